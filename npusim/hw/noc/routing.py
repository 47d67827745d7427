"""Deterministic routing as a table ``next_port[router, dest]`` built in Python.

The flit-level kernel (and the path-level and analytical models) only ever look a
route up in the table, so a new routing algorithm is a new function
``table(topo) -> int64[R, R]`` registered in :data:`ROUTING_FUNCTIONS`. Entry
``next_port[r, d]`` is the output port (see :mod:`npusim.hw.noc.topology`) a packet at
router ``r`` bound for ``d`` leaves by; ``next_port[d, d] == PORT_LOCAL`` (eject).

Built in: dimension-order routing ``xy`` (all of x first, then y; the default) and
``yx``. In a dimension that wraps (ring, torus) the shorter way round is taken, ties
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


ROUTING_FUNCTIONS = {
    "xy": lambda topo: dimension_order_table(topo, "xy"),
    "yx": lambda topo: dimension_order_table(topo, "yx"),
}


@dataclass(frozen=True)
class Routing:
    """A routing table bound to its topology, with path and hop-count helpers."""

    name: str
    topo: Topology
    next_port: np.ndarray
    _hops: list = field(default_factory=list, repr=False, compare=False)

    def route(self, src: int, dst: int) -> list[int]:
        """Link ids a packet from ``src`` to ``dst`` traverses, in order (empty if src == dst)."""
        return route(src, dst, self)

    def hops(self, src: int, dst: int) -> int:
        """Number of links between ``src`` and ``dst`` on this routing's path."""
        return int(self.hop_matrix()[src, dst])

    def hop_matrix(self) -> np.ndarray:
        """``hops[s, d]`` for every pair (computed once, vectorised over all pairs)."""
        if not self._hops:
            self._hops.append(_hop_matrix(self.topo, self.next_port))
        return self._hops[0]


def build_routing(topo: Topology, name: str = "xy") -> Routing:
    """Build the named routing for ``topo``; checks every route reaches its destination."""
    if name not in ROUTING_FUNCTIONS:
        raise ConfigError(f"routing: unknown routing {name!r}; known: {', '.join(ROUTING_FUNCTIONS)}")
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
    topo, table = routing.topo, routing.next_port
    links, r = [], int(src)
    for _ in range(topo.num_routers):
        if r == dst:
            return links
        port = int(table[r, dst])
        links.append(int(topo.link_id[r, port]))
        r = int(topo.nbr_router[r, port])
    raise ConfigError(f"routing {routing.name!r}: no route from {src} to {dst}")


def hops(src: int, dst: int, routing: Routing) -> int:
    """Links between ``src`` and ``dst`` under ``routing`` (Manhattan distance for XY on a mesh)."""
    return routing.hops(src, dst)
