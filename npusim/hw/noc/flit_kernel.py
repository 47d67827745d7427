"""Numba kernels of the flit-level NoC model; the model itself is described in
:mod:`npusim.hw.noc.flit` (read that first). Everything here works on the
:class:`FlitState` tables, all int64 unless noted, indexed as follows
(``P`` ports, ``V`` VCs per port, ``B`` flits per VC buffer):

``cfg[C_*]``                constants of the network (sizes, pipeline depth...)
``ctr[K_*]``                cumulative counters (flits, packets, latency sums...)
``vc[(r*P+p)*V+v, VC_*]``   per VC of port ``p`` of router ``r``: as an *input* VC its FIFO
                            (head, count) and the output port / downstream VC held by the
                            packet at its front; as an *output* VC (``p`` an output port)
                            whether it is claimed and its credits, with a FIFO of credits
                            still on their way back (``OV_CQ_*``)
``slot[vcid*B+i, SL_*]``    input-buffer flit slots (packet, sequence number, ready cycle)
                            and, in ``SL_CQ_TIME``, the credit-return FIFO of output VC ``vcid``
``port[r*P+p, PT_*]``       link wiring (downstream input port, upstream output port,
                            latencies, dateline flag), non-empty-VC bitmask, round-robin
                            pointers, flits sent on the output link
``node[r, ND_*]``           flits buffered in the router, the earliest cycle the router can act
                            (``ND_WAKE``), NI state, source-queue ring pointers, the memory port
                            (``ND_MEM_LANES`` lanes, round-robin pointer, flits ejected there),
                            the memory injection lanes (``ND_MINJ_LANES``, how many hold a packet,
                            flits they injected) and the memory's source-queue ring pointers
``sq[r*SQ+i]``              source-queue rings of packet ids (the NIs')
``msq[r*SQ+i]``             the memories' source-queue rings (:func:`send_packet_from_mem`)
``lane[r*MINJ_LANES_MAX+l, LN_*]``  memory injection lane ``l`` of router ``r``: its packet, next
                            flit, the cycle that flit is ready, output port and downstream VC
``pkt[k, PK_*]``            packet table (recycled rows; ``free`` is the stack of free rows);
                            ``PK_MEM`` marks a packet for its destination's memory port
``next_port[r, d]``         int8 routing table (a 1x1 placeholder when routing is computed)
``rt``                      routing parameters (see :func:`_route`)
``done[i, 0|1]``            (tag, tail-ejection cycle) of completed packets, when recorded
``scr[2*i], scr[2*i+1]``    scratch of the BookSim-mode VC allocator (requesting VC, grants);
                            ``scr[o]``: the default mode's, output ``o``'s VC requesters

Performance notes (found by inspecting the LLVM IR and profiling with perf):

- Kernels are compiled with ``_nrt=False``: they never allocate, and Numba's
  reference counting of array arguments (which its pruning pass fails to remove in
  functions with branches) cost two atomic operations per array per call -- it made the
  model 3x slower. Hot leaf helpers are inlined at the Numba IR level.
- A router is only visited in cycles where a flit at one of its VC fronts can be ready
  (``ND_WAKE``; pushing a flit into an empty VC lowers it). In the cycles skipped no flit
  could move there, and no allocator's pointer moves either: the same results as visiting every
  cycle. Worth ~15 % at low load (what the event engine mostly sees), nothing measurable at mid
  load.
"""

from __future__ import annotations

from collections import namedtuple

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
import numba
import numpy as np

from npusim.hw.noc.topology import PORT_DIM, PORT_E, PORT_LOCAL, PORT_N, PORT_S, PORT_W

# ---- cfg: constants ------------------------------------------------------------------
C_R, C_P, C_V, C_B, C_S, C_NCLS, C_SQ, C_MAXPKT, C_RECORD_DONE, C_DONE_CAP, C_BOOKSIM = range(11)
NCFG = 11
# ---- ctr: counters, cumulative since make_state ----------------------------------------
(K_FLITS_CREATED, K_FLITS_INJ, K_FLITS_EJ, K_PKTS_CREATED, K_PKTS_DONE, K_ERRORS, K_SQ_OVERFLOW,
 K_DONE_OVERFLOW, K_LAST_CYCLE, K_LAST_PROGRESS, K_DONE_CNT, K_FREE_TOP, K_MEAS_CREATED,
 K_MEAS_DONE, K_SUM_PKT_LAT, K_SUM_NET_LAT, K_SUM_HOPS, K_MAX_PKT_LAT, K_MEM_EJ, K_MEM_INJ) = range(20)
NCTR = 20  # K_MEM_EJ / K_MEM_INJ: flits ejected at memory ports / injected by memory lanes (also in K_FLITS_EJ / _INJ)
# ---- vc columns ------------------------------------------------------------------------
(VC_HEAD, VC_COUNT, VC_OUTPORT, VC_OUTVC, OV_BUSY, OV_CREDITS, OV_CQ_HEAD, OV_CQ_CNT, VC_APTR, OV_GPTR,
 OV_FREE_AT) = range(11)
# BookSim mode: VC_APTR / OV_GPTR are the iSLIP accept / grant pointers of the VC allocator;
# OV_FREE_AT the first cycle a released output VC may be claimed again
NVCF = 11
# ---- slot columns ----------------------------------------------------------------------
SL_PKT, SL_SEQ, SL_READY, SL_CQ_TIME = range(4)
NSLF = 4
# ---- port columns ----------------------------------------------------------------------
(PT_DOWN_IN, PT_LINK, PT_LAT, PT_DATELINE, PT_UP_OUT, PT_UP_LAT, PT_MASK, PT_IN_RR, PT_VA_RR,
 PT_OUT_RR, PT_FLITS, PT_ACC_RR, PT_VA_IN_RR, PT_SREQ) = range(14)
# PT_VA_IN_RR (of an output): the requester (input port, or P + memory injection lane) its VC
# allocation serves first, round-robin
NPTF = PT_SREQ + 5  # PT_SREQ + o: the VC of this input port requesting output o (BookSim mode), -1 if none
# ---- node columns ----------------------------------------------------------------------
(ND_FLITS, ND_SQ_HEAD, ND_SQ_CNT, ND_NI_PKT, ND_NI_SEQ, ND_NI_VC, ND_NI_RR, ND_WAKE, ND_MEM_LANES,
 ND_MEM_RR, ND_MEM_FLITS, ND_MINJ_LANES, ND_MSQ_HEAD, ND_MSQ_CNT, ND_MINJ_BUSY, ND_MINJ_FLITS) = range(16)
NNDF = 16
# ND_MINJ_LANES: memory injection lanes (min(ND_MEM_LANES, MINJ_LANES_MAX)); ND_MSQ_*: the memory's
# source-queue ring (in ``msq``); ND_MINJ_BUSY: lanes holding a packet; ND_MINJ_FLITS: flits they injected
# ---- pkt columns -----------------------------------------------------------------------
PK_SRC, PK_DST, PK_NFLITS, PK_CREATE, PK_INJECT, PK_TAG, PK_MEASURE, PK_HOPS, PK_EJECTED, PK_MEM = range(10)
NPKF = 10
# the memory-controller port of a router, as an output in a switch request (3 bits: above any
# topology's ports, which are < 7): packets with PK_MEM leave there at their destination, up to
# ND_MEM_LANES flits a cycle from different input ports; no VC or credit (always accepting)
PORT_MEMC = 7
# ---- lane columns: memory injection lanes, row r * MINJ_LANES_MAX + l ----------------------
# the packet a lane injects (-1: free), its next flit, the cycle that flit is ready for switch
# allocation, the output port and downstream VC the packet holds (-1: not allocated yet)
LN_PKT, LN_SEQ, LN_READY, LN_OUT, LN_OUTVC = range(5)
NLNF = 5
MINJ_LANES_MAX = 15  # 4 bits a lane in a router's lane-request word (valid | out << 1)
NEVER = np.int64(2**62)  # a wake-up cycle that never comes
# a switch request of input port p: bits [REQ_BITS*p, REQ_BITS*(p+1)) = valid | out << 1 | vc << 4
REQ_BITS = 10

