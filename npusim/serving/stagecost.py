"""Stage replay: the iteration cache's cheapest fidelity, an iteration replayed as one hold per
pipeline stage whose length depends on how full the pipeline is.

Why: since HBM traffic crosses the mesh, an iteration's time on a pipelined instance is set by
the *other* iterations in flight — the pipeline's stages stream their weights at once and share
the HBM channels and the links next to them. The skeleton replay (:mod:`.itercache`) replays each
DMA but holds the NoC messages it measured alone, so under load it is 15–80% fast, and replaying
the DMAs costs nearly as much as the iteration itself. Here contention is measured, not replayed.

Measured per iteration shape (two simulations on fresh chips at the run's fidelity):

* **alone** — the program as it is: lane ``l`` (one pipeline stage of one data-parallel
  replica: its TP group's cores) *adds* ``alone[l]`` cycles to the iteration (its last task's end
  minus its predecessor lane's), so the chain of increments ends when the iteration did;
* **loaded** — the same program with every dependency between lanes cut, so all stages work
  at once, as they do when the pipeline is full of (similar) iterations: ``loaded[l]`` is when
  lane ``l`` ends then, and the last of them, ``wave = max(loaded)``, the pipeline's period at
  full load (the time it takes to move one iteration's weights and KV with every stage streaming).

Replayed with ``k`` iterations in flight on the instance (this one included) out of ``depth``
stages, lane ``l`` holds every unit of its cores for::

    d[l] = max(alone[l], min(loaded[l], wave * k / depth))     (alone[l] when k = 1)

the saturation form: while the shared HBM channels and mesh links are saturated the chip
completes at most one iteration per ``wave``, so by Little's law an iteration with ``k`` in
flight takes ``k * wave``, spread over the lanes — but no lane takes longer than it did with
every stage competing, nor less than it took alone. Measured against simulating every iteration
(Qwen3-4B on npusim-64c, TP 4 x 16 stages, 8 requests) the latency matches within 4% at 5–8
iterations in flight and is short by 12–40% at 2–4, where the streams of a few stages already
contend but the chip is not yet saturated. Each lane's holds wait for its
predecessor lane's; the engine's in-order queues then pipeline iterations as the real ones do
(lane ``l`` of iteration ``i+1`` starts when lane ``l`` of iteration ``i`` is done and lane
``l-1`` of ``i+1`` has finished). The holds sit on the cores' compute units (cube, vector),
counted busy for the cycles they were busy alone; the DMA engines and NoC ports stay free for the
transfers that are simulated (KV spills, PD KV transfers), so their utilisation series do not
count cached iterations' traffic (the summary's ``hbm_bytes`` does). The holds are retimed when
the fill changes (:class:`HoldsInFlight`, called by :meth:`npusim.serving.instance.Instance.retime`);
with ``ServingConfig.spill_waits`` a cached iteration's first stage waits for pending KV spills when it
reads KV from HBM, as the simulated KV reads then do. Without it (the default) nothing waits for a
spill, and with one instance on the chip nothing else crosses the mesh, so the serving chip's DMAs
(the spills: cached iterations have none) go to the memory model alone, not over the mesh
(:meth:`npusim.serving.simulate.ServingConfig.spills_off_mesh`; same token times, far fewer events).

Assumptions (their error is measured by ``validation/serving_iteration_cache.py``): the iterations
in flight beside this one are of a similar shape; a lane's hold is fixed once it starts; traffic
of other instances (PD disaggregation's other half, KV spills and transfers) does not slow a
cached iteration, nor does a cached iteration slow them — which is wrong when instances share the
chip's HBM (PD disaggregation: mean TTFT −70%), and the run's summary says so
(``iteration_cache.limits``).
Units: cycles of the chip clock; bytes.
"""

from __future__ import annotations

import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from npusim.engine.tasks import KIND_FIXED, PENDING
from npusim.sim import Simulator
from npusim.sim.kernel import KIND_DMA
from npusim.sim.program import submit_materialized


COMPUTE_UNITS = ("cube", "vector")  # where a stage replay's holds sit


