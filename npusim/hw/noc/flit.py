"""Cycle-accurate, flit-level wormhole NoC model (state in numpy arrays, steps in Numba).

Model
-----
Every router has ``P = 5`` ports (local, N, E, S, W; see :mod:`.topology`), each with
``V`` virtual channels, and each VC a FIFO input buffer of ``B`` flits. Packets of ``F``
flits (head, body..., tail; a 1-flit packet is head and tail at once) are routed by a
table ``next_port[router, dest]`` (:mod:`.routing`). Units: everything is in router clock
cycles; one flit crosses one link per cycle (``flit_bytes = link width``).

Per cycle ``c`` (:func:`step`), in this order:

1. **Injection.** Each network interface (NI) takes the packet at the front of its
   infinite source FIFO and writes at most one flit into its router's local input
   port. A head flit claims a local-port VC (an empty one if any, else any with room,
   searched round-robin); later flits follow into the same VC while it has room. The
   local port's buffer state is visible to the NI without delay.
2. **Routers** (order-independent: nothing a router does is visible to another router
   in the same cycle). A flit written into an input buffer in cycle ``a`` is *ready* in
   cycle ``a + S`` (``S = router_stages``, the pipeline depth: route computation, VC and
   switch allocation, switch traversal). In its ready cycle or later:

   - *VC allocation* (head flits): look up the output port; claim a free VC of the
     downstream input port (the allowed VC class, see below), searching round-robin
     from a per-output pointer. A VC stays claimed until the packet's tail flit leaves
     (BookSim's ``wait_for_tail_credit = 0``: the next packet may share the downstream
     FIFO behind the tail).
   - *Switch allocation*: separable input-first round-robin, one iteration, pointers
     advanced only on a grant (iSLIP-1-like): each input port picks one ready VC that
     holds a VC and a credit for it; each output port grants one requesting input.
   - *Switch and link traversal*: a granted flit leaves its buffer, a credit goes back
     upstream and becomes usable there in cycle ``c + link_latency``, and the flit is
     written into the downstream buffer arriving in cycle ``c + link_latency``
     (so it is ready there in ``c + link_latency + S``). The ejection port (local
     output) always accepts one flit per cycle: a flit granted to it is ejected in ``c``.

   Credits are the *ready* half and the link's flit the *valid* half of the
   valid/ready handshake between neighbours: a flit is only sent with a credit in hand,
   so a buffer never overflows and no flit is ever dropped.

Virtual-channel classes: on topologies with dateline links (ring, torus) the VCs are
split into two classes; a packet uses class 0 after injection and after each change of
dimension, and class 1 after crossing a dateline link, which makes dimension-order
routing deadlock-free there (needs ``vcs >= 2``). On a mesh all VCs form one class.

Zero-load latency (exact, tested)
---------------------------------
A packet of ``F`` flits travelling ``H`` hops on an otherwise empty network, with
router pipeline ``S`` and link latency ``L`` (all links equal), created in cycle ``t0``:
its head is injected in ``t0``, ejected in ``t0 + (H+1)*S + H*L``, and the tail follows
``F - 1`` cycles later, so::

    latency = (H + 1) * S + H * L + F - 1      [cycles, creation to tail ejection]

(network and packet latency coincide at zero load). It holds whenever buffers never run
out of credits mid-packet, i.e. ``F <= B`` or ``B >= S + 2L`` (the credit round trip of
a link is ``S + 2L`` cycles; of the local port ``S + 1``).

Parameter mapping to BookSim2 (``src/booksim_config.cpp`` defaults in brackets)
-------------------------------------------------------------------------------
=====================  ==============================================================
npusim                 BookSim2
=====================  ==============================================================
``vcs``                ``num_vcs`` [16]
``buffer_flits``       ``vc_buf_size`` [8] (``buffer_policy = private``)
``router_stages``      ``routing_delay + vc_alloc_delay + sw_alloc_delay +
                       st_prepare_delay + st_final_delay`` [1+1+1+0+1 = 4]
``link_latency``       channel latency [1 on a mesh]; ``credit_delay`` [0]
packet size            ``const_flits_per_packet`` [1]
rate (flits/node/cy)   ``injection_rate`` x ``packet_size`` (BookSim counts packets
                       unless ``injection_rate_uses_flits = 1``)
allocators             ``vc_allocator = sw_allocator = islip``, ``alloc_iters = 1``,
                       round-robin arbiters [same]
source queueing        ``include_queuing = 1`` [same]; ``uniform`` includes the source
                       itself as a destination [same]
=====================  ==============================================================

Differences from BookSim2's ``iq_router`` that a side-by-side run will show: here
every flit (not just the head) spends ``S`` cycles in a router, VC and switch
allocation happen in the same (last) pipeline cycle, injection and ejection channels
add no latency, and there is no speculation, no output queue and no internal speedup.
So latency agrees in structure (per-hop cost ``S + L``) but not to the cycle.

Public interface for the event engine
-------------------------------------
``st = make_state(topo, routing, vcs, buffer_flits, router_stages)``; then, inside or
outside Numba: :func:`send_packet` (enqueue at a source NI), :func:`step` (advance one
cycle), :func:`run_cycles`, :func:`network_idle`; completions are read with
:func:`pop_completed` (tag and tail-ejection cycle of each finished packet).
"""

