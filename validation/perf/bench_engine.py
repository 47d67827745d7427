"""Engine speed: events per wall second on synthetic task DAGs of 10^5 .. 10^7 tasks.

Each task runs on one of the default chip's 320 resource queues (64 cores x
cube/vector/2 DMA/NoC), lasts 1-99 cycles and depends on up to two earlier tasks
within the last 1,000 (so queues and dependencies both gate starts). Compile time
is excluded (a warm-up run first); build time (Python, numpy) is reported apart.

``--pipeline`` instead times a serving pipeline's kernel: one Qwen3-4B decode iteration's program
(TP 4 x 16 stages on npusim-64c, one sequence at KV 2,304, KV in SRAM: ~24k tasks) submitted 1, 4
and 16 times to one simulator -- as many iterations in flight as the serving loop keeps -- at the
analytical and path NoC fidelities, its tasks laid out as the mapper emitted them or in the order
they run alone (``run_order``, what serving submits). Prints the kernel's milliseconds per
iteration (the best of ``--repeat`` runs: the machine may be shared), events per iteration and
events per second; the simulated end must not depend on the layout (checked).

    python validation/perf/bench_engine.py [--sizes 1e5,1e6,1e7]
    python validation/perf/bench_engine.py --pipeline [--repeat 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.sim import Simulator  # noqa: E402


def build(arch, n: int, seed: int = 0) -> Simulator:
    sim = Simulator(arch)
    rng = np.random.default_rng(seed)
    nq = len(sim.engine.queue_names)
    queues = rng.integers(0, nq, n)
    durations = rng.integers(1, 100, n)
    ndeps = rng.integers(0, 3, n)
    ndeps[0] = 0
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(ndeps)
    owner = np.repeat(np.arange(n), ndeps)
    dep = owner - rng.integers(1, 1000, owner.shape[0])
    dep = np.clip(dep, 0, None)
    dep = np.where(dep == owner, owner - 1, dep)
    sim.submit_batch(np.zeros(n, dtype=np.int64), queues, durations[:, None], ptr, dep)
    return sim


def pipeline(repeat: int) -> None:
    from npusim.mapping.mapper import map_model
    from npusim.mapping.spec import spec_from_flags
    from npusim.serving.iteration import build_groups_graph
    from npusim.sim.program import run_order, submit_materialized

    arch = load_arch("npusim-64c")
    spec = spec_from_flags(tp=4, stages=16, layout="ring").model_copy(update={"data_parallel": 1})
    graph = build_groups_graph("qwen3-4b", [(1, 1, 2304, False)], 1, "bf16", None)
    prog = map_model(graph, arch, spec, kv_hbm_fraction=0.0).program
    arrays = prog.materialize(Simulator(arch, memory_mode="analytical", noc_mode="analytical"))
    rows = run_order(Simulator(arch, memory_mode="analytical", noc_mode="analytical"), arrays)
    print(f"one Qwen3-4B decode iteration: {len(arrays[0]):,} tasks; kernel time per iteration, best of {repeat}")
    print(f"{'NoC':>10} {'in flight':>9} {'layout':>10} {'ms/iter':>8} {'events/iter':>12} {'Mevents/s':>10}")
    for noc in ("analytical", "path"):
        ends = {}
        for k in (1, 4, 16):
            for layout, at in (("emitted", None), ("run order", rows)):
                best, events = float("inf"), 0
                for _ in range(repeat + 1):  # the first also loads the kernel
                    sim = Simulator(arch, memory_mode="analytical", noc_mode=noc)
                    for _ in range(k):
                        submit_materialized(sim, arrays, check=False, rows=at)
                    t0 = time.perf_counter()
                    sim.run()
                    best, events = min(best, time.perf_counter() - t0), sim.events
                ends.setdefault(k, set()).add((sim.now, events))
                print(f"{noc:>10} {k:>9} {layout:>10} {best / k * 1e3:>8.2f} {events // k:>12,} "
                      f"{events / best / 1e6:>10.1f}")
        if any(len(v) != 1 for v in ends.values()):
            raise SystemExit(f"the layout changed the simulation at the {noc} NoC: {ends}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e5,1e6,1e7", help="comma-separated task counts")
    ap.add_argument("--pipeline", action="store_true", help="time a serving pipeline's kernel instead (see above)")
    ap.add_argument("--repeat", type=int, default=3, help="--pipeline: runs per row, the best kept")
    args = ap.parse_args()
    if args.pipeline:
        pipeline(args.repeat)
        print(machine_line())
        return
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    arch = load_arch("npusim-64c")
    build(arch, 100).run()  # compile / load the cache
    print(f"{'tasks':>12} {'build s':>9} {'run s':>9} {'events':>12} {'Mevents/s':>10} {'sim cycles':>14}")
    for n in sizes:
        t0 = time.perf_counter()
        sim = build(arch, n)
        t1 = time.perf_counter()
        sim.run()
        t2 = time.perf_counter()
        print(f"{n:>12,} {t1 - t0:>9.2f} {t2 - t1:>9.2f} {sim.events:>12,} {sim.events / (t2 - t1) / 1e6:>10.2f} {sim.now:>14,}")
    print(machine_line())


if __name__ == "__main__":
    main()
