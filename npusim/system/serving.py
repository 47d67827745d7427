"""Serving a request stream on a multi-NPU system: the one serving loop (:func:`npusim.serving.loop.serve`,
the chip's too) with the chip's scheduler, KV manager and metrics, over instances whose iterations a
step-cost model times. This module gives the loop the system's adapters: :class:`_Inst` (an instance:
units of dies, a KV manager per unit, its role's admission rule, :class:`StepCost`),
:class:`_SystemLevel` (the entry pool's queue, the up-front rejection, the KV hand-off, the caching
pool) and :class:`_HeapClock` (an event heap beside one fabric simulation, :class:`_LiveFabric`).

Every deployment shape (:class:`PoolSpec` lists them; :mod:`npusim.system.deploy` reads
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
import weakref
from collections import deque
from dataclasses import dataclass, field, replace

import numpy as np

from npusim.arch import summarize as chip_summary
from npusim.engine.tasks import DONE, KIND_FIXED
from npusim.errors import ConfigError
from npusim.mapping.deployment import CachingPool, Deployment, SystemServing
from npusim.model.configs import ModelConfig
from npusim.model.zoo import get_config
from npusim.serving import loop
from npusim.serving.kvcache import KVCacheManager
from npusim.serving.loop import ARRIVE, KV_ARRIVED, READY, Transfers, advance
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

ROLES = ("aggregated", "prefill", "decode")
_PHASES = {"prefill": ["prefill"], "decode": ["decode"], "aggregated": ["decode", "prefill"]}  # the steps a role runs


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
    """A system instance behind the serving loop's instance interface (:mod:`npusim.serving.loop`):
    ``units`` of dies, a KV manager per unit (aggregated, decode), iterations timed by ``cost``, one
    iteration at a time. Its admission rule is its role's (see the module docstring)."""

    name: str
    role: str
    pool: int
    inst: Instance
    units: list[list[int]]  # fabric vertices of each unit's dies
    scheduler: Scheduler
    cost: StepCost
    level: "_SystemLevel" = field(repr=False, default=None)
    kv: list[KVCacheManager] = field(default_factory=list)  # per unit (aggregated, decode)
    slots_per_unit: int = 0
    budget: int = 0  # prompt tokens an iteration (prefill)
    running: list[Live] = field(default_factory=list)
    unit_of: dict = field(default_factory=dict)  # request id -> unit
    unit_seqs: list[int] = field(default_factory=list)
    busy: bool = False
    turn: int = 0  # prefill: the unit the next prompt runs on
    pool_writes: tuple = ((), (), ())  # prefill: the caching pool's writes of the prompts just done

    def seqs(self) -> int:
        return sum(self.unit_seqs) if self.unit_seqs else len(self.running)

    # -- the loop's instance interface ----------------------------------------------------------
    def admit(self, records: dict, t: float) -> int:
        """An idle instance's own rule: prefill takes whole prompts when it runs none, aggregated holds
        the queue's head while a unit has room; decode is given its requests (:meth:`_SystemLevel.hand_off`)."""
        if self.busy:
            return 0
        if self.role == "prefill" and not self.running:
            self._admit_prompts(records, t)
        elif self.role == "aggregated":
            self._admit_held(records, t)
        return 0

    def can_launch(self) -> bool:
        return not self.busy and bool(self.running)

    def plan(self) -> list[Slot]:
        return self.scheduler.plan(self.running)

    def launch(self, slots: list[Slot], records: dict, t: float) -> float:
        """Time the iteration (its step cost); the ticket is its end time (s)."""
        self.busy = True
        dur = self.cost.iteration_ms(slots, self.unit_of) / 1e3
        tokens = sum(x.q for x in slots)
        mean_ctx = sum(x.kv * x.q for x in slots) / tokens
        lv = self.level
        lv.steps.append({"instance": self.name, "submitted_s": t, "end_s": t + dur, "requests": len(slots),
                         "tokens": tokens, "mean_context": mean_ctx})
        if all(not x.live.prefilling for x in slots):
            lv.stats["steps"] += 1
            lv.stats["batch_sum"] += len(slots)
        elif self.role == "aggregated":  # an iteration carrying prompt tokens (a prefill pool counts admissions)
            lv.stats["batches"] += 1
        return t + dur

    def complete(self, slots: list[Slot], records: dict, t: float):
        self.busy = False
        lv = self.level
        if self.role == "prefill":  # prompts done leave for decode (output 1: done here)
            made = advance(slots, records, t, lambda rid, n: None)
            writes = ([], [], [])
            done, leaving = [], []
            for x in slots:
                live = x.live
                if live.prefilling:
                    continue
                if lv.pool is not None and live.req.hash_ids:
                    lv.write_blocks(lv.reqs[live.req.id], writes)
                (done if live.req.output_len == 1 else leaving).append(live)
            self.pool_writes = writes
            return done, leaving, made, None
        made = advance(slots, records, t, lambda rid, n: self.kv[self.unit_of[rid]].append(rid, n),
                       lv.mtp_draw if lv.mtp else None)
        return [x.live for x in slots if x.live.done], [], made, None

    def release(self, live: Live) -> None:
        rid = live.req.id
        if self.kv:
            u = self.unit_of.pop(rid)
            self.kv[u].free(rid)
            self.unit_seqs[u] -= 1
        self.running.remove(live)

    # -- admission rules -----------------------------------------------------------------------
    def _admit_prompts(self, records: dict, t: float) -> None:
        """Whole queued prompts FCFS within the budget (the first always); with the caching pool, a
        prompt's cached leading blocks are read over the fabric first and not computed."""
        lv = self.level
        pool, block = lv.pool, lv.block
        batch, tokens = [], 0
        while lv.waiting:
            q = lv.reqs[lv.waiting[0]]
            blocks = pool.held_prefix(q.req.hash_ids) if pool is not None else 0
            hit = min(blocks * block, q.req.input_len - 1)
            compute = q.req.input_len - hit
            if batch and tokens + compute > self.budget:
                break
            lv.waiting.popleft()
            if pool is not None:
                pool.lookup(q.req.hash_ids)
                lv.stats["looked_blocks"] += len(q.req.hash_ids)
            rec = records[q.req.id]
            rec.prefix_hit_tokens = hit
            rec.first_scheduled_s = t
            q.prefill_unit = self.units[self.turn % len(self.units)]
            self.turn += 1
            self.running.append(Live(q.req, prefilled=hit, admitted_at=t))
            batch.append((q, hit))
            tokens += compute
        if not batch:
            return
        lv.stats["batches"] += 1
        lv.stats["saved_tokens"] += sum(h for _, h in batch)
        if pool is not None and any(hit for _, hit in batch):  # read the cached prefix blocks first
            inits, tgts, sizes = [], [], []
            for q, hit in batch:
                for b in range(-(-hit // block)):
                    inits.append(q.prefill_unit[0])
                    tgts.append(lv.cpu_ids[pool.cpu_of(q.req.hash_ids[b])])
                    sizes.append(min(block, hit - b * block) * lv.kvb)
            lv.stats["pool_read_bytes"] += int(sum(sizes))
            self.busy = True
            lv.fabric.start(t, [(inits, tgts, sizes, "read", lv.caching_pool.fabric, lv.via)], [(READY, self)])

    def _admit_held(self, records: dict, t: float) -> None:
        """The queue's head while a unit has a slot and KV room."""
        lv = self.level
        while lv.waiting:
            q = lv.reqs[lv.waiting[0]]
            unit = self.place(q.req)
            if unit is None:
                break
            lv.waiting.popleft()
            rec = records[q.req.id]
            rec.first_scheduled_s = rec.first_scheduled_s or t
            self.running.append(Live(q.req, admitted_at=t))
            self.unit_of[q.req.id] = unit

    def place(self, r: Request) -> int | None:
        """A unit with a sequence slot whose KV manager admits ``r`` (the one with the fewest sequences)."""
        for u in sorted(range(len(self.units)), key=lambda u: (self.unit_seqs[u], u)):
            if self.unit_seqs[u] < self.slots_per_unit and self.kv[u].admit(r.id, r.input_len, r.output_len).ok:
                self.unit_seqs[u] += 1
                return u
        return None


@dataclass
class _Req:
    req: Request
    prefill_unit: list[int] = field(default_factory=list)  # fabric vertices of its prefill unit
    decode: tuple[int, int] | None = None  # (instance index, unit)


class _HeapClock:
    """The system's clock for the serving loop: an event heap (time, then push order) beside the one
    fabric simulation (:class:`_LiveFabric`, None for an aggregated pool), which is advanced to the next
    event's time before it is popped; one event is handed over at a time, except arrivals: every arrival
    at the head of the heap at the same instant is handed over with the first, as the chip's engine clock
    does and as a serving engine takes them (vLLM's ``EngineCoreProc._process_input_queue`` drains every
    queued request before the next step is scheduled)."""

    def __init__(self, fabric: "_LiveFabric | None"):
        self.events: list = []
        self.counter = 0
        self.t = 0.0
        self.fabric = fabric

    def _push(self, t: float, event: tuple) -> None:
        heapq.heappush(self.events, (t, self.counter, event))
        self.counter += 1

    def now_s(self) -> float:
        return self.t

    def send(self, requests) -> None:
        for r in requests:
            self._push(r.arrival_s, (ARRIVE, [r]))

    def watch(self, ticket: float, what: tuple) -> None:
        self._push(ticket, what)

    def next(self) -> list[tuple] | None:
        fabric = self.fabric
        if not self.events and not (fabric is not None and fabric.pending):
            return None
        if fabric is not None:
            for end, kind, payload, durs in fabric.advance(self.events[0][0] if self.events else None):
                self._push(end, (kind, payload, durs))
        self.t, _, event = heapq.heappop(self.events)
        if event[0] != ARRIVE:
            return [event]
        arrived = list(event[1])
        while self.events and self.events[0][0] == self.t and self.events[0][2][0] == ARRIVE:
            arrived += heapq.heappop(self.events)[2][1]
        return [(ARRIVE, arrived)]

    def settle(self) -> None:
        pass


class _SystemLevel:
    """The system level under the serving loop: the pools' instances, the entry pool's one queue, the
    disaggregated hand-off (a decode unit chosen, the KV written over the fabric) and the caching
    pool's traffic."""

    def __init__(self, insts: list[_Inst], by_pool: dict, room: dict, hold_role: str, mode: str, fabric,
                 kv_fabric, via, caching_pool, pool, cpu_ids, block: int, kvb: float, mtp: int, mtp_acc: float,
                 seed: int):
        self.instances, self.by_pool, self.room, self.hold_role, self.mode = insts, by_pool, room, hold_role, mode
        self.fabric, self.kv_fabric, self.via, self.caching_pool = fabric, kv_fabric, via, caching_pool
        self.pool, self.cpu_ids, self.block, self.kvb = pool, cpu_ids, block, kvb
        self.mtp, self.mtp_acc = mtp, mtp_acc
        self.rng = np.random.default_rng(seed)
        self.reqs: dict[int, _Req] = {}
        self.waiting: deque[int] = deque()  # the entry pool's queue
        self.wait_decode: list[int] = []  # prefilled, waiting for decode room
        self.transfers = Transfers()
        self.steps: list[dict] = []
        self.stats = {"batches": 0, "steps": 0, "batch_sum": 0, "pool_read_bytes": 0, "pool_write_bytes": 0,
                      "saved_tokens": 0, "looked_blocks": 0}
        for it in insts:
            it.level = self

    def mtp_draw(self) -> int:
        """MTP's accepted draft tokens: each of ``mtp`` accepted with ``mtp_acceptance``, in order."""
        made = 0
        for _ in range(self.mtp):
            if self.rng.random() >= self.mtp_acc:
                break
            made += 1
        return made

    def write_blocks(self, q: _Req, writes) -> None:
        """A prompt's new blocks, written from its prefill unit to the caching pool's CPUs."""
        for h in self.pool.insert(q.req.hash_ids):
            b = q.req.hash_ids.index(h)
            writes[0].append(q.prefill_unit[0])
            writes[1].append(self.cpu_ids[self.pool.cpu_of(h)])
            writes[2].append(min(self.block, q.req.input_len - b * self.block) * self.kvb)

    # -- the loop's level interface -----------------------------------------------------------
    def arrive(self, req: Request, record: RequestRecord, t: float) -> bool:
        self.reqs[req.id] = _Req(req)
        room = self.room[self.hold_role]
        if req.input_len + req.output_len > room:
            record.rejected_reason = (f"prompt + output longer than a{'' if self.mode == 'aggregated' else ' decode'} "
                                      f"unit's KV capacity ({room} tokens)")
            return False
        self.waiting.append(req.id)
        return True

    def hand_off(self, it: _Inst, leaving: list[Live], records: dict, t: float) -> None:
        if it.role != "prefill":
            return
        for live in leaving:
            it.running.remove(live)
        writes, it.pool_writes = it.pool_writes, ((), (), ())
        self.stats["pool_write_bytes"] += int(sum(writes[2]))
        self._assign_decode(t, [live.req.id for live in leaving], writes)

    def _assign_decode(self, t: float, ids: list[int], pool_writes) -> None:
        """Give each request a decode unit with room, and time the KV writes (and pool writes)."""
        placed = []
        dec = self.by_pool["decode"]
        for rid in ids:
            q = self.reqs[rid]
            got = None
            for k in sorted(range(len(dec)), key=lambda k: (dec[k].seqs(), k)):
                u = dec[k].place(q.req)
                if u is not None:
                    got = (k, u)
                    break
            if got is None:
                self.wait_decode.append(rid)
                continue
            q.decode = got
            dec[got[0]].unit_of[rid] = got[1]
            placed.append(q)
        if not placed and not pool_writes[0]:
            return
        per_die = dec[0].inst.kv_bytes_per_die
        # each die of the decode unit receives its share, from the prefill unit's die of the same index
        moves = [(q.prefill_unit[j % len(q.prefill_unit)], die, q.req.input_len * per_die)
                 for q in placed for j, die in enumerate(dec[q.decode[0]].units[q.decode[1]])]
        kv = ([m[0] for m in moves], [m[1] for m in moves], [m[2] for m in moves], "write", self.kv_fabric, self.via)
        self.transfers.sent_bytes += sum(kv[2])
        pool_fabric = self.caching_pool.fabric if self.caching_pool else self.kv_fabric
        self.fabric.start(t, [kv, (*pool_writes, "write", pool_fabric, self.via)],
                          [[(KV_ARRIVED, (q.req.id, q.req.input_len * per_die * len(dec[q.decode[0]].units[q.decode[1]])))
                            for q in placed], None])

    def on_event(self, event: tuple, records: dict, t: float) -> None:
        kind, payload, durs = event
        if kind == READY:  # the caching pool's blocks were read: the prefill batch may run
            payload.busy = False
            return
        rid, nbytes = payload  # KV_ARRIVED: the request joins its decode unit
        self.transfers.durations_s.append(float(durs[0]))
        self.transfers.received_bytes += nbytes
        q = self.reqs[rid]
        k, u = q.decode
        it = self.by_pool["decode"][k]
        it.kv[u].append(rid, q.req.input_len)
        it.running.append(Live(q.req, prefilled=q.req.input_len, generated=1, admitted_at=t))

    def after_iteration(self, it: _Inst, finished: list, records: dict, t: float) -> None:
        if it.role != "prefill" and finished and self.wait_decode:  # decode room freed
            again, self.wait_decode = self.wait_decode, []
            self._assign_decode(t, again, ([], [], []))

    def reject_stuck(self, records: dict) -> bool:
        return False  # a request no unit can ever hold was refused when it arrived

    def busy(self) -> bool:
        return bool(self.waiting or self.wait_decode or any(it.running for it in self.instances))


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


#: every instance step simulated in this process, by what defines it: the loaded system's and chip-cost
#: model's ids (an entry is dropped when either object goes, so an id is never another object's), then
#: (the plan or deployment, phase, model, seed, runtime), then the step's ``(x, y)`` -- see :func:`_instance`
_STEPS: dict[tuple[int, int], dict] = {}


def _instance(loaded: LoadedSystem, source, phase: str, model, seed: int, cc: ChipCost,
              runtime: str | None = None) -> Instance:
    """The pool's instance for ``phase``, its ``step`` shared by every run in this process with the same
    system, chip-cost model, plan (or deployment), phase, model, seed and runtime: a step is a
    deterministic function of those and ``(x, y)``, so a point one run simulated is the next run's
    without simulating it again (a search's serving checks of one plan at several batch limits, and
    its backoff rounds, reuse each other's step-table points: the same numbers, once)."""
    if isinstance(source, Deployment):
        inst = deployment_instance(loaded, source, model, seed, cc, runtime)
    else:
        inst = plan_instance(loaded, source, phase, model, seed, cc, runtime)
    key = (repr(source), phase, repr(get_config(model)), seed, runtime)
    memo = _steps_of(loaded, cc).setdefault(key, {})
    step = inst.step

    def shared(x: int, y: int) -> float:
        if (x, y) not in memo:
            memo[(x, y)] = step(x, y)
        return memo[(x, y)]
    return replace(inst, step=shared)


def _steps_of(loaded: LoadedSystem, cc: ChipCost) -> dict:
    ids = (id(loaded), id(cc))
    if ids not in _STEPS:
        _STEPS[ids] = {}
        weakref.finalize(loaded, _STEPS.pop, ids, None)
        weakref.finalize(cc, _STEPS.pop, ids, None)
    return _STEPS[ids]


def known_steps(loaded: LoadedSystem, cc: ChipCost) -> dict:
    """The step points this process knows for ``loaded`` and ``cc``: ``{instance key: {(x, y): ms}}`` (the
    keys of :func:`_instance`), to hand to another process's :func:`add_known_steps` on the same system and
    chip-cost model (a search's serving checks on the worker pool: each worker is a separate process)."""
    return {k: dict(v) for k, v in _STEPS.get((id(loaded), id(cc)), {}).items() if v}


def add_known_steps(loaded: LoadedSystem, cc: ChipCost, steps: dict) -> int:
    """Take step points another process simulated on the same system and chip-cost model (see
    :func:`known_steps`); points already known stay. Returns the points added."""
    mine, added = _steps_of(loaded, cc), 0
    for key, points in steps.items():
        memo = mine.setdefault(key, {})
        for xy, ms in points.items():
            if xy not in memo:
                memo[xy] = ms
                added += 1
    return added


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
        phases = _PHASES[p.role]
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
    hold_role = "aggregated" if mode == "aggregated" else "decode"
    dinst0 = by_pool[hold_role][0].inst
    kvb = kvb or kv_bytes_per_token(cfg)
    cpu_ids = [topo.index[f"cpu{c}"] for c in range(s.num_cpus)]
    block = caching_pool.block_tokens if caching_pool else 512
    pool = None
    if use_pool:
        cap_gb = caching_pool.capacity_gb or s.cpu.dram_gb * s.num_cpus
        pool = KVPool(int(cap_gb * 2**30 // (block * kvb)), len(cpu_ids))
    fabric = _LiveFabric(loaded, fidelity) if mode == "disaggregated" else None
    last = max((r.arrival_s for r in requests), default=0.0)
    if last * _LiveFabric.PS_PER_S > MAX_ARRIVAL_PS:
        raise ConfigError(f"the last request arrives {last:.3g} s into the run, beyond the {MAX_ARRIVAL_PS / 1e12:.3g} s "
                          "the fabric's 64-bit picosecond clock holds (a higher --rate, or --time-scale for a trace)")
    level = _SystemLevel(insts, by_pool, room, hold_role, mode, fabric, kv_fabric, via, caching_pool, pool, cpu_ids,
                         block, kvb, dinst0.mtp, dinst0.mtp_acceptance, seed)
    run = loop.serve(level, _HeapClock(fabric), requests, progress, max_concurrency)
    return SystemServingResult(_summary(loaded, cfg, pools, level, run, requests, cc, runtime,
                                        slo_ttft_ms, slo_tpot_ms, slo_tbt_ms),
                               [run.records[r.id] for r in requests], level.steps)


def _summary(loaded: LoadedSystem, cfg: ModelConfig, pools: list[PoolSpec], level: _SystemLevel, run, requests,
             cc: ChipCost, runtime: str | None, slo_ttft_ms, slo_tpot_ms, slo_tbt_ms) -> dict:
    """The run's summary: :func:`npusim.serving.metrics.summarize` of its records and the system's keys."""
    records = [run.records[r.id] for r in requests]
    out = summarize(records, slo_ttft_s=slo_ttft_ms / 1e3 if slo_ttft_ms else None,
                    slo_tbt_s=slo_tbt_ms / 1e3 if slo_tbt_ms else None,
                    slo_tpot_s=slo_tpot_ms / 1e3 if slo_tpot_ms else None)
    insts, stats, pool, tr = level.instances, level.stats, level.pool, level.transfers
    dur = out["duration_s"] or 0.0
    npus = {p.role: p.instances * p.npus for p in pools}
    n_total = sum(npus.values())
    n_hold = npus[level.hold_role]
    kv_s = np.asarray(tr.durations_s) * 1e3
    tpot = (out.get("tpot_ms") or {}).get("mean")
    phases = sorted({ph for p in pools for ph in _PHASES[p.role]}, reverse=True)
    caching_pool = level.caching_pool
    out.update({
        "system": loaded.system.name, "model": cfg.name, "mode": level.mode,
        "npus_prefill": npus.get("prefill", 0), "npus_decode": npus.get("decode", 0),
        "npus_aggregated": npus.get("aggregated", 0), "npus_total": n_total,
        "tokens_per_s_per_npu": out["output_tokens"] / dur / n_total if dur else None,
        "output_throughput_per_npu": out["output_tokens"] / dur / n_total if dur else None,
        "tokens_per_s_per_user": 1e3 / tpot if tpot else None,
        "decode_tokens_per_s_per_npu": (out["output_tokens"] - out["requests_completed"]) / dur / n_hold
        if dur else None,
        "mtp": level.mtp, "mtp_acceptance": level.mtp_acc,
        "runtime": {ph: loaded.system.runtime.mode_for(ph, runtime) for ph in phases},
        "instances": {p.role: insts[[i.pool for i in insts].index(j)].inst.label for j, p in enumerate(pools)},
        "pools": [{"role": p.role, "instances": p.instances, "npus_per_instance": p.npus,
                   "label": insts[[i.pool for i in insts].index(j)].inst.label,
                   "max_batch_per_npu": p.max_batch_per_npu if p.role != "prefill" else None,
                   "tokens_per_npu": p.tokens_per_npu} for j, p in enumerate(pools)],
        "prefill_batches": stats["batches"], "decode_steps": stats["steps"],
        "iterations": len(level.steps),
        "mean_decode_batch_per_npu": stats["batch_sum"] / stats["steps"] / n_hold if stats["steps"] else 0.0,
        "kv_transfer": {"fabric": level.kv_fabric, "via": level.via, "bytes": tr.sent_bytes,
                        "mean_ms": float(kv_s.mean()) if kv_s.size else None,
                        "p99_ms": float(np.percentile(kv_s, 99)) if kv_s.size else None},
        "conservation": {"tokens_made": run.tokens_made,
                         "tokens_expected": sum(r.output_len for r in records if r.completed),
                         "kv_bytes_sent": tr.sent_bytes, "kv_bytes_received": tr.received_bytes},
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
    return out


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
