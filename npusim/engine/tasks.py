"""The task table: every task, queue and dependency edge as numpy arrays.

A *task* is a unit of work bound to one *resource queue* (a core's cube, vector,
DMA or NoC pipe; ``-1`` = no queue, e.g. a barrier). Queues are in-order: a task
starts when all its dependencies are done **and** every earlier task of its queue
has finished — or has freed the queue early (``EV_QUEUE_FREE``: a NoC message frees
its source once its tail is injected, though it completes only at the destination) —
like an NPU's instruction pipes. What a task does, and how long it
takes, is decided by the model its ``kind`` selects (see ``npusim.sim``); the
engine only knows kinds as integers, except :data:`KIND_FIXED` whose duration is
``param[0]`` cycles. A ``KIND_FIXED`` task with ``param[1] > 0`` is a *hold*: it keeps its
queue for ``param[0]`` cycles but counts only ``param[1]`` of them as busy (the serving
iteration cache's stand-in for a queue's work of an iteration: its span, and its busy time).

Layout (struct of arrays, grown by doubling on the Python side; task and edge ids, kinds, queues,
states and dependency counts are int32 -- half the bytes the kernel walks per task, ~10% faster with
16 iterations in flight -- times and parameters int64):

* per task: ``kind, queue, param[:, NPARAM], deps_left, state, start, end``,
  ``qnext`` (next task of the same queue), ``succ_head`` (first out-edge);
* per edge (successor lists as linked lists, so submission is incremental):
  ``e_dst, e_next``;
* per queue: ``q_head`` (first task not yet started), ``q_tail``, ``q_running``,
  ``q_busy`` (busy cycles so far);
* ``ready``: FIFO of tasks that may start now; ``sc``: scalars (see ``SC_*``).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np

NPARAM = 6
KIND_FIXED = 0

# engine-level event types (hardware models use 10 and up)
EV_TASK_END = 1  # id = task: the task completes
EV_QUEUE_FREE = 2  # id = task: the task lets its queue start the next task before it completes

PENDING, RUNNING, DONE = 0, 1, 2

SC_NOW, SC_NTASKS, SC_NEDGES, SC_NDONE, SC_READY_HEAD, SC_READY_TAIL, SC_NEVENTS, SC_NOTIFIED = range(8)
N_SCALARS = 8

TaskTable = namedtuple(
    "TaskTable",
    [
        "kind", "queue", "param", "deps_left", "state", "start", "end", "qnext", "succ_head",
        "e_dst", "e_next",
        "q_head", "q_tail", "q_running", "q_busy",
        "ready", "sc",
    ],
)

_TASK_FIELDS = ("kind", "queue", "deps_left", "state", "start", "end", "qnext", "succ_head", "ready")
_EDGE_FIELDS = ("e_dst", "e_next")


def new_task_table(num_queues: int, task_capacity: int = 1024, edge_capacity: int = 2048) -> TaskTable:
    i64, i32 = np.int64, np.int32
    return TaskTable(
        kind=np.zeros(task_capacity, i32),
        queue=np.full(task_capacity, -1, i32),
        param=np.zeros((task_capacity, NPARAM), i64),
        deps_left=np.zeros(task_capacity, i32),
        state=np.zeros(task_capacity, i32),
        start=np.full(task_capacity, -1, i64),
        end=np.full(task_capacity, -1, i64),
        qnext=np.full(task_capacity, -1, i32),
        succ_head=np.full(task_capacity, -1, i32),
        e_dst=np.zeros(edge_capacity, i32),
        e_next=np.full(edge_capacity, -1, i32),
        q_head=np.full(num_queues, -1, i64),
        q_tail=np.full(num_queues, -1, i64),
        q_running=np.full(num_queues, -1, i64),
        q_busy=np.zeros(num_queues, i64),
        ready=np.zeros(task_capacity, i64),
        sc=np.zeros(N_SCALARS, i64),
    )


def _grown(arr: np.ndarray, capacity: int, fill: int) -> np.ndarray:
    out = np.full((capacity, *arr.shape[1:]), fill, dtype=arr.dtype)
    out[: arr.shape[0]] = arr
    return out


_FILL = {"queue": -1, "start": -1, "end": -1, "qnext": -1, "succ_head": -1, "e_next": -1}


def ensure_capacity(tt: TaskTable, tasks_needed: int, edges_needed: int) -> TaskTable:
    """Return ``tt`` or a copy with room for ``tasks_needed`` tasks and ``edges_needed`` edges."""
    changes = {}
    cap = tt.kind.shape[0]
    if tasks_needed > cap:
        new_cap = max(tasks_needed, 2 * cap)
        for name in _TASK_FIELDS:
            changes[name] = _grown(getattr(tt, name), new_cap, _FILL.get(name, 0))
        changes["param"] = _grown(tt.param, new_cap, 0)
    ecap = tt.e_dst.shape[0]
    if edges_needed > ecap:
        new_cap = max(edges_needed, 2 * ecap)
        for name in _EDGE_FIELDS:
            changes[name] = _grown(getattr(tt, name), new_cap, _FILL.get(name, 0))
    return tt._replace(**changes) if changes else tt
