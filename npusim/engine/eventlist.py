"""The chip loop's event queue: every queued event in one int64 array sorted latest first, for use
inside Numba code. The system level keeps the binary heap of :mod:`npusim.engine.heap` (same scalars
``hs``; :class:`npusim.engine.Engine` grows and renumbers either).

Row layout of ``heap[i]``, ``i < hs[0]``: ``(time_cycles, event)``, ``event = id << EV_TYPE_BITS |
type`` (types are below 64, ids may be -1), in descending order of time; among events of the same
time, the one pushed first lies last, so it pops first. That is exactly a priority queue's order on
``(time, push order)`` -- what the binary heap's ``seq`` column gives it -- without storing a
sequence number (a property test checks both against ``heapq``). ``hs[0]`` = size (``hs[1]``
unused here). Two columns, not the heap's four: a push moves each row due no later by two int64
stores instead of four (at the path NoC a push moves ~25-30 rows of ~60-100; dropping the
unread ``seq`` and packing type and id took the kernel from ~76 to ~65 ms a decode iteration with 16
in flight, medians of 18 runs on a noisy 2-core machine, identical results).

Why a sorted list: a chip's queue is short and its new events are mostly due soon. With a serving
pipeline's 16 iterations in flight ~73 events are queued, ~60 of them far off (long DMAs, other
stages' tasks), and a new event was due before 64 of them on average (a Qwen3-4B decode
iteration's trace). A push here moves the ~9 rows due no later up by one, a pop takes the last
row, and neither does the ~6 hard-to-predict compares per level of a binary heap: ~14% less kernel
time on that pipeline and ~19% at the path NoC (``validation/perf/bench_engine.py --pipeline``). Its
cost grows with the events due before a new one, so queues of thousands with events scheduled
anywhere (the system level's fabric: 20x slower with it) keep the binary heap; the engine
benchmark's random DAG (320 queues busy at once, durations 1-99 cycles) runs ~20% slower with it.
The array never grows inside Numba: callers check :func:`event_room` and return to Python, which
enlarges it (``Engine.grow_heap``).
"""

from __future__ import annotations

import numpy as np
import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.heap import HS_SIZE

EL_TIME, EL_EVENT = 0, 1  # a row: the time, then the event (its type in the low EV_TYPE_BITS bits, its id above)
EV_TYPE_BITS = 6
EV_TYPE_MASK = (1 << EV_TYPE_BITS) - 1


def new_event_list(capacity: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((capacity, 2), dtype=np.int64), np.zeros(2, dtype=np.int64)


def renumber_events(rows: np.ndarray, types: np.ndarray, new_id: np.ndarray) -> None:
    """Replace the id ``i`` of every event in ``rows`` whose type is in ``types`` by ``new_id[i]``."""
    ev = rows[:, EL_EVENT]
    sel = np.isin(ev & EV_TYPE_MASK, types)
    rows[sel, EL_EVENT] = (new_id[ev[sel] >> EV_TYPE_BITS] << EV_TYPE_BITS) | (ev[sel] & EV_TYPE_MASK)


@njit(cache=True, _nrt=False)
def event_push(heap, hs, time, etype, eid):
    """Add an event. Not ``inline="always"``: the models call it from ~40 places, and each inlined
    copy slowed Numba's inlining of its caller into the kernel (see ``npusim.sim.kernel``); a call
    passing two arrays and three integers costs little. The rows due no later than the new event
    move up one, and it is written below them: it pops after every queued event of its time."""
    n = hs[HS_SIZE]
    hs[HS_SIZE] = n + 1
    j = n - 1
    while j >= 0 and heap[j, EL_TIME] <= time:
        heap[j + 1, EL_TIME] = heap[j, EL_TIME]
        heap[j + 1, EL_EVENT] = heap[j, EL_EVENT]
        j -= 1
    heap[j + 1, EL_TIME] = time
    heap[j + 1, EL_EVENT] = (eid << EV_TYPE_BITS) | etype


@njit(cache=True, _nrt=False, inline="always")
def event_pop(heap, hs):
    """Remove the earliest event (the last row); returns (time, etype, id). Caller checks size > 0."""
    n = hs[HS_SIZE] - 1
    hs[HS_SIZE] = n
    ev = heap[n, EL_EVENT]
    return heap[n, EL_TIME], ev & EV_TYPE_MASK, ev >> EV_TYPE_BITS


@njit(cache=True, _nrt=False, inline="always")
def event_next_time(heap, hs):
    """Time of the earliest event. Caller checks size > 0."""
    return heap[hs[HS_SIZE] - 1, EL_TIME]


@njit(cache=True, _nrt=False, inline="always")
def event_room(heap, hs):
    return heap.shape[0] - hs[HS_SIZE]
