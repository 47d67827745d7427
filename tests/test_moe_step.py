"""The multi-NPU MoE step of a deployment (npusim.system.moe_step over the system mapper): it runs on
a small instance, conserves tokens, responds to the knobs the right way, and rejects impossible
deployments with clear errors."""

from pathlib import Path

import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment
from npusim.mapping.spec import load_deployment
from npusim.model.zoo import get_config
from npusim.system.load import load_system
from npusim.system.mapper import StepShape, build_step
from npusim.system.moe_step import simulate_step, weights_per_die_gb
from npusim.system.plan import ParallelPlan


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cm1():
    return load_system("cloudmatrix384", nodes=1)  # 8 NPUs = 16 dies


def _dep(**kw):
    base = dict(phase="decode", npus=8, tp=1, ep=16, precision="w8a8", dense_ffn="dp", lm_head="dp")
    base.update(kw)
    return Deployment.model_validate(base)


def test_small_decode_step_runs_and_adds_up(cm1):
    r = simulate_step(cm1, _dep(), batch=8, kv=1024)
    assert r.dies == 16 and r.batch_per_die == 4
    assert r.step_ms > 0 and r.tpot_ms == pytest.approx(r.step_ms)
    assert r.tokens_per_s_per_npu == pytest.approx(8 / (r.step_ms / 1e3))
    b = r.layer_breakdown_us
    assert b["attention"] > 0 and b["moe_compute"] > 0 and b["dispatch"] > 0 and b["combine"] > 0
    assert b["launch"] > 0  # the system runtime's launch per kernel, on the layer's critical path
    assert sum(r.breakdown_us.values()) == pytest.approx(r.step_ms * 1e3, rel=1e-6)  # the step's critical path
    parts = sum(v for k, v in b.items() if k not in ("other", "overlap_hidden", "calibrated"))
    assert r.layer_us == pytest.approx(parts + b["other"] - b["overlap_hidden"], abs=1e-2)
    # calibrated: the part of the layer's critical path (and the step's) that is calibrated constants
    assert 0 < b["calibrated"] <= r.layer_us and 0 < r.calibrated_ms <= r.step_ms
    assert r.calibrated_share == pytest.approx(r.calibrated_ms / r.step_ms)
    assert r.layer_us <= parts + b["other"] + 1e-6
    mtp = simulate_step(cm1, _dep(), batch=8, kv=1024, mtp=1, mtp_acceptance=0.8)
    assert mtp.tokens_per_step == pytest.approx(1.8)
    assert mtp.step_ms > r.step_ms  # more tokens and the MTP layer
    assert mtp.tpot_ms == pytest.approx(mtp.step_ms / 1.8)



def test_a_prefill_step_charges_the_decode_kernels_overheads_and_says_so(cm1):
    """No per-call overhead of the normal (prefill) kernels is published in a usable form (one token
    count, bandwidth-bound): a prefill step charges the decode kernels' calibrated overheads and its
    note says so; a decode step's note does not."""
    from npusim.system.moe_step import PREFILL_NOTE

    ops = cm1.system.moe_operators
    pre = simulate_step(cm1, _dep(phase="prefill"), batch_tokens=256, seq=256)
    dec = simulate_step(cm1, _dep(), batch=8, kv=1024)
    for r in (pre, dec):
        assert r.layer_breakdown_us["calibrated"] == pytest.approx(ops.dispatch_overhead_us + ops.combine_overhead_us)
    assert pre.note.endswith(PREFILL_NOTE) and "one token count" in pre.note
    assert PREFILL_NOTE not in dec.note

def test_longer_context_is_slower(cm1):
    short = simulate_step(cm1, _dep(), batch=8, kv=512)
    long = simulate_step(cm1, _dep(), batch=8, kv=8192)
    assert long.layer_breakdown_us["attention"] > short.layer_breakdown_us["attention"]
    assert long.step_ms > short.step_ms


@pytest.mark.parametrize("eplb", ["none", "greedy", "perfect"])
def test_routing_conserves_tokens(eplb):
    """Every (token, expert) pair is computed once on some rank; a token goes to a rank at most once
    per_rank (at least once per distinct rank of its picks), once per pick per_expert; perfect EPLB
    spreads the pairs evenly over the slots."""
    cfg = get_config("deepseek-r1")
    plan = ParallelPlan(npus=16, dp=16, ep=16, precision="w8a8", redundant_experts=16 if eplb == "greedy" else 0,
                        eplb=eplb)
    shape = StepShape("decode", 16 * 12, 1, 1024)
    loads, copies = {}, {}
    for mode in ("per_rank", "per_expert"):
        wl = build_step(cfg, plan, shape, 1, copies=mode)
        loads[mode] = np.asarray(wl.meta["expert_load"])
        node = next(n for n in wl.nodes if n["kind"] == "transfers" and n["name"].endswith("dispatch"))
        copies[mode] = np.asarray(node["bytes"]).sum()
        assert loads[mode].sum() == 16 * 12 * cfg.experts_per_token  # no pair lost or doubled
    assert copies["per_rank"] <= copies["per_expert"]
    if eplb == "perfect":
        assert loads["per_rank"].max() - loads["per_rank"].min() <= 1


def test_impossible_deployments_are_clear_errors(cm1):
    with pytest.raises(ConfigError, match="NPUs"):
        simulate_step(cm1, _dep(npus=160), batch=8, kv=1024)
    with pytest.raises(ConfigError, match="does not divide"):
        simulate_step(cm1, _dep(ep=12), batch=8, kv=1024)
    with pytest.raises(ConfigError, match="does not fit"):
        simulate_step(cm1, _dep(), batch=512, kv=131072)
    with pytest.raises(ConfigError, match="core_split needs attention_cores"):
        simulate_step(cm1, _dep(microbatches=2, overlap="core_split"), batch=8, kv=1024)
    with pytest.raises(ConfigError, match="cube cores"):
        simulate_step(cm1, _dep(microbatches=2, overlap="core_split", attention_cores=99, moe_cores=8), batch=8,
                      kv=1024)


