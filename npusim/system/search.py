"""Plan search: which parallel plan and batch serve a model best on a system (``npusim plan``).

Candidates are every plan of the instance's ranks (``R = npus x dies``): pipeline stages ``pp``
dividing ``R`` (at most ``max_pp`` and the layer count), ``tp`` dividing a stage's ranks (the
rest ``dp``), for MoE models ``ep`` among the three largest divisors of a stage's ranks that
divide the expert count, and ``microbatches`` 1 or 2 (``pp`` or ``2 pp`` with a pipeline).
Context parallelism (``cp``) and TP inside an expert (``expert_tp``) are not searched: every
candidate takes 1 (run a plan with them by ``npusim run --system ... --cp / --expert-tp``).
A plan the model cannot take (``tp`` not dividing its heads...) is rejected with the reason,
without simulating. Each plan is tried at the batch sizes in increasing order, in rounds (round
``k`` runs every plan still alive at its ``k``-th batch, all on the worker pool); a point whose
weights and KV do not fit a die's HBM is rejected without simulating, one that misses the
latency objective (TPOT for decode, TTFT for prefill) is simulated and marked infeasible, and
either ends that plan's search (a larger batch needs more memory and is no faster).

The objective: the most tokens/s per NPU among feasible points; the Pareto front is the
feasible points no other point beats on both tokens/s per NPU and latency.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from npusim.errors import NpusimError
from npusim.model.zoo import get_config
from npusim.system.plan import ParallelPlan, check_plan


@dataclass(frozen=True)
class PlanPoint:
    """One plan at one batch: everything a worker needs (picklable)."""

    system: str
    nodes: int | None
    model: str | dict
    plan: dict
    phase: str
    batch: int
    seq: int
    kv: int
    slo_ms: float | None = None
    routing: str = "uniform"
    seed: int = 0
    runtime: str | None = None  # eager / graph (None: the system's default for the phase)


@functools.lru_cache(maxsize=4)
def _system(system: str, nodes: int | None):
    from npusim.system.chipcost import ChipCost
    from npusim.system.load import load_system

    loaded = load_system(system, nodes=nodes)
    return loaded, ChipCost(loaded.chip)


def latency_key(phase: str) -> str:
    return "tpot_ms" if phase == "decode" else "ttft_ms"


def run_plan_point(pt: PlanPoint) -> dict:
    """Simulate one point; a record with ``plan``, ``batch``, the latency, ``tokens_per_s_per_npu``,
    ``feasible`` and ``reason`` (never raises for the point's own failures)."""
    from npusim.arch import summarize
    from npusim.system.mapper import GB_PER_GIB, StepShape, memory_figures, memory_per_rank_gb
    from npusim.system.step import simulate_plan_step

    lat = latency_key(pt.phase)
    rec = {"plan": pt.plan, "batch": pt.batch, lat: None, "tokens_per_s_per_npu": None, "feasible": False,
           "reason": None, "simulated": False}
    try:
        loaded, cc = _system(pt.system, pt.nodes)
        cfg = get_config(pt.model)
        plan = ParallelPlan.from_dict(pt.plan)
        shape = StepShape(pt.phase, pt.batch, pt.seq if pt.phase == "prefill" else 1,
                          pt.kv if pt.phase == "decode" else pt.seq)
        weights, kv = memory_per_rank_gb(cfg, plan, shape)
        hbm = summarize(loaded.chip).hbm_gb
        rec.update(memory_figures(weights, kv))
        if weights + kv > hbm:
            rec["reason"] = (f"memory: {weights * GB_PER_GIB:.1f} GB weights + {kv * GB_PER_GIB:.1f} GB KV per die > "
                             f"{hbm * GB_PER_GIB:.1f} GB of HBM ({hbm:g} GiB)")
            return rec
        out, _, _ = simulate_plan_step(loaded, cfg, plan, shape, chip_cost=cc, routing=pt.routing, seed=pt.seed,
                                       fit=False, runtime=pt.runtime)
        rec.update({lat: out[lat], "tokens_per_s_per_npu": out["tokens_per_s_per_npu"], "simulated": True,
                    "breakdown_us": out["breakdown_us"], "fixed_share": out["fixed_share"],
                    "runtime": out["runtime"]["mode"]})
        if pt.slo_ms is not None and out[lat] > pt.slo_ms:
            rec["reason"] = f"slo: {lat[:-3].upper()} {out[lat]:.2f} ms > {pt.slo_ms:g} ms"
        else:
            rec["feasible"] = True
    except NpusimError as exc:
        rec["reason"] = str(exc)
    except Exception as exc:  # a bug: recorded, the search goes on
        rec["reason"] = f"{type(exc).__name__}: {exc}"
    return rec


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def candidate_plans(cfg, npus: int, dies_per_npu: int, system_npus: int, precision: str = "bf16",
                    kv_dtype: str = "bf16", max_pp: int = 8, all_ep: bool = False,
                    microbatches: tuple[int, ...] | None = None, mtp: tuple[int, ...] = (0,),
                    redundant: bool = False) -> tuple[list[ParallelPlan], list[dict]]:
    """(plans the model can take, rejected plans with their reasons); see the module docstring.
    The serving search (:mod:`npusim.system.serving_search`) opens the grid: ``all_ep`` every EP that
    divides a stage's ranks, one that does not divide the expert count with the fewest redundant slots
    that make it (``-experts mod ep``, filled by greedy placement: 256 experts over 320 dies take 64
    copies, one expert a die); ``microbatches`` the counts to try (default 1 and 2,
    or ``pp`` and ``2 pp``); ``mtp`` the speculative-token counts (those beyond 0 only for models with an
    MTP module); ``redundant`` each EP plan also with one more redundant expert slot per EP rank (greedy
    placement by load)."""
    from npusim.errors import ConfigError

    ranks = npus * dies_per_npu
    plans, rejected = [], []
    mtps = [m for m in mtp if m == 0 or cfg.num_mtp_layers]
    for pp in (p for p in _divisors(ranks) if p <= max_pp and p <= cfg.num_layers):
        stage = ranks // pp
        for tp in _divisors(stage):
            eps = [1]
            if cfg.num_experts:
                eps = [e for e in _divisors(stage) if cfg.num_experts % e == 0 or (all_ep and e > 1)]
                eps = eps if all_ep else eps[-3:]
            for ep in eps:
                fill = -cfg.num_experts % ep if cfg.num_experts else 0  # slots that make the experts divide
                extra = [(fill, "greedy" if fill else "none")]
                if redundant and ep > 1:
                    extra.append((fill + ep, "greedy"))
                mbs = microbatches or ((1, 2) if pp == 1 else (pp, 2 * pp))
                for mb in mbs:
                    for m in mtps:
                        for red, eplb in extra:
                            plan = ParallelPlan(npus=npus, tp=tp, dp=stage // tp, ep=ep, pp=pp, microbatches=mb,
                                                precision=precision, kv_dtype=kv_dtype, mtp=m,
                                                redundant_experts=red, eplb=eplb)
                            try:
                                check_plan(plan, cfg, dies_per_npu, system_npus)
                                plans.append(plan)
                            except ConfigError as exc:
                                rejected.append({"plan": plan.to_dict(), "batch": None, "feasible": False,
                                                 "reason": str(exc), "simulated": False})
    return plans, rejected


def default_batches(phase: str, npus: int) -> list[int]:
    """Decode: 1, 2, 4 ... up to 64 per NPU; prefill: 1, 2, 4 ... 16 prompts per NPU."""
    top = (64 if phase == "decode" else 16) * npus
    out, b = [], 1
    while b <= top:
        out.append(b)
        b *= 2
    return out


def front(points: list[dict], order: Callable, value: Callable) -> list[dict]:
    """The Pareto front of two objectives: ``points`` in ``order`` (best first on the first objective,
    ties best first on the second), each kept when its ``value`` (the second, higher is better) beats
    every point before it."""
    out, best = [], float("-inf")
    for p in sorted(points, key=order):
        if value(p) > best:
            out.append(p)
            best = value(p)
    return out


def pareto(points: list[dict], lat: str) -> list[dict]:
    """Feasible points not beaten on both tokens/s per NPU (higher) and latency (lower), by latency."""
    return front([p for p in points if p["feasible"]], lambda p: (p[lat], -p["tokens_per_s_per_npu"]),
                 lambda p: p["tokens_per_s_per_npu"])


def search_plans(system: str, nodes: int | None, model, npus: int, phase: str, seq: int, kv: int,
                 slo_ms: float | None = None, precision: str = "bf16", kv_dtype: str = "bf16",
                 batches: list[int] | None = None, max_pp: int = 8, routing: str = "uniform", seed: int = 0,
                 workers: int = 1, client=None, progress: Callable[[int, int], None] | None = None,
                 runtime: str | None = None) -> dict:
    """Search (see the module docstring); returns ``best``, ``candidates``, ``pareto``, ``evaluated``.
    ``runtime``: every point's runtime mode, eager / graph (None: the system's default for the phase)."""
    from npusim.pool import run_points

    loaded, _ = _system(system, nodes)
    cfg = get_config(model)
    plans, rejected = candidate_plans(cfg, npus, loaded.system.npu.dies, loaded.system.num_npus, precision,
                                      kv_dtype, max_pp)
    batches = sorted(set(batches or default_batches(phase, npus)))
    lat = latency_key(phase)
    alive = {i: [b for b in batches if b >= p.dp * p.microbatches] for i, p in enumerate(plans)}
    results: list[dict] = []
    total = sum(len(v) for v in alive.values())
    done = [0]
    while any(alive.values()):
        round_items = [(i, PlanPoint(system, nodes, cfg.to_dict(), plans[i].to_dict(), phase, bs.pop(0), seq, kv,
                                     slo_ms, routing, seed, runtime)) for i, bs in alive.items() if bs]
        got: list[dict] = []

        def finished(rec: dict) -> None:
            got.append(rec)
            done[0] += 1
            if progress:
                progress(done[0], total)

        run_points(run_plan_point, [pt for _, pt in round_items], finished, _died, workers, client)
        by_key = {(str(r["plan"]), r["batch"]): r for r in got}
        for i, pt in round_items:
            rec = by_key[(str(pt.plan), pt.batch)]
            results.append(rec)
            if not rec["feasible"]:  # a larger batch needs more memory and is no faster
                total -= len(alive[i])
                alive[i] = []
    feasible = [r for r in results if r["feasible"]]
    best = max(feasible, key=lambda r: (r["tokens_per_s_per_npu"], -r[lat])) if feasible else None
    return {"system": loaded.system.name, "model": cfg.name, "phase": phase, "npus": npus,
            "objective": {"metric": "tokens_per_s_per_npu", "slo": lat if slo_ms else None, "slo_ms": slo_ms},
            "best": best, "pareto": pareto(results, lat), "candidates": results + rejected,
            "evaluated": sum(r["simulated"] for r in results), "plans": len(plans), "rejected_plans": len(rejected)}


def _died(pt: PlanPoint, exc: BaseException) -> dict:
    return {"plan": pt.plan, "batch": pt.batch, latency_key(pt.phase): None, "tokens_per_s_per_npu": None,
            "feasible": False, "simulated": False,
            "reason": f"the worker running this point died ({type(exc).__name__}: {exc})"}


def plan_label(plan: dict) -> str:
    return f"tp{plan['tp']} dp{plan['dp']} ep{plan['ep']} pp{plan['pp']} mb{plan['microbatches']}"

