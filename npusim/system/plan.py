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
* ``dp``: attention data parallel inside a stage: ``dp`` groups of ``tp x cp`` ranks, each with its
  own share of the sequences (``tp x dp x cp x pp = ranks``);
* ``cp``: context (sequence) parallelism, prefill only: each sequence's prompt split over ``cp``
  groups of ``tp`` ranks (zig-zag: ``2 cp`` equal pieces, CP rank ``c`` holding pieces ``c`` and
  ``2 cp - 1 - c``, so causal attention costs every rank the same); attention is ring attention
  (``cp`` steps, each rank's queries against one KV chunk per step while the chunk it holds goes on
  to the next CP rank), everything else runs on the rank's own tokens; each rank keeps ``1 / cp`` of
  the sequences' KV. Ranks of a stage are ordered ``tp`` fastest, then ``cp``, then ``dp``: rank
  ``(g x cp + c) x tp + t`` is TP rank ``t`` of CP rank ``c`` of DP group ``g``. Decode takes
  ``cp = 1`` (a KV cache split over ranks, with the softmax merge, is not modelled);
* ``ep``: routed experts split over groups of ``ep`` ranks of a stage (each rank holds
  ``experts / ep``; a token goes to the ranks of its group that hold its top-k experts, all-to-all
  dispatch and combine); ``ep`` divides ``tp x dp x cp``; dense models take ``ep = 1``;
* ``expert_tp``: tensor parallelism inside one routed expert: its intermediate width
  (``moe_intermediate_size``) split over ``expert_tp`` ranks. An EP group's ranks form
  ``ep / expert_tp`` *expert sets* of ``expert_tp`` consecutive ranks; experts sit in order on the
  sets, rank ``j`` of a set holding shard ``j`` of each of its experts (``experts x expert_tp / ep``
  shards a rank). A token goes to every rank of the sets holding its top-k experts (``expert_tp``
  times the copies), each computes its shard's GEMMs (width ``/ expert_tp``), the combine returns
  the ``expert_tp`` partial sums and the token's rank adds them (a vector kernel before the MoE
  tail). ``expert_tp`` divides ``ep`` and the expert width; dense models take 1;
* ``microbatches``: the batch split into ``M`` parts that flow through the stages one after
  another (with ``pp = 1``, one part's communication overlaps the next part's compute);
* ``precision``: ``bf16``, ``fp16`` (run as bf16: same width and cube rate on the modelled dies)
  or ``w8a8`` (INT8 weights and activations in the GEMMs, the LM head in bf16);
