"""Mapping specs (``mappers/*.yaml``): how a model is laid onto the cores.

A spec says how many pipeline stages there are and which layers each holds; the
tensor-parallel degree and the partition per operator class; how each TP group's
cores are laid out on the mesh; how many data-parallel replicas share the chip; and
where weights and the KV cache live; and (``serving:``) how ``npusim run`` schedules a
request stream with it. Validated like arch files (unknown keys get a
did-you-mean, every error names the key path).

Partitions (per GEMM, following the NpuSim study's definitions):

* ``tp_k``: split K. Each core holds a ``K/t x N`` weight shard and the matching slice
  of the (replicated) input, computes partial sums of ``Y[M, N]`` and the group
  all-reduces them (``2(t-1)/t * M * N`` elements sent per core). Output replicated.
* ``tp_mn``: split M and N. Each core holds a ``K x N/t`` weight shard; the group
  all-gathers the weights (``(t-1)/t * K * N`` per core) and each core computes its
  ``M/t`` token rows. Activations stay split by tokens.
* ``tp_mnk``: a ``a x b`` grid: K split over ``a`` (all-reduce along it), M/N split over
  ``b`` (weight all-gather along it).
* ``tp_n``: split N only (Megatron's column-parallel linear): each core holds a ``K x N/t``
  weight shard and computes ``Y[M, N/t]`` for every token; the input is all-gathered first
  unless replicated (``(t-1)/t * M * K`` per core). Output split by features. The cheap one
  when M is small (decode), where ``tp_mn`` moves the weights and ``tp_k``'s K slices leave
  the array idle.
* ``auto``: per GEMM, the partition with the least estimated time (compute +
  communication at link bandwidth).

Layouts of a TP group on the mesh: ``linear_seq`` (consecutive cores of a row, the ring
closes across the strip), ``linear_interleave`` (WaferLLM: a strip visited out on even
positions and back on odd ones, so logically adjacent cores are at most 2 hops apart),
``ring`` (a closed loop around a 2-row block: every hop is 1), ``mesh2d`` (a block,
ring order snaking through it; for ``tp_mnk`` its rows and columns are the grid axes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from npusim.config import StrictModel, load_with_extends, validate
from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment, PlanSection, SystemServing
from npusim.resources import data_dir

OP_CLASSES = ("qkv", "o_proj", "ffn_up", "ffn_down", "lm_head", "other")
Partition = Literal["tp_k", "tp_mn", "tp_mnk", "tp_n", "auto"]
Placement = Literal["auto", "sram", "hbm"]
WeightPlacement = Literal["auto", "sram", "hbm", "partial", "first_use"]


class Partitions(StrictModel):
    """Partition per GEMM class; ``default`` applies to classes not given."""

    default: Partition = "auto"
    qkv: Partition | None = None
    o_proj: Partition | None = None
    ffn_up: Partition | None = None
    ffn_down: Partition | None = None
    lm_head: Partition | None = None
    other: Partition | None = None

    def for_class(self, op_class: str) -> str:
        return getattr(self, op_class, None) or self.default


class TensorParallel(StrictModel):
    degree: PositiveInt = 4
    partition: Partitions = Partitions()
    mnk_grid: tuple[PositiveInt, PositiveInt] | None = Field(
        default=None, description="a x b grid of tp_mnk (K split over a, M/N over b); default: most square")

    @model_validator(mode="after")
    def _grid(self):
        if self.mnk_grid is not None and self.mnk_grid[0] * self.mnk_grid[1] != self.degree:
            raise ValueError(f"mnk_grid {list(self.mnk_grid)} must multiply to the TP degree {self.degree}")
        return self

    def grid(self) -> tuple[int, int]:
        if self.mnk_grid is not None:
            return tuple(self.mnk_grid)
        a = int(self.degree ** 0.5)
        while self.degree % a:
            a -= 1
        return a, self.degree // a


class Pipeline(StrictModel):
    stages: PositiveInt = 1
    layers: list[tuple[int, int]] | None = Field(
        default=None, description="inclusive [first, last] layer of each stage; default: an even split")
    microbatches: PositiveInt | None = Field(default=None, description="default: one per stage (when the batch allows)")
    balance: Literal["cost", "layers"] = Field(
        default="cost", description="without explicit layers: stages of even estimated cost (the LM head counts "
        "towards the last stage), or of even layer counts")

    @model_validator(mode="after")
    def _ranges(self):
        if self.layers is not None:
            if len(self.layers) != self.stages:
                raise ValueError(f"layers lists {len(self.layers)} ranges for {self.stages} stages")
            prev = -1
            for first, last in self.layers:
                if first != prev + 1 or last < first:
                    raise ValueError(f"stage layer ranges must be consecutive and non-empty, got {self.layers}")
                prev = last
        return self


class Layout(StrictModel):
    group: Literal["linear_seq", "linear_interleave", "ring", "mesh2d"] = "linear_seq"
    origin: list[int] | None = Field(default=None, description="first core of each TP group (stage-major); default: "
                                     "packed. linear_*: the strip runs along the snake path (even rows west to "
                                     "east, odd rows east to west), so on an odd row its first core is its "
                                     "eastmost (8x8: the strip 56-59 has origin 59); ring/mesh2d: the block's "
                                     "north-west corner")


class Memory(StrictModel):
    weights: WeightPlacement = Field(
        default="auto", description="auto: all in SRAM if they fit, else all streamed from HBM; partial: as "
        "many whole tensors resident as fit, the rest streamed; first_use: resident, but loaded from HBM on "
        "first use (a cold start: the first pass pays the load once, later ones find them in SRAM)")
    kv_cache: Placement = "auto"
    sram_reserve_mb: float = Field(default=2.0, ge=0, description="per core, kept for activations and temporaries")
    weight_tile_kb: PositiveInt = Field(default=4096, description="streamed weights move in tiles of about this size (two buffers per core)")


class Serving(StrictModel):
    """How ``npusim run`` serves requests with this mapping (its flags override these)."""

    schedule: Literal["fusion", "continuous", "disagg"] = "fusion"
    pd_ratio: tuple[PositiveInt, PositiveInt] | None = Field(
        default=None, description="disagg: [prefill, decode] cores on the chip (default 2:1 of it)")
    pd_layout: Literal["pp_first", "dp_first"] = Field(
        default="pp_first", description="disagg: one P/D split of the chip, or one per data-parallel replica")
    pd_stages: tuple[PositiveInt, PositiveInt] | None = Field(
        default=None, description="disagg: pipeline stages of the prefill and decode instances (default: "
        "the fewest with at most 32 cores a stage); each stage's TP group is the region's cores / stages")
    replicas: PositiveInt | None = Field(
        default=None, description="data-parallel copies, each on a band of whole columns (default 1; dp_first: 2)")
    budget: PositiveInt = Field(default=1024, description="fusion: units per iteration (decode 1, chunk = tokens)")
    chunk_tokens: NonNegativeInt = Field(default=512, description="prefill chunk (0: whole prompts, continuous only)")
    max_batch: PositiveInt = 256
    max_tokens: PositiveInt = Field(default=8192, description="continuous: tokens per iteration at most")


class MappingSpec(StrictModel):
    name: str = "mapping"
    description: str = ""
    tensor_parallel: TensorParallel = TensorParallel()
    pipeline: Pipeline = Pipeline()
    data_parallel: PositiveInt | Literal["auto"] = "auto"
    layout: Layout = Layout()
    memory: Memory = Memory()
    serving: Serving = Serving()
    plan: PlanSection | None = None  # a parallel plan of any model over many NPUs (npusim run --system)
    system_serving: SystemServing | None = None  # prefill + decode instances serving requests (--system --trace)


MAPPER_DIR = data_dir("mappers")  # the repository's mappers/, or the copy a wheel ships


def load_mapping(path: str | Path) -> MappingSpec:
    def resolve(name, relative_to=None):
        for cand in ([relative_to / name] if relative_to else []) + [Path(name), MAPPER_DIR / f"{Path(name).stem}.yaml"]:
            if cand.is_file():
                return cand
        raise ConfigError(f"mapping '{name}': no such file, and not a spec in {MAPPER_DIR}")

    p = resolve(path)
    return validate(MappingSpec, load_with_extends(p, resolve), p)


def load_deployment(path: str | Path) -> Deployment:
    """The ``plan:`` section of a mapping spec as a deployment (ConfigError if the file has none, or
    it names no ``phase`` and ``npus``)."""
    spec = load_mapping(path)
    if spec.plan is None or spec.plan.phase is None or spec.plan.npus is None:
        raise ConfigError(f"{path}: no 'plan:' section with a 'phase' and 'npus'; a deployment needs them "
                          "(see mappers/cm384-deepseek-decode.yaml)")
    return validate(Deployment, spec.plan.model_dump(exclude_none=True), f"{path}: plan")


def load_system_serving(path: str | Path) -> tuple[SystemServing, Deployment | PlanSection,
                                                    Deployment | PlanSection]:
    """The ``system_serving:`` section of a mapping spec and the prefill and decode instances it
    names: each the named file's ``plan:`` section, a deployment when it gives its ``phase`` (which
    must match), else a parallel plan. Mapping names resolve next to the file first, then as usual;
    ConfigError otherwise."""
    spec = load_mapping(path)
    plan = spec.system_serving
    if plan is None:
        raise ConfigError(f"{path}: no 'system_serving:' section; serving requests on a system needs one "
                          "(see mappers/cm384-deepseek-serving.yaml)")
    here = Path(path).parent
    deps = []
    for key, phase in (("prefill", "prefill"), ("decode", "decode")):
        name = getattr(plan, key).mapping
        local = here / name
        named = load_mapping(local if local.is_file() else name)
        if named.plan is None:
            raise ConfigError(f"{path}: system_serving.{key}.mapping {name} has no 'plan:' section")
        if named.plan.phase is None:
            deps.append(named.plan)
            continue
        dep = load_deployment(local if local.is_file() else name)
        if dep.phase != phase:
            raise ConfigError(f"{path}: system_serving.{key}.mapping {name} deploys the model for {dep.phase}, "
                              f"expected {phase}")
        deps.append(dep)
    return plan, deps[0], deps[1]


def spec_from_flags(base: MappingSpec | None = None, tp: int | None = None, partition: str | None = None,
                    layout: str | None = None, stages: int | None = None) -> MappingSpec:
    """``base`` (or the defaults) with the command-line overrides applied."""
    data = (base or MappingSpec()).model_dump()
    if tp is not None:
        data["tensor_parallel"]["degree"] = tp
        data["tensor_parallel"]["mnk_grid"] = None
    if partition is not None:
        data["tensor_parallel"]["partition"] = {"default": partition}
    if layout is not None:
        data["layout"]["group"] = layout
    if stages is not None:
        data["pipeline"]["stages"] = stages
        data["pipeline"]["layers"] = None
    return validate(MappingSpec, data, "command-line options")
