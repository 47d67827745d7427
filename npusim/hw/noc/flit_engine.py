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

A message may be a *part* of a DMA task (memory streams, :mod:`npusim.sim.mempath`):
``m_part`` holds the DMA engine's initiator id; it frees no queue and its end is reported
as ``EV_NOC_PART_END`` for that initiator. ``m_mem`` says which side of a memory controller a
stream uses: ``MEM_TO`` (read requests, write data) sends its packets to the destination's
memory-controller port (:func:`~npusim.hw.noc.flit_kernel.send_packet_mem`), ``MEM_FROM`` (read
data, write acknowledgements) injects them at the source through its memory injection lanes
(:func:`~npusim.hw.noc.flit_kernel.send_packet_from_mem`), not the core's NI; lanes from
``new_flit_engine(memory_ports=...)``.
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
MEM_NONE, MEM_TO, MEM_FROM = 0, 1, 2  # m_mem: an ordinary message, towards a memory port, from a memory

FlitEngine = namedtuple(
    "FlitEngine",
    [
        "fs",  # the flit model's state
        "prm",  # [flit bytes, max packet flits]
        "m_task", "m_src", "m_dst", "m_flits_left", "m_packets_out", "m_part", "m_mem", "m_free",
        "active", "sc",  # slots still enqueuing packets; scalars (see S_*)
    ],
)
P_WIDTH, P_MAX_PKT = 0, 1
S_ACTIVE, S_FREE_TOP, S_TICKING, S_MESSAGES = 0, 1, 2, 3


def new_flit_engine(topo, routing, vcs: int, buffer_flits: int, router_stages: int, link_bytes: int,
                    max_packet_flits: int, num_slots: int = 256, memory_ports=None) -> FlitEngine:
    """``memory_ports[r]``: lanes of router ``r``'s memory-controller port (see
    :func:`npusim.hw.noc.flit.make_state`)."""
    fs = make_state(topo, routing, vcs, buffer_flits, router_stages, source_queue_packets=64,
                    done_capacity=4 * topo.num_routers, memory_ports=memory_ports)
    z = lambda: np.zeros(num_slots, np.int64)  # noqa: E731
    return FlitEngine(
        fs=fs, prm=np.array([link_bytes, max_packet_flits], np.int64),
        m_task=np.full(num_slots, -1, np.int64), m_src=z(), m_dst=z(), m_flits_left=z(), m_packets_out=z(),
        m_part=np.full(num_slots, -1, np.int64), m_mem=z(),
        m_free=np.arange(num_slots - 1, -1, -1, dtype=np.int64), active=z(),
        sc=np.array([0, num_slots, 0, 0], np.int64),
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
                       m_part=grown(fe.m_part, -1), m_mem=grown(fe.m_mem),
                       m_free=free, active=grown(fe.active))


@njit(cache=True, _nrt=False, inline="always")
def flit_slots_free(fe):
    return fe.sc[S_FREE_TOP]


@njit(cache=True, _nrt=False)
def flit_start(fe, heap, hs, task, src, dst, nbytes, now):
    """Start a message; the caller made sure a slot is free."""
    w = fe.prm[P_WIDTH]
    _launch(fe, heap, hs, task, -1, src, dst, max(np.int64(1), (nbytes + w - 1) // w), now, 0)


@njit(cache=True, _nrt=False)
def flit_start_part(fe, heap, hs, owner, src, dst, flits, now, mem):
    """Start a message of ``flits`` flits, part of initiator ``owner``'s DMA task; ``mem``:
    ``MEM_TO``, its packets leave at ``dst``'s memory-controller port (``send_packet_mem``), not
    the local one; ``MEM_FROM``, they enter at ``src``'s memory injection lanes
    (``send_packet_from_mem``), not its NI; ``MEM_NONE``: an ordinary message."""
    _launch(fe, heap, hs, -1, owner, src, dst, flits, now, mem)


@njit(cache=True, _nrt=False)
def _launch(fe, heap, hs, task, part, src, dst, flits, now, mem):
    top = fe.sc[S_FREE_TOP] - 1
    fe.sc[S_FREE_TOP] = top
    slot = fe.m_free[top]
    fe.m_task[slot] = task
    fe.m_part[slot] = part
    fe.m_src[slot] = src
    fe.m_dst[slot] = dst
    fe.m_flits_left[slot] = flits
    fe.m_packets_out[slot] = 0
    fe.m_mem[slot] = mem
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
            if fe.m_mem[slot] == MEM_TO:
                k = send_packet_mem(fe.fs, fe.m_src[slot], fe.m_dst[slot], n, now, slot)
            elif fe.m_mem[slot] == MEM_FROM:
                k = send_packet_from_mem(fe.fs, fe.m_src[slot], fe.m_dst[slot], n, now, slot)
            else:
                k = send_packet(fe.fs, fe.m_src[slot], fe.m_dst[slot], n, now, slot)
            if k < 0:
                break
            fe.m_flits_left[slot] -= n
            fe.m_packets_out[slot] += 1
        if fe.m_flits_left[slot] == 0:
            if fe.m_part[slot] < 0:
                event_push(heap, hs, now, EV_QUEUE_FREE, fe.m_task[slot])
            fe.sc[S_ACTIVE] -= 1
            fe.active[i] = fe.active[fe.sc[S_ACTIVE]]
        else:
            i += 1


@njit(cache=True, _nrt=False)
def flit_tick(fe, heap, hs, now):
    """Advance the network one cycle at ``now``; end the messages completed in it."""
    fs = fe.fs
    _enqueue(fe, heap, hs, now)
    step(fs, now)
    for i in range(fs.ctr[K_DONE_CNT]):
        slot = fs.done[i, 0]
        fe.m_packets_out[slot] -= 1
        if fe.m_packets_out[slot] == 0 and fe.m_flits_left[slot] == 0:
            if fe.m_part[slot] >= 0:
                event_push(heap, hs, fs.done[i, 1], EV_NOC_PART_END, fe.m_part[slot])
            else:
                event_push(heap, hs, fs.done[i, 1], EV_TASK_END, fe.m_task[slot])
            fe.m_task[slot] = -1
            fe.m_part[slot] = -1
            fe.m_free[fe.sc[S_FREE_TOP]] = slot
            fe.sc[S_FREE_TOP] += 1
    fs.ctr[K_DONE_CNT] = 0
    if network_idle(fs) and fe.sc[S_ACTIVE] == 0:
        fe.sc[S_TICKING] = 0
    else:
        event_push(heap, hs, now + 1, EV_FLIT_TICK, 0)


__all__ = ["EV_FLIT_TICK", "MEM_FROM", "MEM_NONE", "MEM_TO", "FlitEngine", "flit_slots_free", "flit_start", "flit_start_part", "flit_tick", "grow_flit_slots",
           "new_flit_engine"]
