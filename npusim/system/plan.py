"""A parallel plan: how one model instance is split over the dies of a group of NPUs.

The plan is data (a mapping spec's ``plan:`` section, or ``--tp/--dp/--ep/--pp``
flags); :mod:`npusim.system.mapper` turns a plan and a model into a step workload. Terms, for an
instance of ``npus`` NPUs of ``dies_per_npu`` dies each (``ranks = npus x dies_per_npu``):

* ``pp``: pipeline stages; stage ``s`` holds consecutive layers on ranks ``[s R/pp, (s+1) R/pp)``;
  the embedding is on the first stage, the final norm and LM head on the last;
* ``tp``: tensor parallelism inside a stage (Megatron style): attention heads, the dense FFN's
  intermediate dimension and the LM head's vocabulary split over ``tp`` consecutive ranks, one
  all-reduce after attention and one after the FFN (KV heads are split when ``tp`` divides
  them, else replicated: ``tp`` ranks each keep ``num_kv_heads / tp`` or one head);
* ``dp``: attention data parallel inside a stage: ``dp`` groups of ``tp`` ranks, each with its own
  share of the sequences (``tp x dp x pp = ranks``);
* ``ep``: routed experts split over groups of ``ep`` ranks of a stage (each rank holds
  ``experts / ep``; a token goes to the ranks of its group that hold its top-k experts, all-to-all
  dispatch and combine); ``ep`` divides ``tp x dp``; dense models take ``ep = 1``;
* ``microbatches``: the batch split into ``M`` parts that flow through the stages one after
  another (with ``pp = 1``, one part's communication overlaps the next part's compute);
* ``precision``: ``bf16``, ``fp16`` (run as bf16: same width and cube rate on the modelled dies)
  or ``w8a8`` (INT8 weights and activations in the GEMMs, the LM head in bf16);
* ``kv_dtype``: ``bf16`` or ``int8`` (halves the cache's bytes and its reads);
* ``shared_tp``: the shared experts split over groups of that many consecutive ranks (their tokens
  all-gathered, partial sums scattered back); 1: every rank computes them for its own tokens;
* ``mtp`` / ``mtp_acceptance``: speculative tokens per decode step from the model's multi-token-
  prediction module (DeepSeek-V3), each accepted with that probability.

Not modelled: TP inside one expert, sequence/context parallelism.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from npusim.errors import ConfigError

PRECISIONS = ("bf16", "fp16", "w8a8")
KV_DTYPES = ("bf16", "int8")
#: the operator graph's precision (npusim.model.builder) for a plan precision
GRAPH_PRECISION = {"bf16": "bf16", "fp16": "bf16", "w8a8": "a8w8"}
KV_BYTES = {"bf16": 2, "int8": 1}


@dataclass(frozen=True)
class ParallelPlan:
    """See the module docstring; ``npus`` is the instance's NPU count."""

    npus: int = 1
    tp: int = 1
    dp: int = 1
    ep: int = 1
    pp: int = 1
    microbatches: int = 1
    precision: str = "bf16"
    kv_dtype: str = "bf16"
    mtp: int = 0
    mtp_acceptance: float = 0.7
    shared_tp: int = 1

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, where: str = "plan") -> ParallelPlan:
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a mapping of plan keys ({', '.join(f.name for f in fields(cls))})")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)}; expected {', '.join(sorted(known))}")
        plan = cls(**d)
        plan.check_values(where)
        return plan

    def check_values(self, where: str = "plan") -> None:
        for name in ("npus", "tp", "dp", "ep", "pp", "microbatches", "shared_tp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{where}: {name} must be a positive integer, got {v!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"{where}: precision {self.precision!r}: expected one of {', '.join(PRECISIONS)}")
        if self.kv_dtype not in KV_DTYPES:
            raise ConfigError(f"{where}: kv_dtype {self.kv_dtype!r}: expected one of {', '.join(KV_DTYPES)}")
        if isinstance(self.mtp, bool) or not isinstance(self.mtp, int) or not 0 <= self.mtp <= 8:
            raise ConfigError(f"{where}: mtp must be an integer 0..8 (speculative tokens per step), got {self.mtp!r}")
        if isinstance(self.mtp_acceptance, bool) or not isinstance(self.mtp_acceptance, (int, float)) \
                or not 0 <= self.mtp_acceptance <= 1:
            raise ConfigError(f"{where}: mtp_acceptance must be in [0, 1], got {self.mtp_acceptance!r}")

    def with_changes(self, **changes) -> ParallelPlan:
        """A copy with ``changes`` (None values skipped), checked like a file's."""
        plan = replace(self, **{k: v for k, v in changes.items() if v is not None})
        plan.check_values("command-line options (--tp, ...)")
        return plan

    @property
    def graph_precision(self) -> str:
        return GRAPH_PRECISION[self.precision]

    @property
    def gemm_dtype(self) -> str:
        """The GEMM operands' dtype (and the MoE dispatch's): int8 under w8a8, else bf16."""
        return "int8" if self.precision == "w8a8" else "bf16"

    def ranks_per_stage(self) -> int:
        return self.tp * self.dp


def default_plan(cfg, npus: int, dies_per_npu: int, **given) -> ParallelPlan:
    """The plan used when neither a mapping file nor a flag says: every rank of the instance in one
    stage, tensor parallel over as many ranks as divide the attention heads (the largest power of
    two up to the rank count), data parallel over the rest; MoE models put their experts on every
    rank of the stage (``ep = tp x dp``). Flags given (``given``) are kept; the others filled."""
    ranks = npus * dies_per_npu
    pp = given.get("pp") or 1
    per_stage = ranks // pp if ranks % pp == 0 else ranks
    tp = given.get("tp")
    dp = given.get("dp")
    if tp is None and dp is None:
        tp = 1
        while tp * 2 <= per_stage and per_stage % (tp * 2) == 0 and cfg.num_heads % (tp * 2) == 0:
            tp *= 2
        dp = per_stage // tp
    elif tp is None:
        tp = max(1, per_stage // dp)
    elif dp is None:
        dp = max(1, per_stage // tp)
    ep = given.get("ep") or (tp * dp if cfg.num_experts else 1)
    fixed = {k: v for k, v in given.items() if v is not None and k not in ("tp", "dp", "ep", "pp")}
    plan = ParallelPlan(npus=npus, tp=tp, dp=dp, ep=ep, pp=pp, **fixed)
    plan.check_values()
    return plan


def check_plan(plan: ParallelPlan, cfg, dies_per_npu: int, system_npus: int) -> None:
    """Raise one ConfigError naming the limit an impossible plan breaks (shape only; memory is
    checked by the mapper, which knows the batch)."""
    ranks = plan.npus * dies_per_npu
    if plan.npus > system_npus:
        raise ConfigError(f"plan: {plan.npus} NPUs but the system has {system_npus} (a bigger --nodes or system)")
    if plan.tp * plan.dp * plan.pp != ranks:
        raise ConfigError(f"plan: tp {plan.tp} x dp {plan.dp} x pp {plan.pp} = {plan.tp * plan.dp * plan.pp} ranks, but "
                          f"{plan.npus} NPUs x {dies_per_npu} dies = {ranks} ranks (the product must match)")
    if cfg.num_heads % plan.tp:
        raise ConfigError(f"plan: tp {plan.tp} does not divide {cfg.name}'s {cfg.num_heads} attention heads")
    kv_heads = cfg.num_kv_heads
    if not cfg.is_mla and plan.tp > kv_heads and plan.tp % kv_heads:
        raise ConfigError(f"plan: tp {plan.tp} must divide or be a multiple of {cfg.name}'s {kv_heads} KV heads")
    if not cfg.is_mla and plan.tp < kv_heads and kv_heads % plan.tp:
        raise ConfigError(f"plan: tp {plan.tp} does not divide {cfg.name}'s {kv_heads} KV heads")
    width = cfg.intermediate_size
    if width and width % plan.tp:
        raise ConfigError(f"plan: tp {plan.tp} does not divide {cfg.name}'s FFN width {width}")
    if plan.pp > cfg.num_layers:
        raise ConfigError(f"plan: pp {plan.pp} stages for {cfg.name}'s {cfg.num_layers} layers")
    if cfg.num_experts:
        if plan.ranks_per_stage() % plan.ep:
            raise ConfigError(f"plan: ep {plan.ep} does not divide the {plan.ranks_per_stage()} ranks of a stage "
                              f"(tp {plan.tp} x dp {plan.dp})")
        if cfg.num_experts % plan.ep:
            raise ConfigError(f"plan: ep {plan.ep} does not divide {cfg.name}'s {cfg.num_experts} routed experts")
    elif plan.ep != 1:
        raise ConfigError(f"plan: ep {plan.ep}, but {cfg.name} has no routed experts (dense: ep 1)")
    if plan.shared_tp > 1:
        width = cfg.moe_intermediate_size * cfg.num_shared_experts
        if not cfg.num_shared_experts:
            raise ConfigError(f"plan: shared_tp {plan.shared_tp}, but {cfg.name} has no shared experts")
        if plan.ranks_per_stage() % plan.shared_tp or width % plan.shared_tp:
            raise ConfigError(f"plan: shared_tp {plan.shared_tp} must divide the {plan.ranks_per_stage()} ranks of a "
                              f"stage and the shared experts' width {width}")
    if plan.mtp and not cfg.num_mtp_layers:
        raise ConfigError(f"plan: mtp {plan.mtp}, but {cfg.name} has no multi-token-prediction module")
