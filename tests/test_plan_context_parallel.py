"""Context parallelism for long prefill (plan key ``cp``): each prompt split over ``cp`` groups of
``tp`` ranks, attention as ring attention (the KV chunks passed around the ring, each rank's
queries attended to every chunk once), the rest of the layer on each rank's own chunk; the KV cache
per rank divided by ``cp``; decode and impossible splits refused with clear errors."""

import json

import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.model.zoo import get_config
from npusim.system.load import load_system
from npusim.system.mapper import StepShape, build_step
from npusim.system.parts import layer_part_graph
from npusim.system.plan import ParallelPlan, check_plan
from npusim.system.step import simulate_plan_step

LONG = get_config("qwen2-72b")  # Llama-3-70B's shape (80 layers, 64 heads, 8 KV heads) with a 128K context
SEQ = 32768


@pytest.fixture(scope="module")
def a2():
    return load_system("atlas-800i-a2", nodes=1)  # 8 NPUs, one die each


def _kv_bytes_per_token(cfg, tp: int) -> int:
    """One token's K and V on a rank of a TP group (its share of the KV heads, bf16), per layer."""
    return 2 * max(1, cfg.num_kv_heads // tp) * cfg.head_dim * 2


def _rank_kernel_us(wl, timing, rank: int, prefix: str, category: str) -> float:
    return sum(timing.kernel_us[n["kernel"]] for n in wl.nodes if n["kind"] == "compute" and n["rank"] == rank
               and n["name"].startswith(prefix) and n["category"] == category)


def _rings(wl, prefix: str) -> list[dict]:
    return [n for n in wl.nodes if n["kind"] == "transfers" and n["name"].startswith(prefix + "cp_ring")]


def _attention_pairs(wl, rank: int, prefix: str) -> int:
    """(query, key) pairs times heads a rank attends in one layer (its attention kernels' ops)."""
    total = 0
    for n in wl.nodes:
        if n["kind"] == "compute" and n["rank"] == rank and n["name"].startswith(prefix) and n["category"] == "attention":
            for op in layer_part_graph(LONG, wl.kernels[n["kernel"]]).ops:
                if op.kind == "attention":
                    total += op.attended_pairs * op.heads
    return total


@pytest.mark.slow  # several seconds warm (session 48): left out of the fast suite, run by CI's slow pass
def test_ring_attention_of_a_long_prompt_halves_each_ranks_attention(a2):
    """32K tokens over TP 4: with cp 2 (8 NPUs) each rank attends half the pairs of cp 1 (4 NPUs) and
    its attention takes less time; every layer each rank sends its 16K-token KV chunk (its 2 KV heads)
    to the other CP rank of its TP index, and receives the one it lacks; the KV cache per die halves."""
    tp = 4
    out1, wl1, t1 = simulate_plan_step(a2, LONG, ParallelPlan(npus=4, tp=tp, precision="fp16"),
                                       StepShape("prefill", 1, SEQ, SEQ))
    out2, wl2, t2 = simulate_plan_step(a2, LONG, ParallelPlan(npus=8, tp=tp, cp=2, precision="fp16"),
                                       StepShape("prefill", 1, SEQ, SEQ))
    assert out2["plan"]["cp"] == 2 and out1["plan"]["cp"] == 1
    for r in range(8):  # every rank: its qkv projections, two ring steps and the output projection
        names = [n["name"] for n in wl2.nodes if n["kind"] == "compute" and n.get("rank") == r
                 and n["name"].startswith("L0.")]
        assert names[:4] == ["L0.mb0.attention_qkv", "L0.mb0.ring_attention", "L0.mb0.ring_attention",
                             "L0.mb0.attention_out"]
    att1 = _rank_kernel_us(wl1, t1, 0, "L0.", "attention")
    att2 = [_rank_kernel_us(wl2, t2, r, "L0.", "attention") for r in range(8)]
    assert max(att2) < 0.7 * att1
    assert max(att2) == pytest.approx(min(att2))  # zig-zag: every CP rank the same work
    # the pairs: cp x cp steps of the causal (S/cp)-block, the whole causal square S(S+1)/2 split in two
    pairs1, pairs2 = _attention_pairs(wl1, 0, "L0."), _attention_pairs(wl2, 0, "L0.") + _attention_pairs(wl2, 4, "L0.")
    heads = LONG.num_heads // tp
    assert pairs1 == heads * SEQ * (SEQ + 1) // 2
    assert pairs2 == heads * 2 * 2 * (SEQ // 2) * (SEQ // 2 + 1) // 2  # the diagonal block S/(2 cp) more a step
    assert pairs2 / pairs1 == pytest.approx((SEQ + 2) / (SEQ + 1))
    # the ring's bytes, from the model's config
    chunk = (SEQ // 2) * _kv_bytes_per_token(LONG, tp)
    assert chunk == 16384 * 1024
    rings = _rings(wl2, "L0.mb0.")
    assert len(rings) == 1 and rings[0]["ranks"] == list(range(8))
    sent = np.asarray(rings[0]["bytes"])
    expected = np.zeros((8, 8), np.int64)
    for i in range(8):
        expected[i, (i + tp) % 8] = chunk  # CP rank c's TP rank t -> CP rank c+1's TP rank t
    assert np.array_equal(sent, expected)
    # each rank receives the sequence's KV (on its TP rank) less its own chunk: none lost or doubled
    assert np.array_equal(sent.sum(axis=0), np.full(8, SEQ * _kv_bytes_per_token(LONG, tp) - chunk))
    assert not _rings(wl1, "L0.mb0.")
    assert out2["kv_gb_per_die"] == pytest.approx(out1["kv_gb_per_die"] / 2)
    assert out2["weights_gb_per_die"] == pytest.approx(out1["weights_gb_per_die"])
    assert out2["breakdown_us"]["attention"] < out1["breakdown_us"]["attention"]
    assert out2["ttft_ms"] < out1["ttft_ms"]
    assert out2["tokens_per_s_per_npu"] == pytest.approx(SEQ / (out2["step_ms"] / 1e3) / 8)


def test_a_ring_of_four_passes_every_chunk_once():
    """cp 4: three sends a layer, each forwarding what arrived (it waits for the previous send), four
    ring steps a rank, the head on the CP rank holding the prompts' last pieces (zig-zag: CP rank 0)."""
    cfg = get_config("qwen3-0.6b")
    tp, cp, seq = 2, 4, 4096
    wl = build_step(cfg, ParallelPlan(npus=8, tp=tp, cp=cp), StepShape("prefill", 3, seq, seq))
    rings = _rings(wl, "L1.mb0.")
    assert [n["name"] for n in rings] == [f"L1.mb0.cp_ring{i}" for i in range(cp - 1)]
    for a, b in zip(rings, rings[1:]):
        assert wl.nodes.index(a) in b["deps"]  # a rank forwards the chunk that arrived
    chunk = 3 * (seq // cp) * _kv_bytes_per_token(cfg, tp)
    received = sum(np.asarray(n["bytes"]).sum(axis=0) for n in rings)
    assert np.array_equal(received, np.full(tp * cp, (cp - 1) * chunk))
    assert np.array_equal(sum(np.asarray(n["bytes"]).sum(axis=1) for n in rings), received)
    steps = [n["rank"] for n in wl.nodes if n["name"] == "L1.mb0.ring_attention"]
    assert sorted(steps) == sorted(list(range(tp * cp)) * cp)
    heads = sorted(n["rank"] for n in wl.nodes if n["name"].endswith("lm_head"))
    assert heads == list(range(tp))
    ffn = {wl.kernels[n["kernel"]]["seq_len"] for n in wl.nodes if n["name"].endswith(".ffn")}
    assert ffn == {seq // cp}  # the rest of the layer: each rank's own chunk


def test_a_moe_prefill_with_context_parallelism_routes_every_token_once(a2):
    cfg = get_config("qwen3-30b-a3b")
    plan = ParallelPlan(npus=4, dp=2, cp=2, ep=4, precision="w8a8")
    shape = StepShape("prefill", 2, 1024, 1024)
    out, wl, _ = simulate_plan_step(a2, cfg, plan, shape)
    assert sum(wl.meta["expert_load"]) == 2 * 1024 * cfg.experts_per_token
    assert out["breakdown_us"].get("attention", 0) > 0 and out["ttft_ms"] > 0
    # tp 1: the router on each rank's chunk after the ring, as its own kernel
    routers = {n["rank"]: wl.kernels[n["kernel"]]["batch"] for n in wl.nodes if n["name"] == "L0.mb0.router"}
    assert routers == dict.fromkeys(range(4), 512)


def test_impossible_context_splits_are_clear_errors():
    cfg = get_config("qwen3-4b")
    with pytest.raises(ConfigError, match="cp 3 does not divide the 8 ranks"):
        check_plan(ParallelPlan(npus=8, tp=2, dp=1, cp=3), cfg, 1, 8)
    with pytest.raises(ConfigError, match=r"tp 2 x dp 2 x cp 4 x pp 1 = 16 ranks.*must match"):
        check_plan(ParallelPlan(npus=8, tp=2, dp=2, cp=4), cfg, 1, 8)
    with pytest.raises(ConfigError, match="cp 2 .*decode.* not modelled"):
        build_step(cfg, ParallelPlan(npus=4, tp=2, cp=2), StepShape("decode", 2, 1, 512))
    with pytest.raises(ConfigError, match="--seq 1020: cp 4 .*multiple of 8"):
        build_step(cfg, ParallelPlan(npus=8, tp=2, cp=4), StepShape("prefill", 1, 1020, 1020))


def test_the_cp_flag_overrides_the_mapping(cli, tmp_path):
    mapping = tmp_path / "long.yaml"
    mapping.write_text("plan:\n  npus: 4\n  tp: 2\n  cp: 2\n")
    run = ("run", "--system", "atlas-800i-a2", "--nodes", "1", "--model", "qwen3-0.6b", "--phase", "prefill",
           "--batch", "2", "--seq", "1024", "--mapping", str(mapping), "--json")
    code, out, err = cli(*run)
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["tp"], plan["dp"], plan["cp"]) == (2, 1, 2)
    code, out, err = cli(*run, "--cp", "1")
    assert code == 0, err
    plan = json.loads(out)["plan"]
    assert (plan["tp"], plan["dp"], plan["cp"]) == (2, 2, 1)
    for extra, words in ((["--cp", "3"], ["cp 3 does not divide"]),
                         (["--phase", "decode", "--kv", "512"], ["cp 2", "decode", "not modelled"])):
        code, _, err = cli(*run, *extra)
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1, err
        assert all(w in lines[0] for w in words), lines[0]
