"""The iteration cache's accounting adds up on a prefix of the README's trace, and a rerun from its
directory reproduces the timings (no wall-clock limit here: validation/perf/bench_serving.py --readme
times the README's run)."""

from dataclasses import replace

from npusim.arch import load_arch
from npusim.mapping.spec import spec_from_flags


def _bench_serving(name: str):
    """``validation/perf/bench_serving.py`` loaded as a module named ``name`` (it is a script, not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "validation" / "perf" / "bench_serving.py"
    spec = importlib.util.spec_from_file_location(name, path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_iteration_cache_accounts_for_every_iteration_of_a_trace_prefix(tmp_path):
    """The README's trace, first request, two layers: each iteration is a hit or a miss, every
    miss simulates one shape (two when part of the KV is in HBM: the placement's two ends), and a
    run that finds the shapes on disk simulates none and gives the same timings."""
    from pathlib import Path

    from npusim.serving.requests import fit_context
    from npusim.serving.scheduler import SchedulerConfig
    from npusim.serving.simulate import ServingConfig, simulate_serving
    from npusim.serving.itercache import EXACT
    from npusim.serving.traces import load_trace

    trace = Path(__file__).resolve().parents[1] / "traces" / "mooncake_sample.jsonl"
    reqs, _ = fit_context(load_trace(trace, first=1), 40960)
    reqs = [replace(r, output_len=40) for r in reqs]
    arch = load_arch("npusim-64c")
    spec = spec_from_flags(tp=4, stages=2, layout="ring").model_copy(update={"data_parallel": 1})
    cfg = ServingConfig(model="qwen3-4b", layers=2, scheduler=SchedulerConfig(policy="fusion", budget=1024),
                        iteration_cache=EXACT, iteration_cache_dir=tmp_path)
    first = simulate_serving(arch, spec, reqs, cfg).summary
    ic = first["iteration_cache"]
    assert ic["hits"] + ic["misses"] == first["iterations"]
    assert ic["misses"] <= ic["shapes_simulated"] <= 2 * ic["misses"]
    # a lone prompt's chunks each attend to a longer prefix: one new shape per chunk
    chunks = -(-reqs[0].input_len // 512)
    assert ic["misses"] >= chunks
    again = simulate_serving(arch, spec, reqs, cfg).summary
    assert again["iteration_cache"]["shapes_simulated"] == 0
    assert again["iteration_cache"]["shapes_from_disk"] == ic["shapes_simulated"]
    for key in ("simulated_s", "ttft_ms", "tbt_ms", "e2e_ms", "throughput_tokens_per_s", "iterations"):
        assert again[key] == first[key]


def test_bench_serving_stream_labels_parse_and_a_bad_one_says_what_was_expected():
    """``bench_serving.py --streams``: ``flow@Q`` holds a head-of-line pass ``Q`` cycles, ``flow~S``
    keeps a sharing ``S`` cycles, ``flow@Q~S`` both; anything else with ``@`` or ``~`` stops the run
    before any point with the forms expected."""
    import pytest

    bench = _bench_serving("bench_serving_under_test")
    assert bench.stream_variant("reserve") == "reserve"
    assert bench.stream_variant("flow-all") == "flow"
    assert bench.stream_variant("flow-nomemo") == "flow"
    assert bench.stream_variant("flow@1024") == "flow@1024"
    assert bench.stream_variant("flow~64") == "flow~64"
    assert bench.stream_variant("flow-nomemo@1024~64") == "flow@1024~64"
    for bad in ("reserve@8", "flow~x", "flow@", "flow@-1", "hop~4", "flows"):
        with pytest.raises(SystemExit, match="flow@CYCLES"):
            bench.stream_variant(bad)
    # fewer layers than pipeline stages: a usage error naming the minimum, before any point runs
    with pytest.raises(SystemExit) as stop:
        bench.main(["--requests", "1", "--layers", "4"])
    assert stop.value.code == 2


def test_bench_serving_times_both_nocs_in_one_run(capsys):
    """``bench_serving.py --noc analytical,path --streams flow@Q~S`` (issue 42 item 4's command): both
    points run and the path NoC's wall time over the analytical's is printed (session 60's last commit
    asked the analytical point for a stream spec and stopped the run; found in session 61)."""
    bench = _bench_serving("bench_serving_both")
    bench.main(["--requests", "1", "--layers", "16", "--noc", "analytical,path", "--streams", "flow@16384~256",
                "--max-input", "64", "--max-output", "2"])
    out = capsys.readouterr().out
    assert " analytical " in out and "path/flow@16384~256" in out
    assert "path/flow@16384~256 / analytical wall time (off cache):" in out


def test_bench_serving_draws_of_jittered_arrivals_print_each_variants_mean_and_spread(capsys):
    """``bench_serving.py --jitter-ms J --seeds ...`` (session 63): each draw moves every arrival later by
    less than ``J`` ms, the same draw for the same seed; each point runs once per draw and the run prints
    each variant's mean and spread over them and each flow variant's change of means with its standard
    error. A negative jitter or a seed that is not an integer is a usage error."""
    import pytest

    from npusim.serving.requests import Request

    bench = _bench_serving("bench_serving_draws")
    reqs = [Request(id=i, arrival_s=float(i // 2), input_len=64, output_len=4) for i in range(6)]
    assert bench.jittered(reqs, 0.0, 1) is reqs
    one, again, other = bench.jittered(reqs, 2.0, 1), bench.jittered(reqs, 2.0, 1), bench.jittered(reqs, 2.0, 2)
    late = [b.arrival_s - a.arrival_s for a, b in zip(reqs, one)]
    assert all(0.0 <= d < 2e-3 for d in late) and len(set(late)) == len(late)
    assert [r.arrival_s for r in again] == [r.arrival_s for r in one] != [r.arrival_s for r in other]
    assert [(r.id, r.input_len, r.output_len) for r in one] == [(r.id, r.input_len, r.output_len) for r in reqs]
    for bad in (["--jitter-ms", "-1"], ["--jitter-ms", "1", "--seeds", "1,x"]):
        with pytest.raises(SystemExit) as stop:
            bench.main(["--requests", "1"] + bad)
        assert stop.value.code == 2
    bench.main(["--requests", "2", "--layers", "16", "--noc", "path", "--streams", "flow,flow~256",
                "--max-input", "64", "--max-output", "2", "--jitter-ms", "1", "--seeds", "1,2"])
    out = capsys.readouterr().out
    assert "path/flow #1" in out and "path/flow~256 #2" in out
    assert "path/flow~256 (off cache) over 2 draws of arrivals moved 0..1 ms: simulated s" in out
    assert "path/flow~256 against path/flow (off cache) (means of 2 draws, +- one standard error): simulated s" in out
    assert "iteration latency at the same states" in out


def test_iteration_latency_at_matched_states_compares_only_states_both_runs_met():
    """``bench_serving.latency_at_matched_states``: iterations are keyed by the iterations then in flight
    and their shape; a run against itself is 0% with every iteration matched, a run whose iterations all
    take 10% longer is +10% whatever the order, a state only one run met is left out of the change, and
    pooled runs (draws) are each keyed on their own timeline."""
    import pytest

    bench = _bench_serving("bench_serving_states")

    def it(start, lat, decodes=2, tokens=2, frac=0.5):
        return {"instance": "chip", "submitted_s": start, "end_s": start + lat, "decodes": decodes,
                "tokens": tokens, "kv_hbm_fraction": frac}

    ref = [it(0.0, 1.0), it(0.5, 1.0), it(2.0, 1.0, decodes=1, tokens=257), it(4.0, 0.5)]
    keys = bench.state_latencies([ref])
    assert sorted(k[1] for k in keys) == [0, 0, 1]  # the second launches with the first in flight
    assert bench.latency_at_matched_states([ref], [ref]) == (pytest.approx(0.0, abs=1e-12), 1.0)
    slower = [it(r["submitted_s"], 1.1 * (r["end_s"] - r["submitted_s"]), r["decodes"], r["tokens"]) for r in ref]
    change, share = bench.latency_at_matched_states([slower[::-1]], [ref])
    assert change == pytest.approx(10.0) and share == 1.0
    # a run that never met the prompt's state: that state is out, the rest are 10% slower
    change, share = bench.latency_at_matched_states([[x for x in slower if x["decodes"] == 2]], [ref])
    assert change == pytest.approx(10.0) and share == 0.75
    assert bench.latency_at_matched_states([[it(0.0, 1.0, decodes=5)]], [ref]) is None
    # runs pooled, each keyed on its own timeline: two draws of the same run are the run
    assert bench.latency_at_matched_states([slower, slower], [ref, ref]) == (pytest.approx(10.0), 1.0)
