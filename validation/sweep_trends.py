"""The example study sweeps' published trends beside the simulated ones (NpuSim, arXiv 2510.05632).

Source: the NpuSim study, arXiv 2510.05632 ("From Principles to Practice: A Systematic Study of
LLM Serving on Multi-core NPUs"). Reads the results table of ``examples/sweeps/hw-space.yaml``
or ``examples/sweeps/pd-ratio.yaml`` (run them first with ``npusim sweep``) and prints, per
published claim, the simulated figure, the published one and whether the trend holds.

    npusim sweep examples/sweeps/hw-space.yaml --out out/hw-space && python validation/sweep_trends.py out/hw-space
    npusim sweep examples/sweeps/pd-ratio.yaml --out out/pd-ratio && python validation/sweep_trends.py out/pd-ratio

The ``in SRAM`` column is the share of the fullest core's weights resident in its SRAM (the
sweep maps with ``memory.weights: partial``). Criteria: "hardly changes" is read as within 10%; "helps little" as under 10% (both thresholds
are this script's reading of the paper's words, not published numbers). Only finished points
count; a claim whose points are missing or failed is reported as such.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.sweep.table import read_table  # noqa: E402

SOURCE = "arXiv 2510.05632 (NpuSim)"
SRAM, BW, ARRAY, PHASE = ("arch.cores.sram.capacity_mb", "arch.hbm.channel_bandwidth_gbps",
                          "arch.cores.systolic_array.rows", "workload.phase")


def rows(table):
    cols = table.columns
    return [dict(zip(cols, vals)) for vals in zip(*cols.values()) if vals[list(cols).index("status")] == "ok"]


def hw_space(table) -> None:
    r = rows(table)
    lat = {(p["model"], p[PHASE], p[SRAM], p[ARRAY], p[BW]): p["latency_ms"] for p in r}
    # share of the weights resident in SRAM on the fullest core (weights: partial keeps what fits)
    fits = {(p["model"], p[PHASE], p[SRAM], p[ARRAY], p[BW]):
            (p.get("mapping.resident_weight_mb_per_core") or 0.0) / p["mapping.weight_mb_per_core"] for p in r}
    srams = sorted({k[2] for k in lat})
    bws = sorted({k[4] for k in lat})
    arrays = sorted({k[3] for k in lat})
    print(f"A5: Qwen3-4B, latency at the lowest / highest DRAM bandwidth ({bws[0]} / {bws[-1]} GB/s per core)")
    print(f"{'phase':>8} {'SRAM MB':>7} {'array':>5} | {'ms @lo':>9} {'ms @hi':>9} {'lo/hi':>6} {'in SRAM':>8}")
    a5 = []
    for phase in ("decode", "prefill"):
        for s in srams:
            for a in arrays:
                lo, hi = lat.get(("qwen3-4b", phase, s, a, bws[0])), lat.get(("qwen3-4b", phase, s, a, bws[-1]))
                if lo is None or hi is None:
                    continue
                resident = fits[("qwen3-4b", phase, s, a, bws[0])]
                print(f"{phase:>8} {s:>7} {a:>5} | {lo:9.3f} {hi:9.3f} {lo / hi:6.2f} "
                      f"{100 * resident:7.0f}%")
                if s >= 64:
                    a5.append(lo / hi)
    if a5:
        print(f"  published ({SOURCE}): with SRAM >= 64 MB/core DRAM bandwidth hardly changes latency")
        print(f"  simulated: lo/hi bandwidth latency ratio {min(a5):.2f}-{max(a5):.2f} at SRAM >= 64 MB -> "
              f"{'holds' if max(a5) <= 1.10 else 'does not hold'} (within 10%)")
    print(f"\nA6: Qwen3-32B, smallest array + lowest bandwidth vs largest array + highest bandwidth; SRAM "
          f"{srams[0]} vs {srams[-1]} MB")
    print(f"{'phase':>8} {'SRAM MB':>7} | {'ms small':>9} {'ms big':>9} {'ratio':>6} {'in SRAM':>8}")
    a6, sram_gain = [], []
    for phase in ("decode", "prefill"):
        for s in srams:
            small = lat.get(("qwen3-32b", phase, s, arrays[0], bws[0]))
            big = lat.get(("qwen3-32b", phase, s, arrays[-1], bws[-1]))
            if small is None or big is None:
                continue
            resident = fits[("qwen3-32b", phase, s, arrays[-1], bws[-1])]
            print(f"{phase:>8} {s:>7} | {small:9.3f} {big:9.3f} {small / big:6.2f} {100 * resident:7.0f}%")
            a6.append(small / big)
        for a in arrays:
            for b in bws:
                have = [s for s in srams if ("qwen3-32b", phase, s, a, b) in lat]  # the smallest may not fit HBM
                if len(have) > 1 and fits[("qwen3-32b", phase, have[-1], a, b)] < 1:
                    sram_gain.append(lat[("qwen3-32b", phase, have[0], a, b)] / lat[("qwen3-32b", phase, have[-1], a, b)])
    if a6:
        print(f"  published ({SOURCE}): raising array size and DRAM bandwidth together cuts latency up to 1.4x")
        print(f"  simulated: up to {max(a6):.2f}x (range {min(a6):.2f}-{max(a6):.2f}) -> "
              f"{'holds' if max(a6) > 1 else 'does not hold'} (direction); error of the maximum vs 1.4x: "
              f"{100 * (max(a6) - 1.4) / 1.4:+.0f}%")
    if sram_gain:
        print(f"  published: more SRAM helps little while the weights do not fit in SRAM")
        print(f"  simulated: the smallest -> largest SRAM that runs ({srams[-1]} MB), weights mostly streamed, cuts latency "
              f"{min(sram_gain):.2f}-{max(sram_gain):.2f}x -> {'holds' if max(sram_gain) < 1.10 else 'does not hold'} "
              "(under 10%)")


def change(a, b):
    return f"{100 * (a - b) / b:+.0f}%"


def pd_ratio(table) -> None:
    res = {p["run.pd_ratio"]: p for p in rows(table)}
    print(f"A7: P:D core ratios, {table.attrs.get('description', '')}")
    print(f"{'P:D':>6} | {'TTFT ms':>8} {'TBT ms':>8} {'E2E ms':>9} {'tok/s':>8}")
    for k in ("49:14", "42:21", "28:28", "21:42"):
        if k in res:
            p = res[k]
            print(f"{k:>6} | {p['ttft_ms.mean']:8.1f} {p['tbt_ms.mean']:8.1f} {p['e2e_ms.mean']:9.1f} "
                  f"{p['throughput_tokens_per_s']:8.1f}")
    checks = [("49:14 vs 21:42 TTFT", "49:14", "21:42", "ttft_ms.mean", "-40%", lambda x: x < 0),
              ("21:42 vs 49:14 E2E", "21:42", "49:14", "e2e_ms.mean", "-68%", lambda x: x < 0),
              ("42:21 vs 49:14 TTFT", "42:21", "49:14", "ttft_ms.mean", "+13%", lambda x: x > 0),
              ("42:21 vs 49:14 TBT", "42:21", "49:14", "tbt_ms.mean", "-30%+", lambda x: x < 0),
              ("42:21 vs 28:28 TTFT", "42:21", "28:28", "ttft_ms.mean", "-22%", lambda x: x < 0),
              ("42:21 vs 28:28 TBT", "42:21", "28:28", "tbt_ms.mean", "+10%", lambda x: x > 0)]
    print(f"{'comparison':>22} | {'simulated':>9} {'published':>9} | trend   ({SOURCE})")
    for name, a, b, key, pub, ok in checks:
        if a not in res or b not in res:
            print(f"{name:>22} | {'(missing)':>9} {pub:>9} |")
            continue
        x, y = res[a][key], res[b][key]
        print(f"{name:>22} | {change(x, y):>9} {pub:>9} | {'holds' if ok(x - y) else 'does not hold'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", help="a study sweep's output directory or results.h5")
    args = ap.parse_args()
    table = read_table(args.results)
    name = table.attrs.get("name")
    print(f"{name}: {table.attrs['points']} points, {table.attrs['ok']} finished, {table.attrs['failed']} failed, "
          f"{table.attrs['missing']} missing ({table.path})")
    if name == "hw-space":
        hw_space(table)
    elif name == "pd-ratio":
        pd_ratio(table)
    else:
        sys.exit(f"{name}: not one of the example studies (hw-space, pd-ratio)")
    print(machine_line())


if __name__ == "__main__":
    main()
