"""Path-level NoC model (NpuSim's model): contention at message granularity, inside the kernel.

A *message* (a DMA transfer of ``F`` flits, ``F = ceil(bytes / link width)``) from
router ``src`` to ``dst``:

1. **Path setup, hop by hop.** Its header leaves the source router after the router
   pipeline ``S`` and claims the output link of each router on its route in turn
   (one hop = ``S + L`` cycles: pipeline plus link latency). A link held by another
   message makes the header wait there, in first-come first-served order (ties by
   event order, so deterministic), while it keeps the links it already holds.
   At the destination it claims the router's ejection port the same way.
2. **Streaming.** Behind the header the flits move one per cycle on the held path:
   the head is ejected when the ejection port is claimed, the tail ``F - 1`` cycles
   later (``t_tail``), and the message's task ends then.
3. **Release.** A message that fits in one input buffer (``F <= buffer_flits``) moves
   as in virtual cut-through: each link is freed ``F`` cycles after its header
   claimed it (the packet is absorbed by the next router's buffer even if the header
   then waits), and its source after ``F`` cycles. A longer message (a DMA transfer)
   keeps its path as in wormhole switching: each link is freed when the tail has
   crossed it:
   ``t_tail - L - S + 1 - (H - 1 - k) * (S + L)`` for link ``k`` of ``H`` (the
   uncontended tail timing, counted back from the tail's arrival); the ejection port
   at ``t_tail + 1``. A freed link goes to the first waiting header. The source's
   ``noc`` queue is freed when the first link is (the tail has been injected), so the
   next message from the same core can start while this one is still in flight.

Analytical mode (same state, ``mode="analytical"``): zero-load latency, the source
busy for ``F`` cycles, no contention.

Uncontended, the tail is ejected ``(H + 1) * S + H * L + F - 1`` cycles after the
message starts: exactly the flit-level model's zero-load latency. Each message costs
``2H + 4`` events whatever its size: a 1 MB transfer is a handful of events.

What it leaves out (and the flit model has): finite buffers and the back-pressure
they cause mid-message, virtual channels, per-flit switch arbitration (a held link is
not interleaved with other messages' flits). Under dimension-order routing on a mesh
the link-wait graph has no cycles, so path setup cannot deadlock; on rings/tori it
could, and the engine then reports the stuck messages.

Memory streams (:mod:`npusim.sim.mempath`): a message may instead be a *part* of a DMA
task (``m_part`` = the DMA engine's initiator id): it holds no queue and, when its tail is
ejected, reports ``EV_NOC_PART_END`` for its initiator instead of ending a task. A stream
stands for many one-transaction packets, not one worm, so it always moves as in cut-through
(each link it crosses is busy for its ``F`` flits from when its header claimed it): it costs
every link its bytes but never holds a path while its header waits. Its reservations end
without an event unless a header waits for the link (``LAZY`` owner, ``link_free_at``): the
same timing as a release event, half the events.

Ports: every router has one ejection port for its core (one flit a cycle) and one *memory port*
(:func:`memory_port`) with ``link_lanes`` lanes, one per HBM channel attached there: a message
that ejects there (a memory stream towards the controllers, ``eject``) holds it for
``ceil(F / lanes)`` cycles. Injection is not modelled as a port: a message holds only its mesh
links and its ejection port.

NpuSim's router has a documented defect where two acknowledgements returning in
adjacent cycles lock routers for no reason; here no acknowledgement holds anything:
a link is only ever held by the one message that claimed it, until its tail passes.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.eventlist import event_push
from npusim.engine.tasks import EV_QUEUE_FREE, EV_TASK_END

EV_NOC_HOP, EV_NOC_RELEASE, EV_NOC_PART_END = 20, 21, 22
LAZY = -2  # link_owner of a link reserved by a memory stream until link_free_at (no release event)
WALK = -2  # m_task of a memory stream that walks ahead through free links (path_reserve_part)
MODE_PATH, MODE_ANALYTICAL, MODE_FLIT = 0, 1, 2
MODES = {"path": MODE_PATH, "analytical": MODE_ANALYTICAL, "flit": MODE_FLIT}  # flit: see flit_engine

PathState = namedtuple(
    "PathState",
    [
        # topology and routing
        "next_port", "link_id", "nbr_router", "n_links", "prm",
        # per link (mesh links, then one ejection port per router, then one memory port per router)
        "link_owner", "link_wait_head", "link_wait_tail", "link_flits", "link_free_at", "link_lanes",
        "link_holds",  # messages holding the link now (counted when prm[PRM_HOLD]: the memory flows see them)
        # per message in flight (slots from a free list)
        "m_task", "m_src", "m_dst", "m_flits", "m_cur", "m_wait_next", "m_hops", "m_part", "m_eject", "m_free",
        "counters",
    ],
)
PRM_STAGES, PRM_LINK_LAT, PRM_WIDTH, PRM_MODE, PRM_BUFFER, PRM_WALK, PRM_HOLD = 0, 1, 2, 3, 4, 5, 6
WALK_HOPS = 8  # a memory stream's header walks at most this many hops' time ahead of the event
C_MESSAGES, C_FLITS, C_WAITS, C_FREE_TOP, C_HOLDS_CHANGED = 0, 1, 2, 3, 4
_SLOT_FIELDS = ("m_task", "m_src", "m_dst", "m_flits", "m_cur", "m_wait_next", "m_hops", "m_part", "m_eject")


def new_path_state(topo, routing, router_stages: int, link_latency_cycles: int, link_bytes: int,
                   num_slots: int = 256, mode: str = "path", buffer_flits: int = 8,
                   walk_hops: int = WALK_HOPS, memory_ports=None) -> PathState:
    """Empty network. ``num_slots`` messages can be in flight at once; the kernel returns to
    Python to :func:`grow_slots` when they run out. ``memory_ports[r]``: how many memory-controller
    ports router ``r`` has (the HBM channels attached there, see :func:`memory_port`; missing: none)."""
    n_links = topo.num_links
    n_r = topo.num_routers
    total = n_links + 2 * n_r
    lanes = np.ones(total, np.int64)
    if memory_ports is not None:
        lanes[n_links + n_r:] = np.maximum(1, np.asarray(memory_ports, np.int64))
    z = lambda n: np.zeros(n, np.int64)  # noqa: E731
    full = lambda n: np.full(n, -1, np.int64)  # noqa: E731
    return PathState(
        next_port=routing.next_port.astype(np.int64), link_id=topo.link_id.astype(np.int64),
        nbr_router=topo.nbr_router.astype(np.int64), n_links=np.int64(n_links),
        prm=np.array([router_stages, link_latency_cycles, link_bytes, MODES[mode], buffer_flits,
                      walk_hops * (router_stages + link_latency_cycles), 0],
                     dtype=np.int64),
        link_owner=full(total), link_wait_head=full(total), link_wait_tail=full(total), link_free_at=z(total),
        link_flits=z(total), link_lanes=lanes, link_holds=z(total),
        m_task=full(num_slots), m_src=z(num_slots), m_dst=z(num_slots), m_flits=z(num_slots),
        m_cur=z(num_slots), m_wait_next=full(num_slots), m_hops=z(num_slots), m_part=full(num_slots),
        m_eject=z(num_slots),
        m_free=np.arange(num_slots, dtype=np.int64)[::-1].copy(),
        counters=np.array([0, 0, 0, num_slots, 0], dtype=np.int64),
    )


def grow_slots(ps: PathState) -> PathState:
    """A copy of ``ps`` with twice the message slots (the new ones free)."""
    old = ps.m_task.shape[0]
    new = 2 * old
    changes = {}
    for name in _SLOT_FIELDS:
        arr = getattr(ps, name)
        grown = np.full(new, -1 if name in ("m_task", "m_wait_next", "m_part") else 0, np.int64)
        grown[:old] = arr
        changes[name] = grown
    top = int(ps.counters[C_FREE_TOP])
    free = np.zeros(new, np.int64)
    free[:top] = ps.m_free[:top]
    free[top:top + old] = np.arange(new - 1, old - 1, -1)
    ps.counters[C_FREE_TOP] = top + old
    changes["m_free"] = free
    return ps._replace(**changes)


@njit(cache=True, _nrt=False, inline="always")
def slots_free(ps):
    return ps.counters[C_FREE_TOP]


@njit(cache=True, _nrt=False, inline="always")
def memory_port(ps, r):
    """Link id of router ``r``'s memory-controller port (where streams to its HBM channels eject)."""
    return ps.n_links + (ps.link_owner.shape[0] - ps.n_links) // 2 + r


