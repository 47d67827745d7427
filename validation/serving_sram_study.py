"""PD fusion: per-core SRAM and pipeline stages (NpuSim, arXiv 2510.05632).

Source: the NpuSim study, arXiv 2510.05632 ("From Principles to Practice: A Systematic Study
of LLM Serving on Multi-core NPUs"). Published (PD fusion, 64 cores): at 16 MB SRAM per core,
36 pipeline stages beat 12 or 18 stages by 1.1-1.61x; raising SRAM 16 -> 32 MB per core cuts
latency 2.6-3.7x; at 48 MB per core, 18 stages is the best choice.

Here: npusim-64c with its per-core SRAM (`cores.sram.capacity_mb`) set to each size; PD fusion
(budget 512, chunks of 256); analytical memory, path NoC; Poisson arrivals with fixed lengths.
Each stage is one TP group of `--tp` cores (default 1) in linear_seq strips, one data-parallel
replica. Latency is the mean end-to-end latency of the requests; a cell that cannot be mapped
prints the reason instead of figures.

The default setup follows the public NPU-SIM configurations of this figure (repository
doulujiyao12/npu-sim, `paper/.../pd_fuse_{12*3,18*2,36*1}`): one core per pipeline stage,
36 layers of hidden size 1280 — GPT-2-large's shape, here at A8W8 — so a stage of 1, 2 or 3
layers needs ~19, 39 or 59 MB of weights per core, around the 16-48 MB SRAM sizes; short
prompts (128-512 tokens) and short outputs. What SRAM size changes is how much of each stage's
weights stays resident: `memory.weights: partial` keeps whole weight tensors in SRAM while
they fit (after the reserve, the KV cache and two streaming tile buffers) and streams the rest
each iteration (NPU-SIM's "spill"). `--weights auto` is all-or-nothing instead. The columns
`W MB/core` (the fullest stage's weights per core; the last stage also holds the LM head) and
`kept MB` (resident per core) show it. `--model qwen3-4b --precision bf16 --tp 1` is the
study's model as named, whose 36 layers (~200 MB each) never fit.

    python validation/serving_sram_study.py [--requests 32] [--rate 16] [--sram 16,32,48] [--stages 12,18,36]
        [--model gpt2-large] [--precision a8w8] [--tp 1] [--weights partial|auto]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line

from npusim.arch import load_arch
from npusim.cli.validate import print_table
from npusim.serving.requests import parse_length
from npusim.validate.sram import SramSetup, requests, rows_from, run_cell, variant

SOURCE = "arXiv 2510.05632 (NpuSim)"


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--rate", type=float, default=16.0)
    ap.add_argument("--input-len", default="128:512", help="prompt tokens: N or I1:I2 uniform")
    ap.add_argument("--output-len", default="16", help="output tokens: N or O1:O2 uniform")
    ap.add_argument("--model", default="gpt2-large")
    ap.add_argument("--precision", choices=["bf16", "a8w8"], default="a8w8")
    ap.add_argument("--tp", type=int, default=1, help="cores per pipeline stage")
    ap.add_argument("--weights", choices=["partial", "auto"], default="partial")
    ap.add_argument("--sram", default="16,32,48", help="per-core SRAM sizes, MB (comma list)")
    ap.add_argument("--stages", default="12,18,36", help="pipeline stage counts (comma list)")
    args = ap.parse_args()
    base = load_arch("npusim-64c")
    srams, stage_counts = ints(args.sram), ints(args.stages)
    setup = SramSetup(args.requests, args.rate, parse_length(args.input_len), parse_length(args.output_len),
                      args.model, args.precision, args.tp, args.weights, tuple(srams), tuple(stage_counts))
    reqs = requests(setup)
    print(f"A9: PD fusion on {base.name}, {setup.describe()}")
    print(f"{'SRAM':>5} {'stages':>6} {'TP':>3} | {'E2E ms':>9} {'TTFT ms':>9} {'TBT ms':>8} {'tok/s':>8} | "
          f"{'resident':>8} {'W MB/core':>9} {'kept MB':>7} {'done':>5} {'wall s':>6}")
    t0 = time.perf_counter()
    cells = {}
    for mb in srams:
        arch = variant(base, mb)
        for st in stage_counts:
            head = f"{mb:>3}MB {st:>6} {args.tp:>3} | "
            t1 = time.perf_counter()
            s = cells[(mb, st)] = run_cell(arch, st, setup, reqs)
            if "error" in s:
                print(f"{head}cannot run: {s['error']}", flush=True)
                continue
            wall = time.perf_counter() - t1
            done = f"{s['requests_completed']}/{s['requests_total']}"
            res = f"{s['weights_resident']!s:>8} {s['shard_mb']:9.1f} {s['kept_mb']:7.1f} {done:>5} {wall:6.0f}"
            if s["e2e_ms"]["mean"] is None:
                print(f"{head}{'no request completed':>38} | {res} {s['rejected_reasons']}", flush=True)
                continue
            tbt = s["tbt_ms"]["mean"]
            print(f"{head}{s['e2e_ms']['mean']:9.1f} {s['ttft_ms']['mean']:9.1f} "
                  f"{float('nan') if tbt is None else tbt:8.2f} {s['throughput_tokens_per_s']:8.1f} | "
                  f"{res}", flush=True)
    print_table(rows_from(cells, setup))
    at48 = {st: c["e2e_ms"]["mean"] for (mb, st), c in cells.items() if mb == 48 and "error" not in c}
    if at48:
        print("   48 MB mean E2E ms by stages: " + ", ".join(f"{st}: {v:.1f}" for st, v in sorted(at48.items())))
    print(f"\nwall time {time.perf_counter() - t0:.0f} s; {machine_line()}")


if __name__ == "__main__":
    main()
