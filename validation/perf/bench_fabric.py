"""Fabric simulation speed: wall time and transfers per wall second vs endpoints.

All-to-all (direct, 1 MiB per rank, SDMA engines and AIV-direct) and MoE dispatch (128 tokens
per rank, top-8, uniform) on CloudMatrix384 at 8, 32, 128, 384 and 768 endpoints (dies), flow
model at its defaults. ``build`` is Python turning the collective into tasks (routes, protocol
costs), ``kernel`` the Numba loop; ``us/transfer`` is total wall time per transfer, which stays
flat or falls when cost grows no faster than the number of transfers.

    python validation/perf/bench_fabric.py [--endpoints 8,32,128,384,768] [--ops alltoall,alltoall-aiv,dispatch]
"""

from __future__ import annotations

import argparse
import time

from machine import machine_line

from npusim.system import measure
from npusim.system.load import load_system
from npusim.system.simulator import SystemSim


class _Timer:
    """Splits a run's wall time into building (Python) and the kernel loop (SystemSim.run)."""

    def __init__(self):
        self.kernel = 0.0
        self._orig = SystemSim.run

    def __enter__(self):
        timer = self

        def run(sim, *args, **kw):
            t = time.perf_counter()
            try:
                return timer._orig(sim, *args, **kw)
            finally:
                timer.kernel += time.perf_counter() - t

        SystemSim.run = run
        return self

    def __exit__(self, *exc):
        SystemSim.run = self._orig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoints", default="8,32,128,384,768")
    ap.add_argument("--ops", default="alltoall,alltoall-aiv,dispatch")
    args = ap.parse_args()
    loaded = load_system("cloudmatrix384")
    measure.run_collective(loaded, "alltoall", measure.parse_ranks(loaded, "8"), 1 << 20)  # compile first
    print(f"{'op':14s} {'endpoints':>9s} {'transfers':>10s} {'sim us':>9s} {'updates':>8s} {'build s':>8s} "
          f"{'kernel s':>8s} {'wall s':>7s} {'transfers/s':>12s} {'us/transfer':>11s}")
    for op in args.ops.split(","):
        for n in (int(x) for x in args.endpoints.split(",")):
            with _Timer() as timer:
                t = time.perf_counter()
                if op.startswith("alltoall"):
                    r = measure.run_collective(loaded, "alltoall", measure.parse_ranks(loaded, str(n)), 1 << 20,
                                               "direct", via="aiv" if op.endswith("aiv") else "sdma")
                else:
                    r = measure.run_moe(loaded, "dispatch", n, 128)
                wall = time.perf_counter() - t
            print(f"{op:14s} {n:>9d} {r.transfers:>10,d} {r.time_us:>9.1f} {r.rate_updates:>8,d} "
                  f"{wall - timer.kernel:>8.2f} {timer.kernel:>8.2f} {wall:>7.2f} {r.transfers / wall:>12,.0f} "
                  f"{wall / r.transfers * 1e6:>11.2f}", flush=True)
    print(machine_line())


if __name__ == "__main__":
    main()
