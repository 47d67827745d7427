"""Synthetic NoC experiments, independent of the model fidelity that runs them.

- :class:`NocParams`: the network (topology, VCs, buffers, pipeline, link latency).
- :class:`SyntheticTraffic`: what is offered and how it is measured.
- :func:`make_pattern`: destination patterns ``uniform``, ``transpose``, ``bitcomp``,
  ``hotspot``, ``neighbor`` as arrays the kernels draw from, plus the exact
  destination distribution (:meth:`TrafficPattern.destination_probabilities`) for
  analytical models.
- :class:`NocResult`: what every fidelity returns.

Units: ``rate`` is the offered load in flits per node per cycle; each node creates a
packet of ``packet_flits`` flits with probability ``rate / packet_flits`` per cycle
(Bernoulli process), into an unbounded source queue (bounded in the flit model by
``source_queue_packets``; overflowing it means the load is past saturation). One
generator, :func:`packet_stream`, makes the packets for every fidelity: same seed, same
packets; traffic continues during the drain until the measured packets have arrived.

Measurement (standard methodology, e.g. Dally & Towles ch. 23): ``warmup_cycles``
unmeasured, then packets created during the next ``measure_cycles`` are labelled;
traffic keeps flowing until every labelled packet has arrived (at most
``drain_cycles_max`` more cycles). Latency averages are over labelled packets
(packet latency = creation to tail ejection, source queueing included; network latency
= head injection to tail ejection); accepted throughput and link utilisation count the
flits ejected / carried during the measurement window.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from npusim.choices import TOPOLOGIES, TRAFFIC_PATTERNS
from npusim.errors import ConfigError
from npusim.hw.noc.topology import Topology, mesh, ring, torus

PATTERNS = TRAFFIC_PATTERNS
_ALIASES = {
    "bit-complement": "bitcomp", "bitcomplement": "bitcomp", "bit_complement": "bitcomp",
    "neighbour": "neighbor", "nearest-neighbor": "neighbor", "nearest-neighbour": "neighbor",
    "nearest_neighbor": "neighbor", "nn": "neighbor", "random": "uniform", "uniform-random": "uniform",
}
#: largest synthetic-traffic network (routers); above 4,096 routing is computed, not tabled
MAX_ROUTERS = 16384
# destination kinds understood by the kernels (same values as flit.DEST_*)
DEST_UNIFORM, DEST_TABLE, DEST_HOTSPOT = 0, 1, 2


def canonical_pattern(name: str) -> str:
    """Resolve aliases (``bit-complement``, ``nearest-neighbour``...) to a pattern name."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in PATTERNS:
        raise ConfigError(f"unknown traffic pattern {name!r}; known: {', '.join(PATTERNS)}")
    return key


@dataclass(frozen=True)
class TrafficPattern:
    """A destination distribution per source node, in kernel form.

    ``kind`` DEST_UNIFORM: any node (the source included, as in BookSim2);
    DEST_TABLE: uniformly one of ``cand_idx[cand_ptr[s]:cand_ptr[s+1]]``;
    DEST_HOTSPOT: with probability ``hot_fraction`` one of ``hot_nodes`` (uniformly),
    otherwise uniform.
    """

    name: str
    num_nodes: int
    kind: int
    cand_ptr: np.ndarray
    cand_idx: np.ndarray
    hot_nodes: np.ndarray
    hot_fraction: float

    def destination_probabilities(self) -> np.ndarray:
        """``prob[s, d]``: probability that a packet from ``s`` goes to ``d`` (rows sum to 1)."""
        n = self.num_nodes
        if self.kind == DEST_TABLE:
            prob = np.zeros((n, n))
            for s in range(n):
                cands = self.cand_idx[self.cand_ptr[s]:self.cand_ptr[s + 1]]
                np.add.at(prob[s], cands, 1.0 / cands.size)
            return prob
        prob = np.full((n, n), 1.0 / n)
        if self.kind == DEST_HOTSPOT:
            prob *= 1.0 - self.hot_fraction
            prob[:, self.hot_nodes] += self.hot_fraction / self.hot_nodes.size
        return prob


#: cycles per block of the packet stream; each block draws from its own generator seeded
#: with ``(seed, block)``, so the stream does not depend on how a consumer chunks it
STREAM_BLOCK_CYCLES = 1024


