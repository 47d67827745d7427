"""The benchmark client (npusim.serving.client; ``npusim run --dataset random ... --max-concurrency C``):
vLLM's length and arrival rules, the closed loop's concurrency limit on a chip and on a system,
Little's law, every token made once, the metric definitions on hand-made records, the sweep's
rows and the flags' one-line errors."""

import json
import math

import numpy as np
import pytest

from npusim.cli import main
from npusim.errors import ConfigError
from npusim.mapping.spec import spec_from_flags
from npusim.serving.client import ClosedLoop, bench_row, random_lengths, send_times, sweep_table
from npusim.serving.metrics import RequestRecord, summarize
from npusim.serving.requests import Fixed, Request, Uniform, synthetic_requests
from npusim.serving.scheduler import SchedulerConfig
from npusim.serving.simulate import ServingConfig, simulate_serving

SPEC = spec_from_flags(tp=4, stages=2, layout="ring").model_copy(update={"data_parallel": 1})


# ----------------------------------------------------------------------------- the rules


def test_random_lengths_follow_vllm_random_dataset():
    """[floor(L(1-R)), ceil(L(1+R))], fixed at R = 0, outputs at least 1, R in [0, 1)."""
    assert random_lengths(512, 0.0, "--input-len") == Fixed(512)
    assert random_lengths(100, 0.25, "--input-len") == Uniform(75, 125)
    assert random_lengths(10, 0.33, "--input-len") == Uniform(6, 14)  # floor 6.7, ceil 13.3
    assert random_lengths(1, 0.5, "--output-len") == Uniform(1, 2)  # floor 0.5 -> 0 -> at least 1
    for bad in (1.0, -0.1):
        with pytest.raises(ConfigError, match="--range-ratio"):
            random_lengths(100, bad, "--input-len")
    draws = Uniform(75, 125).sample(np.random.default_rng(0), 5000)
    assert draws.min() == 75 and draws.max() == 125 and abs(draws.mean() - 100) < 1.0


def test_send_times_inf_constant_and_poisson():
    assert list(send_times(3, math.inf, 1.0, 0)) == [0.0, 0.0, 0.0]
    assert list(send_times(3, 2.0, math.inf, 0)) == [0.0, 0.5, 1.0]
    t = send_times(4001, 10.0, 1.0, 7)
    gaps = np.diff(t)
    assert t[0] == 0.0 and abs(gaps.mean() - 0.1) < 0.005  # 4000 exponential gaps: sd of the mean 1.6%
    assert abs(gaps.std() / gaps.mean() - 1.0) < 0.05  # Poisson: cv 1
    bursty = np.diff(send_times(4001, 10.0, 0.25, 7))
    assert bursty.std() / bursty.mean() > 1.6  # gamma shape 0.25: cv 2
    assert list(send_times(50, 10.0, 1.0, 7)) == list(send_times(50, 10.0, 1.0, 7))


def test_closed_loop_sends_at_the_later_of_plan_and_a_free_slot():
    reqs = [Request(i, 0.5 * i, 10, 2) for i in range(4)]  # planned at 0, 0.5, 1.0, 1.5 s
    loop = ClosedLoop(reqs, 2)
    assert [(r.id, r.arrival_s) for r in loop.initial()] == [(0, 0.0), (1, 0.5)]
    assert [(r.id, r.arrival_s) for r in loop.on_finish(0.7)] == [(2, 1.0)]  # planned later than the free slot
    assert [(r.id, r.arrival_s) for r in loop.on_finish(2.0)] == [(3, 2.0)]  # waited for a slot
    assert loop.on_finish(2.1) == [] and loop.on_finish(2.2) == [] and loop.peak == 2
    with pytest.raises(ConfigError, match="--max-concurrency"):
        ClosedLoop(reqs, 0)


def test_metric_definitions_on_hand_made_records():
    """Request a: sent 0, tokens at 0.1, 0.3, 0.6 s: TTFT 100 ms, TPOT (0.6 - 0.1) / 2 = 250 ms, ITL 200
    and 300 ms. Request b: sent 0.2, tokens at 0.5, 0.6: TTFT 300 ms, TPOT 100 ms, ITL 100 ms. Duration
    0 -> 0.6 s."""
    a = RequestRecord(0, 0.0, 10, 3, first_scheduled_s=0.0, token_times_s=[0.1, 0.3, 0.6], finish_s=0.6)
    b = RequestRecord(1, 0.2, 20, 2, first_scheduled_s=0.2, token_times_s=[0.5, 0.6], finish_s=0.6)
    s = summarize([a, b], slo_tpot_s=0.2)
    assert s["ttft_ms"]["mean"] == pytest.approx(200) and s["ttft_ms"]["median"] == pytest.approx(200)
    assert s["tpot_ms"]["mean"] == pytest.approx(175) and s["tpot_ms"]["p99"] == pytest.approx(250 - 0.01 * 150)
    assert s["itl_ms"]["mean"] == pytest.approx(200) and s["itl_ms"]["median"] == pytest.approx(200)
    assert s["itl_ms"]["std"] == pytest.approx(math.sqrt(20000 / 3))
    assert s["request_throughput"] == pytest.approx(2 / 0.6)
    assert s["output_throughput"] == pytest.approx(5 / 0.6)
    assert s["total_token_throughput"] == pytest.approx(35 / 0.6)
    assert s["request_goodput"] == pytest.approx(1 / 0.6)  # a's TPOT 250 ms misses the 200 ms objective
    assert s["mean_concurrency"] == pytest.approx((0.6 + 0.4) / 0.6)
    assert s["requests_per_s"] == s["request_throughput"] and s["tbt_ms"] == s["itl_ms"]  # the old keys stay
    row = bench_row(s, 2)
    assert row["max_concurrency"] == 2 and row["tpot_ms"]["mean"] == pytest.approx(175)
    assert "TPOT mean" in sweep_table([row]) and "175.0" in sweep_table([row])


