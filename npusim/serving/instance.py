"""A serving instance: a set of cores with its own mapping, KV manager, scheduler and
compiled iterations. PD fusion / continuous batching use one instance over the whole chip;
PD disaggregation one for prefill and one for decode.

An instance submits an iteration (:meth:`launch`) after everything it submitted before, so
its cores' in-order queues run iterations back to back; up to ``depth`` (its pipeline
stages) are in flight on disjoint requests. Each iteration ends in a notify task, which
makes the engine hand control back when it completes.
"""

from __future__ import annotations

import hashlib
from collections import deque
from pathlib import Path

import numpy as np

from npusim.arch.derived import kv_cache_base_address
from npusim.engine import NPARAM
from npusim.mapping.mapper import map_model
from npusim.model.builder import build_graph
from npusim.serving.iteration import Work, build_groups_graph, iteration_groups
from npusim.serving.itercache import GAP_FRACTION, IterationCost, IterationCostCache, ShapeStore, measure
from npusim.serving.kvcache import KVCacheManager
from npusim.serving.loop import advance
from npusim.serving.scheduler import Live, Scheduler
from npusim.serving.stagecost import HoldsInFlight, Lanes, StageCost, measure_stages, measure_stages_many
from npusim.sim.kernel import KIND_DMA
from npusim.sim.program import run_order, submit_materialized
from npusim.sim.simulator import Simulator


def _file_digest(model: str) -> str | None:
    """A model file's content digest (ONNX models), so an edited file is not taken for the old one."""
    path = Path(str(model))
    if not path.is_file():
        return None
    return hashlib.blake2b(path.read_bytes(), digest_size=16).hexdigest()


def _placement(hbm_fraction: float) -> float:
    """The kind of KV placement a program is compiled for: none in HBM, all, or a share (0.5)."""
    return 0.0 if hbm_fraction <= 0 else 1.0 if hbm_fraction >= 1 else 0.5


class _Compiled:
    """A materialised iteration program, the relative ids of its sink tasks and its KV-read DMA
    tasks with their parameters at the share of KV in HBM it was compiled for. A program the
    serving loop submits is then :meth:`link`-ed: its arrays become a batch template, laid out in
    the order its tasks run (:func:`npusim.sim.program.run_order`), and are dropped."""

    def __init__(self, arrays, sinks, kv_reads, compiled_fraction: float):
        self.arrays, self.sinks = arrays, sinks
        self.template = None
        self.kv_reads = kv_reads
        param = arrays[2]
        self.kv_read_param = np.zeros((kv_reads.size, NPARAM), dtype=np.int64)
        self.kv_read_param[:, :param.shape[1]] = param[kv_reads]
        self.fraction = compiled_fraction

    def link(self, sim) -> None:
        """Make the template the serving loop submits to ``sim``, laid out in the order the program
        runs alone (timed at the cheapest fidelity: the order is all that run gives)."""
        rows = run_order(Simulator(sim.arch, memory_mode="analytical", noc_mode="analytical"), self.arrays)
        self.template = sim.make_template(self.arrays, rows)
        self.arrays = None

    def kv_read_params(self, fraction: float, shift: int | None, region: int) -> np.ndarray | None:
        """The KV reads' parameters with ``fraction`` of the KV in HBM (the same structure: the share
        changes only the bytes each reads) and their addresses moved ``shift`` bytes, wrapping within
        the KV region ``[region, 2 * region)`` (None: not moved); None if neither changes them."""
        if not self.kv_reads.size or (fraction == self.fraction and shift is None):
            return None
        param = self.kv_read_param.copy()
        if fraction != self.fraction:
            param[:, 0] = np.maximum(1, np.round(param[:, 0] * (fraction / self.fraction)))
        if shift is not None:
            param[:, 1] = region + (param[:, 1] - region + shift) % region
        return param