FlitState = namedtuple("FlitState", ["cfg", "ctr", "vc", "slot", "port", "node", "sq", "pkt", "free",
                                     "next_port", "done", "scr", "rt", "msq", "lane"])


# =====================================================================================
# Source queues and injection
# =====================================================================================

@numba.njit(cache=True, _nrt=False)
def enqueue_packet(cfg, ctr, node, sq, pkt, free, src, dst, nflits, cycle, tag, measure):
    """Append a new packet to NI ``src``'s source queue; return its row or -1 if full."""
    return _enqueue_into(cfg, ctr, node, sq, ND_SQ_HEAD, ND_SQ_CNT, pkt, free, src, dst, nflits, cycle, tag, measure)


@numba.njit(cache=True, _nrt=False, inline="always")
def _enqueue_into(cfg, ctr, node, sq, col_head, col_cnt, pkt, free, src, dst, nflits, cycle, tag, measure):
    """Append a new packet to router ``src``'s ring ``sq`` (pointers in ``node[src, col_head |
    col_cnt]``: the NI's source queue, or the memory's); return its row or -1 if full."""
    sqcap = cfg[C_SQ]
    top = ctr[K_FREE_TOP]
    cnt = node[src, col_cnt]
    if cnt >= sqcap or top == 0:
        ctr[K_SQ_OVERFLOW] += 1
        return -1
    top -= 1
    ctr[K_FREE_TOP] = top
    k = free[top]
    pkt[k, PK_SRC] = src
    pkt[k, PK_DST] = dst
    pkt[k, PK_NFLITS] = nflits
    pkt[k, PK_CREATE] = cycle
    pkt[k, PK_INJECT] = -1
    pkt[k, PK_TAG] = tag
    pkt[k, PK_MEASURE] = measure
    pkt[k, PK_HOPS] = 0
    pkt[k, PK_EJECTED] = 0
    pkt[k, PK_MEM] = 0
    pos = node[src, col_head] + cnt
    if pos >= sqcap:
        pos -= sqcap
    sq[src * sqcap + pos] = k
    node[src, col_cnt] = cnt + 1
    ctr[K_PKTS_CREATED] += 1
    ctr[K_FLITS_CREATED] += nflits
    if measure:
        ctr[K_MEAS_CREATED] += 1
    return k


@numba.njit(cache=True, _nrt=False, inline="always")
def _push_flit(vc, slot, port, node, B, r, ip, v, iv, k, seq, ready):
    """Append flit ``seq`` of packet ``k`` to input VC ``iv`` (VC ``v`` of input port ``ip``
    of router ``r``), ready for switch allocation in cycle ``ready``; room was checked."""
    cnt = vc[iv, VC_COUNT]
    pos = vc[iv, VC_HEAD] + cnt
    if pos >= B:
        pos -= B
    s = iv * B + pos
    slot[s, SL_PKT] = k
    slot[s, SL_SEQ] = seq
    slot[s, SL_READY] = ready
    vc[iv, VC_COUNT] = cnt + 1
    port[ip, PT_MASK] |= np.int64(1) << v
    node[r, ND_FLITS] += 1
    if cnt == 0 and ready < node[r, ND_WAKE]:
        node[r, ND_WAKE] = ready  # the flit is at its VC's front: the router must look at it then


@numba.njit(cache=True, _nrt=False)
def _ni_pick_vc(vc, V, B, base, start):
    """Local-port VC for a new packet: the first empty VC from ``start`` (round-robin),
    else the first with room; -1 if all are full."""
    best = -1
    for j in range(V):
        v = start + j
        if v >= V:
            v -= V
        cnt = vc[base + v, VC_COUNT]
        if cnt == 0:
            return v
        if best < 0 and cnt < B:
            best = v
    return best


@numba.njit(cache=True, _nrt=False, inline="always")
def _ni_first_with_room(vc, V, B, base, start):
    """BookSim mode: local-port VC for a new packet, as ``TrafficManager::_Step`` picks it: the
    VCs in round-robin order from ``start`` (the one after ``_last_vc``), the first that is not
    full (``IsFullFor``; at an NI every VC is free for a new packet, since with
    ``wait_for_tail_credit = 0`` its own previous tail released it); -1 if all are full."""
    for j in range(V):
        v = start + j
        if v >= V:
            v -= V
        if vc[base + v, VC_COUNT] < B:
            return v
    return -1


@numba.njit(cache=True, _nrt=False)
def _ni_next_packet(node, sq, sqcap, r):
    """Pop the next packet of NI ``r``'s source queue into the NI (-1 if none)."""
    if node[r, ND_SQ_CNT] == 0:
        return -1
    return _ni_next_packet_from(node, sq, ND_SQ_HEAD, ND_SQ_CNT, sqcap, r)


@numba.njit(cache=True, _nrt=False, inline="always")
def _ni_next_packet_from(node, ring, col_head, col_cnt, sqcap, r):
    """Pop the next packet of router ``r``'s ring ``ring`` (pointers in ``node[r, col_head |
    col_cnt]``, not empty) into the NI."""
    h = node[r, col_head]
    k = ring[r * sqcap + h]
    node[r, col_head] = h + 1 if h + 1 < sqcap else 0
    node[r, col_cnt] -= 1
    node[r, ND_NI_PKT] = k
    node[r, ND_NI_SEQ] = 0
    return k


@numba.njit(cache=True, _nrt=False, inline="always")
def _body_stages(S):
    """BookSim mode: router cycles of a body or tail flit (switch allocation + switch
    traversal; route computation and VC allocation are the head's alone)."""
    return S if S < 2 else 2


@numba.njit(cache=True, _nrt=False, inline="always")
def _lane_load(node, msq, lane, pkt, sqcap, S, r, row, cycle):
    """Lane ``row`` of router ``r`` takes the next packet of the memory's source queue (not
    empty), entering the router's pipeline in ``cycle``: its head is ready for switch allocation
    ``S`` cycles later, as a flit the NI writes into the local input port is."""
    h = node[r, ND_MSQ_HEAD]
    k = msq[r * sqcap + h]
    node[r, ND_MSQ_HEAD] = h + 1 if h + 1 < sqcap else 0
    node[r, ND_MSQ_CNT] -= 1
    lane[row, LN_PKT] = k
    lane[row, LN_SEQ] = 0
    lane[row, LN_READY] = cycle + S
    lane[row, LN_OUT] = -1
    lane[row, LN_OUTVC] = -1
    pkt[k, PK_INJECT] = cycle
    if cycle + S < node[r, ND_WAKE]:
        node[r, ND_WAKE] = cycle + S


@numba.njit(cache=True, _nrt=False, inline="always")
def _lanes_take(node, msq, lane, pkt, sqcap, S, r, cycle):
    """Free memory injection lanes of router ``r`` take the next packets of the memory's source
    queue."""
    for l in range(node[r, ND_MINJ_LANES]):
        if node[r, ND_MSQ_CNT] == 0:
            return
        row = r * MINJ_LANES_MAX + l
        if lane[row, LN_PKT] >= 0:
            continue
        _lane_load(node, msq, lane, pkt, sqcap, S, r, row, cycle)
        node[r, ND_MINJ_BUSY] += 1


