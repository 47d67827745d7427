"""Network-on-chip models.

Shared by every fidelity:

- :mod:`.topology` -- ``mesh(w, h)``, ``torus(w, h)``, ``ring(n)`` as networkx graphs and
  :func:`to_arrays` (the flat arrays kernels use);
- :mod:`.routing` -- routing tables ``next_port[router, dest]`` (``xy``, ``yx``),
  :func:`route` (link ids of a path) and :func:`hops`;
- :mod:`.traffic` -- :class:`NocParams`, :class:`SyntheticTraffic`, destination patterns
  and the :class:`NocResult` every fidelity returns.

Fidelities: ``flit`` (cycle-accurate routers, :mod:`.flit`, its own cycle-driven
kernel) and, run inside the event engine, ``path`` (:mod:`.path`, message-level
contention) and ``analytical`` (zero-load latency, no contention). Synthetic-traffic
experiments at every fidelity return the same :class:`NocResult`; the registry that
picks one is ``npusim.sim.noc_synthetic`` (it needs the engine, a layer above).
"""

from __future__ import annotations

from npusim.hw.noc.routing import ROUTING_FUNCTIONS, Routing, build_routing, hops, route
from npusim.hw.noc.topology import (
    NUM_PORTS,
    PORT_E,
    PORT_LOCAL,
    PORT_N,
    PORT_NAMES,
    PORT_S,
    PORT_W,
    Topology,
    mesh,
    ring,
    to_arrays,
    torus,
)
from npusim.hw.noc.traffic import PATTERNS, NocParams, NocResult, SyntheticTraffic, make_pattern

__all__ = [
    "NUM_PORTS", "PATTERNS", "PORT_E", "PORT_LOCAL", "PORT_N", "PORT_NAMES", "PORT_S", "PORT_W",
    "ROUTING_FUNCTIONS", "NocParams", "NocResult", "Routing", "SyntheticTraffic", "Topology",
    "build_routing", "hops", "make_pattern", "mesh", "ring", "route", "to_arrays", "torus",
]
