"""Deterministic routing as a table ``next_port[router, dest]`` built in Python.

The flit-level kernel (and the path-level and analytical models) only ever look a
route up in the table, so a new routing algorithm is a new function
``table(topo) -> int64[R, R]`` registered in :data:`ROUTING_FUNCTIONS`. Entry
``next_port[r, d]`` is the output port (see :mod:`npusim.hw.noc.topology`) a packet at
router ``r`` bound for ``d`` leaves by; ``next_port[d, d] == PORT_LOCAL`` (eject).

Built in: dimension-order routing ``xy`` (all of x first, then y; the default) and
``yx``. Above :data:`DENSE_ROUTING_MAX_ROUTERS` routers a dense table (and the dense hop
matrix) would not fit in memory (a 300x300 mesh: 8.1 GB of int8, 65 GB of hops), so
the routing is *computed* from router coordinates instead (:meth:`Routing.port`, and
in the flit kernel from the parameters of :meth:`Routing.kernel_arrays`); only the flit
model runs such networks. In a dimension that wraps (ring, torus) the shorter way round is taken, ties
going the positive way (E, S). Dimension-order routing is deadlock-free on a mesh with
any number of virtual channels and, with the dateline VC classes the flit model uses,
on rings and tori.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npusim.errors import ConfigError
from npusim.hw.noc.topology import PORT_E, PORT_LOCAL, PORT_N, PORT_S, PORT_W, Topology


def _dim_ports(delta: np.ndarray, size: int, wraps: bool, pos_port: int, neg_port: int) -> np.ndarray:
    """Port to move along one dimension given the signed offset ``delta = dest - here``."""
    if wraps:
        forward = np.mod(delta, size)
        positive = forward <= size - forward
    else:
        positive = delta > 0
    return np.where(positive, pos_port, neg_port)


def dimension_order_table(topo: Topology, order: str = "xy") -> np.ndarray:
    """``next_port[r, d]`` for dimension-order routing, ``order`` ``"xy"`` or ``"yx"``."""
    if order not in ("xy", "yx"):
        raise ConfigError(f"routing: expected 'xy' or 'yx', got {order!r}")
    dx = topo.x[None, :] - topo.x[:, None]
    dy = topo.y[None, :] - topo.y[:, None]
    port_x = _dim_ports(dx, topo.width, topo.wrap[0], PORT_E, PORT_W)
    port_y = _dim_ports(dy, topo.height, topo.wrap[1], PORT_S, PORT_N)
    if order == "xy":
        table = np.where(dx != 0, port_x, np.where(dy != 0, port_y, PORT_LOCAL))
    else:
        table = np.where(dy != 0, port_y, np.where(dx != 0, port_x, PORT_LOCAL))
    return table.astype(np.int64)


#: largest network routed with a dense ``next_port[R, R]`` table (16 MiB of int8)
DENSE_ROUTING_MAX_ROUTERS = 4096

ROUTING_FUNCTIONS = {
    "xy": lambda topo: dimension_order_table(topo, "xy"),
    "yx": lambda topo: dimension_order_table(topo, "yx"),
}


@dataclass(frozen=True)
class Routing:
    """A routing bound to its topology, with path and hop-count helpers: a dense table
    ``next_port[R, R]``, or (``next_port is None``, large networks) dimension-order
    routing computed from coordinates."""

    name: str
    topo: Topology
    next_port: np.ndarray | None
    _hops: list = field(default_factory=list, repr=False, compare=False)

    @property
    def dense(self) -> bool:
        return self.next_port is not None

    def port(self, r: int, d: int) -> int:
        """Output port a packet at router ``r`` bound for ``d`` leaves by."""
        if self.dense:
            return int(self.next_port[r, d])
        return int(_computed_ports(self.topo, self.name, np.asarray([r]), np.asarray([d]))[0])

    def route(self, src: int, dst: int) -> list[int]:
        """Link ids a packet from ``src`` to ``dst`` traverses, in order (empty if src == dst)."""
        return route(src, dst, self)

    def hops(self, src, dst):
        """Links between ``src`` and ``dst`` on this routing's path (arrays broadcast)."""
        if self.dense:
            h = self.hop_matrix()[src, dst]
        else:
            h = dimension_order_hops(self.topo, np.asarray(src), np.asarray(dst))
        return int(h) if np.ndim(h) == 0 else h

    def hop_matrix(self) -> np.ndarray:
        """``hops[s, d]`` for every pair (computed once, vectorised over all pairs)."""
        if not self.dense:
            raise ConfigError(f"{self.topo.num_routers} routers: more than {DENSE_ROUTING_MAX_ROUTERS}, so no dense "
                              f"routing table or hop matrix; the path and analytical NoC models need one "
                              f"(the flit model, npusim noc --fidelity flit, routes larger networks)")
        if not self._hops:
            self._hops.append(_hop_matrix(self.topo, self.next_port))
        return self._hops[0]

    def kernel_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(next_port int8[R, R] or a 1x1 placeholder, rt int64[6])`` for the flit kernel:
        ``rt = [computed, width, height, wrap_x, wrap_y, yx]`` (see ``flit_kernel._route``)."""
        t = self.topo
        rt = np.array([0 if self.dense else 1, t.width, t.height, int(t.wrap[0]), int(t.wrap[1]),
                       int(self.name == "yx")], np.int64)
        table = self.next_port.astype(np.int8) if self.dense else np.zeros((1, 1), np.int8)
        return table, rt


def _dim_dist(delta: np.ndarray, size: int, wraps: bool) -> np.ndarray:
    if wraps:
        forward = np.mod(delta, size)
        return np.minimum(forward, size - forward)
    return np.abs(delta)


def grid_hops(a, b, width: int):
    """Hops of the dimension-order route between cores ``a`` and ``b`` (ids ``y * width + x``)
    of a mesh: the one home of this count (mapping layouts, collectives)."""
    a, b = np.asarray(a), np.asarray(b)
    return np.abs(a % width - b % width) + np.abs(a // width - b // width)


def dimension_order_hops(topo: Topology, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Hop counts of dimension-order routes (either order) between router ids, by coordinates."""
    dx = topo.x[dst] - topo.x[src]
    dy = topo.y[dst] - topo.y[src]
    return _dim_dist(dx, topo.width, topo.wrap[0]) + _dim_dist(dy, topo.height, topo.wrap[1])


