"""Serving a request stream on a multi-NPU system (npusim.system.serving): every request completes
with its tokens, KV bytes and pool blocks are conserved, the knobs move results the right way, and
impossible plans get clear errors. A small slice of CloudMatrix384 (two nodes) keeps it quick."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment, SystemServing
from npusim.mapping.spec import load_system_serving
from npusim.model.zoo import get_config
from npusim.serving.requests import Request
from npusim.system.kv_pool import KVPool
from npusim.system.load import load_system
from npusim.system.moe_step import kv_bytes_per_token
from npusim.system.serving import simulate_system_serving
from npusim.system.step_table import StepTable, grid

ROOT = Path(__file__).resolve().parents[1]
KVB = kv_bytes_per_token(get_config("deepseek-r1"))


@pytest.fixture(scope="module")
def cm1():
    return load_system("cloudmatrix384", nodes=2)  # 16 NPUs = 32 dies, 8 CPUs


def _plan(**kw):
    base = {"prefill": {"mapping": "-", "instances": 2, "tokens_per_npu": 2048},
            "decode": {"mapping": "-", "max_batch_per_npu": 8},
            "kv_transfer": {"fabric": "rdma"},
            "caching_pool": {"enabled": True, "fabric": "ub"},
            "slo_ttft_ms": 5000, "slo_tpot_ms": 500}
    base.update(kw)
    return SystemServing.model_validate(base)


PDEP = Deployment.model_validate(dict(phase="prefill", npus=4, tp=1, precision="w8a8"))  # EP8: 32 experts a die
DDEP = Deployment.model_validate(dict(phase="decode", npus=8, tp=1, precision="w8a8"))  # EP16: 16 experts a die


def _requests(n=6, shared_prefix=True):
    """Prompts of 1,024 tokens (2 blocks) every 50 ms; with ``shared_prefix`` all share block 0 and
    every other one repeats its predecessor's prompt entirely."""
    reqs = []
    for i in range(n):
        first = 0 if shared_prefix else 1000 + i
        second = (100 + i - (i % 2)) if shared_prefix else 2000 + i
        reqs.append(Request(i, 0.05 * i, 1024, 4 + i % 3, (first, second)))
    return reqs


@pytest.fixture(scope="module")
def run(cm1):
    return simulate_system_serving(cm1, _plan(), PDEP, DDEP, _requests())


def test_every_request_completes_with_its_tokens(run):
    s = run.summary
    assert s["requests_completed"] == 6 and s["requests_rejected"] == 0
    for rec in run.records:
        assert len(rec.token_times_s) == rec.output_len
        assert rec.token_times_s == sorted(rec.token_times_s)
        assert rec.ttft_s > 0 and rec.finish_s >= rec.token_times_s[0]
    assert s["npus_total"] == 2 * 4 + 8
    assert s["tokens_per_s_per_npu"] == pytest.approx(s["output_tokens"] / s["duration_s"] / 16)


def test_kv_bytes_and_pool_blocks_are_conserved(run):
    s = run.summary
    assert s["kv_transfer"]["bytes"] == sum(r.input_len * KVB for r in run.records if r.output_len > 1)
    pool = s["caching_pool"]
    assert pool["blocks_inserted"] - pool["blocks_evicted"] == pool["blocks_held"]
    # distinct blocks of the workload: block 0 and one second block per pair of requests
    assert pool["blocks_held"] == 1 + 3
    assert pool["prefill_tokens_saved"] == sum(r.prefix_hit_tokens for r in run.records) > 0
    assert 0 < pool["hit_rate"] <= 1


def test_caching_pool_saves_prefill_and_off_saves_nothing(cm1, run):
    off = simulate_system_serving(cm1, _plan(), PDEP, DDEP, _requests(), caching_pool=False).summary
    assert off["caching_pool"] is None and off["prefix_hit_tokens"] == 0
    assert run.summary["ttft_ms"]["mean"] < off["ttft_ms"]["mean"]


def test_ub_moves_kv_faster_than_rdma(cm1, run):
    ub = simulate_system_serving(cm1, _plan(), PDEP, DDEP, _requests(), kv_fabric="ub").summary
    assert ub["kv_transfer"]["fabric"] == "ub"
    assert ub["kv_transfer"]["mean_ms"] < run.summary["kv_transfer"]["mean_ms"]
    # at most the link: 1,024 tokens of KV over one die's RDMA port (25 GB/s) takes at least this long
    assert run.summary["kv_transfer"]["mean_ms"] >= 1024 * KVB / 25e9 * 1e3


def test_mtp_makes_more_tokens_per_step(cm1, run):
    mtp = simulate_system_serving(cm1, _plan(), PDEP, DDEP, _requests(), mtp=1, mtp_acceptance=1.0).summary
    assert mtp["decode_steps"] < run.summary["decode_steps"]
    assert mtp["output_tokens"] == run.summary["output_tokens"]


