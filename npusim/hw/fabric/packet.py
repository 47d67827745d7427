"""Packet-level fabric model: transfers cut into packets that reserve links hop by hop.

Like the chip's path-level NoC, at packet granularity, for small cases and for checking the flow
model:

* after its ``setup_ps`` a transfer injects packets of ``packet_bytes`` (wire bytes) one after
  another: the next packet enters the first link when the previous one has left it;
* a packet whose head reaches a link at ``t`` starts crossing it at ``max(t, link free)``
  (first come, first served in event order: deterministic), occupies it for
  ``ceil(bytes / capacity)`` picoseconds — but not before its tail has arrived (cut-through) —
  and its head reaches the next link one hop latency (link + the switch at its far end) later;
* the transfer completes ``return_ps`` after its last packet's tail reaches the destination.

Buffers are unbounded (no credit back-pressure) and a bundle of parallel links is one faster
link (traffic sprayed evenly), as in the flow model, so the two differ only by packetisation
and arbitration order. Cost: one event per packet per hop.
"""

from __future__ import annotations

import math

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.heap import heap_push
from npusim.engine.tasks import EV_TASK_END
from npusim.hw.fabric.state import FP_RETURN_PS, FP_ROUTE, FP_WIRE_BYTES, S_PACKET_BYTES, S_PKT_FREE

EV_PKT_ARRIVE = 42


@njit(cache=True, _nrt=False, inline="always")
def packet_slots_free(fs):
    return fs.sc[S_PKT_FREE] >= 0


@njit(cache=True, _nrt=False)
def _inject(fs, tt, heap, hs, task, at):
    """The next packet of ``task`` enters its first link's queue at ``at``."""
    wire = tt.param[task, FP_WIRE_BYTES]
    size = min(fs.sc[S_PACKET_BYTES], wire - fs.f_sent[task])
    slot = fs.sc[S_PKT_FREE]
    fs.sc[S_PKT_FREE] = fs.p_next_free[slot]
    fs.p_task[slot] = task
    fs.p_hop[slot] = 0
    fs.p_bytes[slot] = size
    fs.p_tail[slot] = at
    fs.f_sent[task] += size
    heap_push(heap, hs, at, EV_PKT_ARRIVE, slot)


@njit(cache=True, _nrt=False)
def packet_begin(fs, tt, heap, hs, task, now):
    """EV_FLOW_BEGIN in packet mode: start injecting (a zero-byte transfer completes at once)."""
    fs.f_sent[task] = 0
    fs.f_done_bytes[task] = 0
    if tt.param[task, FP_WIRE_BYTES] <= 0:
        r = tt.param[task, FP_ROUTE]
        heap_push(heap, hs, now + fs.route_lat[r] + tt.param[task, FP_RETURN_PS], EV_TASK_END, task)
        return
    _inject(fs, tt, heap, hs, task, now)


@njit(cache=True, _nrt=False)
def packet_arrive(fs, tt, heap, hs, slot, now):
    """EV_PKT_ARRIVE: a packet's head reaches the input of its next link."""
    task = fs.p_task[slot]
    r = tt.param[task, FP_ROUTE]
    k = fs.route_ptr[r] + fs.p_hop[slot]
    link = fs.route_link[k]
    size = fs.p_bytes[slot]
    start = max(now, fs.link_free[link])
    end = max(start + int(math.ceil(size / fs.link_cap[link])), fs.p_tail[slot])
    fs.link_free[link] = end
    fs.link_bytes[link] += size
    fs.link_busy_ps[link] += end - start
    hop = fs.link_hop_ps[link]
    if fs.p_hop[slot] == 0 and fs.f_sent[task] < tt.param[task, FP_WIRE_BYTES]:
        _inject(fs, tt, heap, hs, task, end)  # the kernel keeps a free slot before every event
    if k == fs.route_ptr[r + 1] - 1:  # last hop: the tail reaches the destination
        fs.f_done_bytes[task] += size
        if fs.f_done_bytes[task] >= tt.param[task, FP_WIRE_BYTES]:
            heap_push(heap, hs, end + hop + tt.param[task, FP_RETURN_PS], EV_TASK_END, task)
        fs.p_next_free[slot] = fs.sc[S_PKT_FREE]
        fs.sc[S_PKT_FREE] = slot
    else:
        fs.p_hop[slot] += 1
        fs.p_tail[slot] = end + hop
        heap_push(heap, hs, start + hop, EV_PKT_ARRIVE, slot)
