"""``WorkBuilder``: collect a system-level task graph (transfers, compute, barriers), submit it once.

Task ids handed out are the engine's absolute ids (the builder starts numbering where the engine
stands), so dependencies can name tasks of earlier submissions as well as of this one. Work is
kept in chunks of arrays so that a bulk call (all of an all-to-all's transfers) costs one chunk.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from npusim.engine.tasks import KIND_FIXED
from npusim.system.simulator import SystemSim


class WorkBuilder:
    def __init__(self, sim: SystemSim):
        self.sim = sim
        self.base = sim.engine.num_tasks
        self.count = 0
        self._kinds: list[np.ndarray] = []
        self._queues: list[np.ndarray] = []
        self._params: list[np.ndarray] = []
        self._deps: list[Sequence[tuple[int, ...]] | tuple[tuple[int, ...], int]] = []
        self._names: dict[int, str] = {}
        self._flows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (task ids, data src, data dst)

    @property
    def transfers_recorded(self) -> int:
        return sum(ids.shape[0] for ids, _, _ in self._flows)

    def _chunk(self, kinds, queues, params, deps) -> np.ndarray:
        n = kinds.shape[0]
        p = np.zeros((n, 4), np.int64)
        p[:, : params.shape[1]] = params
        self._kinds.append(kinds)
        self._queues.append(queues)
        self._params.append(p)
        self._deps.append(deps)
        ids = np.arange(self.base + self.count, self.base + self.count + n, dtype=np.int64)
        self.count += n
        return ids

    def transfers(self, initiators, targets, nbytes, op: str = "write", via: str | None = None,
                  fabric: str | None = None, deps: Iterable[int] = ()) -> np.ndarray:
        """Many transfers at once, all after the same ``deps``; returns their task ids."""
        kinds, queues, params = self.sim.transfers(initiators, targets, nbytes, op, via, fabric)
        ids = self._chunk(kinds, queues, params, (tuple(deps), kinds.shape[0]))
        inits = np.atleast_1d(np.asarray(initiators, np.int64))
        tgts = np.atleast_1d(np.asarray(targets, np.int64))
        src, dst = (inits, tgts) if op == "write" else (tgts, inits)
        self._flows.append((ids, src, dst))
        return ids

    def transfer(self, initiator: int, target: int, nbytes: int, op: str = "write", via: str | None = None,
                 fabric: str | None = None, deps: Iterable[int] = (), name: str | None = None) -> int:
        """One read or write of ``nbytes`` between two endpoints (vertex ids); see ``SystemSim``."""
        tid = int(self.transfers([initiator], [target], nbytes, op, via, fabric, deps)[0])
        if name:
            self._names[tid] = name
        return tid

    def compute(self, die: int, duration_ps: int, deps: Iterable[int] = (), unit: str = "compute",
                name: str | None = None) -> int:
        queue = self.sim.queue_of[(die, unit)] if unit else -1
        tid = int(self._chunk(np.array([KIND_FIXED]), np.array([queue]), np.array([[int(duration_ps)]]),
                              [tuple(deps)])[0])
        if name:
            self._names[tid] = name
        return tid

    def barrier(self, deps: Iterable[int], name: str | None = None) -> int:
        """A zero-time task after all of ``deps`` (no queue)."""
        return self.compute(-1, 0, deps, unit="", name=name)

    def flows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(task ids, data source, data destination)`` of every transfer recorded."""
        if not self._flows:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        return tuple(np.concatenate(parts) for parts in zip(*self._flows))

    def submit(self) -> np.ndarray:
        if self.sim.engine.num_tasks != self.base:
            raise RuntimeError("WorkBuilder: the engine received other tasks since this builder was made")
        counts, idx = [], []
        for deps in self._deps:
            if isinstance(deps, tuple):  # shared deps for a bulk chunk
                shared, n = deps
                counts.append(np.full(n, len(shared), np.int64))
                idx.append(np.tile(np.asarray(shared, np.int64), n))
            else:
                counts.append(np.fromiter((len(d) for d in deps), np.int64, len(deps)))
                idx.append(np.fromiter((x for d in deps for x in d), np.int64))
        counts = np.concatenate(counts) if counts else np.zeros(0, np.int64)
        ptr = np.zeros(counts.shape[0] + 1, np.int64)
        np.cumsum(counts, out=ptr[1:])
        names = None
        if self._names:
            names = [""] * self.count
            for tid, name in self._names.items():
                names[tid - self.base] = name
        return self.sim.submit(np.concatenate(self._kinds), np.concatenate(self._queues),
                               np.concatenate(self._params), ptr,
                               np.concatenate(idx) if idx else np.zeros(0, np.int64), names)
