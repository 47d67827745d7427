"""Flit-level NoC speed: router-cycles simulated per second on 8x8, 16x16 and 32x32 meshes.

Uniform random traffic at 40 % of the mesh's bisection bound (4/k flits/node/cycle for a
k x k mesh: 0.2 on 8x8, 0.1 on 16x16, 0.05 on 32x32), 1-flit and 4-flit packets,
2 VCs x 8-flit buffers, 4-stage routers, 1-cycle links; plus BookSim2-default-like runs
(16 VCs x 8 flits, 1-flit packets) at the two points where BookSim2 itself is quoted at
about 0.2 M router-cycles/s (8x8 at 0.2) and 0.1 M (16x16 at 0.1) on this kind of machine.
Router-cycles = routers x cycles simulated (warm-up + window + drain). Compile time is
excluded (a warm-up run first); state building (Python) is reported apart. "wall" is
elapsed time; "cpu" is this process's CPU time (steadier on a shared machine).

    python validation/perf/bench_noc_flit.py [--scale 1.0]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

from npusim.hw.noc import build_routing, make_pattern, to_arrays  # noqa: E402
from npusim.hw.noc import flit  # noqa: E402
from npusim.hw.noc.flit_kernel import O_CYCLES, O_WIN_FLITS_EJ  # noqa: E402
from npusim.hw.noc.traffic import NocParams, SyntheticTraffic  # noqa: E402

# (k, rate, packet flits, vcs, buffer flits, measurement cycles, BookSim2 M router-cycles/s or None)
CASES = [
    (8, 0.2, 1, 2, 8, 40_000, None),
    (8, 0.2, 4, 2, 8, 40_000, None),
    (16, 0.1, 1, 2, 8, 10_000, None),
    (16, 0.1, 4, 2, 8, 10_000, None),
    (32, 0.05, 1, 2, 8, 3_000, None),
    (32, 0.05, 4, 2, 8, 3_000, None),
    (8, 0.2, 1, 16, 8, 40_000, 0.2),
    (16, 0.1, 1, 16, 8, 10_000, 0.1),
]


def bench(k: int, rate: float, flits: int, vcs: int, buf: int, cycles: int) -> dict:
    t0 = time.perf_counter()
    params = NocParams(k, k, vcs=vcs, buffer_flits=buf, router_stages=4, link_latency_cycles=1)
    traffic = SyntheticTraffic(rate=rate, packet_flits=flits, warmup_cycles=1000, measure_cycles=cycles, seed=1)
    topo = to_arrays(params.build_graph())
    state = flit.make_state(topo, build_routing(topo), vcs, buf, 4, traffic.source_queue_packets)
    pattern = make_pattern("uniform", topo)
    t1, c1 = time.perf_counter(), time.process_time()
    out, _ = flit.run_traffic(state, pattern, traffic)
    t2, c2 = time.perf_counter(), time.process_time()
    assert flit.conservation(state)["ok"]
    rc = topo.num_routers * int(out[O_CYCLES])
    return dict(build=t1 - t0, wall=t2 - t1, rc=rc, mrc_wall=rc / (t2 - t1) / 1e6, mrc_cpu=rc / max(c2 - c1, 1e-9) / 1e6,
                accepted=out[O_WIN_FLITS_EJ] / (topo.num_routers * cycles))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every measurement window by this")
    args = ap.parse_args()
    flit.warm_up()
    print(f"{'mesh':>6} {'rate':>5} {'F':>2} {'VCxbuf':>7} {'router-cycles':>14} {'build s':>8} {'run s':>7} "
          f"{'M rc/s wall':>12} {'M rc/s cpu':>11} {'accepted':>9} {'vs BookSim2':>12}")
    for k, rate, flits, vcs, buf, cycles, booksim in CASES:
        r = bench(k, rate, flits, vcs, buf, max(100, int(cycles * args.scale)))
        ratio = f"{r['mrc_wall'] / booksim:.0f}x" if booksim else ""
        print(f"{f'{k}x{k}':>6} {rate:>5.2f} {flits:>2} {vcs:>3}x{buf:<3} {r['rc']:>14,} {r['build']:>8.2f} {r['wall']:>7.2f} "
              f"{r['mrc_wall']:>12.2f} {r['mrc_cpu']:>11.2f} {r['accepted']:>9.3f} {ratio:>12}")
    print("BookSim2 reference: ~0.2 M router-cycles/s (8x8, rate 0.2) and ~0.1 M (16x16, rate 0.1), "
          "defaults (16 VCs x 8, 1-flit packets), as quoted in the project brief for this kind of machine.")
    print(machine_line())


if __name__ == "__main__":
    main()
