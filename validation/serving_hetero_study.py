"""Heterogeneous decode cores under PD disaggregation (NpuSim, arXiv 2510.05632).

Source: the NpuSim study, arXiv 2510.05632. Published (P:D cores 2:1, 7 nm area): raising the
decode cores' DRAM bandwidth 60 -> 240 GB/s gives x2.28 throughput (x2.18 per area); 480 GB/s
gives no further gain (compute-bound); shrinking the decode cores' arrays 64x64 -> 32x32 loses
< 5% throughput and gives x1.9 throughput per area.

The simulation lives in npusim/validate/hetero.py (setup in its docstring: the study's per-core
60 GB/s DRAM chip, the 21 decode cores of a 42:21 split varied, 7:7 instance stages); this
script prints each variant and the rows `npusim validate --only hetero-decode` judges.

    python validation/serving_hetero_study.py [--requests 24] [--rate 40] [--pd-stages 7:7|auto]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.cli.validate import print_table  # noqa: E402
from npusim.validate.hetero import VARIANTS, HeteroSetup, rows_from, run  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = HeteroSetup()
    ap.add_argument("--requests", type=int, default=d.requests)
    ap.add_argument("--rate", type=float, default=d.rate)
    ap.add_argument("--output-len", type=int, default=d.output_len)
    ap.add_argument("--pd-stages", default="7:7", help="stages of the prefill and decode instances, P:D, or auto")
    args = ap.parse_args()
    stages = None if args.pd_stages == "auto" else tuple(int(x) for x in args.pd_stages.split(":"))
    setup = HeteroSetup(args.requests, args.rate, d.input_len, args.output_len, stages)
    t0 = time.perf_counter()
    res = run(setup, VARIANTS)
    print(f"A8: {setup.describe()}")
    print(f"{'decode cores':>22} | {'tok/s':>8} {'TBT ms':>7} {'area mm2':>9} {'tok/s/mm2':>9}")
    for (bw, array), s in res.items():
        print(f"{array:>3}x{array:<3} at {bw:>4} GB/s | {s['throughput_tokens_per_s']:8.1f} {s['tbt_ms']['mean']:7.2f} "
              f"{s['area_mm2']:9.1f} {s['throughput_tokens_per_s'] / s['area_mm2']:9.4f}")
    print_table(rows_from(res, setup))
    print(f"wall time {time.perf_counter() - t0:.0f} s; {machine_line()}")


if __name__ == "__main__":
    main()