@numba.njit(cache=True, _nrt=False)
def _inject_phase(st, cycle):
    """Each NI writes at most one flit of its current packet into its local input port; free
    memory injection lanes take packets from the memory's source queue."""
    cfg, ctr, vc, slot, port, node, sq, pkt = st.cfg, st.ctr, st.vc, st.slot, st.port, st.node, st.sq, st.pkt
    R, P, V, B, S, sqcap = cfg[C_R], cfg[C_P], cfg[C_V], cfg[C_B], cfg[C_S], cfg[C_SQ]
    booksim = cfg[C_BOOKSIM] != 0
    for r in range(R):
        if node[r, ND_MSQ_CNT] > 0:
            _lanes_take(node, st.msq, st.lane, pkt, sqcap, S, r, cycle)
        k = node[r, ND_NI_PKT]
        if k < 0:
            if node[r, ND_MSQ_CNT] > 0 and node[r, ND_MINJ_LANES] == 0:
                # replies queued for a router without memory lanes (synthetic request-reply traffic):
                # the NI sends them before its own queued packets, as BookSim2's terminals do
                k = _ni_next_packet_from(node, st.msq, ND_MSQ_HEAD, ND_MSQ_CNT, sqcap, r)
            else:
                k = _ni_next_packet(node, sq, sqcap, r)
            if k < 0:
                continue
        seq = node[r, ND_NI_SEQ]
        ip = r * P + PORT_LOCAL
        if seq == 0:
            if booksim:  # the first VC with room, round-robin from the one after the last used
                v = _ni_first_with_room(vc, V, B, ip * V, node[r, ND_NI_RR])
                if v < 0:
                    continue
            else:
                v = _ni_pick_vc(vc, V, B, ip * V, node[r, ND_NI_RR])
                if v < 0:
                    continue
            node[r, ND_NI_VC] = v
            node[r, ND_NI_RR] = v + 1 if v + 1 < V else 0
            pkt[k, PK_INJECT] = cycle
        else:
            v = node[r, ND_NI_VC]
            if vc[ip * V + v, VC_COUNT] >= B:
                continue
        if booksim:  # 1-cycle injection channel; body flits skip route computation and VC allocation
            ready = cycle + 1 + (S if seq == 0 else _body_stages(S))
        else:
            ready = cycle + S
        _push_flit(vc, slot, port, node, B, r, ip, v, ip * V + v, k, seq, ready)
        ctr[K_FLITS_INJ] += 1
        ctr[K_LAST_PROGRESS] = cycle
        seq += 1
        node[r, ND_NI_SEQ] = seq
        if seq == pkt[k, PK_NFLITS]:
            node[r, ND_NI_PKT] = -1


# =====================================================================================
# Router: VC allocation, switch allocation, traversal
# =====================================================================================

@numba.njit(cache=True, _nrt=False, inline="always")
def _dim_port(delta, size, wraps, pos_port, neg_port):
    if wraps:
        fwd = delta % size
        return pos_port if fwd <= size - fwd else neg_port
    return pos_port if delta > 0 else neg_port


@numba.njit(cache=True, _nrt=False, inline="always")
def _route(next_port, rt, r, d):
    """Output port at router ``r`` towards ``d``: the table, or (``rt[0] == 1``, networks too
    large for a table) dimension-order routing from coordinates, ``rt = [1, width,
    height, wrap_x, wrap_y, yx]``, the same routes as :mod:`npusim.hw.noc.routing`'s."""
    if rt[0] == 0:
        return np.int64(next_port[r, d])
    w = rt[1]
    dx = d % w - r % w
    dy = d // w - r // w
    if rt[5] == 0:
        if dx != 0:
            return np.int64(_dim_port(dx, w, rt[3], PORT_E, PORT_W))
        if dy != 0:
            return np.int64(_dim_port(dy, rt[2], rt[4], PORT_S, PORT_N))
        return np.int64(PORT_LOCAL)
    if dy != 0:
        return np.int64(_dim_port(dy, rt[2], rt[4], PORT_S, PORT_N))
    if dx != 0:
        return np.int64(_dim_port(dx, w, rt[3], PORT_E, PORT_W))
    return np.int64(PORT_LOCAL)


@numba.njit(cache=True, _nrt=False, inline="always")
def _claim_vc(vc, port, P, V, ncls, r, p, v, o):
    """Claim a free VC of output ``o`` of router ``r`` for a head at VC ``v`` of input port ``p``
    (round-robin from the output's pointer, within the allowed dateline class); -1 if none."""
    op = r * P + o
    lo, hi = 0, V
    if ncls > 1:
        half = V // 2
        upper = port[op, PT_DATELINE] != 0 or (p != PORT_LOCAL and PORT_DIM[p] == PORT_DIM[o] and v >= half)
        if upper:
            lo = half
        else:
            hi = half
    n = hi - lo
    start = port[op, PT_VA_RR]
    if start < lo or start >= hi:
        start = lo
    base = op * V
    for j in range(n):
        dv = start + j
        if dv >= hi:
            dv -= n
        if vc[base + dv, OV_BUSY] == 0:
            vc[base + dv, OV_BUSY] = 1
            port[op, PT_VA_RR] = dv + 1 if dv + 1 < V else 0
            return dv
    return -1


@numba.njit(cache=True, _nrt=False, inline="always")
def _has_credit(vc, slot, B, ov, cycle):
    """Collect the credits of output VC ``ov`` that have arrived by ``cycle``; any left?"""
    cnt = vc[ov, OV_CQ_CNT]
    if cnt > 0:
        h = vc[ov, OV_CQ_HEAD]
        while cnt > 0 and slot[ov * B + h, SL_CQ_TIME] <= cycle:
            h += 1
            if h == B:
                h = 0
            cnt -= 1
            vc[ov, OV_CREDITS] += 1
        vc[ov, OV_CQ_HEAD] = h
        vc[ov, OV_CQ_CNT] = cnt
    return vc[ov, OV_CREDITS] > 0


@numba.njit(cache=True, _nrt=False, inline="always")
def _input_request(vc, slot, port, pkt, next_port, rt, scr, V, B, r, P, p, cycle, want):
    """Input stage of the separable switch allocator for input port ``p`` of router ``r``.

    The first VC (round-robin from the port's pointer) whose front flit is ready, holds a
    downstream VC and has a credit for it becomes the port's switch request, returned as
    ``1 | out_port << 1 | vc << 4`` (0 = no request). Also returns the earliest cycle a
    front flit of this port becomes ready (``cycle`` if one is ready now), and ``want`` with
    the outputs this port's ready heads without a VC ask for one of (:func:`_ask_vc`; granted
    by :func:`_grant_vcs`).
    """
    ip = r * P + p
    m = port[ip, PT_MASK]
    start = port[ip, PT_IN_RR]
    req = 0
    wake = NEVER
    for j in range(V):
        v = start + j
        if v >= V:
            v -= V
        if (m >> v) & 1 == 0:
            continue
        iv = ip * V + v
        s = iv * B + vc[iv, VC_HEAD]
        ready = slot[s, SL_READY]
        if ready > cycle:
            if ready < wake:
                wake = ready
            continue
        wake = cycle
        o = vc[iv, VC_OUTPORT]
        if o < 0:
            if o == -1:  # a head not routed yet
                k = slot[s, SL_PKT]
                o = _route(next_port, rt, r, pkt[k, PK_DST])
                if o == PORT_LOCAL:  # leaves here: no VC to ask for
                    o = PORT_MEMC if pkt[k, PK_MEM] else PORT_LOCAL
                    vc[iv, VC_OUTPORT] = o
                    vc[iv, VC_OUTVC] = 0
                else:
                    vc[iv, VC_OUTPORT] = -2 - o  # routed to o, waiting for a VC there
                    want = _ask_vc(scr, want, o, p)
                    continue
            else:
                want = _ask_vc(scr, want, -2 - o, p)
                continue
        if req != 0:
            continue  # the request is chosen already
        if o != PORT_LOCAL and o != PORT_MEMC and not _has_credit(vc, slot, B, (r * P + o) * V + vc[iv, VC_OUTVC], cycle):
            continue
        req = 1 | (o << 1) | (v << 4)
    return req, wake, want


