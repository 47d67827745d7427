"""Tensor parallelism inside one routed expert (plan key ``expert_tp``): every routed token goes to
the ``T`` ranks of its experts' sets (``T`` times the copies, conserved through the combine), each
rank's expert GEMMs are ``1/T`` of the width for ``T`` times the token-shard pairs (the same FLOPs
summed over the ranks), the partial sums are added on the token's rank, a rank holds ``T`` times
the shards of ``1/T`` the width, and impossible splits are clear errors."""

import json

import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment
from npusim.model.zoo import get_config
from npusim.system.load import load_system
from npusim.system.mapper import StepShape, build_step, memory_per_rank_gb
from npusim.system.moe import combine_bytes_per_token, dispatch_bytes_per_token, pad_rows
from npusim.system.moe_step import simulate_step
from npusim.system.plan import ParallelPlan, check_plan

MOE = get_config("qwen3-30b-a3b")  # 128 experts, top-8, expert width 768, hidden 2048
SHAPE = StepShape("prefill", 4, 256, 256)  # 256 tokens a rank on 4 ranks


def _plan(t: int, **kw) -> ParallelPlan:
    return ParallelPlan(npus=4, dp=4, ep=4, expert_tp=t, precision="w8a8", **kw)


def _last_moe_layer(wl) -> str:
    """The tag prefix (``L<i>.``) of the last simulated MoE layer (whose routing the meta records)."""
    layers = {int(n["name"].split(".")[0][1:]) for n in wl.nodes if n["name"].endswith(".experts_up")}
    return f"L{max(layers)}."


def _expert_gemms(wl, prefix: str) -> list[dict]:
    return [dict(wl.kernels[n["kernel"]], rank=n["rank"], name=n["name"]) for n in wl.nodes
            if n["kind"] == "compute" and n["name"].startswith(prefix) and ".experts_" in n["name"]
            and wl.kernels[n["kernel"]]["type"] == "gemm"]  # not the activation between them


