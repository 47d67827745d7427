"""The multi-NPU MoE step (npusim.system.moe_step): it runs on a small instance, conserves tokens,
responds to the knobs the right way, and rejects impossible deployments with clear errors."""

from pathlib import Path

import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment
from npusim.mapping.spec import load_deployment
from npusim.system.load import load_system
from npusim.system.moe_step import _expert_placement, _traffic, simulate_step
from npusim.model.zoo import get_config


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cm1():
    return load_system("cloudmatrix384", nodes=1)  # 8 NPUs = 16 dies


def _dep(**kw):
    base = dict(phase="decode", npus=8, routed_experts={"per_die": 16}, shared_expert={"mode": "dp"})
    base.update(kw)
    return Deployment.model_validate(base)


def test_small_decode_step_runs_and_adds_up(cm1):
    r = simulate_step(cm1, _dep(), batch=8, kv=1024)
    assert r.dies == 16 and r.batch_per_die == 4
    assert r.step_ms > 0 and r.tpot_ms == pytest.approx(r.step_ms)
    assert r.tokens_per_s_per_npu == pytest.approx(8 / (r.step_ms / 1e3))
    b = r.breakdown_us
    assert b["attention"] > 0 and b["moe_compute"] > 0 and b["dispatch"] > 0 and b["combine"] > 0
    assert b["other_kernels"] > 0  # the system's per-layer small kernels
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


def test_longer_context_is_slower(cm1):
    short = simulate_step(cm1, _dep(), batch=8, kv=512)
    long = simulate_step(cm1, _dep(), batch=8, kv=8192)
    assert long.breakdown_us["attention"] > short.breakdown_us["attention"]
    assert long.step_ms > short.step_ms