@numba.njit(cache=True, _nrt=False, inline="always")
def _ask_vc(scr, want, o, q):
    """Requester ``q`` (an input port, or ``P +`` a memory injection lane) asks output ``o`` for a
    VC this cycle: bit ``q`` of ``scr[o]`` (cleared when ``o`` is first asked, bit ``o`` of
    ``want``). Returns ``want``."""
    if (want >> o) & 1 == 0:
        want |= 1 << o
        scr[o] = 0
    scr[o] |= np.int64(1) << q
    return want


@numba.njit(cache=True, _nrt=False, inline="always")
def _grant_output(port, reqs, lreqs, P, PL, op, o):
    """Output stage: the first requester of output ``o`` (round-robin from the output's pointer)
    among the ``P`` input ports (``reqs``) and, as requesters ``P .. PL - 1``, the router's
    memory injection lanes (``lreqs``: 4 bits a lane, ``valid | out << 1``); advances the pointer
    past it. Returns the requester. Without lane requests the grant is the one of the input
    ports alone (a pointer at ``P`` or beyond acts as 0)."""
    start = port[op, PT_OUT_RR]
    for j in range(PL):
        p = start + j
        if p >= PL:
            p -= PL
        if p < P:
            e = (reqs >> (REQ_BITS * p)) & 1023
            hit = (e & 1) != 0 and ((e >> 1) & 7) == o
        else:
            e = (lreqs >> (4 * (p - P))) & 15
            hit = (e & 1) != 0 and (e >> 1) == o
        if hit:
            port[op, PT_OUT_RR] = p + 1 if p + 1 < PL else 0
            return p
    return -1


@numba.njit(cache=True, _nrt=False, inline="always")
def _pop_flit(vc, port, node, B, r, ip, v, iv):
    """Remove the front flit of input VC ``iv``; returns its slot index."""
    h = vc[iv, VC_HEAD]
    vc[iv, VC_HEAD] = h + 1 if h + 1 < B else 0
    cnt = vc[iv, VC_COUNT] - 1
    vc[iv, VC_COUNT] = cnt
    if cnt == 0:
        port[ip, PT_MASK] &= ~(np.int64(1) << v)
    node[r, ND_FLITS] -= 1
    return iv * B + h


@numba.njit(cache=True, _nrt=False, inline="always")
def _return_credit(vc, slot, port, B, V, ip, v, cycle, extra):
    """Send a credit for VC ``v`` of input port ``ip`` back to the upstream output VC;
    it becomes usable there after the link latency (plus ``extra`` cycles)."""
    ov = port[ip, PT_UP_OUT] * V + v
    pos = vc[ov, OV_CQ_HEAD] + vc[ov, OV_CQ_CNT]
    if pos >= B:
        pos -= B
    slot[ov * B + pos, SL_CQ_TIME] = cycle + port[ip, PT_UP_LAT] + extra
    vc[ov, OV_CQ_CNT] += 1


