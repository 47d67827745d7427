"""Python's cyclic garbage collector during long simulation loops.

A serving loop allocates many short-lived objects per iteration (scheduler slots, the mapper's
blocks for new shapes, metrics rows) and keeps a large heap alive (records, cached programs). At
CPython's default threshold (a young-generation collection every 700 net allocations) a
150-request uncached serving run spent 1.85 s of its 32 s in 2,508 collections, 0.59 s with the
threshold below (``validation/perf/bench_serving.py``'s configuration, Mooncake's first 150
requests; the collections' time summed with ``gc.callbacks``). The loop creates no reference cycles that need collecting promptly, so
collecting less often costs only the memory of garbage awaiting a collection.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

YOUNG_THRESHOLD = 100_000


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect the young generation every ``YOUNG_THRESHOLD`` net allocations inside the block
    (never less often than the caller already does); the thresholds are restored after it."""
    old = gc.get_threshold()
    gc.set_threshold(max(YOUNG_THRESHOLD, old[0]), *old[1:])
    try:
        yield
    finally:
        gc.set_threshold(*old)
