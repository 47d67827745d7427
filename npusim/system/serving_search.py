"""Serving deployment search (``npusim plan --serving``): aggregated or disaggregated, which plans, how
many instances, what batch limits, for a model on ``N`` NPUs of a system, under TTFT/TPOT objectives;
every answer checked by serving requests (:func:`npusim.system.serving.serve_pools`).

1. **Step search** (on the worker pool, one task per plan): every instance size ``n`` dividing the
   budget ``N``; every plan of its dies (:func:`npusim.system.search.candidate_plans` with the grid
   open: every ``tp`` and every EP that divides the instance's dies -- one that does not divide the
   experts with the fewest redundant slots that make it, greedily placed --, ``pp`` up to ``max_pp``,
   micro-batches 1 and 2, MTP 0 and 1 for models with an MTP module, one more redundant expert slot
   per EP rank when the routing is skewed -- with uniform routing a copy only takes memory). Decode:
   each plan at 1, 2, 4, 8 ... (powers of two) up to ``DECODE_TOP_PER_NPU`` (128) sequences per NPU
   (:func:`decode_ladder`: the same batches per NPU at every instance size) at the context
   ``input + output / 2``, until one misses the TPOT objective or HBM, then the three best plans of
   each instance size once more at 1.5 times their last feasible batch (between the powers of two: 96
   per NPU when 64 passed and 128 missed); prefill: one prompt of ``input`` tokens per DP group (its
   TTFT when it runs alone).
2. **Estimates** (arithmetic on the step results, to rank candidates, never an answer):
   *aggregated* -- a decode plan at batch ``b`` (per instance), ``N / n`` replicas: an instance makes
   ``b`` requests' tokens per ``O x tpot(b) + b x t_p`` (``t_p``: its prefill time per prompt, the
   prompts' steps stall the decodes), so TPOT ~ ``tpot(b) + b t_p / O`` and TTFT ~ the prefill step;
   *disaggregated* (xPyD) -- sized by rate matching (:func:`rate_matched`, as AIConfigurator does): the
   two fastest-prompt plans of each instance size paired with every decode plan and batch ``b``; for
   each ``y`` decode instances that fit, ``x`` prefill instances at the floor and ceiling of the count
   whose prompt rate (``x dp / ttft``, at most the utilisation cap of :func:`prefill_utilisation_cap`:
   M/D/1, so the mean TTFT stays within its objective at that load) carries the decode pool's
   requests (``y b / (O tpot)``); TTFT and requests/s those of the closed loop the check serves, at its
   ``y b`` slots (:func:`closed_loop_prefill`: approximate mean value analysis, M/D/1 in the open limit,
   Little's law when the prefill pool saturates), TPOT ~ ``tpot(b)``. A prefill batch holds the step estimate's prompts (one per DP group:
   ``tokens_per_npu = dp x input / n``).
   With ``max_concurrency`` (the user's benchmark concurrency) no candidate holds more sequences than
   that (batch limit x instances).
3. **Serving check**: the best ``serve_top`` distinct candidates of each mode by estimated tokens/s per NPU
   (among those the estimate says meet both objectives; one deployment reached by two routes --
   independent DP groups cut into instances two ways, or replicas of a smaller deployment, see
   :func:`deployment_key` -- takes one place, the cheapest to serve of them), and the best of each mode again at a quarter
   of its batch limit (a point further up the tokens/s-per-user axis; that candidate's own estimate), are served: a closed loop of
   ``C`` = the deployment's sequence slots (the concurrency its batch limit implies, as the estimate
   assumes), ``3 C`` prompts of exactly ``input``/``output`` tokens, all sent at 0 (an aggregated
   deployment of ``R`` replicas as one replica at ``C / R`` with ``3 C / R`` prompts: at its slots each
   replica refills its own freed slot; they share only the queue, whose same-instant refills can land on
   another replica -- Qwen3-0.6B, 2 replicas against 1 at half: TTFT 6% apart, TPOT and tokens/s per NPU
   0.6% --; ``replicas`` says so). Latencies are judged on the requests sent after the
   first ``C`` (the first wave's TTFT is the cold start's queue, not the deployment's steady state);
   throughput is the tokens made while the loop is full (:func:`steady_throughput`: from the first
   refill to the last send; the whole run's, ramp-up and drain included, is beside it). A candidate is *feasible* when those requests' mean TTFT and mean
   TPOT meet the objectives. A served candidate that misses an objective is served
   again at half its decode batch limit (up to ``BACKOFF_ROUNDS`` times, each with that candidate's own
   estimate; each served candidate's ``serve_round`` says which: 0 for the first), since the step estimate misses queueing: without it a looser search could stop at an
   infeasible large batch whose quarter point is far below what a tighter search finds. A disaggregated
   deployment at half the batch needs fewer prefill instances to match its rate, so when the same prefill
   count was not estimated, the same pools at another prefill count are (:func:`backoff_candidate`). A
   disaggregated deployment that met TPOT but missed TTFT queued its prompts for the prefill pool: it is
   served again with one more prefill instance instead, while the budget holds one (:func:`more_prefill`).

**Full scale** (``plans_per_size``): before any step is simulated, :func:`prune_plans` skips the plans
that cannot hold the model and their lowest batch's KV, or whose roofline TPOT (weights and KV read
once at the HBM bandwidth) misses the objective, and keeps, for each instance size, the ``K`` best (tp,
ep, redundant slots) shapes by that roofline's tokens/s per NPU, each at one micro-batch and the most
MTP tokens (prompt steps at MTP off); after their ladders, the other micro-batch and MTP choices of each
size's best shape are laddered too. Every skipped plan is in ``candidates`` with its reason and
counted in ``skipped``. The roofline leaves out compute and communication: it ranks, it does not bound,
so a shape it ranks low (more TP, a smaller EP) may be missed.

Not exact: the split estimate is an approximate closed-network analysis. Until session 43 it was M/D/1, an
open (Poisson) queue, while the check is a closed loop at the slots, which never queues more than its slots:
near the rate match it rejected a split the check serves within its objectives (Llama-3-70B on 8 Atlas 800I
A2 cards, 1024 / 256 tokens, 2,000 / 50 ms: one tp4 prefill instance and one tp4 decode instance at 32
sequences, M/D/1 TTFT 58 s at prefill utilisation 0.998, served 368 ms and 107.5 tokens/s per NPU; the
closed loop's estimate is about 1.3 s). It still assumes requests independent of each other, while the
check's fixed lengths move them in waves, and it can accept a split the check misses (session 42's
Qwen3-30B-A3B b512 splits, whose first waves queue more).

Not guaranteed: that a tighter objective never gives a better ``best`` across two searches. Judged on the
same served candidates it cannot (a tighter objective only removes feasible ones), but each search serves
the best *estimates* under its own objectives, so a tighter search can serve a candidate a looser one
ranked below its top ``serve_top`` and did not serve (Qwen3-30B-A3B on 8 CloudMatrix384 NPUs: at 500 ms /
20 ms the search served an aggregated batch-256 deployment, 1,541.7 tokens/s per NPU, that the 2,000 ms /
50 ms search ranked below its batch-512 one, 1,526.1 when served: the estimate keeps growing with the batch
while served throughput has saturated).

``best`` is the feasible served candidate with the most output tokens/s per NPU (``best_per_objective``
also names the one with the most tokens/s per user); ``pareto`` the feasible served candidates no
other beats on both tokens/s per NPU and tokens/s per user. Every served candidate carries its step
estimate and the estimate's error against the served result.
"""