def packet_stream(traffic: "SyntheticTraffic", pattern: TrafficPattern, first_cycle: int, last_cycle: int):
    """The synthetic packets created in cycles ``[first_cycle, last_cycle)``: arrays
    ``(cycle, source, destination)`` in (cycle, source) order. Every node creates a packet
    with probability ``traffic.packet_probability`` per cycle (Bernoulli); destinations
    follow ``pattern``. The one generator of every fidelity (flit, path, analytical):
    the same seed gives the same packets to all of them."""
    n = pattern.num_nodes
    cycles, sources, dests = [], [], []
    b0, b1 = first_cycle // STREAM_BLOCK_CYCLES, -(-last_cycle // STREAM_BLOCK_CYCLES)
    for block in range(b0, b1):
        rng = np.random.default_rng((int(traffic.seed), block))
        hit = np.flatnonzero(rng.random(STREAM_BLOCK_CYCLES * n) < traffic.packet_probability)
        cyc = hit // n + block * STREAM_BLOCK_CYCLES
        src = hit % n
        dst = _draw_destinations(pattern, rng, src)
        keep = (cyc >= first_cycle) & (cyc < last_cycle)
        if traffic.sources is not None:  # only these nodes create packets
            keep &= np.isin(src, np.asarray(traffic.sources, np.int64))
        cycles.append(cyc[keep])
        sources.append(src[keep])
        dests.append(dst[keep])
    if not cycles:
        z = np.zeros(0, np.int64)
        return z, z, z
    return (np.concatenate(cycles).astype(np.int64), np.concatenate(sources).astype(np.int64),
            np.concatenate(dests).astype(np.int64))


def _draw_destinations(pattern: TrafficPattern, rng, src: np.ndarray) -> np.ndarray:
    n = pattern.num_nodes
    u = rng.random(src.size)
    if pattern.kind == DEST_TABLE:
        lo = pattern.cand_ptr[src]
        cnt = pattern.cand_ptr[src + 1] - lo
        return pattern.cand_idx[lo + np.minimum((u * cnt).astype(np.int64), cnt - 1)]
    uniform = np.minimum((rng.random(src.size) * n).astype(np.int64), n - 1)
    if pattern.kind == DEST_HOTSPOT:
        hot = pattern.hot_nodes
        pick = hot[np.minimum((rng.random(src.size) * hot.size).astype(np.int64), hot.size - 1)]
        return np.where(u < pattern.hot_fraction, pick, uniform)
    return uniform


def mean_hops(pattern: TrafficPattern, routing) -> float:
    """Mean hop count of a packet (sources uniform, destinations per ``pattern``) under
    ``routing``, without the dense ``R x R`` matrices (large meshes have no hop matrix)."""
    from npusim.hw.noc.routing import dimension_order_hops

    topo, n = routing.topo, pattern.num_nodes

    def pair_hops(src, dst):
        return routing.hops(src, dst) if routing.dense else dimension_order_hops(topo, src, dst)

    def uniform():
        if routing.dense:
            return float(routing.hop_matrix().mean())
        total = 0.0
        for size, wraps in ((topo.width, topo.wrap[0]), (topo.height, topo.wrap[1])):
            c = np.arange(size)
            delta = c[None, :] - c[:, None]
            dist = np.minimum(np.mod(delta, size), size - np.mod(delta, size)) if wraps else np.abs(delta)
            total += float(dist.mean())
        return total

    if pattern.kind == DEST_UNIFORM:
        return uniform()
    if pattern.kind == DEST_TABLE:
        counts = np.diff(pattern.cand_ptr)
        src = np.repeat(np.arange(n), counts)
        return float((pair_hops(src, pattern.cand_idx) / counts[src]).sum() / n)
    hot = pattern.hot_nodes
    src = np.repeat(np.arange(n), hot.size)
    to_hot = float(pair_hops(src, np.tile(hot, n)).mean())
    return (1.0 - pattern.hot_fraction) * uniform() + pattern.hot_fraction * to_hot


def _table(name: str, dests: list[list[int]]) -> TrafficPattern:
    ptr = np.zeros(len(dests) + 1, np.int64)
    ptr[1:] = np.cumsum([len(d) for d in dests])
    idx = np.asarray([d for ds in dests for d in ds], dtype=np.int64)
    return TrafficPattern(name, len(dests), DEST_TABLE, ptr, idx, np.zeros(1, np.int64), 0.0)


