"""Figures derived from a system description: what ``npusim info SYSTEM`` prints.

* peak TFLOPS and HBM: the die's arch summary times the dies;
* per-NPU fabric bandwidth: per fabric, the capacity of the links leaving one NPU's dies
  (the package link between its own dies excluded), per direction;
* bisection bandwidth: per fabric, the maximum flow (networkx) from the dies of the first half
  of the nodes to those of the second half, per direction — the split the presets' symmetric
  topologies make worst (for one node: the first half of its NPUs against the rest).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import networkx as nx

from npusim.arch import summarize
from npusim.system.load import LoadedSystem
from npusim.system.topology import DIE_LINK_FABRIC


@dataclass(frozen=True)
class SystemSummary:
    name: str
    description: str
    nodes: int
    npus: int
    dies_per_npu: int
    dies: int
    cpus: int
    chip: str
    peak_tflops: dict[str, float]
    peak_tflops_per_npu: dict[str, float]
    hbm_gb: float
    hbm_gb_per_npu: float
    hbm_bandwidth_gbps_per_npu: float
    fabrics: dict[str, dict]
    die_link_gbps: float | None
    cpu_dram_gb: float

    def to_dict(self) -> dict:
        return asdict(self)


def _bisection_gbps(loaded: LoadedSystem, fabric: str) -> float:
    topo, s = loaded.topology, loaded.system
    g = nx.DiGraph()
    for link in range(topo.num_links):
        if topo.link_fabric[link] in (fabric, DIE_LINK_FABRIC):
            a, b = int(topo.link_src[link]), int(topo.link_dst[link])
            g.add_edge(a, b, capacity=float(topo.link_cap[link]) * 1000)
    dies = [topo.index[d] for d in topo.die_names]
    if s.nodes > 1:
        half = s.nodes // 2 * s.npus_per_node * s.npu.dies
    else:
        half = s.npus_per_node // 2 * s.npu.dies
    left, right = dies[:half], dies[half:]
    if not left or not right:
        return 0.0
    for d in left:
        g.add_edge("source", d, capacity=float("inf"))
    for d in right:
        g.add_edge(d, "sink", capacity=float("inf"))
    if "source" not in g or "sink" not in g or not nx.has_path(g, "source", "sink"):
        return 0.0
    return float(nx.maximum_flow_value(g, "source", "sink"))


def summarize_system(loaded: LoadedSystem) -> SystemSummary:
    s, topo = loaded.system, loaded.topology
    chip = summarize(loaded.chip)
    dies_per_npu = s.npu.dies
    npu0 = {topo.index[f"npu0.die{d}"] for d in range(dies_per_npu)}
    fabrics = {}
    for name, fab in s.fabrics.items():
        out = sum(float(topo.link_cap[link]) * 1000 for link in range(topo.num_links)
                  if topo.link_fabric[link] == name and int(topo.link_src[link]) in npu0)
        fabrics[name] = {
            "description": fab.description,
            "per_npu_gbps": out,
            "per_die_gbps": out / dies_per_npu,
            "bisection_gbps": _bisection_gbps(loaded, name),
            "switches": {sw.name: {"per": sw.per, "chips": sw.chips, "latency_ns": sw.latency_ns} for sw in fab.switches},
        }
    return SystemSummary(
        name=s.name, description=s.description, nodes=s.nodes, npus=s.num_npus, dies_per_npu=dies_per_npu,
        dies=s.num_dies, cpus=s.num_cpus, chip=loaded.chip.name,
        peak_tflops={k: v * s.num_dies for k, v in chip.peak_tflops.items()},
        peak_tflops_per_npu={k: v * dies_per_npu for k, v in chip.peak_tflops.items()},
        hbm_gb=chip.hbm_gb * s.num_dies, hbm_gb_per_npu=chip.hbm_gb * dies_per_npu,
        hbm_bandwidth_gbps_per_npu=chip.hbm_bandwidth_gbps * dies_per_npu, fabrics=fabrics,
        die_link_gbps=s.npu.die_link.bandwidth_gbps if s.npu.die_link else None,
        cpu_dram_gb=s.cpu.dram_gb * s.num_cpus,
    )