@numba.njit(cache=True, _nrt=False, inline="always")
def _forward(vc, slot, port, node, pkt, P, V, B, S, op, dv, k, seq, tail, cycle):
    """Put a flit on output link ``op`` (downstream VC ``dv``): it is written into the downstream
    input VC now (the credit reserved its slot) and is ready there after link latency + ``S``
    cycles of pipeline."""
    ov = op * V + dv
    dip = port[op, PT_DOWN_IN]
    _push_flit(vc, slot, port, node, B, dip // P, dip, dv, dip * V + dv, k, seq, cycle + port[op, PT_LAT] + S)
    vc[ov, OV_CREDITS] -= 1
    port[op, PT_FLITS] += 1
    if seq == 0:
        pkt[k, PK_HOPS] += 1
    if tail:
        vc[ov, OV_BUSY] = 0  # the next packet may claim this VC (wait_for_tail_credit = 0)


@numba.njit(cache=True, _nrt=False, inline="always")
def _eject(cfg, ctr, pkt, free, done, r, k, seq, tail, cycle):
    """Eject a flit at router ``r``; on the tail, account the packet and free its row.
    Flits out of order, duplicated or at the wrong router count as errors."""
    if seq != pkt[k, PK_EJECTED] or pkt[k, PK_DST] != r:
        ctr[K_ERRORS] += 1
    pkt[k, PK_EJECTED] += 1
    ctr[K_FLITS_EJ] += 1
    if not tail:
        return
    ctr[K_PKTS_DONE] += 1
    # BookSim mode: the flit crosses a 1-cycle ejection channel and the NI reads it in the
    # cycle after (BookSim's ``atime``), 2 cycles after leaving the router
    arrive = cycle + 2 * cfg[C_BOOKSIM]
    if pkt[k, PK_MEASURE]:
        lat = arrive - pkt[k, PK_CREATE]
        ctr[K_MEAS_DONE] += 1
        ctr[K_SUM_PKT_LAT] += lat
        ctr[K_SUM_NET_LAT] += arrive - pkt[k, PK_INJECT]
        ctr[K_SUM_HOPS] += pkt[k, PK_HOPS]
        if lat > ctr[K_MAX_PKT_LAT]:
            ctr[K_MAX_PKT_LAT] = lat
    if cfg[C_RECORD_DONE]:
        n = ctr[K_DONE_CNT]
        if n < cfg[C_DONE_CAP]:
            done[n, 0] = pkt[k, PK_TAG]
            done[n, 1] = arrive
            ctr[K_DONE_CNT] = n + 1
        else:
            ctr[K_DONE_OVERFLOW] += 1
    pkt[k, PK_SRC] = -1
    top = ctr[K_FREE_TOP]
    free[top] = k
    ctr[K_FREE_TOP] = top + 1


@numba.njit(cache=True, _nrt=False, inline="always")
def _grant_vcs(st, r, want):
    """VC allocation of router ``r`` this cycle. Every ready head flit at an input VC's front, and
    every memory injection lane's ready head, that holds no downstream VC has been routed (once:
    ``VC_OUTPORT = -2 - o`` while it waits) and, unless it leaves at this router (the local or the
    memory port: no VC), has asked its output ``o`` (:func:`_input_request`, :func:`_lane_requests`:
    ``want``, and ``scr[o]``, the requesters' bits). Each output serves its requesters round-robin
    from its pointer (``PT_VA_IN_RR``: input ports ``0 .. P-1``, then the lanes as ``P ..``, as the
    switch allocator's outputs do), one VC a requester (its first head for that output, in the
    port's own VC order, that finds one free in its dateline class); the pointer moves past the
    last requester served. So inputs that keep asking for one output get its VCs in turn, whatever
    their ports' numbers (session 56: until then the input ports claimed in a scan order drawn per
    visit, which, with three or more requesters, favoured those after the larger gaps in port order:
    0.33 / 0.42 of an output for the E and W inputs of a router, and 0.18 for its N input against
    0.41 / 0.41 for E and the local NI; and the lanes claimed after every input port). Returns the
    requesters served (bits), whose switch requests the caller makes again."""
    cfg, vc, port, node, lane, scr = st.cfg, st.vc, st.port, st.node, st.lane, st.scr
    P, V, ncls = cfg[C_P], cfg[C_V], cfg[C_NCLS]
    nlanes = node[r, ND_MINJ_LANES]
    served = 0
    PL = P + nlanes
    for o in range(P):
        if (want >> o) & 1 == 0:
            continue
        op = r * P + o
        start = port[op, PT_VA_IN_RR]
        if start >= PL:
            start = 0
        bits = scr[o]
        for j in range(PL):
            q = start + j
            if q >= PL:
                q -= PL
            if (bits >> q) & 1 == 0:
                continue
            if q < P:
                ip = r * P + q
                m = port[ip, PT_MASK]
                vs = port[ip, PT_IN_RR]
                for jj in range(V):
                    v = vs + jj
                    if v >= V:
                        v -= V
                    iv = ip * V + v
                    if (m >> v) & 1 == 0 or vc[iv, VC_OUTPORT] != -2 - o:
                        continue
                    dv = _claim_vc(vc, port, P, V, ncls, r, q, v, o)
                    if dv >= 0:  # else its class has no VC free: the port's next head may have one
                        vc[iv, VC_OUTPORT] = o
                        vc[iv, VC_OUTVC] = dv
                        port[op, PT_VA_IN_RR] = q + 1 if q + 1 < PL else 0
                        served |= np.int64(1) << q
                        break
            else:
                dv = _claim_vc(vc, port, P, V, ncls, r, PORT_LOCAL, 0, o)
                if dv >= 0:
                    row = r * MINJ_LANES_MAX + q - P
                    lane[row, LN_OUT] = o
                    lane[row, LN_OUTVC] = dv
                    port[op, PT_VA_IN_RR] = q + 1 if q + 1 < PL else 0
                    served |= np.int64(1) << q
    return served


@numba.njit(cache=True, _nrt=False)
def _routers_phase(st, cycle):
    """Allocation and traversal in every router holding flits (order-independent)."""
    cfg, vc, slot, port, node, pkt = st.cfg, st.vc, st.slot, st.port, st.node, st.pkt
    R, P, V, B = cfg[C_R], cfg[C_P], cfg[C_V], cfg[C_B]
    for r in range(R):
        if node[r, ND_WAKE] > cycle:  # no front flit is ready: nothing can happen here
            continue
        reqs, wake, want = 0, NEVER, 0
        for p in range(P):
            if port[r * P + p, PT_MASK] == 0:
                continue
            req, port_wake, want = _input_request(vc, slot, port, pkt, st.next_port, st.rt, st.scr, V, B, r, P, p,
                                                  cycle, want)
            wake = min(wake, port_wake)
            reqs |= req << (REQ_BITS * p)
        lreqs = 0
        if node[r, ND_MINJ_BUSY] > 0:
            lreqs, lane_wake, want = _lane_requests(st, r, cycle, want)
            wake = min(wake, lane_wake)
        if want != 0:  # VC allocation, then the switch requests again of the requesters it served
            served = _grant_vcs(st, r, want)
            for p in range(P):
                if (served >> p) & 1:
                    req, _, _ = _input_request(vc, slot, port, pkt, st.next_port, st.rt, st.scr, V, B, r, P, p,
                                               cycle, 0)
                    reqs = (reqs & ~(np.int64(1023) << (REQ_BITS * p))) | (req << (REQ_BITS * p))
            if served >> P:
                lreqs, _, _ = _lane_requests(st, r, cycle, 0)
        outs = 0
        for p in range(P):
            if (reqs >> (REQ_BITS * p)) & 1:
                outs |= 1 << ((reqs >> (REQ_BITS * p + 1)) & 7)
        if lreqs != 0:
            for l in range(node[r, ND_MINJ_LANES]):
                if (lreqs >> (4 * l)) & 1:
                    outs |= 1 << ((lreqs >> (4 * l + 1)) & 7)
        # a ready flit that stays (blocked, or behind the one that leaves) retries next cycle;
        # flits arriving later lower ND_WAKE in _push_flit (and _lanes_take)
        node[r, ND_WAKE] = cycle + 1 if wake <= cycle else wake
        PL = P + node[r, ND_MINJ_LANES]
        for o in range(P):
            if (outs >> o) & 1 == 0:
                continue
            p = _grant_output(port, reqs, lreqs, P, PL, r * P + o, o)
            if p < P:
                _traverse(st, r, p, o, reqs, cycle)
            else:
                _traverse_lane(st, r, p - P, o, cycle)
        if (outs >> PORT_MEMC) & 1:
            # the memory port: one flit a cycle per lane, from distinct input ports (each makes one
            # request), granted round-robin from the router's pointer; it always accepts
            start = node[r, ND_MEM_RR]
            left = node[r, ND_MEM_LANES]
            for j in range(P):
                if left == 0:
                    break
                p = start + j
                if p >= P:
                    p -= P
                e = (reqs >> (REQ_BITS * p)) & 1023
                if (e & 1) and ((e >> 1) & 7) == PORT_MEMC:
                    node[r, ND_MEM_RR] = p + 1 if p + 1 < P else 0
                    _traverse(st, r, p, PORT_MEMC, reqs, cycle)
                    left -= 1


@numba.njit(cache=True, _nrt=False, inline="always")
def _lane_requests(st, r, cycle, want):
    """Switch requests of router ``r``'s memory injection lanes (4 bits a lane, ``valid | out <<
    1``) and the earliest cycle one of their flits is ready. A lane's flit requests its output
    when it is ready, its packet holds a downstream VC (none at the local port: a response to the
    core of this router) and it has a credit for it; a ready head without one asks its output
    (:func:`_ask_vc`, as requester ``P + l``; returned in ``want``)."""
    cfg, vc, slot, lane, pkt = st.cfg, st.vc, st.slot, st.lane, st.pkt
    P, V, B = cfg[C_P], cfg[C_V], cfg[C_B]
    lreqs = 0
    wake = NEVER
    for l in range(st.node[r, ND_MINJ_LANES]):
        row = r * MINJ_LANES_MAX + l
        k = lane[row, LN_PKT]
        if k < 0:
            continue
        ready = lane[row, LN_READY]
        if ready > cycle:
            if ready < wake:
                wake = ready
            continue
        wake = cycle
        o = lane[row, LN_OUT]
        if o < 0:
            o = _route(st.next_port, st.rt, r, pkt[k, PK_DST])
            if o != PORT_LOCAL:  # no downstream VC yet
                want = _ask_vc(st.scr, want, o, P + l)
                continue
            lane[row, LN_OUT] = o
        if o != PORT_LOCAL and not _has_credit(vc, slot, B, (r * P + o) * V + lane[row, LN_OUTVC], cycle):
            continue
        lreqs |= (1 | (o << 1)) << (4 * l)
    return lreqs, wake, want


@numba.njit(cache=True, _nrt=False, inline="always")
def _traverse_lane(st, r, l, o, cycle):
    """Move the next flit of memory injection lane ``l`` of router ``r`` through the switch to
    output ``o``: onto its link, or ejected at the local port. The lane's next flit is ready in
    the next cycle (one flit a cycle per lane)."""
    cfg, ctr, vc, slot, port, node, pkt, lane = st.cfg, st.ctr, st.vc, st.slot, st.port, st.node, st.pkt, st.lane
    P, V, B, S = cfg[C_P], cfg[C_V], cfg[C_B], cfg[C_S]
    row = r * MINJ_LANES_MAX + l
    k, seq = lane[row, LN_PKT], lane[row, LN_SEQ]
    tail = seq == pkt[k, PK_NFLITS] - 1
    ctr[K_FLITS_INJ] += 1
    ctr[K_MEM_INJ] += 1
    node[r, ND_MINJ_FLITS] += 1
    if o == PORT_LOCAL:
        _eject(cfg, ctr, pkt, st.free, st.done, r, k, seq, tail, cycle)
    else:
        _forward(vc, slot, port, node, pkt, P, V, B, S, r * P + o, lane[row, LN_OUTVC], k, seq, tail, cycle)
    if tail and node[r, ND_MSQ_CNT] > 0:
        # the next packet follows the tail into the pipeline (as the NI writes a new packet's head
        # behind the previous tail): its head is ready S cycles after it entered, the cycle after
        # the tail entered at the earliest (``cycle + 1 - S``) and never before the packet existed
        k2 = st.msq[r * cfg[C_SQ] + node[r, ND_MSQ_HEAD]]
        _lane_load(node, st.msq, lane, pkt, cfg[C_SQ], S, r, row, max(cycle + 1 - S, pkt[k2, PK_CREATE]))
    elif tail:
        lane[row, LN_PKT] = -1
        lane[row, LN_OUT] = -1
        lane[row, LN_OUTVC] = -1
        node[r, ND_MINJ_BUSY] -= 1
    else:
        lane[row, LN_SEQ] = seq + 1
        lane[row, LN_READY] = cycle + 1
    ctr[K_LAST_PROGRESS] = cycle


@numba.njit(cache=True, _nrt=False, inline="always")
def _traverse(st, r, p, o, reqs, cycle):
    """Move the flit of input port ``p``'s granted request (in ``reqs``) through the switch of
    router ``r`` to output ``o``: onto its link, or ejected (local or memory port)."""
    cfg, ctr, vc, slot, port, node, pkt = st.cfg, st.ctr, st.vc, st.slot, st.port, st.node, st.pkt
    P, V, B, S = cfg[C_P], cfg[C_V], cfg[C_B], cfg[C_S]
    v = (reqs >> (REQ_BITS * p + 4)) & 63
    ip = r * P + p
    iv = ip * V + v
    port[ip, PT_IN_RR] = v + 1 if v + 1 < V else 0
    s = _pop_flit(vc, port, node, B, r, ip, v, iv)
    k, seq = slot[s, SL_PKT], slot[s, SL_SEQ]
    if p != PORT_LOCAL:
        _return_credit(vc, slot, port, B, V, ip, v, cycle, 0)
    tail = seq == pkt[k, PK_NFLITS] - 1
    if o == PORT_LOCAL:
        _eject(cfg, ctr, pkt, st.free, st.done, r, k, seq, tail, cycle)
    elif o == PORT_MEMC:
        node[r, ND_MEM_FLITS] += 1
        ctr[K_MEM_EJ] += 1
        _eject(cfg, ctr, pkt, st.free, st.done, r, k, seq, tail, cycle)
    else:
        _forward(vc, slot, port, node, pkt, P, V, B, S, r * P + o, vc[iv, VC_OUTVC], k, seq, tail, cycle)
    if tail:
        vc[iv, VC_OUTPORT] = -1
        vc[iv, VC_OUTVC] = -1
    ctr[K_LAST_PROGRESS] = cycle


@numba.njit(cache=True, _nrt=False, inline="always")
def _va_class_range(port, P, V, ncls, op, p, o, v):
    """Downstream VCs a packet at input VC ``v`` of port ``p`` may claim on output ``o``
    (dateline classes, see the module docstring of :mod:`.flit`): ``[lo, hi)``."""
    lo, hi = 0, V
    if ncls > 1 and o != PORT_LOCAL:
        half = V // 2
        if port[op, PT_DATELINE] != 0 or (p != PORT_LOCAL and PORT_DIM[p] == PORT_DIM[o] and v >= half):
            lo = half
        else:
            hi = half
    return lo, hi


@numba.njit(cache=True, _nrt=False, inline="always")
def _islip_va(vc, port, scr, next_port, rt, pkt, slot, P, V, B, ncls, r, nreq, cycle):
    """BookSim mode: one iteration of iSLIP between the ``nreq`` head flits listed in
    ``scr`` (input VC ids) and the free VCs of the output ports they route to (the
    ejection port's VCs included). Each free output VC grants the first requesting input
    VC at or after its pointer; each input VC accepts the first grant at or after its
    own; pointers move past an accepted grant. Winners get their output port and VC."""
    PV = P * V
    base = r * PV
    for i in range(nreq):
        scr[2 * i + 1] = 0
    # grant
    for i in range(nreq):
        iv = scr[2 * i]
        ip = iv // V
        p, v = ip - r * P, iv - ip * V
        o = _route(next_port, rt, r, pkt[slot[iv * B + vc[iv, VC_HEAD], SL_PKT], PK_DST])
        op = r * P + o
        lo, hi = _va_class_range(port, P, V, ncls, op, p, o, v)
        for dv in range(lo, hi):
            ov = op * V + dv
            if vc[ov, OV_BUSY] != 0 or vc[ov, OV_FREE_AT] > cycle:
                continue
            # does an earlier requester (cyclically from the pointer) also want ov?
            g = vc[ov, OV_GPTR]
            mine = iv - base - g
            if mine < 0:
                mine += PV
            best = mine
            for jj in range(nreq):
                if jj == i:
                    continue
                iv2 = scr[2 * jj]
                ip2 = iv2 // V
                if _route(next_port, rt, r, pkt[slot[iv2 * B + vc[iv2, VC_HEAD], SL_PKT], PK_DST]) != o:
                    continue
                lo2, hi2 = _va_class_range(port, P, V, ncls, op, ip2 - r * P, o, iv2 - ip2 * V)
                if dv < lo2 or dv >= hi2:
                    continue
                d2 = iv2 - base - g
                if d2 < 0:
                    d2 += PV
                if d2 < best:
                    best = d2
                    break
            if best == mine:
                scr[2 * i + 1] |= np.int64(1) << dv
    # accept
    for i in range(nreq):
        mask = scr[2 * i + 1]
        if mask == 0:
            continue
        iv = scr[2 * i]
        o = _route(next_port, rt, r, pkt[slot[iv * B + vc[iv, VC_HEAD], SL_PKT], PK_DST])
        a = vc[iv, VC_APTR] - o * V
        start = a if 0 <= a < V else 0
        dv = -1
        for jj in range(V):
            d = start + jj
            if d >= V:
                d -= V
            if (mask >> d) & 1:
                dv = d
                break
        op = r * P + o
        ov = op * V + dv
        vc[ov, OV_BUSY] = 1
        vc[iv, VC_OUTPORT] = o
        vc[iv, VC_OUTVC] = dv
        nxt = iv - base + 1
        vc[ov, OV_GPTR] = nxt if nxt < PV else 0
        nxt = o * V + dv + 1
        vc[iv, VC_APTR] = nxt if nxt < PV else 0


@numba.njit(cache=True, _nrt=False)
def _routers_phase_booksim(st, cycle):
    """:func:`_routers_phase` with BookSim2's ``iq_router`` conventions (``booksim=True`` in
    :func:`npusim.hw.noc.flit.make_state`): VC allocation and switch allocation are both
    iSLIP with one iteration (:func:`_islip_va`; for the switch every input port requests
    every output one of its VCs can use, each output grants one input round-robin, each
    input accepts one grant round-robin, pointers move only on an accepted grant); the
    ejection port's VCs are allocated like any other; body flits spend ``min(S, 2)``
    cycles in a router (switch allocation and traversal only); a head that reaches its
    VC's front when the previous packet's tail leaves starts route computation in the
    next cycle; credits take one cycle more than the link to become usable upstream.
    A head's VC and switch allocation happen in its ready cycle (BookSim: two cycles and
    one cycle before switch traversal; the shift is the same for every head, so who
    competes with whom is unchanged)."""
    cfg, ctr, vc, slot, port, node, pkt, scr = st.cfg, st.ctr, st.vc, st.slot, st.port, st.node, st.pkt, st.scr
    R, P, V, B, S, ncls = cfg[C_R], cfg[C_P], cfg[C_V], cfg[C_B], cfg[C_S], cfg[C_NCLS]
    SB = _body_stages(S)
    head_only = S - SB  # route computation + VC allocation
    for r in range(R):
        if node[r, ND_WAKE] > cycle:
            continue
        wake = NEVER
        nreq = 0
        # ready fronts: heads without a VC request VC allocation
        for p in range(P):
            ip = r * P + p
            m = port[ip, PT_MASK]
            if m == 0:
                continue
            for v in range(V):
                if (m >> v) & 1 == 0:
                    continue
                iv = ip * V + v
                ready = slot[iv * B + vc[iv, VC_HEAD], SL_READY]
                if ready > cycle:
                    if ready < wake:
                        wake = ready
                    continue
                wake = cycle
                if vc[iv, VC_OUTPORT] < 0:
                    scr[2 * nreq] = iv
                    nreq += 1
        node[r, ND_WAKE] = cycle + 1 if wake <= cycle else wake
        if wake > cycle:
            continue
        if nreq:
            _islip_va(vc, port, scr, st.next_port, st.rt, pkt, slot, P, V, B, ncls, r, nreq, cycle)
        # switch requests: per input port and output, the first VC (round-robin) that is
        # ready, holds a VC there and has a credit
        reqs = 0  # 5 bits (outputs requested) per input port
        for p in range(P):
            ip = r * P + p
            for o in range(P):
                port[ip, PT_SREQ + o] = -1
            m = port[ip, PT_MASK]
            if m == 0:
                continue
            start = port[ip, PT_IN_RR]
            mask = 0
            for j in range(V):
                v = start + j
                if v >= V:
                    v -= V
                if (m >> v) & 1 == 0:
                    continue
                iv = ip * V + v
                if slot[iv * B + vc[iv, VC_HEAD], SL_READY] > cycle:
                    continue
                o = vc[iv, VC_OUTPORT]
                if o < 0 or (mask >> o) & 1:
                    continue
                if o != PORT_LOCAL and not _has_credit(vc, slot, B, (r * P + o) * V + vc[iv, VC_OUTVC], cycle):
                    continue
                port[ip, PT_SREQ + o] = v
                mask |= 1 << o
            reqs |= mask << (5 * p)
        if reqs == 0:
            continue
        # grant: each output picks one requesting input, round-robin from its pointer
        grants = 0  # valid bit | input port, 4 bits per output
        for o in range(P):
            start = port[r * P + o, PT_OUT_RR]
            for jj in range(P):
                p = start + jj
                if p >= P:
                    p -= P
                if (reqs >> (5 * p + o)) & 1:
                    grants |= (8 | p) << (4 * o)
                    break
        # accept: each input takes one grant, round-robin from its pointer
        for p in range(P):
            ip = r * P + p
            start = port[ip, PT_ACC_RR]
            o = -1
            for jj in range(P):
                oo = start + jj
                if oo >= P:
                    oo -= P
                g = (grants >> (4 * oo)) & 15
                if (g & 8) and (g & 7) == p:
                    o = oo
                    break
            if o < 0:
                continue
            port[r * P + o, PT_OUT_RR] = p + 1 if p + 1 < P else 0
            port[ip, PT_ACC_RR] = o + 1 if o + 1 < P else 0
            v = port[ip, PT_SREQ + o]
            iv = ip * V + v
            port[ip, PT_IN_RR] = v + 1 if v + 1 < V else 0
            s = _pop_flit(vc, port, node, B, r, ip, v, iv)
            k, seq = slot[s, SL_PKT], slot[s, SL_SEQ]
            if p != PORT_LOCAL:
                _return_credit(vc, slot, port, B, V, ip, v, cycle, 1)
            tail = seq == pkt[k, PK_NFLITS] - 1
            if o == PORT_LOCAL:
                _eject(cfg, ctr, pkt, st.free, st.done, r, k, seq, tail, cycle)
                if tail:
                    vc[(r * P + PORT_LOCAL) * V + vc[iv, VC_OUTVC], OV_BUSY] = 0
            else:
                _forward(vc, slot, port, node, pkt, P, V, B, S if seq == 0 else SB, r * P + o, vc[iv, VC_OUTVC], k,
                         seq, tail, cycle)
            if tail:
                # BookSim releases the VC at switch allocation (a cycle before traversal, here
                # `cycle`) and allocates VCs two cycles before traversal: claimable from cycle + 2
                vc[(r * P + o) * V + vc[iv, VC_OUTVC], OV_FREE_AT] = cycle + 2
            if tail:
                vc[iv, VC_OUTPORT] = -1
                vc[iv, VC_OUTVC] = -1
                if vc[iv, VC_COUNT] > 0 and head_only > 0:
                    # the next packet's head is now at the front: route computation starts next cycle
                    s2 = iv * B + vc[iv, VC_HEAD]
                    if slot[s2, SL_READY] < cycle + 1 + head_only:
                        slot[s2, SL_READY] = cycle + 1 + head_only
            ctr[K_LAST_PROGRESS] = cycle


# =====================================================================================
# Public kernels
# =====================================================================================

@numba.njit(cache=True, _nrt=False)
def step(st, cycle):
    """Advance the network by exactly one cycle (call with cycle = previous + 1)."""
    _inject_phase(st, cycle)
    if st.cfg[C_BOOKSIM]:
        _routers_phase_booksim(st, cycle)
    else:
        _routers_phase(st, cycle)
    st.ctr[K_LAST_CYCLE] = cycle


@numba.njit(cache=True, _nrt=False)
def send_packet(st, src, dst, nflits, cycle, tag):
    """Enqueue a packet of ``nflits`` flits at NI ``src`` for ``dst`` created in ``cycle``;
    returns its packet row or -1 if the source queue (or packet table) is full."""
    return enqueue_packet(st.cfg, st.ctr, st.node, st.sq, st.pkt, st.free, src, dst, nflits, cycle, tag, 0)


@numba.njit(cache=True, _nrt=False)
def send_packet_mem(st, src, dst, nflits, cycle, tag):
    """:func:`send_packet` for ``dst``'s memory-controller port (memory-bound traffic: HBM read
    requests, write data): at ``dst`` it leaves by one of ``ND_MEM_LANES`` memory-port lanes
    instead of the local ejection port (the local port when ``dst`` has none, or in BookSim mode)."""
    k = enqueue_packet(st.cfg, st.ctr, st.node, st.sq, st.pkt, st.free, src, dst, nflits, cycle, tag, 0)
    if k >= 0 and st.node[dst, ND_MEM_LANES] > 0 and st.cfg[C_BOOKSIM] == 0:
        st.pkt[k, PK_MEM] = 1
    return k


@numba.njit(cache=True, _nrt=False)
def send_packet_from_mem(st, src, dst, nflits, cycle, tag):
    """:func:`send_packet` on behalf of ``src``'s memory controller (memory responses: HBM read
    data, write acknowledgements): it enters the network through one of ``src``'s
    ``ND_MINJ_LANES`` memory injection lanes (from the memory's own source queue), not the
    router's NI; through the NI when ``src`` has no lanes, or in BookSim mode."""
    if st.node[src, ND_MINJ_LANES] > 0 and st.cfg[C_BOOKSIM] == 0:
        return _enqueue_into(st.cfg, st.ctr, st.node, st.msq, ND_MSQ_HEAD, ND_MSQ_CNT, st.pkt, st.free, src, dst,
                             nflits, cycle, tag, 0)
    return enqueue_packet(st.cfg, st.ctr, st.node, st.sq, st.pkt, st.free, src, dst, nflits, cycle, tag, 0)


@numba.njit(cache=True, _nrt=False)
def flits_in_network(st):
    """Flits in input buffers (including flits still crossing a link)."""
    return st.ctr[K_FLITS_INJ] - st.ctr[K_FLITS_EJ]


@numba.njit(cache=True, _nrt=False)
def network_idle(st):
    """True when no packet is queued, being injected or in the network."""
    return st.ctr[K_PKTS_CREATED] == st.ctr[K_PKTS_DONE]


@numba.njit(cache=True, _nrt=False)
def run_cycles(st, first_cycle, ncycles, stop_when_idle):
    """Step cycles ``first_cycle .. first_cycle + ncycles - 1`` and return the next cycle;
    with ``stop_when_idle``, return as soon as the network is idle."""
    cycle = first_cycle
    end = first_cycle + ncycles
    while cycle < end:
        if stop_when_idle and st.ctr[K_PKTS_CREATED] == st.ctr[K_PKTS_DONE]:
            break
        step(st, cycle)
        cycle += 1
    return cycle


# =====================================================================================
# Synthetic traffic
# =====================================================================================

# indices of run_synthetic's ``out`` array
(O_CYCLES, O_WIN_FLITS_CREATED, O_WIN_FLITS_EJ, O_WIN_BACKLOG_START, O_WIN_BACKLOG_END, O_DRAINED,
 O_REFUSED, O_DEADLOCK, O_MAX_QUEUE, O_FINISHED) = range(10)
NOUT = 10


# request-reply synthetic traffic: a request's tag is ``(src * R + dst) * 2 + measured`` (>= 0); the
# replies waiting for their creation cycle are a ring ``pend[PD_HEAD | PD_CNT]`` then rows of
# (cycle, src, dst, measured) from ``PD_ROWS``
PD_HEAD, PD_CNT, PD_CAP, PD_ROWS = 0, 1, 2, 4


@numba.njit(cache=True, _nrt=False)
def _replies_due(st, pend, reply_flits, cycle, out):
    """Enqueue the replies created by ``cycle`` at their sources: into the memory's queue (its
    injection lanes, or the NI before its own packets where there are none). A full queue keeps
    them waiting (counted in ``out[O_REFUSED]`` once each cycle it happens)."""
    cap = pend[PD_CAP]
    while pend[PD_CNT] > 0:
        row = PD_ROWS + 4 * pend[PD_HEAD]
        if pend[row] > cycle:
            return
        k = _enqueue_into(st.cfg, st.ctr, st.node, st.msq, ND_MSQ_HEAD, ND_MSQ_CNT, st.pkt, st.free, pend[row + 1],
                          pend[row + 2], reply_flits, pend[row], -1, pend[row + 3])
        if k < 0:
            out[O_REFUSED] += 1
            return
        pend[PD_HEAD] = pend[PD_HEAD] + 1 if pend[PD_HEAD] + 1 < cap else 0
        pend[PD_CNT] -= 1


@numba.njit(cache=True, _nrt=False)
def _requests_arrived(st, pend, out):
    """Completed requests (recorded in ``done``) become pending replies, created in the cycle the
    request's tail arrived (BookSim2's reply ``ctime``, the request's ``atime``)."""
    R = st.cfg[C_R]
    cap = pend[PD_CAP]
    for i in range(st.ctr[K_DONE_CNT]):
        tag = st.done[i, 0]
        if tag < 0:
            continue
        if pend[PD_CNT] == cap:
            out[O_REFUSED] += 1
            continue
        pos = pend[PD_HEAD] + pend[PD_CNT]
        if pos >= cap:
            pos -= cap
        row = PD_ROWS + 4 * pos
        pair = tag // 2
        pend[row] = st.done[i, 1]
        pend[row + 1] = pair % R  # the reply leaves the request's destination
        pend[row + 2] = pair // R
        pend[row + 3] = tag % 2
        pend[PD_CNT] += 1
    st.ctr[K_DONE_CNT] = 0


@numba.njit(cache=True, _nrt=False)
def run_synthetic(st, cyc, src, dst, nflits, first_cycle, end_cycle, warmup, measure, drain_max,
                  deadlock_cycles, link_window, out, reply_flits, pend):
    """Cycles ``first_cycle .. end_cycle - 1`` of a synthetic-traffic run on a state that
    ran the cycles before (call again with the next block until ``out[O_FINISHED]``).

    ``cyc, src, dst``: the packets created in those cycles, in (cycle, source) order
    (:func:`npusim.hw.noc.traffic.packet_stream`, the generator every fidelity shares),
    each of ``nflits`` flits; packets created in ``[warmup, warmup + measure)`` are
    measured. A full source queue refuses a packet (counted: past saturation). Traffic
    continues after the window until all measured packets have arrived
    (``out[O_DRAINED] = 1``) or ``drain_max`` cycles pass; stops early if no flit moves for
    ``deadlock_cycles`` cycles while flits are in the network. Flits per output port in
    the window go to ``link_window`` (indexed ``r * P + p``), summary counts to ``out``.
    Returns the next cycle.

    Request-reply traffic (``reply_flits > 0``, BookSim2's ``use_read_write``): every packet of the
    stream is a request; when its tail arrives its destination sends a reply of ``reply_flits``
    flits back, created in that cycle (measured if the request was), through the destination's
    memory injection lanes or, without lanes, its NI ahead of the NI's queued requests. A request
    to a router with a memory port leaves there (``PK_MEM``; not in BookSim mode). ``pend``: the
    replies not yet due (see ``PD_*``), kept by the caller between blocks; the state must record
    completions (``done_capacity``).
    """
    cfg, ctr, port, node = st.cfg, st.ctr, st.port, st.node
    rr = reply_flits > 0
    R = cfg[C_R]
    start_meas, end_meas = warmup, warmup + measure
    k = 0
    npk = cyc.size
    cycle = first_cycle
    while cycle < end_cycle:
        if cycle == start_meas:
            for i in range(link_window.size):
                link_window[i] = -port[i, PT_FLITS]
            out[O_WIN_FLITS_CREATED] = -ctr[K_FLITS_CREATED]
            out[O_WIN_FLITS_EJ] = -ctr[K_FLITS_EJ]
            out[O_WIN_BACKLOG_START] = ctr[K_FLITS_CREATED] - ctr[K_FLITS_EJ]
        if cycle == end_meas:
            for i in range(link_window.size):
                link_window[i] += port[i, PT_FLITS]
            out[O_WIN_FLITS_CREATED] += ctr[K_FLITS_CREATED]
            out[O_WIN_FLITS_EJ] += ctr[K_FLITS_EJ]
            out[O_WIN_BACKLOG_END] = ctr[K_FLITS_CREATED] - ctr[K_FLITS_EJ]
        if cycle >= end_meas and ctr[K_MEAS_DONE] == ctr[K_MEAS_CREATED] and (not rr or pend[PD_CNT] == 0):
            out[O_DRAINED] = 1
            out[O_FINISHED] = 1
            break
        if cycle >= end_meas + drain_max:
            out[O_FINISHED] = 1
            break
        measured = 1 if start_meas <= cycle < end_meas else 0
        if rr:
            _replies_due(st, pend, reply_flits, cycle, out)
        while k < npk and cyc[k] == cycle:
            r = src[k]
            tag = (r * R + dst[k]) * 2 + measured if rr else -1
            row = enqueue_packet(cfg, ctr, node, st.sq, st.pkt, st.free, r, dst[k], nflits, cycle, tag, measured)
            if row < 0:
                out[O_REFUSED] += 1
            else:
                if rr and node[dst[k], ND_MEM_LANES] > 0 and cfg[C_BOOKSIM] == 0:
                    st.pkt[row, PK_MEM] = 1
                if node[r, ND_SQ_CNT] > out[O_MAX_QUEUE]:
                    out[O_MAX_QUEUE] = node[r, ND_SQ_CNT]
            k += 1
        step(st, cycle)
        if rr:
            _requests_arrived(st, pend, out)
        cycle += 1
        if cycle - ctr[K_LAST_PROGRESS] > deadlock_cycles and ctr[K_FLITS_INJ] > ctr[K_FLITS_EJ]:
            out[O_DEADLOCK] = 1
            out[O_FINISHED] = 1
            break
    out[O_CYCLES] = cycle
    return cycle
