"""A system's fabrics as a networkx graph, flattened to arrays for the flow and packet kernels.

Vertices are endpoints (``npu3.die1``, ``cpu5``) and switches (``node2.l1`` for a per-node
switch, ``l2`` for a system-wide one). Every link of the schema becomes two *directed links*
(one per direction), each with its own capacity (bytes per picosecond = GB/s / 1000) and
latency. The on-package die-to-die link belongs to every fabric (it is the same wire whatever
plane a transfer uses).

Routing: a transfer between two endpoints uses the first fabric (in the file's order) that
connects them, unless a fabric is named; on it, a shortest path in hops (networkx BFS, whose
tie-break follows the graph's insertion order, so it is deterministic). Path latency is the sum
of its links' latencies plus the latency of every switch it passes through.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property

import networkx as nx
import numpy as np

from npusim.errors import ConfigError
from npusim.system.schema import System

_ENDPOINT = re.compile(r"^(?:npu(\d+)(?:\.die(\d+))?|cpu(\d+))$")
DIE_LINK_FABRIC = "package"


@dataclass
class Topology:
    """Vertices, directed links and routes of a system's fabrics (see module docstring)."""

    system: System
    names: list[str]
    index: dict[str, int]
    vertex_kind: list[str]  # "die", "cpu" or the switch's name
    vertex_latency_ps: np.ndarray
    link_src: np.ndarray
    link_dst: np.ndarray
    link_cap: np.ndarray  # bytes per picosecond, per direction
    link_lat_ps: np.ndarray
    link_fabric: list[str]  # fabric name, or "package" for die-to-die links
    link_members: np.ndarray  # parallel physical links in the bundle
    graphs: dict[str, nx.Graph]  # per fabric: undirected, edge attribute "links" = (a->b id, b->a id)
    aiv_link: dict[int, int]  # die vertex -> its virtual AIV-direct issue link (when aiv_max_gbps is set)
    _routes: dict = field(default_factory=dict, repr=False)
    #: SystemSim's routes, (fabric, src, dst, aiv) -> (fabric, vertices, link ids, latency ps): a memo
    #: shared by every simulator of this topology (a plan search builds one per step point)
    sim_routes: dict = field(default_factory=dict, repr=False)

    @property
    def num_links(self) -> int:
        return int(self.link_src.shape[0])

    @cached_property
    def die_names(self) -> list[str]:
        s = self.system
        return [f"npu{n}.die{d}" for n in range(s.num_npus) for d in range(s.npu.dies)]

    def endpoint(self, name: str) -> int:
        """Vertex id of an endpoint name (``npu8.die1``, ``npu8`` = its die 0, ``cpu4``)."""
        m = _ENDPOINT.match(str(name).strip())
        s = self.system
        if not m:
            raise ConfigError(f"endpoint '{name}': expected npuN.dieD, npuN or cpuN")
        if m.group(3) is not None:
            if int(m.group(3)) >= s.num_cpus:
                raise ConfigError(f"endpoint '{name}': {s.name} has {s.num_cpus} CPUs (cpu0..cpu{s.num_cpus - 1})")
            return self.index[f"cpu{int(m.group(3))}"]
        npu, die = int(m.group(1)), int(m.group(2) or 0)
        if npu >= s.num_npus:
            raise ConfigError(f"endpoint '{name}': {s.name} has {s.num_npus} NPUs (npu0..npu{s.num_npus - 1})")
        if die >= s.npu.dies:
            raise ConfigError(f"endpoint '{name}': an NPU of {s.name} has {s.npu.dies} die(s)")
        return self.index[f"npu{npu}.die{die}"]

    def node_of(self, vertex: int) -> int:
        """The node an endpoint sits in (NPUs 8k..8k+7 and CPUs 4k..4k+3 in node k for the presets)."""
        name = self.names[vertex]
        s = self.system
        m = _ENDPOINT.match(name)
        if m is None:
            raise ValueError(f"{name} is not an endpoint")
        if m.group(3) is not None:
            return int(m.group(3)) // s.cpus_per_node
        return int(m.group(1)) // s.npus_per_node

    def fabric_between(self, src: int, dst: int, fabric: str | None = None) -> str:
        """The fabric a transfer from ``src`` to ``dst`` uses (the named one must connect them)."""
        if fabric is not None:
            if fabric not in self.graphs:
                raise ConfigError(f"fabric '{fabric}': {self.system.name} has {', '.join(self.graphs)}")
            if dst not in self._tree(fabric, src):
                raise ConfigError(f"fabric '{fabric}' does not connect {self.names[src]} and {self.names[dst]}")
            return fabric
        for name in self.graphs:
            if dst in self._tree(name, src):
                return name
        raise ConfigError(f"no fabric of {self.system.name} connects {self.names[src]} and {self.names[dst]}")

    def _tree(self, fabric: str, src: int) -> dict:
        """Shortest paths from ``src`` to every vertex of ``fabric`` (BFS, cached per source)."""
        key = (fabric, src)
        tree = self._routes.get(key)
        if tree is None:
            g = self.graphs[fabric]
            tree = nx.single_source_shortest_path(g, src) if src in g else {}
            self._routes[key] = tree
        return tree

    @cached_property
    def _edge_link(self) -> dict[str, dict[tuple[int, int], int]]:
        """Per fabric: (vertex, next vertex) -> directed link id."""
        out = {}
        for name, g in self.graphs.items():
            table = {}
            for a, b, ids in g.edges(data="links"):
                for link in ids:
                    table[(int(self.link_src[link]), int(self.link_dst[link]))] = link
            out[name] = table
        return out

    def route(self, src: int, dst: int, fabric: str | None = None) -> tuple[str, list[int], list[int]]:
        """``(fabric, vertices, directed link ids)`` of the path from ``src`` to ``dst``."""
        if src == dst:
            return (fabric or next(iter(self.graphs)), [src], [])
        fab = self.fabric_between(src, dst, fabric)
        vertices = self._tree(fab, src)[dst]
        edge = self._edge_link[fab]
        return fab, vertices, [edge[(a, b)] for a, b in zip(vertices, vertices[1:])]