class Instance:
    def __init__(self, name: str, sim, spec, cfg, sched_cfg, cores: list[int] | None = None,
                 hbm_bytes: int | None = None):
        self.name, self.sim, self.spec, self.cfg = name, sim, spec, cfg
        self.arch = sim.arch
        self.cores = cores
        self.scheduler = Scheduler(sched_cfg)
        self.cache: dict[tuple, _Compiled] = {}
        self.shapes_compiled = 0
        self._submitted: set[int] = set()  # ids of the task-kind arrays of shapes submitted before
        self.pending_spills: list[int] = []  # spill_waits: KV spill DMAs the next iteration's HBM KV reads wait for
        self._spill_engine = None  # (initiators, queues) of the cores' spill DMA engine, built on first use
        buckets = cfg.iteration_cache
        self.costs = None
        self.replayed_hbm_bytes = 0  # what cached (stage-replayed) iterations moved, not simulated
        self._plan_memory(hbm_bytes)
        if buckets is not None:
            store = None
            if cfg.iteration_cache_dir is not None:
                store = ShapeStore(cfg.iteration_cache_dir, {
                    "arch": self.arch.model_dump(mode="json", exclude={"name", "description"}),
                    "spec": self.iter_spec.model_dump(mode="json", exclude={"name", "description"}),
                    "cores": self.core_list, "model": cfg.model, "model_file": _file_digest(cfg.model),
                    "precision": cfg.precision, "layers": cfg.layers,
                    "pad": cfg.pad_shapes, "memory": cfg.memory_mode, "noc": cfg.noc_mode,
                    "memory_over_noc": cfg.measured_over_noc, "memory_streams": sim.memory_streams,
                    "segments": [GAP_FRACTION, "one per DMA"], "replay": cfg.iteration_replay},
                    StageCost if self.stage_replay else IterationCost)
            self.costs = IterationCostCache(buckets, self._measure, store,
                                            self._measure_many if self.stage_replay else None)
        self.inflight: deque = deque()  # (notify task, slots, kv share in HBM, submitted_s)
        self.holds = HoldsInFlight(self.lanes.depth) if self.costs is not None and self.stage_replay else None
        self.running: list = []
        self.waiting: deque = deque()
        self.depth = spec.pipeline.stages
        self.hands_off = False  # PD disaggregation's prefill instance: prompts done leave for decode

    @property
    def core_list(self) -> list[int]:
        return list(range(self.arch.num_cores)) if self.cores is None else self.cores

    def _plan_memory(self, hbm_bytes: int | None) -> None:
        """Decide once whether weights stay in SRAM, and size the KV manager around them."""
        cfg, arch = self.cfg, self.arch
        # one sequence per core, so a spec with data-parallel replicas maps all of them
        probe = build_graph(cfg.model, phase="decode", batch=len(self.core_list), seq_len=1, kv_len=2,
                            precision=cfg.precision, layers=cfg.layers)
        self.kv_bytes_per_token = int(sum(op.kv_bytes_per_token for op in probe.ops if op.kind == "attention"))
        # HBM holds one copy of each weight (a tied LM head shares the embedding table); resident
        # weights occupy SRAM like the mapper counts them: everything but the embedding rows
        weights_hbm = sum(op.weight_bytes for op in probe.ops if op.kind != "embedding" and
                          not op.attrs.get("shared_weight"))
        weights_sram = sum(op.weight_bytes for op in probe.ops if op.kind != "embedding")
        mapped = map_model(probe, arch, self.spec, cores=self.cores)
        self.lanes = Lanes.of_groups(mapped.groups)
        self.weights_resident = mapped.weights_resident
        streamed = "partial" if self.spec.memory.weights == "partial" else "hbm"
        mem = self.spec.memory.model_copy(update={"weights": "sram" if self.weights_resident else streamed,
                                                  "kv_cache": "auto"})
        self.iter_spec = self.spec.model_copy(update={"memory": mem})
        # memory.weights first_use: the instance's first iteration loads the weights, later ones find them
        self.first_use_spec = (self.spec.model_copy(update={"memory": mem.model_copy(update={"weights": "first_use"})})
                               if self.spec.memory.weights == "first_use" else None)
        used = sorted({c for c in mapped.program.core if c >= 0})  # cores the mapping leaves idle hold no KV
        n = len(used)
        sram = int(sum(arch.sram_for(c).capacity_mb for c in used) * 2**20)
        hbm = int(arch.hbm.capacity_gb * 2**30) if hbm_bytes is None else hbm_bytes
        # streamed weights pass through two tile buffers per core (see the mapper); with
        # memory.weights partial some stay resident beside them
        streaming_sram = (2 * self.spec.memory.weight_tile_kb * 1024 + mapped.resident_weight_bytes_per_core) * n
        activation_sram = int(self.spec.memory.sram_reserve_mb * 2**20 * n)
        if not self.weights_resident and streaming_sram + activation_sram > sram:
            # cores whose SRAM the weight tiles and the activations fill (an Ascend die's 0.5 MB L1
            # against the default 2 x 4 MB tiles + 2 MB reserve): the KV cache lives in HBM alone
            sram = streaming_sram = activation_sram = 0
        self.kv = KVCacheManager(
            sram_bytes=sram, hbm_bytes=max(0, hbm - (0 if self.weights_resident else weights_hbm)),
            bytes_per_token=max(1, self.kv_bytes_per_token), block_tokens=cfg.block_tokens,
            weights_bytes=weights_sram if self.weights_resident else streaming_sram,
            activation_bytes=activation_sram,
            admission=cfg.admission, prefix_cache=cfg.prefix_cache, debug=cfg.debug)

    def _compile(self, groups, sampled: int, placement: float, spec=None) -> _Compiled:
        """Map the iteration graph of ``groups`` (see ``iteration_groups``) at a KV placement
        (with ``spec`` instead of the instance's iteration spec: the first-use load)."""
        graph = build_groups_graph(self.cfg.model, groups, sampled, self.cfg.precision, self.cfg.layers,
                                   pad=self.cfg.pad_shapes)
        prog = map_model(graph, self.arch, spec or self.iter_spec, kv_hbm_fraction=placement,
                         cores=self.cores).program
        arrays = prog.materialize(self.sim)
        has_succ = np.zeros(len(prog), dtype=bool)
        has_succ[arrays[4]] = True  # every task some other task depends on
        names = prog.names  # KV reads are DMA tasks (the mapper's add_dma): look only at those
        kv_reads = np.array([i for i in np.flatnonzero(arrays[0] == KIND_DMA).tolist() if names[i].endswith(" read KV")],
                            dtype=np.int64)
        self.shapes_compiled += 1
        return _Compiled(arrays, np.flatnonzero(~has_succ), kv_reads, placement)

    @property
    def stage_replay(self) -> bool:
        return self.cfg.iteration_replay == "stages"

    @property
    def _measure_options(self) -> dict:
        """The fresh simulators' options of a shape's measurement: the run's fidelity."""
        return {"memory_mode": self.cfg.memory_mode, "noc_mode": self.cfg.noc_mode,
                "memory_over_noc": self.cfg.measured_over_noc, "memory_streams": self.sim.memory_streams}

    def _measure(self, groups, sampled: int, placement: float):
        """An iteration shape's cost for the iteration cache: its stage timing, or its cost
        skeleton (its program simulated alone)."""
        comp = self._compile(groups, sampled, placement)
        if self.stage_replay:
            return measure_stages(self.arch, self.lanes, comp.arrays, self._measure_options)
        return measure(self.arch, self.cfg.memory_mode, self.cfg.noc_mode, comp.arrays, comp.kv_reads, placement,
                       memory_over_noc=self.cfg.measured_over_noc, memory_streams=self.sim.memory_streams)

    def _measure_many(self, shapes: list) -> list:
        """The stage timings of ``shapes`` (``(groups, sampled, placement)`` each), one program
        built while the previous shapes' simulations run (:func:`measure_stages_many`)."""
        return measure_stages_many(self.arch, self.lanes, lambda sh: self._compile(*sh).arrays, shapes,
                                   self._measure_options)

    def _compiled(self, slots, hbm_fraction: float) -> _Compiled:
        """The iteration's linked program. Programs are compiled per shape and per *kind* of KV
        placement: none in HBM (no KV reads by DMA), all of it, or a share, compiled at one half
        and rescaled per iteration (:meth:`_Compiled.kv_read_params`)."""
        work = [Work(s.q, s.kv, s.samples) for s in slots]
        groups, sampled = iteration_groups(work, pad=self.cfg.pad_shapes)
        placement = _placement(hbm_fraction)
        key = (groups + (sampled,), placement)
        first = self.first_use_spec
        hit = None if first is not None else self.cache.get(key)
        if hit is None:
            hit = self._compile(list(groups), sampled, placement, first)
            hit.link(self.sim)
            if first is None:
                self.cache[key] = hit
            self.first_use_spec = None  # loaded once: later iterations find the weights in SRAM
        return hit

    def _cached(self, slots, hbm_fraction: float) -> tuple:
        """The iteration's replay from the iteration cache (its stage holds at the pipeline's
        current fill, or its cost skeleton): its arrays, the relative id of the task that ends
        with it, and its :class:`StageCost` (None for a skeleton)."""
        work = [Work(s.q, s.kv, s.samples) for s in slots]
        groups, sampled = iteration_groups(work, pad=self.cfg.pad_shapes)
        if self.stage_replay:
            cost = self.costs.stage_cost(groups, sampled, hbm_fraction)
            self.replayed_hbm_bytes += cost.hbm_bytes
            return (*cost.tasks(self.lanes, len(self.inflight) + 1), cost)
        placement = _placement(hbm_fraction)
        return (*self.costs.tasks(groups, sampled, placement, hbm_fraction if 0 < hbm_fraction < 1 else placement),
                None)

    def plan(self) -> list:
        busy = {s.live.req.id for it in self.inflight for s in it[1]}
        return self.scheduler.plan([r for r in self.running if r.req.id not in busy])

    def launch(self, slots, records: dict, now_s: float) -> int:
        """Submit an iteration; returns its notify task."""
        for s in slots:
            rec = records[s.live.req.id]
            if rec.first_scheduled_s is None:
                rec.first_scheduled_s = now_s
        sram_tok = hbm_tok = 0
        for s in slots:
            a, b = self.kv.location(s.live.req.id)
            sram_tok, hbm_tok = sram_tok + a, hbm_tok + b
        frac = hbm_tok / (sram_tok + hbm_tok) if sram_tok + hbm_tok else 0.0
        stages = None  # the stage replay's cost, if that is how this iteration replays
        if self.costs is None:
            comp = self._compiled(slots, frac)
            ids, sinks = self._submit_linked(comp, slots, frac, hbm_tok), comp.sinks
        else:  # the cached cost (it does not load first-use weights)
            arrays, last, stages = self._cached(slots, frac)
            ids, sinks = self._submit_cached(arrays, stages, hbm_tok), [last]
        note = self.sim.add_notify(ids[sinks].tolist(), name=f"{self.name} iteration end")
        self.inflight.append((note, slots, frac, now_s))
        if stages is not None:
            self.holds.add(note, ids[stages.unit_rows()], stages)
            self.retime()
        return note

    def retime(self) -> None:
        """Stage replay: set the holds not yet started of every iteration in flight to the
        pipeline's current fill (called when it changes: at a launch and at an iteration's end),
        so a lane's hold reflects the iterations in flight when it starts."""
        if self.holds is not None:
            live = {it[0] for it in self.inflight}
            while self.holds.notes and self.holds.notes[0][0] not in live:  # iterations end in launch order
                self.holds.drop_oldest()
            self.holds.retime(self.sim.engine.tt, len(self.inflight))

    def can_launch(self) -> bool:
        """Another iteration may be in flight (up to ``depth``, its pipeline stages)."""
        return len(self.inflight) < self.depth

    def complete(self, slots, records: dict, end_s: float):
        """The oldest iteration in flight ended at ``end_s`` (iterations end in launch order): its tokens
        exist (:func:`npusim.serving.loop.advance`, KV grown, spills issued). Returns the serving loop's
        (requests done, requests whose prompt is done when this instance ``hands_off``, tokens made,
        the iteration's record)."""
        _, launched, frac, submitted_s = self.inflight.popleft()
        assert launched is slots, "an instance's iterations complete in order"
        self.retime()  # the pipeline's fill changed (stage replay)
        spills = []
        made = advance(slots, records, end_s, lambda rid, n: spills.extend(self.kv.append(rid, n)))
        self._spill(spills)
        done = [r for r in self.running if r.done]
        leaving = [r for r in self.running if not r.prefilling and not r.done] if self.hands_off else []
        return done, leaving, made, {
            "instance": self.name, "submitted_s": submitted_s, "end_s": end_s, "requests": len(slots),
            "tokens": sum(x.q for x in slots), "decodes": sum(1 for x in slots if x.q == 1),
            "kv_hbm_fraction": frac, "spill_bytes": sum(t.nbytes for t in spills)}

    def release(self, live) -> None:
        """A finished request leaves: its KV is freed."""
        self.kv.free(live.req.id)
        self.running.remove(live)

    def _spill(self, transfers) -> None:
        """KV moved SRAM->HBM: per transfer, DMA writes split over the instance's cores' second DMA
        engine, each core's share at its slice of the transfer's HBM extent (the KV manager's
        offsets, above the weights' half of HBM). Readers do not wait for them: a spilled block
        stays valid in SRAM until its write completes (the copy is freed after), so the next
        iteration reads it either way; with ``ServingConfig.spill_waits`` the next iteration's KV
        reads from HBM wait for every pending spill instead (:meth:`launch`), a pessimistic bound."""
        sim = self.sim
        if not transfers:
            return
        if self._spill_engine is None:  # each core's second DMA engine (its initiator and queue)
            engine = min(1, sim.dma_engines - 1)
            self._spill_engine = (np.array([sim.initiator(c, engine) for c in self.core_list], dtype=np.int64),
                                  np.array([sim.queue(c, f"dma{engine}") for c in self.core_list], dtype=np.int64))
        initiators, queues = self._spill_engine
        n = len(initiators)
        base = kv_cache_base_address(self.arch, 0)  # the KV region; extents are the KV manager's
        span = max(1, int(self.arch.hbm.capacity_gb * 2**30) - base)
        params, queue = [], []
        for t in transfers:  # each core's share, at its slice of the transfer's HBM extent
            b = t.nbytes // n + (np.arange(n) < t.nbytes % n)
            on = b > 0
            row = np.zeros((int(on.sum()), 6), dtype=np.int64)  # bytes, address, write, initiator
            row[:, 0], row[:, 2], row[:, 3] = b[on], 1, initiators[on]
            row[:, 1] = (base + (t.hbm_offset_bytes + np.cumsum(b) - b) % span)[on]
            params.append(row)
            queue.append(queues[on])
        param, queue = np.concatenate(params), np.concatenate(queue)
        if not len(param):
            return
        ids = sim.submit_batch(np.full(len(param), KIND_DMA), queue, param, np.zeros(len(param) + 1, dtype=np.int64),
                               np.zeros(0, dtype=np.int64), ["KV spill"] * len(param), check=False)  # built valid
        if self.cfg.spill_waits:  # the next KV-reading iteration waits for them
            self.pending_spills.extend(ids.tolist())

    def _submit_linked(self, comp: _Compiled, slots, hbm_fraction: float, hbm_tok: int) -> np.ndarray:
        """Submit a linked program with its KV reads at the iteration's share of KV in HBM and moved
        to its requests (:meth:`_kv_shift`); with ``spill_waits`` they also wait for the pending
        spills that write that KV."""
        shift = self._kv_shift(slots) if hbm_tok else None
        fraction = hbm_fraction if 0 < hbm_fraction < 1 else comp.fraction
        patch = comp.kv_read_params(fraction, shift, kv_cache_base_address(self.arch, 0))
        spills = None
        if self.pending_spills and comp.kv_reads.size:  # only kept with spill_waits (see _spill)
            spills, self.pending_spills = self.pending_spills, []
        return self.sim.submit_template(comp.template, patch_rows=None if patch is None else comp.kv_reads,
                                        patch_param=patch, extra_rows=None if spills is None else comp.kv_reads,
                                        extra_preds=spills)

    def _submit_cached(self, arrays, stages, hbm_tok: int) -> np.ndarray:
        """Submit an iteration cache's replay (a stage replay's ``stages``, else a skeleton); with
        ``spill_waits`` a stage replay's first stage waits for the pending spills when it reads KV
        from HBM (the skeleton replay does not wait)."""
        if self.pending_spills and stages is not None and hbm_tok:
            gated = stages.unit_rows()[stages.unit_lane == 0]
            if gated.size:
                return self._submit_after_spills(gated, arrays)
        # a shape's arrays (kept by the caches; a stage replay's, all but its hold times, shared by
        # every replay) are checked on their first submission only
        check = id(arrays[0]) not in self._submitted
        self._submitted.add(id(arrays[0]))
        return submit_materialized(self.sim, arrays, check=check)

    def _kv_shift(self, slots) -> int | None:
        """Where the KV reads move to: the mapper lays each core's KV out by layer; the reads start
        at the first request's HBM extent (its share per core), so batches of other requests touch
        other DRAM rows. None if no request of the batch has KV in HBM."""
        first = next((s for s in slots if self.kv.location(s.live.req.id)[1]), None)
        if first is None:
            return None
        return self.kv.hbm_extent(first.live.req.id)[0] // max(1, len(self.core_list)) // 4096 * 4096

    def _submit_after_spills(self, gated: np.ndarray, arrays):
        """Submit ``arrays`` with its tasks ``gated`` also depending on the pending spills."""
        kinds, queue, param, ptr, idx = arrays
        base = self.sim.engine.num_tasks
        extra = np.zeros(len(kinds), dtype=np.int64)
        extra[gated] = len(self.pending_spills)
        new_ptr = np.zeros_like(ptr)
        new_ptr[1:] = np.cumsum(np.diff(ptr) + extra)
        new_idx = np.empty(int(new_ptr[-1]), dtype=np.int64)
        counts = np.diff(ptr)
        own = np.repeat(new_ptr[:-1], counts) + (np.arange(idx.size) - np.repeat(ptr[:-1], counts))
        new_idx[own] = idx + base
        spills = np.asarray(self.pending_spills, dtype=np.int64)
        for r in gated.tolist():
            new_idx[new_ptr[r] + counts[r]:new_ptr[r + 1]] = spills
        self.pending_spills = []
        return self.sim.submit_batch(kinds, queue, param, new_ptr, new_idx)

    def admit(self, records: dict, now_s: float) -> int:
        """Admit waiting requests FCFS; returns how many were rejected for good."""
        rejected = 0
        while self.waiting and len(self.running) < self.scheduler.cfg.max_batch:
            live = self.waiting[0]
            req = live.req
            adm = self.kv.admit(req.id, req.input_len, req.output_len, getattr(req, "hash_ids", ()))
            if not adm.ok:
                if adm.permanent:
                    self.waiting.popleft()
                    records[req.id].rejected_reason = f"{self.name}: {adm.reason}"
                    rejected += 1
                    continue
                break
            self.waiting.popleft()
            for victim_id in adm.preempted:  # restart from scratch later
                victim = next(r for r in self.running if r.req.id == victim_id)
                self.running.remove(victim)
                records[victim_id].token_times_s.clear()
                records[victim_id].first_scheduled_s = None
                self.waiting.appendleft(Live(victim.req))
            if live.prefilled == 0:
                live.prefilled = adm.prefix_hit_tokens  # reused KV: no prefill compute for these tokens
                records[req.id].prefix_hit_tokens = live.prefilled
            live.admitted_at = now_s
            self.running.append(live)
            if live.kv_to_place:  # KV transferred from another instance lands here
                self._spill(self.kv.append(req.id, live.kv_to_place))
                live.kv_to_place = 0
        return rejected

    def remap(self, new_id) -> None:
        """Renumber in-flight notify tasks (and pending spills) after an engine compaction."""
        self.inflight = deque((int(new_id[n]), sl, fr, sub) for n, sl, fr, sub in self.inflight)
        if self.holds is not None:
            self.holds.remap(new_id)
        self.pending_spills = [int(new_id[t]) for t in self.pending_spills if new_id[t] >= 0]