from __future__ import annotations

import time
from collections import namedtuple

import numba
import numpy as np

from npusim.errors import ConfigError, DeadlockError
from npusim.hw.noc.routing import Routing, build_routing
from npusim.hw.noc.topology import PORT_DIM, PORT_LOCAL, Topology, to_arrays
from npusim.hw.noc.traffic import DEST_HOTSPOT, DEST_TABLE, NocParams, NocResult, SyntheticTraffic, make_pattern

# ---- indices into st.cfg (constants of a state) ------------------------------------
C_R, C_P, C_V, C_B, C_S, C_NCLS, C_SQ, C_MAXPKT, C_RECORD_DONE, C_DONE_CAP, C_NLINKS = range(11)
_NCFG = 11
# ---- indices into st.ctr (counters, all cumulative since make_state) -----------------
(K_FLITS_CREATED, K_FLITS_INJ, K_FLITS_EJ, K_PKTS_CREATED, K_PKTS_DONE, K_ERRORS, K_SQ_OVERFLOW,
 K_DONE_OVERFLOW, K_LAST_CYCLE, K_LAST_PROGRESS, K_DONE_CNT, K_FREE_TOP, K_MEAS_CREATED,
 K_MEAS_DONE, K_SUM_PKT_LAT, K_SUM_NET_LAT, K_SUM_HOPS, K_MAX_PKT_LAT) = range(18)
_NCTR = 18

FlitState = namedtuple("FlitState", [
    "cfg", "ctr",
    # topology (flattened r * P + p) and routing
    "nbr_router", "nbr_port", "link_id", "up_router", "up_port", "up_link",
    "link_lat", "link_dateline", "port_dim", "next_port",
    # input buffers: per input VC iv = (r * P + p) * V + v, slots iv * B + i
    "buf_pkt", "buf_seq", "buf_ready", "vc_head", "vc_count", "vc_outport", "vc_outvc",
    "port_mask", "router_flits", "in_rr", "rot",
    # output side: per output VC ov = (r * P + o) * V + v
    "ovc_busy", "credits", "cq_time", "cq_head", "cq_cnt", "va_rr", "out_rr", "link_flits",
    # network interfaces (source queues)
    "sq_pkt", "sq_head", "sq_cnt", "ni_pkt", "ni_seq", "ni_vc", "ni_rr",
    # packet table (recycled slots)
    "pkt_src", "pkt_dst", "pkt_nflits", "pkt_create", "pkt_inject", "pkt_tag", "pkt_measure",
    "pkt_hops", "pkt_ejected", "free_stack",
    # completions for the caller, per-step scratch
    "done_tag", "done_time", "req_out", "req_vc",
])


