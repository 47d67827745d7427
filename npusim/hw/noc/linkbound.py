"""Memory traffic at the analytical NoC: each stream reserves the links of its route first come, first served.

The analytical NoC gives messages their zero-load latency and no contention
(:func:`npusim.hw.noc.path.path_start`). Memory traffic cannot be timed that way: many cores
reading from the few routers where the HBM channels attach load the links next to those routers
far beyond one flit a cycle, and with no mesh in its way the analytical NoC moved the README's
forward pass's HBM data at 95% of the HBM's peak, above the mesh's max-flow bound (66.6%) —
more than the links can carry (issue 42).

Model (the one the analytical memory model applies to its channels' data buses,
:func:`npusim.hw.memory.hbm.analytical_finish`, here applied to the mesh's links): a stream of
``F`` flits from router ``src`` to ``dst`` reserves, on every link of its route and on the port it
leaves the mesh by (``eject``: the core's ejection port, or an attach router's memory-controller
port with one lane per channel there), ``ceil(F / lanes)`` cycles, starting at the later of the
stream's start and the end of the link's earlier reservations. Each link is reserved on its own
(not in step with its neighbours on the route), so no link is ever idle while a stream waits for
it. The stream's tail is ejected when its last reservation ends plus the route's zero-load
latency ``(H + 1) S + H L`` (router pipeline ``S``, link latency ``L``, ``H`` hops): uncontended,
exactly the path and flit models' zero-load latency ``(H + 1) S + H L + F - 1``.

Consequences (assumptions, in cycles of the NoC clock):

* over any interval a link carries at most one flit a cycle (a memory port ``lanes``), so the
  memory traffic's bandwidth never exceeds any link's peak nor, the reservations being a
  feasible flow on the mesh, its max-flow bound; with one stream's reservations adding up link by
  link, a busy pattern takes at least its busiest link's flits (the XY-routing bound);
* the order is first come, first served, not fair shares: a stream that starts later waits for
  the reservations made before it (the total is the same, the order differs);
* what the model leaves out: head-of-line blocking in finite buffers, virtual channels and
  switch arbitration (the flit model has them: it reaches ~0.8 of the XY bound on the forward
  pass, ``validation/noc_hotspot_booksim.py --forward``); the reservations are made when the DMA
  starts, and messages between cores (zero-load, uncontended) neither see nor are seen by them.

Cost: one pass over the route's links per stream, no events (the DMA's streams end in one event,
:func:`npusim.sim.mempath.mem_start`).
"""

from __future__ import annotations

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.hw.noc.path import C_FLITS, C_MESSAGES, PRM_LINK_LAT, PRM_STAGES, _occupancy


@njit(cache=True, _nrt=False, inline="always")
def reserve_route(ps, src, dst, flits, now, eject):
    """Reserve ``flits`` flits on each link of the route ``src -> dst`` of path state ``ps`` and on
    the port ``eject`` at ``dst``, each from the later of ``now`` and the end of its earlier
    reservations (``ps.link_free_at``; counted in ``ps.link_flits``); returns the cycle the
    stream's tail is ejected (see the module docstring)."""
    ps.counters[C_MESSAGES] += 1
    ps.counters[C_FLITS] += flits
    end = now
    hops = 0
    r = src
    while True:
        link = eject if r == dst else ps.link_id[r, ps.next_port[r, dst]]
        start = max(now, ps.link_free_at[link])
        busy = start + _occupancy(ps, link, flits)
        ps.link_free_at[link] = busy
        ps.link_flits[link] += flits
        end = max(end, busy)
        if r == dst:
            break
        r = ps.nbr_router[r, ps.next_port[r, dst]]
        hops += 1
    return end - 1 + (hops + 1) * ps.prm[PRM_STAGES] + hops * ps.prm[PRM_LINK_LAT]


__all__ = ["reserve_route"]
