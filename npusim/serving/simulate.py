"""The serving simulation: requests arrive, the scheduler decides in Python between
iterations, the engine executes each iteration on the chip.

The work runs on *instances* (:mod:`.instance`): one over the whole chip for continuous
batching and PD fusion, a prefill and a decode instance for PD disaggregation. Loop:

1. Requests that have arrived by the engine's clock join the (first) instance's waiting
   queue; its KV manager admits them first come first served while the batch has room (a
   request that can never fit is rejected with the reason; with ``admission="preempt"``
   the manager may evict running requests, which then restart from scratch).
2. Each instance with room plans iterations (:mod:`.scheduler`); an iteration's graph
   (:mod:`.iteration`) is mapped onto the instance's cores and submitted to the engine
   after everything already submitted, so the cores' in-order queues run iterations back
   to back. With ``S`` pipeline stages up to ``S`` iterations are in flight on disjoint
   requests (vLLM's pipeline-parallel scheduling). KV spilled SRAM->HBM becomes DMA writes
   that run alongside. Identical iterations (same request shapes, KV lengths rounded up to
   256 tokens, decodes in two length groups, same share of KV in HBM to 10 %) reuse one
   compiled program.
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

from npusim.arch.schema import Arch
from npusim.errors import ConfigError
from npusim.mapping.spec import MappingSpec
from npusim.model.builder import build_graph
from npusim.serving.instance import Instance
from npusim.serving.metrics import RequestRecord, TimeSeries, summarize
from npusim.serving.scheduler import Live, SchedulerConfig
from npusim.sim import Simulator


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


def pd_regions(arch: Arch, prefill: int, decode: int) -> tuple[list[int], list[int]]:
    """PP-first PD disaggregation layout: decode cores in the middle columns of the mesh, prefill
    cores at the sides; within each region cores run column by column (snaking), so TP groups
    are compact vertical strips."""
    w, h = arch.cores.grid.width, arch.cores.grid.height
    if prefill < 1 or decode < 1 or prefill + decode > w * h:
        raise ConfigError(f"--pd-ratio {prefill}:{decode}: needs at least one core each and at most "
                          f"{w * h} in all")
    centre = (w - 1) / 2
    cols = sorted(range(w), key=lambda x: (abs(x - centre), x))
    order = []
    for i, x in enumerate(cols):
        ys = range(h) if i % 2 == 0 else range(h - 1, -1, -1)
        order += [y * w + x for y in ys]
    decode_cores = order[:decode]
    prefill_cores = order[decode:decode + prefill]
    return prefill_cores, decode_cores


class ServingSimulator:
    """Drives one or two :class:`~npusim.serving.instance.Instance` s on one engine.

    ``pd`` (``(prefill_cores, decode_cores)`` counts) selects PD disaggregation: new requests
    prefill on the prefill instance (continuous batching, chunked), their KV cache then moves
    over the NoC from every prefill core to the decode cores (real messages, contending with
    all other traffic), and they decode on the decode instance (see :meth:`_disaggregated` for
    how each instance is laid out)."""

    def __init__(self, arch: Arch, spec: MappingSpec, cfg: ServingConfig, pd: tuple[int, int] | None = None):
        self.arch, self.spec, self.cfg = arch, spec, cfg
        self.sim = Simulator(arch, memory_mode=cfg.memory_mode, noc_mode=cfg.noc_mode)
        self.hz = arch.clock_ghz * 1e9
        self.tasks_total = 0  # tasks dropped by compaction, for the summary
        if pd is None:
            self.instances = [Instance("chip", self.sim, spec, cfg, cfg.scheduler)]
        else:
            self.instances = self._disaggregated(*pd_regions(arch, *pd))
        self.entry = self.instances[0]

    def _disaggregated(self, prefill_cores, decode_cores) -> list[Instance]:
        """A prefill and a decode instance. Each spreads its tensor parallelism over its whole
        region (at most 32 cores a pipeline stage): a token's latency falls with the cores its
        stage streams weights with, while extra stages only add hops."""
        cfg, spec, arch = self.cfg, self.spec, self.arch
        layers = len(build_graph(cfg.model, phase="decode", batch=1, seq_len=1, kv_len=2,
                                 precision=cfg.precision, layers=cfg.layers).layers())
        hbm = int(arch.hbm.capacity_gb * 2**30)
        out = []
        for name, cores, sched in (
                ("prefill", prefill_cores, replace(cfg.scheduler, policy="continuous")),
                ("decode", decode_cores, replace(cfg.scheduler, policy="continuous", chunk_tokens=0))):
            stages = max(1, min(layers, math.ceil(len(cores) / 32)))
            tp = len(cores) // stages
            sub = spec.model_copy(update={
                "tensor_parallel": spec.tensor_parallel.model_copy(update={"degree": tp, "mnk_grid": None}),
                "pipeline": spec.pipeline.model_copy(update={"stages": stages, "layers": None}),
                "data_parallel": 1})
            out.append(Instance(name, self.sim, sub, cfg, sched, cores=cores,
                                hbm_bytes=hbm * len(cores) // arch.num_cores))
        return out

    def _cycles(self, seconds: float) -> int:
        return int(math.ceil(seconds * self.hz))

    def _seconds(self, cycles: int) -> float:
        return cycles / self.hz

    # -- the loop ---------------------------------------------------------------------------
    def run(self, requests, progress=None) -> ServingRun:
        sim = self.sim
        arrivals = deque(sorted(requests, key=lambda r: (r.arrival_s, r.id)))
        records: dict[int, RequestRecord] = {}
        iterations: list[dict] = []
        util = TimeSeries(["cube", "vector", "dma", "noc"], "fraction of the chip's units busy")
        occupancy = TimeSeries(["sram_used_bytes", "hbm_used_bytes"], "bytes")
        units = sim.units
        cls = {"cube": [units.index("cube")], "vector": [units.index("vector")],
               "dma": [i for i, u in enumerate(units) if u.startswith("dma")], "noc": [units.index("noc")]}
        self._last_busy, self._last_t = sim.busy_cycles().copy(), sim.now
        handlers: dict[int, tuple] = {}
        transfers = {"bytes": 0, "count": 0}
        total = len(arrivals)
        self.finished = 0
        while True:
            now_s = self._seconds(sim.now)
            while arrivals and arrivals[0].arrival_s <= now_s:
                req = arrivals.popleft()
                records[req.id] = RequestRecord(req.id, req.arrival_s, req.input_len, req.output_len)
                self.entry.waiting.append(Live(req))
            for inst in self.instances:
                self.finished += inst.admit(records, now_s)
                while inst.free_to_launch():
                    slots = inst.plan()
                    if not slots:
                        break
                    handlers[inst.launch(slots, records, now_s)] = ("iteration", inst)
            if not handlers:
                if arrivals:  # idle until the next request arrives
                    sim.run(until=max(sim.now, self._cycles(arrivals[0].arrival_s)))
                    continue
                stuck = next((i for i in self.instances if i.waiting and not i.running), None)
                if stuck is not None:  # nothing runs and nothing can be admitted: never spin
                    live = stuck.waiting.popleft()
                    records[live.req.id].rejected_reason = f"{stuck.name}: cannot be admitted even when idle"
                    self.finished += 1
                    continue
                if any(i.running or i.waiting for i in self.instances):
                    raise ConfigError("the scheduler planned an empty iteration with requests running "
                                      "(check max_batch, max_tokens and budget)")
                break
            out = sim.run(until=self._cycles(arrivals[0].arrival_s) if arrivals else None)
            if out.reason != "notify":
                continue
            kind, obj = handlers.pop(out.task)
            end_s = self._seconds(sim.now)
            if kind == "iteration":
                iterations.append(self._iteration_done(obj, out.task, records, end_s, handlers, transfers))
                busy_now = sim.busy_cycles()
                delta = (busy_now - self._last_busy).sum(axis=0)
                span = max(1, sim.now - self._last_t)
                self._last_busy, self._last_t = busy_now.copy(), sim.now
                util.record(end_s, [float(delta[cls[k]].sum() / (span * self.arch.num_cores * len(cls[k])))
                                    for k in ("cube", "vector", "dma", "noc")])
                occ = [i.kv.occupancy() for i in self.instances]
                occupancy.record(end_s, [sum(o["sram_used_bytes"] for o in occ),
                                         sum(o["hbm_used_bytes"] for o in occ)])
                if progress:
                    progress(end_s, self.finished, total)
            else:  # a request's KV arrived at the decode instance
                live, source = obj
                source.kv.free(live.req.id)
                self.instances[1].waiting.append(live)
            if sim.engine.num_done > max(COMPACT_AFTER_TASKS, 4 * (sim.engine.num_tasks - sim.engine.num_done)):
                self.tasks_total += sim.engine.num_done
                new_id = sim.compact()
                handlers = {int(new_id[k]): v for k, v in handlers.items()}
                for inst in self.instances:
                    inst.remap(new_id)
        return self._result(records, iterations, util, occupancy, transfers)

    def _iteration_done(self, inst: Instance, note: int, records, end_s, handlers, transfers) -> dict:
        first, slots, frac, submitted_s = inst.inflight.popleft()
        assert first == note, "an instance's iterations complete in order"
        spills = inst.advance(slots, records, end_s)
        for live in [r for r in inst.running if r.done]:
            records[live.req.id].finish_s = end_s
            inst.kv.free(live.req.id)
            inst.running.remove(live)
            self.finished += 1
        if len(self.instances) > 1 and inst is self.instances[0]:
            for live in [r for r in inst.running if not r.prefilling]:
                inst.running.remove(live)
                handlers[self._send_kv(live, transfers)] = ("kv", (live, inst))
        return {"instance": inst.name, "submitted_s": submitted_s, "end_s": end_s, "requests": len(slots),
                "tokens": sum(x.q for x in slots), "decodes": sum(1 for x in slots if x.q == 1),
                "kv_hbm_fraction": frac, "spill_bytes": sum(t.nbytes for t in spills)}

    def _send_kv(self, live, transfers) -> int:
        """Move a prefilled request's KV from every prefill core to the decode cores (NoC messages)."""
        src, dst = self.instances[0].core_list, self.instances[1].core_list
        nbytes = live.kv_tokens * self.instances[0].kv_bytes_per_token
        sends = [self.sim.add_send(s, dst[i % len(dst)], nbytes // len(src) + (1 if i < nbytes % len(src) else 0),
                                   name="KV transfer") for i, s in enumerate(src)]
        transfers["bytes"] += nbytes
        transfers["count"] += 1
        live.kv_to_place = live.kv_tokens
        return self.sim.add_notify(sends, name="KV transferred")

    def _result(self, records, iterations, util, occupancy, transfers) -> ServingRun:
        cfg, sim = self.cfg, self.sim
        recs = [records[k] for k in sorted(records)]
        summary = summarize(recs, slo_ttft_s=None if cfg.slo_ttft_ms is None else cfg.slo_ttft_ms / 1e3,
                            slo_tbt_s=None if cfg.slo_tbt_ms is None else cfg.slo_tbt_ms / 1e3)
        summary.update({
            "iterations": len(iterations), "compiled_iteration_shapes": sum(len(i.cache) for i in self.instances),
            "simulated_s": self._seconds(sim.now), "weights_resident": all(i.weights_resident for i in self.instances),
            "kv_bytes_per_token": self.entry.kv_bytes_per_token,
            "kv_manager": self.entry.kv.stats() if len(self.instances) == 1 else
            {i.name: i.kv.stats() for i in self.instances},
            "scheduler": {"policy": "disagg" if len(self.instances) > 1 else cfg.scheduler.policy,
                          **self.entry.scheduler.stats},
            "instances": {i.name: {"cores": len(i.core_list), "tp": i.spec.tensor_parallel.degree,
                                   "stages": i.spec.pipeline.stages} for i in self.instances},
            "kv_transfer_bytes": transfers["bytes"], "kv_transfers": transfers["count"],
            "tasks": self.tasks_total + sim.engine.num_tasks, "events": sim.events,
        })
        if cfg.debug:
            for inst in self.instances:
                inst.kv.check_invariants()
        return ServingRun(recs, iterations, {"utilization": util, "memory": occupancy}, summary, sim)


def simulate_serving(arch: Arch, spec: MappingSpec, requests, cfg: ServingConfig, progress=None,
                     pd: tuple[int, int] | None = None) -> ServingRun:
    """Serve ``requests``; ``pd=(prefill_cores, decode_cores)`` disaggregates prefill and decode."""
    return ServingSimulator(arch, spec, cfg, pd).run(requests, progress)