def make_state(topo: Topology, routing: Routing, vcs: int, buffer_flits: int, router_stages: int,
               source_queue_packets: int = 256, done_capacity: int = 0) -> FlitState:
    """Allocate an empty network: all buffers empty, all credits available.

    ``vcs`` VCs per port (1..64), ``buffer_flits`` flits per VC, ``router_stages``
    cycles of router pipeline (>= 1); link latencies come from the topology.
    ``source_queue_packets`` bounds each NI's queue (a full queue refuses packets and is
    counted as an overflow). ``done_capacity > 0`` records completed packets for
    :func:`pop_completed` (needed by the event engine, not by synthetic runs).
    """
    R, P, V, B, S = topo.num_routers, topo.num_ports, int(vcs), int(buffer_flits), int(router_stages)
    if not 1 <= V <= 64:
        raise ConfigError(f"vcs must be in 1..64, got {vcs}")
    if B < 1:
        raise ConfigError(f"buffer_flits must be >= 1, got {buffer_flits}")
    if S < 1:
        raise ConfigError(f"router_stages must be >= 1, got {router_stages}")
    if source_queue_packets < 1:
        raise ConfigError(f"source_queue_packets must be >= 1, got {source_queue_packets}")
    ncls = 2 if topo.has_dateline else 1
    if V < ncls:
        raise ConfigError(f"the {topo.kind} topology needs >= 2 virtual channels (dateline classes), got {V}")
    if routing.topo is not topo:
        raise ConfigError("routing was built for a different topology")
    nvc, max_pkt = R * P * V, R * P * V * B + R * (source_queue_packets + 1)
    up_router = np.full(R * P, -1, np.int64)
    up_port = np.full(R * P, -1, np.int64)
    up_link = np.full(R * P, -1, np.int64)
    dst_ip = topo.link_dst * P + topo.link_dst_port
    up_router[dst_ip], up_port[dst_ip], up_link[dst_ip] = topo.link_src, topo.link_src_port, np.arange(topo.num_links)
    cfg = np.zeros(_NCFG, np.int64)
    cfg[[C_R, C_P, C_V, C_B, C_S, C_NCLS, C_SQ, C_MAXPKT, C_RECORD_DONE, C_DONE_CAP, C_NLINKS]] = (
        R, P, V, B, S, ncls, source_queue_packets, max_pkt, int(done_capacity > 0), max(1, done_capacity), topo.num_links)
    ctr = np.zeros(_NCTR, np.int64)
    ctr[K_FREE_TOP] = max_pkt
    ctr[K_LAST_CYCLE] = -1
    i64 = lambda n, fill=0: np.full(n, fill, np.int64)  # noqa: E731
    i32 = lambda n, fill=0: np.full(n, fill, np.int32)  # noqa: E731
    return FlitState(
        cfg=cfg, ctr=ctr,
        nbr_router=topo.nbr_router.ravel().copy(), nbr_port=topo.nbr_port.ravel().copy(),
        link_id=topo.link_id.ravel().copy(), up_router=up_router, up_port=up_port, up_link=up_link,
        link_lat=topo.link_latency_cycles.copy(), link_dateline=topo.link_dateline.astype(np.int8),
        port_dim=PORT_DIM.copy(), next_port=routing.next_port.astype(np.int8),
        buf_pkt=i32(nvc * B, -1), buf_seq=i32(nvc * B), buf_ready=i64(nvc * B), vc_head=i64(nvc), vc_count=i64(nvc),
        vc_outport=i64(nvc, -1), vc_outvc=i64(nvc, -1), port_mask=i64(R * P), router_flits=i64(R),
        in_rr=i64(R * P), rot=i64(R),
        ovc_busy=np.zeros(nvc, np.int8), credits=i64(nvc, B), cq_time=i64(nvc * B), cq_head=i64(nvc), cq_cnt=i64(nvc),
        va_rr=i64(R * P), out_rr=i64(R * P), link_flits=i64(topo.num_links),
        sq_pkt=i32(R * source_queue_packets, -1), sq_head=i64(R), sq_cnt=i64(R), ni_pkt=i64(R, -1), ni_seq=i64(R),
        ni_vc=i64(R, -1), ni_rr=i64(R),
        pkt_src=i32(max_pkt, -1), pkt_dst=i32(max_pkt, -1), pkt_nflits=i32(max_pkt), pkt_create=i64(max_pkt),
        pkt_inject=i64(max_pkt, -1), pkt_tag=i64(max_pkt, -1), pkt_measure=np.zeros(max_pkt, np.int8),
        pkt_hops=i32(max_pkt), pkt_ejected=i32(max_pkt), free_stack=np.arange(max_pkt, dtype=np.int32),
        done_tag=i64(max(1, done_capacity)), done_time=i64(max(1, done_capacity)),
        req_out=i64(P, -1), req_vc=i64(P, -1),
    )


def zero_load_latency_cycles(hops: int | np.ndarray, packet_flits: int, router_stages: int, link_latency_cycles: int):
    """``(H + 1) * S + H * L + F - 1``: creation to tail ejection on an empty network."""
    return (np.asarray(hops) + 1) * router_stages + np.asarray(hops) * link_latency_cycles + packet_flits - 1


# =====================================================================================
# Numba kernels
# =====================================================================================

@numba.njit(cache=True)
def send_packet(st, src, dst, nflits, cycle, tag, measure):
    """Enqueue a packet of ``nflits`` flits at NI ``src`` for ``dst``, created in ``cycle``.

    Returns its packet slot, or -1 if the source queue (or packet table) is full (the
    refusal is counted in ``ctr[K_SQ_OVERFLOW]``; nothing is enqueued).
    """
    sq = st.cfg[C_SQ]
    top = st.ctr[K_FREE_TOP]
    if st.sq_cnt[src] >= sq or top == 0:
        st.ctr[K_SQ_OVERFLOW] += 1
        return -1
    top -= 1
    st.ctr[K_FREE_TOP] = top
    pkt = st.free_stack[top]
    st.pkt_src[pkt] = src
    st.pkt_dst[pkt] = dst
    st.pkt_nflits[pkt] = nflits
    st.pkt_create[pkt] = cycle
    st.pkt_inject[pkt] = -1
    st.pkt_tag[pkt] = tag
    st.pkt_measure[pkt] = measure
    st.pkt_hops[pkt] = 0
    st.pkt_ejected[pkt] = 0
    pos = st.sq_head[src] + st.sq_cnt[src]
    if pos >= sq:
        pos -= sq
    st.sq_pkt[src * sq + pos] = pkt
    st.sq_cnt[src] += 1
    st.ctr[K_PKTS_CREATED] += 1
    st.ctr[K_FLITS_CREATED] += nflits
    if measure:
        st.ctr[K_MEAS_CREATED] += 1
    return pkt


