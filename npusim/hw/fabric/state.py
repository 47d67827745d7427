"""Arrays of a fabric model: links, routes, per-transfer state, packets.

Time is integer picoseconds; link capacities are bytes per picosecond (GB/s / 1000).
A *route* is a list of directed link ids (CSR: ``route_ptr``, ``route_link``) with its head
latency ``route_lat``: the sum of its links' ``link_hop_ps`` (a link's own latency plus that of
the switch at its far end). A *transfer* is an engine task of kind
``KIND_FLOW`` whose parameters are (see :data:`FP_ROUTE` ...):

* ``route``: route id;
* ``wire_bytes``: bytes on the wire (payload / protocol efficiency);
* ``setup_ps``: time from the task's start to its first byte (launch, target access, a read's
  request trip);
* ``return_ps``: time from the last byte's arrival to completion (a write's acknowledgement).

Per-transfer state is indexed by task id (arrays grown with the task table).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

FP_ROUTE, FP_WIRE_BYTES, FP_SETUP_PS, FP_RETURN_PS = range(4)

MODE_FLOW, MODE_PACKET = 0, 1

# scalars in ``sc``
(S_MODE, S_NACT, S_VERSION, S_TLAST, S_PENDING, S_UPDATES, S_PKT_FREE, S_PACKET_BYTES, S_ROUNDS,
 S_QUANTUM_PS) = range(10)
N_SC = 10
# float scalars in ``fsc``
F_PEAK_LOAD, F_TOLERANCE = 0, 1

FabricState = namedtuple("FabricState", [
    "link_cap", "link_hop_ps", "link_bytes", "link_busy_ps", "route_ptr", "route_link", "route_lat",
    # per transfer (task id)
    "f_rem", "f_rate", "f_pos", "f_sent", "f_done_bytes",
    # active set and water-filling scratch (per link: counts, remaining capacity, transfer lists)
    "act", "cnt", "remcap", "touched", "blist", "lf_start", "lf_fill", "lf_flow",
    # packet model: per link next-free time; packet slots
    "link_free", "p_task", "p_hop", "p_bytes", "p_tail", "p_next_free",
    "sc", "fsc",  # int and float scalars (S_* and F_* below)
])


def new_fabric_state(link_cap: np.ndarray, link_hop_ps: np.ndarray, route_ptr: np.ndarray, route_link: np.ndarray, route_lat: np.ndarray,
                     task_capacity: int, mode: int, packet_bytes: int, packet_slots: int = 1024,
                     quantum_ps: int = 0, tolerance: float = 1e-9) -> FabricState:
    n_links = link_cap.shape[0]
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
        f_rem=np.zeros(task_capacity), f_rate=np.zeros(task_capacity),
        f_pos=np.full(task_capacity, -1, np.int64), f_sent=np.zeros(task_capacity, np.int64),
        f_done_bytes=np.zeros(task_capacity, np.int64),
        act=np.zeros(task_capacity, np.int64),
        cnt=np.zeros(n_links, np.int64), remcap=np.zeros(n_links), touched=np.zeros(n_links, np.int64),
        blist=np.zeros(n_links, np.int64), lf_start=np.zeros(n_links, np.int64), lf_fill=np.zeros(n_links, np.int64),
        lf_flow=np.zeros(task_capacity, np.int64),
        link_free=np.zeros(n_links, np.int64),
        p_task=np.zeros(packet_slots, np.int64), p_hop=np.zeros(packet_slots, np.int64),
        p_bytes=np.zeros(packet_slots, np.int64), p_tail=np.zeros(packet_slots, np.int64),
        p_next_free=np.arange(1, packet_slots + 1, dtype=np.int64),
        sc=sc, fsc=fsc,
    )
    st.p_next_free[-1] = -1
    st.sc[S_PKT_FREE] = 0
    return st


def grow_tasks(st: FabricState, capacity: int, max_route_links: int) -> FabricState:
    """Room for per-transfer state of ``capacity`` tasks whose routes have at most ``max_route_links``."""
    changes = {}
    if st.lf_flow.shape[0] < capacity * max_route_links:
        changes["lf_flow"] = np.zeros(max(capacity * max_route_links, 2 * st.lf_flow.shape[0]), np.int64)
    if st.f_rem.shape[0] >= capacity:
        return st._replace(**changes)
    for name, fill in (("f_rem", 0), ("f_rate", 0), ("f_pos", -1), ("f_sent", 0),
                       ("f_done_bytes", 0), ("act", 0)):
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
