"""The NpuSim partition study (NpuSim, arXiv 2510.05632: TP-K vs TP-MN and TP-MNK studies): TP-K vs TP-MN vs TP-MNK for Qwen3-4B.

Source: "From Principles to Practice: A Systematic Study of LLM Serving on Multi-core
NPUs" (arXiv 2510.05632). Published: with TP=4 on 64 cores, TP-K is up to 6.03x faster
than TP-MN at sequence 256; TP-K falls off sharply once the sequence exceeds the hidden
size (2,560 for Qwen3-4B), where TP-MN wins; TP-MNK gives a 1.44x average speed-up at
sequences 512-1024 (the most balanced across lengths).

Here: prefill of one sequence, one decoder layer (per-layer latency, without embedding
and LM head) on one TP-4 group of npusim-64c, and the whole model over 9 pipeline stages x TP 4
(36 cores, 4 layers a stage), for each partition applied to every GEMM; memory at the analytical
fidelity, NoC at the path level. Then the layouts (linear-seq, linear-interleave, ring, mesh2d)
at TP=4 on 64 cores and TP=16 on 256 cores. The rows judged against the study are the ones
`npusim validate --only partition` prints (npusim/validate/partition.py).

HBM traffic crosses the mesh to the channels' routers (issue 12 section 1);
``--memory-shortcut`` sends it straight to the memory model as before, for the comparison.

    python validation/partition_study.py [--quick] [--memory-shortcut]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.cli.validate import print_table  # noqa: E402
from npusim.validate.partition import PARTITIONS, crossover, latency, partition_rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--memory-shortcut", action="store_true", help="DMA straight to HBM, not over the mesh")
    args = ap.parse_args()
    over_noc = False if args.memory_shortcut else None
    print("HBM traffic " + ("straight to the memory model (shortcut)" if args.memory_shortcut else
                            "over the mesh to the channels' routers"))
    arch = load_arch("npusim-64c")
    seqs = [128, 256, 1024, 4096] if args.quick else [128, 256, 512, 1024, 2048, 2560, 4096]
    t0 = time.perf_counter()
    for scope, layers, stages in (("per layer", 1, 1), ("end to end", None, 9)):
        print(f"\nQwen3-4B prefill, TP=4, {scope} (ms); ratios > 1 mean the first is faster")
        print(f"{'seq':>6} {'TP-K':>9} {'TP-MN':>9} {'TP-MNK':>9} | {'MN/K':>6} {'best/MNK':>8} | comm share K / MN")
        lat_all = {}
        for seq in seqs:
            res = {p: latency(arch, seq, p, layers, stages, memory_over_noc=over_noc) for p in PARTITIONS}
            lat = {p: r["latency_ms"] for p, r in res.items()}
            lat_all[seq] = lat
            comm = {p: r["breakdown_fraction"]["communication"] for p, r in res.items()}
            best_other = min(lat["tp_k"], lat["tp_mn"])
            print(f"{seq:>6} {lat['tp_k']:9.3f} {lat['tp_mn']:9.3f} {lat['tp_mnk']:9.3f} | "
                  f"{lat['tp_mn'] / lat['tp_k']:6.2f} {best_other / lat['tp_mnk']:8.2f} | "
                  f"{100 * comm['tp_k']:.0f}% / {100 * comm['tp_mn']:.0f}%")
        x = crossover(lat_all)
        print(f"TP-MN/TP-K crosses 1 at ~{x:.0f} tokens" if x else "TP-MN/TP-K does not cross 1 in this range")
    print("\nLayouts, Qwen3-4B prefill seq 1024, one layer, partition auto (ms):")
    print(f"{'chip':>12} {'TP':>3} " + " ".join(f"{k:>18}" for k in ("linear_seq", "linear_interleave", "ring", "mesh2d")))
    for preset, tp in (("npusim-64c", 4), ("npusim-256c", 16)):
        chip = load_arch(preset)
        row = [latency(chip, 1024, "auto", 1, 1, tp=tp, layout=k, memory_over_noc=over_noc)["latency_ms"]
               for k in ("linear_seq", "linear_interleave", "ring", "mesh2d")]
        print(f"{preset:>12} {tp:>3} " + " ".join(f"{v:18.3f}" for v in row))
    print("\nAgainst the study (npusim validate --only partition):")
    print_table(partition_rows(args.quick))
    print(f"\nwall time {time.perf_counter() - t0:.1f} s; {machine_line()}")


if __name__ == "__main__":
    main()
