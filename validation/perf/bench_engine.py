"""Engine speed: events per wall second on synthetic task DAGs of 10^5 .. 10^7 tasks.

Each task runs on one of the default chip's 320 resource queues (64 cores x
cube/vector/2 DMA/NoC), lasts 1-99 cycles and depends on up to two earlier tasks
within the last 1,000 (so queues and dependencies both gate starts). Compile time
is excluded (a warm-up run first); build time (Python, numpy) is reported apart.

    python validation/perf/bench_engine.py [--sizes 1e5,1e6,1e7]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1e5,1e6,1e7", help="comma-separated task counts")
    args = ap.parse_args()
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
