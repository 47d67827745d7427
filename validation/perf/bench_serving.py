"""Serving simulation speed: wall time and simulated seconds per wall second for requests of
the Mooncake conversation trace, per fidelity, and how wall time grows with requests and cores.

Requests are the trace's first N (../shared/traces/mooncake, else the repository's 200-line
sample) at the trace's own arrival times, prompts clipped to --max-input tokens and outputs
to --max-output (Mooncake's prompts average ~13k tokens; at Qwen3-4B's 144 KiB of KV per
token the chip's HBM holds only ~30 of them, and simulating them whole would take hours; the
number clipped is reported). PD fusion, budget 512, chunks of 256; Qwen3-4B on TP-4 groups in
a 16-stage pipeline per 64 cores: a chip with more cores runs one data-parallel replica per
64 cores (256 cores: 4 replicas on bands of columns). ``--layers N`` simulates only the first
N decoder layers (for the long growth series; say so when quoting).

``--noc path,analytical`` times both NoC fidelities in one run and prints the path NoC's wall time
over the analytical's; ``--streams`` the path NoC's memory stream models (default ``flow@16384~256``, the serving loop's since session 64; issue 42
item 4: uncached, 1,000 requests, path at most 2x analytical); ``flow-all`` is the flows with every DMA a flow of
the filling (``npusim.hw.noc.memflow.MICE`` off); ``flow-nomemo`` the flows solving every sharing (``memflow.MEMO_SLOTS``
0: no sharing takes the rates remembered for a state seen before; the flows' results before session 57); ``flow@Q`` the flows with a head-of-line pass held for ``Q`` cycles
(``memflow.HOL_PERIOD``; ``flow`` itself makes a pass every update); ``flow~S`` the flows with a sharing kept for
``S`` cycles (``memflow.SHARE_PERIOD``: starts and drains within it wait for the next sharing); ``flow@Q~S`` both.
With ``flow-nomemo`` (else ``flow``) beside them the run prints each variant's effect on the simulated time.

``--jitter-ms J`` runs each point once per ``--seeds`` draw (default 1,2,3) with every request's arrival moved
later by 0..J ms (uniform, drawn per request and seed; the trace's timestamps are whole seconds give or take a few
ms, so the draws are inputs the trace cannot tell apart) and prints each variant's mean and spread over the draws:
a hundred requests' schedule amplifies a change of one cycle into a few percent of the makespan and the mean time
per output token (docs/FIDELITY.md, sessions 61 and 63), so a variant's effect is told from that spread by the
draws' means, not by one run. Each flow variant's line also gives its iterations' latency against the reference's
at the states both launched iterations in (the instance's iterations in flight, the iteration's decodes, prompt
tokens and KV share in HBM; :func:`latency_at_matched_states`): what the model changes in an iteration's time, apart
from what it changes in the schedule.

``--cache off,on`` runs each point without and with the iteration-cost cache
(``npusim run --iteration-cache``; ``--cache-buckets`` its buckets, default exact).

``--readme`` instead times the README's trace command, ``npusim run --trace
traces/mooncake_sample.jsonl`` at its defaults (whole prompts clipped to the model's context, the
iteration cache auto: the long buckets for this trace), on its first ``--requests`` requests (default all 200), in this process
with the kernel loaded first: wall and CPU seconds, simulated seconds per wall second, requests
done, cache hits, where the wall time went (building programs of new shapes, measuring them on
the engine, the engine in the serving loop, the rest) and why the cache does not carry the run:
the shapes it had to simulate, grouped by structure (the attention groups' request counts and
query lengths, the sampled rows, the KV placement) with the KV lengths left out. Extra arguments
after ``--`` go to ``npusim run`` (e.g. ``-- --iteration-cache off``).

    python validation/perf/bench_serving.py [--requests 100,1000] [--arch npusim-64c,npusim-256c]
        [--memory analytical,tlm] [--noc path,analytical] [--streams flow,reserve] [--layers N] [--cache off,on]
        [--cache-buckets kv=1024] [--trace FILE] [--jitter-ms 1 [--seeds 1,2,3]]
    python validation/perf/bench_serving.py --readme [--requests 30] [-- --iteration-cache off]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.hw.noc import memflow  # noqa: E402
from npusim.sim.mempath import SERVING_STREAMS, parse_streams  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.serving.itercache import parse_buckets  # noqa: E402
from npusim.serving.requests import cap_lengths  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402
from npusim.serving.traces import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CORES_PER_REPLICA = 64
STAGES = 16  # pipeline stages per replica (TP 4 x 16 stages = 64 cores)


def trace_path() -> Path:
    """The shared Mooncake conversation trace beside the checkout (or a worktree's parents), else
    the repository's 200-line sample."""
    for parent in ROOT.parents:
        shared = parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
        if shared.is_file():
            return shared
    return ROOT / "traces" / "mooncake_sample.jsonl"


class PartTimers:
    """Wall seconds of a serving run's parts, by wrapping the functions that do them (no profiler:
    its overhead would distort the Python parts against the kernel): building programs
    (``Instance._compile``), measuring shapes (the stage replay's ``measure_stages`` or the skeleton
    replay's ``measure``: two or one fresh simulators and their runs) and the engine in the serving
    loop (``Simulator.run`` outside measurements). Also keeps the shapes measured."""

    def __init__(self):
        self.seconds: Counter = Counter()
        self.calls: Counter = Counter()
        self.shapes: list[tuple] = []
        self._depth = threading.local()

    def _timed(self, part: str, fn, outer: bool = False):
        timers = self

        def wrapper(*a, **k):
            if part == "engine, serving loop" and (threading.current_thread() is not threading.main_thread()
                                                   or getattr(timers._depth, "measuring", 0)):
                return fn(*a, **k)  # a measurement's run: counted in its measurement
            if outer:
                timers._depth.measuring = getattr(timers._depth, "measuring", 0) + 1
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timers.seconds[part] += time.perf_counter() - t
                timers.calls[part] += 1
                if outer:
                    timers._depth.measuring -= 1
        return wrapper

    @contextlib.contextmanager
    def installed(self):
        from npusim.serving import instance
        from npusim.sim.simulator import Simulator

        saved = [(instance.Instance, "_compile"), (instance, "measure_stages"), (instance, "measure"),
                 (instance, "measure_stages_many"), (Simulator, "run"), (instance.Instance, "_measure"),
                 (instance.Instance, "_measure_many")]
        originals = [getattr(o, n) for o, n in saved]
        timers = self
        measure_shape, measure_shapes = instance.Instance._measure, instance.Instance._measure_many

        def record(inst, groups, sampled, placement):
            timers.shapes.append((tuple(groups), sampled, placement))
            return measure_shape(inst, groups, sampled, placement)

        def record_many(inst, shapes):
            timers.shapes.extend((tuple(g), s, p) for g, s, p in shapes)
            return measure_shapes(inst, shapes)

        instance.Instance._compile = self._timed("building programs of new shapes", instance.Instance._compile)
        instance.measure_stages = self._timed("measuring shapes (fresh simulators, engine runs)",
                                              instance.measure_stages, outer=True)
        instance.measure = self._timed("measuring shapes (fresh simulators, engine runs)", instance.measure,
                                       outer=True)
        instance.measure_stages_many = self._timed("measuring shapes (fresh simulators, engine runs)",
                                                   instance.measure_stages_many, outer=True)
        instance.Instance._measure_many = record_many
        Simulator.run = self._timed("engine, serving loop", Simulator.run)
        instance.Instance._measure = record
        try:
            yield self
        finally:
            for (o, n), f in zip(saved, originals):
                setattr(o, n, f)


def shape_census(shapes: list[tuple]) -> list[str]:
    """Lines on the shapes a run simulated: how many, their structures (KV lengths left out) and how
    many distinct KV lengths each attention group kind took."""
    if not shapes:
        return ["no shape simulated"]
    structure = Counter((tuple((n, q, causal) for n, q, _, causal in g), s, p) for g, s, p in shapes)
    groups = Counter(len(g) for g, _, _ in shapes)
    placements = Counter(p for _, _, p in shapes)
    chunk_kv = {kv for g, _, _ in shapes for _, q, kv, _ in g if q > 1}
    decode_kv = {kv for g, _, _ in shapes for _, q, kv, _ in g if q == 1}
    out = [f"{len(shapes):,} shapes simulated; {len(structure)} structures (groups' counts and query lengths, "
           f"sampled rows, KV placement) once KV lengths are left out",
           "attention groups per shape: " + ", ".join(f"{k}: {v:,}" for k, v in sorted(groups.items())),
           "KV placement (0 none in HBM, 1 all; a share between measures both): "
           + ", ".join(f"{k:g}: {v:,}" for k, v in sorted(placements.items())),
           f"distinct KV lengths: prefill chunks {len(chunk_kv)}, decode groups {len(decode_kv)}",
           "most common structures (shapes):"]
    for (st, sampled, placement), n in structure.most_common(5):
        text = " + ".join(f"{c}x(q {q}{', causal' if causal else ''})" for c, q, causal in st)
        out.append(f"  {n:6,}  {text}; sampled {sampled}, placement {placement:g}")
    return out


def run_cli(argv: list[str]) -> dict:
    from npusim.cli import main as npusim

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = npusim(argv + ["--json"])
    if code != 0:
        raise SystemExit(f"npusim {' '.join(argv)} exited {code}")
    return json.loads(buf.getvalue())


def readme_run(requests: int | None, extra: list[str]) -> None:
    """Time the README's trace command (see the module docstring)."""
    trace = ROOT / "traces" / "mooncake_sample.jsonl"
    argv = ["run", "--trace", str(trace), "--no-progress"] + (["--requests", str(requests)] if requests else []) + extra
    run_cli(["run", "--requests", "1", "--no-progress"])  # load (or compile) the kernel outside the timing
    timers = PartTimers()
    t0, c0 = time.perf_counter(), time.process_time()
    with timers.installed(), contextlib.redirect_stderr(io.StringIO()):
        s = run_cli(argv)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    ic = s["iteration_cache"]
    print(f"npusim {' '.join(argv[:1] + ['--trace', 'traces/' + trace.name] + argv[3:])}")
    print(f"wall {wall:.1f} s, CPU {cpu:.1f} s (both cores: the stage replay's loaded run is in a thread); "
          f"simulated {s['simulated_s']:.1f} s, {s['simulated_s'] / wall:.3f} simulated s per wall s")
    print(f"requests {s['requests_completed']} done of {s['requests']} ({s['requests_rejected']} rejected); "
          f"iterations {s['iterations']:,}; shapes compiled {s['compiled_iteration_shapes']:,}; tasks {s['tasks']:,}")
    if ic.get("enabled"):
        print(f"iteration cache: {ic['hits']:,} hits, {ic['misses']:,} misses (hit rate {100 * ic['hit_rate']:.1f}%), "
              f"{ic['shapes_simulated']:,} shapes simulated")
    print(f"{'part':>52} {'wall s':>8} {'share':>6} {'calls':>8} {'ms/call':>8}")
    # the stage replay measures a cell's missing shapes at once, building each program inside that
    # measurement while the previous shapes run: building is then part of measuring, not beside it
    build, measuring = "building programs of new shapes", "measuring shapes (fresh simulators, engine runs)"
    nested = timers.calls[measuring] and timers.seconds[build] <= timers.seconds[measuring] and ic.get("replay") == "stages"
    rest = wall - sum(v for k, v in timers.seconds.items() if not (nested and k == build))
    for part in (measuring, build, "engine, serving loop"):
        sec, n = timers.seconds[part], timers.calls[part]
        label = f"of which {part}" if nested and part == build else part
        print(f"{label:>52} {sec:8.1f} {100 * sec / wall:5.1f}% {n:8,} {1e3 * sec / max(n, 1):8.1f}")
    print(f"{'scheduler, KV manager, replay, metrics, rest':>52} {rest:8.1f} {100 * rest / wall:5.1f}%")
    for line in shape_census(timers.shapes):
        print(line)
    print(machine_line())


def stream_variant(label: str) -> str:
    """``--streams`` label -> the ``memory_streams`` it runs (:func:`npusim.sim.mempath.parse_streams`: ``flow@Q``,
    ``flow~S`` and ``flow@Q~S`` a head-of-line pass held ``Q`` cycles, a sharing kept ``S`` cycles);
    ``flow-all`` and ``flow-nomemo`` are the flows (every DMA a flow; every sharing solved)."""
    spec = label.replace("-nomemo", "").replace("-all", "")
    try:
        parse_streams(spec)
    except ValueError as e:
        raise SystemExit(f"--streams {label}: {e}") from None
    return spec


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def _change(got: float | None, ref: float | None) -> str:
    """``got`` against ``ref`` in percent (``-`` when either is missing or ``ref`` is 0)."""
    return "-" if got is None or not ref else f"{100 * (got / ref - 1):+.3f}%"


def jittered(reqs: list, jitter_ms: float, seed: int) -> list:
    """``reqs`` with each arrival moved later by a uniform draw in ``[0, jitter_ms)`` ms (seeded;
    unchanged when ``jitter_ms`` is 0)."""
    if jitter_ms <= 0:
        return reqs
    late = np.random.default_rng(seed).random(len(reqs)) * jitter_ms * 1e-3
    return [replace(r, arrival_s=r.arrival_s + float(d)) for r, d in zip(reqs, late)]


def _spread(values: list[float]) -> str:
    """The mean of ``values`` and, for two or more, their sample standard deviation in percent of it."""
    m = float(np.mean(values))
    return f"{m:.2f}" if len(values) < 2 else f"{m:.2f} +-{100 * float(np.std(values, ddof=1)) / m:.1f}%"


def _ensemble_change(got: list[float], ref: list[float]) -> str:
    """The change of ``got``'s mean against ``ref``'s, with its standard error from both spreads."""
    if len(got) < 2 or len(ref) < 2:
        return _change(float(np.mean(got)), float(np.mean(ref)))
    mg, mr = float(np.mean(got)), float(np.mean(ref))
    se = (mg / mr) * float(np.sqrt(np.var(got, ddof=1) / len(got) / mg ** 2 + np.var(ref, ddof=1) / len(ref) / mr ** 2))
    return f"{100 * (mg / mr - 1):+.2f}% (+-{100 * se:.2f})"


def state_latencies(runs: list[list[dict]]) -> dict:
    """Uncached runs' iteration latencies (s, launch to end) by the state each was launched in:
    (its instance, the iterations of that instance then in flight in its run, its decodes, its prompt
    tokens in steps of 64, the share of its KV in HBM in tenths)."""
    out: dict = {}
    by_instance: dict = {}
    for r, iterations in enumerate(runs):
        for it in iterations:
            by_instance.setdefault((r, it["instance"]), []).append(it)
    for (_, name), its in by_instance.items():
        start = np.array([it["submitted_s"] for it in its])
        end = np.array([it["end_s"] for it in its])
        # in flight at a launch: launched before it and not yet ended (an end comes after its own launch)
        flying = np.searchsorted(np.sort(start), start, side="left") - np.searchsorted(np.sort(end), start, side="right")
        for it, k, lat in zip(its, flying.tolist(), (end - start).tolist()):
            key = (name, k, it["decodes"], (it["tokens"] - it["decodes"]) // 64, int(10 * it["kv_hbm_fraction"]))
            out.setdefault(key, []).append(lat)
    return out


def latency_at_matched_states(got: list[list[dict]], ref: list[list[dict]]) -> tuple[float, float] | None:
    """The iterations of runs ``got`` against those of runs ``ref`` at the states both launched
    iterations in (:func:`state_latencies`): the change of the mean latency, each state weighted by
    ``ref``'s iterations in it, and the share of ``ref``'s iterations matched. Two runs whose schedules part
    (a hundred requests' does at a change of one cycle) still meet most states, so this tells a model's
    effect on an iteration's time from its effect on the schedule."""
    a, b = state_latencies(ref), state_latencies(got)
    num = den = 0.0
    matched = 0
    for key, lats in a.items():
        if key in b:
            num += len(lats) * float(np.mean(b[key]))
            den += float(np.sum(lats))
            matched += len(lats)
    return None if not matched else (100 * (num / den - 1), matched / max(1, sum(len(r) for r in ref)))


def main(argv: list[str] | None = None) -> None:
    argv, extra = (sys.argv[1:] if argv is None else list(argv)), []
    if "--" in argv:
        argv, extra = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--readme", action="store_true", help="time the README's trace command (see above)")
    ap.add_argument("--requests", default=None, help="requests per point (default 20,100; --readme: all)")
    ap.add_argument("--arch", default="npusim-64c")
    ap.add_argument("--memory", default="analytical")
    ap.add_argument("--noc", default="path")
    ap.add_argument("--layers", type=int, default=None,
                    help=f"simulate only the first N decoder layers (at least {STAGES}: one per pipeline stage)")
    ap.add_argument("--max-input", type=int, default=2048)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--streams", default=SERVING_STREAMS,
                    help="memory stream model(s) at the path NoC (npusim.sim.mempath): flow, reserve, hop, flow-all, flow-nomemo, flow@CYCLES, "
                         f"flow~CYCLES, flow@CYCLES~CYCLES or a list (default {SERVING_STREAMS}, the serving loop's)")
    ap.add_argument("--cache", default="off", help="iteration cache: off, on or off,on")
    ap.add_argument("--cache-buckets", default="exact", help="iteration cache buckets (see npusim run --help)")
    ap.add_argument("--trace", type=Path, default=None, help="Mooncake JSONL (default: the shared trace, else the sample)")
    ap.add_argument("--jitter-ms", type=float, default=0.0, metavar="MS",
                    help="move each arrival later by 0..MS ms, once per --seeds draw, and print each variant's "
                         "mean and spread over the draws (default 0: the trace as it is)")
    ap.add_argument("--seeds", default="1,2,3", help="--jitter-ms: the draws' seeds (default 1,2,3)")
    args = ap.parse_args(argv)
    if args.jitter_ms < 0:
        ap.error(f"--jitter-ms {args.jitter_ms:g}: expected 0 or more milliseconds")
    try:
        seeds = [int(x) for x in args.seeds.split(",")] if args.jitter_ms > 0 else [0]
    except ValueError:
        ap.error(f"--seeds {args.seeds}: expected integers separated by commas, e.g. 1,2,3")
    if args.layers is not None and args.layers < STAGES:
        ap.error(f"--layers {args.layers}: the pipeline has {STAGES} stages, each needs a layer (give at least {STAGES})")
    if args.readme:
        readme_run(int(args.requests) if args.requests else None, extra)
        return
    for label in args.streams.split(","):  # a bad label stops the run before any point
        stream_variant(label)
    saved_memo = memflow.MEMO_SLOTS
    path = args.trace or trace_path()
    buckets = parse_buckets(args.cache_buckets)
    layers = "all" if args.layers is None else str(args.layers)
    print(f"trace {path.name}; prompts clipped to {args.max_input}, outputs to {args.max_output} tokens; "
          f"Qwen3-4B, {layers} layers; TP 4 x {STAGES} stages per {CORES_PER_REPLICA} cores")
    print(f"{'requests':>8} {'arch':>12} {'memory':>10} {'noc':>14} {'cache':>5} | {'clipped':>7} {'wall s':>8} {'cpu s':>8} {'sim s':>8} "
          f"{'sim s/wall s':>12} {'iterations':>10} {'shapes':>6} {'tasks':>12} {'Mevents/s':>9} {'tok/s':>8} "
          f"{'TTFT ms':>9} {'TPOT ms':>8}")
    spec = spec_from_flags(tp=4, stages=STAGES, layout="ring").model_copy(update={"data_parallel": 1})
    warm = ServingConfig(model="qwen3-4b", layers=STAGES)  # as many layers as stages
    for n in (int(x) for x in (args.requests or "20,100").split(",")):
        reqs, clipped = cap_lengths(load_trace(path, first=n), args.max_input, args.max_output)
        for arch_name in args.arch.split(","):
            arch = load_arch(arch_name)
            replicas = max(1, arch.num_cores // CORES_PER_REPLICA)
            for memory in args.memory.split(","):
                walls = {}
                points = [(x, st, c) for x in args.noc.split(",") for c in args.cache.split(",")
                          for st in (args.streams.split(",") if x == "path" else ["-"])]
                sims = {}  # (streams, cache) -> per draw (simulated s, mean TTFT, mean TPOT)
                iterations = {}  # (streams, cache) -> each draw's iteration records
                for noc, streams, cache in points:
                    memory_streams = stream_variant(streams) if noc == "path" else None
                    cfg = ServingConfig(model="qwen3-4b", layers=args.layers, memory_mode=memory, noc_mode=noc,
                                        scheduler=SchedulerConfig(policy="fusion", budget=512, chunk_tokens=256),
                                        iteration_cache=buckets if cache == "on" else None,
                                        **({"memory_streams": memory_streams} if noc == "path" else {}))
                    # compile the kernel for this fidelity outside the timing
                    simulate_serving(arch, spec, reqs[:1], replace(warm, memory_mode=memory, noc_mode=noc),
                                     replicas=replicas)
                    for seed in seeds:
                        memflow.MICE = "-all" not in streams  # flow-all: every DMA a flow of the filling
                        memflow.MEMO_SLOTS = 0 if "-nomemo" in streams else saved_memo  # flow-nomemo: every sharing solved
                        t0, c0 = time.perf_counter(), time.process_time()
                        run = simulate_serving(arch, spec, jittered(reqs, args.jitter_ms, seed), cfg, replicas=replicas)
                        s = run.summary
                        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                        memflow.MICE, memflow.MEMO_SLOTS = True, saved_memo
                        walls[noc, streams, cache] = walls.get((noc, streams, cache), 0.0) + wall
                        iterations.setdefault((streams, cache), []).append(run.iterations)
                        sims.setdefault((streams, cache), []).append(
                            (s['simulated_s'], s['ttft_ms']['mean'], s['tpot_ms']['mean']))
                        label = (noc if noc != "path" else f"path/{streams}") + (f" #{seed}" if seed else "")
                        print(f"{n:>8} {arch_name:>12} {memory:>10} {label:>14} {cache:>5} | {clipped:>7} {wall:8.1f} "
                              f"{cpu:8.1f} {s['simulated_s']:8.2f} {s['simulated_s'] / wall:12.3f} {s['iterations']:>10} "
                              f"{s['compiled_iteration_shapes']:>6} {s['tasks']:>12,} {s['events'] / wall / 1e6:9.2f} "
                              f"{s['throughput_tokens_per_s']:8.1f} {_ms(s['ttft_ms']['mean']):>9} "
                              f"{_ms(s['tpot_ms']['mean']):>8}", flush=True)
                for (noc, streams, cache), wall in walls.items():  # the path NoC's cost against the analytical's
                    ref = walls.get(("analytical", "-", cache))
                    if noc == "path" and ref:
                        print(f"{'':>8} path/{streams} / analytical wall time ({cache} cache): {wall / ref:.2f}x",
                              flush=True)
                if len(seeds) > 1:  # each variant over the draws: mean and spread
                    for (streams, cache), runs in sims.items():
                        label = "analytical" if streams == "-" else f"path/{streams}"
                        print(f"{'':>8} {label} ({cache} cache) over {len(runs)} draws of arrivals moved 0..{args.jitter_ms:g} ms: "
                              + ", ".join(f"{name} {_spread([r[i] for r in runs])}"
                                          for i, name in enumerate(("simulated s", "mean TTFT ms", "mean TPOT ms"))),
                              flush=True)
                for (streams, cache), got in sims.items():  # each flow variant against the flows solving every sharing
                    base = "flow-nomemo" if ("flow-nomemo", cache) in sims else "flow"
                    ref = sims.get((base, cache))
                    if streams.startswith("flow") and streams != base and ref:
                        how = f" (means of {len(got)} draws, +- one standard error)" if len(seeds) > 1 else ""
                        ch = [_ensemble_change([g[i] for g in got], [r[i] for r in ref]) for i in range(3)]
                        matched = latency_at_matched_states(iterations[streams, cache], iterations[base, cache])
                        at = "" if matched is None or cache == "on" else (
                            f"; iteration latency at the same states {matched[0]:+.2f}% "
                            f"({100 * matched[1]:.0f}% of the iterations matched)")
                        print(f"{'':>8} path/{streams} against path/{base} ({cache} cache){how}: simulated s "
                              f"{ch[0]}, mean TTFT {ch[1]}, mean TPOT {ch[2]}{at}", flush=True)
    print(machine_line())


if __name__ == "__main__":
    main()