# ----------------------------------------------------------------------------- closed loops


def _in_flight_at(records, t: float) -> int:
    """Requests sent at or before ``t`` and not finished by then (one finishing at ``t`` has left)."""
    return sum(1 for r in records if r.arrival_s <= t < r.finish_s)


def _time_average_in_flight(records) -> float:
    """The area under the number in flight over [first send, last finish], divided by that span."""
    start, end = min(r.arrival_s for r in records), max(r.finish_s for r in records)
    return sum(r.finish_s - r.arrival_s for r in records) / (end - start)


def check_closed_loop(records, reqs, c: int, summary: dict) -> None:
    """Never more than ``c`` in flight, exactly ``c`` at every send while requests remain; every
    request made exactly its output tokens, once; Little's law."""
    by_id = {r.id: r for r in reqs}
    assert summary["requests_completed"] == len(reqs)
    for rec in records:
        assert len(rec.token_times_s) == by_id[rec.id].output_len and rec.finish_s == rec.token_times_s[-1]
        assert rec.arrival_s >= by_id[rec.id].arrival_s  # never sent before planned
    sends = sorted(r.arrival_s for r in records)
    assert max(_in_flight_at(records, t) for t in sends) == c
    # a request beyond the first c is sent exactly when another finishes (all planned at 0)
    finishes = {r.finish_s for r in records}
    assert all(r.arrival_s in finishes for r in records if r.arrival_s > 0)
    # Little's law: throughput x mean latency is the time-averaged number in flight (an identity of
    # the definitions, duration = first send to last finish) ...
    little = summary["request_throughput"] * summary["e2e_ms"]["mean"] / 1e3
    assert little == pytest.approx(_time_average_in_flight(records), rel=1e-9)
    assert little == pytest.approx(summary["mean_concurrency"], rel=1e-9)
    # ... which is c until the last send and falls only while the loop drains: at most c, and at
    # least c x (last send / duration)
    last_send, duration = max(sends), summary["duration_s"]
    assert c * last_send / duration - 1e-9 <= little <= c + 1e-9


def test_closed_loop_on_a_chip(arch64):
    """12 prompts of varied lengths, at most 3 in flight. Little's law within 15% of C here: with 4
    rounds of C requests the drain (the last round, ending unevenly) is at most ~1/4 of the run,
    where fewer than C are in flight, so concurrency = throughput x latency sits just below C."""
    reqs = synthetic_requests(12, math.inf, input_len=Uniform(16, 160), output_len=Uniform(2, 16), seed=5)
    cfg = ServingConfig(model="qwen3-0.6b", layers=2, debug=True,
                        scheduler=SchedulerConfig(policy="fusion", budget=256, chunk_tokens=64, max_batch=8))
    run = simulate_serving(arch64, SPEC, reqs, cfg, max_concurrency=3)
    check_closed_loop(run.records, reqs, 3, run.summary)
    assert 0.85 * 3 <= run.summary["mean_concurrency"] <= 3
    again = simulate_serving(arch64, SPEC, reqs, cfg, max_concurrency=3)
    assert [r.token_times_s for r in again.records] == [r.token_times_s for r in run.records]


def test_closed_loop_with_pd_disaggregation_and_a_planned_rate(arch64):
    """PD disaggregation on the chip (a request finishes on the decode instance) and sends planned
    at 50 per second: never sent before planned, never more than 2 in flight."""
    reqs = synthetic_requests(8, math.inf, input_len=Uniform(16, 200), output_len=Uniform(2, 10), seed=5)
    times = send_times(8, 50.0, 1.0, 5)
    reqs = [Request(r.id, float(t), r.input_len, r.output_len) for r, t in zip(reqs, times)]
    cfg = ServingConfig(model="qwen3-0.6b", layers=2, debug=True,
                        scheduler=SchedulerConfig(policy="continuous", chunk_tokens=64, max_batch=8))
    run = simulate_serving(arch64, SPEC, reqs, cfg, pd=(16, 8), max_concurrency=2)
    assert run.summary["requests_completed"] == 8 and run.summary["kv_transfers"] == 8
    by_id = {r.id: r for r in reqs}
    assert all(rec.arrival_s >= by_id[rec.id].arrival_s for rec in run.records)
    assert all(len(rec.token_times_s) == rec.output_len for rec in run.records)
    assert max(_in_flight_at(run.records, rec.arrival_s) for rec in run.records) <= 2
    assert run.summary["mean_concurrency"] <= 2