def test_routing_conserves_tokens():
    cfg = get_config("deepseek-r1")
    dep = _dep(routed_experts={"per_die": 16, "redundant": 0})
    rng = np.random.default_rng(0)
    picks = np.stack([[rng.choice(256, 8, replace=False) for _ in range(12)] for _ in range(16)])
    homes = _expert_placement(cfg, dep, 16, np.bincount(picks.ravel(), minlength=256))
    tokens, per_die = _traffic(picks, homes, [], 16, "none", "per_rank")
    assert per_die.sum() == picks.size  # every (token, expert) pair computed once
    # deduplicated: exactly the distinct home dies of each token's picks
    want = np.zeros((16, 16), np.int64)
    for src in range(16):
        for tok in range(12):
            for die in {int(e) // 16 for e in picks[src, tok]}:
                want[src, die] += 1
    assert np.array_equal(tokens, want)
    per_expert, _ = _traffic(picks, homes, [], 16, "none", "per_expert")
    assert np.all(per_expert.sum(axis=1) == 12 * 8)  # one copy per pick
    assert np.array_equal(per_expert.sum(axis=0), per_die) and np.all(per_expert >= tokens)
    perfect, per_die_p = _traffic(picks, homes, [], 16, "perfect", "per_expert")
    assert per_die_p.sum() == picks.size and per_die_p.max() - per_die_p.min() <= 1


def test_impossible_deployments_are_clear_errors(cm1):
    with pytest.raises(ConfigError, match="NPUs"):
        simulate_step(cm1, _dep(npus=160), batch=8, kv=1024)
    with pytest.raises(ConfigError, match="slots"):
        simulate_step(cm1, _dep(routed_experts={"per_die": 4}), batch=8, kv=1024)
    with pytest.raises(ConfigError, match="does not fit"):
        simulate_step(cm1, _dep(), batch=512, kv=131072)
    with pytest.raises(ValueError, match="core_split"):  # pydantic's error; files get a ConfigError
        _dep(microbatches=2)


def test_presets_load():
    for name in ("cm384-deepseek-decode", "cm384-deepseek-prefill", "a2-deepseek-decode", "a2-deepseek-prefill"):
        dep = load_deployment(ROOT / "mappers" / f"{name}.yaml")
        assert dep.phase in name
    ep64 = load_deployment(ROOT / "examples" / "mappings" / "cm384-deepseek-decode-ep64.yaml")
    assert (ep64.npus * 2, ep64.routed_experts.per_die * ep64.npus * 2) == (64, 256)  # EP64: 4 experts a die
    assert ep64.microbatches == 2  # the rest from the decode preset it extends


def test_shared_expert_is_costed_in_every_mode(cm1):
    """dp: every die computes the shared FFN for its own tokens (none of its bytes move); tp: T dies
    split it, all-gather their tokens and scatter the partial sums back (bytes of both directions
    = (T-1) peers x tokens x message size, per die and microbatch), each holding 1/T of its weights."""
    from npusim.system.moe import combine_bytes_per_token, dispatch_bytes_per_token
    from npusim.system.moe_step import _shared_expert_kernel, weights_per_die_gb
    from npusim.system.workload import Workload
    cfg = get_config("deepseek-r1")
    wl = Workload(16)
    dp_k, dp_group = _shared_expert_kernel(cfg, _dep(), wl.kernel, 8, 24, 16)
    assert wl.kernels[dp_k]["type"] == "sum" and dp_group["gather_bytes"].sum() == 0
    tp_k, tp_group = _shared_expert_kernel(cfg, _dep(shared_expert={"mode": "tp", "degree": 4}), wl.kernel, 8, 24, 16)
    up = wl.kernels[wl.kernels[tp_k]["of"][0]]
    assert up["n"] == 2 * cfg.moe_intermediate_size // 4 and up["m"] == 32  # 1/4 of the width, 4 dies' tokens
    per_die_gather = tp_group["gather_bytes"].sum(axis=1)
    assert np.all(per_die_gather == 3 * 8 * dispatch_bytes_per_token(cfg.hidden_size, "int8"))
    assert np.all(tp_group["scatter_bytes"].sum(axis=0) == 3 * 8 * combine_bytes_per_token(cfg.hidden_size))
    assert tp_group["gather_bytes"][0, 4] == 0  # die 0 and die 4 are in different groups
    assert _shared_expert_kernel(cfg, _dep(shared_expert={"mode": "dedicated", "degree": 2}), wl.kernel, 8, 24,
                                 16)[0] is None
    w_dp = weights_per_die_gb(cfg, _dep())
    w_tp = weights_per_die_gb(cfg, _dep(shared_expert={"mode": "tp", "degree": 4}))
    shared_gb = 3 * cfg.hidden_size * cfg.moe_intermediate_size * (cfg.num_layers - cfg.first_dense_layers) / 2**30
    assert w_dp - w_tp == pytest.approx(shared_gb * 3 / 4)
    with pytest.raises(ConfigError, match="does not divide"):
        _shared_expert_kernel(cfg, _dep(shared_expert={"mode": "tp", "degree": 3}), wl.kernel, 8, 24, 16)
    r_dp = simulate_step(cm1, _dep(), batch=8, kv=1024)
    r_tp = simulate_step(cm1, _dep(shared_expert={"mode": "tp", "degree": 4}), batch=8, kv=1024)
    assert r_tp.breakdown_us["shared_expert_comm"] > 0 and r_dp.breakdown_us["shared_expert_comm"] == 0


def test_attention_tp_splits_heads_and_moves_the_groups_activations(cm1):
    """attention tp: T dies split the heads of the group's tokens: each die holds the group's KV
    (MLA's latent KV is per token), less attention weight, and its inputs/outputs cross the fabric."""
    dp = simulate_step(cm1, _dep(), batch=8, kv=1024)
    tp = simulate_step(cm1, _dep(attention={"mode": "tp", "degree": 4}), batch=8, kv=1024)
    assert tp.kv_gb_per_die == pytest.approx(4 * dp.kv_gb_per_die)
    assert tp.weights_gb_per_die < dp.weights_gb_per_die
    assert dp.breakdown_us["attention_comm"] == 0 and tp.breakdown_us["attention_comm"] > 0
    with pytest.raises(ConfigError, match="attention tp 3"):
        simulate_step(cm1, _dep(attention={"mode": "tp", "degree": 3}), batch=8, kv=1024)
    with pytest.raises(ValueError, match="not dedicated"):
        _dep(attention={"mode": "dedicated", "degree": 2})
    assert _dep(attention="dp").attention.mode == "dp"  # the short form of the preset files


def test_spread_contexts_make_the_slowest_die_set_the_attention(cm1):
    """kv_min: contexts drawn per sequence over [kv_min, 2 kv - kv_min]; dies' attention differs
    (seeded, deterministic), the breakdown's attention is the slowest die's, never faster than all
    at the mean; a bad kv_min is a clear error."""
    even = simulate_step(cm1, _dep(), batch=8, kv=2048)
    spread = simulate_step(cm1, _dep(), batch=8, kv=2048, kv_min=512)
    again = simulate_step(cm1, _dep(), batch=8, kv=2048, kv_min=512)
    assert even.attention_imbalance == 1.0
    assert spread.attention_imbalance > 1.0 and spread.attention_imbalance == again.attention_imbalance
    assert spread.breakdown_us["attention"] > even.breakdown_us["attention"]
    assert spread.step_ms >= even.step_ms * 0.999
    with pytest.raises(ConfigError, match="kv-min"):
        simulate_step(cm1, _dep(), batch=8, kv=2048, kv_min=4096)
