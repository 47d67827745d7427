"""Any model on a system by a parallel plan: the plan's checks, the system mapper's workload (bytes
conserved, saved and re-timed identically), the executor's step (its critical path sums to the
step, links never above capacity, the extrapolated layers agree with simulating them all), group-
limited routing, and the plan search."""

import json
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.arch import summarize
from npusim.errors import ConfigError
from npusim.model.zoo import get_config
from npusim.system import mapper as system_mapper
from npusim.system.execute import time_workload
from npusim.system.load import load_system
from npusim.system.mapper import StepShape, build_step, memory_per_rank_gb
from npusim.system.moe import dispatch_bytes_per_token, route_tokens
from npusim.system.plan import ParallelPlan, check_plan, default_plan
from npusim.system.search import pareto, search_plans
from npusim.system.step import simulate_plan_step
from npusim.system.workload import Workload


@pytest.fixture(scope="module")
def a2():
    return load_system("atlas-800i-a2", nodes=1)  # 8 NPUs, one die each


def test_impossible_plans_name_their_limit(a2):
    cfg = get_config("qwen3-4b")  # 32 heads, 8 KV heads, no experts
    with pytest.raises(ConfigError, match="must match"):
        check_plan(ParallelPlan(npus=4, tp=2), cfg, 1, 8)
    with pytest.raises(ConfigError, match="does not divide .* 32 attention heads"):
        check_plan(ParallelPlan(npus=3, tp=3), cfg, 1, 8)
    with pytest.raises(ConfigError, match="no routed experts"):
        check_plan(ParallelPlan(npus=2, dp=2, ep=2), cfg, 1, 8)
    with pytest.raises(ConfigError, match="system has 8"):
        check_plan(ParallelPlan(npus=16, dp=16), cfg, 1, 8)
    with pytest.raises(ConfigError, match="does not fit"):  # 140 GB of bf16 weights on one 64 GB die
        simulate_plan_step(a2, "llama-3-70b", ParallelPlan(npus=1), StepShape("decode", 1, 1, 128))
    with pytest.raises(ConfigError, match="fewer sequences than dp"):
        build_step(cfg, ParallelPlan(npus=4, dp=4), StepShape("decode", 2, 1, 128))
    moe = get_config("qwen3-30b-a3b")
    with pytest.raises(ConfigError, match="ep 3 does not divide"):
        check_plan(ParallelPlan(npus=4, dp=4, ep=3), moe, 1, 8)


def test_default_plan_is_tensor_parallel_over_the_heads_then_data_parallel():
    assert default_plan(get_config("qwen3-4b"), 8, 1) == ParallelPlan(npus=8, tp=8, dp=1)
    assert default_plan(get_config("qwen3-30b-a3b"), 4, 2) == ParallelPlan(npus=4, tp=8, dp=1, ep=8)
    assert default_plan(get_config("gpt2"), 8, 1).tp == 4  # 12 heads: the largest power of two dividing them
    assert default_plan(get_config("qwen3-4b"), 8, 1, pp=2) == ParallelPlan(npus=8, tp=4, pp=2)


def test_breakdown_is_the_critical_path_and_links_stay_within_capacity(a2):
    out, wl, timing = simulate_plan_step(a2, "qwen3-4b", ParallelPlan(npus=4, tp=4), StepShape("decode", 8, 1, 512))
    assert sum(out["breakdown_us"].values()) == pytest.approx(timing.step_us, rel=1e-6)
    assert set(out["breakdown_us"]) >= {"attention", "ffn", "tp_comm", "lm_head"}
    assert out["tpot_ms"] == pytest.approx(timing.step_us / 1e3)
    assert out["tokens_per_s_per_npu"] == pytest.approx(8 / (timing.step_us / 1e6) / 4)
    assert 0 < max(link["utilization"] for link in timing.links) <= 1.0 + 1e-9
    assert np.all(timing.node_end_us >= timing.node_start_us)


