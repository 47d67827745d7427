"""Serving simulation speed: wall time and simulated seconds per wall second for requests of
the Mooncake conversation trace on npusim-64c, and how wall time grows with requests.

Requests are the trace's first N (../shared/traces/mooncake, else the repository's 200-line
sample), prompts clipped to --max-input tokens and outputs to --max-output (Mooncake's
12k-token prompts x 144 KiB of Qwen3-4B KV per token would hold only ~30 requests in HBM
and take hours to simulate at this stage; the clipping is reported). PD fusion, budget
512, chunks of 256; Qwen3-4B on TP-4 groups in a 16-stage pipeline.

    python validation/perf/bench_serving.py [--requests 20,50,100] [--memory analytical,tlm]
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
from npusim.serving.requests import cap_lengths  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402
from npusim.serving.traces import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def trace_path() -> Path:
    shared = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
    return shared if shared.is_file() else ROOT / "traces" / "mooncake_sample.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="20,50,100")
    ap.add_argument("--memory", default="analytical")
    ap.add_argument("--noc", default="path")
    ap.add_argument("--max-input", type=int, default=2048)
    ap.add_argument("--max-output", type=int, default=128)
    args = ap.parse_args()
    arch = load_arch("npusim-64c")
    spec = spec_from_flags(tp=4, stages=16, layout="ring").model_copy(update={"data_parallel": 1})
    path = trace_path()
    print(f"trace {path.name}; prompts clipped to {args.max_input}, outputs to {args.max_output} tokens")
    print(f"{'requests':>8} {'memory':>10} {'noc':>6} | {'clipped':>7} {'wall s':>8} {'sim s':>8} {'sim s/wall s':>12} "
          f"{'iterations':>10} {'shapes':>6} {'tasks':>12} {'tok/s':>8}")
    for n in (int(x) for x in args.requests.split(",")):
        reqs, clipped = cap_lengths(load_trace(path, first=n), args.max_input, args.max_output)
        for memory in args.memory.split(","):
            cfg = ServingConfig(model="qwen3-4b", memory_mode=memory, noc_mode=args.noc,
                                scheduler=SchedulerConfig(policy="fusion", budget=512, chunk_tokens=256))
            t0 = time.perf_counter()
            s = simulate_serving(arch, spec, reqs, cfg).summary
            wall = time.perf_counter() - t0
            print(f"{n:>8} {memory:>10} {args.noc:>6} | {clipped:>7} {wall:8.1f} {s['simulated_s']:8.3f} "
                  f"{s['simulated_s'] / wall:12.4f} {s['iterations']:>10} {s['compiled_iteration_shapes']:>6} "
                  f"{s['tasks']:>12,} {s['throughput_tokens_per_s']:8.1f}", flush=True)
    print(machine_line())


if __name__ == "__main__":
    main()