from __future__ import annotations

import math
import time
from fractions import Fraction
from dataclasses import dataclass, replace

from npusim.errors import ConfigError, NpusimError
from npusim.model.zoo import get_config
from npusim.system.search import PlanPoint, _divisors, _system, candidate_plans, front, run_plan_point

#: rounds of serving a candidate that missed an objective again at half its decode batch limit
BACKOFF_ROUNDS = 3
#: the decode ladder's largest batch per NPU (its 1.5x refinement reaches 96, the published
#: CloudMatrix384 DeepSeek-R1 decode batch, when 128 misses)
DECODE_TOP_PER_NPU = 128
#: full scale (``plans_per_size``): decode ladders start at this many sequences per NPU (fewer only
#: move along the tokens/s-per-user axis at low throughput; the quarter-batch check of a 64-per-NPU
#: best still has its point)
FULL_SCALE_FROM_PER_NPU = 16
#: full scale: prompt steps only for instances of at most budget / this many NPUs (a prompt step of
#: one prompt per DP group over 160 NPUs -- 320 prompts -- takes minutes to simulate; the published
#: prefill instances are the small ones), so aggregated candidates have at least this many replicas
FULL_SCALE_PREFILL_SHARE = 4
#: full scale: the micro-batch / MTP variants, and the 1.5x batches, of this many best coarse plans
FULL_SCALE_REFINE = 2
#: prefill plans of each instance size (fastest prompts per ms first) paired with every decode plan
PREFILL_PLANS_PER_SIZE = 2


@dataclass(frozen=True)
class Ladder:
    """One plan's batches, run in order until one fails (a worker's task)."""

    points: tuple[PlanPoint, ...]


def decode_ladder(plan, full_scale: bool = False) -> list[int]:
    """A decode plan's ladder of instance batches (sequences), smallest first: its lowest batch (one
    sequence per DP group and micro-batch; at ``full_scale`` at least ``FULL_SCALE_FROM_PER_NPU`` per NPU),
    then ``k x npus`` for ``k`` = 1, 2, 4 ... ``DECODE_TOP_PER_NPU`` sequences per NPU above it. The
    powers of two are per NPU, so every instance size of a plan shape is tried at the same batches per
    NPU (a ladder of the instance's batch in powers of two put a 160-NPU instance at 25.6 and 51.2 per
    NPU, batches no deployment can state as a whole number per NPU, and 64 per NPU on 64 NPUs)."""
    lo = plan.dp * plan.microbatches
    if full_scale:
        lo = max(lo, FULL_SCALE_FROM_PER_NPU * plan.npus)
    per_npu = [1 << i for i in range(DECODE_TOP_PER_NPU.bit_length()) if 1 << i <= DECODE_TOP_PER_NPU]
    return [lo] + [k * plan.npus for k in per_npu if k * plan.npus > lo]


def run_ladder(task: Ladder) -> list[dict]:
    out = []
    for pt in task.points:
        rec = run_plan_point(pt)
        rec["phase"] = pt.phase
        out.append(rec)
        if not rec["feasible"]:
            break
    return out


def _ladder_died(task: Ladder, exc: BaseException) -> list[dict]:
    return [{"plan": task.points[0].plan, "batch": task.points[0].batch, "phase": task.points[0].phase,
             "feasible": False, "simulated": False,
             "reason": f"the worker running this plan died ({type(exc).__name__}: {exc})"}]


@dataclass(frozen=True)
class ServeTask:
    """One candidate deployment to serve (a worker's task)."""

    deployment: dict  # ServingDeployment fields
    num_prompts: int
    concurrency: int
    input_len: int
    output_len: int
    seed: int = 0
    index: int = 0  # its place in the search's list (results come back in completion order)
    # step points earlier checks simulated (serving.known_steps, as ((key, ((x, y), ms), ...), ...)): the checks
    # of one process share them (serving._instance), but each round's worker pool is new processes, so the
    # search hands each check what the checks of the rounds before it simulated
    steps: tuple = ()


def steps_tuple(steps: dict) -> tuple:
    """``serving.known_steps``'s dict as a :class:`ServeTask`'s ``steps`` (sorted: the same tuple for the same points)."""
    return tuple(sorted((k, tuple(sorted(v.items()))) for k, v in steps.items()))


def merge_steps(into: dict, steps: dict | None) -> None:
    for k, v in (steps or {}).items():
        into.setdefault(k, {}).update(v)


def serve_candidate(task: ServeTask) -> dict:
    """Serve a candidate (see the module docstring); its served figures, never raises for its own failure."""
    from npusim.serving.metrics import summarize
    from npusim.serving.workload import RequestSource
    from npusim.system.deploy import ServingDeployment, scenario
    from npusim.system.serving import add_known_steps, known_steps, serve_pools

    try:
        dep = ServingDeployment(**task.deployment)
        loaded, cc = _system(dep.system, dep.nodes)  # one pair a process (lru_cache): its checks share points
        add_known_steps(loaded, cc, {k: dict(v) for k, v in task.steps})
        before = sum(map(len, known_steps(loaded, cc).values()))
        loaded, pools = scenario(dep, loaded=loaded)
        cfg = get_config(dep.model)
        # aggregated replicas at C = their slots share nothing: each refills its own freed slot, so one
        # replica at C / R with 1 / R of the prompts is the deployment (per NPU and per request)
        replicas = pools[0].instances if dep.mode == "aggregated" and task.concurrency % pools[0].instances == 0 \
            and task.num_prompts % pools[0].instances == 0 else 1
        if replicas > 1:
            pools = [replace(pools[0], instances=1)]
        conc, prompts = task.concurrency // replicas, task.num_prompts // replicas
        # the benchmark client's closed loop: every prompt planned at 0, `concurrency` in flight
        reqs = RequestSource(dataset="random", input_len=task.input_len, output_len=task.output_len,
                             num_prompts=prompts, seed=task.seed).requests_for(cfg).requests
        run = serve_pools(loaded, pools, reqs, cfg, kv_fabric=dep.kv_transfer.fabric if dep.kv_transfer else None,
                          via=dep.kv_transfer.via if dep.kv_transfer else "sdma", slo_ttft_ms=dep.slo_ttft_ms,
                          slo_tpot_ms=dep.slo_tpot_ms, seed=task.seed, chip_cost=cc, max_concurrency=conc,
                          runtime=dep.runtime)
        s = run.summary
        steady = [r for r in run.records if r.id >= conc] or run.records
        st = summarize(steady, slo_ttft_s=dep.slo_ttft_ms / 1e3 if dep.slo_ttft_ms else None,
                       slo_tpot_s=dep.slo_tpot_ms / 1e3 if dep.slo_tpot_ms else None)
        ttft, tpot = st["ttft_ms"]["mean"], st["tpot_ms"]["mean"]
        steady_tput = steady_throughput(run.records, conc)
        npus_total = s["npus_total"]
        return {"_task": task.index, "served": True,
                "output_throughput_per_npu": steady_tput / npus_total if steady_tput else s["output_throughput_per_npu"],
                "output_throughput_per_npu_run": s["output_throughput_per_npu"],
                "output_throughput": s["output_throughput"] * replicas, "ttft_ms": ttft, "tpot_ms": tpot,
                "ttft_p99_ms": st["ttft_ms"]["p99"], "tpot_p99_ms": st["tpot_ms"]["p99"],
                "tokens_per_s_per_user": 1e3 / tpot if tpot else None, "slo_attainment": st["slo_attainment"],
                "requests_completed": s["requests_completed"], "num_prompts": prompts,
                "max_concurrency": conc, "mean_concurrency": s["mean_concurrency"],
                "replicas": replicas,  # served as one of this many identical replicas (the figures above: one's)
                "conservation": s["conservation"], "reason": None,
                # step points this check simulated itself (the others it was handed or found in its process)
                "step_points_simulated": sum(map(len, known_steps(loaded, cc).values())) - before,
                "_steps": known_steps(loaded, cc)}
    except NpusimError as exc:
        return {"_task": task.index, "served": False, "reason": str(exc)}
    except Exception as exc:  # a bug: recorded, the search goes on
        return {"_task": task.index, "served": False, "reason": f"{type(exc).__name__}: {exc}"}