@numba.njit(cache=True)
def _push_flit(st, r, ip, iv, pkt, seq, ready):
    """Append a flit to input VC ``iv`` (port ``ip`` of router ``r``); caller checked room."""
    B = st.cfg[C_B]
    cnt = st.vc_count[iv]
    pos = st.vc_head[iv] + cnt
    if pos >= B:
        pos -= B
    slot = iv * B + pos
    st.buf_pkt[slot] = pkt
    st.buf_seq[slot] = seq
    st.buf_ready[slot] = ready
    st.vc_count[iv] = cnt + 1
    st.port_mask[ip] |= np.int64(1) << (iv - ip * st.cfg[C_V])
    st.router_flits[r] += 1


@numba.njit(cache=True)
def _ni_pick_vc(st, r):
    """VC of router ``r``'s local input port for a new packet: an empty VC if any, else
    one with room, searched round-robin from the NI's pointer; -1 if all are full."""
    V, B, P = st.cfg[C_V], st.cfg[C_B], st.cfg[C_P]
    base = (r * P + PORT_LOCAL) * V
    start = st.ni_rr[r]
    best = -1
    for j in range(V):
        v = start + j
        if v >= V:
            v -= V
        cnt = st.vc_count[base + v]
        if cnt == 0:
            return v
        if best < 0 and cnt < B:
            best = v
    return best


@numba.njit(cache=True)
def _inject_phase(st, cycle):
    """Each NI writes at most one flit of its current packet into the local input port."""
    R, P, V, B, S, sq = st.cfg[C_R], st.cfg[C_P], st.cfg[C_V], st.cfg[C_B], st.cfg[C_S], st.cfg[C_SQ]
    for r in range(R):
        pkt = st.ni_pkt[r]
        if pkt < 0:
            if st.sq_cnt[r] == 0:
                continue
            h = st.sq_head[r]
            pkt = st.sq_pkt[r * sq + h]
            st.sq_head[r] = h + 1 if h + 1 < sq else 0
            st.sq_cnt[r] -= 1
            st.ni_pkt[r] = pkt
            st.ni_seq[r] = 0
        seq = st.ni_seq[r]
        ip = r * P + PORT_LOCAL
        if seq == 0:
            v = _ni_pick_vc(st, r)
            if v < 0:
                continue
            st.ni_vc[r] = v
            st.ni_rr[r] = v + 1 if v + 1 < V else 0
            st.pkt_inject[pkt] = cycle
        else:
            v = st.ni_vc[r]
            if st.vc_count[ip * V + v] >= B:
                continue
        _push_flit(st, r, ip, ip * V + v, pkt, seq, cycle + S)
        st.ctr[K_FLITS_INJ] += 1
        st.ctr[K_LAST_PROGRESS] = cycle
        seq += 1
        if seq == st.pkt_nflits[pkt]:
            st.ni_pkt[r] = -1
        else:
            st.ni_seq[r] = seq


@numba.njit(cache=True)
def _allocate_vc(st, r, p, v, iv, pkt):
    """Route a head flit and claim a downstream VC; returns the output port or -1."""
    P, V = st.cfg[C_P], st.cfg[C_V]
    o = np.int64(st.next_port[r, st.pkt_dst[pkt]])
    if o == PORT_LOCAL:
        st.vc_outport[iv] = o
        st.vc_outvc[iv] = 0
        return o
    op = r * P + o
    lo, hi = 0, V
    if st.cfg[C_NCLS] > 1:
        half = V // 2
        cls = 0
        if st.link_dateline[st.link_id[op]]:
            cls = 1
        elif p != PORT_LOCAL and st.port_dim[p] == st.port_dim[o] and v >= half:
            cls = 1
        if cls == 0:
            hi = half
        else:
            lo = half
    n = hi - lo
    start = st.va_rr[op]
    if start < lo or start >= hi:
        start = lo
    base = op * V
    for j in range(n):
        dv = start + j
        if dv >= hi:
            dv -= n
        if st.ovc_busy[base + dv] == 0:
            st.ovc_busy[base + dv] = 1
            st.va_rr[op] = dv + 1 if dv + 1 < V else 0
            st.vc_outport[iv] = o
            st.vc_outvc[iv] = dv
            return o
    return -1


@numba.njit(cache=True)
def _has_credit(st, ov, cycle):
    """Collect credits that have arrived by ``cycle`` for output VC ``ov``; any left?"""
    cnt = st.cq_cnt[ov]
    if cnt > 0:
        B = st.cfg[C_B]
        h = st.cq_head[ov]
        while cnt > 0 and st.cq_time[ov * B + h] <= cycle:
            h += 1
            if h == B:
                h = 0
            cnt -= 1
            st.credits[ov] += 1
        st.cq_head[ov] = h
        st.cq_cnt[ov] = cnt
    return st.credits[ov] > 0


