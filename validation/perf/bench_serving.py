"""Serving simulation speed: wall time and simulated seconds per wall second for requests of
the Mooncake conversation trace, per fidelity, and how wall time grows with requests and cores.

Requests are the trace's first N (../shared/traces/mooncake, else the repository's 200-line
sample) at the trace's own arrival times, prompts clipped to --max-input tokens and outputs
to --max-output (Mooncake's prompts average ~13k tokens; at Qwen3-4B's 144 KiB of KV per
token the chip's HBM holds only ~30 of them, and simulating them whole would take hours; the
number clipped is reported). PD fusion, budget 512, chunks of 256; Qwen3-4B on TP-4 groups in
a 16-stage pipeline per 64 cores: a chip with more cores runs one data-parallel replica per
64 cores (256 cores: 4 replicas on bands of columns). ``--layers N`` simulates only the first
N decoder layers (for the long growth series; say so when quoting).

``--cache off,on`` runs each point without and with the iteration-cost cache
(``npusim run --iteration-cache``; ``--cache-buckets`` its buckets, default exact).

    python validation/perf/bench_serving.py [--requests 100,1000] [--arch npusim-64c,npusim-256c]
        [--memory analytical,tlm] [--noc path,analytical] [--layers N] [--cache off,on]
        [--cache-buckets kv=1024] [--trace FILE]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.serving.itercache import parse_buckets  # noqa: E402
from npusim.serving.requests import cap_lengths  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402
from npusim.serving.traces import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CORES_PER_REPLICA = 64


def trace_path() -> Path:
    """The shared Mooncake conversation trace beside the checkout (or a worktree's parents), else
    the repository's 200-line sample."""
    for parent in ROOT.parents:
        shared = parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
        if shared.is_file():
            return shared
    return ROOT / "traces" / "mooncake_sample.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="20,100")
    ap.add_argument("--arch", default="npusim-64c")
    ap.add_argument("--memory", default="analytical")
    ap.add_argument("--noc", default="path")
    ap.add_argument("--layers", type=int, default=None, help="simulate only the first N decoder layers")
    ap.add_argument("--max-input", type=int, default=2048)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--cache", default="off", help="iteration cache: off, on or off,on")
    ap.add_argument("--cache-buckets", default="exact", help="iteration cache buckets (see npusim run --help)")
    ap.add_argument("--trace", type=Path, default=None, help="Mooncake JSONL (default: the shared trace, else the sample)")
    args = ap.parse_args()
    path = args.trace or trace_path()
    buckets = parse_buckets(args.cache_buckets)
    layers = "all" if args.layers is None else str(args.layers)
    print(f"trace {path.name}; prompts clipped to {args.max_input}, outputs to {args.max_output} tokens; "
          f"Qwen3-4B, {layers} layers; TP 4 x 16 stages per {CORES_PER_REPLICA} cores")
    print(f"{'requests':>8} {'arch':>12} {'memory':>10} {'noc':>10} {'cache':>5} | {'clipped':>7} {'wall s':>8} {'cpu s':>8} {'sim s':>8} "
          f"{'sim s/wall s':>12} {'iterations':>10} {'shapes':>6} {'tasks':>12} {'Mevents/s':>9} {'tok/s':>8}")
    spec = spec_from_flags(tp=4, stages=16, layout="ring").model_copy(update={"data_parallel": 1})
    warm = ServingConfig(model="qwen3-4b", layers=16)  # as many layers as stages
    for n in (int(x) for x in args.requests.split(",")):
        reqs, clipped = cap_lengths(load_trace(path, first=n), args.max_input, args.max_output)
        for arch_name in args.arch.split(","):
            arch = load_arch(arch_name)
            replicas = max(1, arch.num_cores // CORES_PER_REPLICA)
            for memory in args.memory.split(","):
                for noc, cache in ((x, c) for x in args.noc.split(",") for c in args.cache.split(",")):
                    cfg = ServingConfig(model="qwen3-4b", layers=args.layers, memory_mode=memory, noc_mode=noc,
                                        scheduler=SchedulerConfig(policy="fusion", budget=512, chunk_tokens=256),
                                        iteration_cache=buckets if cache == "on" else None)
                    # compile the kernel for this fidelity outside the timing
                    simulate_serving(arch, spec, reqs[:1], replace(warm, memory_mode=memory, noc_mode=noc),
                                     replicas=replicas)
                    t0, c0 = time.perf_counter(), time.process_time()
                    s = simulate_serving(arch, spec, reqs, cfg, replicas=replicas).summary
                    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
                    print(f"{n:>8} {arch_name:>12} {memory:>10} {noc:>10} {cache:>5} | {clipped:>7} {wall:8.1f} {cpu:8.1f} "
                          f"{s['simulated_s']:8.2f} {s['simulated_s'] / wall:12.3f} {s['iterations']:>10} "
                          f"{s['compiled_iteration_shapes']:>6} {s['tasks']:>12,} {s['events'] / wall / 1e6:9.2f} "
                          f"{s['throughput_tokens_per_s']:8.1f}", flush=True)
    print(machine_line())


if __name__ == "__main__":
    main()
