"""A serving instance as the system serving loop sees it, from a DeepSeek deployment or a parallel plan.

An :class:`Instance` is ``npus`` NPUs split into *units*, each holding its own sequences and their
KV cache: a die under DeepSeek's data-parallel attention, a tensor-parallel group of dies under a
plan (with pipeline stages, the group's ranks of every stage). Per die of a unit: the bytes of one
token's KV it keeps (a plan's TP group splits the KV heads; each stage keeps its layers') and its
weights. ``step(x, y)`` is the instance's step time in ms (a :class:`~npusim.system.step_table.StepTable`
interpolates it): decode at ``x`` = the busiest unit's sequences times ``x_scale`` (a DeepSeek
deployment counts sequences per NPU) and mean context ``y``; prefill at ``x`` = prompt tokens per
NPU and prompt length ``y``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment
from npusim.model.zoo import get_config
from npusim.system.chipcost import ChipCost
from npusim.system.load import LoadedSystem
from npusim.system.mapper import StepShape, memory_per_rank_gb
from npusim.system.moe_step import deployment_plan, kv_bytes_per_token, weights_per_die_gb
from npusim.system.plan import ParallelPlan, check_plan
from npusim.system.step import simulate_plan_step
from npusim.system.step_table import deployment_step


@dataclass
class Instance:
    phase: str
    npus: int
    units: list[list[int]]  # instance-local die indices of each unit
    kv_bytes_per_die: float  # one token's KV on each die of its unit
    weights_gib_per_die: float  # GiB (2^30 bytes)
    step: Callable[[int, int], float]
    x_scale: int = 1
    mtp: int = 0
    mtp_acceptance: float = 0.0
    label: str = ""


def deployment_instance(loaded: LoadedSystem, dep: Deployment, model: str, seed: int = 0,
                        chip_cost: ChipCost | None = None, runtime: str | None = None) -> Instance:
    """DeepSeek's deployments: every die a unit (data-parallel attention), its KV the whole token's."""
    cfg = get_config(model)
    dpn = loaded.system.npu.dies
    plan = deployment_plan(dep, cfg, dpn)
    return Instance(dep.phase, dep.npus, [[d] for d in range(dep.npus * dpn)], float(kv_bytes_per_token(cfg)),
                    weights_per_die_gb(cfg, dep, dpn), deployment_step(loaded, dep, model, seed, chip_cost=chip_cost,
                                                                 runtime=runtime),
                    x_scale=dpn, mtp=plan.mtp, mtp_acceptance=plan.mtp_acceptance, label="deployment")


def plan_step(loaded: LoadedSystem, model, plan: ParallelPlan, phase: str, seed: int = 0,
              chip_cost: ChipCost | None = None, runtime: str | None = None) -> Callable[[int, int], float]:
    """A plan's step time (ms): decode at (sequences of each DP group, context), prefill at (prompt
    tokens per NPU, context): ``x x npus / y`` whole prompts of ``y`` tokens, at least one per group;
    fewer tokens than the context (``x x npus < y``) are a chunk of a longer prompt: one per group, each
    of those tokens attending ``y`` keys (the prompt's earlier chunks are in its KV cache)."""
    cc = chip_cost or ChipCost(loaded.chip)

    def step(x: int, y: int) -> float:
        if phase == "decode":
            shape, mb = StepShape("decode", x * plan.dp, 1, max(1, y)), min(plan.microbatches, x)
        else:
            tokens, y = x * plan.npus, max(1, y)
            prompts = max(plan.dp, round(tokens / y))
            # a chunk: fewer new tokens than keys (context parallelism splits whole prompts only)
            seq = y if tokens >= y or plan.cp > 1 else max(1, round(tokens))
            shape, mb = StepShape("prefill", prompts, seq, y), min(plan.microbatches, prompts // plan.dp)
        out, _, _ = simulate_plan_step(loaded, model, plan.with_changes(microbatches=max(1, mb)), shape, chip_cost=cc,
                                       seed=seed, fit=False, runtime=runtime)
        return out["step_ms"]
    return step


def plan_instance(loaded: LoadedSystem, plan: ParallelPlan, phase: str, model: str, seed: int = 0,
                  chip_cost: ChipCost | None = None, runtime: str | None = None) -> Instance:
    """A plan's instance: a unit per DP group (its TP ranks in every pipeline stage)."""
    cfg = get_config(model)
    dpn = loaded.system.npu.dies
    check_plan(plan, cfg, dpn, loaded.system.num_npus)
    per_stage = plan.npus * dpn // plan.pp
    units = [[s * per_stage + g * plan.tp + j for s in range(plan.pp) for j in range(plan.tp)]
             for g in range(plan.dp)]
    weights, kv_gb = memory_per_rank_gb(cfg, plan, StepShape("decode", plan.dp, 1, 1))  # one token per group
    if not math.isfinite(kv_gb) or kv_gb <= 0:
        raise ConfigError(f"{cfg.name}: no KV cache per token on the plan's dies")
    mtp = plan.mtp if phase == "decode" else 0
    return Instance(phase, plan.npus, units, kv_gb * 2**30, weights, plan_step(loaded, cfg, plan, phase, seed, chip_cost, runtime),
                    mtp=mtp, mtp_acceptance=plan.mtp_acceptance if mtp else 0.0,
                    label=f"plan tp{plan.tp} dp{plan.dp} ep{plan.ep} pp{plan.pp}")