@numba.njit(cache=True)
def _complete(st, pkt, cycle):
    """Tail ejected: account the packet and free its slot."""
    st.ctr[K_PKTS_DONE] += 1
    if st.pkt_measure[pkt]:
        lat = cycle - st.pkt_create[pkt]
        st.ctr[K_MEAS_DONE] += 1
        st.ctr[K_SUM_PKT_LAT] += lat
        st.ctr[K_SUM_NET_LAT] += cycle - st.pkt_inject[pkt]
        st.ctr[K_SUM_HOPS] += st.pkt_hops[pkt]
        if lat > st.ctr[K_MAX_PKT_LAT]:
            st.ctr[K_MAX_PKT_LAT] = lat
    if st.cfg[C_RECORD_DONE]:
        n = st.ctr[K_DONE_CNT]
        if n < st.cfg[C_DONE_CAP]:
            st.done_tag[n] = st.pkt_tag[pkt]
            st.done_time[n] = cycle
            st.ctr[K_DONE_CNT] = n + 1
        else:
            st.ctr[K_DONE_OVERFLOW] += 1
    st.pkt_src[pkt] = -1
    top = st.ctr[K_FREE_TOP]
    st.free_stack[top] = pkt
    st.ctr[K_FREE_TOP] = top + 1


@numba.njit(cache=True)
def _traverse(st, r, p, v, o, cycle):
    """Move the front flit of input VC ``v`` at port ``p`` of router ``r`` through output ``o``."""
    P, V, B, S = st.cfg[C_P], st.cfg[C_V], st.cfg[C_B], st.cfg[C_S]
    ip = r * P + p
    iv = ip * V + v
    h = st.vc_head[iv]
    slot = iv * B + h
    pkt = st.buf_pkt[slot]
    seq = st.buf_seq[slot]
    st.vc_head[iv] = h + 1 if h + 1 < B else 0
    cnt = st.vc_count[iv] - 1
    st.vc_count[iv] = cnt
    if cnt == 0:
        st.port_mask[ip] &= ~(np.int64(1) << v)
    st.router_flits[r] -= 1
    if p != PORT_LOCAL:  # return a credit upstream, usable after the link latency
        ov = (st.up_router[ip] * P + st.up_port[ip]) * V + v
        pos = st.cq_head[ov] + st.cq_cnt[ov]
        if pos >= B:
            pos -= B
        st.cq_time[ov * B + pos] = cycle + st.link_lat[st.up_link[ip]]
        st.cq_cnt[ov] += 1
    tail = seq == st.pkt_nflits[pkt] - 1
    if o == PORT_LOCAL:
        if seq != st.pkt_ejected[pkt] or st.pkt_dst[pkt] != r:
            st.ctr[K_ERRORS] += 1
        st.pkt_ejected[pkt] += 1
        st.ctr[K_FLITS_EJ] += 1
        if tail:
            _complete(st, pkt, cycle)
    else:
        op = r * P + o
        k = st.link_id[op]
        dv = st.vc_outvc[iv]
        ov = op * V + dv
        dr = st.nbr_router[op]
        dip = dr * P + st.nbr_port[op]
        _push_flit(st, dr, dip, dip * V + dv, pkt, seq, cycle + st.link_lat[k] + S)
        st.credits[ov] -= 1
        st.link_flits[k] += 1
        if seq == 0:
            st.pkt_hops[pkt] += 1
        if tail:
            st.ovc_busy[ov] = 0
    if tail:
        st.vc_outport[iv] = -1
        st.vc_outvc[iv] = -1
    st.ctr[K_LAST_PROGRESS] = cycle


@numba.njit(cache=True)
def _router_cycle(st, r, cycle):
    """VC allocation, switch allocation and traversal of one router in one cycle."""
    P, V, B = st.cfg[C_P], st.cfg[C_V], st.cfg[C_B]
    rot = st.rot[r]
    st.rot[r] = rot + 1 if rot + 1 < P else 0
    req_out, req_vc = st.req_out, st.req_vc
    requested = 0  # bitmask of requested output ports
    for k in range(P):
        p = rot + k
        if p >= P:
            p -= P
        ip = r * P + p
        req_out[p] = -1
        m = st.port_mask[ip]
        if m == 0:
            continue
        start = st.in_rr[ip]
        cand, cand_out = -1, -1
        for j in range(V):
            v = start + j
            if v >= V:
                v -= V
            if (m >> v) & 1 == 0:
                continue
            iv = ip * V + v
            slot = iv * B + st.vc_head[iv]
            if st.buf_ready[slot] > cycle:
                continue
            o = st.vc_outport[iv]
            if o < 0:
                o = _allocate_vc(st, r, p, v, iv, st.buf_pkt[slot])
                if o < 0:
                    continue
            if cand >= 0:
                continue  # already have this port's request; kept scanning only for VA
            if o != PORT_LOCAL and not _has_credit(st, (r * P + o) * V + st.vc_outvc[iv], cycle):
                continue
            cand, cand_out = v, o
        if cand >= 0:
            req_out[p] = cand_out
            req_vc[p] = cand
            requested |= 1 << cand_out
    if requested == 0:
        return
    for o in range(P):
        if (requested >> o) & 1 == 0:
            continue
        op = r * P + o
        start = st.out_rr[op]
        for j in range(P):
            p = start + j
            if p >= P:
                p -= P
            if req_out[p] == o:
                st.out_rr[op] = p + 1 if p + 1 < P else 0
                v = req_vc[p]
                st.in_rr[r * P + p] = v + 1 if v + 1 < V else 0
                _traverse(st, r, p, v, o, cycle)
                break


