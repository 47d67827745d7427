"""Path-level NoC speed: messages per wall second in the event engine.

Every core sends a stream of messages (sizes uniform in 256 B .. 64 KiB, random
destinations) back to back; the path model costs a few events per message whatever
its size, the flit model one network step per busy cycle. Compile time excluded.

    python validation/perf/bench_noc_path.py [--messages 200000] [--flit-messages 2000]
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
from npusim.arch.schema import Arch  # noqa: E402
from npusim.config import deep_merge  # noqa: E402
from npusim.sim import KIND_NOC, Simulator  # noqa: E402


def build(arch: Arch, n: int, mode: str, seed: int = 0) -> Simulator:
    sim = Simulator(arch, noc_mode=mode)
    rng = np.random.default_rng(seed)
    cores = arch.num_cores
    src = rng.integers(0, cores, n)
    dst = rng.integers(0, cores, n)
    size = rng.integers(256, 64 << 10, n)
    queues = src * sim.queues_per_core + sim.units.index("noc")
    sim.submit_batch(np.full(n, KIND_NOC), queues, np.stack([src, dst, size], axis=1), np.zeros(n + 1, np.int64),
                     np.zeros(0, np.int64))
    return sim


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--flit-messages", type=int, default=2_000)
    args = ap.parse_args()
    base = load_arch("npusim-64c")
    print(f"{'mesh':>6} {'model':>6} {'messages':>9} {'wall s':>8} {'msg/s':>10} {'Mevents/s':>10} {'sim cycles':>12}")
    for side in (8, 16, 32):
        arch = Arch.model_validate(deep_merge(base.model_dump(), {"cores": {"grid": {"width": side, "height": side}}}))
        for mode, n in (("path", args.messages), ("flit", args.flit_messages)):
            build(arch, 10, mode).run()  # compile / load the cache
            sim = build(arch, n, mode)
            t0 = time.perf_counter()
            sim.run()
            wall = time.perf_counter() - t0
            print(f"{side}x{side:<3} {mode:>6} {n:>9,} {wall:>8.2f} {n / wall:>10,.0f} {sim.events / wall / 1e6:>10.2f} "
                  f"{sim.makespan():>12,}")
    print(machine_line())


if __name__ == "__main__":
    main()
