"""Numba primitives of the task engine: adding tasks, starting and finishing them.

These functions know nothing about what a task does; the simulation kernel
(``npusim.sim.kernel``) calls them and dispatches on ``kind`` to hardware models.
See :mod:`npusim.engine.tasks` for the table layout and queue semantics.
"""

from __future__ import annotations

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.tasks import (
    DONE,
    KIND_FIXED,
    PENDING,
    RUNNING,
    SC_NDONE,
    SC_NEDGES,
    SC_NTASKS,
    SC_READY_HEAD,
    SC_READY_TAIL,
)


@njit(cache=True, _nrt=False, inline="always")
def _can_start(tt, task):
    if tt.state[task] != PENDING or tt.deps_left[task] != 0:
        return False
    q = tt.queue[task]
    return q < 0 or (tt.q_running[q] < 0 and tt.q_head[q] == task)


@njit(cache=True, _nrt=False, inline="always")
def _push_ready(tt, task):
    tail = tt.sc[SC_READY_TAIL]
    tt.ready[tail] = task
    tt.sc[SC_READY_TAIL] = tail + 1


@njit(cache=True, _nrt=False, inline="always")
def pop_ready(tt):
    """Next task that may start now, or -1. Tasks made ready twice are returned once."""
    while tt.sc[SC_READY_HEAD] < tt.sc[SC_READY_TAIL]:
        task = tt.ready[tt.sc[SC_READY_HEAD]]
        tt.sc[SC_READY_HEAD] += 1
        if _can_start(tt, task):
            return task
    return -1


@njit(cache=True, _nrt=False)
def add_tasks(tt, first, count, kind, queue, param, dep_ptr, dep_idx, row):
    """Add tasks ``0 .. count-1`` of a batch and link them into their queues and the dependency
    graph. Task ``i`` (``kind[i]``, ``queue[i]``, ``param[i]``: its first parameters, the rest 0)
    is stored at row ``first + row[i]`` (``row`` a permutation of ``0 .. count-1``);
    ``dep_idx[dep_ptr[i]:dep_ptr[i+1]]`` are its predecessors as absolute ids, those of this batch
    as ``first + j`` for its task ``j`` (done predecessors are skipped).

    Queues, successor lists and the first ready tasks are linked in the batch's order ``i``,
    whatever the rows: the loop only follows these links, so a batch runs the same at any
    ``row`` -- which only sets where each task's fields lie in memory (see ``Engine.submit_batch``)."""
    n_edges = tt.sc[SC_NEDGES]
    given = param.shape[1]
    for i in range(count):
        task = first + row[i]
        tt.kind[task] = kind[i]
        tt.queue[task] = queue[i]
        for j in range(given):
            tt.param[task, j] = param[i, j]
        for j in range(given, tt.param.shape[1]):
            tt.param[task, j] = 0
        tt.state[task] = PENDING
        tt.start[task] = -1
        tt.end[task] = -1
        tt.qnext[task] = -1
        tt.succ_head[task] = -1
        q = tt.queue[task]
        if q >= 0:
            if tt.q_tail[q] >= 0 and tt.state[tt.q_tail[q]] != DONE:
                tt.qnext[tt.q_tail[q]] = task
            if tt.q_head[q] < 0:
                tt.q_head[q] = task
            tt.q_tail[q] = task
        deps = 0
        for k in range(dep_ptr[i], dep_ptr[i + 1]):
            pred = dep_idx[k]
            if pred >= first:  # of this batch: not done (maybe not even initialised yet)
                pred = first + row[pred - first]
            elif tt.state[pred] == DONE:
                continue
            deps += 1
            tt.e_dst[n_edges] = task
            tt.e_next[n_edges] = tt.succ_head[pred]
            tt.succ_head[pred] = n_edges
            n_edges += 1
        tt.deps_left[task] = deps
    tt.sc[SC_NEDGES] = n_edges
    tt.sc[SC_NTASKS] = first + count
    for i in range(count):
        if _can_start(tt, first + row[i]):
            _push_ready(tt, first + row[i])