@pytest.mark.parametrize("t", [2, 4])
def test_expert_tp_multiplies_the_copies_and_keeps_the_expert_flops(t):
    one = build_step(MOE, _plan(1), SHAPE, copies="per_expert")
    split = build_step(MOE, _plan(t), SHAPE, copies="per_expert")
    tokens = SHAPE.batch * SHAPE.seq_len
    # every (token, expert) pick goes to the T ranks of the expert's set: T times the copies and pairs
    assert sum(one.meta["dispatch_copies"]) == tokens * MOE.experts_per_token
    assert sum(split.meta["dispatch_copies"]) == t * sum(one.meta["dispatch_copies"])
    assert sum(split.meta["expert_load"]) == t * sum(one.meta["expert_load"])
    # the expert GEMMs: 1/T of the width, T times the pairs: the same FLOPs summed over the ranks
    h, w = MOE.hidden_size, MOE.moe_intermediate_size
    flops = {}
    for name, wl, width in (("one", one, w), ("split", split, w // t)):
        prefix = _last_moe_layer(wl)
        gemms = _expert_gemms(wl, prefix)
        up = [g for g in gemms if g["name"].endswith("experts_up")]
        down = [g for g in gemms if g["name"].endswith("experts_down")]
        assert {g["n"] for g in up} == {2 * width} and {g["k"] for g in down} == {width}
        pairs = np.asarray(wl.meta["expert_load"])
        per_pair = 2 * h * 2 * width + 2 * width * h  # gate+up, then down, 2 FLOPs a multiply-add
        flops[name] = int(pairs.sum()) * per_pair
        padded = sum(2 * g["m"] * g["k"] * g["n"] * g.get("batch", 1) for g in gemms)
        slots = _plan(1 if name == "one" else t).expert_slots(MOE.num_experts)
        # each rank's rows: its pairs spread over its slots, padded to the tile
        rows = [pad_rows(-(-int(p) // slots)) * slots for p in pairs]
        assert padded == sum(rows) * per_pair >= flops[name]
    assert flops["split"] == flops["one"]


def test_dispatch_and_combine_conserve_the_copies_and_the_token_adds_the_partial_sums():
    t = 2
    wl = build_step(MOE, _plan(t), SHAPE, copies="per_rank")
    h = MOE.hidden_size
    prefix = _last_moe_layer(wl)
    dispatch = next(n for n in wl.nodes if n["name"] == f"{prefix}mb0.dispatch")
    combine = next(n for n in wl.nodes if n["name"] == f"{prefix}mb0.combine")
    sent = np.asarray(dispatch["bytes"]) // dispatch_bytes_per_token(h, "int8")
    back = np.asarray(combine["bytes"]) // combine_bytes_per_token(h)
    assert np.array_equal(back, sent.T)  # every copy sent out comes back as one partial output
    assert sent.sum() > 0
    # the token's rank adds the T partial sums of each expert set: (T - 1) / T of its copies' rows
    adds = {n["rank"]: wl.kernels[n["kernel"]] for n in wl.nodes if n["name"] == f"{prefix}mb0.expert_partial_sum"}
    copies = wl.meta["dispatch_copies"]
    assert sorted(adds) == [0, 1, 2, 3]
    for r, k in adds.items():
        assert k["batch"] == copies[r] * (t - 1) // t and k["upto"] == "mlp_residual"
    # per rank (a rank's outputs for a token summed before the combine): T copies per set of the token's
    # experts, never more than T times the distinct ranks of expert_tp 1 (a set of T ranks holds their experts)
    one = build_step(MOE, _plan(1), SHAPE, copies="per_rank")
    assert sum(copies) <= t * sum(one.meta["dispatch_copies"])
    assert sum(copies) % t == 0


def test_a_rank_holds_t_times_the_shards_of_one_t_of_the_width():
    cfg = get_config("deepseek-r1")
    plans = {t: ParallelPlan(npus=32, dp=32, ep=32, expert_tp=t, precision="w8a8") for t in (1, 2, 4)}
    shape = StepShape("decode", 32, 1, 1024)
    weights = {t: memory_per_rank_gb(cfg, p, shape)[0] for t, p in plans.items()}
    shard_gb = 3 * cfg.hidden_size * cfg.moe_intermediate_size * 1 / 2**30  # one whole int8 expert
    for t, p in plans.items():
        assert p.expert_slots(cfg.num_experts) == cfg.num_experts * t // 32
        check_plan(p, cfg, 1, 32)
    # experts x T / ep shards of width / T: the routed weights a rank holds stay the same
    assert weights[2] == pytest.approx(weights[1]) and weights[4] == pytest.approx(weights[1])
    fewer = ParallelPlan(npus=32, dp=32, ep=16, expert_tp=1, precision="w8a8")  # two ranks per expert set
    tp2_ep32 = ParallelPlan(npus=32, dp=32, ep=32, expert_tp=2, precision="w8a8")
    # ep 32 with expert_tp 2 holds what ep 16 does, halved: 16 expert sets of 2 ranks
    moe_layers = cfg.num_layers - cfg.first_dense_layers
    assert memory_per_rank_gb(cfg, fewer, shape)[0] - memory_per_rank_gb(cfg, tp2_ep32, shape)[0] == pytest.approx(
        moe_layers * shard_gb * cfg.num_experts / 32, rel=1e-9)


def test_expert_tp_lets_more_ranks_than_expert_groups_share_the_experts():
    """128 experts do not split over ep 6; over 3 expert sets of 2 ranks they do not either, but over
    2 sets of 3 ranks they do (64 experts a set, a third of each expert's width on a rank)."""
    with pytest.raises(ConfigError, match="ep 6 does not divide .* 128 routed experts"):
        check_plan(ParallelPlan(npus=6, dp=6, ep=6), MOE, 1, 8)
    with pytest.raises(ConfigError, match=r"ep 6 / expert_tp 2 = 3 expert sets does not divide"):
        check_plan(ParallelPlan(npus=6, dp=6, ep=6, expert_tp=2), MOE, 1, 8)
    plan = ParallelPlan(npus=6, dp=6, ep=6, expert_tp=3)
    check_plan(plan, MOE, 1, 8)
    wl = build_step(MOE, plan, StepShape("decode", 12, 1, 256), copies="per_expert")
    assert sum(wl.meta["dispatch_copies"]) == 3 * 12 * MOE.experts_per_token
    up = {wl.kernels[n["kernel"]]["n"] for n in wl.nodes if n["name"].endswith("experts_up")}
    assert up == {2 * MOE.moe_intermediate_size // 3}


@pytest.mark.parametrize("plan, cfg, match", [
    (ParallelPlan(npus=4, dp=4, ep=4, expert_tp=8), MOE, "expert_tp 8 is more than ep 4"),
    (ParallelPlan(npus=4, dp=4, ep=4, expert_tp=3), MOE, "expert_tp 3 does not divide ep 4"),
    (ParallelPlan(npus=5, dp=5, ep=5, expert_tp=5), MOE, r"expert_tp 5 does not divide .*moe_intermediate_size 768"),
    (ParallelPlan(npus=2, tp=2, expert_tp=2), get_config("qwen3-4b"), "expert_tp 2.*no routed experts"),
])
def test_impossible_expert_splits_name_their_limit(plan, cfg, match):
    with pytest.raises(ConfigError, match=match):
        check_plan(plan, cfg, 1, 8)


def test_a_deployment_takes_expert_tp_and_moves_twice_the_tokens():
    cm1 = load_system("cloudmatrix384", nodes=1)  # 8 NPUs = 16 dies
    base = dict(phase="decode", npus=8, tp=1, ep=16, precision="w8a8", dense_ffn="dp", lm_head="dp")
    one = simulate_step(cm1, Deployment.model_validate(base), batch=8, kv=1024)
    two = simulate_step(cm1, Deployment.model_validate({**base, "expert_tp": 2}), batch=8, kv=1024)
    assert two.plan["expert_tp"] == 2 and one.plan["expert_tp"] == 1
    assert sum(two.workload.meta["dispatch_copies"]) > sum(one.workload.meta["dispatch_copies"])
    assert two.layer_breakdown_us["dispatch"] > one.layer_breakdown_us["dispatch"]
    assert two.weights_gb_per_die == pytest.approx(one.weights_gb_per_die)
    with pytest.raises(ConfigError, match="expert_tp 3 does not divide ep 16"):
        simulate_step(cm1, Deployment.model_validate({**base, "expert_tp": 3}), batch=8, kv=1024)


def test_the_expert_tp_flag_overrides_the_mapping(cli, tmp_path):
    mapping = tmp_path / "moe.yaml"
    mapping.write_text("plan:\n  npus: 2\n  dp: 2\n  ep: 2\n  expert_tp: 2\n  precision: w8a8\n")
    run = ("run", "--system", "atlas-800i-a2", "--nodes", "1", "--model", "qwen3-30b-a3b", "--phase", "decode",
           "--batch", "4", "--kv", "256", "--mapping", str(mapping), "--json")
    code, out, err = cli(*run)
    assert code == 0, err
    assert json.loads(out)["plan"]["expert_tp"] == 2
    code, out, err = cli(*run, "--expert-tp", "1")
    assert code == 0, err
    assert json.loads(out)["plan"]["expert_tp"] == 1
    code, _, err = cli(*run, "--expert-tp", "4")
    assert code == 2 and "expert_tp 4 is more than ep 2" in err and len(err.strip().splitlines()) == 1
