"""PD disaggregation core ratios and PD fusion vs disaggregation (NpuSim, arXiv 2510.05632).

Source: the NpuSim study, arXiv 2510.05632 ("From Principles to Practice: A Systematic Study
of LLM Serving on Multi-core NPUs"), Qwen3-4B on 64 cores.

A7 published: P:D 49:14 cuts TTFT 40% vs 21:42; 21:42 cuts mean E2E latency 68% vs 49:14 at a
100:100 in:out workload; 42:21 vs 49:14: TTFT +13%, TBT -30% or more; 42:21 vs 28:28: TTFT
-22%, TBT +10%.
A10 published: at P:D tokens 1:5 (decode-heavy) fusion has 2.3x the throughput of
disaggregation; at 10:1 (prefill-heavy) disaggregation has 1.34x; disaggregation's TBT varies
< 5% across workloads, fusion's up to 2.57x. The published disaggregation uses heterogeneous
decode cores; its fusion the homogeneous chip.

The simulation lives in npusim/validate/serving_pd.py (its docstring gives the setup: the
study's per-core DRAM chip, 7:7 instance stages and 7 fusion stages from the public NPU-SIM
configurations); this script prints the simulated figures and the rows `npusim validate --only
pd-ratios,fusion-vs-disagg` judges (magnitudes, not only signs). Flags change the setup.

    python validation/serving_pd_study.py [--requests 40] [--rate 20] [--a7-requests 200] [--a7-rate inf]
        [--only a7|a10]
        [--arch npusim-64c] [--pd-stages 7:7|auto] [--fusion-stages 7] [--balance cost|layers]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.cli.validate import print_table  # noqa: E402
from npusim.validate.serving_pd import A7_SETUP, PdSetup, a7, a7_rows_from, a10, a10_rows_from  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = PdSetup()
    ap.add_argument("--requests", type=int, default=d.requests, help="A10's requests (default 40)")
    ap.add_argument("--rate", type=float, default=d.rate, help="A10's Poisson rate, requests/s (default 20)")
    ap.add_argument("--a7-requests", type=int, default=A7_SETUP.requests,
                    help="A7's requests (default: the artefact's 200)")
    ap.add_argument("--a7-rate", type=float, default=A7_SETUP.rate,
                    help="A7's arrival rate, requests/s (default inf: all at once, as the artefact)")
    ap.add_argument("--only", choices=["a7", "a10"], default=None, help="run one of the two studies")
    ap.add_argument("--arch", default=None, help="A7's chip (default: npusim-64c with per-core 60 GB/s DRAM)")
    ap.add_argument("--pd-stages", default="7:7", help="stages of the prefill and decode instances, P:D, or auto "
                                                       "(npusim's default: fewest stages of <= 32 cores)")
    ap.add_argument("--balance", choices=["cost", "layers"], default=d.balance,
                    help="layers per pipeline stage: even estimated cost (npusim's default) or even counts")
    ap.add_argument("--fusion-stages", type=int, default=d.fusion_stages,
                    help="A10: pipeline stages of the fusion instance (TP = cores / stages)")
    args = ap.parse_args()
    stages = None if args.pd_stages == "auto" else tuple(int(x) for x in args.pd_stages.split(":"))
    setup = PdSetup(args.requests, args.rate, stages, args.fusion_stages, args.balance)
    t0 = time.perf_counter()
    rows = []
    if args.only != "a10":
        a7_setup = replace(setup, requests=args.a7_requests, rate=args.a7_rate)
        res = a7(a7_setup, load_arch(args.arch) if args.arch else None)
        print(f"A7: P:D core ratios, 100 in / 100 out tokens; {a7_setup.describe()}")
        print("  TTFT, TBT and decode span as NPU-SIM's draw_pd_split_mono.py computes them; "
              "TTFT and E2E from arrival as npusim's summary does")
        print(f"{'P:D':>6} | {'TTFT ms':>8} {'TBT ms':>8} {'decode ms':>9} | {'TTFT arr':>8} {'E2E arr':>9} {'tok/s':>8}")
        for (p, dd), s in res.items():
            print(f"{p:>3}:{dd:<2} | {s['ttft_ms']:8.1f} {s['tbt_ms']:8.1f} {s['decode_ms']:9.1f} | "
                  f"{s['ttft_from_arrival_ms']:8.1f} {s['e2e_ms']:9.1f} {s['throughput_tokens_per_s']:8.1f}")
        rows += a7_rows_from(res, a7_setup, *([args.arch] if args.arch else []))
    if args.only != "a7":
        res = a10(setup)
        print(f"\nA10: PD fusion (homogeneous chip) vs disaggregation 42:21 (heterogeneous decode cores); {setup.describe()}")
        print(f"{'in:out':>9} | {'fusion tok/s':>12} {'disagg tok/s':>12} | {'fusion TBT':>10} {'disagg TBT':>10}")
        for label, r in res.items():
            f, dd = r["fusion"], r["disagg"]
            print(f"{label:>9} | {f['throughput_tokens_per_s']:12.1f} {dd['throughput_tokens_per_s']:12.1f} | "
                  f"{f['tbt_ms']['mean']:10.2f} {dd['tbt_ms']['mean']:10.2f}")
        rows += a10_rows_from(res, setup)
    print_table(rows)
    print(f"\nwall time {time.perf_counter() - t0:.0f} s; {machine_line()}")


if __name__ == "__main__":
    main()
