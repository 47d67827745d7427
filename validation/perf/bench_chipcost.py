"""Chip-cost speed: what a miss (one chip simulation), a memory hit and a disk hit cost, for GEMM
shapes a DeepSeek-V3 system run asks of one Ascend 910C die (ascend-910c-die preset).

Shapes (INT8 A8W8, hidden 7168, per-die shares of the published dimensions): q_a 7168x1536,
o_proj 16384x7168 / TP 8 (= 2048x7168, also a routed expert's down projection), dense FFN
7168x18432 / TP (TP 1 and 8), a routed expert's gate+up 7168x4096; tokens m = 96 (decode batch per
die), 1024, 4096, 16384 (prefill).
Each miss is timed on a fresh in-memory cache (so it is a real simulation), the disk hit on a new
ChipCost reading the file the miss wrote. The first row's miss also pays loading the Numba kernel
from its cache (or compiling it) once per process; it is printed separately.

    python validation/perf/bench_chipcost.py [--memory tlm] [--l2 110] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.system.chipcost import ChipCost  # noqa: E402

KN = [("q_a", 7168, 1536), ("o_proj tp8", 2048, 7168), ("ffn_up tp8", 7168, 2304), ("ffn_up", 7168, 18432),
      ("expert up", 7168, 4096)]
TOKENS = [96, 1024, 4096, 16384]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="ascend-910c-die")
    ap.add_argument("--memory", choices=["analytical", "tlm"], default="analytical")
    ap.add_argument("--l2", type=float, default=None, help="ideal-L2 bytes/cycle per core (default: none)")
    ap.add_argument("--dtype", default="int8")
    ap.add_argument("--quick", action="store_true", help="m = 96 and 4096 only")
    args = ap.parse_args()
    arch = load_arch(args.arch)
    tokens = [96, 4096] if args.quick else TOKENS

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        ChipCost(arch, memory=args.memory, persist=False, l2_bytes_per_cycle=args.l2).gemm(64, 256, 256, args.dtype)
        warm = time.perf_counter() - t0
        print(f"chip {arch.name}, memory {args.memory}, L2 {args.l2 or 'none'}, {args.dtype}; first call in the "
              f"process (Numba kernel load + a tiny GEMM): {warm:.2f} s")
        print(f"{'op':>12} {'m':>6} {'k':>6} {'n':>6} | {'miss s':>7} {'mem hit us':>10} {'disk hit ms':>11} | "
              f"{'sim us':>10} {'util':>6} {'HBM GB/s':>8} {'HBM/min':>7} {'tasks':>6}  plan")
        total_miss = 0.0
        for name, k, n in KN:
            for m in tokens:
                where = Path(tmp) / f"{m}x{k}x{n}"  # a cold disk cache per row
                cc = ChipCost(arch, memory=args.memory, cache_dir=where, l2_bytes_per_cycle=args.l2)
                t0 = time.perf_counter()
                r = cc.gemm(m, k, n, args.dtype)
                miss = time.perf_counter() - t0
                total_miss += miss
                reps = 1000
                t0 = time.perf_counter()
                for _ in range(reps):
                    cc.gemm(m, k, n, args.dtype)
                mem_hit = (time.perf_counter() - t0) / reps
                fresh = ChipCost(arch, memory=args.memory, cache_dir=where, l2_bytes_per_cycle=args.l2)
                t0 = time.perf_counter()
                fresh.gemm(m, k, n, args.dtype)
                disk_hit = time.perf_counter() - t0
                assert cc.stats.misses == 1 and fresh.stats.disk_hits == 1
                print(f"{name:>12} {m:>6} {k:>6} {n:>6} | {miss:>7.3f} {mem_hit * 1e6:>10.1f} {disk_hit * 1e3:>11.2f} | "
                      f"{r.time_us:>10.1f} {r.compute_utilization:>6.3f} {r.hbm_bandwidth_gbps:>8.0f} "
                      f"{r.hbm_bytes / r.min_hbm_bytes:>7.2f} {r.tasks:>6}  {r.mapping}")
        print(f"total miss time {total_miss:.2f} s for {len(KN) * len(tokens)} shapes")
    print(machine_line())


if __name__ == "__main__":
    main()
