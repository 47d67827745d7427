"""The chip level of serving: requests arrive, the scheduler decides in Python between
iterations, the engine executes each iteration on the chip.

The loop is :func:`npusim.serving.loop.serve`, the same at every level; this module gives it the
chip's adapters: :class:`ServingSimulator` (the level: instances, routing, the KV hand-off) and
:class:`_EngineClock` (the discrete-event engine as the loop's clock).

The work runs on *instances* (:mod:`.instance`): one over the whole chip for continuous
batching and PD fusion, a prefill and a decode instance for PD disaggregation; with data-
parallel replicas, one (or one pair) per band of columns. What a chip run does, step by step:

1. Requests that have arrived by the engine's clock join the waiting queue of the replica
   with the fewest requests (its entry instance); its KV manager admits them first come first served while the batch has room (a
   request that can never fit is rejected with the reason; with ``admission="preempt"``
   the manager may evict running requests, which then restart from scratch).
2. Each instance with room plans iterations (:mod:`.scheduler`); an iteration's graph
   (:mod:`.iteration`) is mapped onto the instance's cores and submitted to the engine
   after everything already submitted, so the cores' in-order queues run iterations back
   to back. With ``S`` pipeline stages up to ``S`` iterations are in flight on disjoint
   requests (vLLM's pipeline-parallel scheduling). KV spilled SRAM->HBM becomes DMA writes
   that run alongside. Identical iterations (same request shapes, KV lengths rounded up to
   256 tokens, decodes in two length groups, the same kind of KV placement — none, some or
   all in HBM, the share rescaling the KV reads; with ``pad_shapes`` decode counts and chunk
   lengths padded as graph-mode engines pad them) reuse one compiled program.
3. The engine runs until a notify task completes — an iteration (its tokens appear then;
   requests advance, finished ones free their KV) or a disaggregated request's KV transfer
   (it joins the decode instance). Finished tasks are compacted away as they pile up, so
   memory stays bounded by the work in flight.

When nothing can run the clock jumps to the next arrival. If requests are waiting,
nothing runs and the next one can never be admitted, it is rejected with the manager's
reason instead of spinning. Times are seconds in results, core cycles in the engine.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from npusim.arch.schema import Arch
from npusim.errors import ConfigError
from npusim.gcpolicy import fewer_collections
from npusim.mapping.spec import MappingSpec
from npusim.model.builder import build_graph
from npusim.model.zoo import get_config
from npusim.serving import loop
from npusim.serving.instance import Instance
from npusim.serving.itercache import Buckets
from npusim.serving.itercache import summary as itercache_summary
from npusim.serving.loop import ARRIVE, KV_ARRIVED, Transfers
from npusim.serving.metrics import TimeSeries, summarize
from npusim.serving.requests import check_context
from npusim.serving.sampling import UtilizationSampler
from npusim.serving.scheduler import Live, SchedulerConfig
from npusim.sim import Simulator
from npusim.sim.mempath import SERVING_STREAMS


REPLAYS = ("stages", "skeleton")  # how the iteration cache replays an iteration
#: the latest arrival a run takes, in cycles: its iterations must still fit the engine's int64 clock
MAX_ARRIVAL_CYCLES = 2**62


@dataclass(frozen=True)
class ServingConfig:
    model: str = "qwen3-4b"
    precision: str = "bf16"
    layers: int | None = None
    scheduler: SchedulerConfig = SchedulerConfig()
    memory_mode: str = "analytical"
    noc_mode: str = "path"
    memory_over_noc: bool | None = None  # HBM traffic over the mesh (default: yes, at every NoC fidelity)
    # the path fidelity's memory-stream model (npusim.sim.mempath): default the flows with the passes held
    # (SERVING_STREAMS, flow@16384~256), or flow (exact), flow@Q~S, or the old reserve / hop streams
    memory_streams: str = SERVING_STREAMS
    admission: str = "queue"
    prefix_cache: bool = False
    block_tokens: int = 16
    slo_ttft_ms: float | None = None
    slo_tbt_ms: float | None = None
    slo_tpot_ms: float | None = None  # goodput: each request's TPOT (its mean gap) at most this
    debug: bool = False
    pad_shapes: bool = True  # pad iteration graphs like graph-mode engines (see npusim.serving.iteration)
    core_window_s: float = 0.05  # per-core utilisation windows (npusim.serving.sampling)
    iteration_cache: Buckets | None = None  # replay iteration costs per shape (npusim.serving.itercache)
    iteration_cache_dir: Path | None = None  # keep measured shapes on disk there (reused by later runs)
    iteration_replay: str = "stages"  # how cached iterations replay: stages or skeleton (npusim.serving.stagecost)
    # an iteration's KV reads from HBM wait for every pending KV spill (a pessimistic bound); default no:
    # a spilled block stays valid in SRAM until its write completes, so a reader never waits for it
    spill_waits: bool = False

    @property
    def measured_over_noc(self) -> bool:
        """Whether simulated iterations (and the iteration cache's measurements) send their HBM
        traffic over the mesh: ``memory_over_noc``, by default at every NoC fidelity (at the
        analytical one as link reservations, :mod:`npusim.hw.noc.linkbound`)."""
        return True if self.memory_over_noc is None else self.memory_over_noc

    def spills_off_mesh(self, disaggregated: bool) -> bool:
        """Whether the serving chip's DMAs go straight to the memory model even though iterations
        were measured over the mesh: with the stage replay, whose cached iterations are holds, the only
        DMAs left are KV spills; nothing waits for them (``spill_waits`` off) and, with no KV
        transfers (PD disaggregation), no other traffic crosses the mesh for them to contend with.
        So their mesh streams change no latency, only the mesh counters, and cost ~17k events
        per iteration (~60% of a cached run's loop; validation/perf/bench_serving.py)."""
        return (self.iteration_cache is not None and self.iteration_replay == "stages" and not self.spill_waits
                and not disaggregated and self.measured_over_noc)

    def __post_init__(self):
        if self.iteration_replay not in REPLAYS:
            raise ConfigError(f"iteration cache replay '{self.iteration_replay}': expected one of {REPLAYS}")
        if self.iteration_replay == "skeleton" and self.iteration_cache is not None and self.iteration_cache.stage_only:
            raise ConfigError("iteration cache: chunk_edges=interp, decode_kv=shared, sampled, mixed_kv and blend_kv "
                              "(the long buckets use them) interpolate between more than two corners, which only the "
                              "stage replay does; use --iteration-cache-replay stages or other buckets")


@dataclass
class ServingRun:
    records: list
    iterations: list[dict]
    series: dict
    summary: dict
    sim: Simulator = field(repr=False, default=None)


#: finished tasks kept before the engine drops them. Session 50: 250k instead of 2M (4219c9a's figure, when
#: compaction was dear): an uncached run's table no longer grows to millions of tasks, and 3 uncached Mooncake
#: requests take 5.9-6.6 s instead of 13.3-13.5 s at the analytical NoC, 16.8 s instead of 27.4 s at the path
#: NoC, identical results (validation/perf/bench_serving.py --requests 3 --cache off); cached runs unchanged
COMPACT_AFTER_TASKS = 250_000


def replica_bands(arch: Arch, replicas: int) -> list[tuple[list[int], list[int]]]:
    """The chip cut into ``replicas`` equal bands of whole columns (or, if the width does not
    divide, of whole rows): ``(columns, rows)`` of each band."""
    w, h = arch.cores.grid.width, arch.cores.grid.height
    if replicas < 1:
        raise ConfigError(f"replicas must be at least 1, got {replicas}")
    if w % replicas == 0:
        k = w // replicas
        return [(list(range(r * k, (r + 1) * k)), list(range(h))) for r in range(replicas)]
    if h % replicas == 0:
        k = h // replicas
        return [(list(range(w)), list(range(r * k, (r + 1) * k))) for r in range(replicas)]
    raise ConfigError(f"{replicas} replicas: neither the mesh width {w} nor its height {h} divides into "
                      f"{replicas} equal bands")


def _band_order(arch: Arch, columns: list[int], rows: list[int]) -> list[int]:
    """A band's cores, middle columns first, each column walked top-down or bottom-up in turn
    (snaking), so consecutive cores are mesh neighbours and TP groups are compact strips."""
    w = arch.cores.grid.width
    centre = (columns[0] + columns[-1]) / 2
    order = []
    for i, x in enumerate(sorted(columns, key=lambda x: (abs(x - centre), x))):
        order += [y * w + x for y in (rows if i % 2 == 0 else rows[::-1])]
    return order


def pd_regions(arch: Arch, prefill: int, decode: int, columns: list[int] | None = None,
               rows: list[int] | None = None) -> tuple[list[int], list[int]]:
    """PP-first PD disaggregation layout of a band (default: the whole chip): decode cores in
    the middle columns, prefill cores at the sides. Each region runs column by column
    (snaking), so its TP groups are compact vertical strips: the decode region from the middle
    outwards; the prefill region from the left edge inwards, then on the right side from the
    decode region outwards (so only one prefill group spans the decode region)."""
    w = arch.cores.grid.width
    columns = list(range(w)) if columns is None else columns
    rows = list(range(arch.cores.grid.height)) if rows is None else rows
    size = len(columns) * len(rows)
    if prefill < 1 or decode < 1 or prefill + decode > size:
        raise ConfigError(f"--pd-ratio {prefill}:{decode}: needs at least one core each and at most "
                          f"{size} in all")
    order = _band_order(arch, columns, rows)
    decode_cores = order[:decode]
    rest = set(order[decode:])
    lo = min(c % w for c in decode_cores)
    left = [c for c in order[decode:] if c % w < lo]
    right = [c for c in order[decode:] if c % w >= lo]
    column = {}  # the snake through the remaining cores: each column's cores in walking order
    for c in sorted(left, key=lambda c: c % w) + sorted(right, key=lambda c: c % w):
        column.setdefault(c % w, []).append(c)
    walk: list[int] = []
    for x in sorted(column, key=lambda x: (x >= lo, x)):
        cores = sorted(column[x], key=lambda c: c // w)
        if walk and abs(cores[-1] // w - walk[-1] // w) < abs(cores[0] // w - walk[-1] // w):
            cores.reverse()  # enter each column at the end nearer to where the walk is
        walk += cores
    assert set(walk) == rest
    return walk[:prefill], decode_cores


class _EngineClock:
    """The chip's clock for the serving loop (:mod:`npusim.serving.loop`): the discrete-event engine.
    A ticket is a notify task (an iteration's end, a KV transfer's arrival); :meth:`next` hands over
    every arrival due by the engine's time, or runs the engine until the next notify or arrival (idle:
    it jumps to the next arrival); after a notify's events were handled, finished tasks are compacted
    away as they pile up, so memory stays bounded by the work in flight."""

    def __init__(self, owner: "ServingSimulator"):
        self.owner, self.sim, self.hz = owner, owner.sim, owner.hz
        self.arrivals: deque = deque()
        self.handlers: dict[int, tuple] = {}
        self.notified = False

    def now_s(self) -> float:
        return self.sim.now / self.hz

    def send(self, requests) -> None:
        self.arrivals.extend(requests)

    def watch(self, ticket: int, what: tuple) -> None:
        self.handlers[ticket] = what

    def _due(self) -> list:
        now_s, due = self.now_s(), []
        while self.arrivals and self.arrivals[0].arrival_s <= now_s:
            due.append(self.arrivals.popleft())
        return [(ARRIVE, due)] if due else []

    def _cycles(self, seconds: float) -> int:
        return int(math.ceil(seconds * self.hz))

    def next(self) -> list[tuple] | None:
        sim, arrivals = self.sim, self.arrivals
        while True:
            due = self._due()
            if due:
                return due
            if not self.handlers:
                if not arrivals:
                    return None
                sim.run(until=max(sim.now, self._cycles(arrivals[0].arrival_s)))  # idle until it arrives
                continue
            out = sim.run(until=self._cycles(arrivals[0].arrival_s) if arrivals else None)
            if out.reason == "notify":
                self.notified = True
                return [self.handlers.pop(out.task)] + self._due()

    def settle(self) -> None:
        if not self.notified:
            return
        self.notified = False
        engine, owner = self.sim.engine, self.owner
        if engine.num_done > max(COMPACT_AFTER_TASKS, 4 * (engine.num_tasks - engine.num_done)):
            owner.tasks_total += engine.num_done
            new_id = self.sim.compact()
            self.handlers = {int(new_id[k]): v for k, v in self.handlers.items()}
            for inst in owner.instances:
                inst.remap(new_id)


class ServingSimulator:
    """Drives :class:`~npusim.serving.instance.Instance` s on one engine.

    ``replicas`` data-parallel copies each get an equal band of the mesh (whole columns);
    arrivals go to the replica with the fewest requests (ties: the lowest index). ``pd``
    (``(prefill_cores, decode_cores)`` counts over the chip, split evenly among the replicas)
    selects PD disaggregation: new requests prefill on a replica's prefill instance
    (continuous batching, chunked), their KV cache then moves over the NoC from every prefill
    core to the replica's decode cores (real messages, contending with all other traffic), and
    they decode on its decode instance (see :meth:`_disaggregated` for how instances are laid
    out). One replica is the *PP-first* layout (decode cores in the chip's middle columns,
    prefill at the sides); several are *DP-first* (each band split the same way)."""

    def __init__(self, arch: Arch, spec: MappingSpec, cfg: ServingConfig, pd: tuple[int, int] | None = None,
                 replicas: int = 1):
        self.arch, self.spec, self.cfg = arch, spec, cfg
        self.spills_off_mesh = cfg.spills_off_mesh(pd is not None)
        self.sim = Simulator(arch, memory_mode=cfg.memory_mode, noc_mode=cfg.noc_mode,
                             memory_over_noc=False if self.spills_off_mesh else cfg.memory_over_noc,
                             memory_streams=cfg.memory_streams)
        self.hz = arch.clock_ghz * 1e9
        self.tasks_total = 0  # tasks dropped by compaction, for the summary
        bands = replica_bands(arch, replicas)
        self.instances: list[Instance] = []
        self.entries: list[Instance] = []  # where arrivals go, one per replica
        self.downstream: dict[Instance, Instance] = {}  # prefill instance -> its decode instance
        self.in_transit: dict[Instance, int] = {}  # decode instance -> requests whose KV is on its way
        for r, (columns, rows) in enumerate(bands):
            suffix = str(r) if replicas > 1 else ""
            if pd is None:
                inst = self._whole_band(columns, rows, replicas, suffix)
                self.instances.append(inst)
                self.entries.append(inst)
                continue
            p, d = pd
            if p % replicas or d % replicas:
                raise ConfigError(f"--pd-ratio {p}:{d} does not split evenly over {replicas} replicas")
            prefill, decode = self._disaggregated(*pd_regions(arch, p // replicas, d // replicas, columns, rows),
                                                  suffix)
            self.instances += [prefill, decode]
            self.entries.append(prefill)
            self.downstream[prefill] = decode
            prefill.hands_off = True

    def _whole_band(self, columns, rows, replicas: int, suffix: str) -> Instance:
        """One instance over a band (the whole chip for one replica): the spec's TP degree and
        as many of its pipeline stages as fit the band."""
        spec, arch = self.spec, self.arch
        if replicas == 1:
            return Instance("chip", self.sim, spec, self.cfg, self.cfg.scheduler)
        cores = _band_order(arch, columns, rows)
        tp = spec.tensor_parallel.degree
        if tp > len(cores):
            raise ConfigError(f"TP {tp} does not fit a replica's {len(cores)} cores "
                              f"({replicas} replicas on {arch.num_cores} cores)")
        stages = min(spec.pipeline.stages, len(cores) // tp)
        if stages != spec.pipeline.stages:
            spec = spec.model_copy(update={"pipeline": spec.pipeline.model_copy(update={"stages": stages,
                                                                                          "layers": None})})
        return Instance("chip" + suffix, self.sim, spec, self.cfg, self.cfg.scheduler, cores=cores,
                        hbm_bytes=int(arch.hbm.capacity_gb * 2**30) // replicas)

    def _disaggregated(self, prefill_cores, decode_cores, suffix: str = "") -> list[Instance]:
        """A prefill and a decode instance. Each spreads its tensor parallelism over its whole
        region: by default in the fewest pipeline stages with at most 32 cores each (a token's
        latency falls with the cores its stage streams weights with, while extra stages only
        add hops); the spec's ``serving.pd_stages`` sets the stage counts instead."""
        cfg, spec, arch = self.cfg, self.spec, self.arch
        layers = len(build_graph(cfg.model, phase="decode", batch=1, seq_len=1, kv_len=2,
                                 precision=cfg.precision, layers=cfg.layers).layers())
        hbm = int(arch.hbm.capacity_gb * 2**30)
        chosen = spec.serving.pd_stages or (None, None)
        out = []
        for name, cores, sched, want in (
                ("prefill", prefill_cores, replace(cfg.scheduler, policy="continuous"), chosen[0]),
                ("decode", decode_cores, replace(cfg.scheduler, policy="continuous", chunk_tokens=0), chosen[1])):
            stages = want or max(1, min(layers, math.ceil(len(cores) / 32)))
            if stages > min(layers, len(cores)):
                raise ConfigError(f"serving.pd_stages: {stages} {name} stages need at most {min(layers, len(cores))} "
                                  f"(the model has {layers} layers, the {name} region {len(cores)} cores)")
            tp = len(cores) // stages
            sub = spec.model_copy(update={
                "tensor_parallel": spec.tensor_parallel.model_copy(update={"degree": tp, "mnk_grid": None}),
                "pipeline": spec.pipeline.model_copy(update={"stages": stages, "layers": None}),
                "data_parallel": 1})
            out.append(Instance(name + suffix, self.sim, sub, cfg, sched, cores=cores,
                                hbm_bytes=hbm * len(cores) // arch.num_cores))
        return out

    def _load(self, entry: Instance) -> int:
        """Requests a replica holds: waiting or running at its entry instance and, with PD
        disaggregation, at its decode instance (KV in transit counts as waiting there)."""
        load = len(entry.waiting) + len(entry.running)
        if entry in self.downstream:
            dest = self.downstream[entry]
            load += len(dest.waiting) + len(dest.running) + self.in_transit.get(dest, 0)
        return load

    def _seconds(self, cycles: int) -> float:
        return cycles / self.hz

    # -- the loop ---------------------------------------------------------------------------
    def run(self, requests, progress=None, max_concurrency: int | None = None) -> ServingRun:
        """Serve ``requests``; ``max_concurrency``: at most that many in flight, each further request
        sent when one finishes or is rejected (:class:`npusim.serving.client.ClosedLoop`)."""
        with fewer_collections():  # see npusim.gcpolicy
            return self._run(requests, progress, max_concurrency)

    def _run(self, requests, progress, max_concurrency=None) -> ServingRun:
        sim = self.sim
        planned = sorted(requests, key=lambda r: (r.arrival_s, r.id))
        check_context(planned, get_config(self.cfg.model).max_position_embeddings, str(self.cfg.model))
        if planned and not planned[-1].arrival_s * self.hz <= MAX_ARRIVAL_CYCLES:  # also inf, NaN
            raise ConfigError(f"the last request arrives {planned[-1].arrival_s:.3g} s into the run, beyond the "
                              f"{MAX_ARRIVAL_CYCLES / self.hz:.3g} s a 64-bit cycle count holds at {self.hz / 1e9:g} "
                              "GHz (a higher --rate, or --time-scale for a trace)")
        self.util = UtilizationSampler(sim, self.cfg.core_window_s)
        self.occupancy = TimeSeries(["sram_used_bytes", "hbm_used_bytes"], "bytes")
        self.transfers = Transfers()
        self.clock = _EngineClock(self)
        run = loop.serve(self, self.clock, planned, progress, max_concurrency)
        self.util.sample(final=True)
        return self._result(run.records, run.iterations, run.tokens_made)

    # -- the serving loop's level interface (npusim.serving.loop) ------------------------------
    def arrive(self, req, record, now_s: float) -> bool:
        """An arrival joins the waiting queue of the replica with the fewest requests."""
        min(self.entries, key=self._load).waiting.append(Live(req))
        return True

    def hand_off(self, inst: Instance, leaving: list, records, now_s: float) -> None:
        """Prompts done on a prefill instance: their KV starts over the NoC to its decode instance."""
        for live in leaving:
            inst.running.remove(live)
            dest = self.downstream[inst]
            nbytes = live.kv_tokens * inst.kv_bytes_per_token
            self.clock.watch(self._send_kv(live, nbytes, inst, dest), (KV_ARRIVED, live, inst, nbytes))
            self.in_transit[dest] = self.in_transit.get(dest, 0) + 1

    def on_event(self, event: tuple, records, now_s: float) -> None:
        """A request's KV arrived at the decode instance: it waits there to be admitted."""
        _, live, source, nbytes = event
        self.transfers.received_bytes += nbytes
        source.kv.free(live.req.id)
        dest = self.downstream[source]
        self.in_transit[dest] -= 1
        dest.waiting.append(live)

    def after_iteration(self, inst: Instance, finished: list, records, end_s: float) -> None:
        self.util.sample()
        occ = [i.kv.occupancy() for i in self.instances]
        self.occupancy.record(end_s, [sum(o["sram_used_bytes"] for o in occ), sum(o["hbm_used_bytes"] for o in occ)])

    def reject_stuck(self, records) -> bool:
        """An instance with requests waiting, none running and nothing in flight can never admit its
        queue's head: reject it (with the reason) instead of spinning."""
        stuck = next((i for i in self.instances if i.waiting and not i.running), None)
        if stuck is None:
            return False
        live = stuck.waiting.popleft()
        records[live.req.id].rejected_reason = f"{stuck.name}: cannot be admitted even when idle"
        return True

    def busy(self) -> bool:
        return any(i.running or i.waiting for i in self.instances)

    def _send_kv(self, live, nbytes: int, source: Instance, dest: Instance) -> int:
        """Move a prefilled request's KV (``nbytes``) from every prefill core to the decode cores (NoC
        messages)."""
        src, dst = source.core_list, dest.core_list
        sends = [self.sim.add_send(s, dst[i % len(dst)], nbytes // len(src) + (1 if i < nbytes % len(src) else 0),
                                   name="KV transfer") for i, s in enumerate(src)]
        self.transfers.sent_bytes += nbytes
        self.transfers.count += 1
        live.kv_to_place = live.kv_tokens
        return self.sim.add_notify(sends, name="KV transferred")

    def _result(self, records, iterations, tokens_made: int) -> ServingRun:
        cfg, sim = self.cfg, self.sim
        recs = [records[k] for k in sorted(records)]
        summary = summarize(recs, slo_ttft_s=None if cfg.slo_ttft_ms is None else cfg.slo_ttft_ms / 1e3,
                            slo_tbt_s=None if cfg.slo_tbt_ms is None else cfg.slo_tbt_ms / 1e3,
                            slo_tpot_s=None if cfg.slo_tpot_ms is None else cfg.slo_tpot_ms / 1e3)
        summary.update({
            "iterations": len(iterations), "compiled_iteration_shapes": sum(i.shapes_compiled for i in self.instances),
            "iteration_cache": itercache_summary([i.costs for i in self.instances if i.costs is not None],
                                                 cfg.iteration_cache, cfg.iteration_replay, len(self.instances),
                                                 spills_over_mesh=not self.spills_off_mesh),
            "simulated_s": self._seconds(sim.now), "weights_resident": all(i.weights_resident for i in self.instances),
            "kv_bytes_per_token": self.entries[0].kv_bytes_per_token,
            "kv_manager": self.entries[0].kv.stats() if len(self.instances) == 1 else
            {i.name: i.kv.stats() for i in self.instances},
            "scheduler": {"policy": "disagg" if self.downstream else cfg.scheduler.policy,
                          **{k: sum(i.scheduler.stats[k] for i in self.instances)
                             for k in self.entries[0].scheduler.stats}},
            "replicas": len(self.entries),
            "instances": {i.name: {"cores": len(i.core_list), "tp": i.spec.tensor_parallel.degree,
                                   "stages": i.spec.pipeline.stages} for i in self.instances},
            "kv_transfer_bytes": self.transfers.sent_bytes, "kv_transfers": self.transfers.count,
            "conservation": {"tokens_made": tokens_made,
                             "tokens_expected": sum(r.output_len for r in recs if r.completed),
                             "kv_bytes_sent": self.transfers.sent_bytes,
                             "kv_bytes_received": self.transfers.received_bytes},
            # cached iterations (stage replay) move their measured bytes without simulating them
            "hbm_bytes": int(sim.mem.ch_bytes.sum()) + sum(i.replayed_hbm_bytes for i in self.instances),
            "hbm_bytes_over_noc": sim.hbm_bytes_over_noc,
            "sram_stall_cycles": sim.sram_stall_cycles,
            "tasks": self.tasks_total + sim.engine.num_tasks, "events": sim.events,
        })
        if cfg.debug:
            for inst in self.instances:
                inst.kv.check_invariants()
        return ServingRun(recs, iterations, {**self.util.series(), "memory": self.occupancy}, summary, sim)


def simulate_serving(arch: Arch, spec: MappingSpec, requests, cfg: ServingConfig, progress=None,
                     pd: tuple[int, int] | None = None, replicas: int = 1,
                     max_concurrency: int | None = None) -> ServingRun:
    """Serve ``requests`` on ``replicas`` data-parallel copies; ``pd=(prefill_cores, decode_cores)``
    disaggregates prefill and decode (DP-first when ``replicas > 1``). ``max_concurrency``: a
    benchmark client's limit on requests in flight (:class:`npusim.serving.client.ClosedLoop`; their
    ``arrival_s`` are then planned send times, each sent no earlier than a slot frees)."""
    return ServingSimulator(arch, spec, cfg, pd, replicas).run(requests, progress, max_concurrency)