def build_topology(system: System) -> Topology:
    """Expand the schema's link templates into vertices and directed links (see module docstring)."""
    s = system
    _check_protocols(s)
    names: list[str] = []
    kinds: list[str] = []
    lat: list[float] = []

    def add_vertex(name: str, kind: str, latency_ns: float = 0.0) -> int:
        names.append(name)
        kinds.append(kind)
        lat.append(latency_ns)
        return len(names) - 1

    dies_of_node = [[add_vertex(f"npu{n}.die{d}", "die") for n in range(k * s.npus_per_node, (k + 1) * s.npus_per_node)
                     for d in range(s.npu.dies)] for k in range(s.nodes)]
    cpus_of_node = [[add_vertex(f"cpu{c}", "cpu") for c in range(k * s.cpus_per_node, (k + 1) * s.cpus_per_node)]
                    for k in range(s.nodes)]
    src, dst, cap, llat, lfab, members = [], [], [], [], [], []
    graphs: dict[str, nx.Graph] = {}

    def add_link(g: nx.Graph | None, a: int, b: int, gbps: float, latency_ns: float, fabric: str, count: int):
        ids = []
        for u, v in ((a, b), (b, a)):
            src.append(u)
            dst.append(v)
            cap.append(gbps / 1000.0)
            llat.append(latency_ns)
            lfab.append(fabric)
            members.append(count)
            ids.append(len(src) - 1)
        if g is not None:
            g.add_edge(a, b, links=tuple(ids))
        return ids

    package_edges = []
    if s.npu.dies > 1:
        for n in range(s.num_npus):
            first = n * s.npu.dies
            for d in range(1, s.npu.dies):
                a, b = first, first + d  # die vertices were added first, in order
                package_edges.append((a, b, add_link(None, a, b, s.npu.die_link.bandwidth_gbps,
                                                     s.npu.die_link.latency_ns, DIE_LINK_FABRIC, 1)))
    for fname, fab in s.fabrics.items():
        g = nx.Graph()
        switches = {sw.name: sw for sw in fab.switches}
        inst: dict[str, list[int]] = {}
        for sw in fab.switches:
            if sw.per == "node":
                inst[sw.name] = [add_vertex(f"node{k}.{sw.name}", sw.name, sw.latency_ns) for k in range(s.nodes)]
            else:
                inst[sw.name] = [add_vertex(sw.name, sw.name, sw.latency_ns)]
        for a, b, ids in package_edges:
            g.add_edge(a, b, links=tuple(ids))
        for link in fab.links:
            x, y = link.between
            gbps = link.count * link.bandwidth_gbps
            if x in ("die", "cpu") and y in ("die", "cpu"):
                if x != y:
                    for k in range(s.nodes):
                        for a in (dies_of_node[k] if x == "die" else cpus_of_node[k]):
                            for b in (dies_of_node[k] if y == "die" else cpus_of_node[k]):
                                add_link(g, a, b, gbps, link.latency_ns, fname, link.count)
                else:
                    for k in range(s.nodes):
                        group = dies_of_node[k] if x == "die" else cpus_of_node[k]
                        for i, a in enumerate(group):
                            for b in group[i + 1:]:
                                if not g.has_edge(a, b):  # dies of one package already have their link
                                    add_link(g, a, b, gbps, link.latency_ns, fname, link.count)
                continue
            if x in switches and y in ("die", "cpu"):
                x, y = y, x
            for k in range(s.nodes):
                if x in ("die", "cpu"):
                    ends_a = dies_of_node[k] if x == "die" else cpus_of_node[k]
                else:
                    if switches[x].per == "system" and k > 0 and switches[y].per == "system":
                        continue
                    ends_a = [inst[x][k if switches[x].per == "node" else 0]]
                b = inst[y][k if switches[y].per == "node" else 0]
                for a in ends_a:
                    add_link(g, a, b, gbps, link.latency_ns, fname, link.count)
        graphs[fname] = g
    aiv_link = {}
    if s.initiator.aiv_max_gbps:  # a die's AIV-direct issue limit: a virtual link from the die to itself
        for group in dies_of_node:
            for die in group:
                aiv_link[die] = add_link(None, die, die, s.initiator.aiv_max_gbps, 0.0, "aiv", 1)[0]
                src.pop(), dst.pop(), cap.pop(), llat.pop(), lfab.pop(), members.pop()  # one direction only
    topo = Topology(
        system=s, names=names, index={n: i for i, n in enumerate(names)}, vertex_kind=kinds,
        vertex_latency_ps=np.round(np.asarray(lat) * 1000).astype(np.int64),
        link_src=np.asarray(src, np.int64), link_dst=np.asarray(dst, np.int64),
        link_cap=np.asarray(cap, np.float64), link_lat_ps=np.round(np.asarray(llat) * 1000).astype(np.int64),
        link_fabric=lfab, link_members=np.asarray(members, np.int64), graphs=graphs, aiv_link=aiv_link,
    )
    _check_connected(topo, dies_of_node, cpus_of_node)
    _check_ports(topo)
    return topo


