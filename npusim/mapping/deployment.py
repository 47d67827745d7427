"""The multi-NPU deployment of a MoE model: the ``system:`` section of a mapping spec
(:class:`npusim.mapping.spec.MappingSpec`; read by :func:`npusim.mapping.spec.load_deployment`).

How DeepSeek-V3/R1 (or another MoE model of the zoo) is laid over an instance of NPUs
(``mappers/cm384-deepseek-decode.yaml`` ...):

* ``npus``: NPUs of the instance (disjoint from other instances); every die of them is one
  expert-parallel rank;
* ``attention``: ``dp`` (MLA data parallel over the dies: each die's own sequences) or
  ``{mode: tp, degree: T}`` (groups of T consecutive dies split the heads: each die of a group
  computes its heads for all of the group's tokens, all-gathers the group's inputs before and
  reduce-scatters the output after — MLA's latent KV is per token, not per head, so every die
  of the group holds the group's whole KV cache); TP inside a die is the chip mapper's business;
* ``routed_experts``: ``per_die`` routed experts on each expert die, ``redundant`` extra copies
  placed by the load profile (``eplb``), on ``dies`` dies (default: all dies not holding shared
  experts);
* ``shared_expert``: ``dedicated: N`` dies that compute only the shared expert (every token goes
  to one of them, round robin by source die, like a 9th expert), or ``dp`` (every die computes it
  for its own tokens), or ``tp: T`` (groups of T dies split it);
* ``dense_ffn`` (the first dense layers) and ``lm_head``: ``dp`` or ``tp: T``;
* ``microbatches`` (1 or 2) and ``overlap``: two microbatches so that one's communication hides
  under the other's compute — ``core_split`` (decode, the CloudMatrix384 paper's streams): two core
  shares (``core_split``), attention on one, MoE and communication on the other; ``dma`` (prefill:
  all-to-all on the DMA engines): all cores compute attention of both microbatches, then their
  experts, while the SDMA engines move one microbatch's tokens under the other's compute;
* ``mtp`` / ``mtp_acceptance``: speculative tokens per step and their acceptance (0 = off);
* ``step_overhead_us``: graph launch / scheduling time per step, with its source;
* ``eplb``: ``none`` | ``greedy`` | ``perfect`` expert placement by load.

Units: ``_us`` microseconds. Everything not given takes the default stated on its field.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt, field_validator, model_validator

from npusim.config import StrictModel, validate


class RoutedExperts(StrictModel):
    per_die: PositiveInt = 1
    redundant: NonNegativeInt = 0


class Parallel(StrictModel):
    """``dp`` (each die for its own tokens), ``tp: T`` (T dies split it) or ``dedicated: N`` dies."""

    mode: Literal["dp", "tp", "dedicated"] = "dp"
    degree: PositiveInt = 1


class CoreShare(StrictModel):
    cube: PositiveInt
    vector: PositiveInt


class Deployment(StrictModel):
    phase: Literal["decode", "prefill"]
    npus: PositiveInt
    attention: Parallel = Field(default_factory=Parallel)
    routed_experts: RoutedExperts = Field(default_factory=RoutedExperts)
    shared_expert: Parallel = Field(default_factory=Parallel)
    dense_ffn: Parallel = Field(default_factory=Parallel)
    lm_head: Parallel = Field(default_factory=Parallel)
    microbatches: Literal[1, 2] = 1
    overlap: Literal["core_split", "dma"] = "core_split"
    core_split: dict[str, CoreShare] = Field(default_factory=dict)
    mtp: NonNegativeInt = 0
    mtp_acceptance: float = Field(default=0.7, ge=0.0, le=1.0)
    eplb: Literal["none", "greedy", "perfect"] = "none"
    step_overhead_us: NonNegativeFloat = 0.0
    step_overhead_source: str = ""

    def overridden(self, **changes) -> Deployment:
        """A copy with ``changes`` (None values skipped), validated like the file: a value out of
        range (an MTP acceptance of 1.5) is one ConfigError, not a silently wrong step."""
        changes = {k: v for k, v in changes.items() if v is not None}
        if not changes:
            return self
        return validate(Deployment, {**self.model_dump(), **changes}, "command-line options (--mtp, ...)")

    @field_validator("attention", mode="before")
    @classmethod
    def _attention_mode(cls, v):
        return {"mode": "dp"} if v == "dp" else v

    @model_validator(mode="after")
    def _split(self):
        if self.attention.mode == "dedicated":
            raise ValueError("attention: dp or {mode: tp, degree: T}, not dedicated")
        if self.microbatches == 2 and self.overlap == "core_split" and set(self.core_split) != {"attention", "moe"}:
            raise ValueError("microbatches: 2 needs core_split with 'attention' and 'moe' shares (cube, vector), "
                             "or overlap: dma")
        return self


class PlanSection(StrictModel):
    """A parallel plan (:mod:`npusim.system.plan`) in a mapping spec's ``plan:`` section: how any
    model's instance is split over its NPUs' dies; each key may be left out (a flag, or the
    default plan, fills it)."""

    npus: PositiveInt | None = None
    tp: PositiveInt | None = None
    dp: PositiveInt | None = None
    ep: PositiveInt | None = None
    pp: PositiveInt | None = None
    microbatches: PositiveInt | None = None
    precision: Literal["bf16", "fp16", "w8a8"] | None = None
    kv_dtype: Literal["bf16", "int8"] | None = None
    mtp: NonNegativeInt | None = None
    mtp_acceptance: float | None = Field(default=None, ge=0.0, le=1.0)
    shared_tp: PositiveInt | None = None


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
