"""A binary min-heap of events in one int64 array, for use inside Numba code.

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


@njit(cache=True, _nrt=False, inline="always")
def _less(heap, i, j):
    ti, tj = heap[i, TIME], heap[j, TIME]
    if ti != tj:
        return ti < tj
    return heap[i, SEQ] < heap[j, SEQ]


@njit(cache=True, _nrt=False, inline="always")
def _swap(heap, i, j):
    for c in range(4):
        tmp = heap[i, c]
        heap[i, c] = heap[j, c]
        heap[j, c] = tmp


@njit(cache=True, _nrt=False)
def heap_push(heap, hs, time, etype, eid):
    """Add an event. Not ``inline="always"``: the models call it from ~40 places, and each inlined
    copy slowed Numba's inlining of its caller into the kernel (see ``npusim.sim.kernel``); a call
    passing two arrays and three integers costs little."""
    i = hs[HS_SIZE]
    heap[i, TIME] = time
    heap[i, SEQ] = hs[HS_SEQ]
    heap[i, ETYPE] = etype
    heap[i, EID] = eid
    hs[HS_SIZE] = i + 1
    hs[HS_SEQ] += 1
    while i > 0:
        parent = (i - 1) >> 1
        if _less(heap, i, parent):
            _swap(heap, i, parent)
            i = parent
        else:
            break


@njit(cache=True, _nrt=False, inline="always")
def heap_pop(heap, hs):
    """Remove the earliest event; returns (time, etype, id). Caller checks size > 0."""
    time, etype, eid = heap[0, TIME], heap[0, ETYPE], heap[0, EID]
    n = hs[HS_SIZE] - 1
    hs[HS_SIZE] = n
    if n > 0:
        for c in range(4):
            heap[0, c] = heap[n, c]
        i = 0
        while True:
            left = 2 * i + 1
            if left >= n:
                break
            child = left
            right = left + 1
            if right < n and _less(heap, right, left):
                child = right
            if _less(heap, child, i):
                _swap(heap, child, i)
                i = child
            else:
                break
    return time, etype, eid


@njit(cache=True, _nrt=False, inline="always")
def heap_room(heap, hs):
    return heap.shape[0] - hs[HS_SIZE]