@numba.njit(cache=True)
def step(st, cycle):
    """Advance the network by exactly one cycle (``cycle`` must increase by 1 per call)."""
    _inject_phase(st, cycle)
    rf = st.router_flits
    for r in range(st.cfg[C_R]):
        if rf[r] > 0:
            _router_cycle(st, r, cycle)
    st.ctr[K_LAST_CYCLE] = cycle


@numba.njit(cache=True)
def flits_in_network(st):
    """Flits sitting in input buffers (including those still on a link)."""
    return st.ctr[K_FLITS_INJ] - st.ctr[K_FLITS_EJ]


@numba.njit(cache=True)
def network_idle(st):
    """True when no packet is queued, being injected or in the network."""
    return st.ctr[K_PKTS_CREATED] == st.ctr[K_PKTS_DONE]


@numba.njit(cache=True)
def run_cycles(st, first_cycle, ncycles, stop_when_idle):
    """Step cycles ``first_cycle .. first_cycle + ncycles - 1``; return the next cycle.

    With ``stop_when_idle`` it returns early as soon as the network is idle.
    """
    cycle = first_cycle
    end = first_cycle + ncycles
    while cycle < end:
        if stop_when_idle and network_idle(st):
            break
        step(st, cycle)
        cycle += 1
    return cycle


# ---- synthetic traffic --------------------------------------------------------------
# indices into the ``out`` array of run_synthetic
(O_CYCLES, O_WIN_FLITS_CREATED, O_WIN_FLITS_EJ, O_WIN_BACKLOG_START, O_WIN_BACKLOG_END, O_DRAINED,
 O_OVERFLOW, O_DEADLOCK, O_MAX_QUEUE) = range(9)
_NOUT = 9


@numba.njit(cache=True)
def _pick_dest(r, n, kind, cand_ptr, cand_idx, hot_nodes, hot_frac):
    if kind == DEST_TABLE:
        lo = cand_ptr[r]
        cnt = cand_ptr[r + 1] - lo
        if cnt == 1:
            return cand_idx[lo]
        return cand_idx[lo + np.random.randint(0, cnt)]
    if kind == DEST_HOTSPOT and np.random.random() < hot_frac:
        return hot_nodes[np.random.randint(0, hot_nodes.size)]
    return np.random.randint(0, n)


@numba.njit(cache=True)
def _backlog_flits(st):
    """Flits created but not yet ejected (source queues + NIs + network)."""
    return st.ctr[K_FLITS_CREATED] - st.ctr[K_FLITS_EJ]


@numba.njit(cache=True)
def run_synthetic(st, kind, cand_ptr, cand_idx, hot_nodes, hot_frac, pkt_prob, nflits,
                  warmup, measure, drain_max, deadlock_cycles, seed, link_window, out):
    """Warm-up, measurement and drain phases of a synthetic-traffic run on a fresh state.

    Every cycle each node creates a packet of ``nflits`` flits with probability
    ``pkt_prob`` (Bernoulli; ``rate / nflits``) for a destination drawn by
    :func:`_pick_dest`. Packets created in ``[warmup, warmup + measure)`` are measured.
    Traffic keeps being generated after the window until every measured packet has
    arrived (drained) or ``drain_max`` cycles pass. The run also stops on a
    source-queue overflow or when no flit moves for ``deadlock_cycles`` cycles while
    flits are in the network. Per-link flit counts in the window go to ``link_window``,
    summary counts to ``out`` (``O_*`` indices).
    """
    np.random.seed(seed)
    n = st.cfg[C_R]
    start_meas, end_meas = warmup, warmup + measure
    cycle = 0
    max_queue = 0
    while True:
        if cycle == start_meas:
            link_window[:] = -st.link_flits
            out[O_WIN_FLITS_CREATED] = -st.ctr[K_FLITS_CREATED]
            out[O_WIN_FLITS_EJ] = -st.ctr[K_FLITS_EJ]
            out[O_WIN_BACKLOG_START] = _backlog_flits(st)
        if cycle == end_meas:
            link_window += st.link_flits
            out[O_WIN_FLITS_CREATED] += st.ctr[K_FLITS_CREATED]
            out[O_WIN_FLITS_EJ] += st.ctr[K_FLITS_EJ]
            out[O_WIN_BACKLOG_END] = _backlog_flits(st)
        if cycle >= end_meas and st.ctr[K_MEAS_DONE] == st.ctr[K_MEAS_CREATED]:
            out[O_DRAINED] = 1
            break
        if cycle >= end_meas + drain_max:
            break
        measured = 1 if (cycle >= start_meas and cycle < end_meas) else 0
        for r in range(n):
            if np.random.random() < pkt_prob:
                d = _pick_dest(r, n, kind, cand_ptr, cand_idx, hot_nodes, hot_frac)
                if send_packet(st, r, d, nflits, cycle, -1, measured) < 0:
                    out[O_OVERFLOW] = 1
                if st.sq_cnt[r] > max_queue:
                    max_queue = st.sq_cnt[r]
        if out[O_OVERFLOW]:
            break
        step(st, cycle)
        cycle += 1
        if cycle - st.ctr[K_LAST_PROGRESS] > deadlock_cycles and flits_in_network(st) > 0:
            out[O_DEADLOCK] = 1
            break
    out[O_CYCLES] = cycle
    out[O_MAX_QUEUE] = max_queue
    return cycle


