"""Upper bounds on the HBM bandwidth the mesh can deliver to a set of cores (issue 42 item 1).

Two bounds, both in GB/s, on a chip's mesh (``arch.noc.link_bytes_per_cycle`` x ``arch.clock_ghz``
per directed link) between the routers where the HBM channels attach
(:func:`npusim.arch.derived.hbm_attach_routers`) and the cores that read:

* :func:`memory_max_flow_gbps` -- routing-oblivious: the maximum flow (networkx) from a super
  source (each attach router fed its channels' bandwidth) through the mesh's directed links to
  the reading cores (each one's ejection port, one link's width). No routing, packetisation or
  arbitration can deliver more.
* :func:`memory_xy_bound_gbps` -- the pattern's own traffic under the arch's routing function:
  each group of cores (a pipeline stage; the groups run one after the other) reads its cores'
  bytes evenly from every channel, and takes at least its busiest directed link's bytes / link
  bandwidth (and each channel's share / its bandwidth). Tighter than the max flow for a given
  pattern; assumes the bytes spread evenly over the channels (interleaving) and counts only the
  data (reads' responses), not the request flits.
"""

from __future__ import annotations

import numpy as np

from npusim.arch.derived import channel_bandwidths_gbps, hbm_attach_routers


def memory_max_flow_gbps(arch, sinks) -> float:
    """networkx maximum flow from the HBM channels (a super source: each attach router gets its
    channels' bandwidth) through the mesh's directed links (link width x clock) to ``sinks`` (each
    core's ejection port, one link's width), GB/s; routing-oblivious."""
    import networkx as nx

    from npusim.hw.noc.topology import mesh

    link = arch.noc.link_bytes_per_cycle * arch.clock_ghz
    g = nx.DiGraph()
    g.add_edges_from(mesh(arch.cores.grid.width, arch.cores.grid.height).edges, capacity=link)
    bw = channel_bandwidths_gbps(arch)
    for ch, r in enumerate(hbm_attach_routers(arch)):
        cap = g.edges["src", int(r)]["capacity"] + bw[ch] if g.has_edge("src", int(r)) else bw[ch]
        g.add_edge("src", int(r), capacity=cap)
    for c in sinks:
        g.add_edge(int(c), "sink", capacity=link)
    return float(nx.maximum_flow_value(g, "src", "sink"))


def memory_xy_bound_gbps(arch, per_core, groups) -> float:
    """HBM GB/s a pattern can reach at most under the arch's routing: ``per_core[c]`` bytes read by
    core ``c``; ``groups``: lists of cores that read at once, one group after the other (each
    group takes at least its busiest directed link's bytes / link bandwidth, and each channel's
    bytes / its bandwidth)."""
    from npusim.hw.noc import build_routing, route
    from npusim.hw.noc.topology import mesh_topology

    topo = mesh_topology(arch.cores.grid.width, arch.cores.grid.height, arch.noc.link_bytes_per_cycle,
                         arch.noc.link_latency_cycles)
    routing = build_routing(topo, arch.noc.routing)
    attach = hbm_attach_routers(arch)
    bw = channel_bandwidths_gbps(arch)
    link = arch.noc.link_bytes_per_cycle * arch.clock_ghz
    per_core = np.asarray(per_core, dtype=float)
    seconds = 0.0
    for cores in groups:
        cores = list(cores)
        load = np.zeros(topo.num_links)
        for c in cores:
            for r in attach:  # each channel sends 1/channels of the core's bytes
                for lk in route(int(r), int(c), routing):
                    load[lk] += per_core[c] / attach.size
        group_bytes = per_core[cores].sum()
        seconds += max(load.max() / (link * 1e9), (group_bytes / attach.size / (bw.min() * 1e9)))
    return per_core.sum() / seconds / 1e9 if seconds else 0.0


__all__ = ["memory_max_flow_gbps", "memory_xy_bound_gbps"]
