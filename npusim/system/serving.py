"""Serving a request stream on a multi-NPU system: the chip's scheduler, KV manager and metrics, over
instances whose iterations a step-cost model times.

One loop for every deployment shape (:class:`PoolSpec` lists them; :mod:`npusim.system.deploy` reads
deployment files and the ``system_serving:`` sections into them):

* **aggregated** (``role: aggregated``, ``instances`` replicas of one plan): each instance is the
  chip level's continuous batching: :class:`npusim.serving.scheduler.Scheduler` (policy
  ``continuous``) decides every iteration -- every decoding sequence, then prompt chunks of
  ``chunk_tokens`` first come first served while ``max_tokens`` lasts -- and a
  :class:`npusim.serving.kvcache.KVCacheManager` per unit (a die, or a TP group of dies) admits a
  request when its whole KV (prompt + output) fits the unit's HBM after the weights (a ring per
  request, as on the chip; no SRAM tier: a system's KV lives in HBM). Requests wait in one queue
  per pool; an instance admits the head while one of its units has a sequence slot
  (``max_batch_per_npu``) and KV room (the unit with the fewest sequences first).
* **disaggregated** (``prefill`` and ``decode`` pools, on disjoint NPUs: decode first, then the
  prefill instances, in NPU order): an idle prefill instance takes queued prompts first come, first
  served, whole, up to ``tokens_per_npu`` prompt tokens per NPU (the first always; a longer one is
  chunked by the Scheduler over several iterations); a request's prompt runs on one unit of the
  instance (units in turn). With the caching pool (:mod:`npusim.system.kv_pool`) the prompt's
  leading blocks found in the CPUs' DRAM are read over the fabric before the batch runs and not
  computed (at least one token is), and its new blocks are written after its prefill. When its
  prompt is done (its first token), a request is given a decode unit (of the decode instance with
  the fewest sequences, the unit with the fewest, among those with a slot and KV room: the unit's
  KV manager admits it) and its prompt's KV is written from its prefill unit's dies to the decode
  unit's dies over ``kv_transfer.fabric``; with no room it waits (its KV on the prefill die) until a
  decode sequence finishes. Decode instances run the Scheduler's continuous batching over the
  sequences whose KV has arrived.
* **the step-cost model** (:class:`StepCost`, the one interface the loop times an iteration by): a
  decode-only iteration is the decode :class:`~npusim.system.step_table.StepTable`'s step at (the
  busiest unit's sequences x ``x_scale``, the slots' mean context); an iteration with prompt tokens
  is the prefill table's at ((prompt + decode tokens) per NPU, their token-weighted context): a
  mixed iteration's decodes are costed as prompt tokens of that context (weights read once; their
  attention over their own context is not separated -- stated in ``NOTE``). The tables simulate the
  instance's plan (or DeepSeek deployment) step at grid points, so every time is a simulated step.
* **MTP**: a decoding sequence makes ``1 + accepted`` tokens an iteration (each of the ``mtp``
  speculative tokens accepted with ``mtp_acceptance``, in order, seeded).
* **KV transfers and pool traffic** share one fabric simulation (:class:`_LiveFabric`, flow model)
  started as the serving clock reaches them, so they contend with everything in flight.

Conservation is counted, not assumed: ``conservation`` in the summary gives the tokens made against
the completed requests' outputs and the KV bytes sent against the bytes that arrived.
Times are seconds (``_s``); summaries in ms as :func:`npusim.serving.metrics.summarize` gives them.
Deterministic for a given seed. What is not modelled is listed in ``NOTE``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from npusim.arch import summarize as chip_summary
from npusim.engine.tasks import DONE, KIND_FIXED
from npusim.errors import ConfigError
from npusim.mapping.deployment import CachingPool, Deployment, SystemServing
from npusim.model.configs import ModelConfig
from npusim.model.zoo import get_config
from npusim.serving.client import ClosedLoop
from npusim.serving.kvcache import KVCacheManager
from npusim.serving.metrics import RequestRecord, summarize
from npusim.serving.requests import Request, check_context
from npusim.serving.scheduler import Live, Scheduler, SchedulerConfig, Slot
from npusim.system.chipcost import ChipCost
from npusim.system.instance import Instance, deployment_instance, plan_instance
from npusim.system.kv_pool import KVPool
from npusim.system.load import LoadedSystem
from npusim.system.moe_step import kv_bytes_per_token
from npusim.system.plan import ParallelPlan
from npusim.system.simulator import PS_PER_US, SystemSim
from npusim.system.step_table import StepTable

#: the latest arrival a run takes, in picoseconds: the fabric engine's clock is an int64
MAX_ARRIVAL_PS = 2**62
NOTE = ("partial model: step times interpolated between simulated step shapes (see step_table), every die of "
        "a step at the busiest unit's batch; an aggregated iteration mixing prompt chunks and decodes is "
        "costed as one prefill step of all its tokens; prefill-side KV capacity, pool reads overlapping "
        "compute and decode preemption are not modelled")

ARRIVAL, ITER_DONE, KV_ARRIVED, POOL_LOADED = range(4)
ROLES = ("aggregated", "prefill", "decode")


@dataclass(frozen=True)
class PoolSpec:
    """One pool of identical instances. ``source``: a DeepSeek :class:`Deployment` or a
    :class:`ParallelPlan` (its ``npus`` per instance). ``max_batch_per_npu``: sequences per NPU
    (aggregated, decode); ``tokens_per_npu``: tokens per NPU an iteration (prefill's batch budget,
    aggregated's ``max_tokens``); ``chunk_tokens``: aggregated prompt chunks (0: whole prompts)."""

    role: str
    instances: int
    source: Deployment | ParallelPlan
    max_batch_per_npu: int = 64
    tokens_per_npu: int = 16384
    chunk_tokens: int = 0

    def __post_init__(self):
        if self.role not in ROLES:
            raise ConfigError(f"serving pool role '{self.role}': expected one of {', '.join(ROLES)}")
        if self.instances < 1:
            raise ConfigError(f"serving pool ({self.role}): instances must be >= 1, got {self.instances}")

    @property
    def npus(self) -> int:
        return self.source.npus


class StepCost:
    """An instance's iteration time (ms) from the Scheduler's slots (see the module docstring):
    ``x_scale`` scales the busiest unit's sequences to the decode table's ``x``."""

    def __init__(self, npus: int, x_scale: int, prefill: StepTable | None, decode: StepTable | None):
        self.npus, self.x_scale, self.prefill, self.decode = npus, x_scale, prefill, decode

    def iteration_ms(self, slots: list[Slot], unit_of: dict) -> float:
        prompt = [s for s in slots if s.live.prefilling]
        if not prompt:
            per_unit: dict[int, int] = {}
            for s in slots:
                u = unit_of[s.live.req.id]
                per_unit[u] = per_unit.get(u, 0) + 1
            return self.decode.step_ms(max(per_unit.values()) * self.x_scale, sum(s.kv for s in slots) / len(slots))
        tokens = sum(s.q for s in slots)
        y = sum(s.kv * s.q for s in slots) / tokens
        budget = self.prefill.xs[-1] * self.npus  # a lone prompt longer than the budget: chunked by the Scheduler
        return self.prefill.step_ms(min(tokens, budget) / self.npus, y)


@dataclass
class _Inst:
    name: str
    role: str
    pool: int
    inst: Instance
    units: list[list[int]]  # fabric vertices of each unit's dies
    scheduler: Scheduler
    cost: StepCost
    kv: list[KVCacheManager] = field(default_factory=list)  # per unit (aggregated, decode)
    slots_per_unit: int = 0
    budget: int = 0  # prompt tokens an iteration (prefill)
    running: list[Live] = field(default_factory=list)
    unit_of: dict = field(default_factory=dict)  # request id -> unit
    unit_seqs: list[int] = field(default_factory=list)
    busy: bool = False
    turn: int = 0  # prefill: the unit the next prompt runs on

    def seqs(self) -> int:
        return sum(self.unit_seqs) if self.unit_seqs else len(self.running)


@dataclass
class _Req:
    req: Request
    record: RequestRecord
    prefill_unit: list[int] = field(default_factory=list)  # fabric vertices of its prefill unit
    decode: tuple[int, int] | None = None  # (instance index, unit)


@dataclass
class SystemServingResult:
    """The summary, one record per request, and one dict per iteration (``instance``,
    ``submitted_s``, ``end_s``, ``requests``, ``tokens`` computed, ``mean_context``)."""

    summary: dict
    records: list[RequestRecord]
    steps: list[dict] = field(default_factory=list)


class _LiveFabric:
    """One fabric simulation for the whole serving run (flow model): every transfer group starts
    at its serving time and contends with all transfers in flight then (KV transfers of every
    prefill batch, pool reads and writes). The serving loop advances it to its next event's time
    and gets back the groups that finished by then; it never runs ahead of the serving clock, so
    a transfer started later can still slow one already in flight."""

    PS_PER_S = PS_PER_US * 1e6

    def __init__(self, loaded: LoadedSystem, fidelity: str):
        self.sim = SystemSim(loaded, fidelity)
        self.pending: list[tuple[np.ndarray, float, int, object]] = []  # (task ids, start s, event kind, payload)

    def start(self, t_s: float, batches, kinds_payloads) -> None:
        """Start transfer ``batches`` (``(initiators, targets, nbytes, op, fabric, via)``) at ``t_s``;
        ``kinds_payloads[b]`` is ``(event kind, payload)`` for the whole batch ``b`` (its event
        comes when its last transfer ends), a list of them (one per transfer) or None (no event)."""
        sim = self.sim
        delay = max(0, int(round(t_s * self.PS_PER_S)) - sim.now_ps)
        gate = sim.submit(np.array([KIND_FIXED]), np.array([-1]), np.array([[delay, 0, 0, 0]], np.int64),
                          np.zeros(2, np.int64), np.zeros(0, np.int64))
        for (inits, tgts, sizes, op, fabric, via), what in zip(batches, kinds_payloads):
            if not inits:
                continue
            kinds, queues, params = sim.transfers(inits, tgts, np.asarray(sizes, np.int64), op, via, fabric)
            n = kinds.shape[0]
            ids = sim.submit(kinds, queues, params, np.arange(n + 1, dtype=np.int64), np.repeat(gate, n))
            if isinstance(what, list):
                self.pending += [(ids[i: i + 1], t_s, k, pl) for i, (k, pl) in enumerate(what)]
            elif what is not None:
                self.pending.append((ids, t_s, what[0], what[1]))

    def advance(self, t_s: float | None) -> list[tuple[float, int, object, np.ndarray]]:
        """Run to ``t_s`` (None: until idle); ``(end s, kind, payload, durations s)`` of the groups done."""
        if not self.pending:
            return []
        self.sim.run(None if t_s is None else int(round(t_s * self.PS_PER_S)))
        tt = self.sim.engine.tt
        done, still = [], []
        for ids, t0, kind, payload in self.pending:
            if np.all(tt.state[ids] == DONE):
                ends = tt.end[ids] / self.PS_PER_S
                done.append((float(ends.max()), kind, payload, ends - t0))
            else:
                still.append((ids, t0, kind, payload))
        self.pending = still
        return sorted(done, key=lambda d: d[0])


def _instance(loaded: LoadedSystem, source, phase: str, model: str, seed: int, cc: ChipCost,
              runtime: str | None = None) -> Instance:
    if isinstance(source, Deployment):
        return deployment_instance(loaded, source, model, seed, cc, runtime)
    return plan_instance(loaded, source, phase, model, seed, cc, runtime)


def serve_pools(loaded: LoadedSystem, pools: list[PoolSpec], requests: list[Request], model: str | ModelConfig,
                kv_fabric: str | None = None, via: str = "sdma", caching_pool: CachingPool | None = None,
                slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None, slo_tbt_ms: float | None = None,
                seed: int = 0, fidelity: str = "flow", progress=None, chip_cost: ChipCost | None = None,
                max_concurrency: int | None = None, runtime: str | None = None) -> SystemServingResult:
    """Serve ``requests`` on ``pools`` (one ``aggregated`` pool, or a ``prefill`` and a ``decode``
    pool; see the module docstring). ``caching_pool``: the EMS-style pool (disaggregated only), None
    for none. Goodput counts requests within ``slo_ttft_ms`` and ``slo_tpot_ms`` (and every gap
    within ``slo_tbt_ms``). ``max_concurrency``: a benchmark client's limit on requests in flight
    (:class:`npusim.serving.client.ClosedLoop`). ``runtime``: the steps' runtime mode, eager / graph
    (None: the system's default per phase)."""
    s = loaded.system
    cfg = get_config(model)
    check_context(requests, cfg.max_position_embeddings, cfg.name)
    roles = sorted(p.role for p in pools)
    if roles not in (["aggregated"], ["decode", "prefill"]):
        raise ConfigError(f"serving pools {', '.join(roles) or 'none'}: expected one aggregated pool, or one prefill "
                          "and one decode pool")
    mode = "aggregated" if roles == ["aggregated"] else "disaggregated"
    if mode == "aggregated" and isinstance(pools[0].source, Deployment):
        raise ConfigError("an aggregated pool runs prompts and decodes on one instance: give it a parallel plan; a "
                          f"DeepSeek deployment file is calibrated for one phase ({pools[0].source.phase})")
    topo = loaded.topology
    dpn = s.npu.dies
    cc = chip_cost or ChipCost(loaded.chip)
    # NPU order: the decode pool first, then the prefill pool (the aggregated pool alone)
    order = sorted(range(len(pools)), key=lambda i: ROLES.index(pools[i].role) if pools[i].role != "decode" else -1)
    used = sum(pools[i].instances * pools[i].npus for i in order)
    if used > s.num_npus:
        desc = " + ".join(f"{pools[i].instances} {pools[i].role} x {pools[i].npus} NPUs" for i in order)
        raise ConfigError(f"serving deployment: {desc} = {used} NPUs, but {s.name} has {s.num_npus} "
                          f"(a larger --nodes, or fewer instances)")
    if mode == "disaggregated":
        kv_fabric = kv_fabric or next(iter(s.fabrics))
        if kv_fabric not in s.fabrics:
            raise ConfigError(f"system_serving: fabric '{kv_fabric}' is not one of {s.name}'s ({', '.join(s.fabrics)})")
    use_pool = caching_pool is not None and caching_pool.enabled and mode == "disaggregated"
    if use_pool:
        if caching_pool.fabric not in s.fabrics:
            raise ConfigError(f"system_serving: fabric '{caching_pool.fabric}' is not one of {s.name}'s "
                              f"({', '.join(s.fabrics)})")
        if s.num_cpus == 0:
            raise ConfigError(f"--caching-pool on: {s.name} has no CPUs to hold the pool")

    hbm = chip_summary(loaded.chip).hbm_gb * 2**30
    dies = [topo.index[n] for n in topo.die_names]
    max_in = max((r.input_len for r in requests), default=1)
    max_ctx = max((r.input_len + r.output_len for r in requests), default=2)
    insts: list[_Inst] = []
    by_pool: dict[str, list[_Inst]] = {}
    npu0 = 0
    kvb = None  # one token's whole KV (the caching pool's blocks)
    room: dict[str, int] = {}  # tokens of KV a unit of the pool holds
    for i in order:
        p = pools[i]
        phases = {"prefill": ["prefill"], "decode": ["decode"], "aggregated": ["decode", "prefill"]}[p.role]
        made = {ph: _instance(loaded, p.source, ph, model, seed, cc, runtime) for ph in phases}
        base = made[phases[0]]
        n_units = len(base.units)
        slots_per_unit = max(1, p.max_batch_per_npu * base.npus // n_units)
        ptable = dtable = None
        if "prefill" in made:
            top = p.tokens_per_npu if p.role == "prefill" else max(1, math.ceil(p.tokens_per_npu))
            ptable = StepTable(made["prefill"].step, "prefill", x_max=top, y_max=max(max_in if p.role == "prefill"
                                                                                    else max_ctx, 128),
                               x_min=min(128, top))
        if "decode" in made:
            dtable = StepTable(made["decode"].step, "decode", x_max=slots_per_unit * base.x_scale,
                               y_max=max(max_ctx, 128))
        cost = StepCost(base.npus, base.x_scale, ptable, dtable)
        if p.role != "prefill":
            kvd = getattr(p.source, "kv_dtype", "bf16")
            kvb = kv_bytes_per_token(cfg) * (0.5 if kvd == "int8" else 1)
            room[p.role] = int((hbm - base.weights_gib_per_die * 2**30) // base.kv_bytes_per_die)
            if room[p.role] <= 0:
                raise ConfigError(f"system_serving: the {p.role} instance's weights ({base.weights_gib_per_die * 2**30 / 1e9:.1f} "
                                  f"GB per die) leave no HBM for KV ({hbm / 1e9:.1f} GB per die): more NPUs per instance")
        budget = p.tokens_per_npu * base.npus
        for k in range(p.instances):
            units = [[dies[(npu0 + k * base.npus) * dpn + d] for d in unit] for unit in base.units]
            sched = SchedulerConfig(policy="continuous", max_batch=slots_per_unit * n_units if p.role != "prefill"
                                    else max(1, budget), max_tokens=max(1, budget),
                                    chunk_tokens=p.chunk_tokens if p.role == "aggregated" else 0)
            name = p.role if p.role != "prefill" and p.instances == 1 else f"{p.role}{k}"  # the timeline's tracks
            it = _Inst(name, p.role, i, base, units, Scheduler(sched), cost, slots_per_unit=slots_per_unit,
                       budget=budget)
            if p.role != "prefill":
                bpt = max(1, math.ceil(base.kv_bytes_per_die))
                it.kv = [KVCacheManager(0, room[p.role] * bpt, bpt) for _ in units]
                it.unit_seqs = [0] * len(units)
            insts.append(it)
            by_pool.setdefault(p.role, []).append(it)
        npu0 += p.instances * base.npus
    entry_role = "aggregated" if mode == "aggregated" else "prefill"
    hold_role = "aggregated" if mode == "aggregated" else "decode"
    dinst0 = by_pool[hold_role][0].inst
    mtp, mtp_acc = dinst0.mtp, dinst0.mtp_acceptance
    kvb = kvb or kv_bytes_per_token(cfg)
    cpu_ids = [topo.index[f"cpu{c}"] for c in range(s.num_cpus)]
    block = caching_pool.block_tokens if caching_pool else 512
    pool = None
    if use_pool:
        cap_gb = caching_pool.capacity_gb or s.cpu.dram_gb * s.num_cpus
        pool = KVPool(int(cap_gb * 2**30 // (block * kvb)), len(cpu_ids))
    fabric = _LiveFabric(loaded, fidelity) if mode == "disaggregated" else None
    rng = np.random.default_rng(seed)

    reqs = {r.id: _Req(r, RequestRecord.from_request(r)) for r in requests}
    for q in reqs.values():
        if q.req.input_len + q.req.output_len > room[hold_role]:
            q.record.rejected_reason = (f"prompt + output longer than a{'' if mode == 'aggregated' else ' decode'} "
                                        f"unit's KV capacity ({room[hold_role]} tokens)")
    events: list[tuple[float, int, int, object]] = []
    counter = 0

    def push(t: float, kind: int, payload) -> None:
        nonlocal counter
        heapq.heappush(events, (t, counter, kind, payload))
        counter += 1

    last = max((r.arrival_s for r in requests), default=0.0)
    if last * _LiveFabric.PS_PER_S > MAX_ARRIVAL_PS:
        raise ConfigError(f"the last request arrives {last:.3g} s into the run, beyond the {MAX_ARRIVAL_PS / 1e12:.3g} s "
                          "the fabric's 64-bit picosecond clock holds (a higher --rate, or --time-scale for a trace)")
    source = None if max_concurrency is None else ClosedLoop(requests, max_concurrency)

    def send(batch) -> None:
        for r in batch:
            q = reqs[r.id]
            q.req = r
            q.record.arrival_s = r.arrival_s
            if source is not None or q.record.rejected_reason is None:  # a client's rejection frees its slot then
                push(r.arrival_s, ARRIVAL, r.id)

    send(requests if source is None else source.initial())
    waiting: deque[int] = deque()  # the entry pool's queue
    wait_decode: list[int] = []  # prefilled, waiting for decode room
    stats = {"batches": 0, "steps": 0, "batch_sum": 0, "kv_bytes": 0, "kv_bytes_received": 0, "kv_s": [],
             "pool_read_bytes": 0, "pool_write_bytes": 0, "saved_tokens": 0, "looked_blocks": 0,
             "tokens_made": 0}
    steps: list[dict] = []
    done_count = 0

    def finish(q: _Req, t: float) -> None:
        nonlocal done_count
        q.record.finish_s = t
        done_count += 1
        if source is not None:
            send(source.on_finish(t))

    def admit_prefill(t: float, it: _Inst) -> None:
        """An idle prefill instance takes whole queued prompts FCFS within its budget (the first always)."""
        batch, tokens = [], 0
        while waiting:
            q = reqs[waiting[0]]
            blocks = pool.held_prefix(q.req.hash_ids) if pool is not None else 0
            hit = min(blocks * block, q.req.input_len - 1)
            compute = q.req.input_len - hit
            if batch and tokens + compute > it.budget:
                break
            waiting.popleft()
            if pool is not None:
                pool.lookup(q.req.hash_ids)
                stats["looked_blocks"] += len(q.req.hash_ids)
            q.record.prefix_hit_tokens = hit
            q.record.first_scheduled_s = t
            q.prefill_unit = it.units[it.turn % len(it.units)]
            it.turn += 1
            it.running.append(Live(q.req, prefilled=hit, admitted_at=t))
            batch.append((q, hit))
            tokens += compute
        if not batch:
            return
        stats["batches"] += 1
        stats["saved_tokens"] += sum(h for _, h in batch)
        if pool is not None and any(hit for _, hit in batch):  # read the cached prefix blocks first
            inits, tgts, sizes = [], [], []
            for q, hit in batch:
                for b in range(-(-hit // block)):
                    inits.append(q.prefill_unit[0])
                    tgts.append(cpu_ids[pool.cpu_of(q.req.hash_ids[b])])
                    sizes.append(min(block, hit - b * block) * kvb)
            stats["pool_read_bytes"] += int(sum(sizes))
            it.busy = True
            fabric.start(t, [(inits, tgts, sizes, "read", caching_pool.fabric, via)], [(POOL_LOADED, it)])

    def admit_held(t: float, it: _Inst) -> None:
        """An aggregated instance admits the queue's head while a unit has a slot and KV room."""
        while waiting:
            q = reqs[waiting[0]]
            unit = _place(it, q.req)
            if unit is None:
                break
            waiting.popleft()
            q.record.first_scheduled_s = q.record.first_scheduled_s or t
            it.running.append(Live(q.req, admitted_at=t))
            it.unit_of[q.req.id] = unit

    def _place(it: _Inst, r: Request) -> int | None:
        for u in sorted(range(len(it.units)), key=lambda u: (it.unit_seqs[u], u)):
            if it.unit_seqs[u] < it.slots_per_unit and it.kv[u].admit(r.id, r.input_len, r.output_len).ok:
                it.unit_seqs[u] += 1
                return u
        return None

    def start(t: float, it: _Inst) -> None:
        if it.busy:
            return
        if it.role == "prefill" and not it.running:
            admit_prefill(t, it)
            if it.busy:
                return
        elif it.role == "aggregated":
            admit_held(t, it)
        if not it.running:
            return
        slots = it.scheduler.plan(it.running)
        if not slots:
            return
        it.busy = True
        dur = it.cost.iteration_ms(slots, it.unit_of) / 1e3
        tokens = sum(x.q for x in slots)
        mean_ctx = sum(x.kv * x.q for x in slots) / tokens
        steps.append({"instance": it.name, "submitted_s": t, "end_s": t + dur, "requests": len(slots),
                      "tokens": tokens, "mean_context": mean_ctx})
        if all(not x.live.prefilling for x in slots):
            stats["steps"] += 1
            stats["batch_sum"] += len(slots)
        push(t + dur, ITER_DONE, (it, slots))

    def assign_decode(t: float, ids: list[int], pool_writes) -> None:
        """Give each request a decode unit with room, and time the KV writes (and pool writes)."""
        placed = []
        dec = by_pool["decode"]
        for rid in ids:
            q = reqs[rid]
            got = None
            for k in sorted(range(len(dec)), key=lambda k: (dec[k].seqs(), k)):
                u = _place(dec[k], q.req)
                if u is not None:
                    got = (k, u)
                    break
            if got is None:
                wait_decode.append(rid)
                continue
            q.decode = got
            dec[got[0]].unit_of[rid] = got[1]
            placed.append(q)
        if not placed and not pool_writes[0]:
            return
        dinst = dec[0].inst
        # each die of the decode unit receives its share, from the prefill unit's die of the same index
        moves = [(q.prefill_unit[j % len(q.prefill_unit)], die, q.req.input_len * dinst.kv_bytes_per_die)
                 for q in placed for j, die in enumerate(dec[q.decode[0]].units[q.decode[1]])]
        kv = ([m[0] for m in moves], [m[1] for m in moves], [m[2] for m in moves], "write", kv_fabric, via)
        stats["kv_bytes"] += sum(kv[2])
        fabric.start(t, [kv, (*pool_writes, "write", caching_pool.fabric if caching_pool else kv_fabric, via)],
                     [[(KV_ARRIVED, (q.req.id, q.req.input_len * dinst.kv_bytes_per_die
                                     * len(dec[q.decode[0]].units[q.decode[1]])))
                       for q in placed], None])

    def release(it: _Inst, live: Live, t: float) -> None:
        rid = live.req.id
        u = it.unit_of.pop(rid)
        it.kv[u].free(rid)
        it.unit_seqs[u] -= 1
        it.running.remove(live)
        finish(reqs[rid], t)

    def iteration_done(t: float, it: _Inst, slots: list[Slot]) -> None:
        it.busy = False
        if it.role == "prefill":
            writes = ([], [], [])
            going = []
            for x in slots:
                live = x.live
                live.prefilled += x.q
                if live.prefilling:
                    continue
                q = reqs[live.req.id]
                it.running.remove(live)
                q.record.token_times_s.append(t)
                stats["tokens_made"] += 1
                if pool is not None and q.req.hash_ids:
                    for h in pool.insert(q.req.hash_ids):
                        b = q.req.hash_ids.index(h)
                        writes[0].append(q.prefill_unit[0])
                        writes[1].append(cpu_ids[pool.cpu_of(h)])
                        writes[2].append(min(block, q.req.input_len - b * block) * kvb)
                if q.req.output_len == 1:
                    finish(q, t)
                else:
                    going.append(live.req.id)
            stats["pool_write_bytes"] += int(sum(writes[2]))
            assign_decode(t, going, writes)
            return
        finished = []
        for x in slots:
            live = x.live
            rec = reqs[live.req.id].record
            u = it.unit_of[live.req.id]
            if live.prefilling:
                live.prefilled += x.q
                it.kv[u].append(live.req.id, x.q)
                if x.samples:
                    live.generated = 1
                    rec.token_times_s.append(t)
                    stats["tokens_made"] += 1
            else:
                made = 1
                for _ in range(mtp):
                    if rng.random() >= mtp_acc:
                        break
                    made += 1
                made = min(made, live.req.output_len - live.generated)
                it.kv[u].append(live.req.id, made)
                live.generated += made
                rec.token_times_s.extend([t] * made)
                stats["tokens_made"] += made
            if live.done:
                finished.append(live)
        for live in finished:
            release(it, live, t)
        if progress is not None and finished:
            progress(t, done_count, len(requests))
        if finished and wait_decode:
            again, wait_decode[:] = list(wait_decode), []
            assign_decode(t, again, ([], [], []))

    while events or (fabric is not None and fabric.pending):
        if fabric is not None:
            for end, fkind, fpayload, durs in fabric.advance(events[0][0] if events else None):
                if fkind == KV_ARRIVED:
                    stats["kv_s"].append(float(durs[0]))
                push(end, fkind, fpayload)
        t, _, kind, payload = heapq.heappop(events)
        if kind == POOL_LOADED:
            payload.busy = False
        elif kind == ARRIVAL:
            if reqs[payload].record.rejected_reason is None:
                waiting.append(payload)
            else:  # only with a client (source): its slot frees at once
                send(source.on_finish(t))
        elif kind == ITER_DONE:
            iteration_done(t, *payload)
        elif kind == KV_ARRIVED:
            rid, nbytes = payload
            q = reqs[rid]
            stats["kv_bytes_received"] += nbytes
            k, u = q.decode
            it = by_pool["decode"][k]
            it.kv[u].append(rid, q.req.input_len)
            it.running.append(Live(q.req, prefilled=q.req.input_len, generated=1, admitted_at=t))
        for it in insts:
            start(t, it)

    records = [reqs[r.id].record for r in requests]
    out = summarize(records, slo_ttft_s=slo_ttft_ms / 1e3 if slo_ttft_ms else None,
                    slo_tbt_s=slo_tbt_ms / 1e3 if slo_tbt_ms else None,
                    slo_tpot_s=slo_tpot_ms / 1e3 if slo_tpot_ms else None)
    dur = out["duration_s"] or 0.0
    npus = {p.role: p.instances * p.npus for p in pools}
    n_total = sum(npus.values())
    n_hold = npus[hold_role]
    kv_s = np.asarray(stats["kv_s"]) * 1e3
    tpot = (out.get("tpot_ms") or {}).get("mean")
    out.update({
        "system": s.name, "model": cfg.name, "mode": mode,
        "npus_prefill": npus.get("prefill", 0), "npus_decode": npus.get("decode", 0),
        "npus_aggregated": npus.get("aggregated", 0), "npus_total": n_total,
        "tokens_per_s_per_npu": out["output_tokens"] / dur / n_total if dur else None,
        "output_throughput_per_npu": out["output_tokens"] / dur / n_total if dur else None,
        "tokens_per_s_per_user": 1e3 / tpot if tpot else None,
        "decode_tokens_per_s_per_npu": (out["output_tokens"] - out["requests_completed"]) / dur / n_hold
        if dur else None,
        "mtp": mtp, "mtp_acceptance": mtp_acc,
        "instances": {p.role: insts[[i.pool for i in insts].index(j)].inst.label for j, p in enumerate(pools)},
        "pools": [{"role": p.role, "instances": p.instances, "npus_per_instance": p.npus,
                   "label": insts[[i.pool for i in insts].index(j)].inst.label,
                   "max_batch_per_npu": p.max_batch_per_npu if p.role != "prefill" else None,
                   "tokens_per_npu": p.tokens_per_npu} for j, p in enumerate(pools)],
        "prefill_batches": stats["batches"], "decode_steps": stats["steps"],
        "iterations": len(steps),
        "mean_decode_batch_per_npu": stats["batch_sum"] / stats["steps"] / n_hold if stats["steps"] else 0.0,
        "kv_transfer": {"fabric": kv_fabric, "via": via, "bytes": stats["kv_bytes"],
                        "mean_ms": float(kv_s.mean()) if kv_s.size else None,
                        "p99_ms": float(np.percentile(kv_s, 99)) if kv_s.size else None},
        "conservation": {"tokens_made": stats["tokens_made"],
                         "tokens_expected": sum(r.output_len for r in records if r.completed),
                         "kv_bytes_sent": stats["kv_bytes"], "kv_bytes_received": stats["kv_bytes_received"]},
        "caching_pool": None if pool is None else {
            "fabric": caching_pool.fabric, "capacity_blocks": pool.capacity_blocks, "blocks_held": len(pool),
            "blocks_inserted": pool.inserted, "blocks_evicted": pool.evicted,
            "hit_rate": pool.hit_blocks / stats["looked_blocks"] if stats["looked_blocks"] else 0.0,
            "prefill_tokens_saved": stats["saved_tokens"], "read_bytes": stats["pool_read_bytes"],
            "write_bytes": stats["pool_write_bytes"]},
        "step_table": {"prefill_points": sum(t.points for t in _tables(insts, "prefill")),
                       "decode_points": sum(t.points for t in _tables(insts, "decode")),
                       "lookups": sum(t.lookups for ph in ("prefill", "decode") for t in _tables(insts, ph))},
        "chip_cost": cc.stats.as_dict(),
        "note": NOTE,
    })
    return SystemServingResult(out, records, steps)


def _tables(insts: list[_Inst], phase: str) -> list[StepTable]:
    seen = {}
    for it in insts:
        t = getattr(it.cost, phase)
        if t is not None:
            seen[id(t)] = t
    return list(seen.values())


def pools_from_system_serving(plan: SystemServing, pdep, ddep) -> list[PoolSpec]:
    """A ``system_serving:`` section's pools: its prefill instances and one decode instance."""
    return [PoolSpec("prefill", plan.prefill.instances, pdep, tokens_per_npu=plan.prefill.tokens_per_npu),
            PoolSpec("decode", 1, ddep, max_batch_per_npu=plan.decode.max_batch_per_npu)]


def system_serving_pools(plan: SystemServing, pdep: Deployment | ParallelPlan, ddep: Deployment | ParallelPlan,
                         kv_fabric: str | None = None, caching_pool: bool | None = None, mtp: int | None = None,
                         mtp_acceptance: float | None = None):
    """A ``system_serving:`` section as :func:`serve_pools` takes it, flags over the plan's choices:
    (pools, the caching pool or None, KV fabric, ``via``). ``pdep`` and ``ddep``: DeepSeek deployments,
    or parallel plans of any model (:mod:`npusim.system.instance`)."""
    if mtp is not None or mtp_acceptance is not None:
        ddep = ddep.with_changes(mtp=mtp, mtp_acceptance=mtp_acceptance) if isinstance(ddep, ParallelPlan) \
            else ddep.overridden(mtp=mtp, mtp_acceptance=mtp_acceptance)
    pool_cfg = plan.caching_pool
    use_pool = (pool_cfg is not None and pool_cfg.enabled) if caching_pool is None else caching_pool
    if use_pool and pool_cfg is None:
        raise ConfigError("--caching-pool on: the mapping's system_serving has no caching_pool section")
    if pool_cfg is not None:
        pool_cfg = pool_cfg.model_copy(update={"enabled": bool(use_pool)})
    return (pools_from_system_serving(plan, pdep, ddep), pool_cfg if use_pool else None,
            kv_fabric or plan.kv_transfer.fabric, plan.kv_transfer.via)


def simulate_system_serving(loaded: LoadedSystem, plan: SystemServing, pdep: Deployment | ParallelPlan,
                            ddep: Deployment | ParallelPlan,
                            requests: list[Request], model: str = "deepseek-r1", seed: int = 0,
                            kv_fabric: str | None = None, caching_pool: bool | None = None,
                            mtp: int | None = None, mtp_acceptance: float | None = None,
                            fidelity: str = "flow", slo_tbt_ms: float | None = None,
                            progress=None, chip_cost: ChipCost | None = None,
                            max_concurrency: int | None = None, runtime: str | None = None) -> SystemServingResult:
    """Serve ``requests`` by a ``system_serving:`` section (its prefill pool and one decode
    instance, :func:`system_serving_pools`, :func:`serve_pools`); flags override the plan's choices.
    ``runtime``: the steps' runtime mode, eager / graph (None: the system's default per phase)."""
    pools, pool_cfg, kv_fabric, via = system_serving_pools(plan, pdep, ddep, kv_fabric, caching_pool, mtp,
                                                           mtp_acceptance)
    return serve_pools(loaded, pools, requests, model, kv_fabric=kv_fabric, via=via, caching_pool=pool_cfg,
                       slo_ttft_ms=plan.slo_ttft_ms, slo_tpot_ms=plan.slo_tpot_ms, slo_tbt_ms=slo_tbt_ms, seed=seed,
                       fidelity=fidelity, progress=progress, chip_cost=chip_cost, max_concurrency=max_concurrency,
                       runtime=runtime)
