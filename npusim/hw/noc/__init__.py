"""Network-on-chip models.

Shared by every fidelity:

- :mod:`.topology` -- ``mesh(w, h)``, ``torus(w, h)``, ``ring(n)`` as networkx graphs and
  :func:`to_arrays` (the flat arrays kernels use);
- :mod:`.routing` -- routing tables ``next_port[router, dest]`` (``xy``, ``yx``),
  :func:`route` (link ids of a path) and :func:`hops`;
- :mod:`.traffic` -- :class:`NocParams`, :class:`SyntheticTraffic`, destination patterns
  and the :class:`NocResult` every fidelity returns.

Fidelities (:data:`FIDELITIES`): ``flit`` (cycle-accurate routers, :mod:`.flit`),
``path`` and ``analytical`` (not implemented yet). A fidelity is a function
``simulate_X(params: NocParams, traffic: SyntheticTraffic) -> NocResult``; register it in
:data:`SIMULATORS` as ``"module:function"`` (imported lazily, so importing this package
does not load Numba kernels) and :func:`simulate` and ``npusim noc --fidelity X`` use it.
"""

from __future__ import annotations

import importlib

from npusim.errors import ConfigError
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

FIDELITIES = ("flit", "path", "analytical")
#: fidelity name -> "module:function" implementing it
SIMULATORS: dict[str, str] = {
    "flit": "npusim.hw.noc.flit:simulate_flit",
}


def simulator(fidelity: str):
    """The ``simulate_X(params, traffic) -> NocResult`` function of a fidelity."""
    if fidelity not in FIDELITIES:
        raise ConfigError(f"unknown NoC fidelity {fidelity!r}; known: {', '.join(FIDELITIES)}")
    target = SIMULATORS.get(fidelity)
    if target is None:
        implemented = ", ".join(sorted(SIMULATORS))
        raise ConfigError(f"the {fidelity!r} NoC fidelity is not implemented yet (available: {implemented})")
    module, func = target.split(":")
    return getattr(importlib.import_module(module), func)


def simulate(fidelity: str, params: NocParams, traffic: SyntheticTraffic) -> NocResult:
    """Run a synthetic-traffic experiment at the given fidelity."""
    return simulator(fidelity)(params, traffic)


__all__ = [
    "FIDELITIES", "NUM_PORTS", "PATTERNS", "PORT_E", "PORT_LOCAL", "PORT_N", "PORT_NAMES", "PORT_S", "PORT_W",
    "ROUTING_FUNCTIONS", "SIMULATORS", "NocParams", "NocResult", "Routing", "SyntheticTraffic", "Topology",
    "build_routing", "hops", "make_pattern", "mesh", "ring", "route", "simulate", "simulator", "to_arrays", "torus",
]
