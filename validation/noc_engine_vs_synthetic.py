"""HBM reads at the flit fidelity: the engine against the flit model's own synthetic harness (issue 42 item 1).

The same traffic two ways on npusim-64c (8x8 mesh, 2 VCs x 8-flit buffers, XY routing, 64 HBM
channels at 16 edge attach routers, 4 memory lanes each):

* **engine**: ``Simulator(noc_mode="flit", memory_mode="analytical")``, the 16 cores of one 4x4
  quadrant (x 4..7, y 0..3) each read ``--bytes`` bytes (contiguous, split over the core's DMA
  engines, consecutive addresses, so spread evenly over the 64 channels); the DMAs' requests,
  the controllers' service and the data cross the cycle-accurate routers
  (:mod:`npusim.sim.mempath`, :mod:`npusim.hw.noc.flit_engine`). Bandwidth = bytes read / the
  last DMA's end (cycles) x clock; link use = flits a link carried / those cycles.
* **synthetic**: :func:`npusim.hw.noc.flit.simulate_flit` with request-reply hot-spot traffic from
  the same 16 cores to the same 16 routers (``SyntheticTraffic(reply_flits=, memory_lanes=,
  sources=)``): a one-flit request per 256 B burst (``hbm.interleave_bytes``), a reply of 4 flits
  sent from the memory lanes when the request arrives; Bernoulli requests at each offered load,
  open loop (no limit on requests in flight); bandwidth = reply flits accepted x 64 B x clock.
  Its best point over the sweep is the routers' saturation throughput on this traffic.

The engine is a closed loop (each DMA engine keeps ``cores.dma.max_outstanding`` transactions of
``transaction_bytes`` in flight, its TLM tags: on npusim-64c 32 x 64 B, 8 bursts an engine, 16 a
core); the synthetic harness is open loop and, past saturation, its throughput depends on the
offered load (430-468 GB/s over 0.12-0.16 requests a cycle, 348 at 0.20): the check is the engine
against that band. ``--tags`` runs the engine with other tag counts.

Measured (1 MiB a core; this machine, model only):

    run                                  GB/s  hottest link
    synthetic, best point (0.16)        467.9  0.90
    engine, before (whole reply streams  218.8  0.44   (-53%)
      queued at each DMA's start)
    engine, 32 tags (the arch's)        436.8  0.88   (-6.6% of the best point, in the band)
    engine, 64 tags                     443.7  0.89   (-5.2%)

Tags (``--tags 1 4 8 16 4096``): 52, 97, 189, 354 GB/s (few tags: latency bound, the memory
model's own tag loop too) and 326 with 4,096 (requests effectively unthrottled: served in arrival
order alone; the requests crowd the links towards the edge and arrive in an unfair order).

Units: GB/s (1e9 B/s); link use is a fraction of one flit a cycle.

    python validation/noc_engine_vs_synthetic.py [--bytes 1048576] [--tags 16 64]
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
from npusim.arch.derived import hbm_attach_routers  # noqa: E402
from npusim.hw.noc import NocParams, SyntheticTraffic  # noqa: E402
from npusim.hw.noc.flit import simulate_flit  # noqa: E402
from npusim.sim import Simulator  # noqa: E402

RATES = (0.08, 0.10, 0.12, 0.14, 0.16, 0.20)  # requests a source a cycle


def quadrant(arch) -> list[int]:
    w, h = arch.cores.grid.width, arch.cores.grid.height
    return [y * w + x for y in range(h // 2) for x in range(w // 2, w)]


def engine_read(arch, nbytes: int, tags: int | None = None) -> dict:
    """The quadrant's cores each read ``nbytes`` through the engine at the flit fidelity."""
    if tags is not None:
        cores = arch.cores.model_copy(update={"dma": arch.cores.dma.model_copy(update={"max_outstanding": tags})})
        arch = arch.model_copy(update={"cores": cores})
    sim = Simulator(arch, memory_mode="analytical", noc_mode="flit")
    engines = arch.cores.dma.engines
    addr = 0
    per = nbytes // engines
    for c in quadrant(arch):
        for e in range(engines):
            sim.add_dma(c, per, address=addr, dma_engine=e)
            addr += per
    t0 = time.time()
    sim.run()
    cycles = sim.makespan()
    lf = sim.link_flits() / cycles
    order = np.argsort(-lf, kind="stable")[:3]
    return dict(gbps=len(quadrant(arch)) * per * engines / cycles * arch.clock_ghz, link_max=float(lf.max()),
                hottest=[(sim.topology.link_name(int(i)), round(float(lf[i]), 2)) for i in order],
                cycles=int(cycles), wall=time.time() - t0)


