"""Multi-NPU sections of a mapping spec (:class:`npusim.mapping.spec.MappingSpec`): the ``plan:``
section (a parallel plan, :mod:`npusim.system.plan`, for any model on a system; with a ``phase`` it
is a *deployment*: the instance one serving phase runs, read by
:func:`npusim.mapping.spec.load_deployment`) and ``system_serving:`` (prefill and decode instances
serving a request stream).

A deployment file (``mappers/cm384-deepseek-decode.yaml`` ...) lays a MoE model over an instance
of NPUs in the plan's keys: ``tp`` (attention heads split over groups of ``tp`` dies; 1: data
parallel attention, each die its own sequences), ``ep`` (the expert dies), ``expert_tp`` (each
expert's width split over that many dies), ``cp`` (a prefill's prompts split over that many groups of
``tp`` dies, ring attention), ``shared_dies`` (dies
dedicated to the shared experts) or ``shared_tp``, ``redundant_experts`` and ``eplb``,
``dense_ffn`` / ``lm_head`` (``tp`` or ``dp``), ``microbatches`` with ``overlap`` (``core_split``
with ``attention_cores`` / ``moe_cores`` cube cores, or ``dma``), ``mtp`` / ``mtp_acceptance``,
``precision``; besides the plan, optionally ``step_overhead_us`` (the serving framework's time per
step, with its ``step_overhead_source``): it replaces the system's ``runtime.scheduler_us`` for this
instance; every other runtime cost is the system's (:class:`npusim.system.schema.Runtime`), the same
as for any plan.

Units: ``_us`` microseconds. Everything not given takes the default stated on its field (or the
default plan's, :func:`npusim.system.plan.default_plan`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt

from npusim.config import StrictModel, validate

#: the keys of a plan section that are parallel-plan keys (:class:`npusim.system.plan.ParallelPlan`)
PLAN_KEYS = ("npus", "tp", "dp", "cp", "ep", "expert_tp", "pp", "microbatches", "precision", "kv_dtype", "mtp",
             "mtp_acceptance", "shared_tp", "dense_ffn", "lm_head", "shared_dies", "redundant_experts", "eplb",
             "overlap", "attention_cores", "moe_cores")


class PlanSection(StrictModel):
    """A parallel plan (:mod:`npusim.system.plan`) in a mapping spec's ``plan:`` section: how any
    model's instance is split over its NPUs' dies; each key may be left out (a flag, or the
    default plan, fills it). ``phase``: the serving phase the instance runs (a deployment);
    ``step_overhead_us``: the framework's per-step time, replacing the system's
    ``runtime.scheduler_us`` (None: the system's) with its source."""

    npus: PositiveInt | None = None
    tp: PositiveInt | None = None
    dp: PositiveInt | None = None
    cp: PositiveInt | None = None
    ep: PositiveInt | None = None
    expert_tp: PositiveInt | None = None
    pp: PositiveInt | None = None
    microbatches: PositiveInt | None = None
    precision: Literal["bf16", "fp16", "w8a8"] | None = None
    kv_dtype: Literal["bf16", "int8"] | None = None
    mtp: NonNegativeInt | None = None
    mtp_acceptance: float | None = Field(default=None, ge=0.0, le=1.0)
    shared_tp: PositiveInt | None = None
    dense_ffn: Literal["tp", "dp"] | None = None
    lm_head: Literal["tp", "dp"] | None = None
    shared_dies: NonNegativeInt | None = None
    redundant_experts: NonNegativeInt | None = None
    eplb: Literal["none", "greedy", "perfect"] | None = None
    overlap: Literal["none", "dma", "core_split"] | None = None
    attention_cores: NonNegativeInt | None = None
    moe_cores: NonNegativeInt | None = None
    phase: Literal["decode", "prefill"] | None = None
    step_overhead_us: NonNegativeFloat | None = None
    step_overhead_source: str = ""

    def plan_keys(self) -> dict:
        """The parallel-plan keys the section gives (None: left to flags or the default plan)."""
        return {k: getattr(self, k) for k in PLAN_KEYS if getattr(self, k) is not None}


class Deployment(PlanSection):
    """A plan section with its ``phase`` and ``npus``: one serving instance of a model (the DeepSeek
    deployments on CloudMatrix384 and Atlas 800I A2)."""

    phase: Literal["decode", "prefill"]
    npus: PositiveInt

    def overridden(self, **changes) -> Deployment:
        """A copy with ``changes`` (None values skipped), validated like the file: a value out of
        range (an MTP acceptance of 1.5) is one ConfigError, not a silently wrong step."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return self
        return validate(Deployment, {**self.model_dump(), **changes}, "command-line options (--mtp, ...)")


class PrefillPool(StrictModel):
    """``instances`` prefill instances, each deployed by the mapping spec ``mapping`` (its
    ``system:`` section, phase prefill); an instance runs one batch of prompts at a time, at most
    ``tokens_per_npu`` prompt tokens per NPU of it (a longer prompt takes several such steps)."""

    mapping: str
    instances: PositiveInt = 1
    tokens_per_npu: PositiveInt = 16384


class DecodePool(StrictModel):
    """One decode instance deployed by ``mapping`` (phase decode): continuous batching of at most
    ``max_batch_per_npu`` sequences per NPU, spread over its dies (data-parallel attention)."""

    mapping: str
    max_batch_per_npu: PositiveInt = 96


class KVTransfer(StrictModel):
    """How a prompt's KV cache moves from its prefill die to its decode die: over fabric ``fabric``
    of the system (``rdma``, ``ub``, ``roce`` ... as the system file names them), started by the
    ``via`` engines (``sdma`` or ``aiv``)."""

    fabric: str
    via: Literal["sdma", "aiv"] = "sdma"


class CachingPool(StrictModel):
    """An EMS-style context caching pool: prompt KV blocks (``block_tokens`` per block; the trace's
    ``hash_ids`` name them) kept in the CPUs' DRAM and reached over ``fabric``. ``capacity_gb``
    (default: every CPU's ``dram_gb``) bounds it; least recently used blocks leave first."""

    enabled: bool = True
    fabric: str
    capacity_gb: float | None = Field(default=None, gt=0)
    block_tokens: PositiveInt = 512


class SystemServing(StrictModel):
    """Serving a request stream on a multi-NPU system with prefill/decode disaggregation: prefill
    instances and one decode instance on disjoint NPUs (decode first, then the prefill instances,
    in NPU order), KV moved between them as fabric traffic, an optional caching pool, and the
    SLOs goodput is judged by (``slo_ttft_ms``; ``slo_tpot_ms`` bounds every gap between tokens)."""

    prefill: PrefillPool
    decode: DecodePool
    kv_transfer: KVTransfer
    caching_pool: CachingPool | None = None
    slo_ttft_ms: float | None = Field(default=None, gt=0)
    slo_tpot_ms: float | None = Field(default=None, gt=0)
