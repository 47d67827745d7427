"""What the SRAM in the timing path costs in wall time: a TLM forward pass with the SRAM out of
the timing path (``sram.feeds_compute: false``) and with its ports in it (npusim-64c's 512-bit
ports: no stall, so the same events and latency; the difference is the per-shape fold loop when
the program is timed and the per-task port check in the kernel). Compile time excluded (a warm-up
run first). Qwen3-4B prefill, 1 x 512 tokens, one decoder layer, TP 16, NoC analytical.

    python validation/perf/bench_sram.py [--repeat 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.model.builder import build_graph  # noqa: E402
from npusim.scenarios.forward import simulate_forward  # noqa: E402


def with_sram(arch, **update):
    sram = arch.cores.sram.model_copy(update=update)
    return arch.model_copy(update={"cores": arch.cores.model_copy(update={"sram": sram})})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    print(machine_line())
    arch = load_arch("npusim-64c")
    g = build_graph("qwen3-4b", layers=1, phase="prefill", batch=1, seq_len=512)
    spec = spec_from_flags(tp=16, stages=1).model_copy(update={"data_parallel": 1})
    cases = (("SRAM out of the path", with_sram(arch, feeds_compute=False)), ("SRAM ports (512-bit)", arch))
    simulate_forward(g, arch, spec, memory_mode="tlm", noc_mode="analytical")  # compile
    print(f"{'case':>22} {'wall s':>7} {'events':>12} {'latency ms':>10}")
    for _ in range(args.repeat):
        for label, a in cases:
            w = time.perf_counter()
            s = simulate_forward(g, a, spec, memory_mode="tlm", noc_mode="analytical").summary
            print(f"{label:>22} {time.perf_counter() - w:>7.1f} {s['events']:>12,} {s['latency_ms']:>10.3f}", flush=True)


if __name__ == "__main__":
    main()