def _step_key(phase: str, plan: dict, batch) -> str:
    import json

    return json.dumps([phase, plan, batch], sort_keys=True, default=str)


def step_index(records: list[dict]) -> dict[str, dict]:
    """Step records by (phase, plan, batch), those of a worker that died left out (never simulated)."""
    return {_step_key(r["phase"], r["plan"], r["batch"]): r for r in records
            if r.get("phase") in ("prefill", "decode") and not str(r.get("reason") or "").startswith("the worker running this plan died")}


def resumed_ladder(task: Ladder, have: dict[str, dict]) -> list[dict] | None:
    """What :func:`run_ladder` would return for ``task``, from earlier records: each point's record in order
    up to the first infeasible one; None when a point it would run has no record."""
    out = []
    for pt in task.points:
        rec = have.get(_step_key(pt.phase, pt.plan, pt.batch))
        if rec is None:
            return None
        out.append(rec)
        if not rec["feasible"]:
            break
    return out


def serve_key(task: ServeTask) -> str:
    """What a serving check's result is a deterministic function of: its deployment, prompts, concurrency,
    lengths and seed (not its place in the list, nor the step points it was handed: those only save it time)."""
    import json

    return json.dumps([task.deployment, task.num_prompts, task.concurrency, task.input_len, task.output_len,
                       task.seed], sort_keys=True, default=str)


def served_record(task: ServeTask, result: dict) -> dict:
    """A serving check's result as a ``steps.jsonl`` line (``phase: serve``), its step points as lists."""
    rec = {k: v for k, v in result.items() if k not in ("_task", "_steps")}
    steps = [[list(k), [[list(xy), ms] for xy, ms in v.items()]] for k, v in (result.get("_steps") or {}).items()]
    return {"phase": "serve", "serve_key": serve_key(task), "result": rec, "steps": steps}


def served_index(records: list[dict]) -> dict[str, dict]:
    """The serving checks an interrupted search logged (:func:`served_record`), by :func:`serve_key`: each
    its result again with its step points (``_steps``, handed on to later rounds' checks)."""
    out = {}
    for r in records:
        if r.get("phase") == "serve" and r.get("serve_key") and isinstance(r.get("result"), dict):
            steps = {tuple(k): {tuple(xy): ms for xy, ms in pts} for k, pts in r.get("steps") or []}
            out[r["serve_key"]] = {**r["result"], "_steps": steps}
    return out


def read_step_records(path) -> list[dict]:
    """The records of a ``steps.jsonl`` (``plan --serving --out DIR``), one JSON object a line; a last line
    cut short by an interruption is left out."""
    import json
    from pathlib import Path

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"--resume-steps {path}: no such file (a search's --out DIR/steps.jsonl)")
    out = []
    lines = p.read_text().splitlines()
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except ValueError:
            if i == len(lines) - 1:
                break
            raise ConfigError(f"--resume-steps {path}: line {i + 1} is not a step record") from None
    return out


def steady_throughput(records, concurrency: int) -> float | None:
    """Output tokens/s while the closed loop is full: tokens made between the first refill (the send of
    request ``concurrency``) and the last send, over that window (None when there is no such window)."""
    recs = sorted(records, key=lambda r: r.id)
    if len(recs) <= concurrency:
        return None
    t0, t1 = recs[concurrency].arrival_s, recs[-1].arrival_s
    if t1 <= t0:
        return None
    made = sum(1 for r in recs for t in r.token_times_s if t0 < t <= t1)
    return made / (t1 - t0)


def _serve_died(task: ServeTask, exc: BaseException) -> dict:
    return {"_task": task.index, "served": False, "reason": f"the worker serving this candidate died ({type(exc).__name__}: {exc})"}


def _pareto(points: list[dict]) -> list[dict]:
    """Points not beaten on both tokens/s per NPU and tokens/s per user, by tokens/s per user."""
    return front(points, lambda p: (-p["tokens_per_s_per_user"], -p["output_throughput_per_npu"]),
                 lambda p: p["output_throughput_per_npu"])


def _label(c: dict, prefill_count: bool = True) -> str:
    """A candidate's pools, instances, plans and batch limits (``prefill_count=False``: the prefill pool's
    instance count left out, the key of :func:`backoff_candidate`'s rate-matched fallback)."""
    from npusim.system.search import plan_label

    return " + ".join(f"{p['instances'] if prefill_count or p['role'] != 'prefill' else 'n'}x {p['role']} "
                      f"[{plan_label(p['plan'])} mtp{p['plan']['mtp']} "
                      f"b{p['max_batch_per_npu'] * p['plan']['npus'] if p['role'] != 'prefill' else '-'}]"
                      for p in c["deployment"]["pools"])


def backoff_candidate(c: dict, cands: list[dict], done: set) -> dict | None:
    """The candidate a served one that missed an objective is served as next: the same deployment at half
    its decode batch limit (:func:`_scaled`), with its own estimate. A disaggregated deployment at half the
    batch is rate-matched to fewer prefill instances, so when the same prefill count has no candidate, the
    same pools at any prefill count: the estimate-feasible one with the most estimated tokens/s per NPU
    (the cheapest to serve among equals), else the best estimate. None when there is none not yet served
    (``done``: :func:`deployment_key` s)."""
    half = _scaled(c, 2)
    if half is None:
        return None
    fresh = [d for d in cands if deployment_key(d["deployment"]) not in done]
    exact = [d for d in fresh if _label(d) == _label(half)]
    if exact:
        return exact[0]
    if c["mode"] != "disaggregated":
        return None
    same = [d for d in fresh if _label(d, prefill_count=False) == _label(half, prefill_count=False)]
    rank = lambda d: (not d.get("estimate_feasible", True), -d["estimate"]["output_throughput_per_npu"], _size(d))  # noqa: E731
    return min(same, key=rank) if same else None