@pytest.mark.slow  # several seconds warm (session 48): left out of the fast suite, run by CI's slow pass
def test_closed_loop_on_a_system():
    """The same client on the system loop: Qwen3-0.6B, TP-2 prefill and TP-4 x DP-2 decode on a
    CloudMatrix384 of 2 nodes, 10 prompts, at most 4 in flight."""
    from npusim.mapping.deployment import SystemServing
    from npusim.system.load import load_system
    from npusim.system.plan import ParallelPlan
    from npusim.system.serving import simulate_system_serving

    plan = SystemServing.model_validate({"prefill": {"mapping": "-", "instances": 2, "tokens_per_npu": 2048},
                                         "decode": {"mapping": "-", "max_batch_per_npu": 8},
                                         "kv_transfer": {"fabric": "rdma"}})
    reqs = synthetic_requests(10, math.inf, input_len=Uniform(64, 600), output_len=Uniform(2, 12), seed=2)
    run = simulate_system_serving(load_system("cloudmatrix384", nodes=2), plan, ParallelPlan(npus=1, tp=2),
                                  ParallelPlan(npus=4, tp=4, dp=2), reqs, model="qwen3-0.6b", max_concurrency=4)
    check_closed_loop(run.records, reqs, 4, run.summary)


# ----------------------------------------------------------------------------- the command line


CHIP = ["run", "--arch", "npusim-64c", "--model", "qwen3-0.6b", "--layers", "2", "--dataset", "random",
        "--input-len", "64", "--output-len", "8", "--num-prompts", "6", "--json", "--no-progress"]


def _json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_client_summary_and_sweep_rows(capsys):
    s = _json(capsys, *CHIP, "--max-concurrency", "2", "--range-ratio", "0.5", "--slo-tpot-ms", "1000")
    for key in ("ttft_ms", "tpot_ms", "itl_ms"):
        assert {"mean", "median", "p99"} <= set(s[key]) and s[key]["mean"] > 0
    assert s["max_concurrency"] == 2 and s["request_rate"] == "inf" and s["dataset"] == "random"
    assert s["requests_completed"] == 6 and s["request_goodput"] == pytest.approx(s["request_throughput"])
    assert s["output_throughput"] * s["duration_s"] == pytest.approx(s["output_tokens"])
    assert 6 * 4 <= s["output_tokens"] <= 6 * 12 and s["output_tokens"] != 6 * 8  # outputs in [4, 12], spread
    out = _json(capsys, *CHIP, "--sweep-concurrency", "1,3")
    assert [r["max_concurrency"] for r in out["rows"]] == [1, 3]
    assert out["rows"][0]["mean_concurrency"] == pytest.approx(1.0)  # one at a time: always exactly one in flight
    assert all(r["requests_completed"] == 6 and r["output_throughput"] > 0 for r in out["rows"])
    assert main([a for a in CHIP if a != "--json"] + ["--sweep-concurrency", "1,3"]) == 0
    assert "concurrency" in capsys.readouterr().out


def test_cli_request_rate_spaces_the_sends(capsys):
    s = _json(capsys, *CHIP, "--request-rate", "4", "--burstiness", "inf")
    assert s["request_rate"] == 4.0 and s["burstiness"] == "inf"
    assert s["duration_s"] > 5 * 0.25  # the last of 6 is sent at 1.25 s


@pytest.mark.parametrize("extra, words", [
    (["--max-concurrency", "0"], ["--max-concurrency", "positive integer"]),
    (["--sweep-concurrency", "1,x"], ["--sweep-concurrency", "1,x", "positive integers"]),
    (["--sweep-concurrency", "2,2"], ["--sweep-concurrency", "distinct"]),
    (["--dataset", "nope"], ["--dataset", "nope"]),
    (["--range-ratio", "1.0"], ["--range-ratio", "[0, 1)"]),
    (["--input-len", "16:64"], ["--input-len", "one number"]),
    (["--requests", "4"], ["--num-prompts", "--requests"]),
    (["--rate", "4", "--request-rate", "2"], ["--request-rate", "--rate"]),
    (["--max-concurrency", "2", "--sweep-concurrency", "1,2"], ["--max-concurrency", "--sweep-concurrency"]),
    (["--burstiness", "2"], ["--burstiness", "--request-rate"]),
])
def test_bad_client_flags_are_one_line_errors(capsys, extra, words):
    argv = [a for a in CHIP if a not in ("--json",)]
    if "--input-len" in extra:
        i = argv.index("--input-len")
        argv[i:i + 2] = []
    assert main(argv + extra) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    assert all(w in err for w in words), err


def test_range_ratio_needs_the_random_dataset(capsys):
    assert main(["run", "--num-prompts", "2", "--range-ratio", "0.2", "--no-progress"]) == 2
    assert "--range-ratio" in capsys.readouterr().err
