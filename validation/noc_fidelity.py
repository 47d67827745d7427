"""NoC fidelities side by side: flit (cycle-accurate) vs path (message-level) vs analytical.

For an 8x8 and a 16x16 mesh, uniform and transpose traffic, offered loads from 0.05
flits/node/cycle up to the flit model's saturation, prints the average packet latency
of each fidelity and the error of the two cheaper ones against the flit model, plus
each one's accepted throughput and wall time. Routers: 4 pipeline stages, 1-cycle links,
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

from npusim.hw.noc import NocParams, SyntheticTraffic  # noqa: E402
from npusim.sim.noc_synthetic import simulate  # noqa: E402


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
    print(machine_line())


if __name__ == "__main__":
    main()