@njit(cache=True, _nrt=False, inline="always")
def _occupancy(ps, link, flits):
    """Cycles ``flits`` flits hold ``link``: one a cycle per lane (a memory port has one lane per channel)."""
    lanes = ps.link_lanes[link]
    return (flits + lanes - 1) // lanes


@njit(cache=True, _nrt=False, inline="always")
def flits_of(ps, nbytes):
    w = ps.prm[PRM_WIDTH]
    return max(np.int64(1), (nbytes + w - 1) // w)


@njit(cache=True, _nrt=False, inline="always")
def path_start(ps, heap, hs, task, src, dst, nbytes, now):
    """Start a message (the caller made sure a slot is free). Path mode: its header tries
    its first hop after the source router. Analytical mode: it frees its source after
    injecting its ``F`` flits and ends at the zero-load latency, with no contention."""
    flits = flits_of(ps, nbytes)
    ps.counters[C_MESSAGES] += 1
    ps.counters[C_FLITS] += flits
    if ps.prm[PRM_MODE] == MODE_ANALYTICAL:
        S, L = ps.prm[PRM_STAGES], ps.prm[PRM_LINK_LAT]
        hops = 0
        r = src
        while r != dst:
            lk = ps.link_id[r, ps.next_port[r, dst]]
            ps.link_flits[lk] += flits
            r = ps.nbr_router[r, ps.next_port[r, dst]]
            hops += 1
        ps.link_flits[ps.n_links + dst] += flits
        event_push(heap, hs, now + flits, EV_QUEUE_FREE, task)
        event_push(heap, hs, now + (hops + 1) * S + hops * L + flits - 1, EV_TASK_END, task)
        return
    _launch(ps, heap, hs, task, -1, src, dst, flits, now, ps.n_links + dst)


@njit(cache=True, _nrt=False, inline="always")
def path_start_part(ps, heap, hs, owner, src, dst, flits, now, eject):
    """Start a message of ``flits`` flits that is part of initiator ``owner``'s DMA task (path
    mode only; the caller made sure a slot is free): no queue, ``EV_NOC_PART_END`` at the end.
    ``eject``: the port it leaves the mesh by at ``dst`` (the core's ``n_links + dst``, or the
    router's :func:`memory_port`)."""
    ps.counters[C_MESSAGES] += 1
    ps.counters[C_FLITS] += flits
    _launch(ps, heap, hs, -1, owner, src, dst, flits, now, eject)


@njit(cache=True, _nrt=False, inline="always")
def path_reserve_part(ps, heap, hs, owner, src, dst, flits, now, eject):
    """Start a memory stream of ``flits`` flits (part of initiator ``owner``'s DMA task) that *walks
    ahead*: its header claims each free link of its route in one go, at the time it would reach it
    (``now + S``, then ``S + L`` per hop), reserving it for its ``F`` flits as :func:`_claim` does
    for a stream, without the hop events. Where a link is not free when the header would reach it
    (another message holds it, headers queue for it, or a stream's reservation runs past that time
    on a mesh link), the stream becomes an event-driven message there (it waits like any header, see
    :func:`path_handle`) and walks ahead again after each link it claims; so it does, without
    waiting, where the next link is more than ``WALK_HOPS`` hops' time (``8 (S + L)`` cycles) ahead
    of the event it walks from. Returns the tail's ejection time when the walk reached the
    destination (the caller reports the part's end), else -1 (the message reports its own
    ``EV_NOC_PART_END``; the caller made sure a slot is free). At the ejection port the tail simply
    follows the earlier stream's (nothing is reserved beyond it, so waiting there needs no event).

    Approximation (measured by ``validation/memory_stream_model.py``): a free link is reserved
    when the header's walk starts, up to ``8 (S + L)`` cycles before the header reaches it, so a
    message reaching it in between waits instead of going first (an unbounded walk, up to the
    mesh's diameter ahead, put the mean TTFT of a serving case 6% off; 8 hops, 0.2%)."""
    ps.counters[C_MESSAGES] += 1
    ps.counters[C_FLITS] += flits
    return _walk(ps, heap, hs, -1, owner, src, dst, flits, src, 0, now + ps.prm[PRM_STAGES], now, eject)


@njit(cache=True, _nrt=False, inline="always")
def _walk(ps, heap, hs, slot, part, src, dst, flits, r, hops, t, now, eject):
    """Walk stream ``part``'s header from router ``r`` (reached at ``t`` after ``hops`` hops),
    reserving free links (see :func:`path_reserve_part`); ``slot``: its message slot (-1: none
    yet). Returns the tail's ejection time (the slot, if any, freed) or -1 (a hop event pushed)."""
    S, L = ps.prm[PRM_STAGES], ps.prm[PRM_LINK_LAT]
    while True:
        link = eject if r == dst else ps.link_id[r, ps.next_port[r, dst]]
        o = ps.link_owner[link]
        busy = o == LAZY and ps.link_free_at[link] > t
        if o >= 0 or ps.link_wait_head[link] >= 0 or (busy and r != dst) or t - now > ps.prm[PRM_WALK]:
            if slot < 0:
                slot = _take_slot(ps, WALK, part, src, dst, flits, eject)
            ps.m_cur[slot] = r
            ps.m_hops[slot] = hops
            event_push(heap, hs, t, EV_NOC_HOP, slot)
            return -1
        if busy:
            ps.counters[C_WAITS] += 1
            t = ps.link_free_at[link]
        occ = _occupancy(ps, link, flits)
        ps.link_owner[link] = LAZY
        ps.link_free_at[link] = t + occ
        ps.link_flits[link] += flits
        if r == dst:
            if slot >= 0:
                _free_slot(ps, slot)
            return t + occ - 1
        r = ps.nbr_router[r, ps.next_port[r, dst]]
        hops += 1
        t += L + S


@njit(cache=True, _nrt=False, inline="always")
def _free_slot(ps, slot):
    ps.m_task[slot] = -1
    ps.m_part[slot] = -1
    ps.m_free[ps.counters[C_FREE_TOP]] = slot
    ps.counters[C_FREE_TOP] += 1


@njit(cache=True, _nrt=False, inline="always")
def _take_slot(ps, task, part, src, dst, flits, eject):
    top = ps.counters[C_FREE_TOP] - 1
    ps.counters[C_FREE_TOP] = top
    slot = ps.m_free[top]
    ps.m_task[slot] = task
    ps.m_part[slot] = part
    ps.m_src[slot] = src
    ps.m_dst[slot] = dst
    ps.m_flits[slot] = flits
    ps.m_cur[slot] = src
    ps.m_hops[slot] = 0
    ps.m_eject[slot] = eject
    return slot


@njit(cache=True, _nrt=False, inline="always")
def _launch(ps, heap, hs, task, part, src, dst, flits, now, eject):
    slot = _take_slot(ps, task, part, src, dst, flits, eject)
    if flits <= ps.prm[PRM_BUFFER] and part < 0:  # the source router's input buffer takes the whole packet
        event_push(heap, hs, now + flits, EV_QUEUE_FREE, task)
    event_push(heap, hs, now + ps.prm[PRM_STAGES], EV_NOC_HOP, slot)


@njit(cache=True, _nrt=False, inline="always")
def _next_link(ps, slot):
    """The link (or ejection port) the header at ``m_cur`` needs next."""
    cur, dst = ps.m_cur[slot], ps.m_dst[slot]
    if cur == dst:
        return ps.m_eject[slot]
    return ps.link_id[cur, ps.next_port[cur, dst]]


@njit(cache=True, _nrt=False, inline="always")
def _holds_changed(ps, link):
    """Note that a message claimed or freed ``link``: ``counters[C_HOLDS_CHANGED]`` is ``link + 1``,
    or -1 once more than one link changed since the kernel last looked."""
    v = ps.counters[C_HOLDS_CHANGED]
    if v == 0:
        ps.counters[C_HOLDS_CHANGED] = link + 1
    elif v != link + 1:
        ps.counters[C_HOLDS_CHANGED] = -1


@njit(cache=True, _nrt=False, inline="always")
def _claim(ps, heap, hs, slot, link, now):
    """``slot`` owns ``link`` from ``now``: advance the header, or — when the link is the
    ejection port — schedule the tail, the link releases and the end of the task."""
    ps.link_owner[link] = slot
    if ps.prm[PRM_HOLD] != 0:  # the memory flows lose this link while the message holds it
        ps.link_holds[link] += 1
        _holds_changed(ps, link)
    cur, dst = ps.m_cur[slot], ps.m_dst[slot]
    S, L = ps.prm[PRM_STAGES], ps.prm[PRM_LINK_LAT]
    flits = ps.m_flits[slot]
    task = ps.m_task[slot]
    # a memory stream is many one-transaction packets, not one worm: it moves cut-through
    cut_through = flits <= ps.prm[PRM_BUFFER] or ps.m_part[slot] >= 0
    if link < ps.n_links:
        ps.m_cur[slot] = ps.nbr_router[cur, ps.next_port[cur, dst]]
        ps.m_hops[slot] += 1
        if cut_through:  # the whole packet crosses into the next router's buffer
            ps.link_flits[link] += flits
            if ps.m_part[slot] >= 0:  # memory streams: released lazily (an event only if someone waits)
                _reserve_lazily(ps, heap, hs, link, now + flits)
            else:
                event_push(heap, hs, now + flits, EV_NOC_RELEASE, link)
        if task == WALK:  # a walking memory stream: on through the free links ahead
            part = ps.m_part[slot]
            t_tail = _walk(ps, heap, hs, slot, part, ps.m_src[slot], dst, flits, ps.m_cur[slot], ps.m_hops[slot],
                           now + L + S, now, ps.m_eject[slot])
            if t_tail >= 0:
                event_push(heap, hs, t_tail, EV_NOC_PART_END, part)
            return
        event_push(heap, hs, now + L + S, EV_NOC_HOP, slot)
        return
    # ejection port claimed: head ejected now, tail F-1 cycles later (on one lane); the slot is done
    t_tail = now + _occupancy(ps, link, flits) - 1
    ps.link_flits[link] += flits
    part = ps.m_part[slot]
    if part >= 0:
        _reserve_lazily(ps, heap, hs, link, t_tail + 1)
    else:
        event_push(heap, hs, t_tail + 1, EV_NOC_RELEASE, link)
    if part >= 0:
        event_push(heap, hs, t_tail, EV_NOC_PART_END, part)
    else:
        event_push(heap, hs, t_tail, EV_TASK_END, task)
    if not cut_through:
        _schedule_wormhole_releases(ps, heap, hs, slot, t_tail)
    _free_slot(ps, slot)


@njit(cache=True, _nrt=False, inline="always")
def _reserve_lazily(ps, heap, hs, link, free_at):
    """A memory stream holds ``link`` until ``free_at``; a release event only if headers wait."""
    ps.link_owner[link] = LAZY
    ps.link_free_at[link] = free_at
    if ps.link_wait_head[link] >= 0:
        event_push(heap, hs, free_at, EV_NOC_RELEASE, link)


@njit(cache=True, _nrt=False, inline="always")
def _schedule_wormhole_releases(ps, heap, hs, slot, t_tail):
    """Free each link of the path when the tail has crossed it, and the source queue when
    the tail has left the source."""
    S, L = ps.prm[PRM_STAGES], ps.prm[PRM_LINK_LAT]
    flits, dst = ps.m_flits[slot], ps.m_dst[slot]
    hops = ps.m_hops[slot]
    source_free = t_tail + 1  # 0 hops: the tail leaves the source router when ejected
    r = ps.m_src[slot]
    for k in range(hops):
        lk = ps.link_id[r, ps.next_port[r, dst]]
        release = t_tail - L - S + 1 - (hops - 1 - k) * (S + L)
        if k == 0:
            source_free = release
        ps.link_flits[lk] += flits
        event_push(heap, hs, release, EV_NOC_RELEASE, lk)
        r = ps.nbr_router[r, ps.next_port[r, dst]]
    if ps.m_part[slot] < 0:
        event_push(heap, hs, source_free, EV_QUEUE_FREE, ps.m_task[slot])


@njit(cache=True, _nrt=False, inline="always")
def path_handle(ps, heap, hs, etype, eid, now):
    """Handle a NoC event (a header's hop, or a link's release). Both end in one call of
    :func:`_claim` (the largest inlined function of the kernel: one copy compiles faster)."""
    if etype == EV_NOC_HOP:
        slot = eid
        link = _next_link(ps, slot)
        owner = ps.link_owner[link]
        if owner == LAZY and ps.link_free_at[link] <= now and ps.link_wait_head[link] < 0:
            owner = -1  # a memory stream's reservation that has run out
        if owner != -1:
            if owner == LAZY and ps.link_wait_head[link] < 0:  # the first waiter: the release becomes an event
                event_push(heap, hs, max(now, ps.link_free_at[link]), EV_NOC_RELEASE, link)
            ps.counters[C_WAITS] += 1
            ps.m_wait_next[slot] = -1
            if ps.link_wait_tail[link] >= 0:
                ps.m_wait_next[ps.link_wait_tail[link]] = slot
            else:
                ps.link_wait_head[link] = slot
            ps.link_wait_tail[link] = slot
            return
    else:
        # EV_NOC_RELEASE: the tail has passed; hand the link to the first waiting header
        link = eid
        if ps.prm[PRM_HOLD] != 0 and ps.link_owner[link] >= 0 and ps.link_holds[link] > 0:
            ps.link_holds[link] -= 1
            _holds_changed(ps, link)
        ps.link_owner[link] = -1
        slot = ps.link_wait_head[link]
        if slot < 0:
            return
        ps.link_wait_head[link] = ps.m_wait_next[slot]
        if ps.link_wait_head[link] < 0:
            ps.link_wait_tail[link] = -1
    _claim(ps, heap, hs, slot, link, now)