@pytest.mark.parametrize("pp", [2, 4])
def test_a_pipeline_step_pays_the_host_overhead_once(a2, pp):
    """The runtime's per-step synchronize and scheduler time follow each rank's own last work, side by
    side on every rank: once on the critical path. It was chained over the ranks of every stage but the last
    (a rank there waited for the node before it in the list, the previous rank's overhead):
    Llama-3-70B tp8 pp2 took 105 ms, 80 of them eight overheads."""
    from npusim.validate.calibrate import _variant

    cfg = replace(get_config("qwen3-0.6b"), num_layers=4)
    sched = _variant(a2, {"runtime": {"scheduler_us": 5000.0}})
    out, wl, timing = simulate_plan_step(sched, cfg, ParallelPlan(npus=2 * pp, tp=2, pp=pp),
                                         StepShape("decode", 4, 1, 256), runtime="graph")
    # the graph's own host work on the path (its replay, the attention updates the device waits for)
    no_sched, _, _ = simulate_plan_step(_variant(a2, {"runtime": {"scheduler_us": 0.0}}), cfg,
                                        ParallelPlan(npus=2 * pp, tp=2, pp=pp), StepShape("decode", 4, 1, 256),
                                        runtime="graph")
    assert out["breakdown_us"]["host"] == pytest.approx(5000.0 + no_sched["breakdown_us"]["host"])
    assert no_sched["breakdown_us"]["host"] >= a2.system.runtime.graph_launch_us
    work = float(timing.node_end_us.max())  # the device's last work (the host's tasks are not nodes)
    assert timing.step_us == pytest.approx(work + a2.system.runtime.sync_us + 5000.0)  # the step's synchronize, then the scheduler


def test_one_microbatch_through_stages_is_the_one_stage_step_plus_its_sends(a2, monkeypatch):
    """Qwen3-30B-A3B (4 layers) over 4 stages of one tp2/ep2 group: each stage's ranks receive their
    hidden states as their peer in the stage before finishes, so the pipeline is the one-stage step
    shifted by its three sends, exactly. A receiving rank took no part in the sending stage's last
    all-gather but waited for all of it, which skewed the stage (+0.4 us)."""
    monkeypatch.setattr(system_mapper, "SIM_LAYERS", 10_000)
    cfg, shape = replace(get_config("qwen3-30b-a3b"), num_layers=4), StepShape("decode", 2, 1, 64)
    staged, _, _ = simulate_plan_step(a2, cfg, ParallelPlan(npus=8, tp=2, ep=2, pp=4), shape)
    single, _, _ = simulate_plan_step(a2, cfg, ParallelPlan(npus=2, tp=2, ep=2), shape)
    sends = staged["breakdown_us"]["pp_comm"]
    assert sends > 0
    assert staged["step_ms"] == pytest.approx(single["step_ms"] + sends / 1e3, abs=1e-5)  # parts rounded to 1 ns


def test_extrapolated_layers_agree_with_simulating_every_layer(a2, monkeypatch):
    """SIM_LAYERS layers and the rest at the measured period against all 28 layers simulated."""
    plan, shape = ParallelPlan(npus=2, tp=2, microbatches=2), StepShape("decode", 8, 1, 256)
    cut, _, _ = simulate_plan_step(a2, "qwen3-0.6b", plan, shape)
    assert cut["simulated_layers"] == system_mapper.SIM_LAYERS < 28
    monkeypatch.setattr(system_mapper, "SIM_LAYERS", 10_000)
    full, wl, _ = simulate_plan_step(a2, "qwen3-0.6b", plan, shape)
    assert full["simulated_layers"] == 28 and "repeat" not in wl.meta
    assert cut["step_ms"] == pytest.approx(full["step_ms"], rel=0.01)


def test_more_tensor_parallel_dies_make_a_memory_bound_decode_faster(a2):
    steps = [simulate_plan_step(a2, "qwen3-8b", ParallelPlan(npus=t, tp=t), StepShape("decode", 8, 1, 1024))[0]
             ["step_ms"] for t in (1, 2, 4)]
    assert steps[0] > steps[1] > steps[2]
    grow = [simulate_plan_step(a2, "qwen3-8b", ParallelPlan(npus=2, tp=2), StepShape("decode", b, 1, 4096))[0]
            ["step_ms"] for b in (1, 16, 64)]
    assert grow[0] < grow[1] < grow[2]  # the KV read grows with the batch