def synthetic_read(arch, rates=RATES, measure: int = 10000) -> dict:
    """The same cores' request-reply traffic in the flit model's synthetic harness; its best point."""
    noc = arch.noc
    burst_flits = max(1, arch.hbm.interleave_bytes // noc.link_bytes_per_cycle)
    params = NocParams(arch.cores.grid.width, arch.cores.grid.height, vcs=noc.virtual_channels,
                       buffer_flits=noc.buffer_depth_flits, router_stages=noc.router_pipeline_cycles,
                       link_latency_cycles=noc.link_latency_cycles, routing=noc.routing)
    attach = hbm_attach_routers(arch)
    hot = tuple(sorted(set(attach.tolist())))
    lanes = int(np.bincount(attach).max())
    n = arch.cores.grid.width * arch.cores.grid.height
    best = None
    for r in rates:
        t0 = time.time()
        res = simulate_flit(params, SyntheticTraffic(
            pattern="hotspot", hotspot_nodes=hot, hotspot_fraction=1.0, rate=r, packet_flits=1,
            reply_flits=burst_flits, memory_lanes=lanes, warmup_cycles=3000, measure_cycles=measure,
            sources=tuple(quadrant(arch))))
        gbps = (res.accepted_flits_per_node_cycle * n * burst_flits / (1 + burst_flits)
                * noc.link_bytes_per_cycle * arch.clock_ghz)
        point = dict(rate=r, gbps=gbps, link_max=float(res.link_utilization.max()),
                     hottest=[(k, round(u, 2)) for k, u in res.hottest_links(3)], saturated=res.saturated,
                     wall=time.time() - t0)
        print(f"  synthetic rate {r:.3f}: {gbps:6.1f} GB/s, hottest link {point['link_max']:.2f}"
              f"{' (saturated)' if res.saturated else ''}", flush=True)
        if best is None or gbps > best["gbps"]:
            best = point
    return best


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="npusim-64c")
    ap.add_argument("--bytes", type=int, default=1 << 20, help="bytes each quadrant core reads")
    ap.add_argument("--tags", type=int, nargs="*", default=[None, 64],
                    help="DMA tags (max_outstanding) for the engine runs; none: the arch's")
    args = ap.parse_args(argv)
    arch = load_arch(args.arch)
    print(machine_line())
    print(f"{args.arch}: the 16 cores of one quadrant read {args.bytes} B each")
    syn = synthetic_read(arch)
    rows = [("synthetic (open loop, best point)", syn["gbps"], syn["link_max"], syn["hottest"], syn["wall"])]
    for t in args.tags:
        e = engine_read(arch, args.bytes, t)
        tags = t if t is not None else arch.cores.dma.max_outstanding
        rows.append((f"engine, {tags} tags/DMA engine", e["gbps"], e["link_max"], e["hottest"], e["wall"]))
    print(f"{'run':36s} {'GB/s':>7s} {'vs syn':>7s} {'link max':>8s}  hottest links")
    for name, g, lm, hot, _ in rows:
        print(f"{name:36s} {g:7.1f} {100 * (g / syn['gbps'] - 1):+6.1f}% {lm:8.2f}  {hot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
