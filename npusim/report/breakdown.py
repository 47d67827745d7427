"""Where time went: per core, each cycle of the run is compute, memory, communication or idle.

A cycle counts as *compute* if the core's cube or vector unit is busy, else *memory*
if one of its DMA engines is, else *communication* if its NoC queue is sending, else
*idle*; the fractions are averaged over the cores that ran anything. (Exposed time:
memory overlapped by compute counts as compute.)
"""

from __future__ import annotations

import numpy as np

CLASSES = ("compute", "memory", "communication", "idle")


def _union_length(starts: np.ndarray, ends: np.ndarray) -> int:
    if starts.size == 0:
        return 0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    # running max of ends; a new block starts where s exceeds every earlier end
    run_end = np.maximum.accumulate(e)
    new_block = np.ones(s.shape[0], dtype=bool)
    new_block[1:] = s[1:] > run_end[:-1]
    block_id = np.cumsum(new_block) - 1
    block_start = s[new_block]
    block_end = np.zeros(block_start.shape[0], dtype=np.int64)
    np.maximum.at(block_end, block_id, e)
    return int((block_end - block_start).sum())


def time_breakdown(sim) -> dict:
    """``{"cycles": {...}, "fraction": {...}, "cores_used": n}`` averaged over busy cores."""
    n = sim.engine.num_tasks
    start, end = sim.task_times()
    queue = sim.engine.tt.queue[:n]
    ran = (queue >= 0) & (start >= 0) & (end > start)
    core = queue // sim.queues_per_core
    unit = queue % sim.queues_per_core
    unit_class = np.array([0 if u in ("cube", "vector") else 1 if u.startswith("dma") else 2 for u in sim.units])
    total = sim.makespan()
    sums = np.zeros(4)
    used = 0
    for c in np.unique(core[ran]).tolist():
        sel = ran & (core == c)
        cls = unit_class[unit[sel]]
        s, e = start[sel], end[sel]
        covered = [_union_length(s[cls <= k], e[cls <= k]) for k in range(3)]
        sums += [covered[0], covered[1] - covered[0], covered[2] - covered[1], total - covered[2]]
        used += 1
    cycles = sums / max(1, used)
    return {
        "cores_used": used,
        "cycles": dict(zip(CLASSES, cycles.tolist())),
        "fraction": dict(zip(CLASSES, (cycles / total if total else cycles * 0).tolist())),
    }
