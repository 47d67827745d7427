"""One forward pass of a model on a chip: map it, simulate it, report where time went."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from npusim.arch.derived import hbm_attach_routers
from npusim.arch.schema import Arch
from npusim.mapping.mapper import Mapped, map_model
from npusim.mapping.spec import MappingSpec
from npusim.model.ir import Graph
from npusim.report.breakdown import time_breakdown
from npusim.sim import Simulator
from npusim.sim.mempath import DEFAULT_STREAMS


@dataclass
class ForwardRun:
    sim: Simulator
    mapped: Mapped
    graph: Graph
    summary: dict


def simulate_forward(graph: Graph, arch: Arch, spec: MappingSpec, memory_mode: str = "tlm",
                     noc_mode: str = "path", progress=None, mapped: Mapped | None = None,
                     memory_over_noc: bool | None = None, memory_streams: str = DEFAULT_STREAMS) -> ForwardRun:
    """``memory_over_noc``, ``memory_streams``: see :class:`~npusim.sim.Simulator` (default: HBM
    traffic crosses the mesh at the path and flit fidelities, at path as max-min flows)."""
    # with the TLM L2 the mapper's L2 traffic is real DMAs the cache decides (map_model, l2_addressed)
    mapped = mapped or map_model(graph, arch, spec, l2_addressed=memory_mode == "tlm" and arch.l2 is not None)
    sim = Simulator(arch, memory_mode=memory_mode, noc_mode=noc_mode, memory_over_noc=memory_over_noc,
                    memory_streams=memory_streams)
    mapped.program.submit(sim)
    sim.run(progress=progress, chunk_events=500_000)
    return ForwardRun(sim, mapped, graph, summarize_forward(sim, mapped, graph))


def hbm_link_ids(sim: Simulator) -> np.ndarray:
    """Ids of the mesh links that leave or enter a router where an HBM channel attaches."""
    routers = np.unique(hbm_attach_routers(sim.arch))
    topo = sim.topology
    return np.flatnonzero(np.isin(topo.link_src, routers) | np.isin(topo.link_dst, routers))


def _import_notes(graph: Graph) -> list[str]:
    """An ONNX graph's nodes that were not computed (imported with ``allow_unsupported``)."""
    if not (graph.meta.get("unsupported") or graph.meta.get("unknown_shapes")):
        return []
    from npusim.model.onnx_import import allowed_unsupported_notes

    return allowed_unsupported_notes(graph.meta)


def summarize_forward(sim: Simulator, mapped: Mapped, graph: Graph) -> dict:
    arch = sim.arch
    cycles = sim.makespan()
    seconds = cycles / (arch.clock_ghz * 1e9)
    bd = time_breakdown(sim)
    busy = sim.busy_cycles()
    units = sim.units
    hbm_bytes = int(sim.mem.ch_bytes.sum())
    n_links = sim.topology.num_links
    link_util = sim.link_flits() / cycles if cycles else np.zeros(n_links)
    hbm_links = hbm_link_ids(sim)
    partitions: dict[str, int] = {}
    for p in mapped.decisions.values():
        partitions[p] = partitions.get(p, 0) + 1
    tokens = graph.batch * (graph.seq_len if graph.phase == "prefill" else 1)
    return {
        "model": graph.name, "phase": graph.phase, "batch": graph.batch, "seq_len": graph.seq_len,
        "kv_len": graph.kv_len, "arch": arch.name, "memory_fidelity": sim.memory_mode, "noc_fidelity": sim.noc_mode,
        "memory_streams": sim.memory_streams,
        "cycles": cycles,
        "latency_ms": seconds * 1e3,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds if seconds else 0.0,
        "flops": graph.flops,
        "tflops_achieved": graph.flops / seconds / 1e12 if seconds else 0.0,
        "breakdown_ms": {k: v / (arch.clock_ghz * 1e6) for k, v in bd["cycles"].items()},
        "breakdown_fraction": bd["fraction"],
        "cores_used": bd["cores_used"],
        "core_utilization": {u: float(busy[:, j].sum() / (bd["cores_used"] * cycles)) if cycles and bd["cores_used"]
                             else 0.0 for j, u in enumerate(units)},
        "hbm_bytes": hbm_bytes,
        "hbm_bytes_over_noc": sim.hbm_bytes_over_noc,
        "hbm_bandwidth_gbps": hbm_bytes / seconds / 1e9 if seconds else 0.0,
        # compute cycles lost to the SRAM ports (summed over tasks; 0 at the analytical memory fidelity)
        "sram_stall_cycles": sim.sram_stall_cycles,
        "sram_dma_stall_cycles": sim.sram_dma_stall_cycles,
        "noc_link_utilization_max": float(link_util.max()) if n_links else 0.0,
        "noc_link_utilization_mean": float(link_util.mean()) if n_links else 0.0,
        # the mesh links into and out of the routers the HBM channels attach to
        "noc_link_utilization_at_hbm_max": float(link_util[hbm_links].max()) if hbm_links.size else 0.0,
        "noc_link_utilization_at_hbm_mean": float(link_util[hbm_links].mean()) if hbm_links.size else 0.0,
        "mapping": {
            "tp": mapped.groups[0].cores.__len__(), "stages": mapped.stages, "replicas": mapped.replicas,
            "microbatches": mapped.microbatches, "stage_layers": mapped.stage_layers,
            "layout_first_group": list(mapped.groups[0].cores), "weights_resident": mapped.weights_resident,
            "weight_mb_per_core": mapped.weight_bytes_per_core / 2**20, "kv_cache_in_hbm": mapped.kv_in_hbm,
            "resident_weight_mb_per_core": mapped.resident_weight_bytes_per_core / 2**20,
            "partitions": partitions, "notes": [*mapped.notes, *_import_notes(graph)],
        },
        "tasks": sim.engine.num_tasks, "events": sim.events,
    }