* ``kv_dtype``: ``bf16`` or ``int8`` (halves the cache's bytes and its reads);
* ``shared_tp``: the shared experts split over groups of that many consecutive ranks (their tokens
  all-gathered, partial sums scattered back); 1: every rank computes them for its own tokens;
* ``mtp`` / ``mtp_acceptance``: speculative tokens per decode step from the model's multi-token-
  prediction module (DeepSeek-V3), each accepted with that probability;
* ``dense_ffn`` and ``lm_head``: ``tp`` (split over the ``tp`` group like attention) or ``dp`` (each
  rank of the group computes the whole FFN or LM head for its ``1/tp`` share of the group's tokens:
  attention's output is reduce-scattered to the token shares, and all-gathered before the next
  attention);
* ``shared_dies``: ranks at the end of each stage dedicated to the shared experts (no routed
  experts there): every token goes to one of them, round robin by source rank, like one more
  routed expert; 0: the shared experts run on every rank (``shared_tp``);
* ``redundant_experts``: extra expert slots in each EP group (``(experts + redundant) / ep`` slots
  a rank), filled with copies of the most loaded experts when ``eplb`` is ``greedy``;
* ``eplb``: ``none`` (experts in order, no copies), ``greedy`` (copies to the most loaded experts by
  an earlier routing sample, not the step's own), ``perfect`` (every token-expert pair spread evenly
  over the slots: the bound a perfect balancer reaches);
* ``overlap`` (with two or more microbatches): ``none`` (one stream, the microbatches' layers in
  turn; communication overlaps the other's compute), ``dma`` (one stream: every microbatch's
  attention, then their experts, the all-to-all on the SDMA engines), ``core_split`` (two streams on
  each die: attention on ``attention_cores`` cube cores, the MoE side -- dispatch and combine
  launches, experts, shared experts -- on ``moe_cores``; the CloudMatrix384 paper's decode streams).

Not modelled: context parallelism in decode (``cp`` is a prefill plan).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace

from npusim.errors import ConfigError

PRECISIONS = ("bf16", "fp16", "w8a8")
KV_DTYPES = ("bf16", "int8")
#: the operator graph's precision (npusim.model.builder) for a plan precision
GRAPH_PRECISION = {"bf16": "bf16", "fp16": "bf16", "w8a8": "a8w8"}
KV_BYTES = {"bf16": 2, "int8": 1}
SPLITS = ("tp", "dp")
EPLB = ("none", "greedy", "perfect")
OVERLAPS = ("none", "dma", "core_split")


@dataclass(frozen=True)
class ParallelPlan:
    """See the module docstring; ``npus`` is the instance's NPU count."""

    npus: int = 1
    tp: int = 1
    dp: int = 1
    cp: int = 1
    ep: int = 1
    expert_tp: int = 1
    pp: int = 1
    microbatches: int = 1
    precision: str = "bf16"
    kv_dtype: str = "bf16"
    mtp: int = 0
    mtp_acceptance: float = 0.7
    shared_tp: int = 1
    dense_ffn: str = "tp"
    lm_head: str = "tp"
    shared_dies: int = 0
    redundant_experts: int = 0
    eplb: str = "none"
    overlap: str = "none"
    attention_cores: int = 0  # core_split: cube cores of the attention stream (0: all)
    moe_cores: int = 0  # core_split: cube cores of the MoE stream (0: all)

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
        for name in ("npus", "tp", "dp", "cp", "ep", "expert_tp", "pp", "microbatches", "shared_tp"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{where}: {name} must be a positive integer, got {v!r}")
        for name in ("shared_dies", "redundant_experts", "attention_cores", "moe_cores"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ConfigError(f"{where}: {name} must be a non-negative integer, got {v!r}")
        for name, choices in (("dense_ffn", SPLITS), ("lm_head", SPLITS), ("eplb", EPLB), ("overlap", OVERLAPS)):
            if getattr(self, name) not in choices:
                raise ConfigError(f"{where}: {name} {getattr(self, name)!r}: expected one of {', '.join(choices)}")
        if self.overlap == "core_split" and self.microbatches > 1 and not (self.attention_cores and self.moe_cores):
            raise ConfigError(f"{where}: overlap core_split needs attention_cores and moe_cores (the two streams' "
                              "cube cores)")
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
        return self.tp * self.dp * self.cp

    def expert_slots(self, num_experts: int) -> int:
        """Expert slots on each rank of an EP group (its experts and their redundant copies; with
        ``expert_tp``, expert shards: ``(experts + redundant) x expert_tp / ep``). Also the slots of
        an expert set (``expert_tp`` ranks), which hold whole experts."""
        return (num_experts + self.redundant_experts) * self.expert_tp // self.ep


def check_phase(plan: ParallelPlan, phase: str) -> None:
    """ConfigError for a plan the step's phase cannot run: context parallelism is a prefill plan."""
    if plan.cp > 1 and phase != "prefill":
        raise ConfigError(f"plan: cp {plan.cp} splits a prompt over ranks for prefill; a {phase} step with context "
                          "parallelism (the KV cache split over ranks, their attention merged by softmax statistics) "
                          "is not modelled: use cp 1 for decode")


def default_plan(cfg, npus: int, dies_per_npu: int, **given) -> ParallelPlan:
    """The plan used when neither a mapping file nor a flag says: every rank of the instance in one
    stage, tensor parallel over as many ranks as divide the attention heads (the largest power of
    two up to the rank count), data parallel over the rest; MoE models put their experts on every
    rank of the stage (``ep = tp x dp x cp``). Flags given (``given``) are kept; the others filled."""
    ranks = npus * dies_per_npu
    pp = given.get("pp") or 1
    cp = given.get("cp") or 1
    per_stage = ranks // pp if ranks % pp == 0 else ranks
    per_stage = per_stage // cp if per_stage % cp == 0 else per_stage  # the ranks tp x dp share
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
    ep = given.get("ep") or (tp * dp * cp if cfg.num_experts else 1)
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
    if ranks % plan.cp:
        raise ConfigError(f"plan: cp {plan.cp} does not divide the {ranks} ranks ({plan.npus} NPUs x {dies_per_npu} "
                          "dies): context parallelism splits each prompt over cp groups of tp ranks")
    product = plan.tp * plan.dp * plan.cp * plan.pp
    if product != ranks:
        factors = f"tp {plan.tp} x dp {plan.dp}" + (f" x cp {plan.cp}" if plan.cp > 1 else "") + f" x pp {plan.pp}"
        raise ConfigError(f"plan: {factors} = {product} ranks, but {plan.npus} NPUs x {dies_per_npu} dies = {ranks} "
                          "ranks (the product must match)")
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
        expert_ranks = plan.ranks_per_stage() - plan.shared_dies
        if expert_ranks < 1 or expert_ranks % plan.ep:
            raise ConfigError(f"plan: ep {plan.ep} does not divide the {expert_ranks} expert ranks of a stage "
                              f"(tp {plan.tp} x dp {plan.dp}" + (f" x cp {plan.cp}" if plan.cp > 1 else "")
                              + f", less {plan.shared_dies} shared-expert dies)")
        check_expert_tp(plan, cfg)
        slots = cfg.num_experts + plan.redundant_experts
        sets = plan.ep // plan.expert_tp  # expert sets of expert_tp ranks (ranks, with expert_tp 1)
        if slots % sets:
            raise ConfigError(f"plan: ep {plan.ep}" + (f" / expert_tp {plan.expert_tp} = {sets} expert sets"
                                                        if plan.expert_tp > 1 else "")
                              + f" does not divide {cfg.name}'s {cfg.num_experts} routed experts"
                              + (f" + {plan.redundant_experts} redundant copies" if plan.redundant_experts else ""))
    elif plan.ep != 1 or plan.expert_tp != 1 or plan.redundant_experts or plan.shared_dies:
        raise ConfigError(f"plan: ep {plan.ep}, expert_tp {plan.expert_tp}, redundant_experts or shared_dies, but "
                          f"{cfg.name} has no routed experts (dense: ep 1, expert_tp 1)")
    if plan.shared_dies and (not cfg.num_shared_experts or plan.shared_tp > 1):
        raise ConfigError(f"plan: shared_dies {plan.shared_dies} needs a model with shared experts "
                          f"({cfg.name} has {cfg.num_shared_experts}) and shared_tp 1")
    if plan.shared_tp > 1:
        width = cfg.moe_intermediate_size * cfg.num_shared_experts
        if not cfg.num_shared_experts:
            raise ConfigError(f"plan: shared_tp {plan.shared_tp}, but {cfg.name} has no shared experts")
        if plan.ranks_per_stage() % plan.shared_tp or width % plan.shared_tp:
            raise ConfigError(f"plan: shared_tp {plan.shared_tp} must divide the {plan.ranks_per_stage()} ranks of a "
                              f"stage and the shared experts' width {width}")
    if plan.mtp and not cfg.num_mtp_layers:
        raise ConfigError(f"plan: mtp {plan.mtp}, but {cfg.name} has no multi-token-prediction module")


def check_expert_tp(plan: ParallelPlan, cfg) -> None:
    """ConfigError unless ``expert_tp`` splits ``cfg``'s routed experts: at most ``ep`` ranks, dividing
    ``ep`` (whole expert sets in an EP group) and the experts' intermediate width."""
    t = plan.expert_tp
    if t == 1:
        return
    if t > plan.ep:
        raise ConfigError(f"plan: expert_tp {t} is more than ep {plan.ep}: an expert's shards sit on ranks of one "
                          "EP group (expert_tp <= ep)")
    if plan.ep % t:
        raise ConfigError(f"plan: expert_tp {t} does not divide ep {plan.ep} (an EP group is whole expert sets of "
                          "expert_tp consecutive ranks)")
    if cfg.moe_intermediate_size % t:
        raise ConfigError(f"plan: expert_tp {t} does not divide {cfg.name}'s expert width (moe_intermediate_size "
                          f"{cfg.moe_intermediate_size})")
