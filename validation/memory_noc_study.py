"""HBM traffic over the mesh (issue 12 section 1): what it changes, and how the NoC fidelities agree.

1. One 1 MiB HBM read on npusim-64c from an edge core (0, an attach router), the centre (27) and
   a corner (63), alone and with other messages aimed at the core from each of its mesh
   neighbours (2 at a corner, 3 on an edge, 4 inside), 8 MiB each (2 MiB each at the flit
   fidelity, which costs one event per cycle).
   Before, a DMA went straight to the memory model: the same cycles everywhere, whatever the
   traffic (the ``analytical`` column still does that).
2. Concurrent weight-like streams: 16 cores (west 2x2 blocks) or all 64 cores each read 4 x
   256 KiB (2 DMA engines x 2 tiles); path vs flit fidelity (is the path model optimistic or
   pessimistic against the cycle-accurate routers?).
3. A memory-bound decode step on npusim-64c (Qwen3-4B, 16 sequences, KV 2,048, the `npusim run`
   default mapping), memory analytical, NoC path: latency, HBM bandwidth, bytes over the mesh
   and link utilisation next to the HBM controllers (links into and out of attach routers)
   against the rest, with and without the mesh trip.
4. Serving: the first 8 decoder layers of Qwen3-4B on npusim-64c (TP 4 x 8 stages, weights
   streamed from HBM), PD fusion, 16 requests (Poisson 50/s, prompt 256, 32 output tokens), with
   and without the mesh trip.

    python validation/memory_noc_study.py [--skip-flit]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.model.builder import build_graph  # noqa: E402
from npusim.scenarios.forward import hbm_link_ids, simulate_forward  # noqa: E402
from npusim.serving.requests import synthetic_requests  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402
from npusim.sim import Simulator  # noqa: E402

MIB = 2**20


WEST_16 = [0, 1, 8, 9, 2, 3, 10, 11, 16, 17, 24, 25, 18, 19, 26, 27]  # the 16 cores of the mesh's west half


def load_concurrent_streams(sim, cores) -> int:
    """Each core's two DMA engines read 2 x 256 KiB each at once (distinct addresses); the bytes."""
    a = 0
    for c in cores:
        for e in range(2):
            for _ in range(2):
                sim.add_dma(c, 256 * 1024, address=a, dma_engine=e)
                a += 256 * 1024
    return a


def one_dma(arch, core, noc, traffic_each):
    sim = Simulator(arch, memory_mode="tlm", noc_mode=noc)
    w = arch.cores.grid.width
    x, y = core % w, core // w
    nbrs = [(x + dx) + (y + dy) * w for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1))
            if 0 <= x + dx < w and 0 <= y + dy < arch.cores.grid.height]
    for src in nbrs if traffic_each else ():
        sim.add_send(src, core, traffic_each)
    d = sim.add_dma(core, MIB)
    sim.run(until_task=d)
    return sim.now


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-flit", action="store_true")
    args = ap.parse_args()
    t0 = time.perf_counter()
    arch = load_arch("npusim-64c")
    nocs = ("analytical", "path") + (() if args.skip_flit else ("flit",))
    print("1. One 1 MiB read (TLM memory), cycles; 'loaded': other messages aimed at the core")
    print(f"{'core':>6} " + " ".join(f"{n + ' alone':>16} {n + ' loaded':>17}" for n in nocs))
    for core in (0, 27, 63):
        row = []
        for noc in nocs:
            each = 2 * MIB if noc == "flit" else 8 * MIB
            row += [one_dma(arch, core, noc, 0), one_dma(arch, core, noc, each)]
        print(f"{core:>6} " + " ".join(f"{v:16,d}" if i % 2 == 0 else f"{v:17,d}" for i, v in enumerate(row)),
              flush=True)

    print("\n2. Concurrent streams, 4 x 256 KiB a core (analytical memory): bytes per cycle delivered")
    for name, cores in (("16 cores", WEST_16), ("64 cores", list(range(64)))):
        out = []
        for noc in nocs:
            sim = Simulator(arch, memory_mode="analytical", noc_mode=noc)
            nbytes = load_concurrent_streams(sim, cores)
            sim.run()
            out.append(f"{noc} {nbytes / sim.makespan():7.1f}")
        print(f"   {name}: " + ", ".join(out), flush=True)

    print("\n3. Memory-bound decode on npusim-64c: Qwen3-4B, 16 sequences, KV 2,048 (memory analytical, NoC path)")
    g = build_graph("qwen3-4b", phase="decode", batch=16, seq_len=1, kv_len=2048)
    stages = max(1, min(len(g.layers()), arch.num_cores // 16))
    spec = spec_from_flags(tp=16, stages=stages).model_copy(update={"data_parallel": 1})
    print(f"{'HBM path':>22} {'ms':>8} {'HBM GB/s':>9} {'HBM GB':>7} {'over NoC GB':>11} "
          f"{'util@HBM max/mean':>18} {'util other mean':>15}")
    for label, over in (("straight (before)", False), ("over the mesh", None)):
        run = simulate_forward(g, arch, spec, memory_mode="analytical", noc_mode="path", memory_over_noc=over)
        s, sim = run.summary, run.sim
        n = sim.topology.num_links
        util = sim.noc.link_flits[:n] / max(1, s["cycles"])
        at = hbm_link_ids(sim)
        other = np.setdiff1d(np.arange(n), at)
        print(f"{label:>22} {s['latency_ms']:8.2f} {s['hbm_bandwidth_gbps']:9.1f} {s['hbm_bytes'] / 1e9:7.2f} "
              f"{s['hbm_bytes_over_noc'] / 1e9:11.2f} {util[at].max():8.2f} / {util[at].mean():6.2f} "
              f"{util[other].mean():15.2f}", flush=True)

    print("\n4. Serving Qwen3-4B's first 8 layers on npusim-64c, TP 4 x 8 stages, PD fusion, 16 requests "
          "(Poisson 50/s, 256 -> 32 tokens)")
    reqs = synthetic_requests(16, 50.0, input_len=256, output_len=32, seed=1)
    sspec = spec_from_flags(tp=4, stages=8).model_copy(update={"data_parallel": 1})
    print(f"{'HBM path':>22} {'tok/s':>8} {'TTFT ms':>8} {'TPOT ms':>8} {'HBM GB':>7} {'over NoC GB':>11} {'wall s':>7}")
    for label, over in (("straight (before)", False), ("over the mesh", None)):
        w0 = time.perf_counter()
        cfg = ServingConfig(model="qwen3-4b", layers=8, memory_over_noc=over,
                            scheduler=SchedulerConfig(policy="fusion", budget=512, chunk_tokens=256))
        s = simulate_serving(arch, sspec, reqs, cfg).summary
        print(f"{label:>22} {s['throughput_tokens_per_s']:8.1f} {s['ttft_ms']['mean']:8.2f} {s['tpot_ms']['mean']:8.3f} "
              f"{s['hbm_bytes'] / 1e9:7.2f} {s['hbm_bytes_over_noc'] / 1e9:11.2f} {time.perf_counter() - w0:7.1f}",
              flush=True)
    print(f"\nwall time {time.perf_counter() - t0:.1f} s; {machine_line()}")


if __name__ == "__main__":
    main()
