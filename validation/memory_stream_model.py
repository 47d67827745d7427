"""The path fidelity's memory-stream models against each other: ``reserve`` (the default) vs ``hop``.

HBM traffic crosses the mesh as one request and one response stream per attach router per DMA
(:mod:`npusim.sim.mempath`). ``hop`` moves each stream's header link by link, one event per hop
(and two per wait); ``reserve`` lets the header claim every free link ahead of it in one go, at
the time it would reach it, and falls back to hop-by-hop only where it must wait on a mesh link
(:func:`npusim.hw.noc.path.path_reserve_part`), at most 8 hops' time ahead. The approximation: a
free link is reserved up to ``8 (S + L)`` cycles before the header reaches it. This prints the error of ``reserve``
against ``hop`` (cycles, throughput, latency) and what it saves (events, CPU seconds) on

1. concurrent weight-like streams: 16 or 64 cores each reading 4 x 256 KiB (analytical memory);
2. forward passes of Qwen3-4B on npusim-64c with the serving mapping (TP 4 x 16 stages): decode
   batches and a prefill, memory analytical (all layers), and a decode batch with TLM memory (the
   first 2 layers, TP 4 x 2 stages: its DRAM events dominate, the streams' share is small);
3. serving: Qwen3-4B's first 8 layers, TP 4 x 8 stages, PD fusion, 16 requests (Poisson 50/s,
   256 -> 32 tokens) — the ``memory_noc_study.py`` case.

    python validation/memory_stream_model.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402
from memory_noc_study import WEST_16, load_concurrent_streams  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.model.builder import build_graph  # noqa: E402
from npusim.scenarios.forward import simulate_forward  # noqa: E402
from npusim.serving.requests import synthetic_requests  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402
from npusim.sim import Simulator  # noqa: E402

MODELS = ("hop", "reserve")


def row(label: str, vals: dict, key: str, fmt: str = "{:,.0f}") -> str:
    h, r = vals["hop"], vals["reserve"]
    err = r[key] / h[key] - 1 if h[key] else 0.0
    return (f"{label:>34} | {fmt.format(h[key]):>14} {fmt.format(r[key]):>14} {100 * err:+7.2f}% | "
            f"{h['events']:>11,} {r['events']:>11,} {h['cpu']:7.2f} {r['cpu']:7.2f}")


def head(what: str) -> None:
    print(f"{'case':>34} | {'hop ' + what:>14} {'reserve':>14} {'error':>8} | {'hop events':>11} "
          f"{'reserve ev.':>11} {'hop cpu':>7} {'res. cpu':>7}")


def main() -> None:
    arch = load_arch("npusim-64c")
    worst = 0.0
    print("memory streams over the mesh at the path fidelity: reserve vs hop (error = reserve / hop - 1)\n")
    print("1. Concurrent streams, 4 x 256 KiB a core (analytical memory): bytes per cycle delivered")
    head("B/cycle")
    for name, cores in (("16 cores", WEST_16), ("64 cores", list(range(64)))):
        vals = {}
        for m in MODELS:
            sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams=m)
            nbytes = load_concurrent_streams(sim, cores)
            c0 = time.process_time()
            sim.run()
            vals[m] = {"bw": nbytes / sim.makespan(), "events": sim.events,
                       "cpu": time.process_time() - c0}
        worst = max(worst, abs(vals["reserve"]["bw"] / vals["hop"]["bw"] - 1))
        print(row(name, vals, "bw", "{:.1f}"), flush=True)

    print("\n2. Forward passes, Qwen3-4B on npusim-64c, TP 4 x 16 stages (2L: first 2 layers, TP 4 x 2): cycles")
    head("cycles")
    spec = spec_from_flags(tp=4, stages=16, layout="ring").model_copy(update={"data_parallel": 1})
    spec2 = spec_from_flags(tp=4, stages=2, layout="ring").model_copy(update={"data_parallel": 1})
    cases = [("decode", 1, 1, 512), ("decode", 8, 1, 1024), ("decode", 32, 1, 2048), ("prefill", 1, 512, 0)]
    for memory, layers in (("analytical", None), ("tlm", 2)):  # TLM: the first 2 layers (its DRAM events cost)
        for phase, batch, seq, kv in cases if layers is None else cases[1:2]:
            g = build_graph("qwen3-4b", phase=phase, batch=batch, seq_len=seq, kv_len=kv or None, layers=layers)
            vals = {}
            for m in MODELS:
                c0 = time.process_time()
                run = simulate_forward(g, arch, spec if layers is None else spec2, memory_mode=memory, noc_mode="path",
                                       memory_streams=m)
                vals[m] = {"cycles": run.summary["cycles"], "events": run.sim.events, "cpu": time.process_time() - c0}
            worst = max(worst, abs(vals["reserve"]["cycles"] / vals["hop"]["cycles"] - 1))
            label = f"{memory} {phase} b{batch}" + (f" kv{kv}" if kv else f" s{seq}")
            label += f" {layers}L" if layers else ""
            print(row(label, vals, "cycles"), flush=True)

    print("\n3. Serving Qwen3-4B's first 8 layers, TP 4 x 8 stages, PD fusion, 16 requests (50/s, 256 -> 32)")
    head("value")
    reqs = synthetic_requests(16, 50.0, input_len=256, output_len=32, seed=1)
    sspec = spec_from_flags(tp=4, stages=8).model_copy(update={"data_parallel": 1})
    vals = {}
    for m in MODELS:
        cfg = ServingConfig(model="qwen3-4b", layers=8, memory_streams=m,
                            scheduler=SchedulerConfig(policy="fusion", budget=512, chunk_tokens=256))
        c0 = time.process_time()
        s = simulate_serving(arch, sspec, reqs, cfg).summary
        vals[m] = {"tok/s": s["throughput_tokens_per_s"], "TTFT ms": s["ttft_ms"]["mean"],
                   "TBT ms": s["tbt_ms"]["mean"], "TBT p99 ms": s["tbt_ms"]["p99"], "events": s["events"],
                   "cpu": time.process_time() - c0}
    for key in ("tok/s", "TTFT ms", "TBT ms", "TBT p99 ms"):
        worst = max(worst, abs(vals["reserve"][key] / vals["hop"][key] - 1))
        print(row(key, vals, key, "{:.2f}"), flush=True)
    print(f"\nworst |error| of reserve vs hop: {100 * worst:.2f}%")
    print(machine_line())


if __name__ == "__main__":
    main()
