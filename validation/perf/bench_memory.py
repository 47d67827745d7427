"""HBM model speed: transactions per wall second in TLM mode vs analytical mode.

All DMA engines of the default chip stream (or randomly read) a total of --bytes
through the HBM; TLM simulates every 64-byte transaction with its four phases,
the analytical mode one duration per DMA transfer. Compile time excluded.

    python validation/perf/bench_memory.py [--bytes 256MiB]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.cli.util import parse_size  # noqa: E402
from npusim.sim.memory_probe import measure_memory  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bytes", type=parse_size, default="256MiB")
    ap.add_argument("--arch", default="npusim-64c")
    args = ap.parse_args()
    arch = load_arch(args.arch)
    for mode in ("tlm", "analytical"):
        measure_memory(arch, "stream", 1 << 16, mode=mode)  # compile / load the cache
    txn = arch.cores.dma.transaction_bytes
    print(f"{arch.name}, {args.bytes:,} bytes, {txn}-byte transactions")
    print(f"{'pattern':>8} {'mode':>11} {'wall s':>8} {'txns':>12} {'Mtxn/s':>8} {'sim GB/s':>9} {'speed-up':>9}")
    for pattern in ("stream", "random"):
        walls = {}
        for mode in ("tlm", "analytical"):
            t0 = time.perf_counter()
            r = measure_memory(arch, pattern, args.bytes, mode=mode)
            walls[mode] = time.perf_counter() - t0
            txns = args.bytes // txn
            speed = "" if mode == "tlm" else f"{walls['tlm'] / walls[mode]:>8.1f}x"
            print(f"{pattern:>8} {mode:>11} {walls[mode]:>8.2f} {txns:>12,} {txns / walls[mode] / 1e6:>8.2f} "
                  f"{r.bandwidth_gbps:>9.1f} {speed:>9}")
    print("(analytical 'txns' = the transactions it stands for; it simulates one event per DMA)")
    print(machine_line())


if __name__ == "__main__":
    main()