def _check_connected(topo: Topology, dies_of_node, cpus_of_node) -> None:
    """Every pair of endpoints must be joined by at least one fabric (a transfer uses one fabric)."""
    endpoints = [i for group in (*dies_of_node, *cpus_of_node) for i in group]
    comp_of: list[dict[int, int]] = []
    members: list[list[frozenset]] = []
    for g in topo.graphs.values():
        comps = [frozenset(c) for c in nx.connected_components(g)]
        comp_of.append({v: k for k, c in enumerate(comps) for v in c})
        members.append(comps)
    everyone = set(endpoints)
    checked: set[tuple] = set()
    for e in endpoints:
        key = tuple(c.get(e, -1) for c in comp_of)
        if key in checked:
            continue
        checked.add(key)
        reach = set().union(*(members[f][k] for f, k in enumerate(key) if k >= 0))
        missing = everyone - reach
        if missing:
            raise ConfigError(f"system '{topo.system.name}': the fabric graph is disconnected: no single fabric joins "
                              f"{topo.names[e]} and {topo.names[min(missing)]} ({len(missing)} endpoints unreachable "
                              f"from {topo.names[e]})")


def _check_ports(topo: Topology) -> None:
    """A switch with ``ports_per_chip`` must have enough ports for the links attached to it."""
    for fname, fab in topo.system.fabrics.items():
        for sw in fab.switches:
            if sw.ports_per_chip is None:
                continue
            ports = sw.chips * sw.ports_per_chip
            for v, kind in enumerate(topo.vertex_kind):
                if kind != sw.name:
                    continue
                attached = int(sum(topo.link_members[i] for i in np.flatnonzero(topo.link_src == v)
                                   if topo.link_fabric[i] == fname))
                if attached > ports:
                    raise ConfigError(f"system '{topo.system.name}': switch {topo.names[v]} ({fname}) has {sw.chips} chips x "
                                      f"{sw.ports_per_chip} ports = {ports} ports, but {attached} links attach to it "
                                      f"(fewer nodes, or more switch chips)")


def _check_protocols(system: System) -> None:
    """Every endpoint kind a fabric links must have its read/write protocol figures."""
    for fname, fab in system.fabrics.items():
        kinds = {end for link in fab.links for end in link.between if end in ("die", "cpu")}
        p = fab.protocol
        for kind in sorted(kinds):
            for table in ("read_efficiency", "write_efficiency", "read_overhead_ns", "write_overhead_ns"):
                if kind not in getattr(p, table):
                    raise ConfigError(f"system.fabrics.{fname}.protocol.{table}: no figure for '{kind}', which this "
                                      f"fabric links")