def more_prefill(c: dict, npus: int, output_len: int, done: set) -> dict | None:
    """A disaggregated candidate whose served TPOT met its objective but whose TTFT missed: its prompts
    queued for the prefill pool (the rate match's estimate misses the closed loop's waves near
    saturation), so the same deployment with one more prefill instance, its own estimate
    (:func:`split_estimate`), when the budget holds it and it was not served (``done``); else None."""
    import copy

    if c["mode"] != "disaggregated" or "split" not in c:
        return None
    d = copy.deepcopy(c)
    pre, dec = (next(p for p in d["deployment"]["pools"] if p["role"] == role) for role in ("prefill", "decode"))
    pre["instances"] += 1
    n_p, prompts, ttft, n_d, b, tpot = c["split"]
    if pre["instances"] * n_p + dec["instances"] * n_d > npus or deployment_key(d["deployment"]) in done:
        return None
    d["estimate"] = split_estimate(n_p, prompts, ttft, n_d, b, tpot, output_len, pre["instances"], dec["instances"])
    return d


def deployment_key(dep: dict) -> tuple:
    """A deployment up to what does not change what it serves (two candidates with the same key are
    served once: see :func:`distinct`). Two rewritings, each of one deployment reached by two routes:

    * **independent DP groups**: a pool whose plan has no expert parallelism and no pipeline (``ep``
      and ``pp`` 1) is its DP groups side by side, each with the whole model and nothing exchanged
      between groups, so ``x`` instances of ``dp`` groups are ``x dp`` groups however they are cut into
      instances (two prefill instances of tp1 dp4 and one of tp1 dp8: the same groups, the same
      prompts per NPU a batch); the pool is keyed by its total groups and NPUs.
    * **replicas**: a deployment whose pools' group counts share a factor ``g`` is ``g`` copies of the
      deployment with ``1 / g`` of each, at ``1 / g`` of the slots, which share only the queue (see the
      aggregated replicas in :func:`serve_candidate`); keyed by the smallest copy.

    Not exact to the last digit: where an instance's batch is cut differs (one dp8 prefill instance
    takes up to 8 queued prompts in a step, two dp4 ones 4 each, each on its own clock). Served side by
    side (session 43, Qwen3-30B-A3B on 8 CloudMatrix384 NPUs, 2,048 / 256 tokens): 1,565.9 against
    1,565.5 tokens/s per NPU and TTFT 139 / 140 ms at b256, identical at b512; 2P1D against 4P2D
    identical (1,810.8)."""
    pools = []
    for p in dep["pools"]:
        plan = dict(p["plan"])
        groups = p["instances"]
        if plan.get("ep", 1) == 1 and plan.get("pp", 1) == 1:  # the pool as its groups (NPUs a group: a fraction)
            groups *= plan["dp"]
            plan["npus"] = str(Fraction(plan["npus"], plan["dp"]))
            plan["dp"] = 1
        pools.append((p["role"], groups, tuple(sorted((k, str(v)) for k, v in plan.items())),
                      p["max_batch_per_npu"] if p["role"] != "prefill" else None, p["tokens_per_npu"],
                      p.get("chunk_tokens", 0)))
    g = math.gcd(*(q[1] for q in pools))
    rest = tuple(sorted((k, str(v)) for k, v in dep.items() if k != "pools"))
    return rest, tuple(sorted((r, n // g, *more) for r, n, *more in pools))


def distinct(ranked: list[dict], k: int) -> list[dict]:
    """The first ``k`` candidates of ``ranked`` whose deployments differ (:func:`deployment_key`); of
    equivalent ones the first ranked, so the places freed go to the next distinct candidates."""
    out, seen = [], set()
    for c in ranked:
        key = deployment_key(c["deployment"])
        if key not in seen:
            seen.add(key)
            out.append(c)
            if len(out) == k:
                break
    return out


def _size(c: dict) -> tuple[int, int]:
    """What serving a candidate costs, to serve the cheapest of equivalent ones: its largest instance's
    NPUs (an aggregated deployment is served as one of its replicas), then its instances."""
    pools = c["deployment"]["pools"]
    return max(p["plan"]["npus"] for p in pools), sum(p["instances"] for p in pools)


def search_serving(system: str, nodes: int | None, model, npus: int, input_len: int, output_len: int,
                   slo_ttft_ms: float | None, slo_tpot_ms: float | None, precision: str = "bf16",
                   kv_dtype: str = "bf16", max_pp: int = 1, routing: str = "uniform", seed: int = 0,
                   serve_top: int = 2, max_concurrency: int | None = None, workers: int = 1, client=None,
                   kv_fabric: str | None = None, progress=None, runtime: str | None = None,
                   plans_per_size: int | None = None, step_log=None, resume: list[dict] | None = None) -> dict:
    """Search serving deployments (see the module docstring): ``best``, ``best_per_objective``,
    ``candidates``, ``pareto``, ``evaluated`` (served candidates), ``step_points`` (simulated steps).
    ``runtime``: every step's runtime mode, eager / graph (None: the system's default per phase), in
    the step search, in the served candidates and in each candidate's deployment (``runtime:``).
    ``step_log(records)``: called with each ladder's step records as it finishes, and with each serving
    check's :func:`served_record` (a long search's work kept as it comes, e.g. ``plan --serving --out DIR``'s
    ``steps.jsonl``). ``resume``: the records of an interrupted run of the same search
    (:func:`read_step_records`); a ladder whose every step is among them is taken from them (and logged
    again), not simulated (:func:`resumed_ladder`), and a serving check among them is taken from them
    (:func:`served_index`). ``progress(done, total)`` counts ladders and serving checks."""
    from npusim.pool import run_points as _run_points

    have = step_index(resume or [])
    have_served = served_index(resume or [])
    resumed = [0]

    def run_points(fn, items, finished, failed, workers, client):
        """The pool's run_points, with the ladders an interrupted run finished taken from its records."""
        if fn is run_ladder and have:
            todo = []
            for t in items:
                recs = resumed_ladder(t, have)
                if recs is None:
                    todo.append(t)
                else:
                    resumed[0] += len(recs)
                    finished(recs)
            items = todo
        _run_points(fn, items, finished, failed, workers, client)

    loaded, _ = _system(system, nodes)
    cfg = get_config(model)
    s = loaded.system
    if npus > s.num_npus:
        raise ConfigError(f"--npus {npus}: {s.name} has {s.num_npus} NPUs (a larger --nodes)")
    dies = s.npu.dies
    kv_ctx = input_len + output_len // 2
    skewed = routing != "uniform"
    plans, rejected = [], []
    for n in _divisors(npus):
        got, bad = candidate_plans(cfg, n, dies, s.num_npus, precision, kv_dtype, max_pp, all_ep=True,
                                   microbatches=(1, 2) if max_pp == 1 else None, mtp=(0, 1), redundant=skewed)
        plans += got
        rejected += bad
    held, skipped, skipped_prefill = [], [], set()
    if plans_per_size is not None:  # the full-scale search: a coarse set first (see prune_plans)
        from npusim.arch import summarize as chip_summary

        chip = chip_summary(loaded.chip)
        plans, held, skipped = prune_plans(plans, cfg, kv_ctx, chip.hbm_gb, chip.hbm_bandwidth_gbps, slo_tpot_ms,
                                           plans_per_size)
    mdict = cfg.to_dict()
    pre, shapes = [], set()
    point = lambda p, b: PlanPoint(system, nodes, mdict, p.to_dict(), "decode", b, 1, kv_ctx, slo_tpot_ms,  # noqa: E731
                                   routing, seed, runtime)

    def ladder(p):
        return Ladder(tuple(point(p, b) for b in decode_ladder(p, full_scale=plans_per_size is not None)))
    ladders = [ladder(p) for p in plans]
    for p in plans:  # a prompt's step: MTP and micro-batch overlap are decode choices
        q = p.with_changes(mtp=0, microbatches=1)
        if plans_per_size is not None and p.npus * FULL_SCALE_PREFILL_SHARE > npus:
            skipped_prefill.add(p.npus)
            continue
        if str(q.to_dict()) not in shapes:
            shapes.add(str(q.to_dict()))
            pre.append(Ladder((PlanPoint(system, nodes, mdict, q.to_dict(), "prefill", q.dp, input_len, input_len,
                                         slo_ttft_ms, routing, seed, runtime),)))
    decode_recs: list[list[dict]] = []
    prefill_recs: list[list[dict]] = []
    total = len(ladders) + len(pre)
    done = [0]
    clock = time.perf_counter()

    def tick(store):
        def f(recs):
            store.append(recs)
            if step_log is not None:
                step_log(recs)
            done[0] += 1
            if progress:
                progress(done[0], total)
        return f
    into = {"prefill": tick(prefill_recs), "decode": tick(decode_recs)}
    tasks = pre + ladders
    if plans_per_size is not None:  # full scale: prompt steps small instances first, decode ladders large
        # first, taken in turn, so an interrupted search's steps.jsonl holds both ends of each
        size = lambda t: t.points[0].plan["npus"]  # noqa: E731
        a, b = sorted(pre, key=size), sorted(ladders, key=lambda t: -size(t))
        tasks = [t for pair in zip(a, b) for t in pair] + a[len(b):] + b[len(a):]
    run_points(run_ladder, tasks, lambda recs: into[recs[0]["phase"]](recs), _ladder_died, workers, client)
    if held:  # refine: the held-back micro-batch and MTP choices of each instance size's best coarse shape
        top_of: dict[int, tuple] = {}
        for rs in decode_recs:
            for r in rs:
                n = r["plan"]["npus"]
                if r["feasible"] and r["tokens_per_s_per_npu"] > top_of.get(n, (0.0, None))[0]:
                    top_of[n] = (r["tokens_per_s_per_npu"], r["plan"])
        shape = lambda d: (d["npus"], d["tp"], d["ep"], d["pp"], d["redundant_experts"], d["eplb"])  # noqa: E731
        want = {shape(pl) for _, pl in sorted(top_of.values(), key=lambda t: -t[0])[:FULL_SCALE_REFINE]}
        more = [p for p in held if shape(p.to_dict()) in want]
        for p in held:
            if shape(p.to_dict()) not in want:
                skipped.append({"plan": p.to_dict(), "batch": None, "feasible": False, "simulated": False,
                                "reason": "skipped before simulating: a micro-batch or MTP variant of a shape that "
                                          f"was not among the {FULL_SCALE_REFINE} best in the coarse ladders"})
        total += len(more)
        run_points(run_ladder, [ladder(p) for p in more], tick(decode_recs), _ladder_died, workers, client)
        plans = plans + more
    # between the powers of two: the 1.5x point above each of the best plans' last feasible batch (the three
    # best plans of each instance size by tokens/s per NPU; the others are far behind at the powers of two)
    best_of: dict[int, list] = {}
    for rs in decode_recs:
        ok = [r for r in rs if r["feasible"]]
        if ok and len(ok) < len(rs):  # it failed at 2x its last feasible batch
            best_of.setdefault(ok[-1]["plan"]["npus"], []).append(ok[-1])
    refine = []
    if plans_per_size is not None:  # full scale: the FULL_SCALE_REFINE best plans overall
        best_of = {0: sorted((r for rs in best_of.values() for r in rs),
                             key=lambda r: -r["tokens_per_s_per_npu"])[:FULL_SCALE_REFINE]}
    for recs in best_of.values():
        for r in sorted(recs, key=lambda r: -r["tokens_per_s_per_npu"])[:3]:
            b = r["batch"] * 3 // 2
            if b > r["batch"]:
                refine.append(Ladder((point(_plan(r["plan"]), b),)))
    total += len(refine)
    run_points(run_ladder, refine, tick(decode_recs), _ladder_died, workers, client)
    steps_s = time.perf_counter() - clock
    step_points = sum(r.get("simulated", False) for rs in decode_recs + prefill_recs for r in rs)
    key = lambda d: tuple(sorted((k, str(v)) for k, v in d.items()))  # noqa: E731
    prefill = {}  # plan key -> (ttft ms, prompts per step, npus, plan)
    for rs in prefill_recs:
        r = rs[0]
        if r.get("ttft_ms") is not None and r.get("simulated"):
            prefill[key(r["plan"])] = (r["ttft_ms"], r["batch"], r["plan"]["npus"], r["plan"])
    decode = []  # (plan, batch, tpot ms)
    for rs in decode_recs:
        for r in rs:
            if r["feasible"]:
                decode.append((r["plan"], r["batch"], r["tpot_ms"], r["tokens_per_s_per_npu"]))
    O = output_len
    cands = []
    base = {"model": model if isinstance(model, str) else cfg.name, "system": s.name, "nodes": nodes,
            "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "runtime": runtime}
    # aggregated: n divides N, all N NPUs in N / n replicas
    for plan, b, tpot, _ in decode:
        pk = key({**plan, "mtp": 0, "microbatches": 1})
        if pk not in prefill:
            continue
        ttft, prompts, n, _ = prefill[pk]
        if npus % n or b % n:  # a deployment limits sequences per NPU: a batch it can state
            continue
        if max_concurrency is not None and b * (npus // n) > max_concurrency:  # more slots than users
            continue
        t_p = ttft / prompts  # ms of prefill per prompt on the instance
        cycle = O * tpot + b * t_p
        tput = b * O / cycle * 1e3 * (npus // n) / npus
        est = {"ttft_ms": ttft, "tpot_ms": cycle / O, "output_throughput_per_npu": tput,
               "tokens_per_s_per_user": 1e3 * O / cycle}
        dep = {**base, "mode": "aggregated", "kv_transfer": None,
               "pools": [{"role": "aggregated", "instances": npus // n, "plan": plan,
                          "max_batch_per_npu": b // n,
                          "tokens_per_npu": max(128, _ceil_to(plan["dp"] * input_len + b, n) // n),
                          "chunk_tokens": 0}]}
        cands.append({"mode": "aggregated", "deployment": dep, "estimate": est, "slots": b * (npus // n)})
    # disaggregated: x prefill instances and y decode instances sized by rate matching (see :func:`rate_matched`)
    best_p: dict[int, list] = {}
    for ttft, prompts, n, pplan in prefill.values():
        if slo_ttft_ms is None or ttft <= slo_ttft_ms:
            best_p.setdefault(n, []).append((prompts / ttft, ttft, prompts, pplan))
    best_p = {n: sorted(v, key=lambda t: -t[0])[:PREFILL_PLANS_PER_SIZE] for n, v in best_p.items()}
    fabric = kv_fabric or _kv_fabric(loaded)
    for plan, b, tpot, _ in decode:
        nd = plan["npus"]
        if b % nd:
            continue
        for n_p, options in best_p.items():
            for _, ttft, prompts, pplan in options:
                for x, y, est in rate_matched(npus, n_p, prompts, ttft, nd, b, tpot, O, slo_ttft_ms):
                    if max_concurrency is not None and b * y > max_concurrency:
                        continue
                    dep = {**base, "mode": "disaggregated", "kv_transfer": {"fabric": fabric, "via": "sdma"},
                           "pools": [{"role": "prefill", "instances": x, "plan": pplan, "max_batch_per_npu": 64,
                                      # a batch holds the step estimate's prompts: one per DP group
                                      "tokens_per_npu": max(128, _ceil_to(prompts * input_len, n_p) // n_p),
                                      "chunk_tokens": 0},
                                     {"role": "decode", "instances": y, "plan": plan,
                                      "max_batch_per_npu": b // nd, "tokens_per_npu": 16384, "chunk_tokens": 0}]}
                    cands.append({"mode": "disaggregated", "deployment": dep, "estimate": est, "slots": b * y,
                                  "split": (n_p, prompts, ttft, nd, b, tpot)})  # split_estimate's arguments
    ok = lambda c: ((slo_ttft_ms is None or c["estimate"]["ttft_ms"] <= slo_ttft_ms)  # noqa: E731
                    and (slo_tpot_ms is None or c["estimate"]["tpot_ms"] <= slo_tpot_ms))
    for c in cands:
        c["estimate_feasible"] = ok(c)
    chosen = []
    for mode in ("aggregated", "disaggregated"):
        # equivalent deployments (deployment_key) served once: the cheapest to serve among equal estimates
        ranked = sorted((c for c in cands if c["mode"] == mode and c["estimate_feasible"]),
                        key=lambda c: (-c["estimate"]["output_throughput_per_npu"], _size(c)))
        mine = distinct(ranked, serve_top)
        if mine:  # the best again at a quarter of its batch limit: further along the per-user axis
            low = _scaled(mine[0], 4)
            match = [c for c in cands if low is not None and _label(c) == _label(low)]  # with its own estimate
            keys = {deployment_key(c["deployment"]) for c in mine}
            if match and deployment_key(match[0]["deployment"]) not in keys:
                mine.append(match[0])
        chosen += [c for c in mine if c not in chosen]
    meets = lambda r: ((slo_ttft_ms is None or r["ttft_ms"] <= slo_ttft_ms)  # noqa: E731
                       and (slo_tpot_ms is None or r["tpot_ms"] <= slo_tpot_ms))
    clock = time.perf_counter()
    out_cands: list[tuple[dict, dict, int]] = []
    batch = chosen
    known: dict = {}  # step points the checks so far simulated, handed to the next round's (see ServeTask)
    resumed_checks = [0]
    for rnd in range(BACKOFF_ROUNDS + 1):
        tasks = []
        for c in batch:
            conc = c["slots"]  # the concurrency its batch limit implies (at most max_concurrency: see cands)
            tasks.append(ServeTask(c["deployment"], 3 * conc, conc, input_len, output_len, seed, len(tasks),
                                   steps_tuple(known)))
        served: list[dict] = []
        total += len(tasks)
        if progress:
            progress(done[0], total)

        def checked(r: dict) -> None:
            served.append(r)
            if step_log is not None and not str(r.get("reason") or "").startswith("the worker serving"):
                step_log([served_record(tasks[r["_task"]], r)])
            done[0] += 1
            if progress:
                progress(done[0], total)
        todo = []
        for t in tasks:  # a check an interrupted run of the same search finished: its logged result
            r = have_served.get(serve_key(t))
            if r is None:
                todo.append(t)
            else:
                resumed_checks[0] += 1
                served.append({**r, "_task": t.index})
                if step_log is not None:  # logged again: this run's log holds every check it answered
                    step_log([served_record(t, r)])
                done[0] += 1
        run_points(serve_candidate, todo, checked, _serve_died, workers, client)
        for r in served:
            merge_steps(known, r.pop("_steps", None))
        results = list(zip(batch, _in_order(served, tasks)))
        out_cands += [(c, r, rnd) for c, r in results]
        # a served candidate that misses an objective is served again at half its decode batch limit
        # (with that candidate's own estimate), so a looser search reaches what a tighter one serves
        served_keys = {deployment_key(c["deployment"]) for c, _, _ in out_cands}
        batch = []
        for c, r in results:
            nxt = None
            if r.get("served") and not meets(r):
                ttft_only = slo_tpot_ms is None or r["tpot_ms"] <= slo_tpot_ms
                more = more_prefill(c, npus, output_len, served_keys) if ttft_only else None
                if more is not None:
                    more["estimate_feasible"] = ok(more)
                    cands.append(more)
                nxt = more or backoff_candidate(c, cands, served_keys)
            if nxt is not None:
                batch.append(nxt)
                served_keys.add(deployment_key(nxt["deployment"]))
        if not batch:
            break
    chosen = [c for c, _, _ in out_cands]
    evaluated = []
    for c, r, rnd in out_cands:
        rec = {"mode": c["mode"], "deployment": c["deployment"], "label": _label(c), "estimate": c["estimate"],
               "serve_round": rnd}
        rec.update({k: v for k, v in r.items() if k != "_task"})
        if r.get("served"):
            fe = meets(r)
            rec["feasible"] = fe
            if not fe:
                why = []
                if slo_ttft_ms is not None and r["ttft_ms"] > slo_ttft_ms:
                    why.append(f"TTFT {r['ttft_ms']:.1f} ms > {slo_ttft_ms:g} ms")
                if slo_tpot_ms is not None and r["tpot_ms"] > slo_tpot_ms:
                    why.append(f"TPOT {r['tpot_ms']:.2f} ms > {slo_tpot_ms:g} ms")
                rec["reason"] = "served: " + ", ".join(why)
            rec["estimate_error"] = {k: (c["estimate"][k] - r[k]) / r[k] if r.get(k) else None
                                     for k in ("ttft_ms", "tpot_ms", "output_throughput_per_npu")}
        else:
            rec["feasible"] = False
        evaluated.append(rec)
    unserved = []
    for c in cands:
        if any(c is cc for cc in chosen):
            continue
        unserved.append({"mode": c["mode"], "label": _label(c), "estimate": c["estimate"], "feasible": False,
                         "served": False, "reason": "estimate: misses an objective" if not c["estimate_feasible"]
                         else "not served: below the served candidates by estimated tokens/s per NPU"})
    feasible = [r for r in evaluated if r["feasible"]]
    best = max(feasible, key=lambda r: r["output_throughput_per_npu"]) if feasible else None
    fastest = max(feasible, key=lambda r: r["tokens_per_s_per_user"]) if feasible else None
    if best is not None:
        best = {**best, "ttft_ms": best["ttft_ms"], "tpot_ms": best["tpot_ms"]}
    return {"system": s.name, "model": cfg.name, "npus": npus, "input_len": input_len, "output_len": output_len,
            "runtime": runtime,
            "objective": {"slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms,
                          "metric": "output_throughput_per_npu"},
            "best": best, "best_per_objective": {"output_throughput_per_npu": best, "tokens_per_s_per_user": fastest},
            "pareto": _pareto(feasible), "evaluated": len(evaluated),
            "candidates": evaluated + unserved + [{"mode": None, "feasible": False, "served": False,
                                                   "reason": r["reason"], "plan": r["plan"]} for r in rejected + skipped],
            "step_points": step_points, "plans": len(plans), "rejected_plans": len(rejected),
            "skipped_plans": len(skipped), "skipped": _skip_counts(skipped), "plans_per_size": plans_per_size,
            "prefill_sizes_skipped": sorted(skipped_prefill),
            "decode_points": sum(len(rs) for rs in decode_recs), "prefill_points": len(prefill_recs),
            "resumed_points": resumed[0], "resumed_checks": resumed_checks[0],
            "deployments_estimated": len(cands),
            "wall_s": {"steps": steps_s, "serving": time.perf_counter() - clock}}


def roofline_rank(cfg, plan, kv_ctx: int, hbm_gib: float, hbm_gbps: float, slo_tpot_ms: float | None) -> tuple:
    """A plan's cheap decode figure, no step simulated (the cap's ranking, see :func:`prune_plans`):
    ``(tokens/s per NPU, batch)`` at the largest ladder batch whose weights and KV fit a die's HBM and
    whose roofline TPOT meets the objective, the step taken as reading the busiest die's weights and KV
    once at the HBM bandwidth (``hbm_gbps``, GB/s) -- compute, communication and fixed costs left out,
    so it ranks plans, it is not a bound on what they serve. ``(None, reason)`` when no batch passes."""
    from npusim.system.mapper import StepShape, memory_per_rank_gb

    tokens = 1 + plan.mtp * plan.mtp_acceptance
    best, why = None, "memory: the weights and the lowest batch's KV do not fit a die's HBM"
    for b in decode_ladder(plan):
        weights, kv = memory_per_rank_gb(cfg, plan, StepShape("decode", b, 1, kv_ctx))
        if weights + kv > hbm_gib:
            break
        step_ms = (weights + kv) * 2**30 / (hbm_gbps * 1e9) * 1e3
        if slo_tpot_ms is not None and step_ms / tokens > slo_tpot_ms:
            why = f"roofline: TPOT {step_ms / tokens:.1f} ms > {slo_tpot_ms:g} ms reading the weights alone"
            break
        best = (b * tokens / (step_ms / 1e3) / plan.npus, b)
    return best if best is not None else (None, why)


def prune_plans(plans: list, cfg, kv_ctx: int, hbm_gib: float, hbm_gbps: float, slo_tpot_ms: float | None,
                per_size: int) -> tuple[list, list, list[dict]]:
    """The coarse set of a full-scale search, before any step is simulated: plans that cannot hold the
    model and their lowest batch's KV in HBM, or whose roofline TPOT misses the objective, are skipped;
    of the rest, for each instance size, the ``per_size`` best (tp, ep, redundant slots) shapes by
    :func:`roofline_rank`, each at one micro-batch and the most MTP tokens. Returns (the coarse plans,
    the held-back variants -- the other micro-batch and MTP choices of the coarse shapes, ladder-run for
    each size's best shape after the coarse ladders --, the skipped plans, each with its ``reason``)."""
    ranked: dict[int, list] = {}
    skipped = []
    for p in plans:
        fig, b_or_why = roofline_rank(cfg, p, kv_ctx, hbm_gib, hbm_gbps, slo_tpot_ms)
        if fig is None:
            skipped.append({"plan": p.to_dict(), "batch": None, "feasible": False, "simulated": False,
                            "reason": f"skipped before simulating: {b_or_why}"})
            continue
        ranked.setdefault(p.npus, []).append((fig, p))
    coarse, held = [], []
    for n, got in ranked.items():
        shape = lambda p: (p.tp, p.ep, p.pp, p.redundant_experts, p.eplb)  # noqa: E731
        best: dict[tuple, float] = {}
        for fig, p in got:
            best[shape(p)] = max(best.get(shape(p), 0.0), fig)
        order = sorted(best, key=lambda k: -best[k])
        keep = order[:per_size]
        fewest_mb, most_mtp = min(q.microbatches for _, q in got), max(q.mtp for _, q in got)
        for fig, p in got:
            k = shape(p)
            if k not in keep:
                skipped.append({"plan": p.to_dict(), "batch": None, "feasible": False, "simulated": False,
                                "reason": f"skipped before simulating: roofline rank {order.index(k) + 1} "
                                          f"of {len(best)} shapes of {n} NPUs ({fig:,.0f} tokens/s per NPU), beyond "
                                          f"--plans-per-size {per_size}"})
            elif p.microbatches == fewest_mb and p.mtp == most_mtp:
                coarse.append(p)
            else:
                held.append(p)
    return coarse, held, skipped


def prefill_utilisation_cap(ttft_ms: float, slo_ttft_ms: float | None) -> float:
    """The highest utilisation of a prefill instance at which its mean TTFT stays within the objective,
    by M/D/1: a batch (one prompt per DP group) takes the deterministic step time ``T`` (``ttft_ms``), the
    prompts arrive as a Poisson stream, so the mean TTFT at utilisation ``rho`` (arrival rate over the
    instance's prompts per ``T``) is ``T (1 + rho / (2 (1 - rho)))``. Within ``S`` (``slo_ttft_ms``):
    ``rho <= 2 k / (1 + 2 k)``, ``k = S / T - 1``. 0 when ``T > S``; 1 with no objective. Why M/D/1: the
    step time is a simulated, deterministic step; thousands of closed-loop users' requests come close
    to Poisson; it is one formula a user can check (a utilisation cap would be a constant to pick)."""
    if slo_ttft_ms is None:
        return 1.0
    k = slo_ttft_ms / ttft_ms - 1
    return 0.0 if k <= 0 else 2 * k / (1 + 2 * k)


def prefill_ttft(ttft_ms: float, rho: float) -> float:
    """Mean TTFT (ms) of a prefill instance at utilisation ``rho`` < 1 (M/D/1, see
    :func:`prefill_utilisation_cap`)."""
    return ttft_ms * (1 + rho / (2 * (1 - rho)))


def closed_loop_prefill(ttft_ms: float, demand_ms: float, think_ms: float, customers: int) -> tuple[float, float]:
    """Mean TTFT (ms) and requests/ms of a closed loop of ``customers`` requests that alternate between a
    prefill pool and decode (the serving check's loop, and a benchmark client's at a fixed concurrency).

    Model (approximate mean value analysis, stated): decode is a delay of ``think_ms`` (``O x tpot``: every
    customer holds a decode slot, the slots being the customers); the prefill pool serves a request in
    ``ttft_ms`` (its batch's step) and completes one every ``demand_ms`` at full load (``ttft_ms`` over the
    pool's parallel prompts, ``x dp``). By the arrival theorem, with Schweitzer's estimate of the queue a
    request finds (``(n - 1) / n`` of the loop's mean queue), it waits for the requests queued beyond those
    in service, ``demand_ms`` each, plus, with the probability the pool is full, half a ``demand_ms``
    (deterministic service: departures evenly spaced): ``R = T + a X D^2 / (2 (1 - a X D))``, ``a = (n-1)/n``;
    the loop's throughput ``X = n / (R + Z)`` (Little's law), solved for ``X`` by bisection; when that
    would need more than the pool's rate ``1 / D``, ``X = 1 / D`` and ``R = n D - Z`` (Little's law). In the open
    limit (``n`` large) it is M/D/1 at the pool's rate; a closed loop never queues more than its customers,
    so near the rate match it does not diverge as M/D/1 does (Llama-3-70B 1P1D tp4 at 32 sequences on 8
    Atlas 800I A2 cards: M/D/1 58 s, served 368 ms); with the pool saturated it tends to Little's law,
    ``n / X - Z`` at ``X = 1 / D``."""
    n, T, D, Z = customers, ttft_ms, demand_ms, think_ms
    a = (n - 1) / n

    def resp(x: float) -> float:
        return T + a * x * D * D / (2 * (1 - a * x * D))

    if n / (resp(1 / D) + Z) >= 1 / D:  # the pool saturated: it completes one every D, the rest queue
        return max(T, n * D - Z), 1 / D
    lo, hi = 0.0, min(n / (T + Z), 1 / D)
    for _ in range(100):  # n / (resp(x) + Z) - x falls with x: one root in (lo, hi)
        mid = (lo + hi) / 2
        if n / (resp(mid) + Z) > mid:
            lo = mid
        else:
            hi = mid
    return resp(lo), lo


def rate_matched(npus: int, n_p: int, prompts: int, ttft_ms: float, n_d: int, batch: int, tpot_ms: float,
                 output_len: int, slo_ttft_ms: float | None) -> list[tuple[int, int, dict]]:
    """The xPyD splits of ``npus`` near the rate match, each ``(x, y, estimate)``: a prefill instance of
    ``n_p`` NPUs serves ``prompts`` requests per ``ttft_ms`` (one per DP group); a decode instance of
    ``n_d`` NPUs at ``batch`` sequences serves ``batch / (output_len x tpot_ms)`` requests/ms. For each
    ``y`` that fits, ``x`` is the floor and the ceiling of ``y x decode rate / (cap x prefill rate)``, the
    cap from :func:`prefill_utilisation_cap` (a queueing margin, so the prefill pool's TTFT stays within
    its objective at that load). The estimate is the closed loop the check serves, at its ``y x batch``
    slots (:func:`closed_loop_prefill`): TTFT and requests/s ``X`` (at most the prefill pool's and the
    decode pool's rates), TPOT the decode step's."""
    rho = prefill_utilisation_cap(ttft_ms, slo_ttft_ms)
    mu_p, mu_d = prompts / ttft_ms, batch / (output_len * tpot_ms)  # requests per ms per instance
    out = []
    for y in range(1, (npus - n_p) // n_d + 1):
        need = y * mu_d / (rho * mu_p) if rho > 0 else float("inf")
        if need == float("inf"):
            continue
        for x in sorted({max(1, math.floor(need)), max(1, math.ceil(need))}):
            used = x * n_p + y * n_d
            if used > npus:
                continue
            out.append((x, y, split_estimate(n_p, prompts, ttft_ms, n_d, batch, tpot_ms, output_len, x, y)))
    return out


def split_estimate(n_p: int, prompts: int, ttft_ms: float, n_d: int, batch: int, tpot_ms: float, output_len: int,
                   x: int, y: int) -> dict:
    """The closed-loop estimate of ``x`` prefill and ``y`` decode instances (see :func:`rate_matched`)."""
    mu_p, mu_d = prompts / ttft_ms, batch / (output_len * tpot_ms)  # requests per ms per instance
    ttft, X = closed_loop_prefill(ttft_ms, 1 / (x * mu_p), output_len * tpot_ms, y * batch)
    return {"ttft_ms": ttft, "tpot_ms": tpot_ms, "output_throughput_per_npu": X * output_len * 1e3 / (x * n_p + y * n_d),
            "tokens_per_s_per_user": 1e3 / tpot_ms, "prefill_utilisation": X / (x * mu_p),
            "decode_utilisation": X / (y * mu_d)}


def _skip_counts(skipped: list[dict]) -> dict:
    """Skipped plans counted by why: memory, roofline TPOT, beyond the cap, a variant not refined."""
    out: dict[str, int] = {}
    for r in skipped:
        why = r["reason"].removeprefix("skipped before simulating: ")
        k = ("memory" if why.startswith("memory") else "roofline TPOT" if why.startswith("roofline:")
             else "beyond --plans-per-size" if why.startswith("roofline rank") else "variant not refined")
        out[k] = out.get(k, 0) + 1
    return out


def _in_order(served: list[dict], tasks: list[ServeTask]) -> list[dict]:
    by = {r.get("_task"): r for r in served}
    return [by.get(i, {"served": False, "reason": "no result"}) for i in range(len(tasks))]


def _scaled(c: dict, divisor: int) -> dict | None:
    """The same deployment at its decode batch limit / ``divisor`` (None when that is below ``divisor``
    per instance); the search serves the candidate of that label, with its own step estimate, when
    there is one."""
    import copy

    d = copy.deepcopy(c)
    pool = next(p for p in d["deployment"]["pools"] if p["role"] != "prefill")
    per_inst = pool["max_batch_per_npu"] * pool["plan"]["npus"]
    if per_inst < divisor:
        return None
    pool["max_batch_per_npu"] = max(1, pool["max_batch_per_npu"] // divisor)
    return d


def _plan(d: dict):
    from npusim.system.plan import ParallelPlan

    return ParallelPlan.from_dict(d)


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


def _kv_fabric(loaded) -> str:
    """The fabric KV moves between instances over: the system's serving file's (RoCE on Atlas 800I A2,
    the RDMA plane on CloudMatrix384), else the system's first fabric."""
    names = list(loaded.system.fabrics)
    for want in ("rdma", "roce"):
        if want in names:
            return want
    return names[0]
