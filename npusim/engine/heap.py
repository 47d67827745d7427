"""A binary min-heap of events in one int64 array, for use inside Numba code: the system level's
event queue (its fabric keeps thousands of events queued; the chip's loop uses the sorted list of
:mod:`npusim.engine.eventlist`, two columns, faster on a chip's short queues).

Row layout of ``heap[i]``: ``(time_cycles, seq, event_type, id)``. Events are ordered
by time, then by ``seq`` — a counter that increases with every push — so events at
the same cycle fire in the order they were scheduled: ties are deterministic.

``hs`` ("heap scalars") is an int64 array: ``hs[0]`` = size, ``hs[1]`` = next seq.
The heap never grows inside Numba: callers check :func:`heap_room` and return to
Python, which enlarges the array (see ``npusim.engine.Engine``).
"""

from __future__ import annotations

import numpy as np
import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

TIME, SEQ, ETYPE, EID = 0, 1, 2, 3
HS_SIZE, HS_SEQ = 0, 1


def new_heap(capacity: int) -> tuple[np.ndarray, np.ndarray]:
    return np.zeros((capacity, 4), dtype=np.int64), np.zeros(2, dtype=np.int64)


def renumber_events(rows: np.ndarray, types: np.ndarray, new_id: np.ndarray) -> None:
    """Replace the id ``i`` of every event in ``rows`` whose type is in ``types`` by ``new_id[i]``."""
    sel = np.isin(rows[:, ETYPE], types)
    rows[sel, EID] = new_id[rows[sel, EID]]


@njit(cache=True, _nrt=False, inline="always")
def _copy_row(heap, dst, src):
    heap[dst, TIME] = heap[src, TIME]
    heap[dst, SEQ] = heap[src, SEQ]
    heap[dst, ETYPE] = heap[src, ETYPE]
    heap[dst, EID] = heap[src, EID]


@njit(cache=True, _nrt=False)
def heap_push(heap, hs, time, etype, eid):
    """Add an event. Not ``inline="always"``, like ``eventlist.event_push`` (see there): a call
    passing two arrays and three integers costs little. The new event's ``seq`` is the largest yet,
    so it rises above a parent only of a later time; the parents it passes move down one row each
    and it is written once, where it stops (a hole, not swaps)."""
    i = hs[HS_SIZE]
    seq = hs[HS_SEQ]
    hs[HS_SIZE] = i + 1
    hs[HS_SEQ] = seq + 1
    while i > 0:
        parent = (i - 1) >> 1
        if heap[parent, TIME] <= time:
            break
        _copy_row(heap, i, parent)
        i = parent
    heap[i, TIME] = time
    heap[i, SEQ] = seq
    heap[i, ETYPE] = etype
    heap[i, EID] = eid


@njit(cache=True, _nrt=False, inline="always")
def heap_pop(heap, hs):
    """Remove the earliest event; returns (time, etype, id). Caller checks size > 0. The last row
    fills the root's place: the smaller child of the hole moves up until the last row's key is no
    larger than both children (written once, where it stops)."""
    time, etype, eid = heap[0, TIME], heap[0, ETYPE], heap[0, EID]
    n = hs[HS_SIZE] - 1
    hs[HS_SIZE] = n
    if n > 0:
        last_t, last_s = heap[n, TIME], heap[n, SEQ]
        i = 0
        child = 1
        while child < n:
            ct, cs = heap[child, TIME], heap[child, SEQ]
            right = child + 1
            if right < n:
                rt, rs = heap[right, TIME], heap[right, SEQ]
                if rt < ct or (rt == ct and rs < cs):
                    child, ct, cs = right, rt, rs
            if ct > last_t or (ct == last_t and cs > last_s):
                break
            _copy_row(heap, i, child)
            i = child
            child = 2 * i + 1
        _copy_row(heap, i, n)  # i < n: the row past the end is the last event, kept until here
    return time, etype, eid


@njit(cache=True, _nrt=False, inline="always")
def heap_next_time(heap, hs):
    """Time of the earliest event. Caller checks size > 0."""
    return heap[0, TIME]


@njit(cache=True, _nrt=False, inline="always")
def heap_room(heap, hs):
    return heap.shape[0] - hs[HS_SIZE]