@njit(cache=True, _nrt=False)
def add_template(tt, first, tp, patch_rows, patch_param, extra_rows, extra_preds):
    """Add a :class:`npusim.engine.template.BatchTemplate` at ``first``: the table ends as
    ``add_tasks`` would leave it for the batch the template was made from (its fields at the same
    rows; edges elsewhere, each list in the same order). ``patch_param[k]`` replaces the parameters
    of row ``patch_rows[k]``. Rows ``extra_rows`` (in the batch's order) also depend on the tasks
    ``extra_preds`` (absolute ids; done ones skipped), as if listed after their own dependencies."""
    eb = tt.sc[SC_NEDGES]
    n = tp.kind.shape[0]
    width = tp.param.shape[1]
    for r in range(n):
        t = first + r
        tt.kind[t] = tp.kind[r]
        tt.queue[t] = tp.queue[r]
        for j in range(width):
            tt.param[t, j] = tp.param[r, j]
        tt.deps_left[t] = tp.deps_left[r]
        tt.state[t] = PENDING
        tt.start[t] = -1
        tt.end[t] = -1
        nxt = tp.qnext[r]
        tt.qnext[t] = first + nxt if nxt >= 0 else -1
        head = tp.succ_head[r]
        tt.succ_head[t] = eb + head if head >= 0 else -1
    for k in range(patch_rows.shape[0]):
        for j in range(width):
            tt.param[first + patch_rows[k], j] = patch_param[k, j]
    n_edges = eb + tp.e_dst.shape[0]
    for e in range(tp.e_dst.shape[0]):
        tt.e_dst[eb + e] = first + tp.e_dst[e]
        nxt = tp.e_next[e]
        tt.e_next[eb + e] = eb + nxt if nxt >= 0 else -1
    for k in range(extra_rows.shape[0]):
        task = first + extra_rows[k]
        for pred in extra_preds:
            if tt.state[pred] == DONE:
                continue
            tt.deps_left[task] += 1
            tt.e_dst[n_edges] = task
            tt.e_next[n_edges] = tt.succ_head[pred]
            tt.succ_head[pred] = n_edges
            n_edges += 1
    for k in range(tp.q_ids.shape[0]):
        q = tp.q_ids[k]
        head = first + tp.q_first[k]
        if tt.q_tail[q] >= 0 and tt.state[tt.q_tail[q]] != DONE:
            tt.qnext[tt.q_tail[q]] = head
        if tt.q_head[q] < 0:
            tt.q_head[q] = head
        tt.q_tail[q] = first + tp.q_last[k]
    tt.sc[SC_NEDGES] = n_edges
    tt.sc[SC_NTASKS] = first + n
    for k in range(tp.zero.shape[0]):
        if _can_start(tt, first + tp.zero[k]):
            _push_ready(tt, first + tp.zero[k])


@njit(cache=True, _nrt=False, inline="always")
def mark_started(tt, task, now):
    tt.state[task] = RUNNING
    tt.start[task] = now
    q = tt.queue[task]
    if q >= 0:
        tt.q_running[q] = task
        tt.q_head[q] = tt.qnext[task]


@njit(cache=True, _nrt=False, inline="always")
def release_queue(tt, task, now):
    """``task`` stops occupying its queue at ``now`` (it may still be running)."""
    q = tt.queue[task]
    if q < 0 or tt.q_running[q] != task:
        return
    held = now - tt.start[task]
    if tt.kind[task] == KIND_FIXED and tt.param[task, 1] > 0:  # a hold: busy only param[1] of it
        held = min(held, tt.param[task, 1])
    tt.q_busy[q] += held
    tt.q_running[q] = -1
    head = tt.q_head[q]
    if head >= 0 and _can_start(tt, head):
        _push_ready(tt, head)
    if tt.q_tail[q] == task:
        tt.q_tail[q] = -1


@njit(cache=True, _nrt=False, inline="always")
def mark_finished(tt, task, now):
    """Finish ``task`` at ``now``: free its queue (if still held), release successors."""
    release_queue(tt, task, now)
    tt.state[task] = DONE
    tt.end[task] = now
    tt.sc[SC_NDONE] += 1
    e = tt.succ_head[task]
    while e >= 0:
        succ = tt.e_dst[e]
        tt.deps_left[succ] -= 1
        if tt.deps_left[succ] == 0 and _can_start(tt, succ):
            _push_ready(tt, succ)
        e = tt.e_next[e]


@njit(cache=True, _nrt=False)
def copy_successors(tt, old, new_id, e_dst, e_next, succ_head):
    """Rebuild the successor lists of tasks ``old`` (new ids ``0..len(old)-1``) into the
    given edge arrays, targets renumbered by ``new_id``, each list in its order (the order in
    which a finishing task releases its successors, so the order in which those that become ready
    at once start: a compaction must not change it); returns the number of edges."""
    edges = 0
    for i in range(old.shape[0]):
        e = tt.succ_head[old[i]]
        prev = -1
        while e >= 0:
            e_dst[edges] = new_id[tt.e_dst[e]]
            e_next[edges] = -1
            if prev < 0:
                succ_head[i] = edges
            else:
                e_next[prev] = edges
            prev = edges
            edges += 1
            e = tt.e_next[e]
    return edges
