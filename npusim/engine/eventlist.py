"""The chip loop's event queue: every queued event in one int64 array sorted latest first, for use
inside Numba code. Same layout and scalars as :mod:`npusim.engine.heap` (whose binary heap the
system level keeps), so :class:`npusim.engine.Engine` grows and renumbers either alike.

Row layout of ``heap[i]``, ``i < hs[0]``: ``(time_cycles, seq, event_type, id)``, in descending
order of ``(time, seq)``: the earliest event is the last row. ``seq`` -- a counter that increases
with every push -- orders events of the same cycle in the order they were scheduled, so ties are
deterministic and the order is exactly a priority queue's on ``(time, seq)`` (a property test
checks it against ``heapq``). ``hs`` ("heap scalars"): ``hs[0]`` = size, ``hs[1]`` = next seq.

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

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.heap import EID, ETYPE, HS_SEQ, HS_SIZE, SEQ, TIME, _copy_row


@njit(cache=True, _nrt=False)
def event_push(heap, hs, time, etype, eid):
    """Add an event. Not ``inline="always"``: the models call it from ~40 places, and each inlined
    copy slowed Numba's inlining of its caller into the kernel (see ``npusim.sim.kernel``); a call
    passing two arrays and three integers costs little. The rows due no later than the new event
    move up one, and it is written below the later ones: its ``seq`` is the largest yet, so it pops
    after every queued event of its time."""
    n = hs[HS_SIZE]
    seq = hs[HS_SEQ]
    hs[HS_SIZE] = n + 1
    hs[HS_SEQ] = seq + 1
    j = n - 1
    while j >= 0 and heap[j, TIME] <= time:
        _copy_row(heap, j + 1, j)
        j -= 1
    heap[j + 1, TIME] = time
    heap[j + 1, SEQ] = seq
    heap[j + 1, ETYPE] = etype
    heap[j + 1, EID] = eid


@njit(cache=True, _nrt=False, inline="always")
def event_pop(heap, hs):
    """Remove the earliest event (the last row); returns (time, etype, id). Caller checks size > 0."""
    n = hs[HS_SIZE] - 1
    hs[HS_SIZE] = n
    return heap[n, TIME], heap[n, ETYPE], heap[n, EID]


@njit(cache=True, _nrt=False, inline="always")
def event_next_time(heap, hs):
    """Time of the earliest event. Caller checks size > 0."""
    return heap[hs[HS_SIZE] - 1, TIME]


@njit(cache=True, _nrt=False, inline="always")
def event_room(heap, hs):
    return heap.shape[0] - hs[HS_SIZE]