def make_pattern(name: str, topo: Topology, hotspot_nodes: list[int] | None = None,
                 hotspot_fraction: float = 0.2) -> TrafficPattern:
    """Build a destination pattern for ``topo``.

    ``uniform``: any node. ``transpose``: (x, y) -> (y, x) (square grids only).
    ``bitcomp``: (x, y) -> (W-1-x, H-1-y) (bit complement of the id when W and H are
    powers of two). ``hotspot``: a fraction ``hotspot_fraction`` of packets goes to
    ``hotspot_nodes`` (default: the centre router), the rest uniform.
    ``neighbor``: one of the node's direct neighbours in the topology, uniformly.
    Nodes that a permutation maps onto themselves send to themselves (through their
    router, 0 hops), as BookSim2 does.
    """
    name = canonical_pattern(name)
    n, w, h = topo.num_routers, topo.width, topo.height
    empty = np.zeros(1, np.int64)
    if name == "uniform":
        return TrafficPattern(name, n, DEST_UNIFORM, np.zeros(n + 1, np.int64), empty, empty, 0.0)
    if name == "hotspot":
        nodes = [(h // 2) * w + w // 2] if hotspot_nodes is None else list(hotspot_nodes)
        if not nodes or any(not 0 <= int(x) < n for x in nodes):
            raise ConfigError(f"hotspot nodes must be router ids in 0..{n - 1}, got {nodes}")
        if not 0.0 <= hotspot_fraction <= 1.0:
            raise ConfigError(f"hotspot fraction must be in [0, 1], got {hotspot_fraction}")
        return TrafficPattern(name, n, DEST_HOTSPOT, np.zeros(n + 1, np.int64), empty,
                              np.asarray(nodes, np.int64), float(hotspot_fraction))
    if name == "transpose":
        if w != h:
            raise ConfigError(f"transpose traffic needs a square grid, got {w}x{h}")
        return _table(name, [[int(topo.x[s]) * w + int(topo.y[s])] for s in range(n)])
    if name == "bitcomp":
        return _table(name, [[(h - 1 - int(topo.y[s])) * w + (w - 1 - int(topo.x[s]))] for s in range(n)])
    nbrs = [sorted({int(v) for v in topo.nbr_router[s, 1:] if v >= 0}) or [s] for s in range(n)]
    return _table(name, nbrs)


@dataclass(frozen=True)
class NocParams:
    """Network parameters (defaults follow the ``noc`` section of the arch schema).

    ``flit_bytes`` = link width in bytes per cycle (one flit per link per cycle);
    ``router_stages`` = router pipeline depth in cycles; ``buffer_flits`` = depth of each
    VC's input FIFO; ``routing`` one of ``xy``, ``yx``. ``booksim_compatible`` selects
    BookSim2's router and latency conventions in the flit model (see
    :mod:`npusim.hw.noc.flit`); the other fidelities do not have it.
    """

    width: int = 8
    height: int = 8
    topology: str = "mesh"
    vcs: int = 2
    buffer_flits: int = 8
    router_stages: int = 4
    link_latency_cycles: int = 1
    flit_bytes: int = 64
    routing: str = "xy"
    booksim_compatible: bool = False

    def __post_init__(self):
        if self.topology not in TOPOLOGIES:
            raise ConfigError(f"unknown topology {self.topology!r}; known: {', '.join(TOPOLOGIES)}")
        for key in ("width", "height", "vcs", "buffer_flits", "router_stages", "link_latency_cycles", "flit_bytes"):
            value = getattr(self, key)
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ConfigError(f"{key} must be a positive integer, got {value!r}")
        if self.vcs > 64:
            raise ConfigError(f"vcs must be <= 64, got {self.vcs}")
        if self.width * self.height > MAX_ROUTERS:
            raise ConfigError(f"{self.width}x{self.height} = {self.width * self.height} routers: at most {MAX_ROUTERS} "
                              f"(e.g. 128x128); a 300x300 flit run of 2,000 cycles already takes ~20 minutes")
        if self.routing not in ("xy", "yx"):
            raise ConfigError(f"routing must be 'xy' or 'yx', got {self.routing!r}")

    @classmethod
    def from_arch(cls, arch, **overrides) -> "NocParams":
        """Take the mesh size from ``arch.cores.grid`` and the rest from ``arch.noc``;
        keyword arguments that are not None override."""
        noc, grid = arch.noc, arch.cores.grid
        values = dict(width=grid.width, height=grid.height, vcs=noc.virtual_channels,
                      buffer_flits=noc.buffer_depth_flits, router_stages=noc.router_pipeline_cycles,
                      link_latency_cycles=noc.link_latency_cycles, flit_bytes=noc.link_bytes_per_cycle,
                      routing=noc.routing)
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @property
    def label(self) -> str:
        return f"{self.topology} {self.width}x{self.height}" if self.topology != "ring" else f"ring {self.width}"

    def build_graph(self):
        """The networkx graph of this topology (see :mod:`.topology`)."""
        kw = dict(width_bytes=self.flit_bytes, latency_cycles=self.link_latency_cycles)
        if self.topology == "ring":
            return ring(self.width * self.height, **kw)
        return (torus if self.topology == "torus" else mesh)(self.width, self.height, **kw)


@dataclass(frozen=True)
class SyntheticTraffic:
    """Offered traffic and measurement windows (cycles are router clock cycles).

    ``drain_cycles_max`` defaults to ``max(measure_cycles, 2000)``.

    Request-reply traffic (flit fidelity only; BookSim2's ``use_read_write`` with reads only):
    ``reply_flits > 0`` makes every packet of the stream a request (``packet_flits`` flits) whose
    arrival sends a reply of ``reply_flits`` flits back from its destination, created in the
    cycle the request's tail arrived; latency and throughput then count requests and replies
    together, as BookSim2's do. ``memory_lanes > 0`` gives every hotspot node a memory-controller
    port and as many memory injection lanes (the chip's HBM attach routers, see
    :mod:`npusim.hw.noc.flit`): requests leave there, replies enter there; 0 (and the BookSim2
    mode): they share the router's local port and NI, replies ahead of the NI's queued requests.
    ``rate`` counts the requests' flits only.

    ``sources``: only these nodes create packets (each at ``rate``; default every node); the
    accepted throughput is still per node of the whole network.
    """

    pattern: str = "uniform"
    rate: float = 0.1
    packet_flits: int = 1
    warmup_cycles: int = 1000
    measure_cycles: int = 10000
    drain_cycles_max: int | None = None
    seed: int = 1
    hotspot_nodes: tuple[int, ...] | None = None
    hotspot_fraction: float = 0.2
    source_queue_packets: int = 256
    reply_flits: int = 0
    memory_lanes: int = 0
    sources: tuple[int, ...] | None = None

    def __post_init__(self):
        object.__setattr__(self, "pattern", canonical_pattern(self.pattern))
        if not (isinstance(self.rate, (int, float)) and math.isfinite(self.rate) and 0.0 < self.rate <= 1.0):
            raise ConfigError(f"rate (offered load, flits/node/cycle) must be in (0, 1], got {self.rate!r}")
        if not isinstance(self.packet_flits, (int, np.integer)) or self.packet_flits < 1:
            raise ConfigError(f"packet_flits must be a positive integer, got {self.packet_flits!r}")
        if self.warmup_cycles < 0:
            raise ConfigError(f"warmup_cycles must be >= 0, got {self.warmup_cycles}")
        if self.measure_cycles < 1:
            raise ConfigError(f"measurement cycles must be >= 1, got {self.measure_cycles}")
        if self.drain_cycles_max is not None and self.drain_cycles_max < 0:
            raise ConfigError(f"drain_cycles_max must be >= 0, got {self.drain_cycles_max}")
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if self.sources is not None:
            object.__setattr__(self, "sources", tuple(int(x) for x in self.sources))
            if not self.sources or min(self.sources) < 0:
                raise ConfigError(f"sources must be router ids, got {self.sources}")
        for key in ("reply_flits", "memory_lanes"):
            value = getattr(self, key)
            if not isinstance(value, (int, np.integer)) or value < 0:
                raise ConfigError(f"{key} must be a non-negative integer, got {value!r}")
        if self.memory_lanes and self.pattern != "hotspot":
            raise ConfigError("memory_lanes attach memory ports at the hotspot nodes: the pattern must be hotspot")

    @property
    def drain_cycles(self) -> int:
        return max(self.measure_cycles, 2000) if self.drain_cycles_max is None else int(self.drain_cycles_max)

    @property
    def packet_probability(self) -> float:
        return self.rate / self.packet_flits


@dataclass
class NocResult:
    """What a NoC model reports for one synthetic-traffic run (cycles are NoC cycles)."""

    fidelity: str
    topology: str
    pattern: str
    packet_flits: int
    offered_flits_per_node_cycle: float
    generated_flits_per_node_cycle: float
    accepted_flits_per_node_cycle: float
    avg_packet_latency_cycles: float
    avg_network_latency_cycles: float
    max_packet_latency_cycles: float
    avg_hops: float
    zero_load_latency_cycles: float
    packets_measured: int
    packets_delivered: int
    saturated: bool
    saturation_reason: str
    cycles_simulated: int
    wall_seconds: float
    link_utilization: np.ndarray = field(repr=False)
    link_names: list[str] = field(repr=False)
    params: dict = field(default_factory=dict)

    @property
    def router_cycles_per_second(self) -> float:
        routers = self.params.get("routers", 0)
        return routers * self.cycles_simulated / self.wall_seconds if self.wall_seconds > 0 else float("nan")

    def hottest_links(self, k: int = 5) -> list[tuple[str, float]]:
        order = np.argsort(-self.link_utilization, kind="stable")[:k]
        return [(self.link_names[i], float(self.link_utilization[i])) for i in order]

    def to_dict(self) -> dict:
        d = asdict(self)
        util = d.pop("link_utilization")
        d.pop("link_names")
        d["link_utilization_max"] = float(util.max()) if util.size else 0.0
        d["link_utilization_mean"] = float(util.mean()) if util.size else 0.0
        d["hottest_links"] = [{"link": n, "utilization": round(u, 6)} for n, u in self.hottest_links()]
        d["link_utilization"] = [round(float(u), 6) for u in util]
        d["router_cycles_per_second"] = self.router_cycles_per_second
        return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}