def test_moe_dispatch_conserves_token_copies(a2):
    cfg = get_config("qwen3-30b-a3b")
    plan = ParallelPlan(npus=4, dp=4, ep=4, precision="w8a8")
    wl = build_step(cfg, plan, StepShape("decode", 16, 1, 512))
    dispatch = [n for n in wl.nodes if n["kind"] == "transfers" and n["name"].endswith(".dispatch")]
    combine = [n for n in wl.nodes if n["kind"] == "transfers" and n["name"].endswith(".combine")]
    assert dispatch and len(dispatch) == len(combine)
    per_token = dispatch_bytes_per_token(cfg.hidden_size, "int8")
    for d, c in zip(dispatch, combine):
        sent = np.asarray(d["bytes"])
        assert np.all(np.diag(sent) == 0) and np.all(sent % per_token == 0)
        copies = sent // per_token
        assert np.all(copies.sum(axis=1) <= 4 * 3)  # 4 tokens a rank, at most 3 other ranks each
        assert np.array_equal(np.asarray(c["bytes"]) > 0, sent.T > 0)  # combine returns what was dispatched


def test_saved_workload_re_times_identically(a2, tmp_path):
    out, wl, _ = simulate_plan_step(a2, "qwen3-30b-a3b", ParallelPlan(npus=2, dp=2, ep=2, precision="w8a8"),
                                    StepShape("decode", 8, 1, 512))
    wl.save(tmp_path)
    again = Workload.load(tmp_path)
    assert again.to_dict() == json.loads(json.dumps(wl.to_dict()))
    assert time_workload(again, a2).step_us == pytest.approx(out["step_ms"] * 1e3, rel=1e-12)


META = {"model": get_config("qwen3-0.6b").to_dict(), "plan": {"npus": 2, "tp": 2}, "phase": "decode", "batch": 4,
        "tokens": 4, "seq_len": 1, "kv_len": 128}


@pytest.mark.parametrize("bad, match", [
    ({"format": "x"}, "not an npusim system workload"),
    ({"nodes": [{"kind": "compute", "rank": 0, "kernel": 0, "deps": [5]}]}, "earlier nodes"),
    ({"nodes": [{"kind": "compute", "rank": 9, "kernel": 0, "deps": []}]}, "'rank' must be an integer 0..1"),
    ({"nodes": [{"kind": "compute", "kernel": 0, "deps": []}]}, "'rank'"),
    ({"nodes": [{"kind": "transfers", "ranks": [0, 1], "bytes": [[0, "x"], [0, 0]]}]}, "'bytes'"),
    ({"kernels": [{"type": "sum", "of": [3]}]}, "earlier kernels"),
    ({"kernels": [{"type": "warp"}]}, "'type' must be one of"),
    ({"kernels": [{"type": "gemm", "m": 2**40, "k": 8, "n": 8}]}, "'m' must be an integer"),
    ({"kernels": [{"type": "layer", "layer": 0, "phase": "prefill", "batch": 4096, "seq_len": 4096,
                   "kv_len": 4096}]}, "tokens, more than"),
    ({"meta": {**META, "phase": "train"}}, "meta.phase"),
    ({"meta": {**META, "model": "qwen3-0.6b"}}, "meta.model"),
    ({"meta": {**META, "plan": {"npus": 2, "tp": "x"}}}, "meta.plan: tp"),
    ({"meta": {**META, "repeat": {"start": 0, "marks": [0], "layers": 3}}}, "repeat"),
    ({"nodes": []}, "no work"),
])
def test_a_bad_workload_file_is_one_clear_error(tmp_path, bad, match):
    d = {"format": "npusim-system-workload", "version": 1, "ranks": 2, "meta": META,
         "kernels": [{"type": "fixed", "us": 1.0}], "nodes": [{"kind": "compute", "rank": 0, "kernel": 0}], **bad}
    (tmp_path / "workload.json").write_text(json.dumps(d))
    with pytest.raises(ConfigError, match=match):
        Workload.load(tmp_path)


