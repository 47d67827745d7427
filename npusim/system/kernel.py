"""The system-level simulation loop: the engine's tasks and heap driving the fabric model, in Numba.

Same engine as the chip (:mod:`npusim.engine`), another hardware model. Task kinds:

* ``KIND_FIXED`` / ``KIND_NOTIFY``: a duration of ``param[0]`` picoseconds (a die's compute, its
  time taken from the chip simulator through the chip-cost interface); ``KIND_NOTIFY`` returns
  to Python when it completes;
* ``KIND_FLOW``: a transfer over the fabric, timed by the flow or packet model
  (:mod:`npusim.hw.fabric`), parameters in :mod:`npusim.hw.fabric.state`.

Time is integer picoseconds. The loop returns to Python at ``until``, when the watched task
completes, after ``max_events`` events, when the heap or the packet pool must grow, or when idle.
"""

from __future__ import annotations

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.core import mark_finished, mark_started, pop_ready, release_queue
from npusim.engine.heap import HS_SIZE, heap_next_time, heap_pop, heap_push, heap_room
from npusim.engine.tasks import EV_QUEUE_FREE, EV_TASK_END, KIND_FIXED, SC_NEVENTS, SC_NOTIFIED, SC_NOW
from npusim.hw.fabric.flow import EV_FLOW_BEGIN, EV_FLOW_UPDATE, flow_begin, flow_start, flow_update
from npusim.hw.fabric.packet import EV_PKT_ARRIVE, packet_arrive, packet_begin, packet_slots_free
from npusim.hw.fabric.state import MODE_PACKET, S_MODE, S_NACT

KIND_FLOW = 4
KIND_NOTIFY = 3

(STATUS_IDLE, STATUS_TIME_LIMIT, STATUS_WATCH, STATUS_GROW, STATUS_EVENT_LIMIT, STATUS_GROW_PACKETS,
 STATUS_NOTIFY) = range(7)

HEADROOM = 8  # events one task start or one packet-model handler can push (a flow update pushes
# one per active transfer it finishes, plus one: the room check counts those too)


@njit(cache=True, _nrt=False, nogil=True)  # no Python objects inside: the progress heartbeat runs beside it
def system_loop(tt, heap, hs, fs, until, watch, max_events):
    """Advance the system simulation; returns a ``STATUS_*`` code (see module docstring)."""
    events = 0
    packet = fs.sc[S_MODE] == MODE_PACKET
    while True:
        while True:
            if heap_room(heap, hs) < HEADROOM + fs.sc[S_NACT]:
                return STATUS_GROW
            task = pop_ready(tt)
            if task < 0:
                break
            now = tt.sc[SC_NOW]
            mark_started(tt, task, now)
            kind = tt.kind[task]
            if kind == KIND_FLOW:
                flow_start(fs, tt, heap, hs, task, now)
            else:  # KIND_FIXED, KIND_NOTIFY (other kinds are rejected at submission)
                heap_push(heap, hs, now + tt.param[task, 0], EV_TASK_END, task)
        if hs[HS_SIZE] == 0:
            return STATUS_IDLE
        if heap_next_time(heap, hs) > until:
            tt.sc[SC_NOW] = max(tt.sc[SC_NOW], until)
            return STATUS_TIME_LIMIT
        if events >= max_events:
            return STATUS_EVENT_LIMIT
        if packet and not packet_slots_free(fs):
            return STATUS_GROW_PACKETS
        time, etype, eid = heap_pop(heap, hs)
        now = max(time, tt.sc[SC_NOW])
        tt.sc[SC_NOW] = now
        tt.sc[SC_NEVENTS] += 1
        events += 1
        if etype == EV_TASK_END:
            mark_finished(tt, eid, now)
            if eid == watch:
                return STATUS_WATCH
            if tt.kind[eid] == KIND_NOTIFY:
                tt.sc[SC_NOTIFIED] = eid
                return STATUS_NOTIFY
        elif etype == EV_QUEUE_FREE:
            release_queue(tt, eid, now)
        elif etype == EV_FLOW_BEGIN:
            if packet:
                packet_begin(fs, tt, heap, hs, eid, now)
            else:
                flow_begin(fs, tt, heap, hs, eid, now)
        elif etype == EV_FLOW_UPDATE:
            flow_update(fs, tt, heap, hs, eid, now)
        elif etype == EV_PKT_ARRIVE:
            packet_arrive(fs, tt, heap, hs, eid, now)


KINDS = (KIND_FIXED, KIND_NOTIFY, KIND_FLOW)
