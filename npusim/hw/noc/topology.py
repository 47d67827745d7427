"""NoC topologies as networkx graphs, and their conversion to flat numpy arrays (a grid's arrays
are also built directly, :func:`grid_topology`: a chip's mesh needs no graph library).

A topology is a :class:`networkx.DiGraph` whose nodes are router ids ``0..R-1`` with
integer attributes ``x`` and ``y``, and whose directed edges are unidirectional links
with these attributes:

``out_port`` / ``in_port``
    the port the link leaves its source router by and enters its sink router by
    (one of :data:`PORT_N`, :data:`PORT_E`, :data:`PORT_S`, :data:`PORT_W`);
``width_bytes``
    bytes the link moves per cycle (one flit per cycle, so this is the flit size);
``latency_cycles``
    cycles from the cycle a flit is put on the link to the cycle it is written into the
    downstream input buffer (>= 1); credits travel back with the same latency;
``dateline``
    True for the wrap-around link of a ring dimension: a packet crossing it moves to the
    upper virtual-channel class so that dimension-order routing on rings and tori is
    deadlock-free (Dally & Seitz dateline scheme).

Every router also has a local port (:data:`PORT_LOCAL`) where its core injects and
ejects packets; it is not an edge of the graph. Router id is ``y * width + x``; ``N``
points to ``y - 1`` (row 0 is the northern edge), ``E`` to ``x + 1``.

The graph attribute ``wrap = (wrap_x, wrap_y)`` says which dimensions wrap around
(routing takes the shorter way round them) and ``kind``, ``width``, ``height``
describe the builder used. Other topologies can be described the same way: any graph
with these attributes converts with :func:`to_arrays`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from npusim.errors import ConfigError

if TYPE_CHECKING:  # networkx is imported where a graph is built: a run on a grid never needs it
    import networkx as nx

PORT_LOCAL, PORT_N, PORT_E, PORT_S, PORT_W = 0, 1, 2, 3, 4
NUM_PORTS = 5
PORT_NAMES = ("L", "N", "E", "S", "W")
OPPOSITE_PORT = {PORT_N: PORT_S, PORT_S: PORT_N, PORT_E: PORT_W, PORT_W: PORT_E}
#: dimension a port moves along: 0 = x (E/W), 1 = y (N/S), -1 = local port
PORT_DIM = np.array([-1, 1, 0, 1, 0], dtype=np.int64)
_STEP = {PORT_N: (0, -1), PORT_E: (1, 0), PORT_S: (0, 1), PORT_W: (-1, 0)}


def _check_dims(width: int, height: int):
    if int(width) < 1 or int(height) < 1:
        raise ConfigError(f"topology dimensions must be >= 1, got {width}x{height}")


def _grid_links(width: int, height: int, wrap: tuple[bool, bool]) -> list[tuple[int, int, int, bool]]:
    """``(src, dst, out_port, dateline)`` of a grid's links in (source, port) order: mesh links plus,
    in dimensions that wrap, the dateline wrap links."""
    dims = (width, height)
    links = []
    for y in range(height):
        for x in range(width):
            for port, (dx, dy) in _STEP.items():
                nx_, ny_ = x + dx, y + dy
                dim = 0 if dx else 1
                crosses = not (0 <= (nx_ if dx else ny_) < dims[dim])
                if crosses and not wrap[dim]:
                    continue
                links.append((y * width + x, (ny_ % height) * width + nx_ % width, port, crosses))
    return links


def _grid_shape(width: int, height: int, wrap: tuple[bool, bool], latency_cycles: int) -> tuple[bool, bool]:
    """Check a grid's dimensions and link latency; its wrap flags as built (a dimension of 1 or 2
    routers gets no wrap link: it would duplicate the mesh link)."""
    _check_dims(width, height)
    if int(latency_cycles) < 1:
        raise ConfigError(f"link latency must be >= 1 cycle, got {latency_cycles}")
    return bool(wrap[0]) and width > 2, bool(wrap[1]) and height > 2


def _grid(kind: str, width: int, height: int, wrap: tuple[bool, bool], width_bytes: int, latency_cycles: int) -> nx.DiGraph:
    """A grid as a graph (see the module docstring)."""
    import networkx as nx

    wrap = _grid_shape(width, height, wrap, latency_cycles)
    g = nx.DiGraph(kind=kind, width=width, height=height, wrap=wrap)
    for y in range(height):
        for x in range(width):
            g.add_node(y * width + x, x=x, y=y)
    for src, dst, port, dateline in _grid_links(width, height, wrap):
        g.add_edge(src, dst, out_port=port, in_port=OPPOSITE_PORT[port], width_bytes=int(width_bytes),
                   latency_cycles=int(latency_cycles), dateline=bool(dateline))
    return g


def mesh(width: int, height: int, width_bytes: int = 64, latency_cycles: int = 1) -> nx.DiGraph:
    """A ``width x height`` 2D mesh: each router links to its N/E/S/W neighbours."""
    return _grid("mesh", width, height, (False, False), width_bytes, latency_cycles)


def torus(width: int, height: int, width_bytes: int = 64, latency_cycles: int = 1) -> nx.DiGraph:
    """A 2D torus: a mesh plus wrap-around links (dateline links) in each dimension.

    A dimension of 1 or 2 routers gets no wrap link (it would duplicate the mesh link).
    """
    return _grid("torus", width, height, (True, True), width_bytes, latency_cycles)


def ring(n: int, width_bytes: int = 64, latency_cycles: int = 1) -> nx.DiGraph:
    """A bidirectional ring of ``n`` routers laid out along x (E = clockwise)."""
    return _grid("ring", n, 1, (True, False), width_bytes, latency_cycles)


@dataclass(frozen=True)
class Topology:
    """Flat arrays describing a topology, the form the Numba kernels use.

    Per router ``r`` and port ``p`` (``P = NUM_PORTS``; -1 where a port has no link):
    ``nbr_router[r, p]`` is the router the output link leads to, ``nbr_port[r, p]`` the
    input port it enters there, ``link_id[r, p]`` the id of that output link. Per link
    ``k``: ``link_src``, ``link_dst``, ``link_src_port``, ``link_dst_port``,
    ``link_latency_cycles``, ``link_width_bytes``, ``link_dateline``. Link ids follow the
    order (source router, output port). :attr:`graph` is the topology as a graph: the one
    it was converted from, or (built directly, :func:`grid_topology`) the grid built on first use.
    """

    kind: str
    width: int
    height: int
    num_routers: int
    num_ports: int
    x: np.ndarray
    y: np.ndarray
    nbr_router: np.ndarray
    nbr_port: np.ndarray
    link_id: np.ndarray
    link_src: np.ndarray
    link_dst: np.ndarray
    link_src_port: np.ndarray
    link_dst_port: np.ndarray
    link_latency_cycles: np.ndarray
    link_width_bytes: np.ndarray
    link_dateline: np.ndarray
    wrap: tuple[bool, bool]
    source_graph: nx.DiGraph | None = None

    @property
    def graph(self) -> nx.DiGraph:
        if self.source_graph is None:  # a grid built as arrays: its links are uniform (a 1x1 grid has none)
            first = (int(self.link_width_bytes[0]), int(self.link_latency_cycles[0])) if self.num_links else (64, 1)
            object.__setattr__(self, "source_graph", _grid(self.kind, self.width, self.height, self.wrap, *first))
        return self.source_graph

    @property
    def num_links(self) -> int:
        return int(self.link_src.size)

    @property
    def has_dateline(self) -> bool:
        return bool(self.link_dateline.any())

    def link_name(self, k: int) -> str:
        """Human-readable link name, e.g. ``(3,2)->(4,2) E``."""
        s, d = int(self.link_src[k]), int(self.link_dst[k])
        port = PORT_NAMES[int(self.link_src_port[k])]
        return f"({self.x[s]},{self.y[s]})->({self.x[d]},{self.y[d]}) {port}"


def _from_links(kind: str, width: int, height: int, x: list, y: list, links, wrap, graph) -> Topology:
    """A :class:`Topology` of routers at ``x, y`` and ``links``, ``(src, dst, out_port, in_port,
    latency_cycles, width_bytes, dateline)`` each in (source, port) order, checked."""
    n = len(x)
    nbr_router = np.full((n, NUM_PORTS), -1, dtype=np.int64)
    nbr_port = np.full((n, NUM_PORTS), -1, dtype=np.int64)
    link_id = np.full((n, NUM_PORTS), -1, dtype=np.int64)
    for k, (u, v, port, in_port, lat, _, _) in enumerate(links):
        if not (1 <= port < NUM_PORTS) or nbr_router[u, port] != -1:
            raise ConfigError(f"topology link {u}->{v}: output port {port} is invalid or used twice")
        if lat < 1:
            raise ConfigError(f"topology link {u}->{v}: latency_cycles must be >= 1")
        nbr_router[u, port], nbr_port[u, port], link_id[u, port] = v, in_port, k
    cols = np.array(links, dtype=np.int64).reshape(len(links), 7)
    return Topology(
        kind=kind, width=int(width), height=int(height), num_routers=n, num_ports=NUM_PORTS,
        x=np.array(x, dtype=np.int64), y=np.array(y, dtype=np.int64),
        nbr_router=nbr_router, nbr_port=nbr_port, link_id=link_id,
        link_src=cols[:, 0].copy(), link_dst=cols[:, 1].copy(), link_src_port=cols[:, 2].copy(),
        link_dst_port=cols[:, 3].copy(), link_latency_cycles=cols[:, 4].copy(), link_width_bytes=cols[:, 5].copy(),
        link_dateline=cols[:, 6].astype(np.bool_), wrap=tuple(bool(w) for w in wrap), source_graph=graph,
    )


def grid_topology(kind: str, width: int, height: int, wrap: tuple[bool, bool] = (False, False),
                  width_bytes: int = 64, latency_cycles: int = 1) -> Topology:
    """A grid's :class:`Topology` built as arrays, without a graph (the same arrays as
    ``to_arrays`` of :func:`mesh`, :func:`torus` or :func:`ring`; networkx is not imported)."""
    wrap = _grid_shape(width, height, wrap, latency_cycles)
    links = [(u, v, port, OPPOSITE_PORT[port], int(latency_cycles), int(width_bytes), dateline)
             for u, v, port, dateline in _grid_links(width, height, wrap)]
    xs = [r % width for r in range(width * height)]
    ys = [r // width for r in range(width * height)]
    return _from_links(kind, width, height, xs, ys, links, wrap, None)


def mesh_topology(width: int, height: int, width_bytes: int = 64, latency_cycles: int = 1) -> Topology:
    """:func:`mesh` as arrays (see :func:`grid_topology`)."""
    return grid_topology("mesh", width, height, (False, False), width_bytes, latency_cycles)


def to_arrays(g: nx.DiGraph) -> Topology:
    """Turn a topology graph (see the module docstring) into :class:`Topology` arrays."""
    n = g.number_of_nodes()
    if sorted(g.nodes) != list(range(n)):
        raise ConfigError("topology graph nodes must be the router ids 0..R-1")
    edges = sorted(((u, d["out_port"], v, d) for u, v, d in g.edges(data=True)), key=lambda e: (e[0], e[1]))
    links = [(u, v, port, d["in_port"], d["latency_cycles"], d["width_bytes"], d.get("dateline", False))
             for u, port, v, d in edges]
    return _from_links(g.graph.get("kind", "custom"), int(g.graph.get("width", n)), int(g.graph.get("height", 1)),
                       [g.nodes[r]["x"] for r in range(n)], [g.nodes[r]["y"] for r in range(n)], links,
                       g.graph.get("wrap", (False, False)), g)


def parse_mesh(text: str) -> tuple[int, int]:
    """Parse ``"8x8"`` (width x height) into ``(8, 8)``; raise ConfigError otherwise."""
    parts = str(text).lower().split("x")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ConfigError(f"--mesh: expected WIDTHxHEIGHT such as 8x8, got {text!r}")
    w, h = (int(p) for p in parts)
    if w < 1 or h < 1:
        raise ConfigError(f"--mesh: width and height must be >= 1, got {text!r}")
    return w, h
