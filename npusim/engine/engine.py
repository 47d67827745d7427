"""Python side of the engine: submitting work, growing arrays, reading results.

The Numba loop that advances time lives in :mod:`npusim.sim.kernel` (it drives the
hardware models); this class owns the task table and event heap between runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npusim.engine.core import add_tasks, add_template, copy_successors
from npusim.engine import eventlist, heap
from npusim.engine.heap import HS_SIZE
from npusim.engine.tasks import (
    DONE,
    EV_QUEUE_FREE,
    EV_TASK_END,
    SC_READY_HEAD,
    SC_READY_TAIL,
    KIND_FIXED,
    NPARAM,
    PENDING,
    RUNNING,
    SC_NDONE,
    SC_NEDGES,
    SC_NOW,
    SC_NTASKS,
    ensure_capacity,
    new_task_table,
)
from npusim.engine.template import BatchTemplate, make_template
from npusim.errors import ConfigError, DeadlockError

TASK_EVENTS = np.array([EV_TASK_END, EV_QUEUE_FREE], dtype=np.int64)  # events whose id is a task


class Engine:
    """Tasks, queues and events of one simulation.

    ``queue_names[i]`` names resource queue ``i`` (e.g. ``"core3.cube"``); they appear in
    traces and deadlock reports. Task names are optional and kept only in Python. ``event_list``:
    the events in the chip loop's sorted list (:mod:`npusim.engine.eventlist`), else in the binary
    heap (:mod:`npusim.engine.heap`, the system level's).
    """

    def __init__(self, queue_names: Sequence[str], task_capacity: int = 1024, event_list: bool = False):
        self.queue_names = list(queue_names)
        self.tt = new_task_table(len(self.queue_names), task_capacity, 2 * task_capacity)
        self._queue = eventlist if event_list else heap  # the module that lays out and renumbers events
        self.heap, self.hs = eventlist.new_event_list(1024) if event_list else heap.new_heap(1024)
        self.task_names: dict[int, str] = {}

    # -- submission ---------------------------------------------------------------
    @property
    def num_tasks(self) -> int:
        return int(self.tt.sc[SC_NTASKS])

    @property
    def num_done(self) -> int:
        return int(self.tt.sc[SC_NDONE])

    @property
    def now(self) -> int:
        """Current simulated time in cycles."""
        return int(self.tt.sc[SC_NOW])

    def submit_batch(
        self,
        kind: np.ndarray,
        queue: np.ndarray,
        param: np.ndarray,
        dep_ptr: np.ndarray,
        dep_idx: np.ndarray,
        names: Sequence[str] | None = None,
        check: bool = True,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """Add ``n`` tasks at once; returns their ids.

        ``param`` is ``(n, k)`` with ``k <= NPARAM``; ``dep_idx[dep_ptr[i]:dep_ptr[i+1]]``
        lists task ``i``'s predecessors as absolute ids (earlier tasks, or ``first + j`` for task
        ``j`` of this batch, where ``first`` is :attr:`num_tasks`). Raises ConfigError for an
        out-of-range queue or dependency (``check=False`` skips the checks: for arrays a caller
        built and checked once, submitted many times).

        ``rows`` (a permutation of ``0 .. n-1``, default the identity) stores task ``i`` at id
        ``first + rows[i]``; the ids returned are those (``first + rows``). It changes nothing but
        where the tasks lie in memory: queues and dependencies are linked in the batch's order (see
        ``add_tasks``), so the simulation is the same. Tasks laid out in the order they will run
        keep the loop's reads close together: with a pipeline's iterations in flight it walks one
        region per iteration, not one per core of each (see ``npusim.sim.program.run_order``).
        """
        if np.size(kind) == 0:
            return np.zeros(0, dtype=np.int64)
        kind, queue, param, dep_ptr, dep_idx = self._as_arrays(kind, queue, param, dep_ptr, dep_idx)
        n = kind.shape[0]
        first = self.num_tasks
        if check:
            self._check_batch(first, n, queue, param, dep_ptr, dep_idx)
        rows = self._layout(rows, n, check)
        self.tt = ensure_capacity(self.tt, first + n, int(self.tt.sc[SC_NEDGES]) + dep_idx.shape[0])
        add_tasks(self.tt, first, n, kind, queue, param, dep_ptr, dep_idx, rows)
        ids = first + rows
        if names is not None:
            for i, name in enumerate(names):
                if name:
                    self.task_names[int(ids[i])] = name
        return ids

    def make_template(self, kind, queue, param, dep_ptr, dep_idx, rows=None, check: bool = True) -> BatchTemplate:
        """A batch (as :meth:`submit_batch` takes it, its dependencies given as ``j`` for its task
        ``j``: all inside it) linked once, to add many times with :meth:`submit_template` -- the
        same table as ``submit_batch`` of the batch with ``dep_idx + num_tasks`` (see
        :mod:`npusim.engine.template`). ``check`` as in :meth:`submit_batch`."""
        kind, queue, param, dep_ptr, dep_idx = self._as_arrays(kind, queue, param, dep_ptr, dep_idx)
        n = kind.shape[0]
        if check:
            self._check_batch(0, n, queue, param, dep_ptr, dep_idx)
        rows = self._layout(rows, n, check)
        return make_template(len(self.queue_names), kind, queue, param, dep_ptr, dep_idx, rows)

    def submit_template(self, tmpl: BatchTemplate, patch_rows=None, patch_param=None,
                        extra_rows=None, extra_preds=None) -> np.ndarray:
        """Add a template's tasks after those the engine has; returns their ids in the batch's
        order (``num_tasks + tmpl.rows``). ``patch_param[k]`` (``NPARAM`` wide) replaces the
        parameters of the batch's task ``patch_rows[k]``; the batch's tasks ``extra_rows`` (in
        increasing order) also wait for the tasks ``extra_preds``, as if those were listed last
        among their dependencies in ``submit_batch``."""
        first = self.num_tasks
        none = np.zeros(0, dtype=np.int64)
        extra_rows = none if extra_rows is None else tmpl.rows[np.asarray(extra_rows, dtype=np.int64)]
        extra_preds = none if extra_preds is None else np.asarray(extra_preds, dtype=np.int64)
        patch_rows = none if patch_rows is None else tmpl.rows[np.asarray(patch_rows, dtype=np.int64)]
        patch_param = (np.zeros((0, NPARAM), dtype=np.int64) if patch_param is None else
                       np.asarray(patch_param, dtype=np.int64).reshape(patch_rows.shape[0], NPARAM))
        n = tmpl.kind.shape[0]
        self.tt = ensure_capacity(self.tt, first + n, int(self.tt.sc[SC_NEDGES]) + tmpl.e_dst.shape[0]
                                  + extra_rows.shape[0] * extra_preds.shape[0])
        add_template(self.tt, first, tmpl, patch_rows, patch_param, extra_rows, extra_preds)
        return first + tmpl.rows

    def submit(
        self,
        kind: int = KIND_FIXED,
        queue: int = -1,
        param: Sequence[int] = (0,),
        deps: Sequence[int] = (),
        name: str | None = None,
        check: bool = True,
    ) -> int:
        """Add one task (convenience wrapper of :meth:`submit_batch`; ``check`` likewise)."""
        deps = np.asarray(list(deps), dtype=np.int64)
        ids = self.submit_batch(
            np.array([kind]), np.array([queue]), np.asarray([list(param)]),
            np.array([0, deps.shape[0]]), deps, [name] if name else None, check=check,
        )
        return int(ids[0])

    @staticmethod
    def _as_arrays(kind, queue, param, dep_ptr, dep_idx) -> tuple:
        """A batch's arrays as the Numba functions take them (int64; one queue broadcast)."""
        kind = np.asarray(kind, dtype=np.int64).ravel()
        n = kind.shape[0]
        return (kind, np.broadcast_to(np.asarray(queue, dtype=np.int64), (n,)),
                np.asarray(param, dtype=np.int64).reshape(n, -1),
                np.asarray(dep_ptr, dtype=np.int64), np.asarray(dep_idx, dtype=np.int64))

    @staticmethod
    def _layout(rows, n: int, check: bool) -> np.ndarray:
        """The rows a batch of ``n`` tasks is stored at (default the identity), checked to be a
        permutation if given and ``check``."""
        if rows is None:
            return np.arange(n, dtype=np.int64)
        rows = np.asarray(rows, dtype=np.int64)
        if check and not np.array_equal(np.sort(rows), np.arange(n)):
            raise ConfigError(f"task rows: must be a permutation of 0..{n - 1}")
        return rows

    def _check_batch(self, first, n, queue, param, dep_ptr, dep_idx):
        nq = len(self.queue_names)
        if param.shape[1] > NPARAM:
            raise ConfigError(f"task parameters: at most {NPARAM} per task, got {param.shape[1]}")
        if n and (queue.min() < -1 or queue.max() >= nq):
            bad = int(queue[(queue < -1) | (queue >= nq)][0])
            raise ConfigError(f"task queue {bad} out of range (0..{nq - 1}, or -1 for none)")
        if dep_ptr.shape[0] != n + 1 or dep_ptr[0] != 0 or dep_ptr[-1] != dep_idx.shape[0] or np.any(np.diff(dep_ptr) < 0):
            raise ConfigError("dependencies: dep_ptr must be a non-decreasing CSR index of length n+1 ending at len(dep_idx)")
        if dep_idx.shape[0]:
            if dep_idx.min() < 0 or dep_idx.max() >= first + n:
                raise ConfigError(f"dependencies: task ids must be in 0..{first + n - 1}")
            owner = np.repeat(np.arange(first, first + n), np.diff(dep_ptr))
            if np.any(owner == dep_idx):
                raise ConfigError(f"dependencies: task {int(owner[owner == dep_idx][0])} depends on itself")

    # -- heap ---------------------------------------------------------------------
    def grow_heap(self) -> None:
        size = int(self.hs[HS_SIZE])
        bigger = np.zeros((2 * self.heap.shape[0], self.heap.shape[1]), dtype=np.int64)
        bigger[:size] = self.heap[:size]
        self.heap = bigger

    # -- results ------------------------------------------------------------------
    def task_name(self, task: int) -> str:
        name = self.task_names.get(task, f"task{task}")
        q = int(self.tt.queue[task])
        return f"{name} [{self.queue_names[q]}]" if q >= 0 else name

    def blocked_report(self, limit: int = 10) -> str:
        """Describe tasks that have not started and what each is waiting for."""
        tt = self.tt
        n = self.num_tasks
        pending = np.flatnonzero(tt.state[:n] == PENDING)
        waiting_on: dict[int, list[int]] = {}
        # predecessors of pending tasks: walk edges of every unfinished task
        for src in np.flatnonzero(tt.state[:n] != DONE):
            e = tt.succ_head[src]
            while e >= 0:
                waiting_on.setdefault(int(tt.e_dst[e]), []).append(int(src))
                e = tt.e_next[e]
        lines = []
        for task in pending[:limit]:
            task = int(task)
            reasons = []
            preds = waiting_on.get(task, [])
            if preds:
                reasons.append("waits for " + ", ".join(self.task_name(p) for p in preds[:3]) + (" ..." if len(preds) > 3 else ""))
            q = int(tt.queue[task])
            if q >= 0 and tt.q_head[q] != task:
                head = int(tt.q_head[q])
                running = int(tt.q_running[q])
                ahead = running if running >= 0 else head
                if ahead >= 0 and ahead != task:
                    reasons.append(f"is queued behind {self.task_name(ahead)}")
            lines.append(f"  {self.task_name(task)}: " + ("; ".join(reasons) or "never released"))
        more = f"\n  ... and {len(pending) - limit} more" if len(pending) > limit else ""
        running = int(np.count_nonzero(tt.state[:n] == RUNNING))
        return (
            f"{len(pending)} task(s) can never start ({running} still running, event queue empty) "
            f"at cycle {self.now}:\n" + "\n".join(lines) + more
        )

    def check_deadlock(self) -> None:
        """Raise DeadlockError if tasks are left but no event can ever start them."""
        if self.num_done < self.num_tasks and int(self.hs[HS_SIZE]) == 0:
            raise DeadlockError(self.blocked_report())

    def busy_cycles(self, include_running: bool = False) -> np.ndarray:
        """Busy cycles per queue: of the tasks that have released their queue, plus, with
        ``include_running``, the part up to now of the tasks occupying one (so differences
        between two calls are the busy time inside that window)."""
        busy = self.tt.q_busy.copy()
        if include_running:
            running = self.tt.q_running
            held = running >= 0
            tasks = running[held]
            elapsed = self.now - self.tt.start[tasks]
            hold = (self.tt.kind[tasks] == KIND_FIXED) & (self.tt.param[tasks, 1] > 0)  # see release_queue
            elapsed[hold] = np.minimum(elapsed[hold], self.tt.param[tasks[hold], 1])
            busy[held] += elapsed
        return busy

    def task_times(self) -> tuple[np.ndarray, np.ndarray]:
        n = self.num_tasks
        return self.tt.start[:n].copy(), self.tt.end[:n].copy()

    def is_done(self, task: int) -> bool:
        return int(self.tt.state[task]) == DONE

    # -- compaction -----------------------------------------------------------------------
    def compact(self) -> np.ndarray:
        """Drop every finished task, renumbering the rest in order; returns ``new_id[old_id]``
        (-1 for dropped tasks). Events in the heap that name tasks are renumbered too; callers
        must renumber the task ids they hold (hardware models: see ``Simulator.compact``).

        Finished tasks can go because nothing refers to them any more: a pending task only
        counts (and links to) predecessors that had not finished when it was submitted.
        """
        tt = self.tt
        n = self.num_tasks
        keep = tt.state[:n] != DONE
        new_id = np.full(n, -1, dtype=np.int64)
        new_id[keep] = np.arange(int(keep.sum()), dtype=np.int64)
        old = np.flatnonzero(keep)
        m = old.shape[0]
        # In place: new ids never exceed old ones. The capacity stays (the table fills up again
        # as work is submitted; regrowing costs more than the memory would save), and slots past
        # ``m`` need no reset because ``add_tasks`` initialises every field of a new task.
        for name in ("kind", "queue", "deps_left", "state", "start", "end", "param"):
            arr = getattr(tt, name)
            arr[:m] = arr[old]
        qn = tt.qnext[old]
        tt.qnext[:m] = np.where(qn >= 0, new_id[np.maximum(qn, 0)], -1)
        # pending tasks' successors are pending too
        succ_head = np.empty_like(tt.succ_head)
        succ_head[:m] = -1
        e_dst, e_next = np.empty_like(tt.e_dst), np.empty_like(tt.e_next)
        edges = copy_successors(tt, old, new_id, e_dst, e_next, succ_head)
        fresh = tt._replace(succ_head=succ_head, e_dst=e_dst, e_next=e_next)

        def remap(ids):
            ids = np.asarray(ids)
            return np.where(ids >= 0, new_id[np.maximum(ids, 0)], -1)

        fresh.q_head[:] = remap(tt.q_head)
        fresh.q_tail[:] = remap(tt.q_tail)
        fresh.q_running[:] = remap(tt.q_running)
        ready = remap(tt.ready[tt.sc[SC_READY_HEAD]:tt.sc[SC_READY_TAIL]])
        ready = ready[ready >= 0]
        fresh.ready[:ready.shape[0]] = ready
        fresh.sc[SC_NTASKS] = m
        fresh.sc[SC_NEDGES] = edges
        fresh.sc[SC_NDONE] = 0
        fresh.sc[SC_READY_HEAD] = 0
        fresh.sc[SC_READY_TAIL] = ready.shape[0]
        self.tt = fresh
        size = int(self.hs[HS_SIZE])
        self._queue.renumber_events(self.heap[:size], TASK_EVENTS, new_id)
        self.task_names = {int(new_id[k]): v for k, v in self.task_names.items() if k < n and new_id[k] >= 0}
        return new_id