@dataclass(frozen=True)
class Lanes:
    """An instance's pipeline lanes: ``cores[l]`` of lane ``l`` and the lane it waits for
    (``prev[l]``, -1 for a first stage); ``depth`` is the pipeline's stage count."""

    cores: tuple[tuple[int, ...], ...]
    prev: tuple[int, ...]
    depth: int

    @staticmethod
    def of_groups(groups) -> "Lanes":
        """From a mapping's groups (``replica``, ``stage``, ``cores``): one lane per group, each
        waiting for the same replica's previous stage."""
        order = sorted(range(len(groups)), key=lambda g: (groups[g].replica, groups[g].stage))
        where = {(groups[g].replica, groups[g].stage): i for i, g in enumerate(order)}
        cores = tuple(tuple(groups[g].cores) for g in order)
        prev = tuple(where.get((groups[g].replica, groups[g].stage - 1), -1) for g in order)
        return Lanes(cores, prev, max(g.stage for g in groups) + 1)


def _task_lanes(sim, lanes: Lanes, queue: np.ndarray, ptr: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Each task's lane: its core's, or for a barrier (no queue) the one lane all its consumers
    are in (-1 if none or several)."""
    core_lane = np.full(sim.arch.num_cores, -1, dtype=np.int64)
    for lane, cores in enumerate(lanes.cores):
        core_lane[list(cores)] = lane
    lane = np.where(queue >= 0, core_lane[np.maximum(queue, 0) // sim.queues_per_core], -1)
    barriers = np.flatnonzero(queue < 0)
    if barriers.size:
        owner = np.repeat(np.arange(len(queue)), np.diff(ptr))  # the consumer of each dependency
        by_src = np.argsort(idx, kind="stable")
        starts = np.searchsorted(idx[by_src], np.arange(len(queue) + 1))
        for b in barriers[::-1].tolist():  # consumers have higher ids: they are resolved first
            found = set(lane[owner[by_src[starts[b]:starts[b + 1]]]].tolist())
            if len(found) == 1:
                lane[b] = found.pop()
    return lane


def _cut(arrays: tuple, task_lane: np.ndarray) -> tuple:
    """The arrays without dependencies between tasks of different lanes."""
    kinds, queue, param, ptr, idx = arrays
    owner = np.repeat(np.arange(len(kinds)), np.diff(ptr))
    a, b = task_lane[idx], task_lane[owner]
    keep = (a < 0) | (b < 0) | (a == b)
    new_ptr = np.zeros_like(ptr)
    new_ptr[1:] = np.cumsum(np.bincount(owner[keep], minlength=len(kinds)))
    return kinds, queue, param, new_ptr, idx[keep]


def _lane_ends(sim, arrays: tuple, task_lane: np.ndarray, lanes: int) -> tuple[np.ndarray, int]:
    """Run ``arrays`` on ``sim``; each lane's last end (cycles) and the run's end."""
    ids = submit_materialized(sim, arrays)
    sim.run()
    _, end = sim.task_times()
    end = end[ids]
    out = np.zeros(lanes, dtype=np.int64)
    on = task_lane >= 0
    np.maximum.at(out, task_lane[on], end[on])
    return out, int(end.max(initial=0))


def _spans(alone, loaded, wave, k: int, depth: int):
    """Hold cycles with ``k`` iterations in flight out of ``depth`` (the module docstring's
    saturation form): ``alone`` at ``k = 1``, else ``max(alone, min(loaded, ceil(wave k / depth)))``."""
    k = min(max(1, k), depth)
    if k == 1:  # alone: what was measured alone
        return alone
    return np.maximum(alone, np.minimum(loaded, -(-wave * k // depth)))


def _counted_busy(busy, span):
    """A hold's ``param[1]``: the busy cycles it counts, 0 when busy for all of ``span``."""
    return np.where(busy >= span, 0, np.maximum(1, busy))


@dataclass
class StageCost:
    """One iteration shape's stage timing (see the module docstring): ``duration`` alone
    (cycles); per lane ``alone`` and ``loaded`` cycles; per unit of the lanes' cores (``unit_queue``,
    engine queue ids, with ``unit_lane``; compute units only): ``unit_busy`` cycles alone.
    ``hbm_bytes``: what the iteration reads and writes in HBM."""

    duration: int
    alone: np.ndarray
    loaded: np.ndarray
    unit_queue: np.ndarray
    unit_lane: np.ndarray
    unit_busy: np.ndarray
    hbm_bytes: int
    wave_cycles: int = -1  # the pipeline's period at full load; -1: max(loaded) (a measured shape's)
    _unit_params: dict = field(default_factory=dict, repr=False, compare=False)  # (k, depth) -> unit_params

    ARRAYS = ("alone", "loaded", "unit_queue", "unit_lane", "unit_busy")
    SCALARS = ("duration", "hbm_bytes")

    def blend(self, other: "StageCost", t: float) -> "StageCost":
        """The shape ``t`` of the way from this one to ``other`` (same lanes): every time and byte
        count interpolated linearly."""
        if t <= 0:
            return self
        if t >= 1:
            return other

        def mix(a, b):
            return np.round(a + (b - a) * t).astype(np.int64)

        return StageCost(duration=int(round(self.duration + (other.duration - self.duration) * t)),
                         alone=mix(self.alone, other.alone), loaded=mix(self.loaded, other.loaded),
                         unit_queue=self.unit_queue, unit_lane=self.unit_lane,
                         unit_busy=mix(self.unit_busy, other.unit_busy),
                         hbm_bytes=int(round(self.hbm_bytes + (other.hbm_bytes - self.hbm_bytes) * t)))

    @property
    def wave(self) -> int:
        """The pipeline's period at full load (cycles): the last lane's end with every stage
        working at once, ``max(loaded)`` as measured (an interpolated cost carries the corners'
        interpolated wave: the largest of interpolated lanes would understate it)."""
        return self.wave_cycles if self.wave_cycles >= 0 else int(self.loaded.max(initial=0))

    @staticmethod
    def combine(terms: list[tuple["StageCost", float]]) -> "StageCost":
        """The weighted mean of ``terms`` (same lanes; weights >= 0 summing to 1: the corners of a
        multilinear interpolation) in its totals — duration, the lanes' summed alone cycles, the
        wave, busy cycles and bytes — laid out over the lanes and units as the heaviest corner's
        are: a mean of measured lanes would smooth out where each shape's time really fell
        (which lane waits, which one streams), and the holds, a max of a lane's alone and loaded
        cycles, would come out short."""
        pattern = max(terms, key=lambda cw: cw[1])[0]

        def total(get):
            return sum(w * get(c) for c, w in terms)

        def scaled(arr: np.ndarray, target: float) -> np.ndarray:
            now = float(arr.sum())
            return arr if now <= 0 else np.round(arr * (target / now)).astype(np.int64)

        wave = total(lambda c: c.wave)
        return StageCost(duration=int(round(total(lambda c: c.duration))),
                         alone=scaled(pattern.alone, total(lambda c: float(c.alone.sum()))),
                         loaded=pattern.loaded if pattern.wave <= 0 else
                         np.round(pattern.loaded * (wave / pattern.wave)).astype(np.int64),
                         unit_queue=pattern.unit_queue, unit_lane=pattern.unit_lane,
                         unit_busy=scaled(pattern.unit_busy, total(lambda c: float(c.unit_busy.sum()))),
                         hbm_bytes=int(round(total(lambda c: c.hbm_bytes))), wave_cycles=int(round(wave)))

    def holds(self, k: int, depth: int) -> np.ndarray:
        """Each lane's hold (cycles) with ``k`` iterations in flight out of ``depth``."""
        return _spans(self.alone, self.loaded, self.wave, k, depth)

    def unit_params(self, k: int, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Per unit: its hold's ``param[0]`` (the lane's hold) and ``param[1]`` (the busy cycles
        it counts: 0 for all of them) at ``k`` iterations in flight (memoised: a cost in flight is
        retimed at every launch and end)."""
        key = (min(max(1, k), depth), depth)
        memo = self._unit_params
        if key not in memo:
            span = self.holds(*key)[self.unit_lane]
            memo[key] = span, _counted_busy(self.unit_busy, span)
        return memo[key]

    def unit_rows(self) -> np.ndarray:
        """The rows of the units' holds in :meth:`tasks`' arrays (each earlier lane adds a barrier)."""
        return np.arange(self.unit_lane.size) + self.unit_lane

    def tasks(self, lanes: Lanes, k: int) -> tuple[tuple, int]:
        """Engine arrays ``(kind, queue, param, dep_ptr, dep_idx)`` of the replay (dependencies
        relative to its first task) and the relative id of its last task: per lane, a hold on each
        unit of its cores waiting for the predecessor lane's barrier, then the lane's barrier.
        Only ``param`` is new each time: the other arrays depend on the lanes and units alone and
        are shared by every replay of them."""
        kinds, queue, ptr, idx = _replay_structure(lanes, self.unit_lane.tobytes(), self.unit_queue.tobytes())
        param = np.zeros((len(kinds), 6), dtype=np.int64)
        unit_row = self.unit_rows()
        param[unit_row, 0], param[unit_row, 1] = self.unit_params(k, lanes.depth)
        return (kinds, queue, param, ptr, idx), len(kinds) - 1


class HoldsInFlight:
    """The hold tasks of an instance's stage-replayed iterations in flight, flattened so that a
    change of the pipeline's fill retimes all of them with a few array operations: per unit, its
    hold's engine task (-1 once compacted away), its lane's ``alone`` and ``loaded`` cycles, its
    iteration's wave and its busy cycles alone. Iterations leave in launch order."""

    def __init__(self, depth: int):
        self.depth = depth
        self.notes: deque = deque()  # (notify task, units) per iteration, oldest first
        self.ids = np.zeros(0, dtype=np.int64)
        self.cols = np.zeros((4, 0), dtype=np.int64)  # alone, loaded, wave, busy per unit

    def add(self, note: int, ids: np.ndarray, cost: StageCost) -> None:
        lane = cost.unit_lane
        wave = np.full(lane.size, cost.wave, dtype=np.int64)
        self.notes.append((note, lane.size))
        self.ids = np.concatenate([self.ids, ids])
        self.cols = np.concatenate([self.cols, np.stack([cost.alone[lane], cost.loaded[lane], wave,
                                                         cost.unit_busy])], axis=1)

    def drop_oldest(self) -> None:
        """The oldest iteration ended."""
        _, units = self.notes.popleft()
        self.ids, self.cols = self.ids[units:], self.cols[:, units:]

    def retime(self, tt, k: int) -> None:
        """Set every hold not yet started to ``k`` iterations in flight, as
        :meth:`StageCost.unit_params` gives it."""
        waiting = np.flatnonzero((self.ids >= 0) & (tt.state[np.maximum(self.ids, 0)] == PENDING))
        if not waiting.size:
            return
        alone, loaded, wave, busy = self.cols[:, waiting]
        span = _spans(alone, loaded, wave, k, self.depth)
        ids = self.ids[waiting]
        tt.param[ids, 0] = span
        tt.param[ids, 1] = _counted_busy(busy, span)

    def remap(self, new_id: np.ndarray) -> None:
        """Renumber after an engine compaction (finished holds become -1)."""
        self.notes = deque((int(new_id[n]), u) for n, u in self.notes)
        live = self.ids >= 0
        self.ids = np.where(live, new_id[np.maximum(self.ids, 0)], -1)


@lru_cache(maxsize=64)
def _replay_structure(lanes: Lanes, unit_lane_bytes: bytes, unit_queue_bytes: bytes) -> tuple:
    """The arrays of :meth:`StageCost.tasks` but ``param`` (read-only: shared by every replay)."""
    lane = np.frombuffer(unit_lane_bytes, dtype=np.int64)  # units come lane by lane, in chain order
    n_lanes = len(lanes.prev)
    per_lane = np.bincount(lane, minlength=n_lanes)
    # rows: each lane's unit holds then its barrier, lane by lane; then the last task
    barrier = np.cumsum(per_lane + 1) - 1
    unit_row = np.arange(lane.size) + lane
    n = int(barrier[-1]) + 2
    kinds = np.full(n, KIND_FIXED, dtype=np.int64)
    queue = np.full(n, -1, dtype=np.int64)
    queue[unit_row] = np.frombuffer(unit_queue_bytes, dtype=np.int64)
    prev = np.asarray(lanes.prev, dtype=np.int64)
    # dependencies: a hold waits for its lane's predecessor's barrier; a barrier for its
    # lane's holds; the last task for the barriers no lane waits for
    deps = np.zeros(n, dtype=np.int64)
    deps[unit_row] = prev[lane] >= 0
    deps[barrier] = per_lane
    sinks = np.setdiff1d(np.arange(n_lanes), prev[prev >= 0])
    deps[-1] = sinks.size
    ptr = np.zeros(n + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(deps)
    idx = np.empty(int(ptr[-1]), dtype=np.int64)
    has_prev = prev[lane] >= 0
    idx[ptr[unit_row[has_prev]]] = barrier[prev[lane[has_prev]]]
    for l in range(n_lanes):  # a lane's holds are the rows just before its barrier
        b = int(barrier[l])
        idx[ptr[b]:ptr[b + 1]] = np.arange(b - per_lane[l], b)
    idx[ptr[n - 1]:] = barrier[sinks]
    for a in (kinds, queue, ptr, idx):
        a.flags.writeable = False
    return kinds, queue, ptr, idx


_POOL: dict[int, ThreadPoolExecutor] = {}  # per process (a forked child has no threads): the runs of measurements


def _worker() -> ThreadPoolExecutor:
    pid = os.getpid()
    if pid not in _POOL:
        _POOL[pid] = ThreadPoolExecutor(max_workers=2, thread_name_prefix="npusim-stagecost")
    return _POOL[pid]


def _start(arch, lanes: Lanes, arrays: tuple, sim_options: dict, alone_in_pool: bool):
    """Start an iteration's two runs (see :func:`measure_stages`): the loaded one in a worker
    thread, the alone one in another (``alone_in_pool``) or in the caller's when it asks for the
    result. Returns that ask: a function giving the :class:`StageCost`."""
    sim, loaded_sim = Simulator(arch, **sim_options), Simulator(arch, **sim_options)
    kinds, queue, param, ptr, idx = arrays
    task_lane = _task_lanes(sim, lanes, queue, ptr, idx)
    n_lanes = len(lanes.prev)
    pool = _worker()
    loaded_run = pool.submit(_lane_ends, loaded_sim, _cut(arrays, task_lane), task_lane, n_lanes)
    alone_run = pool.submit(_lane_ends, sim, arrays, task_lane, n_lanes) if alone_in_pool else None

    def result() -> StageCost:
        ends, duration = alone_run.result() if alone_run is not None else _lane_ends(sim, arrays, task_lane, n_lanes)
        loaded, _ = loaded_run.result()
        prev = np.asarray(lanes.prev, dtype=np.int64)
        alone = np.maximum(0, ends - np.where(prev >= 0, ends[np.maximum(prev, 0)], 0))
        busy_q = sim.engine.busy_cycles()
        unit_queue, unit_lane = [], []
        for lane, cores in enumerate(lanes.cores):
            for c in cores:
                for u in (u for u in sim.units if u in COMPUTE_UNITS):
                    unit_queue.append(sim.queue(c, u))
                    unit_lane.append(lane)
        unit_queue = np.asarray(unit_queue, dtype=np.int64)
        return StageCost(duration=duration, alone=alone, loaded=loaded,
                         unit_queue=unit_queue, unit_lane=np.asarray(unit_lane, dtype=np.int64),
                         unit_busy=busy_q[unit_queue].astype(np.int64),
                         hbm_bytes=int(param[kinds == KIND_DMA, 0].sum()))

    return result


def measure_stages(arch, lanes: Lanes, arrays: tuple, sim_options: dict) -> StageCost:
    """Simulate an iteration's materialised program alone and with its lanes cut apart (two fresh
    simulators with ``sim_options``) and reduce it to its :class:`StageCost`. The two runs share
    nothing, so the loaded one runs in a worker thread while this one runs the alone one (the
    kernel releases the GIL): same result, about half the wall time on two cores."""
    return _start(arch, lanes, arrays, sim_options, alone_in_pool=False)()


IN_FLIGHT = 2  # measure_stages_many: shapes whose runs may be under way while the next program is built


def measure_stages_many(arch, lanes: Lanes, build, shapes: list, sim_options: dict) -> list[StageCost]:
    """:func:`measure_stages` of each of ``shapes`` (``build(shape)`` gives its materialised
    arrays), in order: both runs of a shape go to worker threads while this thread builds the
    next shape's program (Python, which holds the GIL that the kernel releases), at most
    ``IN_FLIGHT`` shapes ahead. Same results as one by one (every run is on a fresh simulator)."""
    pending, out = deque(), []
    for shape in shapes:
        pending.append(_start(arch, lanes, build(shape), sim_options, alone_in_pool=True))
        if len(pending) > IN_FLIGHT:
            out.append(pending.popleft()())
    out.extend(p() for p in pending)
    return out
