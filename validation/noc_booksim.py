"""The flit NoC configured like BookSim2, against BookSim2.

BookSim2 cannot be built here (no network to fetch it), so the references are:

1. BookSim2 latencies reported from a BookSim2 run (``noc_booksim_reference.yaml``, with
   its source and configuration), compared with npusim's flit model in its default
   mode and with ``booksim_compatible`` (``npusim noc --booksim-compatible``);
2. BookSim2's zero-load latency derived from its source (pipeline and channel timing,
   see the "BookSim2-compatible mode" section of ``npusim/hw/noc/flit.py``):
   ``(H + 1) * S + H * L + F - 1 + 3`` averaged over the pattern's hop distribution,
   compared with the latency npusim measures at 1 % load, for every configuration of
   the issue: 4x4 and 8x8 meshes, uniform and transpose traffic, 1- and 4-flit packets;
3. per configuration, the latency curve up to 70 % of saturation and the saturation
   throughput in both modes, so the effect of BookSim's conventions is visible.

Every configuration uses BookSim2's defaults: 16 VCs x 8 flits, 4-stage routers,
1-cycle links, XY (DOR) routing, Bernoulli injection, rates in flits/node/cycle.

    python validation/noc_booksim.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.hw.noc import NocParams, SyntheticTraffic  # noqa: E402
from npusim.hw.noc.flit import simulate_flit, zero_load_latency_cycles  # noqa: E402

HERE = Path(__file__).resolve().parent
CONFIGS = [(m, t, f) for m in (4, 8) for t in ("uniform", "transpose") for f in (1, 4)]


def params(mesh: int, booksim: bool) -> NocParams:
    return NocParams(mesh, mesh, vcs=16, buffer_flits=8, router_stages=4, link_latency_cycles=1,
                     booksim_compatible=booksim)


def run(mesh, pattern, flits, rate, booksim, measure, seed=1):
    traffic = SyntheticTraffic(pattern=pattern, rate=rate, packet_flits=flits, warmup_cycles=1000,
                               measure_cycles=measure, seed=seed)
    return simulate_flit(params(mesh, booksim), traffic)


def saturation(mesh, pattern, flits, booksim, measure, step=0.05, refine=4) -> float:
    """Highest offered load (flits/node/cycle) the model sustains: rate steps, then bisection."""
    lo, hi, rate = 0.0, None, step
    while rate <= 1.0 + 1e-9:
        if run(mesh, pattern, flits, round(rate, 4), booksim, measure).saturated:
            hi = rate
            break
        lo, rate = rate, rate + step
    if hi is None:
        return 1.0
    for _ in range(refine):
        mid = (lo + hi) / 2
        if run(mesh, pattern, flits, round(mid, 4), booksim, measure).saturated:
            hi = mid
        else:
            lo = mid
    return lo


def err(x, ref):
    return 100.0 * (x - ref) / ref


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="shorter windows, coarser saturation search")
    args = ap.parse_args()
    measure = 4000 if args.quick else 20000
    ref = yaml.safe_load((HERE / "noc_booksim_reference.yaml").read_text())
    tol = float(ref["tolerance"])
    failures = 0

    print(f"1. BookSim2 run ({ref['source'].strip()})")
    print(f"{'config':>24} {'rate':>5} | {'BookSim2':>8} | {'npusim':>7} {'err':>7} | {'--booksim':>9} {'err':>7} | verdict")
    for pt in ref["points"]:
        mesh = int(pt["mesh"].split("x")[0])
        want = float(pt["avg_packet_latency_cycles"])
        got = {bk: run(mesh, pt["traffic"], pt["packet_flits"], pt["rate"], bk, max(measure, 20000))
               .avg_packet_latency_cycles for bk in (False, True)}
        ok = abs(err(got[True], want)) <= 100 * tol
        failures += not ok
        name = f"{pt['mesh']} {pt['traffic']} {pt['packet_flits']}-flit"
        print(f"{name:>24} {pt['rate']:5.2f} | {want:8.2f} | {got[False]:7.2f} {err(got[False], want):+6.1f}% | "
              f"{got[True]:9.2f} {err(got[True], want):+6.1f}% | {'ok' if ok else 'OUTSIDE'} (tol {100 * tol:.0f}%)")

    print("\n2. zero-load latency: BookSim2's pipeline and channels (derived from its source) vs "
          "--booksim-compatible at 0.01 flits/node/cycle")
    print("   (derived at the measured packets' mean hop count, the formula being linear in H; "
          "pattern mean in brackets)")
    print(f"{'config':>24} | {'derived':>16} {'measured':>8} {'err':>7} | verdict")
    for mesh, pattern, flits in CONFIGS:
        res = run(mesh, pattern, flits, 0.01, True, measure * 2)
        want = float(zero_load_latency_cycles(res.avg_hops, flits, 4, 1, booksim=True))
        ok = 0 <= err(res.avg_packet_latency_cycles, want) <= 2.0
        failures += not ok
        print(f"{f'{mesh}x{mesh} {pattern} {flits}-flit':>24} | {want:7.2f} ({res.zero_load_latency_cycles:6.2f}) "
              f"{res.avg_packet_latency_cycles:8.2f} "
              f"{err(res.avg_packet_latency_cycles, want):+6.2f}% | {'ok' if ok else 'OUTSIDE'} (0..+2%: only contention adds)")

    print("\n3. curves below 70 % of saturation and saturation throughput (flits/node/cycle), default vs BookSim2 mode")
    for mesh, pattern, flits in CONFIGS:
        sat = {bk: saturation(mesh, pattern, flits, bk, measure, step=0.05 if args.quick else 0.025,
                              refine=3 if args.quick else 4) for bk in (False, True)}
        name = f"{mesh}x{mesh} {pattern} {flits}-flit"
        print(f"{name}: saturation default {sat[False]:.3f}, BookSim2 mode {sat[True]:.3f} "
              f"({err(sat[False], sat[True]):+.1f}% default vs BookSim2 mode)")
        top = 0.7 * sat[True]
        rates = [round(top * k / 4, 3) for k in (1, 2, 3, 4)]
        line = "   rate   " + " ".join(f"{r:7.3f}" for r in rates)
        d = [run(mesh, pattern, flits, r, False, measure).avg_packet_latency_cycles for r in rates]
        b = [run(mesh, pattern, flits, r, True, measure).avg_packet_latency_cycles for r in rates]
        print(line)
        print("   default " + " ".join(f"{x:7.2f}" for x in d))
        print("   BookSim " + " ".join(f"{x:7.2f}" for x in b))
    print(machine_line())
    print(f"{failures} comparison(s) outside tolerance")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
