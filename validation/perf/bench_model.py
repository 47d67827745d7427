"""Whole-model simulation speed: wall time for one prefill (2,048 tokens) and one decode step
(16 sequences at KV 2,048) of Qwen3-4B (bf16) and Qwen3-32B (A8W8: in bf16 its 61 GiB of
weights and the KV cache overflow the presets' 64 GiB of HBM) on 64 and 256 cores, per fidelity.

Mapping: the `npusim run` default (TP 16, one pipeline stage per group, ring layouts,
partitions chosen per GEMM). Fidelities: memory analytical or TLM x NoC path, analytical
or flit. TLM simulates every 64-byte HBM transaction (Qwen3-32B streams ~64 GB per pass:
hundreds of millions of transactions), so it runs only with --tlm; the flit NoC only
with --flit.

    python validation/perf/bench_model.py [--tlm] [--flit] [--models qwen3-4b,qwen3-32b]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.mapping.mapper import map_model  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.model.builder import build_graph  # noqa: E402
from npusim.scenarios.forward import simulate_forward  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tlm", action="store_true", help="also the TLM memory model (slow: minutes per pass)")
    ap.add_argument("--flit", action="store_true", help="also the flit-level NoC")
    ap.add_argument("--models", default="qwen3-4b,qwen3-32b")
    args = ap.parse_args()
    fidelities = [("analytical", "analytical"), ("analytical", "path")]
    if args.flit:
        fidelities.append(("analytical", "flit"))
    if args.tlm:
        fidelities.append(("tlm", "path"))
    print(f"{'model':>10} {'phase':>8} {'chip':>12} {'memory':>10} {'noc':>10} | {'build s':>7} {'sim s':>8} "
          f"{'tasks':>9} {'events':>11} {'sim ms':>9}")
    for model in args.models.split(","):
        for phase in ("prefill", "decode"):
            precision = "a8w8" if "32b" in model else "bf16"  # 32B in bf16 (61 GiB) + KV overflows 64 GiB HBM
            if phase == "prefill":
                g = build_graph(model, phase="prefill", batch=1, seq_len=2048, precision=precision)
            else:
                g = build_graph(model, phase="decode", batch=16, seq_len=1, kv_len=2049, precision=precision)
            for preset in ("npusim-64c", "npusim-256c"):
                arch = load_arch(preset)
                stages = max(1, min(len(g.layers()), arch.num_cores // 16))
                spec = spec_from_flags(tp=16, stages=stages, layout="ring").model_copy(update={"data_parallel": 1})
                t0 = time.perf_counter()
                mapped = map_model(g, arch, spec)
                build = time.perf_counter() - t0
                for memory, noc in fidelities:
                    t1 = time.perf_counter()
                    s = simulate_forward(g, arch, spec, memory_mode=memory, noc_mode=noc, mapped=mapped).summary
                    wall = time.perf_counter() - t1
                    print(f"{model:>10} {phase:>8} {preset:>12} {memory:>10} {noc:>10} | {build:7.2f} {wall:8.2f} "
                          f"{s['tasks']:9,} {s['events']:11,} {s['latency_ms']:9.2f}", flush=True)
    print(machine_line())


if __name__ == "__main__":
    main()
