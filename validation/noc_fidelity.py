"""NoC fidelities side by side: flit (cycle-accurate) vs path (message-level) vs analytical.

For an 8x8 and a 16x16 mesh, uniform and transpose traffic, offered loads from 0.05
flits/node/cycle up to the flit model's saturation, prints the average packet latency
of each fidelity and the error of the two cheaper ones against the flit model, plus
each one's accepted throughput and wall time. Then collective traffic (ring and 2D
all-reduce / all-gather, alone and many at once) on the 64-core chip, all three
fidelities driven by the event engine. Routers: 4 pipeline stages, 1-cycle links,
2 VCs x 8-flit buffers (the npusim-64c NoC), 4-flit packets unless --packet-flits.

The reference is our own flit-level model (no BookSim2 run is possible here); its
zero-load latency is exact and tested, and its saturation throughput on uniform 8x8
traffic (~0.39-0.42 flits/node/cycle) is in the range published for 2-VC XY meshes.

    python validation/noc_fidelity.py [--quick] [--packet-flits 4]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.comm import allreduce_2d, ring_allgather, ring_allreduce  # noqa: E402
from npusim.hw.noc import NocParams, SyntheticTraffic  # noqa: E402
from npusim.sim import Simulator  # noqa: E402
from npusim.sim.program import Program  # noqa: E402
from npusim.sim.noc_synthetic import simulate  # noqa: E402

COLLECTIVE_SCENARIOS = {
    "ring AR, row 0 (8 cores)": lambda sim, b: [ring_allreduce(sim, list(range(8)), b)],
    "8 row rings at once": lambda sim, b: [ring_allreduce(sim, list(range(r * 8, r * 8 + 8)), b) for r in range(8)],
    "8 row + 8 column AG at once": lambda sim, b: (
        [ring_allgather(sim, list(range(r * 8, r * 8 + 8)), b) for r in range(8)]
        + [ring_allgather(sim, list(range(c, 64, 8)), b) for c in range(8)]),
    "ring AR, strided order": lambda sim, b: [ring_allreduce(sim, [0, 9, 18, 27, 36, 45, 54, 63], b)],
    "2D AR over 8x8": lambda sim, b: [allreduce_2d(sim, list(range(64)), 8, 8, b)],
}


def collective_table(nbytes: int) -> None:
    """Collective traffic on npusim-64c at each fidelity (flit = reference)."""
    arch = load_arch("npusim-64c")
    print(f"\ncollective traffic on {arch.name}, {nbytes:,} B per core:")
    print(f"{'scenario':>30} | {'flit cyc':>9} {'path cyc':>9} {'analyt':>9} | {'path err':>8} {'ana err':>8} | "
          f"{'wall f/p/a s':>16}")
    for name, build in COLLECTIVE_SCENARIOS.items():
        cycles, wall = {}, {}
        for fid in ("flit", "path", "analytical"):
            sim = Simulator(arch, noc_mode=fid)
            prog = Program(arch.num_cores)
            build(prog, nbytes)
            prog.submit(sim)
            t0 = time.perf_counter()
            sim.run()
            wall[fid] = time.perf_counter() - t0
            cycles[fid] = sim.makespan()
        ref = cycles["flit"]
        print(f"{name:>30} | {ref:9,} {cycles['path']:9,} {cycles['analytical']:9,} | "
              f"{err(cycles['path'], ref):>8} {err(cycles['analytical'], ref):>8} | "
              f"{wall['flit']:5.2f}/{wall['path']:4.2f}/{wall['analytical']:4.2f}")


def err(x: float, ref: float) -> str:
    return f"{100 * (x - ref) / ref:+7.1f}%" if ref and ref == ref and x == x else "    n/a"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="8x8 only, fewer rates, shorter windows")
    ap.add_argument("--packet-flits", type=int, default=4)
    args = ap.parse_args()
    meshes = [(8, 8)] if args.quick else [(8, 8), (16, 16)]
    measure = 3000 if args.quick else 10000
    print(f"{'mesh':>6} {'traffic':>9} {'rate':>5} | {'flit':>8} {'path':>8} {'analyt':>8} | "
          f"{'path err':>8} {'ana err':>8} | {'acc flit':>8} {'acc path':>8} | {'wall f/p/a s':>16}")
    summary = {"path": [], "analytical": []}
    for w, h in meshes:
        params = NocParams(w, h, vcs=2, buffer_flits=8, router_stages=4, link_latency_cycles=1)
        for pattern in ("uniform", "transpose"):
            rate = 0.05
            while rate <= 1.0:
                traffic = SyntheticTraffic(pattern=pattern, rate=round(rate, 3), packet_flits=args.packet_flits,
                                           warmup_cycles=1000, measure_cycles=measure, seed=1)
                res, wall = {}, {}
                for fid in ("flit", "path", "analytical"):
                    t0 = time.perf_counter()
                    res[fid] = simulate(fid, params, traffic)
                    wall[fid] = time.perf_counter() - t0
                ref = res["flit"].avg_packet_latency_cycles
                sat = " (flit saturated)" if res["flit"].saturated else ""
                print(f"{w}x{h:<4} {pattern:>9} {rate:5.2f} | {ref:8.1f} {res['path'].avg_packet_latency_cycles:8.1f} "
                      f"{res['analytical'].avg_packet_latency_cycles:8.1f} | "
                      f"{err(res['path'].avg_packet_latency_cycles, ref):>8} "
                      f"{err(res['analytical'].avg_packet_latency_cycles, ref):>8} | "
                      f"{res['flit'].accepted_flits_per_node_cycle:8.3f} {res['path'].accepted_flits_per_node_cycle:8.3f} | "
                      f"{wall['flit']:5.2f}/{wall['path']:4.2f}/{wall['analytical']:4.2f}{sat}")
                if res["flit"].saturated:
                    break
                for fid in summary:
                    summary[fid].append(abs(res[fid].avg_packet_latency_cycles - ref) / ref)
                rate += 0.05
    for fid, errors in summary.items():
        if errors:
            print(f"{fid:>10}: mean |error| {100 * sum(errors) / len(errors):.1f}%, max {100 * max(errors):.1f}% "
                  f"over {len(errors)} unsaturated points")
    collective_table(16 << 10 if args.quick else 64 << 10)
    print(machine_line())


if __name__ == "__main__":
    main()
