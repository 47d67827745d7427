"""``npusim run``: simulate a workload on a chip and report latency, throughput, utilisation.

Until the model and mapping layers land, the workload is the built-in weight-streaming
GEMM layer (see ``npusim.scenarios.weight_stream``): by default Qwen3-4B's FFN
up-projection (M=2048 tokens, K=2560, N=9728, fp16) split over all cores of the
default chip, weights streamed from HBM with double buffering.
"""

from __future__ import annotations

import json
from pathlib import Path

from npusim.arch import load_arch
from npusim.arch.load import DEFAULT_ARCH
from npusim.cli.progress import task_progress
from npusim.files import write_json
from npusim.report.hdf5 import write_task_hdf5
from npusim.report.perfetto import write_perfetto
from npusim.scenarios.weight_stream import DEFAULT_K, DEFAULT_M, DEFAULT_N, build_weight_stream_layer, summarize_layer
from npusim.sim import Simulator


def add_parser(sub):
    p = sub.add_parser(
        "run",
        help="simulate a workload (default: a weight-streaming GEMM layer on npusim-64c)",
        description="Simulate Y = act(X . W) split over all cores, weights streamed from HBM "
        f"(defaults: M={DEFAULT_M}, K={DEFAULT_K}, N={DEFAULT_N}, fp16 — Qwen3-4B's FFN up-projection "
        "for a 2048-token prefill) and report latency, TFLOPS, HBM bandwidth and utilisation.",
    )
    p.add_argument("--arch", default=DEFAULT_ARCH, help=f"arch YAML path or preset (default {DEFAULT_ARCH})")
    p.add_argument("--m", type=int, default=DEFAULT_M, help=f"tokens (rows of X), default {DEFAULT_M}")
    p.add_argument("--k", type=int, default=DEFAULT_K, help=f"reduction dimension, default {DEFAULT_K}")
    p.add_argument("--n", type=int, default=DEFAULT_N, help=f"output columns, default {DEFAULT_N}")
    p.add_argument("--dtype", default="fp16", help="operand dtype (fp16, bf16, int8; default fp16)")
    p.add_argument("--k-tile", type=int, default=None, help="K rows per weight tile (default: ~256 KiB tiles)")
    p.add_argument("--memory", choices=["tlm", "analytical"], default="tlm", help="HBM model fidelity (default tlm)")
    p.add_argument("--out", type=Path, default=None,
                   help="directory for summary.json, tasks.h5 and timeline.json (Perfetto)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def run(args) -> int:
    arch = load_arch(args.arch)
    sim = Simulator(arch, memory_mode=args.memory)
    layout = build_weight_stream_layer(sim, args.m, args.k, args.n, args.dtype, args.k_tile)
    with task_progress(arch.clock_ghz, enabled=not args.no_progress) as progress:
        sim.run(progress=progress, chunk_events=200_000)
    result = summarize_layer(sim, layout, args.m, args.k, args.n, args.dtype)
    summary = result.to_dict()
    if args.out:
        summary["files"] = _write_outputs(args.out, sim, summary)
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    r = result
    print(f"{r.arch}: Y[{r.m}x{r.n}] = silu(X[{r.m}x{r.k}] . W[{r.k}x{r.n}]) {r.dtype} on {r.cores_used} cores, "
          f"HBM model {r.memory_mode}")
    print(f"  latency        {r.latency_us:,.2f} us ({r.cycles:,} cycles)")
    print(f"  compute        {r.tflops_achieved:,.1f} TFLOPS of {r.tflops_peak:,.1f} peak ({100 * r.compute_utilization:.1f}%)")
    print(f"  HBM            {r.hbm_bytes / 2**20:,.1f} MiB at {r.hbm_bandwidth_gbps:,.1f} GB/s of {r.hbm_peak_gbps:,.1f} peak")
    busy = ", ".join(f"{u} {100 * f:.0f}%" for u, f in r.busy_fraction.items() if f > 0)
    print(f"  busy per core  {busy}")
    print(f"  simulated      {r.tasks:,} tasks, {r.events:,} events")
    for name, path in summary.get("files", {}).items():
        print(f"  wrote {name:<9} {path}")
    return 0


def _write_outputs(out: Path, sim: Simulator, summary: dict) -> dict:
    eng = sim.engine
    n = eng.num_tasks
    start, end = sim.task_times()
    files = {
        "summary": out / "summary.json",
        "tasks": out / "tasks.h5",
        "timeline": out / "timeline.json",
    }
    write_task_hdf5(files["tasks"], kind=eng.tt.kind[:n], queue=eng.tt.queue[:n], param=eng.tt.param[:n],
                    start=start, end=end, queue_names=eng.queue_names, busy_cycles=eng.busy_cycles(),
                    attrs={"arch": sim.arch.name, "clock_ghz": sim.arch.clock_ghz})
    write_perfetto(files["timeline"], queue_names=eng.queue_names, task_queue=eng.tt.queue[:n], start=start,
                   end=end, clock_ghz=sim.arch.clock_ghz, task_names=eng.task_names)
    paths = {k: str(v) for k, v in files.items()}
    write_json(files["summary"], {**summary, "files": paths})
    return paths