@settings(deadline=None)
@given(groups=st.sampled_from([2, 4, 8]), keep=st.integers(1, 8), seed=st.integers(0, 1000))
def test_group_limited_routing_keeps_tokens_in_their_best_groups(groups, keep, seed):
    keep = min(keep, groups)
    experts, k = 64, 4
    picks = route_tokens(2, 50, k, experts, np.ones(experts), seed, groups, keep)
    size = experts // groups
    for row in picks.reshape(-1, k):
        assert len(set(row.tolist())) == k
        assert len(set((row // size).tolist())) <= keep
    if k % keep == 0:
        balanced = route_tokens(2, 50, k, experts, np.ones(experts), seed, groups, keep, balanced=True)
        for row in balanced.reshape(-1, k):
            counts = np.bincount(row // size, minlength=groups)
            assert set(counts[counts > 0].tolist()) == {k // keep}


@pytest.mark.slow  # several seconds warm (session 48): left out of the fast suite, run by CI's slow pass
def test_plan_search_ranks_feasible_points_and_explains_rejections():
    r = search_plans("atlas-800i-a2", 1, "qwen3-4b", 2, "decode", 1024, 1024, slo_ms=30.0, batches=[1, 8, 64, 512])
    assert r["evaluated"] > 0 and r["best"]["feasible"]
    feasible = [c for c in r["candidates"] if c["feasible"]]
    assert r["best"]["tokens_per_s_per_npu"] == max(c["tokens_per_s_per_npu"] for c in feasible)
    assert all(c["tpot_ms"] <= 30.0 for c in feasible)
    assert all(c["reason"] for c in r["candidates"] if not c["feasible"])
    front = r["pareto"]
    assert front == pareto(r["candidates"], "tpot_ms")
    for a in front:  # nothing feasible beats a front point on both axes
        assert not any(c["tpot_ms"] < a["tpot_ms"] and c["tokens_per_s_per_npu"] > a["tokens_per_s_per_npu"]
                       for c in feasible)
    # a plan whose batch misses the objective stops there: no larger batch of it was simulated
    for plan in {json.dumps(c["plan"], sort_keys=True) for c in r["candidates"] if c["batch"]}:
        rows = sorted((c for c in r["candidates"] if json.dumps(c["plan"], sort_keys=True) == plan),
                      key=lambda c: c["batch"])
        assert all(row["feasible"] for row in rows[:-1])


def test_run_system_honours_the_model_and_the_plan_flags(cli, tmp_path):
    code, out, err = cli("run", "--system", "cloudmatrix384", "--nodes", "1", "--model", "qwen3-4b", "--phase",
                          "decode", "--batch", "8", "--kv", "1024", "--npus", "1", "--json", "--out",
                          str(tmp_path / "o"), "--save-workload", str(tmp_path / "w"))
    assert code == 0, err
    r = json.loads(out)
    assert r["model"] == "Qwen3-4B" and r["npus"] == 1 and r["dies"] == 2
    assert {"tp", "dp", "ep", "pp", "microbatches"} <= set(r["plan"]) and r["step_ms"] == r["tpot_ms"] > 0
    timeline = json.loads((tmp_path / "o" / "timeline.json").read_text())
    tracks = {(e["pid"], e["tid"]) for e in timeline["traceEvents"] if e["ph"] == "X"}
    assert {(0, 0), (1, 0), (0, 2), (1, 2)} <= tracks  # both dies' compute and communication
    assert json.loads((tmp_path / "o" / "links.json").read_text())
    code, out, err = cli("replay", str(tmp_path / "w"), "--system", "cloudmatrix384", "--nodes", "1", "--json")
    assert code == 0, err
    assert json.loads(out)["step_ms"] == pytest.approx(r["step_ms"])


def test_a_system_decode_step_takes_its_context_from_kv_else_seq(cli):
    """As on a chip, --seq is a decode step's cached tokens when --kv is not given (it was ignored:
    the step ran at the default 1,024); --kv 1 is the smallest context, the new token alone."""
    argv = ("run", "--system", "atlas-800i-a2", "--nodes", "1", "--npus", "1", "--model", "qwen3-0.6b", "--phase",
            "decode", "--batch", "4", "--json")
    for extra, kv in ((["--seq", "512"], 512), (["--kv", "1"], 1), (["--kv", "300", "--seq", "512"], 300)):
        code, out, err = cli(*argv, *extra)
        assert code == 0, err
        assert json.loads(out)["kv"] == kv


def test_a_step_header_says_mtp_off_rather_than_an_acceptance(cli, monkeypatch):
    """Issue 41: "MTP 0 at 0.7" (an acceptance rate of no speculative tokens) in the header."""
    from pathlib import Path
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    argv = ("run", "--system", "atlas-800i-a2", "--mapping", "mappers/a2-deepseek-decode.yaml", "--phase", "decode",
            "--batch", "8", "--kv", "1024")
    for mtp, words in (("0", "microbatch(es), MTP off"), ("1", "microbatch(es), MTP 1 at 0.7 acceptance")):
        code, out, err = cli(*argv, "--mtp", mtp)
        assert code == 0, err
        assert out.splitlines()[0].endswith(words), out.splitlines()[0]


@pytest.mark.parametrize("argv, words", [
    (["--model", "qwen3-4b", "--npus", "3", "--tp", "3"], ["does not divide", "heads"]),
    (["--model", "qwen3-4b", "--npus", "2", "--tp", "3"], ["the product must match"]),
    (["--model", "qwen3-4b", "--mtp", "1"], ["mtp 1", "no multi-token-prediction module"]),
    (["--model", "qwen3-4b", "--kv-min", "10"], ["--kv-min", "DeepSeek deployment"]),
    (["--model", "llama-3-70b", "--npus", "1"], ["does not fit", "GB of HBM"]),
    (["--mapping", "mappers/a2-deepseek-decode.yaml", "--npus", "8", "--tp", "3"], ["tp 3", "must match"]),
])
def test_plan_path_errors_are_one_line(cli, monkeypatch, argv, words):
    from pathlib import Path
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    code, _, err = cli("run", "--system", "atlas-800i-a2", "--nodes", "1", *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert all(w in lines[0] for w in words), lines[0]


def test_plan_command_contract(cli):
    code, out, err = cli("plan", "--system", "atlas-800i-a2", "--nodes", "1", "--npus", "2", "--model",
                          "qwen3-30b-a3b", "--kv", "1024", "--slo-tpot-ms", "50", "--precision", "w8a8", "--batches",
                          "2,16", "--workers", "1", "--json")
    assert code == 0, err
    r = json.loads(out)
    assert {"plan", "batch", "tpot_ms", "tokens_per_s_per_npu"} <= set(r["best"])
    assert r["evaluated"] >= 1 and r["pareto"]
    assert all({"plan", "batch", "tpot_ms", "tokens_per_s_per_npu", "feasible", "reason"} <= set(c)
               for c in r["candidates"])


def test_memory_per_die_is_in_gb_as_its_keys_say(cli):
    """Issue 41: ``weights_gb_per_die`` held GiB. Qwen3-0.6B whole on one die: its weights are the
    model's weight bytes, its KV 4 sequences x 1,024 tokens x its KV bytes per token, in 10^9 bytes;
    the *_gib_per_die keys hold the same in 2^30 bytes (the HBM's 64 GiB as the arch file gives it)."""
    from npusim.model.summary import model_summary

    m = model_summary("qwen3-0.6b")
    weights, kv = m["weight_bytes"], 4 * 1024 * m["kv_bytes_per_token"]
    code, out, err = cli("run", "--system", "atlas-800i-a2", "--nodes", "1", "--npus", "1", "--model", "qwen3-0.6b",
                         "--phase", "decode", "--batch", "4", "--kv", "1024", "--json")
    assert code == 0, err
    r = json.loads(out)
    for unit, suffix in ((1e9, "gb"), (2**30, "gib")):
        assert r[f"weights_{suffix}_per_die"] == pytest.approx(weights / unit, abs=1e-3)
        assert r[f"kv_{suffix}_per_die"] == pytest.approx(kv / unit, abs=1e-3)
        assert r[f"hbm_{suffix}_per_die"] == pytest.approx(64 * 2**30 / unit, abs=1e-3)
    code, out, err = cli("plan", "--system", "atlas-800i-a2", "--nodes", "1", "--npus", "1", "--model", "qwen3-0.6b",
                         "--batches", "4", "--kv", "1024", "--max-pp", "1", "--workers", "1", "--json")
    assert code == 0, err
    c = json.loads(out)["candidates"][0]
    assert c["weights_gb_per_die"] == pytest.approx(weights / 1e9, abs=1e-3)
    assert c["kv_gb_per_die"] == pytest.approx(kv / 1e9, abs=1e-3)


def test_a_deployment_step_reports_its_kv_in_gb(cli, monkeypatch):
    """The DeepSeek deployment path's kv_gb_per_die (and its validation row) held GiB too: 8
    sequences per die at 1,024 tokens of DeepSeek-R1's MLA latent, in 10^9 bytes."""
    from pathlib import Path

    from npusim.system.moe_step import kv_bytes_per_token
    monkeypatch.chdir(Path(__file__).resolve().parents[1])
    code, out, err = cli("run", "--system", "atlas-800i-a2", "--mapping", "mappers/a2-deepseek-decode.yaml",
                         "--phase", "decode", "--batch", "8", "--kv", "1024", "--json")
    assert code == 0, err
    r = json.loads(out)
    kv = 8 * 1024 * kv_bytes_per_token(get_config("deepseek-r1"))
    assert r["kv_gb_per_die"] == pytest.approx(kv / 1e9) and r["kv_gib_per_die"] == pytest.approx(kv / 2**30)
    assert r["weights_gb_per_die"] == pytest.approx(r["weights_gib_per_die"] * 2**30 / 1e9)


def test_plan_text_counts_points_and_impossible_plans_apart(cli):
    """Issue 41: the header said "0 plans rejected" above "rejected 20 x slo" (points), and a plan
    the model cannot take was listed at batch "bNone"."""
    code, out, err = cli("plan", "--system", "atlas-800i-a2", "--nodes", "1", "--npus", "3", "--model", "qwen3-0.6b",
                         "--batches", "3", "--max-pp", "1", "--slo-tpot-ms", "0.001", "--workers", "1",
                         "--no-progress")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].endswith("3 NPUs: 2 plans searched (2 more impossible: see below), 1 point simulated"), lines[0]
    assert "  rejected      1 point: 1 x slo; 2 plans impossible at any batch" in lines
    assert "    tp3 dp1 ep1 pp1 mb1 any batch: plan: tp 3 does not divide Qwen3-0.6B's 16 attention heads" in lines
    assert "None" not in out and "Pareto front (TPOT against tokens/s per NPU): none" in lines[3]


def test_a_hugging_face_config_runs_on_a_system(cli, tmp_path):
    """--model PATH/config.json (a dense Qwen2 and a MoE Qwen3 config) on the plan path, named by its folder."""
    dense = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 896,
             "intermediate_size": 4864, "num_hidden_layers": 4, "num_attention_heads": 14, "num_key_value_heads": 2,
             "vocab_size": 151936, "max_position_embeddings": 32768, "tie_word_embeddings": True}
    moe = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 1024,
           "intermediate_size": 3072, "moe_intermediate_size": 256, "num_hidden_layers": 4, "num_attention_heads": 16,
           "num_key_value_heads": 4, "head_dim": 64, "num_experts": 16, "num_experts_per_tok": 4,
           "vocab_size": 151936, "max_position_embeddings": 40960}
    for name, cfg, extra in (("Tiny-Qwen2", dense, ["--tp", "2"]), ("Tiny-MoE", moe, ["--dp", "2", "--ep", "2"])):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
        for phase in (["--phase", "decode", "--kv", "512"], ["--phase", "prefill", "--seq", "256"]):
            code, out, err = cli("run", "--system", "atlas-800i-a2", "--nodes", "1", "--npus", "2", "--model",
                                  str(tmp_path / name / "config.json"), "--batch", "4", *phase, *extra, "--json")
            assert code == 0, err
            r = json.loads(out)
            assert r["model"] == name and r["step_ms"] > 0


def test_an_onnx_export_runs_data_parallel_on_a_system(cli, tmp_path):
    from pathlib import Path
    onnx = Path(__file__).resolve().parents[1] / "examples" / "onnx" / "qwen3_tiny_opset18.onnx"
    code, out, err = cli("run", "--system", "atlas-800i-a2", "--nodes", "1", "--npus", "2", "--model", str(onnx),
                          "--phase", "decode", "--batch", "8", "--kv", "256", "--json", "--save-workload",
                          str(tmp_path / "w"))
    assert code == 0, err
    r = json.loads(out)
    assert r["model"] == "qwen3_tiny_opset18" and r["plan"]["dp"] == 2 and r["step_ms"] > 0
    # the runtime, as every config-built model on the system pays it (it was skipped)
    assert r["breakdown_us"]["launch"] > 0 and r["breakdown_us"]["host"] > 0 and 0 < r["fixed_share"] < 1
    code, out, err = cli("replay", str(tmp_path / "w"), "--system", "atlas-800i-a2", "--nodes", "1", "--json")
    assert code == 0 and json.loads(out)["step_ms"] == pytest.approx(r["step_ms"])
    code, _, err = cli("run", "--system", "atlas-800i-a2", "--nodes", "1", "--npus", "2", "--model", str(onnx),
                        "--tp", "2", "--dp", "1")
    assert code == 2 and "data parallel only" in err


@pytest.mark.parametrize("mtp", [0, 1])
def test_a_deployment_is_a_plan_plus_its_calibrated_constants(mtp):
    """B1's layout on Atlas 800I A2 (32 cards, DP attention, EP32 with 8 experts a card, the shared
    expert split over the 8 cards of a node): run as a deployment with the system's calibrated
    constants zeroed, it is exactly the plan path's step, runtime included (one mapper builds both,
    one runtime model times both: no launch_us = 0 switch); with them, slower."""
    from npusim.mapping.deployment import Deployment
    from npusim.system.moe_step import simulate_step
    from npusim.validate.calibrate import _variant

    a2 = load_system("atlas-800i-a2")
    bare = _variant(a2, {"moe_operators": {"other_kernels_us": 0.0, "dispatch_overhead_us": 0.0,
                                           "combine_overhead_us": 0.0}})
    dep = Deployment.model_validate(dict(phase="decode", npus=32, tp=1, ep=32, shared_tp=8, precision="w8a8"))
    built = simulate_step(bare, dep, batch=8, kv=3072, mtp=mtp)
    plan = ParallelPlan(npus=32, dp=32, ep=32, precision="w8a8", mtp=mtp, shared_tp=8)
    # the same runtime on both paths: exactly the same step
    out, wl, _ = simulate_plan_step(bare, "deepseek-r1", plan, StepShape("decode", 8 * 32, 1, 3072))
    assert out["step_ms"] == pytest.approx(built.step_ms, rel=1e-9)
    assert built.plan == plan.to_dict() and built.calibrated_ms == 0
    assert simulate_step(a2, dep, batch=8, kv=3072, mtp=mtp).step_ms > built.step_ms
    gathers = [n for n in wl.nodes if n["name"].endswith(".shared_gather")]
    assert gathers and all(np.asarray(n["bytes"])[0, 8:].sum() == 0 for n in gathers)  # within a node's 8 cards
    with pytest.raises(ConfigError, match="shared_tp 3"):
        check_plan(ParallelPlan(npus=32, dp=32, ep=32, shared_tp=3), get_config("deepseek-r1"), 1, 32)


def test_without_npus_the_instance_grows_to_the_fewest_nodes_that_hold_the_weights():
    """One node when the default plan holds the weights there; else the fewest whole nodes that do
    (DeepSeek-V3 in bf16: ~1.3 TB of weights over one CloudMatrix384 node's 16 dies of 64 GiB is
    ~84 GB a die, over two nodes' 32 dies ~51 GB); an explicit --npus is kept (and may not fit)."""
    from npusim.system.step import default_npus

    cm = load_system("cloudmatrix384")
    assert default_npus(cm, get_config("qwen3-4b"), {}) == cm.system.npus_per_node
    npus = default_npus(cm, get_config("deepseek-v3"), {"precision": "bf16"})
    assert npus == 2 * cm.system.npus_per_node
    plan = default_plan(get_config("deepseek-v3"), npus, cm.system.npu.dies, precision="bf16")
    weights, _ = memory_per_rank_gb(get_config("deepseek-v3"), plan, StepShape("decode", 1, 1, 2))
    one = default_plan(get_config("deepseek-v3"), npus // 2, cm.system.npu.dies, precision="bf16")
    weights_one, _ = memory_per_rank_gb(get_config("deepseek-v3"), one, StepShape("decode", 1, 1, 2))
    hbm = summarize(cm.chip).hbm_gb
    assert weights < hbm <= weights_one
