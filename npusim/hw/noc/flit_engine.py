"""The flit-level NoC driven by the event engine: messages become packets in the cycle model.

A message of ``F = ceil(bytes / link width)`` flits from ``src`` to ``dst`` is cut into
packets of at most ``max_packet_flits`` flits, which enter the source's network
interface FIFO in order (as fast as the FIFO has room). While any packet is queued or
in flight, one engine event per cycle (``EV_FLIT_TICK``) advances the cycle-accurate
model (:func:`npusim.hw.noc.flit_kernel.step`) by one cycle. The message's task ends in
the cycle its last packet's tail is ejected; its source ``noc`` queue is freed once all
its packets are in the FIFO (the NI sends them in order, behind earlier messages).

The cost is one event and one network step per cycle the NoC is busy, whatever the
traffic — the price of cycle accuracy; the path model costs a few events per message.

A DMA's HBM traffic (:mod:`npusim.sim.mempath`) is not a message: it crosses the mesh as below,
entering at a memory controller through its injection lanes
(:func:`~npusim.hw.noc.flit_kernel.send_packet_from_mem`; lanes from
``new_flit_engine(memory_ports=...)``), and its end is reported as ``EV_NOC_PART_END`` for the
DMA engine's initiator.

**DMA reads** (:func:`flit_read_add` / :func:`flit_read_go`) are not two free-running streams: the
DMA engine issues one one-flit request packet per burst, cycling over the attach routers its
bursts map to (its address walk puts consecutive bursts on consecutive channels), and keeps at
most ``lim`` requests in flight — its TLM tags: ``max_outstanding`` transactions of
``transaction_bytes`` in flight (the HBM model's rule, :mod:`npusim.hw.memory.hbm`), so ``lim =
max(1, min(max_outstanding, max_outstanding * transaction_bytes // request bytes))`` requests; a
tag comes back when its burst's data has all arrived. A request that reaches a router's memory
port puts its burst's data (its share of the DMA's data flits there) at the tail of that
router's *controller queue*, which feeds the memory injection lanes in order: the controller
serves requests in the order they arrived, whatever core sent them (first-come first-served
across requesters; the DRAM's own timing and row-hit reordering stay in the memory model). The
DMA's read part ends when its last burst's data has arrived. Before (issue 42 item 1) a DMA
queued its whole reply stream at each controller when it started, without waiting for its
requests, and bundled 16 burst requests in one packet: each controller sent long runs to one core
while the others waited, and the cores' requests, unthrottled, saturated the links towards the
edge and arrived in an unfair order, so 16 cores reading 1 MB each moved half what the same
routers sustain on request-reply traffic (``validation/noc_engine_vs_synthetic.py``). A DMA
write is the same loop the other way: a burst's data (its share of the data flits, in packets of
up to ``max_packet_flits``) goes out within the tags, its last packet's arrival puts a one-flit
acknowledgement in the controller queue, and the acknowledgement's arrival frees the tag.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.eventlist import event_push
from npusim.engine.tasks import EV_QUEUE_FREE, EV_TASK_END
from npusim.hw.noc.flit import make_state
from npusim.hw.noc.flit_kernel import K_DONE_CNT, network_idle, send_packet, send_packet_from_mem, send_packet_mem, step
from npusim.hw.noc.path import EV_NOC_PART_END

EV_FLIT_TICK = 30

FlitEngine = namedtuple(
    "FlitEngine",
    [
        "fs",  # the flit model's state
        "prm",  # [flit bytes, max packet flits]
        "m_task", "m_src", "m_dst", "m_flits_left", "m_packets_out", "m_free",
        "active", "sc",  # slots still enqueuing packets; scalars (see S_*)
        # DMA reads, per initiator ``i`` (and ``i * NR + r`` per attach router ``r``): its core, memory
        # ports used, requests in flight and their limit, bursts still to request / not yet replied
        # in full, the round-robin position over its routers; per (i, r): bursts still to request,
        # data flits and bursts not yet at the controller queue; the routers it reads from
        "rd_core", "rd_ports", "rd_out", "rd_lim", "rd_reqs", "rd_bursts", "rd_rr", "rd_nr",
        "rd_left", "rd_dq", "rd_bq", "rd_rl",
        # writes: per (i, r) the data flits still to send; per i the flits of the burst being queued
        # (a burst longer than a packet) and its router
        "rd_oq", "rd_pend", "rd_pend_r",
        "rd_act",  # initiators with requests still to issue (first sc[S_RD_ACT])
        # the controller queues, a ring per router: entry (initiator * NR + router, data flits left)
        "cq_ir", "cq_flits", "cq_head", "cq_cnt",
    ],
)
P_WIDTH, P_MAX_PKT, P_TAGS, P_INFLIGHT, P_NR, P_CQCAP = range(6)
S_ACTIVE, S_FREE_TOP, S_TICKING, S_MESSAGES, S_READS, S_RD_ACT = range(6)
TAG_RD = 1 << 40  # packet tags from here on belong to DMA reads: TAG_RD + (i * NR + r) * 4 + kind
# kind: a request (a read's one flit, a write burst's last data packet: the burst reached its
# controller), a data packet back, the last packet back of a burst, a write burst's earlier packets
RD_REQ, RD_DATA, RD_DATA_LAST, RD_WDATA = 0, 1, 2, 3


def new_flit_engine(topo, routing, vcs: int, buffer_flits: int, router_stages: int, link_bytes: int,
                    max_packet_flits: int, num_slots: int = 256, memory_ports=None, num_initiators: int = 1,
                    max_outstanding: int = 16, transaction_bytes: int = 64) -> FlitEngine:
    """``memory_ports[r]``: lanes of router ``r``'s memory-controller port (see
    :func:`npusim.hw.noc.flit.make_state`); ``num_initiators`` DMA engines, each with
    ``max_outstanding`` tags of ``transaction_bytes`` (bytes) for its reads (module docstring)."""
    fs = make_state(topo, routing, vcs, buffer_flits, router_stages, source_queue_packets=64,
                    done_capacity=4 * topo.num_routers, memory_ports=memory_ports)
    z = lambda: np.zeros(num_slots, np.int64)  # noqa: E731
    ni, nr = int(num_initiators), int(topo.num_routers)
    tags = max(1, int(max_outstanding))
    cap = ni * tags  # every initiator's requests in flight could wait at one controller
    zi = lambda n: np.zeros(n, np.int64)  # noqa: E731
    return FlitEngine(
        fs=fs, prm=np.array([link_bytes, max_packet_flits, tags, tags * int(transaction_bytes), nr, cap], np.int64),
        m_task=np.full(num_slots, -1, np.int64), m_src=z(), m_dst=z(), m_flits_left=z(), m_packets_out=z(),
        m_free=np.arange(num_slots - 1, -1, -1, dtype=np.int64), active=z(),
        sc=np.array([0, num_slots, 0, 0, 0, 0], np.int64),
        rd_core=zi(ni), rd_ports=zi(ni), rd_out=zi(ni), rd_lim=zi(ni), rd_reqs=zi(ni), rd_bursts=zi(ni),
        rd_rr=zi(ni), rd_nr=zi(ni), rd_left=zi(ni * nr), rd_dq=zi(ni * nr), rd_bq=zi(ni * nr), rd_rl=zi(ni * nr),
        rd_oq=zi(ni * nr), rd_pend=zi(ni), rd_pend_r=zi(ni),
        rd_act=zi(ni), cq_ir=zi(nr * cap), cq_flits=zi(nr * cap), cq_head=zi(nr), cq_cnt=zi(nr),
    )


def grow_flit_slots(fe: FlitEngine) -> FlitEngine:
    """A copy with twice the message slots (the new ones free)."""
    old = fe.m_task.shape[0]
    new = 2 * old

    def grown(arr, fill=0):
        out = np.full(new, fill, np.int64)
        out[:old] = arr
        return out

    top = int(fe.sc[S_FREE_TOP])
    free = np.zeros(new, np.int64)
    free[:top] = fe.m_free[:top]
    free[top:top + old] = np.arange(new - 1, old - 1, -1)
    fe.sc[S_FREE_TOP] = top + old
    return fe._replace(m_task=grown(fe.m_task, -1), m_src=grown(fe.m_src), m_dst=grown(fe.m_dst),
                       m_flits_left=grown(fe.m_flits_left), m_packets_out=grown(fe.m_packets_out),
                       m_free=free, active=grown(fe.active))


@njit(cache=True, _nrt=False, inline="always")
def flit_slots_free(fe):
    return fe.sc[S_FREE_TOP]


@njit(cache=True, _nrt=False)
def flit_start(fe, heap, hs, task, src, dst, nbytes, now):
    """Start a message; the caller made sure a slot is free."""
    w = fe.prm[P_WIDTH]
    top = fe.sc[S_FREE_TOP] - 1
    fe.sc[S_FREE_TOP] = top
    slot = fe.m_free[top]
    fe.m_task[slot] = task
    fe.m_src[slot] = src
    fe.m_dst[slot] = dst
    fe.m_flits_left[slot] = max(np.int64(1), (nbytes + w - 1) // w)
    fe.m_packets_out[slot] = 0
    fe.active[fe.sc[S_ACTIVE]] = slot
    fe.sc[S_ACTIVE] += 1
    fe.sc[S_MESSAGES] += 1
    _enqueue(fe, heap, hs, now)
    if fe.sc[S_TICKING] == 0:
        fe.sc[S_TICKING] = 1
        event_push(heap, hs, now, EV_FLIT_TICK, 0)


@njit(cache=True, _nrt=False)
def _enqueue(fe, heap, hs, now):
    """Put packets of active messages into their NI FIFOs while there is room; a message
    whose packets are all queued frees its source queue and leaves the active list."""
    i = 0
    while i < fe.sc[S_ACTIVE]:
        slot = fe.active[i]
        while fe.m_flits_left[slot] > 0:
            n = min(fe.m_flits_left[slot], fe.prm[P_MAX_PKT])
            k = send_packet(fe.fs, fe.m_src[slot], fe.m_dst[slot], n, now, slot)
            if k < 0:
                break
            fe.m_flits_left[slot] -= n
            fe.m_packets_out[slot] += 1
        if fe.m_flits_left[slot] == 0:
            event_push(heap, hs, now, EV_QUEUE_FREE, fe.m_task[slot])
            fe.sc[S_ACTIVE] -= 1
            fe.active[i] = fe.active[fe.sc[S_ACTIVE]]
        else:
            i += 1


@njit(cache=True, _nrt=False)
def flit_read_add(fe, init, r, bursts, out_flits, back_flits):
    """Initiator ``init``'s next DMA asks attach router ``r`` for ``bursts`` bursts: ``out_flits``
    flits towards the memory (a read's requests, one a burst; a write's data) and ``back_flits``
    back (a read's data; a write's acknowledgements, one a burst). Call for each router, then
    :func:`flit_read_go`."""
    nr = fe.prm[P_NR]
    j = init * nr + r
    fe.rd_left[j] = bursts
    fe.rd_bq[j] = bursts
    fe.rd_oq[j] = out_flits
    fe.rd_dq[j] = back_flits
    fe.rd_rl[init * nr + fe.rd_nr[init]] = r
    fe.rd_nr[init] += 1
    fe.rd_reqs[init] += bursts
    fe.rd_bursts[init] += bursts


@njit(cache=True, _nrt=False)
def flit_read_go(fe, heap, hs, init, core, nbytes, now, ports):
    """Start initiator ``init``'s DMA of ``nbytes`` bytes (read or write) for core ``core`` (its
    routers given by :func:`flit_read_add`); ``ports``: the streams towards the memory leave at
    the routers' memory ports and those back enter at their memory injection lanes (else both use
    the routers' core ports). Its end is reported as ``EV_NOC_PART_END`` for ``init``."""
    reqs = fe.rd_reqs[init]
    req_bytes = max(np.int64(1), (nbytes + reqs - 1) // reqs)
    fe.rd_lim[init] = max(np.int64(1), min(fe.prm[P_TAGS], fe.prm[P_INFLIGHT] // req_bytes))
    fe.rd_core[init] = core
    fe.rd_ports[init] = ports
    fe.rd_out[init] = 0
    fe.rd_rr[init] = 0
    fe.rd_pend[init] = 0
    fe.rd_act[fe.sc[S_RD_ACT]] = init
    fe.sc[S_RD_ACT] += 1
    fe.sc[S_READS] += 1
    _rd_issue(fe, now)
    if fe.sc[S_TICKING] == 0:
        fe.sc[S_TICKING] = 1
        event_push(heap, hs, now, EV_FLIT_TICK, 0)


@njit(cache=True, _nrt=False, inline="always")
def _rd_send_pending(fe, init, now):
    """Queue the packets of ``init``'s current burst (its flits in ``rd_pend``) at its core's NI,
    towards the memory, while there is room; whether all are queued."""
    nr = fe.prm[P_NR]
    r = fe.rd_pend_r[init]
    while fe.rd_pend[init] > 0:
        f = fe.rd_pend[init]
        n = min(f, fe.prm[P_MAX_PKT])
        tag = TAG_RD + (init * nr + r) * 4 + (RD_REQ if n == f else RD_WDATA)
        if fe.rd_ports[init] != 0:
            k = send_packet_mem(fe.fs, fe.rd_core[init], r, n, now, tag)
        else:
            k = send_packet(fe.fs, fe.rd_core[init], r, n, now, tag)
        if k < 0:
            return False
        fe.rd_pend[init] = f - n
    return True


@njit(cache=True, _nrt=False)
def _rd_issue(fe, now):
    """Each DMA engine with bursts still to send sends the next one (a read's one-flit request, a
    write's data), cycling over its routers, while it has a free tag and its core's NI queue has
    room."""
    nr = fe.prm[P_NR]
    i = 0
    while i < fe.sc[S_RD_ACT]:
        init = fe.rd_act[i]
        base = init * nr
        ok = _rd_send_pending(fe, init, now)
        while ok and fe.rd_reqs[init] > 0 and fe.rd_out[init] < fe.rd_lim[init]:
            n = fe.rd_nr[init]
            j = fe.rd_rr[init]
            while fe.rd_left[base + fe.rd_rl[base + j]] == 0:
                j = (j + 1) % n
            r = fe.rd_rl[base + j]
            f = (fe.rd_oq[base + r] + fe.rd_left[base + r] - 1) // fe.rd_left[base + r]  # this burst's flits
            fe.rd_oq[base + r] -= f
            fe.rd_left[base + r] -= 1
            fe.rd_reqs[init] -= 1
            fe.rd_out[init] += 1
            fe.rd_rr[init] = (j + 1) % n
            fe.rd_pend[init] = f
            fe.rd_pend_r[init] = r
            ok = _rd_send_pending(fe, init, now)
        if fe.rd_reqs[init] == 0 and fe.rd_pend[init] == 0:
            fe.sc[S_RD_ACT] -= 1
            fe.rd_act[i] = fe.rd_act[fe.sc[S_RD_ACT]]
        else:
            i += 1


@njit(cache=True, _nrt=False)
def _cq_feed(fe, now):
    """The controller queues hand their data to the memory's source queues in order (packets of
    up to ``max_packet_flits``), while there is room."""
    nr = fe.prm[P_NR]
    cap = fe.prm[P_CQCAP]
    big = fe.prm[P_MAX_PKT]
    for r in range(nr):
        while fe.cq_cnt[r] > 0:
            h = r * cap + fe.cq_head[r]
            ir = fe.cq_ir[h]
            init = ir // nr
            f = fe.cq_flits[h]
            n = min(f, big)
            tag = TAG_RD + ir * 4 + (RD_DATA_LAST if n == f else RD_DATA)
            if fe.rd_ports[init] != 0:
                k = send_packet_from_mem(fe.fs, r, fe.rd_core[init], n, now, tag)
            else:
                k = send_packet(fe.fs, r, fe.rd_core[init], n, now, tag)
            if k < 0:
                break
            fe.cq_flits[h] = f - n
            if n == f:
                fe.cq_head[r] = (fe.cq_head[r] + 1) % cap
                fe.cq_cnt[r] -= 1


@njit(cache=True, _nrt=False)
def _rd_done(fe, heap, hs, tag, t):
    """A packet of a DMA completed at cycle ``t``: a burst reached its controller (a read's
    request, a write's last data packet: what goes back for it joins the controller queue) or
    what came back for a burst has all arrived (its tag is free; the DMA ends with its last
    burst); a write burst's earlier packets change nothing."""
    nr = fe.prm[P_NR]
    x = tag - TAG_RD
    kind = x & 3
    ir = x >> 2
    init = ir // nr
    r = ir - init * nr
    if kind == RD_REQ:
        cap = fe.prm[P_CQCAP]
        f = (fe.rd_dq[ir] + fe.rd_bq[ir] - 1) // fe.rd_bq[ir]  # this burst's share of what goes back
        fe.rd_dq[ir] -= f
        fe.rd_bq[ir] -= 1
        e = r * cap + (fe.cq_head[r] + fe.cq_cnt[r]) % cap
        fe.cq_ir[e] = ir
        fe.cq_flits[e] = f
        fe.cq_cnt[r] += 1
    elif kind == RD_DATA_LAST:
        fe.rd_out[init] -= 1
        fe.rd_bursts[init] -= 1
        if fe.rd_bursts[init] == 0:
            fe.rd_nr[init] = 0
            fe.sc[S_READS] -= 1
            event_push(heap, hs, t, EV_NOC_PART_END, init)


@njit(cache=True, _nrt=False)
def flit_tick(fe, heap, hs, now):
    """Advance the network one cycle at ``now``; end the messages completed in it."""
    fs = fe.fs
    _enqueue(fe, heap, hs, now)
    if fe.sc[S_READS] > 0:
        _rd_issue(fe, now)
        _cq_feed(fe, now)
    step(fs, now)
    for i in range(fs.ctr[K_DONE_CNT]):
        if fs.done[i, 0] >= TAG_RD:
            _rd_done(fe, heap, hs, fs.done[i, 0], fs.done[i, 1])
            continue
        slot = fs.done[i, 0]
        fe.m_packets_out[slot] -= 1
        if fe.m_packets_out[slot] == 0 and fe.m_flits_left[slot] == 0:
            event_push(heap, hs, fs.done[i, 1], EV_TASK_END, fe.m_task[slot])
            fe.m_task[slot] = -1
            fe.m_free[fe.sc[S_FREE_TOP]] = slot
            fe.sc[S_FREE_TOP] += 1
    fs.ctr[K_DONE_CNT] = 0
    if network_idle(fs) and fe.sc[S_ACTIVE] == 0 and fe.sc[S_READS] == 0:
        fe.sc[S_TICKING] = 0
    else:
        event_push(heap, hs, now + 1, EV_FLIT_TICK, 0)


__all__ = ["EV_FLIT_TICK", "TAG_RD", "FlitEngine", "flit_read_add", "flit_read_go",
           "flit_slots_free", "flit_start", "flit_tick", "grow_flit_slots",
           "new_flit_engine"]