# =====================================================================================
# Python-side helpers
# =====================================================================================

def send(st: FlitState, src: int, dst: int, nflits: int, cycle: int, tag: int) -> int:
    """Python wrapper of :func:`send_packet` with argument checks; returns the packet slot.

    Raises ConfigError on bad arguments or a full source queue (enlarge
    ``source_queue_packets`` in :func:`make_state`).
    """
    n = int(st.cfg[C_R])
    if not (0 <= src < n and 0 <= dst < n):
        raise ConfigError(f"send: src {src} / dst {dst} outside 0..{n - 1}")
    if nflits < 1:
        raise ConfigError(f"send: a packet needs >= 1 flit, got {nflits}")
    slot = send_packet(st, src, dst, nflits, cycle, tag, 0)
    if slot < 0:
        raise ConfigError(f"send: source queue of node {src} is full ({int(st.cfg[C_SQ])} packets)")
    return int(slot)


def pop_completed(st: FlitState) -> tuple[np.ndarray, np.ndarray]:
    """Tags and tail-ejection cycles of packets completed since the last call."""
    if st.ctr[K_DONE_OVERFLOW]:
        raise DeadlockError("flit NoC: the completion buffer overflowed; pop completions more often "
                            "or raise done_capacity")
    n = int(st.ctr[K_DONE_CNT])
    tags, times = st.done_tag[:n].copy(), st.done_time[:n].copy()
    st.ctr[K_DONE_CNT] = 0
    return tags, times


def conservation(st: FlitState) -> dict:
    """Flit and packet accounting; ``ok`` is False if anything was lost, duplicated or misdelivered."""
    ctr = st.ctr
    in_buffers = int(st.vc_count.sum())
    queued = int(st.sq_cnt.sum())
    at_ni = int((st.ni_pkt >= 0).sum())
    live_slots = int(st.cfg[C_MAXPKT] - ctr[K_FREE_TOP])
    report = {
        "flits_created": int(ctr[K_FLITS_CREATED]),
        "flits_injected": int(ctr[K_FLITS_INJ]),
        "flits_ejected": int(ctr[K_FLITS_EJ]),
        "flits_in_buffers": in_buffers,
        "packets_created": int(ctr[K_PKTS_CREATED]),
        "packets_done": int(ctr[K_PKTS_DONE]),
        "packets_live": live_slots,
        "delivery_errors": int(ctr[K_ERRORS]),
    }
    report["ok"] = bool(
        ctr[K_FLITS_INJ] == ctr[K_FLITS_EJ] + in_buffers
        and ctr[K_PKTS_CREATED] == ctr[K_PKTS_DONE] + live_slots
        and live_slots >= queued + at_ni
        and ctr[K_ERRORS] == 0
        and np.all(st.credits >= 0)
        and np.all(st.credits + st.cq_cnt + _downstream_counts(st) == st.cfg[C_B])
    )
    return report


def _downstream_counts(st: FlitState) -> np.ndarray:
    """For every output VC: flits held in the downstream buffer it feeds (0 for unused)."""
    P, V = int(st.cfg[C_P]), int(st.cfg[C_V])
    ops = np.arange(st.nbr_router.size)
    counts = np.zeros(st.credits.size, np.int64)
    has = st.nbr_router >= 0
    has[::P] = False  # local (ejection) ports have no downstream buffer
    for op in ops[has]:
        dip = st.nbr_router[op] * P + st.nbr_port[op]
        counts[op * V:(op + 1) * V] = st.vc_count[dip * V:(dip + 1) * V]
    unused = np.repeat(~has, V)
    counts[unused] = st.cfg[C_B] - st.credits[unused] - st.cq_cnt[unused]
    return counts


#: cycles without any flit moving, with flits in the network, that count as a deadlock
DEADLOCK_CYCLES = 10_000
#: a window backlog growth above this fraction of the flits offered in it means saturation
BACKLOG_GROWTH_LIMIT = 0.05