def _computed_ports(topo: Topology, name: str, r: np.ndarray, d: np.ndarray) -> np.ndarray:
    dx = topo.x[d] - topo.x[r]
    dy = topo.y[d] - topo.y[r]
    port_x = _dim_ports(dx, topo.width, topo.wrap[0], PORT_E, PORT_W)
    port_y = _dim_ports(dy, topo.height, topo.wrap[1], PORT_S, PORT_N)
    if name == "xy":
        return np.where(dx != 0, port_x, np.where(dy != 0, port_y, PORT_LOCAL))
    return np.where(dy != 0, port_y, np.where(dx != 0, port_x, PORT_LOCAL))


def build_routing(topo: Topology, name: str = "xy") -> Routing:
    """Build the named routing for ``topo``; checks every route reaches its destination."""
    if name not in ROUTING_FUNCTIONS:
        raise ConfigError(f"routing: unknown routing {name!r}; known: {', '.join(ROUTING_FUNCTIONS)}")
    if topo.num_routers > DENSE_ROUTING_MAX_ROUTERS:
        # dimension order from coordinates: correct by construction on a mesh, torus or ring
        return Routing(name=name, topo=topo, next_port=None)
    table = ROUTING_FUNCTIONS[name](topo)
    n = topo.num_routers
    off = table != PORT_LOCAL
    rows = np.nonzero(off)[0]
    if np.any(topo.nbr_router[rows, table[off]] < 0):
        raise ConfigError(f"routing {name!r} uses a port that has no link in the {topo.kind} topology")
    if np.any(table[np.arange(n), np.arange(n)] != PORT_LOCAL) or np.any(~off & ~np.eye(n, dtype=bool)):
        raise ConfigError(f"routing {name!r}: only a packet at its destination may take the local port")
    routing = Routing(name=name, topo=topo, next_port=table)
    routing.hop_matrix()  # raises on routing loops
    return routing


def _hop_matrix(topo: Topology, table: np.ndarray) -> np.ndarray:
    """Hop counts by pointer doubling over ``nxt[r, d]`` (next router towards ``d``):
    after round ``i`` each entry has advanced ``2**i`` hops (stopping at ``d``)."""
    n = topo.num_routers
    dst = np.arange(n)[None, :]
    here = np.arange(n)[:, None]
    at_dest = here == dst
    nxt = np.where(at_dest, here, topo.nbr_router[here, table])
    dist = (~at_dest).astype(np.int64)
    for _ in range(max(1, int(np.ceil(np.log2(n))) + 1)):
        dist = dist + dist[nxt, dst]
        nxt = nxt[nxt, dst]
    if np.any(nxt != dst):
        raise ConfigError("routing table has a loop: some packets never reach their destination")
    return dist


def route(src: int, dst: int, routing: Routing) -> list[int]:
    """Link ids from ``src`` to ``dst`` under ``routing`` (the path-level model's input)."""
    topo = routing.topo
    links, r = [], int(src)
    for _ in range(topo.num_routers):
        if r == dst:
            return links
        port = routing.port(r, dst)
        links.append(int(topo.link_id[r, port]))
        r = int(topo.nbr_router[r, port])
    raise ConfigError(f"routing {routing.name!r}: no route from {src} to {dst}")


def hops(src: int, dst: int, routing: Routing) -> int:
    """Links between ``src`` and ``dst`` under ``routing`` (Manhattan distance for XY on a mesh)."""
    return routing.hops(src, dst)
