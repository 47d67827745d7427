"""Where a serving run's time goes: cProfile of ``bench_serving.py``'s scenario, grouped by part.

The Mooncake conversation trace's first N requests (prompts clipped to 2,048 tokens, outputs to
128), Qwen3-4B TP 4 x 16 stages on npusim-64c, PD fusion budget 512, chunks of 256, memory
analytical, NoC path — with or without the iteration-cost cache. The kernel is compiled
outside the profile. Parts (cumulative seconds of the named functions, so a part includes what
it calls; "engine" excludes the runs inside skeleton measurements), in CPU seconds:

* building programs of new shapes: ``Instance._compile`` (iteration graph, mapper, collectives,
  materialisation);
* measuring shapes: ``itercache.measure`` (skeleton replay) or ``stagecost.measure_stages`` (stage
  replay, the default) less the program it is given (cache on);
* engine: ``Simulator.run`` (the Numba kernel) outside those measurements;
* submitting tasks: ``submit_materialized`` and notify tasks;
* per-launch Python of the cache: ``IterationCostCache.tasks`` less measuring;
* scheduler, KV manager, sampling, metrics: the rest of ``ServingSimulator.run``.

    python validation/perf/profile_serving.py --requests 100 --cache off [--noc analytical]
    python validation/perf/profile_serving.py --requests 1000 --cache on --cache-buckets kv=1024,batch=32,chunk=64
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serving import trace_path  # noqa: E402
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.serving.itercache import parse_buckets  # noqa: E402
from npusim.serving.requests import cap_lengths  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402
from npusim.serving.traces import load_trace  # noqa: E402


def cumulative(stats: pstats.Stats, file_end: str, name: str) -> float:
    """Cumulative seconds of function ``name`` defined in a file ending with ``file_end``."""
    return sum(v[3] for (f, _, n), v in stats.stats.items() if f.endswith(file_end) and n == name)


def callers_share(stats: pstats.Stats, file_end: str, name: str, caller_file: str, caller: str) -> float:
    """Cumulative seconds of ``name`` when called from ``caller`` (cProfile's per-caller split)."""
    out = 0.0
    for (f, _, n), v in stats.stats.items():
        if f.endswith(file_end) and n == name:
            for (cf, _, cn), cv in v[4].items():
                if cf.endswith(caller_file) and cn == caller:
                    out += cv[3]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100)
    ap.add_argument("--cache", choices=("off", "on"), default="off")
    ap.add_argument("--cache-buckets", default="exact")
    ap.add_argument("--noc", choices=("path", "analytical", "flit"), default="path", help="NoC fidelity (default path)")
    ap.add_argument("--top", type=int, default=25, help="also print the top functions by own time")
    ap.add_argument("--out", type=Path, default=None, help="write the raw profile (pstats) here")
    args = ap.parse_args()
    path = trace_path()
    reqs, clipped = cap_lengths(load_trace(path, first=args.requests), 2048, 128)
    arch = load_arch("npusim-64c")
    spec = spec_from_flags(tp=4, stages=16, layout="ring").model_copy(update={"data_parallel": 1})
    cfg = ServingConfig(model="qwen3-4b", noc_mode=args.noc, scheduler=SchedulerConfig(policy="fusion", budget=512, chunk_tokens=256),
                        iteration_cache=parse_buckets(args.cache_buckets) if args.cache == "on" else None)
    simulate_serving(arch, spec, reqs[:1], replace(cfg, layers=16, iteration_cache=None))  # compile the kernel
    prof = cProfile.Profile(time.process_time)  # CPU seconds: the machine may be shared
    t0, c0 = time.perf_counter(), time.process_time()
    prof.enable()
    s = simulate_serving(arch, spec, reqs, cfg).summary
    prof.disable()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    st = pstats.Stats(prof)
    if args.out:
        st.dump_stats(args.out)
    total = cumulative(st, "serving/simulate.py", "simulate_serving")
    compile_ = cumulative(st, "serving/instance.py", "_compile")
    # measuring a shape: the skeleton replay's measure, or the stage replay's measure_stages (the default)
    measure = cumulative(st, "serving/itercache.py", "measure") + cumulative(st, "serving/stagecost.py",
                                                                            "measure_stages")
    measure_run = (callers_share(st, "sim/simulator.py", "run", "serving/itercache.py", "measure")
                   + callers_share(st, "sim/simulator.py", "run", "serving/stagecost.py", "_lane_ends"))
    engine = cumulative(st, "sim/simulator.py", "run") - measure_run
    submit = (callers_share(st, "sim/program.py", "submit_materialized", "serving/instance.py", "launch")
              + cumulative(st, "serving/instance.py", "_submit_after_spills")
              + cumulative(st, "sim/simulator.py", "add_notify"))
    outer = max((v[3] for (f, _, n), v in st.stats.items() if f.endswith("serving/itercache.py") and n == "tasks"),
                default=0.0)  # IterationCostCache.tasks (it calls IterationCost.tasks)
    skeleton = max(0.0, outer - cumulative(st, "serving/itercache.py", "_shape"))
    rest = total - compile_ - engine - submit - measure - skeleton
    label = "on, " + args.cache_buckets if args.cache == "on" else "off"
    print(f"profile: {args.requests} Mooncake requests ({path.name}, {clipped} clipped), Qwen3-4B TP 4 x 16 on "
          f"npusim-64c, NoC {args.noc}, cache {label}")
    print(f"wall {wall:.1f} s, CPU {cpu:.1f} s (profiled, parts in CPU s: cProfile slows Python, not the kernel); "
          f"iterations "
          f"{s['iterations']:,}, shapes compiled {s['compiled_iteration_shapes']}, tasks {s['tasks']:,}, events "
          f"{s['events']:,}")
    rows = [("building programs of new shapes (graph, mapper, collectives, materialise)", compile_),
            ("engine kernel, serving runs", engine),
            ("engine kernel, measuring shapes (skeletons or stage timings)", measure_run),
            # the stage replay's loaded run is in a worker thread, which cProfile does not see: the
            # main thread's wait for it lands here
            ("reducing runs to shape costs, waiting for loaded runs (measure, less its runs)", measure - measure_run),
            ("per-launch skeleton parameters (cache)", skeleton),
            ("submitting tasks to the engine", submit),
            ("scheduler, KV manager, sampling, metrics, rest", rest)]
    print(f"{'part':>75} {'s':>8} {'share':>7}")
    for name, sec in rows:
        if args.cache == "off" and ("skeleton" in name or name.startswith(("engine kernel, measuring", "reducing"))):
            continue
        print(f"{name:>75} {sec:8.1f} {100 * sec / total:6.1f}%")
    print(f"{'total (simulate_serving)':>75} {total:8.1f}")
    if args.top:
        print(f"\ntop {args.top} functions by own time:")
        st.sort_stats("tottime").print_stats(args.top)
    print(machine_line())


if __name__ == "__main__":
    main()
