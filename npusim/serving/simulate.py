"""The serving simulation: requests arrive, the scheduler decides in Python between
iterations, the engine executes each iteration on the chip.

Loop (one chip-wide core group: continuous batching or PD fusion):

1. Requests that have arrived by the engine's clock join the waiting queue; the KV
   manager admits them first come first served while the batch has room (a request
   that can never fit is rejected with the reason; with ``admission="preempt"`` the
   manager may evict running requests, which then restart from scratch).
2. The scheduler plans the iteration (:mod:`.scheduler`); the iteration's graph
   (:mod:`.iteration`) is mapped onto the chip with the mapping spec and submitted to
   the engine — after everything already submitted, so the cores' in-order queues run
   iterations back to back. KV spilled SRAM->HBM by the manager becomes DMA writes that
   run alongside. Identical iterations (same request shapes, KV lengths rounded up to 256
   tokens, decodes in two length groups, same share of KV in HBM to 10 %) reuse one
   compiled program.
3. With ``S`` pipeline stages up to ``S`` iterations are in flight, on disjoint requests
   (vLLM's pipeline-parallel scheduling): stage ``s`` works on one iteration while stage
   ``s + 1`` works on the previous one. The engine runs until the oldest iteration's last
   task; its end is when that iteration's tokens appear. Requests advance, finished ones
   free their KV. Finished tasks are compacted away as they pile up, so memory stays
   bounded by the work in flight.

When nothing can run the clock jumps to the next arrival. If requests are waiting,
nothing runs and the next one can never be admitted, it is rejected with the manager's
reason instead of spinning. Times are seconds in results, core cycles in the engine.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from npusim.arch.schema import Arch
from npusim.errors import ConfigError
from npusim.mapping.mapper import map_model
from npusim.mapping.spec import MappingSpec
from npusim.model.builder import build_graph
from npusim.serving.iteration import Work, build_iteration_graph, iteration_signature
from npusim.serving.kvcache import KVCacheManager
from npusim.serving.metrics import RequestRecord, TimeSeries, summarize
from npusim.serving.scheduler import Live, Scheduler, SchedulerConfig
from npusim.sim import Simulator
from npusim.sim.program import submit_materialized


@dataclass(frozen=True)
class ServingConfig:
    model: str = "qwen3-4b"
    precision: str = "bf16"
    layers: int | None = None
    scheduler: SchedulerConfig = SchedulerConfig()
    memory_mode: str = "analytical"
    noc_mode: str = "path"
    admission: str = "queue"
    prefix_cache: bool = False
    block_tokens: int = 16
    slo_ttft_ms: float | None = None
    slo_tbt_ms: float | None = None
    debug: bool = False


@dataclass
class ServingRun:
    records: list
    iterations: list[dict]
    series: dict
    summary: dict
    sim: Simulator = field(repr=False, default=None)


COMPACT_AFTER_TASKS = 2_000_000  # finished tasks kept before the engine drops them


class _Compiled:
    """A materialised iteration program and the relative ids of its sink tasks."""

    def __init__(self, arrays, sinks):
        self.arrays, self.sinks = arrays, sinks


class ServingSimulator:
    def __init__(self, arch: Arch, spec: MappingSpec, cfg: ServingConfig):
        self.arch, self.spec, self.cfg = arch, spec, cfg
        self.sim = Simulator(arch, memory_mode=cfg.memory_mode, noc_mode=cfg.noc_mode)
        self.hz = arch.clock_ghz * 1e9
        self.scheduler = Scheduler(cfg.scheduler)
        self.cache: dict[tuple, _Compiled] = {}
        self.tasks_total = 0  # tasks dropped by compaction, for the summary
        self._plan_memory()

    # -- setup ------------------------------------------------------------------------------
    def _plan_memory(self) -> None:
        """Decide once whether weights stay in SRAM, and size the KV manager around them."""
        cfg, arch = self.cfg, self.arch
        probe = build_graph(cfg.model, phase="decode", batch=1, seq_len=1, kv_len=2, precision=cfg.precision,
                            layers=cfg.layers)
        self.kv_bytes_per_token = int(sum(op.kv_bytes_per_token for op in probe.ops if op.kind == "attention"))
        weights = sum(op.weight_bytes for op in probe.ops if op.kind != "embedding" and
                      not op.attrs.get("shared_weight"))
        mapped = map_model(probe, arch, self.spec)
        self.weights_resident = mapped.weights_resident
        mem = self.spec.memory.model_copy(update={"weights": "sram" if self.weights_resident else "hbm",
                                                  "kv_cache": "auto"})
        self.iter_spec = self.spec.model_copy(update={"memory": mem})
        cores = arch.num_cores
        sram = int(arch.cores.sram.capacity_mb * 2**20 * cores)
        hbm = int(arch.hbm.capacity_gb * 2**30)
        self.kv = KVCacheManager(
            sram_bytes=sram, hbm_bytes=max(0, hbm - (0 if self.weights_resident else weights)),
            bytes_per_token=max(1, self.kv_bytes_per_token), block_tokens=cfg.block_tokens,
            weights_bytes=weights if self.weights_resident else 0,
            activation_bytes=int(self.spec.memory.sram_reserve_mb * 2**20 * cores),
            admission=cfg.admission, prefix_cache=cfg.prefix_cache, debug=cfg.debug)

    # -- helpers ----------------------------------------------------------------------------
    def _cycles(self, seconds: float) -> int:
        return int(math.ceil(seconds * self.hz))

    def _seconds(self, cycles: int) -> float:
        return cycles / self.hz

    def _compiled(self, slots, hbm_fraction: float) -> _Compiled:
        work = [Work(s.q, s.kv, s.samples) for s in slots]
        frac = round(hbm_fraction, 1)
        key = (iteration_signature(work), frac)
        hit = self.cache.get(key)
        if hit is None:
            graph = build_iteration_graph(self.cfg.model, work, self.cfg.precision, self.cfg.layers)
            prog = map_model(graph, self.arch, self.iter_spec, kv_hbm_fraction=frac).program
            has_succ = np.zeros(len(prog), dtype=bool)
            for deps in prog.deps:
                has_succ[list(deps)] = True
            hit = _Compiled(prog.materialize(self.sim), np.flatnonzero(~has_succ))
            self.cache[key] = hit
        return hit

    def _spill(self, transfers) -> None:
        """KV moved SRAM->HBM: DMA writes split over every core's second DMA engine."""
        total = sum(t.nbytes for t in transfers)
        if total <= 0:
            return
        cores = self.arch.num_cores
        engine = min(1, self.sim.dma_engines - 1)
        for c in range(cores):
            share = total // cores + (1 if c < total % cores else 0)
            if share:
                self.sim.add_dma(c, share, address=(int(self.arch.hbm.capacity_gb * 2**30) // 2) + c * 2**24,
                                 write=True, dma_engine=engine, name="KV spill")

    # -- the loop ---------------------------------------------------------------------------
    def run(self, requests, progress=None) -> ServingRun:
        cfg = self.cfg
        arrivals = deque(sorted(requests, key=lambda r: (r.arrival_s, r.id)))
        waiting: deque[Live] = deque()
        running: list[Live] = []
        records: dict[int, RequestRecord] = {}
        iterations: list[dict] = []
        util = TimeSeries(["cube", "vector", "dma", "noc"], "fraction of the chip's units busy")
        occupancy = TimeSeries(["sram_used_bytes", "hbm_used_bytes"], "bytes")
        sim = self.sim
        units = sim.units
        cls = {"cube": [units.index("cube")], "vector": [units.index("vector")],
               "dma": [i for i, u in enumerate(units) if u.startswith("dma")], "noc": [units.index("noc")]}
        last_busy = sim.busy_cycles().copy()
        total = len(arrivals)
        finished = 0
        depth = self.spec.pipeline.stages  # iterations in flight at once (one per pipeline stage)
        inflight: deque = deque()
        while arrivals or waiting or running or inflight:
            now_s = self._seconds(sim.now)
            while arrivals and arrivals[0].arrival_s <= now_s:
                req = arrivals.popleft()
                records[req.id] = RequestRecord(req.id, req.arrival_s, req.input_len, req.output_len)
                waiting.append(Live(req))
            finished += self._admit(waiting, running, records, now_s)
            if len(inflight) < depth:
                busy = {s.live.req.id for it in inflight for s in it[1]}
                slots = self.scheduler.plan([r for r in running if r.req.id not in busy])
                if slots:
                    inflight.append(self._launch(slots, records, now_s))
                    continue
            if inflight:
                barrier, slots, frac, submitted_s = inflight.popleft()
                start = sim.now
                sim.run(until_task=barrier)
                end_s = self._seconds(sim.now)
                spills = self._advance(slots, records, end_s)
                done = [r for r in running if r.done]
                for live in done:
                    records[live.req.id].finish_s = end_s
                    self.kv.free(live.req.id)
                    running.remove(live)
                finished += len(done)
                busy_now = sim.busy_cycles()
                delta = (busy_now - last_busy).sum(axis=0)
                last_busy = busy_now.copy()
                span = max(1, sim.now - start)
                util.record(end_s, [float(delta[cls[k]].sum() / (span * self.arch.num_cores * len(cls[k])))
                                    for k in ("cube", "vector", "dma", "noc")])
                occ = self.kv.occupancy()
                occupancy.record(end_s, [occ["sram_used_bytes"], occ["hbm_used_bytes"]])
                iterations.append({"submitted_s": submitted_s,
                                   "end_s": end_s, "requests": len(slots), "tokens": sum(x.q for x in slots),
                                   "decodes": sum(1 for x in slots if x.q == 1), "kv_hbm_fraction": frac,
                                   "spill_bytes": sum(t.nbytes for t in spills)})
                if progress:
                    progress(end_s, finished, total)
                if sim.engine.num_done > max(COMPACT_AFTER_TASKS, 4 * (sim.engine.num_tasks - sim.engine.num_done)):
                    self.tasks_total += sim.engine.num_done
                    new_id = sim.compact()
                    inflight = deque((int(new_id[b]), sl, fr, sub) for b, sl, fr, sub in inflight)
                continue
            if arrivals:  # idle until the next request arrives
                sim.run(until=max(sim.now, self._cycles(arrivals[0].arrival_s)))
                continue
            if waiting and not running:  # nothing runs and nothing can be admitted: never spin
                live = waiting.popleft()
                records[live.req.id].rejected_reason = "cannot be admitted even on an idle chip"
                finished += 1
                continue
            if not waiting and not running:
                break
            raise ConfigError("the scheduler planned an empty iteration with requests running "
                              "(check max_batch, max_tokens and budget)")
        recs = [records[k] for k in sorted(records)]
        summary = summarize(recs, slo_ttft_s=None if cfg.slo_ttft_ms is None else cfg.slo_ttft_ms / 1e3,
                            slo_tbt_s=None if cfg.slo_tbt_ms is None else cfg.slo_tbt_ms / 1e3)
        summary.update({
            "iterations": len(iterations), "compiled_iteration_shapes": len(self.cache),
            "simulated_s": self._seconds(sim.now), "weights_resident": self.weights_resident,
            "kv_bytes_per_token": self.kv_bytes_per_token, "kv_manager": self.kv.stats(),
            "scheduler": {"policy": cfg.scheduler.policy, **self.scheduler.stats},
            "tasks": self.tasks_total + sim.engine.num_tasks, "events": sim.events,
        })
        if cfg.debug:
            self.kv.check_invariants()
        return ServingRun(recs, iterations, {"utilization": util, "memory": occupancy}, summary, sim)

    def _launch(self, slots, records: dict, now_s: float):
        """Submit an iteration after everything already submitted; returns
        (barrier task, slots, share of their KV in HBM, submission time)."""
        for s in slots:
            rec = records[s.live.req.id]
            if rec.first_scheduled_s is None:
                rec.first_scheduled_s = now_s
        sram_tok = hbm_tok = 0
        for s in slots:
            a, b = self.kv.location(s.live.req.id)
            sram_tok, hbm_tok = sram_tok + a, hbm_tok + b
        frac = hbm_tok / (sram_tok + hbm_tok) if sram_tok + hbm_tok else 0.0
        comp = self._compiled(slots, frac)
        ids = submit_materialized(self.sim, comp.arrays)
        barrier = self.sim.engine.submit(queue=-1, param=(0,), deps=ids[comp.sinks].tolist(), name="iteration end")
        return barrier, slots, frac, now_s

    def _advance(self, slots, records: dict, end_s: float) -> list:
        """The iteration's tokens exist at ``end_s``: grow KV, record tokens; returns spills (issued)."""
        spills = []
        for s in slots:
            live = s.live
            spills += self.kv.append(live.req.id, s.q)
            if live.prefilling:
                live.prefilled += s.q
            else:
                live.generated += 1
                records[live.req.id].token_times_s.append(end_s)
            if s.samples and live.generated == 0:
                live.generated = 1
                records[live.req.id].token_times_s.append(end_s)
        self._spill(spills)
        return spills

    def _admit(self, waiting: deque, running: list, records: dict, now_s: float) -> int:
        """Admit waiting requests FCFS; returns how many were rejected for good."""
        rejected = 0
        while waiting and len(running) < self.cfg.scheduler.max_batch:
            live = waiting[0]
            req = live.req
            adm = self.kv.admit(req.id, req.input_len, req.output_len, getattr(req, "hash_ids", ()))
            if not adm.ok:
                if adm.permanent:
                    waiting.popleft()
                    records[req.id].rejected_reason = adm.reason
                    rejected += 1
                    continue
                break
            waiting.popleft()
            for victim_id in adm.preempted:  # restart from scratch later
                victim = next(r for r in running if r.req.id == victim_id)
                running.remove(victim)
                records[victim_id].token_times_s.clear()
                records[victim_id].first_scheduled_s = None
                waiting.appendleft(Live(victim.req))
            live.prefilled = adm.prefix_hit_tokens  # reused KV: no prefill compute for these tokens
            records[req.id].prefix_hit_tokens = live.prefilled
            live.admitted_at = now_s
            running.append(live)
        return rejected


def simulate_serving(arch: Arch, spec: MappingSpec, requests, cfg: ServingConfig, progress=None) -> ServingRun:
    return ServingSimulator(arch, spec, cfg).run(requests, progress)