def test_same_seed_same_result(cm1, run):
    again = simulate_system_serving(cm1, _plan(), PDEP, DDEP, _requests())

    def same(s):  # chip-cost cache counters differ (the second run hits the cache)
        return json.dumps({k: v for k, v in s.items() if k != "chip_cost"}, sort_keys=True)

    assert same(again.summary) == same(run.summary)
    assert [r.token_times_s for r in again.records] == [r.token_times_s for r in run.records]


def test_goodput_judges_ttft_and_tpot(run):
    s = run.summary
    assert s["slo_ttft_ms"] == 5000 and s["slo_tpot_ms"] == 500
    met = [r for r in run.records if r.ttft_s <= 5.0 and (r.tpot_s is None or r.tpot_s <= 0.5)]
    assert s["slo_met_requests"] == len(met)
    assert s["goodput_tokens_per_s"] == pytest.approx(sum(r.output_len for r in met) / s["duration_s"])


def test_impossible_plans_are_clear_errors(cm1):
    with pytest.raises(ConfigError, match="NPUs"):
        simulate_system_serving(cm1, _plan(prefill={"mapping": "-", "instances": 3}), PDEP, DDEP, _requests())
    with pytest.raises(ConfigError, match="fabric 'nvlink'"):
        simulate_system_serving(cm1, _plan(), PDEP, DDEP, _requests(), kv_fabric="nvlink")
    with pytest.raises(ConfigError, match="caching_pool"):
        simulate_system_serving(cm1, _plan(caching_pool=None), PDEP, DDEP, _requests(), caching_pool=True)


def test_a_request_too_long_for_a_decode_die_is_rejected(cm1):
    """DeepSeek-V3's context (163,840 tokens) fits a decode die's KV room, so a die can refuse a
    request only for a model whose config does not bound the context: this one."""
    unbounded = {**get_config("deepseek-v3").to_dict(), "max_position_embeddings": 0}
    reqs = [Request(0, 0.0, 256, 4), Request(1, 0.0, 3_000_000, 4)]
    s = simulate_system_serving(cm1, _plan(caching_pool=None), PDEP, DDEP, reqs, model=unbounded).summary
    assert s["requests_completed"] == 1 and s["requests_rejected"] == 1
    # a benchmark client's slot frees when its request is rejected: one at a time, request 1 is sent
    # when 0 finishes and rejected then, so 2 is sent at that moment too (else it would never be)
    third = [Request(0, 0.0, 256, 4), Request(1, 0.0, 3_000_000, 4), Request(2, 0.0, 256, 4)]
    run = simulate_system_serving(cm1, _plan(caching_pool=None), PDEP, DDEP, third, model=unbounded,
                                  max_concurrency=1)
    rec = {r.id: r for r in run.records}
    assert run.summary["requests_completed"] == 2 and run.summary["requests_rejected"] == 1
    assert rec[0].arrival_s == 0.0 and rec[1].arrival_s == rec[2].arrival_s == rec[0].finish_s
    with pytest.raises(ConfigError, match="context of 163,840"):  # the model as published refuses it up front
        simulate_system_serving(cm1, _plan(caching_pool=None), PDEP, DDEP, reqs)


def test_shipped_serving_mappings_load():
    plan, pdep, ddep = load_system_serving(ROOT / "mappers" / "cm384-deepseek-serving.yaml")
    assert (pdep.phase, ddep.phase, pdep.npus, ddep.npus) == ("prefill", "decode", 16, 160)
    assert ddep.npus + plan.prefill.instances * pdep.npus <= 384
    plan, pdep, ddep = load_system_serving(ROOT / "mappers" / "a2-deepseek-serving.yaml")
    assert ddep.npus + plan.prefill.instances * pdep.npus == 6 * 8  # the file says: --nodes 6


