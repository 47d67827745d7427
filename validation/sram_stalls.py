"""SRAM in the timing path (issue 12 section 3): what the SRAM's port width costs at the detailed fidelity.

NpuSim's study (arXiv 2510.05632, the public NPU-SIM code's ``sram_bitwidth``) varies the width of
the core SRAM's ports, 64/128/256-bit. npusim-64c's SRAM is 32 banks, one port per bank, 512 bits
wide (``bytes_per_cycle_per_bank: 64``); the study's widths are 8/16/32 bytes per bank here. At the
analytical memory fidelity compute is timed by the stall-free closed forms (operands always
arrive), so port width changes nothing; at the detailed (TLM) fidelity the ports serve the
array's streams and the vector unit's passes, DMA traffic competes for them, and compute stalls.

1. Single-core GEMMs (``npusim gemm --memory tlm``): Qwen3-4B shapes on one 128x128 core (a TP-16
   decode FFN slice, a TP-4 prefill projection) and a large square GEMM.
2. Forward passes of Qwen3-4B on the 64-core chip (``npusim run --forward --memory tlm --fidelity
   analytical``, ``--layers`` decoder layers): a decode step (16 sequences at KV 1,024) and a
   prefill (1 x 512 tokens). Columns: the analytical memory fidelity; TLM with the SRAM out of the
   timing path (``sram.feeds_compute: false``, the stall-free closed form with TLM HBM); TLM with
   the SRAM ports (detailed); the stall cycles summed over compute tasks (of them, behind DMA); and
   the difference detailed vs stall-free TLM.

No published figure gives these latencies (the paper plots trends only), so this prints what the
model says; the tests (tests/test_sram_timing.py) check the physics (no stall above the array's peak
demand, monotone in width, ports never above 100 %).

    python validation/sram_stalls.py [--layers N] [--skip-forward]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.hw.memory.sram_timing import gemm_sram_timing  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.model.builder import build_graph  # noqa: E402
from npusim.scenarios.forward import simulate_forward  # noqa: E402

WIDTHS_BITS = (64, 128, 256, 512)  # the study's three, and npusim-64c's own


def with_sram(arch, **update):
    sram = arch.cores.sram.model_copy(update=update)
    name = f"{arch.name}-sram{sram.port_width_bits}" + ("" if sram.feeds_compute else "-private")
    return arch.model_copy(update={"name": name, "cores": arch.cores.model_copy(update={"sram": sram})})


def gemm_table(arch) -> None:
    sa = arch.cores.systolic_array
    shapes = [("decode FFN up, TP16", 16, 2560, 608), ("prefill QKV, TP4", 512, 2560, 1024),
              ("square", 1024, 4096, 4096)]
    print("1. One GEMM on one npusim-64c core (128x128 WS, double-buffered weights, bf16)")
    print(f"{'GEMM':>20} {'M x K x N':>16} {'port bits':>9} {'analytical':>11} {'detailed':>11} "
          f"{'stall':>10} {'diff %':>7} {'ports busy':>10}")
    for label, m, k, n in shapes:
        for bits in WIDTHS_BITS:
            sram = with_sram(arch, bytes_per_cycle_per_bank=bits // 8).cores.sram
            t = gemm_sram_timing(m, k, n, sa.rows, sa.cols, sa.dataflow, 1, sa.t_inj, sram, "bf16",
                                 double_buffer=sa.double_buffered_weights)
            print(f"{label:>20} {f'{m}x{k}x{n}':>16} {bits:>9} {t.stall_free_cycles:>11,} {t.cycles:>11,} "
                  f"{t.stall_cycles:>10,} {100 * t.stall_cycles / t.stall_free_cycles:>7.1f} "
                  f"{100 * t.port_utilization:>9.1f}%")
    print("   command: npusim gemm --arch FILE --m M --k K --n N --dtype bf16 --memory tlm "
          "(FILE: extends npusim-64c, cores.sram.bytes_per_cycle_per_bank = bits / 8)")


def forward_table(arch, layers: int) -> None:
    print(f"\n2. Qwen3-4B forward on npusim-64c ({layers} decoder layer(s), TP 16, NoC analytical)")
    print(f"{'phase':>8} {'port bits':>9} {'analytical ms':>13} {'TLM no-SRAM ms':>14} {'detailed ms':>11} "
          f"{'stall cycles':>13} {'behind DMA':>11} {'diff %':>7} {'wall s':>7}")
    cases = [("decode", dict(phase="decode", batch=16, seq_len=1, kv_len=1024)),
             ("prefill", dict(phase="prefill", batch=1, seq_len=512))]
    for phase, kw in cases:
        g = build_graph("qwen3-4b", layers=layers, **kw)
        stages = max(1, min(len(g.layers()), arch.num_cores // 16))
        spec = spec_from_flags(tp=16, stages=stages).model_copy(update={"data_parallel": 1})
        cheap = simulate_forward(g, arch, spec, memory_mode="analytical", noc_mode="analytical").summary
        free = simulate_forward(g, with_sram(arch, feeds_compute=False), spec, memory_mode="tlm",
                                noc_mode="analytical").summary
        assert free["sram_stall_cycles"] == 0
        for bits in WIDTHS_BITS:
            w0 = time.perf_counter()
            s = simulate_forward(g, with_sram(arch, bytes_per_cycle_per_bank=bits // 8), spec, memory_mode="tlm",
                                 noc_mode="analytical").summary
            wall = time.perf_counter() - w0
            diff = 100 * (s["latency_ms"] / free["latency_ms"] - 1)
            print(f"{phase:>8} {bits:>9} {cheap['latency_ms']:>13.3f} {free['latency_ms']:>14.3f} "
                  f"{s['latency_ms']:>11.3f} {s['sram_stall_cycles']:>13,} {s['sram_dma_stall_cycles']:>11,} "
                  f"{diff:>7.1f} {wall:>7.1f}")
    print(f"   command: npusim run --forward --arch FILE --memory tlm --fidelity analytical --layers {layers} "
          "[--phase prefill --batch 1 --seq 512] --json (sram_stall_cycles)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=1, help="decoder layers in the forward passes (default 1)")
    ap.add_argument("--skip-forward", action="store_true", help="only the single-GEMM table")
    args = ap.parse_args()
    print(machine_line())
    arch = load_arch("npusim-64c")
    gemm_table(arch)
    if not args.skip_forward:
        forward_table(arch, args.layers)


if __name__ == "__main__":
    main()
