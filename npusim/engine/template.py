"""A batch of tasks linked once and submitted many times (a serving iteration's program).

:func:`npusim.engine.core.add_tasks` links a batch into the task table as it adds it: queue
links, successor lists and dependency counts, task by task, each task's fields written at its row.
A batch whose dependencies all lie inside it links the same way wherever it lands, up to an
offset: its tasks' ids move by the table's size and its edges' by the edge count. A
:class:`BatchTemplate` is that linked form, made once by running ``add_tasks`` on an empty table
(:func:`make_template`); :func:`npusim.engine.core.add_template` then copies it in, offsets
added, and links its first and last task of each queue to the table's queues -- half the time of
``add_tasks`` for a 24k-task decode iteration, with the same table to the last field (a
property test compares them). Its edges are renumbered so that each task's successor list is
contiguous, in the order of the rows and of the list (the loop walks them so), which changes where
edges lie and nothing else.

Fields (row ``r`` = the task the batch stores at ``first + r``; ids and edges relative):
``kind, queue, param, deps_left, qnext, succ_head`` per row; ``e_dst, e_next`` per edge;
``q_ids, q_first, q_last``: each queue the batch uses, with its first and last row in the batch's
order; ``zero``: the rows with no dependency, in the batch's order (the only ones that may be
ready at submission); ``rows``: the row of each task of the batch (its ids are ``first + rows``).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.core import add_tasks
from npusim.engine.tasks import new_task_table

BatchTemplate = namedtuple(
    "BatchTemplate",
    ["kind", "queue", "param", "deps_left", "qnext", "succ_head", "e_dst", "e_next",
     "q_ids", "q_first", "q_last", "zero", "rows"],
)


@njit(cache=True, _nrt=False)
def _lists_in_row_order(succ_head, e_next, n, order):
    """Fill ``order`` with the edges of rows ``0 .. n-1``'s successor lists, row by row, each list
    in its order."""
    k = 0
    for r in range(n):
        e = succ_head[r]
        while e >= 0:
            order[k] = e
            k += 1
            e = e_next[e]


def make_template(num_queues: int, kind, queue, param, dep_ptr, dep_idx, rows) -> BatchTemplate:
    """The template of a batch (arrays as ``Engine.submit_batch`` takes them, already checked)
    whose dependencies are all its own tasks (``dep_idx`` in ``0 .. n-1``), laid out at ``rows``."""
    n = kind.shape[0]
    edges = dep_idx.shape[0]
    tt = new_task_table(num_queues, max(n, 1), max(edges, 1))
    add_tasks(tt, 0, n, kind, queue, param, dep_ptr, dep_idx, rows)
    order = np.empty(edges, dtype=np.int64)
    _lists_in_row_order(tt.succ_head, tt.e_next, n, order)
    renumber = np.full(edges + 1, -1, dtype=np.int64)  # old edge -> new; index -1 (no edge) stays -1
    renumber[order] = np.arange(edges)
    used = np.flatnonzero(tt.q_head >= 0)
    return BatchTemplate(
        kind=tt.kind[:n].copy(), queue=tt.queue[:n].copy(), param=tt.param[:n].copy(),
        deps_left=tt.deps_left[:n].copy(), qnext=tt.qnext[:n].copy(),
        succ_head=renumber[tt.succ_head[:n]].astype(np.int32),
        e_dst=tt.e_dst[:edges][order], e_next=renumber[tt.e_next[:edges][order]].astype(np.int32),
        q_ids=used.astype(np.int32), q_first=tt.q_head[used].astype(np.int32), q_last=tt.q_tail[used].astype(np.int32),
        zero=rows[np.diff(dep_ptr) == 0].astype(np.int32), rows=np.asarray(rows, dtype=np.int64).copy(),
    )