@pytest.mark.slow  # all of CloudMatrix384 (176 NPUs) in a fresh interpreter; the tests above serve a 2-node slice
def test_cli_serves_a_trace_on_a_system(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": 100 * i, "input_length": 512, "output_length": 3,
                                         "hash_ids": [7]}) + "\n" for i in range(3)))
    mapping = tmp_path / "serving.yaml"
    mapping.write_text(
        "system_serving:\n"
        "  prefill: {mapping: " + str(ROOT / "mappers" / "cm384-deepseek-prefill.yaml") + ", instances: 1}\n"
        "  decode: {mapping: " + str(ROOT / "mappers" / "cm384-deepseek-decode.yaml") + "}\n"
        "  kv_transfer: {fabric: rdma}\n")
    p = subprocess.run([sys.executable, "-m", "npusim", "run", "--system", "cloudmatrix384", "--trace", str(trace),
                        "--mapping", str(mapping), "--json", "--no-progress", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["requests_completed"] == 3 and out["npus_total"] == 176
    for name in ("summary.json", "serving.h5", "timeline.json"):
        assert (tmp_path / "o" / name).is_file()
    events = json.loads((tmp_path / "o" / "timeline.json").read_text())["traceEvents"]
    assert {e["name"] for e in events if e.get("ph") == "b"} >= {"prefill0 iteration", "decode iteration", "decode"}


def test_the_serving_header_says_mtp_off_rather_than_an_acceptance(run, capsys):
    """Issue 41: "MTP 0 at 0.7" in ``npusim run --system ... --trace``'s header."""
    from npusim.cli.run_system import _print_serving

    assert run.summary["mtp"] == 0
    _print_serving(run.summary)
    header = capsys.readouterr().out.splitlines()[0]
    assert header.endswith("NPUs (MTP off)") and "0.7" not in header, header


def test_step_table_grid_and_bilinear_interpolation():
    assert grid(1, 20) == [1, 2, 3, 4, 6, 8, 12, 16]

    calls = []

    def plane(x, y):  # a step time linear in x and y: bilinear interpolation must be exact
        calls.append((x, y))
        return 2.0 * x + 0.01 * y + 3.0

    t = StepTable(plane, "decode", x_max=64, y_max=8192)
    assert t.xs == grid(1, 64) and t.ys == grid(128, 8192)
    for x, y in ((1, 128), (5, 300), (47.5, 5000), (64, 8192)):
        assert t.step_ms(x, y) == pytest.approx(2.0 * x + 0.01 * y + 3.0)
    assert t.step_ms(0.2, 50) == pytest.approx(t.step_ms(1, 128))  # below the grid: its first point
    with pytest.raises(ConfigError, match="beyond"):
        t.step_ms(65, 128)


@settings(max_examples=examples(50), deadline=None)
@given(st.integers(0, 6), st.lists(st.lists(st.integers(0, 12), min_size=1, max_size=5), max_size=30))
def test_pool_holds_at_most_its_capacity_and_conserves_blocks(cap, prompts):
    pool = KVPool(cap, cpus=4)
    for p in prompts:
        held = pool.held_prefix(tuple(p))
        assert pool.lookup(tuple(p)) == held
        pool.insert(tuple(p))
        assert len(pool) <= cap
        assert pool.inserted - pool.evicted == len(pool)


def test_transfers_of_different_batches_share_the_fabric(cm1):
    """One fabric for the whole run: a KV write started while another is in flight to the same
    die shares that die's port, so both end later than alone; one started after the first ended
    takes what it takes alone. The groups' events come back in end order, never before the
    serving clock reaches them."""
    from npusim.system.serving import KV_ARRIVED, _LiveFabric

    topo = cm1.topology
    a, b, dst = (topo.endpoint(n) for n in ("npu0.die0", "npu1.die0", "npu2.die0"))
    big = 256 << 20

    def run(starts):
        fab = _LiveFabric(cm1, "flow")
        for i, (src, t0) in enumerate(starts):
            fab.start(t0, [([src], [dst], [big], "write", "ub", "sdma")], [(KV_ARRIVED, i)])
        out = []
        for horizon in (1e-4, None):
            out += fab.advance(horizon)
        assert all(end >= t0 for (end, _, i, _), (_, t0) in zip(sorted(out, key=lambda o: o[2]), starts))
        return {i: float(d[0]) for _, _, i, d in out}

    alone = run([(a, 0.0)])[0]
    both = run([(a, 0.0), (b, alone / 4)])
    assert both[0] > alone * 1.2 and both[1] > alone * 1.2  # they shared the destination's port
    after = run([(a, 0.0), (b, alone * 1.5)])
    assert after[0] == pytest.approx(alone, rel=1e-6) and after[1] == pytest.approx(alone, rel=1e-6)


def test_any_model_serves_by_parallel_plans(cm1):
    """Qwen3-0.6B with TP-2 prefill instances and a TP-4 x DP-2 decode instance: every request
    completes, each decode unit is a TP group whose dies each receive their share of a prompt's KV
    (8 KV heads over 4 dies: 1/4 each, so the bytes moved equal the prompts' KV), and the run is
    deterministic."""
    from npusim.system.plan import ParallelPlan
    cfg = get_config("qwen3-0.6b")
    pplan, dplan = ParallelPlan(npus=1, tp=2), ParallelPlan(npus=4, tp=4, dp=2)
    reqs = _requests()
    run = simulate_system_serving(cm1, _plan(caching_pool=None), pplan, dplan, reqs, model="qwen3-0.6b")
    s = run.summary
    assert s["requests_completed"] == len(reqs) and s["npus_decode"] == 4 and s["npus_prefill"] == 2
    assert s["instances"]["decode"].startswith("plan tp4 dp2")
    assert s["kv_transfer"]["bytes"] == pytest.approx(sum(r.input_len for r in reqs) * kv_bytes_per_token(cfg))
    again = simulate_system_serving(cm1, _plan(caching_pool=None), pplan, dplan, reqs, model="qwen3-0.6b")
    assert again.summary["ttft_ms"] == s["ttft_ms"] and again.summary["tpot_ms"] == s["tpot_ms"]
    with pytest.raises(ConfigError, match="no multi-token-prediction module"):
        simulate_system_serving(cm1, _plan(caching_pool=None), pplan, dplan, reqs, model="qwen3-0.6b", mtp=1)