def test_presets_load():
    for name in ("cm384-deepseek-decode", "cm384-deepseek-prefill", "a2-deepseek-decode", "a2-deepseek-prefill"):
        dep = load_deployment(ROOT / "mappers" / f"{name}.yaml")
        assert dep.phase in name
    ep64 = load_deployment(ROOT / "examples" / "mappings" / "cm384-deepseek-decode-ep64.yaml")
    assert (ep64.npus * 2, ep64.ep) == (64, 64)  # EP64: 4 experts a die
    assert ep64.microbatches == 2 and ep64.overlap == "core_split"  # the rest from the decode preset it extends
    with pytest.raises(ConfigError, match="phase"):
        load_deployment(ROOT / "mappers" / "a2-llama3-70b-tp8.yaml")  # a plan, not a deployment


def test_shared_expert_is_costed_in_every_mode(cm1):
    """dp: every die computes the shared FFN for its own tokens (none of its bytes move); tp: T dies
    split it, all-gather their tokens and scatter the partial sums back, each holding 1/T of its
    weights; dedicated dies: every token dispatched to one of them, which hold no routed experts."""
    cfg = get_config("deepseek-r1")
    w_dp = weights_per_die_gb(cfg, _dep(), 2)
    w_tp = weights_per_die_gb(cfg, _dep(shared_tp=4), 2)
    shared_gb = 3 * cfg.hidden_size * cfg.moe_intermediate_size * (cfg.num_layers - cfg.first_dense_layers) / 2**30
    assert w_dp - w_tp == pytest.approx(shared_gb * 3 / 4, rel=0.01)
    r_dp = simulate_step(cm1, _dep(), batch=8, kv=1024)
    r_tp = simulate_step(cm1, _dep(shared_tp=4), batch=8, kv=1024)
    assert r_tp.layer_breakdown_us["shared_expert_comm"] > 0 and r_dp.layer_breakdown_us["shared_expert_comm"] == 0
    with pytest.raises(ConfigError, match="shared_tp 3"):
        simulate_step(cm1, _dep(shared_tp=3), batch=8, kv=1024)
    ded = simulate_step(cm1, _dep(ep=8, shared_dies=8, redundant_experts=0), batch=8, kv=1024, check_fit=False)
    load = ded.workload.meta["expert_load"]
    tokens = 8 * 8  # sequences of the instance
    assert sum(load[8:]) == tokens and sum(load[:8]) == tokens * cfg.experts_per_token
    assert ded.step_ms > 0


def test_attention_tp_splits_heads_and_moves_the_groups_activations(cm1):
    """attention tp: T dies split the heads of the group's tokens: each die holds the group's KV
    (MLA's latent KV is per token), less attention weight, and its inputs/outputs cross the fabric."""
    dp = simulate_step(cm1, _dep(), batch=8, kv=1024)
    tp = simulate_step(cm1, _dep(tp=4), batch=8, kv=1024)
    assert tp.kv_gb_per_die == pytest.approx(4 * dp.kv_gb_per_die)
    assert tp.weights_gb_per_die < dp.weights_gb_per_die
    assert dp.layer_breakdown_us["attention_comm"] == 0 and tp.layer_breakdown_us["attention_comm"] > 0
    with pytest.raises(ConfigError, match="tp 3"):
        simulate_step(cm1, _dep(tp=3), batch=8, kv=1024)


def test_spread_contexts_make_the_slowest_die_set_the_attention(cm1):
    """kv_min: contexts drawn per sequence over [kv_min, 2 kv - kv_min]; dies' attention differs
    (seeded, deterministic), the breakdown's attention is the slowest die's, never faster than all
    at the mean; a bad kv_min is a clear error."""
    even = simulate_step(cm1, _dep(), batch=8, kv=2048)
    spread = simulate_step(cm1, _dep(), batch=8, kv=2048, kv_min=512)
    again = simulate_step(cm1, _dep(), batch=8, kv=2048, kv_min=512)
    assert even.attention_imbalance == pytest.approx(1.0, rel=1e-12)
    assert spread.attention_imbalance > 1.0 and spread.attention_imbalance == again.attention_imbalance
    assert spread.layer_breakdown_us["attention"] > even.layer_breakdown_us["attention"]
    assert spread.step_ms >= even.step_ms * 0.999
    with pytest.raises(ConfigError, match="kv-min"):
        simulate_step(cm1, _dep(), batch=8, kv=2048, kv_min=4096)


@pytest.mark.slow  # seconds warm, more with a cold chip-cost cache (320 dies, 13k workload nodes)
def test_a_step_whose_flow_update_finishes_more_transfers_than_the_heap_holds():
    """xDeepServe's EP288 deployment at 10 sequences per NPU: one rate update of the fabric's flow
    model finishes more transfers than the event heap has room for. The loop once pushed their end
    events past the heap's end (a ValueError on growing it, or a crash: memory corruption); it now
    grows the heap first (room for one event per active transfer)."""
    from npusim.mapping.spec import MAPPER_DIR, load_deployment

    r = simulate_step(load_system("cloudmatrix384"), load_deployment(MAPPER_DIR / "cm384-deepseek-decode-ep288.yaml"),
                      batch=10, kv=3072, mtp=1, mtp_acceptance=0.9, kv_min=2048)
    assert 0 < r.layer_us < r.step_ms * 1e3
    assert r.layer_breakdown_us["dispatch"] > 0 and r.layer_breakdown_us["combine"] > 0
