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

Per-transfer state indexed by task id (``f_sent``, ``f_done_bytes``) grows with the task table.
The flow model keeps its active transfers in *slots* ``0 .. sc[S_NACT]-1`` (``act[slot]`` = task
id): remaining bytes, rate and the route's links inline (``s_links``: one row of ``W`` link ids
per slot, ``W`` = the longest route, padded with the sentinel link id ``n_links``), so its passes
over the active set read contiguous memory. It also keeps, from one rate update to the next, each
link's list of the active transfers crossing it: ``llen[l]`` entries, ``lcnt[l]`` of them live,
in a chain of blocks of ``LIST_BLOCK`` entries (``lhead``/``ltail``, ``blk_next``; all full but
the tail; unused blocks on a free list from ``sc[S_BLK_FREE]``; the lists given a block since they
were last built are ``lused[: sc[S_NUSED]]``, the others are empty). Entry ``e`` (in block
``e // LIST_BLOCK``) is a copy of the transfer's route row, ``lf_route[e * W : (e + 1) * W]``
(``s_pos[slot, k]`` is the entry of the slot's ``k``-th link). A transfer that leaves marks its
entries dead (first link id ``n_links + 1``; ``sc[S_DEAD]`` counts the dead, ``sc[S_LIVE]`` the
live), and the lists are built again from the slots when the dead outnumber half the live, or
when ``sc[S_LISTS_STALE]`` is set (their arrays were replaced). Per-link arrays have
``n_links + 2`` entries (the last two: the sentinel's and the dead mark's). Link ids are int16
while they fit.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

FP_ROUTE, FP_WIRE_BYTES, FP_SETUP_PS, FP_RETURN_PS = range(4)

MODE_FLOW, MODE_PACKET = 0, 1

# scalars in ``sc``
(S_MODE, S_NACT, S_VERSION, S_TLAST, S_PENDING, S_UPDATES, S_PKT_FREE, S_PACKET_BYTES, S_ROUNDS,
 S_QUANTUM_PS, S_LISTS_STALE, S_BLK_FREE, S_DEAD, S_LIVE, S_NUSED) = range(15)
N_SC = 15
# float scalars in ``fsc``
F_PEAK_LOAD, F_TOLERANCE = 0, 1

FabricState = namedtuple("FabricState", [
    "link_cap", "link_hop_ps", "link_bytes", "link_busy_ps", "route_ptr", "route_link", "route_lat",
    # per transfer (task id)
    "f_sent", "f_done_bytes",
    # flow model, per active slot: task id, remaining bytes, rate, route links and their list
    # entries (slot x W)
    "act", "s_rem", "s_rate", "s_links", "s_pos",
    # flow model, per link (n_links + 2): its list of the active transfers crossing it (live and
    # all entries, first and last block); lists in use; per block: the next; the entries (W link
    # ids each)
    "lcnt", "llen", "lhead", "ltail", "lused", "blk_next", "lf_route",
    # flow model, water-filling scratch per link: unfrozen transfers, remaining capacity, touched
    # and bottleneck links, fair shares, freezing order and share
    "cnt", "remcap", "touched", "blist", "lsh", "lkey", "lshare",
    # packet model: per link next-free time; packet slots
    "link_free", "p_task", "p_hop", "p_bytes", "p_tail", "p_next_free",
    "sc", "fsc",  # int and float scalars (S_* and F_* below)
])


LIST_BLOCK = 256  # entries per block of a link's list (a block of 4-link int16 rows is 2 KiB)


def link_id_dtype(n_links: int):
    """Link ids in route rows and lists: int16 while the dead mark fits (half the memory traffic)."""
    return np.int16 if n_links + 1 <= np.iinfo(np.int16).max else np.int32


def _list_blocks(capacity: int, max_route_links: int, n_lists: int) -> int:
    """Blocks enough for the lists of ``capacity`` transfers of up to ``max_route_links`` links:
    live entries and dead ones (at most half the live plus a block when an entry is added), all
    blocks full but each list's last."""
    return 2 * capacity * max_route_links // LIST_BLOCK + n_lists + 4


def new_fabric_state(link_cap: np.ndarray, link_hop_ps: np.ndarray, route_ptr: np.ndarray, route_link: np.ndarray, route_lat: np.ndarray,
                     task_capacity: int, mode: int, packet_bytes: int, packet_slots: int = 1024,
                     quantum_ps: int = 0, tolerance: float = 1e-9) -> FabricState:
    n_links = link_cap.shape[0]
    nl = n_links + 2  # + the sentinel that pads route rows, + the dead mark
    blocks = _list_blocks(task_capacity, 1, nl)  # rows one link wide until the routes are known
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
        f_sent=np.zeros(task_capacity, np.int64), f_done_bytes=np.zeros(task_capacity, np.int64),
        act=np.zeros(task_capacity, np.int64), s_rem=np.zeros(task_capacity), s_rate=np.zeros(task_capacity),
        s_links=np.full((task_capacity, 1), n_links, link_id_dtype(n_links)),
        s_pos=np.zeros((task_capacity, 1), np.int32),
        lcnt=np.zeros(nl, np.int64), llen=np.zeros(nl, np.int64), lhead=np.full(nl, -1, np.int64),
        ltail=np.full(nl, -1, np.int64), lused=np.zeros(nl, np.int64), blk_next=np.zeros(blocks, np.int64),
        lf_route=np.zeros(blocks * LIST_BLOCK, link_id_dtype(n_links)),
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


def grow_tasks(st: FabricState, capacity: int, max_route_links: int) -> FabricState:
    """Room for per-transfer state of ``capacity`` tasks whose routes have at most ``max_route_links``
    (slot rows are widened to the longest route, keeping the active transfers' rows; the kernel
    builds the per-link lists again if their arrays are replaced)."""
    changes = {}
    width = max(st.s_links.shape[1], max_route_links)
    nl = st.lcnt.shape[0]
    old_links = st.s_links
    if old_links.shape[0] < capacity or old_links.shape[1] < width:
        rows = max(capacity, old_links.shape[0])
        new = np.full((rows, width), nl - 2, old_links.dtype)  # the sentinel
        new[: old_links.shape[0], : old_links.shape[1]] = old_links
        changes["s_links"] = new
        blocks = max(_list_blocks(rows, width, nl), st.blk_next.shape[0])
        entry_dtype = np.int32 if blocks * LIST_BLOCK <= np.iinfo(np.int32).max else np.int64
        changes["s_pos"] = np.zeros((rows, width), entry_dtype)
        changes["blk_next"] = np.zeros(blocks, np.int64)
        changes["lf_route"] = np.zeros(blocks * LIST_BLOCK * width, old_links.dtype)
        st.sc[S_LISTS_STALE] = 1
    if st.f_sent.shape[0] >= capacity:
        return st._replace(**changes)
    for name, fill in (("f_sent", 0), ("f_done_bytes", 0), ("act", 0), ("s_rem", 0), ("s_rate", 0)):
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
