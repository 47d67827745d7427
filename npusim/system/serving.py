"""Serving a request stream on a multi-NPU system: prefill instances, a decode instance, KV moved over the fabric.

The CloudMatrix384 deployment of DeepSeek-V3/R1 (prefill/decode disaggregation, the EMS caching
pool), as a discrete-event simulation over requests:

* **prefill instances** (``system_serving.prefill``: ``instances`` of the prefill deployment, on
  disjoint NPUs after the decode instance's) take queued prompts first come, first served, up to
  ``tokens_per_npu`` prompt tokens per NPU a batch (a longer prompt takes several such steps);
  a request's prompt runs on one die of the instance (data-parallel attention; dies in turn).
  A batch lasts the time to load its cached prefix blocks from the pool plus its prefill steps,
  from the prefill :class:`~npusim.system.step_table.StepTable` at (tokens per NPU, the
  token-weighted prompt length). Its end is each request's first token (TTFT).
* **caching pool** (optional, :mod:`npusim.system.kv_pool`): before a prompt's prefill, its
  leading blocks found in the pool are read from the CPUs' DRAM (fabric reads from ``cpuN``) and
  not computed (at least one token is always computed); after it, the prompt's new blocks are
  written to the pool (fabric writes, not waited for).
* **KV transfer**: after its prefill a request is given a decode die (the one with the fewest
  sequences among those with a sequence slot and KV room for its whole prompt + output) and its
  prompt's KV (``input_len`` x :func:`~npusim.system.moe_step.kv_bytes_per_token` bytes) is
  written from its prefill die to that die over ``kv_transfer.fabric``; a request with no room
  waits (its KV stays on the prefill die) until a decode sequence finishes. All transfers of the
  run (KV, pool reads and writes) share one fabric simulation (:class:`SystemSim`, flow model)
  started as the serving clock reaches them, so they contend with everything in flight.
* **decode instance**: continuous batching; each step runs every sequence that has arrived, at
  most ``max_batch_per_npu`` per NPU; its time is the decode table's at (the busiest die's
  sequences x dies per NPU, the mean KV length); a sequence makes ``1 + accepted`` tokens a step
  (each of the ``mtp`` speculative tokens accepted with ``mtp_acceptance``, in order, seeded).

Times are seconds (``_s``); summaries in ms as :func:`npusim.serving.metrics.summarize` gives
them. Deterministic for a given seed. What is not modelled is listed in ``NOTE``.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from npusim.arch import summarize as chip_summary
from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment, SystemServing
from npusim.model.zoo import get_config
from npusim.serving.client import ClosedLoop
from npusim.serving.metrics import RequestRecord, summarize
from npusim.serving.requests import Request, check_context
from npusim.system.chipcost import ChipCost
from npusim.system.kv_pool import KVPool
from npusim.system.load import LoadedSystem
from npusim.system.instance import deployment_instance, plan_instance
from npusim.system.moe_step import kv_bytes_per_token
from npusim.system.plan import ParallelPlan
from npusim.engine.tasks import DONE, KIND_FIXED
from npusim.system.simulator import PS_PER_US, SystemSim
from npusim.system.step_table import StepTable

#: the latest arrival a run takes, in picoseconds: the fabric engine's clock is an int64
MAX_ARRIVAL_PS = 2**62
NOTE = ("partial model: step times interpolated between simulated step shapes (see step_table), every die of "
        "a step at the busiest die's batch; prefill-side KV capacity, pool reads overlapping compute and "
        "decode preemption are not modelled")

ARRIVAL, PREFILL_DONE, KV_ARRIVED, STEP_DONE, POOL_LOADED = range(5)


@dataclass
class _Seq:
    req: Request
    record: RequestRecord
    prefill_die: int = -1  # the fabric vertex its pool reads and writes start from (its prefill unit's first die)
    prefill_unit: list[int] = field(default_factory=list)  # fabric vertices of the prefill unit
    decode_unit: int = -1  # the decode unit (a die, or a TP group) it runs on
    remaining: int = 0  # output tokens still to make
    kv_len: int = 0


@dataclass
class SystemServingResult:
    """The summary, one record per request, and one dict per prefill batch or decode step
    (``instance``, ``submitted_s``, ``end_s``, ``requests``, ``tokens`` computed, ``mean_context``)."""

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


def simulate_system_serving(loaded: LoadedSystem, plan: SystemServing, pdep: Deployment | ParallelPlan,
                            ddep: Deployment | ParallelPlan,
                            requests: list[Request], model: str = "deepseek-r1", seed: int = 0,
                            kv_fabric: str | None = None, caching_pool: bool | None = None,
                            mtp: int | None = None, mtp_acceptance: float | None = None,
                            fidelity: str = "flow", slo_tbt_ms: float | None = None,
                            progress=None, chip_cost: ChipCost | None = None,
                            max_concurrency: int | None = None, runtime: str | None = None) -> SystemServingResult:
    """Serve ``requests`` (see module docstring); flags override the plan's choices. ``pdep`` and
    ``ddep``: DeepSeek deployments, or parallel plans of any model (:mod:`npusim.system.instance`).
    Goodput counts requests within the plan's TTFT and TPOT objectives (and every gap between
    tokens within ``slo_tbt_ms`` when given). ``max_concurrency``: a benchmark client's limit on
    requests in flight (:class:`npusim.serving.client.ClosedLoop`): ``arrival_s`` are then planned
    send times, each request sent no earlier than a finished (or rejected) one frees a slot.
    ``runtime``: the steps' runtime mode, eager / graph (None: the system's default per phase)."""
    s = loaded.system
    cfg = get_config(model)
    check_context(requests, cfg.max_position_embeddings, model)
    topo = loaded.topology
    dpn = s.npu.dies
    if mtp is not None or mtp_acceptance is not None:
        ddep = ddep.with_changes(mtp=mtp, mtp_acceptance=mtp_acceptance) if isinstance(ddep, ParallelPlan) \
            else ddep.overridden(mtp=mtp, mtp_acceptance=mtp_acceptance)
    cc = chip_cost or ChipCost(loaded.chip)
    pinst, dinst = (deployment_instance(loaded, d, model, seed, cc, runtime) if isinstance(d, Deployment)
                    else plan_instance(loaded, d, phase, model, seed, cc, runtime)
                    for d, phase in ((pdep, "prefill"), (ddep, "decode")))
    used = dinst.npus + plan.prefill.instances * pinst.npus
    if used > s.num_npus:
        raise ConfigError(f"system_serving: decode {dinst.npus} NPUs + {plan.prefill.instances} prefill instances x "
                          f"{pinst.npus} NPUs = {used} NPUs, but {s.name} has {s.num_npus} "
                          f"(a larger --nodes, or fewer --prefill-instances)")
    kv_fab = kv_fabric or plan.kv_transfer.fabric
    pool_cfg = plan.caching_pool
    use_pool = (pool_cfg is not None and pool_cfg.enabled) if caching_pool is None else caching_pool
    if use_pool and pool_cfg is None:
        raise ConfigError("--caching-pool on: the mapping's system_serving has no caching_pool section")
    for name in [kv_fab] + ([pool_cfg.fabric] if use_pool else []):
        if name not in s.fabrics:
            raise ConfigError(f"system_serving: fabric '{name}' is not one of {s.name}'s ({', '.join(s.fabrics)})")
    if use_pool and s.num_cpus == 0:
        raise ConfigError(f"--caching-pool on: {s.name} has no CPUs to hold the pool")

    kvb = kv_bytes_per_token(cfg) * (0.5 if getattr(ddep, "kv_dtype", "bf16") == "int8" else 1)  # a token, whole
    hbm = chip_summary(loaded.chip).hbm_gb * 2**30
    room_tokens = int((hbm - dinst.weights_gib_per_die * 2**30) // dinst.kv_bytes_per_die)
    if room_tokens <= 0:
        raise ConfigError(f"system_serving: the decode instance's weights ({dinst.weights_gib_per_die * 2**30 / 1e9:.1f} "
                          f"GB per die) leave no HBM for KV ({hbm / 1e9:.1f} GB per die): more decode NPUs")
    d_units = len(dinst.units)
    slots_per_unit = max(1, plan.decode.max_batch_per_npu * dinst.npus // d_units)  # per unit
    dies = [topo.index[n] for n in topo.die_names]
    decode_units = [[dies[d] for d in unit] for unit in dinst.units]
    inst_units = [[[dies[(dinst.npus + i * pinst.npus) * dpn + d] for d in unit] for unit in pinst.units]
                  for i in range(plan.prefill.instances)]
    cpu_ids = [topo.index[f"cpu{c}"] for c in range(s.num_cpus)]
    block = pool_cfg.block_tokens if pool_cfg else 512
    pool = None
    if use_pool:
        cap_gb = pool_cfg.capacity_gb or s.cpu.dram_gb * s.num_cpus
        pool = KVPool(int(cap_gb * 2**30 // (block * kvb)), len(cpu_ids))

    budget = plan.prefill.tokens_per_npu * pinst.npus
    max_in = max((r.input_len for r in requests), default=1)
    max_ctx = max((r.input_len + r.output_len for r in requests), default=2)
    ptable = StepTable(pinst.step, "prefill", x_max=plan.prefill.tokens_per_npu, y_max=max(max_in, 128),
                       x_min=min(128, plan.prefill.tokens_per_npu))
    dtable = StepTable(dinst.step, "decode", x_max=slots_per_unit * dinst.x_scale, y_max=max(max_ctx, 128))
    fabric = _LiveFabric(loaded, fidelity)
    rng = np.random.default_rng(seed)

    seqs = {r.id: _Seq(r, RequestRecord.from_request(r)) for r in requests}
    for q in seqs.values():
        need = q.req.input_len + q.req.output_len
        if need > room_tokens:
            q.record.rejected_reason = "prompt + output longer than a decode die's KV capacity"
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

    def send(reqs) -> None:
        """Requests sent: each arrives at its (possibly later than planned) send time."""
        for r in reqs:
            q = seqs[r.id]
            q.req = r
            q.record.arrival_s = r.arrival_s
            if source is not None or q.record.rejected_reason is None:  # a client's rejection frees its slot then
                push(r.arrival_s, ARRIVAL, r.id)

    send(requests if source is None else source.initial())
    waiting: deque[int] = deque()  # prompts queued for a prefill instance
    idle = deque(range(plan.prefill.instances))
    wait_decode: list[int] = []  # prefilled, waiting for decode room
    unit_seqs = [0] * d_units  # per decode unit (a die, or a TP group)
    unit_tokens = [0] * d_units
    ready: list[_Seq] = []  # decode sequences whose KV has arrived
    decoding = False
    stats = {"prefill_batches": 0, "decode_steps": 0, "batch_sum": 0, "kv_bytes": 0, "kv_s": [],
             "pool_read_bytes": 0, "pool_write_bytes": 0, "saved_tokens": 0, "looked_blocks": 0}
    steps: list[dict] = []
    done_count = 0

    def start_prefill(t: float, inst: int) -> None:
        batch, tokens = [], 0
        while waiting:
            q = seqs[waiting[0]]
            blocks = pool.held_prefix(q.req.hash_ids) if pool is not None else 0
            hit = min(blocks * block, q.req.input_len - 1)
            compute = q.req.input_len - hit
            if batch and tokens + compute > budget:
                break
            waiting.popleft()
            if pool is not None:
                pool.lookup(q.req.hash_ids)
                stats["looked_blocks"] += len(q.req.hash_ids)
            q.record.prefix_hit_tokens = hit
            q.record.first_scheduled_s = t
            q.prefill_unit = inst_units[inst][len(batch) % len(inst_units[inst])]
            q.prefill_die = q.prefill_unit[0]
            batch.append((q, hit, compute))
            tokens += compute
        stats["prefill_batches"] += 1
        stats["saved_tokens"] += sum(h for _, h, _ in batch)
        # reads of the cached prefix blocks from the pool's CPUs, before the prefill
        if pool is not None and any(hit for _, hit, _ in batch):
            inits, tgts, sizes = [], [], []
            for q, hit, _ in batch:
                for b in range(-(-hit // block)):
                    inits.append(q.prefill_die)
                    tgts.append(cpu_ids[pool.cpu_of(q.req.hash_ids[b])])
                    sizes.append(min(block, hit - b * block) * kvb)
            stats["pool_read_bytes"] += int(sum(sizes))
            fabric.start(t, [(inits, tgts, sizes, "read", pool_cfg.fabric, plan.kv_transfer.via)],
                         [(POOL_LOADED, (inst, batch, tokens, t))])
        else:
            run_prefill(t, inst, batch, tokens, t)

    def run_prefill(t: float, inst: int, batch, tokens: int, submitted: float) -> None:
        """The batch's prefill steps, from ``t`` (its pool reads done)."""
        seq_len = sum(q.req.input_len * c for q, _, c in batch) / max(1, tokens)
        n_steps = max(1, math.ceil(tokens / budget))
        per_npu = min(tokens, budget) / pinst.npus
        end = t + n_steps * ptable.step_ms(per_npu, seq_len) / 1e3
        steps.append({"instance": f"prefill{inst}", "submitted_s": submitted, "end_s": end, "requests": len(batch),
                      "tokens": tokens, "mean_context": seq_len})
        push(end, PREFILL_DONE, (inst, [q.req.id for q, _, _ in batch]))

    def assign_decode(t: float, ids: list[int], pool_writes) -> None:
        """Give each request a decode die if one has room, and time the KV writes (and pool writes)."""
        placed = []
        for rid in ids:
            q = seqs[rid]
            need = q.req.input_len + q.req.output_len
            cands = [d for d in range(d_units) if unit_seqs[d] < slots_per_unit and unit_tokens[d] + need <= room_tokens]
            if not cands:
                wait_decode.append(rid)
                continue
            d = min(cands, key=lambda x: (unit_seqs[x], x))
            unit_seqs[d] += 1
            unit_tokens[d] += need
            q.decode_unit = d
            placed.append(q)
        if not placed and not pool_writes[0]:
            return
        # each die of the decode unit receives its share, from the prefill unit's die of the same index
        moves = [(q.prefill_unit[j % len(q.prefill_unit)], die, q.req.input_len * dinst.kv_bytes_per_die)
                 for q in placed for j, die in enumerate(decode_units[q.decode_unit])]
        kv = ([m[0] for m in moves], [m[1] for m in moves], [m[2] for m in moves], "write", kv_fab,
              plan.kv_transfer.via)
        stats["kv_bytes"] += sum(kv[2])
        fabric.start(t, [kv, (*pool_writes, "write", pool_cfg.fabric if pool_cfg else kv_fab, plan.kv_transfer.via)],
                     [[(KV_ARRIVED, q.req.id) for q in placed], None])

    def start_step(t: float) -> None:
        nonlocal decoding
        if not ready:
            decoding = False
            return
        decoding = True
        per_unit: dict[int, int] = {}
        for q in ready:
            per_unit[q.decode_unit] = per_unit.get(q.decode_unit, 0) + 1
        x = max(per_unit.values()) * dinst.x_scale
        y = sum(q.kv_len for q in ready) / len(ready)
        dur = dtable.step_ms(x, y) / 1e3
        stats["decode_steps"] += 1
        stats["batch_sum"] += len(ready)
        steps.append({"instance": "decode", "submitted_s": t, "end_s": t + dur, "requests": len(ready),
                      "tokens": len(ready) * (1 + dinst.mtp), "mean_context": y})
        push(t + dur, STEP_DONE, list(ready))

    while events or fabric.pending:
        for end, fkind, fpayload, durs in fabric.advance(events[0][0] if events else None):
            if fkind == KV_ARRIVED:
                stats["kv_s"].append(float(durs[0]))
            push(end, fkind, fpayload)
        t, _, kind, payload = heapq.heappop(events)
        if kind == POOL_LOADED:
            run_prefill(t, *payload)
        elif kind == ARRIVAL:
            if seqs[payload].record.rejected_reason is None:
                waiting.append(payload)
            else:  # only with a client (source): its slot frees at once
                send(source.on_finish(t))
        elif kind == PREFILL_DONE:
            inst, ids = payload
            idle.append(inst)
            writes = ([], [], [])
            going = []
            for rid in ids:
                q = seqs[rid]
                q.record.token_times_s.append(t)
                if pool is not None and q.req.hash_ids:
                    for h in pool.insert(q.req.hash_ids):
                        b = q.req.hash_ids.index(h)
                        writes[0].append(q.prefill_die)
                        writes[1].append(cpu_ids[pool.cpu_of(h)])
                        writes[2].append(min(block, q.req.input_len - b * block) * kvb)
                if q.req.output_len == 1:
                    q.record.finish_s = t
                    done_count += 1
                    if source is not None:
                        send(source.on_finish(t))
                else:
                    q.remaining = q.req.output_len - 1
                    q.kv_len = q.req.input_len + 1
                    going.append(rid)
            stats["pool_write_bytes"] += int(sum(writes[2]))
            assign_decode(t, going, writes)
        elif kind == KV_ARRIVED:
            ready.append(seqs[payload])
            if not decoding:
                start_step(t)
        elif kind == STEP_DONE:
            finished = []
            for q in payload:
                made = 1
                for _ in range(dinst.mtp):
                    if rng.random() >= dinst.mtp_acceptance:
                        break
                    made += 1
                made = min(made, q.remaining)
                q.record.token_times_s.extend([t] * made)
                q.remaining -= made
                q.kv_len += made
                if q.remaining == 0:
                    q.record.finish_s = t
                    finished.append(q)
            for q in finished:
                ready.remove(q)
                unit_seqs[q.decode_unit] -= 1
                unit_tokens[q.decode_unit] -= q.req.input_len + q.req.output_len
                done_count += 1
                if source is not None:
                    send(source.on_finish(t))
            if progress is not None and finished:
                progress(t, done_count, len(requests))
            if finished and wait_decode:
                again, wait_decode[:] = list(wait_decode), []
                assign_decode(t, again, ([], [], []))
            start_step(t)
        while idle and waiting:
            start_prefill(t, idle.popleft())

    records = [seqs[r.id].record for r in requests]
    slo_t = plan.slo_ttft_ms / 1e3 if plan.slo_ttft_ms else None
    slo_p = plan.slo_tpot_ms / 1e3 if plan.slo_tpot_ms else None
    out = summarize(records, slo_ttft_s=slo_t, slo_tbt_s=slo_tbt_ms / 1e3 if slo_tbt_ms else None, slo_tpot_s=slo_p)
    dur = out["duration_s"] or 0.0
    n_prefill = plan.prefill.instances * pinst.npus
    kv_s = np.asarray(stats["kv_s"]) * 1e3
    out.update({
        "system": s.name, "model": cfg.name,
        "npus_prefill": n_prefill, "npus_decode": dinst.npus, "npus_total": n_prefill + dinst.npus,
        "tokens_per_s_per_npu": out["output_tokens"] / dur / (n_prefill + dinst.npus) if dur else None,
        "decode_tokens_per_s_per_npu": (out["output_tokens"] - out["requests_completed"]) / dur / dinst.npus
        if dur else None,
        "mtp": dinst.mtp, "mtp_acceptance": dinst.mtp_acceptance,
        "instances": {"prefill": pinst.label, "decode": dinst.label},
        "prefill_batches": stats["prefill_batches"], "decode_steps": stats["decode_steps"],
        "mean_decode_batch_per_npu": stats["batch_sum"] / stats["decode_steps"] / dinst.npus
        if stats["decode_steps"] else 0.0,
        "kv_transfer": {"fabric": kv_fab, "via": plan.kv_transfer.via, "bytes": stats["kv_bytes"],
                        "mean_ms": float(kv_s.mean()) if kv_s.size else None,
                        "p99_ms": float(np.percentile(kv_s, 99)) if kv_s.size else None},
        "caching_pool": None if pool is None else {
            "fabric": pool_cfg.fabric, "capacity_blocks": pool.capacity_blocks, "blocks_held": len(pool),
            "blocks_inserted": pool.inserted, "blocks_evicted": pool.evicted,
            "hit_rate": pool.hit_blocks / stats["looked_blocks"] if stats["looked_blocks"] else 0.0,
            "prefill_tokens_saved": stats["saved_tokens"], "read_bytes": stats["pool_read_bytes"],
            "write_bytes": stats["pool_write_bytes"]},
        "step_table": {"prefill_points": ptable.points, "decode_points": dtable.points,
                       "lookups": ptable.lookups + dtable.lookups},
        "chip_cost": cc.stats.as_dict(),
        "note": NOTE,
    })
    return SystemServingResult(out, records, steps)