def simulate_flit(params: NocParams, traffic: SyntheticTraffic) -> NocResult:
    """Run one synthetic-traffic experiment on the flit-level model (the ``flit`` fidelity).

    Saturation is declared (``saturated=True`` with a reason) when a source queue
    overflows, when the measured packets do not drain within ``drain_cycles_max``, or
    when the backlog of created-but-undelivered flits grows during the measurement
    window by more than 5 % of the flits offered in it (plus ``2 * nodes * F`` flits of
    slack for fluctuations). Raises DeadlockError if the network stops moving.
    """
    topo = to_arrays(params.build_graph())
    routing = build_routing(topo, params.routing)
    pattern = make_pattern(traffic.pattern, topo, traffic.hotspot_nodes, traffic.hotspot_fraction)
    st = make_state(topo, routing, params.vcs, params.buffer_flits, params.router_stages, traffic.source_queue_packets)
    link_window = np.zeros(topo.num_links, np.int64)
    out = np.zeros(_NOUT, np.int64)
    t0 = time.perf_counter()
    run_synthetic(st, pattern.kind, pattern.cand_ptr, pattern.cand_idx, pattern.hot_nodes, pattern.hot_fraction,
                  traffic.packet_probability, traffic.packet_flits, traffic.warmup_cycles, traffic.measure_cycles,
                  traffic.drain_cycles, DEADLOCK_CYCLES, traffic.seed, link_window, out)
    wall = time.perf_counter() - t0
    check = conservation(st)
    if not check["ok"]:
        raise AssertionError(f"flit NoC lost or duplicated flits (a bug): {check}")
    if out[O_DEADLOCK]:
        raise DeadlockError(f"flit NoC: no flit moved for {DEADLOCK_CYCLES} cycles with "
                            f"{int(flits_in_network(st))} flits in the network ({params.routing} routing on {params.label})")
    return _result(params, traffic, topo, routing, pattern, st, out, link_window, wall)


def _saturation_reason(traffic: SyntheticTraffic, n: int, out: np.ndarray) -> str:
    if out[O_OVERFLOW]:
        return f"a source queue overflowed ({traffic.source_queue_packets} packets)"
    if out[O_WIN_FLITS_CREATED] == 0 and out[O_CYCLES] < traffic.warmup_cycles + traffic.measure_cycles:
        return "stopped before the measurement window"
    growth = int(out[O_WIN_BACKLOG_END] - out[O_WIN_BACKLOG_START])
    if growth > BACKLOG_GROWTH_LIMIT * out[O_WIN_FLITS_CREATED] + 2 * n * traffic.packet_flits:
        return f"undelivered flits grew by {growth} during the measurement window"
    if not out[O_DRAINED]:
        return f"measured packets did not drain within {traffic.drain_cycles} cycles"
    return ""


def _result(params, traffic, topo, routing, pattern, st, out, link_window, wall) -> NocResult:
    n, ctr = topo.num_routers, st.ctr
    window = n * traffic.measure_cycles
    done = int(ctr[K_MEAS_DONE])
    avg = (lambda key: float(ctr[key]) / done) if done else (lambda key: float("nan"))
    hops = routing.hop_matrix()
    t0 = zero_load_latency_cycles(hops, traffic.packet_flits, params.router_stages, params.link_latency_cycles)
    reason = _saturation_reason(traffic, n, out)
    return NocResult(
        fidelity="flit",
        topology=params.label,
        pattern=pattern.name,
        packet_flits=traffic.packet_flits,
        offered_flits_per_node_cycle=float(traffic.rate),
        generated_flits_per_node_cycle=float(out[O_WIN_FLITS_CREATED]) / window,
        accepted_flits_per_node_cycle=float(out[O_WIN_FLITS_EJ]) / window,
        avg_packet_latency_cycles=avg(K_SUM_PKT_LAT),
        avg_network_latency_cycles=avg(K_SUM_NET_LAT),
        max_packet_latency_cycles=float(ctr[K_MAX_PKT_LAT]) if done else float("nan"),
        avg_hops=avg(K_SUM_HOPS),
        zero_load_latency_cycles=float((pattern.destination_probabilities() * t0).sum() / n),
        packets_measured=int(ctr[K_MEAS_CREATED]),
        packets_delivered=done,
        saturated=bool(reason),
        saturation_reason=reason,
        cycles_simulated=int(out[O_CYCLES]),
        wall_seconds=wall,
        link_utilization=link_window / float(traffic.measure_cycles),
        link_names=[topo.link_name(k) for k in range(topo.num_links)],
        params=dict(routers=n, vcs=params.vcs, buffer_flits=params.buffer_flits, router_stages=params.router_stages,
                    link_latency_cycles=params.link_latency_cycles, flit_bytes=params.flit_bytes,
                    routing=params.routing, warmup_cycles=traffic.warmup_cycles,
                    measure_cycles=traffic.measure_cycles, seed=traffic.seed,
                    max_source_queue_packets=int(out[O_MAX_QUEUE])),
    )
