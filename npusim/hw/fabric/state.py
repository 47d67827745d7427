"""Arrays of a fabric model: links, routes, per-transfer state, packets.

Time is integer picoseconds; link capacities are bytes per picosecond (GB/s / 1000).
A *route* is a list of directed link ids (CSR: ``route_ptr``, ``route_link``) with its head
latency ``route_lat``: the sum of its links' ``link_hop_ps`` (a link's own latency plus that of
the switch at its far end); a route never crosses a link twice (routes are shortest paths). A
*transfer* is an engine task of kind ``KIND_FLOW`` whose parameters are (see :data:`FP_ROUTE` ...):

* ``route``: route id;
* ``wire_bytes``: bytes on the wire (payload / protocol efficiency);
* ``setup_ps``: time from the task's start to its first byte (launch, target access, a read's
  request trip);
* ``return_ps``: time from the last byte's arrival to completion (a write's acknowledgement).

Per-transfer state of the packet model is indexed by task id (arrays grown with the task table).
The flow model keeps its active transfers in *slots* ``0 .. sc[S_NACT]-1`` (``act[slot]`` = task
id): remaining bytes, rate and the route's links inline (``s_links``: one row of ``W`` link ids
per slot, ``W`` = the longest route, padded with the sentinel link id ``n_links``), so its passes
over the active set read contiguous memory. It also keeps, from one rate update to the next, each
link's list of the active transfers crossing it: entries ``lstart[l] .. lstart[l] + lcnt[l] - 1``
of ``lf_route`` (``W`` link ids each: a copy of the transfer's route row) and ``lf_slot`` (its
slot; ``s_pos[slot, k]`` is the entry of the slot's ``k``-th link), with room up to ``lcap[l]``.
The kernel lays the lists out again from the slots when one is full, or when
``sc[S_LISTS_STALE]`` is set (the arrays were replaced). Per-link arrays have ``n_links + 1``
entries (the last is the sentinel's).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

FP_ROUTE, FP_WIRE_BYTES, FP_SETUP_PS, FP_RETURN_PS = range(4)

MODE_FLOW, MODE_PACKET = 0, 1

# scalars in ``sc``
(S_MODE, S_NACT, S_VERSION, S_TLAST, S_PENDING, S_UPDATES, S_PKT_FREE, S_PACKET_BYTES, S_ROUNDS,
 S_QUANTUM_PS, S_LISTS_STALE) = range(11)
N_SC = 11
# float scalars in ``fsc``
F_PEAK_LOAD, F_TOLERANCE = 0, 1

FabricState = namedtuple("FabricState", [
    "link_cap", "link_hop_ps", "link_bytes", "link_busy_ps", "route_ptr", "route_link", "route_lat",
    # per transfer (task id)
    "f_pos", "f_sent", "f_done_bytes",
    # flow model, per active slot: task id, remaining bytes, rate, route links and their list
    # entries (slot x W)
    "act", "s_rem", "s_rate", "s_links", "s_pos",
    # flow model, per link (n_links + 1): its list (active transfers crossing it: count, first
    # entry, room); the entries (route rows, W link ids each; slots)
    "lcnt", "lstart", "lcap", "lf_route", "lf_slot",
    # flow model, water-filling scratch per link: unfrozen transfers, remaining capacity, touched
    # and bottleneck links, fair shares, freezing order and share
    "cnt", "remcap", "touched", "blist", "lsh", "lkey", "lshare",
    # packet model: per link next-free time; packet slots
    "link_free", "p_task", "p_hop", "p_bytes", "p_tail", "p_next_free",
    "sc", "fsc",  # int and float scalars (S_* and F_* below)
])


def new_fabric_state(link_cap: np.ndarray, link_hop_ps: np.ndarray, route_ptr: np.ndarray, route_link: np.ndarray, route_lat: np.ndarray,
                     task_capacity: int, mode: int, packet_bytes: int, packet_slots: int = 1024,
                     quantum_ps: int = 0, tolerance: float = 1e-9) -> FabricState:
    n_links = link_cap.shape[0]
    nl = n_links + 1  # + the sentinel that pads route rows
    sc = np.zeros(N_SC, np.int64)
    sc[S_MODE] = mode
    sc[S_PACKET_BYTES] = packet_bytes
    sc[S_QUANTUM_PS] = quantum_ps
    fsc = np.zeros(2)
    fsc[F_TOLERANCE] = tolerance
    st = FabricState(
        link_cap=np.asarray(link_cap, np.float64), link_hop_ps=np.asarray(link_hop_ps, np.int64), link_bytes=np.zeros(n_links), link_busy_ps=np.zeros(n_links, np.int64),
        route_ptr=np.asarray(route_ptr, np.int64), route_link=np.asarray(route_link, np.int64),
        route_lat=np.asarray(route_lat, np.int64),
        f_pos=np.full(task_capacity, -1, np.int64), f_sent=np.zeros(task_capacity, np.int64),
        f_done_bytes=np.zeros(task_capacity, np.int64),
        act=np.zeros(task_capacity, np.int64), s_rem=np.zeros(task_capacity), s_rate=np.zeros(task_capacity),
        s_links=np.full((task_capacity, 1), n_links, np.int32), s_pos=np.zeros((task_capacity, 1), np.int64),
        lcnt=np.zeros(nl, np.int64), lstart=np.zeros(nl, np.int64), lcap=np.zeros(nl, np.int64),
        lf_route=np.zeros(_list_room(task_capacity, 1, nl), np.int32),
        lf_slot=np.zeros(_list_room(task_capacity, 1, nl), np.int32),
        cnt=np.zeros(nl, np.int64), remcap=np.zeros(nl), touched=np.zeros(nl, np.int64),
        blist=np.zeros(nl, np.int64), lsh=np.zeros(nl), lkey=np.zeros(nl, np.int64), lshare=np.zeros(nl),
        link_free=np.zeros(n_links, np.int64),
        p_task=np.zeros(packet_slots, np.int64), p_hop=np.zeros(packet_slots, np.int64),
        p_bytes=np.zeros(packet_slots, np.int64), p_tail=np.zeros(packet_slots, np.int64),
        p_next_free=np.arange(1, packet_slots + 1, dtype=np.int64),
        sc=sc, fsc=fsc,
    )
    st.p_next_free[-1] = -1
    st.sc[S_PKT_FREE] = 0
    st.sc[S_LISTS_STALE] = 1
    return st


LIST_MIN_ROOM = 16  # list entries a link gets beyond twice its count when the lists are laid out


def _list_room(capacity: int, max_route_links: int, n_links: int) -> int:
    """List entries for ``capacity`` transfers of up to ``max_route_links`` links: twice what they
    can fill, plus ``LIST_MIN_ROOM`` per link (so a layout always fits)."""
    return 2 * capacity * max_route_links + LIST_MIN_ROOM * n_links


def grow_tasks(st: FabricState, capacity: int, max_route_links: int) -> FabricState:
    """Room for per-transfer state of ``capacity`` tasks whose routes have at most ``max_route_links``
    (slot rows are widened to the longest route, keeping the active transfers' rows; the
    per-link lists are laid out again by the kernel if their arrays are replaced)."""
    changes = {}
    width = max(st.s_links.shape[1], max_route_links)
    nl = st.lcnt.shape[0]
    room = _list_room(capacity, width, nl)
    if st.lf_slot.shape[0] < room or st.lf_route.shape[0] < room * width:
        room = max(room, 2 * st.lf_slot.shape[0])
        changes["lf_slot"] = np.zeros(room, np.int32)
        changes["lf_route"] = np.zeros(room * width, np.int32)
    old_links = st.s_links
    if old_links.shape[0] < capacity or old_links.shape[1] < width:
        rows = max(capacity, old_links.shape[0])
        new = np.full((rows, width), nl - 1, np.int32)  # the sentinel
        new[: old_links.shape[0], : old_links.shape[1]] = old_links
        changes["s_links"] = new
        changes["s_pos"] = np.zeros((rows, width), np.int64)  # set by the next layout
    if changes:
        st.sc[S_LISTS_STALE] = 1
    if st.f_pos.shape[0] >= capacity:
        return st._replace(**changes)
    for name, fill in (("f_pos", -1), ("f_sent", 0), ("f_done_bytes", 0), ("act", 0), ("s_rem", 0),
                       ("s_rate", 0)):
        old = getattr(st, name)
        new = np.full(capacity, fill, dtype=old.dtype)
        new[: old.shape[0]] = old
        changes[name] = new
    return st._replace(**changes)


def grow_packets(st: FabricState) -> FabricState:
    """Double the packet slot pool (the kernel returns to Python when it is empty)."""
    n = st.p_task.shape[0]
    changes = {}
    for name in ("p_task", "p_hop", "p_bytes", "p_tail"):
        old = getattr(st, name)
        new = np.zeros(2 * n, dtype=old.dtype)
        new[:n] = old
        changes[name] = new
    nxt = np.zeros(2 * n, np.int64)
    nxt[:n] = st.p_next_free
    nxt[n:] = np.arange(n + 1, 2 * n + 1)
    nxt[-1] = st.sc[S_PKT_FREE]  # chain the old free list (-1 when empty) after the new slots
    st = st._replace(p_next_free=nxt, **changes)
    st.sc[S_PKT_FREE] = n
    return st
