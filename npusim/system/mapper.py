"""The system mapper: a model and a parallel plan -> the workload of one serving step.

One step is one decode iteration (``batch`` sequences of the instance, one new token each, at
context ``kv_len``) or one prefill batch (``batch`` prompts of ``seq_len`` tokens). The batch is
split over the plan's ``dp`` attention groups, then into ``microbatches``; each part flows
through the pipeline stages (:mod:`npusim.system.plan` defines the terms). With context
parallelism (``cp``, prefill) each DP group's prompts are cut into ``cp`` chunks, each on its own
*token group* of ``tp`` ranks (``dp x cp`` token groups a stage; with ``cp = 1`` a token group is a
DP group). Per layer and part, on the ranks of a token group:

* dense layer: attention (heads / tp) -> all-reduce of the hidden states (bf16) -> FFN
  (width / tp) -> all-reduce (tensor-parallel collectives by ``TP_ALGORITHM``);
* attention under context parallelism (``cp > 1``): ring attention over the DP group's ``cp``
  token groups (see :meth:`_Builder.ring_attention`); the rest of the layer on each token group's
  own chunk of the prompts, as above;
* MoE layer: attention (heads / tp; with tp 1 the router in the same kernel) -> with tp > 1 a
  reduce-scatter to each rank's 1/tp share of the group's tokens and the router on it -> each rank
  dispatches its tokens to the ranks of its expert-parallel group holding their top-k experts (INT8
  or BF16 activations as the precision says, one copy per destination rank or per selected expert,
  as the system's operators send; AIV-direct writes, SDMA under ``overlap: dma``) and to its
  shared-expert die (``shared_dies``) -> grouped expert GEMMs on each rank for the token copies it
  received (spread evenly over its expert slots, rows padded to 16, the cube's tile), shared experts
  on each rank for its own tokens (or split ``shared_tp`` ways) -> combine (BF16 outputs back) -> the
  weighted sum and residual (created when the next work needs it, so an in-order stream never waits
  on one microbatch's combine ahead of another's work) -> with tp > 1, an all-gather of the group's
  tokens. With ``expert_tp: T`` a token goes to all ``T`` ranks of each expert set holding one of its
  experts (``T`` times the copies, each rank's expert GEMMs ``1/T`` of the width) and the combine
  brings back ``T`` partial sums per set: the token's rank adds them (``(T - 1) / T`` of the combined
  rows, each ``hidden`` wide: an element-wise add kernel, the layer's ``mlp_residual`` op at that
  many rows) before the weighted sum;
* speculative tokens (``plan.mtp``, models with an MTP module): each sequence's step carries 1 +
  mtp tokens through every layer, the MTP decoder layer runs once per speculative token (as one
  more layer of the repeated kind), then ``eh_proj`` and the drafts' LM-head pass; a step gains
  ``1 + mtp x mtp_acceptance`` tokens a sequence;
* between stages, each rank sends its hidden states to the rank of the same index in the next
  stage; the last stage runs the final norm and the LM head (vocabulary / tp, then the logits
  all-gathered (bf16) over the group; ``lm_head: dp``: the whole vocabulary for each rank's share of
  the sequences), once for all microbatches when ``pp = 1``.

Routing is drawn (:mod:`npusim.system.moe`, seeded; group-limited when the model groups its experts:
DeepSeek-V3's ``n_group``/``topk_group``, Mixture of Grouped Experts); experts sit in order on the
ranks of an EP group (expert ``e`` on rank ``e // slots``; with ``expert_tp: T`` on the expert set
``e // slots`` of ``T`` consecutive ranks), redundant copies as ``eplb`` says.
Microbatches overlap as ``plan.overlap`` says; a deployment's calibrated times (:class:`Overheads`)
are ``fixed`` kernels. With ``pp = 1`` and
more than ``SIM_LAYERS`` identical layers, ``SIM_LAYERS`` are simulated and the rest extrapolated
at the period between the last two (``meta.repeat``); with ``pp > 1`` every layer is simulated.
The experts' activation between their GEMMs is a vector kernel (:meth:`_Builder.expert_activation`).
Not modelled here: the embedding lookup, the MTP layer's own weights in the memory check, ring
attention's online-softmax merge of each step's partial output (``cp``), context parallelism in decode.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from npusim.errors import ConfigError
from npusim.model.ir import Op
from npusim.system.moe import combine_bytes_per_token, combine_local_ops, dispatch_bytes_per_token, \
    dispatch_local_ops, expert_weights, pad_rows, route_tokens, token_copies
from npusim.system.parts import layer_part_graph
from npusim.system.plan import ParallelPlan, check_phase
from npusim.system.workload import Workload

SIM_LAYERS = 3
#: the tensor-parallel collectives' algorithm: one-shot ("mesh") reduce-scatter and all-gather through
#: every peer at once, as HCCL runs them on fully connected servers (ring and halving-doubling are
#: the alternatives a workload file may name)
TP_ALGORITHM = "direct"
ACT_BYTES = 2  # bf16 hidden states between ranks
#: offsets the seed of the routing sample greedy EPLB places experts by (an earlier sample, as
#: deployments place by the loads they observed, never the step's own routing)
EPLB_SAMPLE_SEED = 7919


@dataclass(frozen=True)
class StepShape:
    """What one step computes: ``batch`` sequences (decode: context ``kv_len`` after the new token;
    prefill: prompts of ``seq_len`` tokens, each attending ``kv_len`` keys when that is larger: a prompt's
    chunk after a cached part). ``kv_min`` (decode): the sequences' contexts spread
    uniformly over ``[kv_min, 2 kv_len - kv_min]`` (mean ``kv_len``, drawn per sequence, seeded), so
    data-parallel groups' attention differs and the slowest sets the pace (a group's attention is
    interpolated linearly in its mean context between chip costs at ``kv_len`` and at the top of
    the range); None: every sequence at ``kv_len``."""

    phase: str
    batch: int
    seq_len: int = 1
    kv_len: int = 1
    kv_min: int | None = None

    @property
    def tokens_per_seq(self) -> int:
        """New tokens of a sequence in the step (decode: 1, or 1 + the speculative tokens)."""
        return self.seq_len


@dataclass(frozen=True)
class Overheads:
    """Fixed times (us) a deployment adds to the simulated work, each a ``fixed`` kernel.

    Calibrated (filed under ``calibrated``): ``dispatch_us`` / ``combine_us`` per operator call (on
    the MoE stream before the transfers), ``step_us`` once per step, ``small_kernels_us`` per layer
    and microbatch (a what-if, 0 in the presets: in a MoE layer half after attention and half with
    the dispatch launch, in a dense layer after it); ``source`` cites them. Kernel launches are the
    system runtime's (:class:`~npusim.system.schema.Runtime`, added by
    :func:`npusim.system.execute.time_workload`); so is the per-step scheduler time (``step_us``
    stays for workloads that want a fixed step time of their own, ``calibrated``)."""

    small_kernels_us: float = 0.0
    dispatch_us: float = 0.0
    combine_us: float = 0.0
    step_us: float = 0.0
    source: str = ""
    small_kernels_source: str = ""
    step_source: str = ""


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class _Builder:
    def __init__(self, cfg, plan: ParallelPlan, shape: StepShape, dies_per_npu: int, routing: str, seed: int,
                 copies: str, overheads: Overheads | None):
        self.cfg, self.plan, self.shape, self.seed, self.copies = cfg, plan, shape, seed, copies
        self.oh = overheads or Overheads()
        ranks = plan.npus * dies_per_npu
        self.per_stage = ranks // plan.pp
        self.wl = Workload(ranks)
        self.weights = expert_weights(routing, cfg.num_experts, seed) if cfg.num_experts else None
        self.moe_layer_calls = 0
        split = plan.overlap == "core_split" and plan.microbatches > 1
        self.att_cores = plan.attention_cores if split else None
        self.moe_cores = plan.moe_cores if split else None
        self.moe_stream = "moe" if split else "compute"
        # MoE and shared-expert transfers: AIV-direct writes, as the dispatch/combine operators move
        # tokens; under the dma overlap, the SDMA engines (the cores stay on the other microbatch)
        self.via = "sdma" if plan.overlap == "dma" and plan.microbatches > 1 else "aiv"
        self.kv_weights = None  # per DP group: where its mean context sits between kv_len and kv_top
        self.kv_top = shape.kv_len
        self.expert_load = None  # token-expert pairs per rank of the stage, last MoE layer
        self.dispatch_copies = None  # token copies each rank of the stage sent to routed experts (its own
        # rank's included), last MoE layer
        self.homes = None  # ranks (within an EP group) holding each expert, placed at the first MoE layer
        self.pending: dict[int, tuple] = {}  # a rank's "combined" mark -> its MoE tail not yet run (settle)
        self.rings: dict[tuple, dict] = {}  # (layer tag, first rank of a DP group) -> its ring attention's outputs
        self._op_names: dict[int, tuple[list[str], int]] = {}  # layer -> its ops' names, its KV bytes a token

    # kernels -----------------------------------------------------------------------------------
    def layer_kernel(self, part: str, layer: int, seqs: int, cores: int | None = None, kv_len: int | None = None,
                     **split) -> int:
        s = self.shape
        spec = {"type": "layer", "part": part, "layer": layer, "phase": s.phase, "batch": max(1, seqs),
                "seq_len": s.seq_len, "kv_len": kv_len or (s.kv_len if s.phase == "decode" else max(s.seq_len, s.kv_len)),
                "precision": self.plan.graph_precision, "kv_dtype": self.plan.kv_dtype, **split}
        if cores:
            spec["cores"] = cores
        return self.wl.kernel(spec)

    def token_kernel(self, part: str, layer: int, tokens: int, cores: int | None = None) -> int:
        """A part whose work is per token only (router, shared experts, the MoE tail, a dense FFN)
        for ``tokens`` tokens."""
        spec = {"type": "layer", "part": part, "layer": layer, "phase": self.shape.phase, "batch": max(1, tokens),
                "seq_len": 1, "kv_len": 1, "precision": self.plan.graph_precision, "kv_dtype": self.plan.kv_dtype}
        if cores:
            spec["cores"] = cores
        return self.wl.kernel(spec)

    def gemm(self, m: int, k: int, n: int, dtype: str, batch: int = 1, cores: int | None = None) -> int:
        spec = {"type": "gemm", "m": int(m), "k": int(k), "n": int(n), "dtype": dtype}
        if batch > 1:
            spec["batch"] = int(batch)
        if cores:
            spec["cores"] = cores
        return self.wl.kernel(spec)

    def fixed(self, us: float, source: str) -> int:
        return self.wl.kernel({"type": "fixed", "us": float(us), "source": source or "the mapping"})

    def attention_cores(self, layer: int) -> int | None:
        """Cube cores of a MoE layer's attention (the attention stream's share under core_split)."""
        return self.att_cores if self.cfg.num_experts and layer >= self.cfg.first_dense_layers else None

    def attention_kernel(self, group: int, layer: int, seqs: int, part: str = "attention") -> int:
        """The group's attention (heads / tp) for its sequences (a MoE layer's on the attention
        stream's cores); with spread contexts (``kv_min``) a blend between the costs at ``kv_len``
        and at the range's top by the group's mean context."""
        cores = self.attention_cores(layer)
        k = self.layer_kernel(part, layer, seqs, cores, heads_split=self.plan.tp)
        if self.kv_weights is None:
            return k
        top = self.layer_kernel(part, layer, seqs, cores, kv_len=self.kv_top, heads_split=self.plan.tp)
        return self.wl.kernel({"type": "blend", "a": k, "b": top, "weight": float(self.kv_weights[group])})

    def group_ranks(self, stage: int, group: int) -> list[int]:
        """The ``tp`` ranks of token group ``group`` (DP group ``group // cp``, CP rank ``group % cp``)."""
        base = stage * self.per_stage + group * self.plan.tp
        return list(range(base, base + self.plan.tp))

    def calibrated(self, ranks, us: float, prev: dict, name: str, source: str, stream: str = "compute") -> dict:
        """A fixed time on each rank after ``prev`` (nothing when ``us`` is 0), filed under
        ``calibrated``."""
        if us <= 0:
            return prev
        k = self.fixed(us, source)
        return {r: self.wl.compute(r, k, [prev.get(r)], name, "calibrated", stream) for r in ranks}

    def vector_kernel(self, op, cores: int | None) -> int:
        """A vector op (:class:`~npusim.model.ir.Op`) as a ``vector`` workload kernel on ``cores``."""
        spec = {"type": "vector", "op_class": op.op_class, "elements": int(op.elements),
                "row_len": int(op.row_len or 1), "dtype": op.dtype}
        if op.fn:
            spec["fn"] = op.fn
        if cores:
            spec["cores"] = cores
        return self.wl.kernel(spec)

    def local_work(self, rank: int, ops, deps: list, name: str, category: str) -> int:
        """``ops`` (the MoE operators' vector work on a die, :mod:`npusim.system.moe`) one after
        another on ``rank``'s MoE stream after ``deps``; the last node (or a barrier when none)."""
        for op in ops:
            deps = [self.wl.compute(rank, self.vector_kernel(op, self.moe_cores), deps,
                                    f"{name}.{op.name.split('.')[-1]}", category, self.moe_stream)]
        return deps[0] if len(deps) == 1 else self.wl.barrier(deps, name, rank=rank)

    def expert_activation(self, rows: int, width: int, batch: int) -> int:
        """The experts' activation between their GEMMs for ``rows`` rows of each of ``batch`` experts
        (the up GEMM's ``2 width`` outputs a row): under INT8 (W8A8) one pass that de-quantises the
        GEMM's INT32 output, applies SwiGLU and re-quantises for the down GEMM (CANN's
        DequantSwigluQuant), costed as a quantising stream over the INT32 rows (4 bytes an element
        read, about the real kernel's traffic); else SwiGLU over the bf16 rows."""
        elements = rows * batch * 2 * width
        op = (Op("experts.act", "vector", dtype="fp32", elements=elements, op_class="quantize", row_len=2 * width)
              if self.plan.gemm_dtype == "int8" else
              Op("experts.act", "vector", dtype="bf16", elements=elements, op_class="activation", fn="swiglu",
                 row_len=2 * width))
        return self.vector_kernel(op, self.moe_cores)

    # collectives of a TP group ------------------------------------------------------------------
    def group_collective(self, op: str, ranks, tokens: int, prev: dict, name: str) -> dict:
        """``op`` over the group for ``tokens`` tokens' hidden states (bf16): after it every rank's
        next work waits for it."""
        if len(ranks) == 1:
            return prev
        nbytes = tokens * self.cfg.hidden_size * ACT_BYTES
        node = self.wl.collective(op, ranks, nbytes, list(prev.values()), name, "tp_comm", TP_ALGORITHM)
        return dict.fromkeys(ranks, node)

    # one layer of one microbatch of one DP group --------------------------------------------------
    def attention(self, ranks, group: int, layer: int, seqs: int, prev: dict, tag: str, reduce: str = "allreduce",
                  part: str = "attention") -> dict:
        """The token group's attention (ring attention under context parallelism), then ``reduce``
        over its ``tp`` ranks."""
        if self.plan.cp > 1:
            out = self.ring_attention(ranks, group, layer, seqs, prev, tag, part)
        else:
            k = self.attention_kernel(group, layer, seqs, part)
            prev = self.settle(ranks, prev)
            out = {r: self.wl.compute(r, k, [prev.get(r)], f"{tag}.attention", "attention") for r in ranks}
        return self.group_collective(reduce, ranks, seqs * self.shape.tokens_per_seq, out, f"{tag}.attention_{reduce}")

    # context parallelism (prefill) ----------------------------------------------------------------
    def ring_attention(self, ranks, group: int, layer: int, seqs: int, prev: dict, tag: str, part: str) -> dict:
        """Token group ``group``'s (on ``ranks``) attention nodes: its DP group's ring attention
        (:meth:`_ring`), built for the DP group's ``cp`` token groups when the first of them asks
        (each then takes its own ranks' nodes)."""
        cp, tp = self.plan.cp, self.plan.tp
        c = group % cp
        key = (tag, ranks[0] - c * tp)
        if c == 0:
            self.rings[key] = self._ring(key[1], layer, seqs, prev, tag, part)
        out = self.rings[key] if c < cp - 1 else self.rings.pop(key)
        return {r: out[r] for r in ranks}

    def _ring(self, base: int, layer: int, seqs: int, prev: dict, tag: str, part: str) -> dict:
        """Ring attention of the DP group whose ranks start at ``base`` (``cp x tp`` ranks: CP rank
        ``c``'s TP rank ``t`` is ``base + c tp + t``). Each rank holds a chunk of each of the group's
        ``seqs`` prompts (the step's ``seq_len`` tokens: the prompt / cp, zig-zag pieces ``c`` and
        ``2 cp - 1 - c``) and its heads / tp, and runs:

        * the attention block's norm and Q/K/V projections for its chunk (MLA: to the latent KV):
          ``attention_qkv``;
        * ``cp`` ring steps: step ``i`` attends its queries to the KV chunk it holds (its own at step
          0, then the one that arrived), and -- before the last -- sends that chunk on to the next CP
          rank of the same TP index (``cp_ring<i>``, category ``cp_comm``: the chunk's KV in the
          cache's dtype, MLA's latent KV or the rank's K and V heads). As ring flash attention posts
          it, step ``i``'s send starts once the chunk has arrived and the rank's step ``i - 1`` is
          done, so it overlaps step ``i``'s compute; step ``i + 1`` waits for the chunk;
        * the output projection and the residual (``attention_out``); with ``part``
          ``attention+router``, then the router on its tokens.

        A step's kernel is the chunk's causal diagonal block: its S/cp queries against S/cp keys
        (MLA: with the up-projection ``kv_b_proj`` of those keys' latents). Zig-zag gives every step
        the same (query, key) pairs, (S/cp)^2 / 2 (the diagonal block S / (2 cp) more), so the other
        steps -- full blocks of that many pairs (half the queries against the whole chunk, or all
        of them against half of it) -- are costed as the diagonal one. Not costed: the online-softmax
        rescale merging each step's partial output into the running one."""
        plan, wl = self.plan, self.wl
        ring = list(range(base, base + plan.cp * plan.tp))
        prev = self.settle(ring, prev)
        qkv, step, out_proj = self.ring_kernels(layer, seqs)
        done = {r: wl.compute(r, qkv, [prev.get(r)], f"{tag}.attention_qkv", "attention") for r in ring}
        sizes = self.ring_send_bytes(layer, seqs)
        arrived = None  # the transfers that brought the chunk each rank attends to next (None: its own)
        for i in range(plan.cp):
            sent = None
            if i + 1 < plan.cp:
                sent = wl.transfers(ring, sizes, [arrived, *done.values()], f"{tag}.cp_ring{i}", "cp_comm")
            done = {r: wl.compute(r, step, [done[r], arrived], f"{tag}.ring_attention", "attention") for r in ring}
            arrived = sent
        out = {r: wl.compute(r, out_proj, [done[r]], f"{tag}.attention_out", "attention") for r in ring}
        if part == "attention+router":
            router = self.token_kernel("router", layer, seqs * self.shape.tokens_per_seq, self.attention_cores(layer))
            out = {r: wl.compute(r, router, [out[r]], f"{tag}.router", "moe_compute") for r in ring}
        return out

    def layer_op_names(self, layer: int) -> tuple[list[str], int]:
        """The names of layer ``layer``'s ops in a prefill graph (without the ``L<i>.`` prefix; a
        tiny shape: names only) and the KV bytes a token keeps in its attention op (sharded by
        ``tp``, in the plan's KV dtype)."""
        if layer not in self._op_names:
            spec = {"type": "layer", "layer": layer, "phase": "prefill", "batch": 1, "seq_len": 2, "kv_len": 2,
                    "precision": self.plan.graph_precision, "kv_dtype": self.plan.kv_dtype, "heads_split": self.plan.tp}
            ops = layer_part_graph(self.cfg, spec).ops
            kv = next(op.kv_bytes_per_token for op in ops if op.kind == "attention")
            self._op_names[layer] = ([op.name.split(".", 1)[1] for op in ops], kv)
        return self._op_names[layer]

    def ring_kernels(self, layer: int, seqs: int) -> tuple[int, int, int]:
        """(projections, one ring step, output projection) of the layer's attention for ``seqs``
        prompts' chunks (the step's ``seq_len`` tokens each), heads / tp: cuts of the layer's graph
        at the ring's first op (MLA prefill's ``kv_b_proj``, else the attention op) and after the
        attention op."""
        names, _ = self.layer_op_names(layer)
        attention = names.index("attn.attention")
        first = names.index("attn.kv_b_proj") if "attn.kv_b_proj" in names else attention
        s = self.shape
        spec = {"type": "layer", "layer": layer, "phase": "prefill", "batch": max(1, seqs), "seq_len": s.seq_len,
                "kv_len": s.seq_len, "precision": self.plan.graph_precision, "kv_dtype": self.plan.kv_dtype,
                "heads_split": self.plan.tp}
        cores = self.attention_cores(layer)
        if cores:
            spec["cores"] = cores
        before = names[first - 1]
        return (self.wl.kernel({**spec, "upto": before}),
                self.wl.kernel({**spec, "after": before, "upto": "attn.attention"}),
                self.wl.kernel({**spec, "after": "attn.attention", "upto": "attn_residual"}))

    def ring_send_bytes(self, layer: int, seqs: int) -> list[list[int]]:
        """The ring's byte matrix over its ``cp x tp`` ranks: each rank sends its KV chunk (``seqs``
        prompts x the step's ``seq_len`` tokens x the KV bytes a token keeps on it) to the next CP
        rank's rank of the same TP index."""
        cp, tp = self.plan.cp, self.plan.tp
        chunk = max(1, seqs) * self.shape.seq_len * self.layer_op_names(layer)[1]
        n = cp * tp
        sizes = [[0] * n for _ in range(n)]
        for i in range(n):
            sizes[i][((i // tp + 1) % cp) * tp + i % tp] = chunk
        return sizes

    def dense_layer(self, ranks, group: int, seqs: int, prev: dict, tag: str) -> dict:
        """Attention, then the dense FFN split over the group (``dense_ffn: tp``: all-reduce after
        each) or on each rank's token share (``dp``: reduce-scatter after attention, all-gather after
        the FFN); then the layer's calibrated small kernels, if any."""
        tokens = seqs * self.shape.tokens_per_seq
        if self.plan.dense_ffn == "tp" or len(ranks) == 1:
            a = self.attention(ranks, group, 0, seqs, prev, tag)
            k = self.layer_kernel("ffn", 0, seqs, ffn_split=self.plan.tp)
            out = {r: self.wl.compute(r, k, [a[r]], f"{tag}.ffn", "ffn") for r in ranks}
            out = self.group_collective("allreduce", ranks, tokens, out, f"{tag}.ffn_allreduce")
        else:
            a = self.attention(ranks, group, 0, seqs, prev, tag, "reducescatter")
            out = {r: self.wl.compute(r, self.token_kernel("ffn", 0, share), [a[r]], f"{tag}.ffn", "ffn")
                   for r, share in zip(ranks, _split(tokens, len(ranks)))}
            out = self.group_collective("allgather", ranks, tokens, out, f"{tag}.ffn_allgather")
        return self.calibrated(ranks, self.oh.small_kernels_us, out, f"{tag}.small_kernels",
                               self.oh.small_kernels_source or self.oh.source)

    # MoE ---------------------------------------------------------------------------------------
    def _placement(self, ranks: int, tokens: int) -> list[list[int]]:
        """Ranks (within an EP group; with ``expert_tp``, expert sets) holding each routed expert: a
        home each, in order (``slots`` a rank or set), plus, under greedy EPLB, the redundant copies
        given one by one to the expert with the most tokens per copy in an earlier routing sample
        (``tokens`` on each of ``ranks``)."""
        cfg, plan = self.cfg, self.plan
        n, slots = cfg.num_experts, plan.expert_slots(cfg.num_experts)
        homes = [[e // slots] for e in range(n)]
        if plan.eplb == "greedy" and plan.redundant_experts:
            sample = route_tokens(ranks, tokens, cfg.experts_per_token, n, self.weights, self.seed + EPLB_SAMPLE_SEED,
                                  cfg.expert_groups, cfg.groups_per_token, cfg.experts_per_group_balanced)
            load = np.bincount(sample.ravel(), minlength=n).astype(float)
            share = load.copy()
            for c in range(plan.redundant_experts):
                e = int(np.argmax(share))
                homes[e].append((n + c) // slots)
                share[e] = load[e] / len(homes[e])
        return homes

    def _destinations(self, picks: np.ndarray, valid: np.ndarray) -> np.ndarray:
        """``dest[src, token, k]``: the stage rank computing each token's k-th expert (-1: no token);
        with ``expert_tp: T``, ``dest[src, token, k T + j]``: the rank holding shard ``j`` of it (rank
        ``j`` of the expert's set). EP groups are consecutive ranks, an expert set ``T`` consecutive
        ranks of one; shared-expert dies dispatch to the groups in turn."""
        plan = self.plan
        n, ntok, k = picks.shape
        groups = (n - plan.shared_dies) // plan.ep
        base = (np.arange(n) % (groups * plan.ep)) // plan.ep * plan.ep
        if plan.eplb == "perfect":  # every (token, pick) pair of a group spread evenly over its slots
            slots = np.asarray([r for h in self.homes for r in h])
            local = slots[np.arange(n * ntok * k) % len(slots)].reshape(n, ntok, k)
        else:  # the copies of an expert share its tokens round robin
            nhomes = np.array([len(h) for h in self.homes])
            table = np.full((len(self.homes), nhomes.max()), -1, np.int64)
            for e, h in enumerate(self.homes):
                table[e, : len(h)] = h
            copy = (np.arange(n)[:, None, None] + np.arange(ntok)[None, :, None]) % nhomes[picks]
            local = table[picks, copy]
        t = plan.expert_tp
        if t > 1:  # an expert set's T ranks, each for its shard
            local = (local[..., None] * t + np.arange(t)).reshape(n, ntok, k * t)
        return np.where(valid[:, :, None], base[:, None, None] + local, -1)

    def moe_front(self, stage: int, seqs_by_group: list[int], prev: dict, tag: str) -> dict:
        """Attention, the router on each rank's token share and the dispatch, for all DP groups of
        a stage (dispatch crosses groups). With tp > 1 attention's output is reduce-scattered to the
        ranks' token shares (each dispatches its own), and all-gathered after the MoE block."""
        cfg, plan, wl = self.cfg, self.plan, self.wl
        layer = cfg.first_dense_layers
        stage_ranks = list(range(stage * self.per_stage, (stage + 1) * self.per_stage))
        tokens_of, gate = {}, {}
        half = self.oh.small_kernels_us / 2
        for g, seqs in enumerate(seqs_by_group):
            ranks = self.group_ranks(stage, g)
            shares = _split(seqs * self.shape.tokens_per_seq, plan.tp)
            if plan.tp == 1:  # attention and router in one kernel
                out = self.attention(ranks, g, layer, seqs, prev, tag, part="attention+router")
            else:
                att = self.attention(ranks, g, layer, seqs, prev, tag, "reducescatter")
                out = {r: wl.compute(r, self.token_kernel("router", layer, share, self.att_cores), [att[r]],
                                     f"{tag}.router", "moe_compute") for r, share in zip(ranks, shares)}
            out = self.calibrated(ranks, half, out, f"{tag}.small_kernels", self.oh.small_kernels_source or
                                  self.oh.source)
            tokens_of.update(zip(ranks, shares))
            gate.update(out)
        launch = self.oh.dispatch_us + half
        gate = self.calibrated(stage_ranks, launch, gate, f"{tag}.dispatch_launch", self.oh.source, self.moe_stream)
        n = len(stage_ranks)
        most = max(1, max(tokens_of.values()))
        picks = route_tokens(n, most, cfg.experts_per_token, cfg.num_experts, self.weights,
                             self.seed * 1_000_003 + self.moe_layer_calls, cfg.expert_groups, cfg.groups_per_token,
                             cfg.experts_per_group_balanced)
        self.moe_layer_calls += 1
        if self.homes is None:
            self.homes = self._placement(n, most)
        own = np.array([tokens_of[r] for r in stage_ranks], np.int64)
        dest = self._destinations(picks, np.arange(most)[None, :] < own[:, None])
        copies = token_copies(np.where(dest >= 0, dest, np.arange(n)[:, None, None]), n, self.copies)
        # with expert_tp T, the rows of expert partial sums each rank adds up: (T - 1) / T of its copies
        self.dispatch_copies = copies.sum(axis=1)
        partial_rows = self.dispatch_copies * (plan.expert_tp - 1) // plan.expert_tp
        pairs = np.zeros(n, np.int64)  # token-expert pairs (token-shard pairs with expert_tp) each rank computes
        np.add.at(pairs, dest[dest >= 0], 1)
        if plan.shared_dies:  # each rank's tokens also visit one shared-expert die, once
            target = n - plan.shared_dies + np.arange(n) % plan.shared_dies
            copies[np.arange(n), target] += own
            np.add.at(pairs, target, own)
        self.expert_load = pairs
        h = cfg.hidden_size
        disp = copies * dispatch_bytes_per_token(h, plan.gemm_dtype)
        comb = copies.T * combine_bytes_per_token(h)
        np.fill_diagonal(disp, 0)
        np.fill_diagonal(comb, 0)
        sent, received = copies.sum(axis=1), copies.sum(axis=0)  # rows each rank sends (own included), gets
        packed, reorder = [], []
        for i, r in enumerate(stage_ranks):
            send_ops, receive_ops = dispatch_local_ops(int(own[i]), int(sent[i]), int(received[i]), h, plan.gemm_dtype)
            packed.append(self.local_work(r, send_ops, [gate[r]], f"{tag}.dispatch", "dispatch"))
            reorder.append(receive_ops)
        d_node = wl.transfers(stage_ranks, disp, packed, f"{tag}.dispatch", "dispatch", self.via)
        return {"stage": stage, "seqs": seqs_by_group, "ranks": stage_ranks, "tokens_of": tokens_of, "gate": gate,
                "dispatch": d_node, "pairs": pairs, "combine_bytes": comb, "partial_rows": partial_rows, "tag": tag,
                "reorder": reorder, "returned": sent}

    def moe_back(self, f: dict) -> dict:
        """Shared and routed experts, the combine, the weighted sum (and, with tp > 1, the group's
        all-gather) for what :meth:`moe_front` dispatched."""
        cfg, plan, wl = self.cfg, self.plan, self.wl
        tag, stage_ranks, gate, pairs = f["tag"], f["ranks"], f["gate"], f["pairs"]
        h, width, dtype = cfg.hidden_size, cfg.moe_intermediate_size, plan.gemm_dtype
        slots = plan.expert_slots(cfg.num_experts)
        first_shared = len(stage_ranks) - plan.shared_dies
        shared, scatter = ({}, -1) if not cfg.num_shared_experts or plan.shared_dies else \
            self.shared_experts(stage_ranks, f["tokens_of"], gate, dtype, tag)
        experts = {}
        for i, r in enumerate(stage_ranks):
            deps = [self.local_work(r, f["reorder"][i], [f["dispatch"], gate[r]], f"{tag}.dispatch", "dispatch"),
                    *shared.get(r, [])]
            dedicated = i >= first_shared  # all its tokens through the shared experts, one GEMM pair
            rows = pad_rows(int(pairs[i]) if dedicated else math.ceil(pairs[i] / slots))
            if rows:
                w, b = (width * cfg.num_shared_experts, 1) if dedicated else (width // plan.expert_tp, slots)
                up = self.gemm(rows, h, 2 * w, dtype, b, self.moe_cores)
                down = self.gemm(rows, w, h, dtype, b, self.moe_cores)
                u = wl.compute(r, up, deps, f"{tag}.experts_up", "moe_compute", self.moe_stream)
                a = wl.compute(r, self.expert_activation(rows, w, b), [u], f"{tag}.experts_act", "moe_compute",
                               self.moe_stream)
                deps = [wl.compute(r, down, [a], f"{tag}.experts_down", "moe_compute", self.moe_stream)]
            experts[r] = deps
        launch = self.calibrated(stage_ranks, self.oh.combine_us, {r: d[-1] for r, d in experts.items()},
                                 f"{tag}.combine_launch", self.oh.source, self.moe_stream)
        c_node = wl.transfers(stage_ranks, f["combine_bytes"], [d for deps in experts.values() for d in deps]
                              + list(launch.values()), f"{tag}.combine", "combine", self.via)
        out = {}
        for g, seqs in enumerate(f["seqs"]):
            ranks = self.group_ranks(f["stage"], g)
            for r in ranks:
                summed = self.local_work(r, combine_local_ops(int(f["returned"][r - stage_ranks[0]]), h),
                                         [c_node, launch.get(r)] + experts[r], f"{tag}.combine", "combine")
                out[r] = wl.barrier([summed, scatter], f"{tag}.combined", rank=r)
                tail = self.token_kernel("moe_tail", cfg.first_dense_layers, f["tokens_of"][r], self.att_cores)
                partial = self.partial_sum_kernel(int(f["partial_rows"][r - stage_ranks[0]]))
                self.pending[out[r]] = (tail, tuple(ranks), seqs * self.shape.tokens_per_seq, tag, partial)
        return out

    def partial_sum_kernel(self, rows: int) -> int | None:
        """The element-wise add of ``rows`` expert partial sums (``hidden`` wide, bf16) into their
        tokens' outputs (``expert_tp``), on the MoE tail's cores: the MoE layer's ``mlp_residual`` op
        (an add of two rows x hidden tensors) built for that many rows. None: nothing to add."""
        if rows <= 0:
            return None
        layer = self.cfg.first_dense_layers
        names, _ = self.layer_op_names(layer)
        spec = {"type": "layer", "layer": layer, "phase": self.shape.phase, "batch": rows, "seq_len": 1, "kv_len": 1,
                "precision": self.plan.graph_precision, "kv_dtype": self.plan.kv_dtype,
                "after": names[names.index("mlp_residual") - 1], "upto": "mlp_residual"}
        if self.att_cores:
            spec["cores"] = self.att_cores
        return self.wl.kernel(spec)

    def settle(self, ranks, prev: dict) -> dict:
        """``prev`` with the MoE tails still pending on ``ranks`` run: (with ``expert_tp``, the
        add of the experts' partial sums, then) the weighted sum of the
        combined expert outputs and the residual on each rank's tokens (then, with tp > 1, the
        group's all-gather). A tail is created when the next work needs it, so that on an in-order
        stream it never waits for its combine ahead of another microbatch's work."""
        out = dict(prev)
        gathers = {}
        for r in ranks:
            if prev.get(r) not in self.pending:
                continue
            kernel, group, tokens, tag, partial = self.pending.pop(prev[r])
            ready = prev[r]
            if partial is not None:  # expert_tp: the experts' partial sums added first
                ready = self.wl.compute(r, partial, [ready], f"{tag}.expert_partial_sum", "moe_compute")
            out[r] = self.wl.compute(r, kernel, [ready], f"{tag}.moe_tail", "moe_compute")
            gathers[group] = (tokens, tag)
        for group, (tokens, tag) in gathers.items():
            out.update(self.group_collective("allgather", list(group), tokens, {r: out[r] for r in group},
                                             f"{tag}.moe_allgather"))
        return out

    def shared_experts(self, stage_ranks: list[int], tokens_of: dict, gate: dict, dtype: str, tag: str) -> dict:
        """The shared experts of a MoE layer, per rank: with ``shared_tp`` 1 each rank computes them
        for its own tokens; with ``shared_tp: T`` groups of T consecutive ranks split their width:
        each rank all-gathers its group's tokens (as dispatched: INT8 or BF16 with scales), computes
        its 1/T for all of them and sends each peer the BF16 partial sums of the peer's tokens (the
        scatter overlaps the routed experts). Returns each rank's shared-expert nodes and the scatter
        node (-1: none) the layer's tail waits for."""
        cfg, plan, wl = self.cfg, self.plan, self.wl
        layer, t = cfg.first_dense_layers, plan.shared_tp
        if t == 1:  # each rank its own tokens (the shared FFN's ops for that many rows)
            return {r: [wl.compute(r, self.token_kernel("shared", layer, tokens_of[r], self.moe_cores), [gate[r]],
                                   f"{tag}.shared_experts", "moe_compute", self.moe_stream)]
                    for r in stage_ranks if tokens_of[r]}, -1
        n, h = len(stage_ranks), cfg.hidden_size
        width = cfg.moe_intermediate_size * cfg.num_shared_experts // t
        same = (np.arange(n)[:, None] // t == np.arange(n)[None, :] // t) & ~np.eye(n, dtype=bool)
        own = np.array([tokens_of[r] for r in stage_ranks], np.int64)
        gather = np.where(same, own[:, None] * dispatch_bytes_per_token(h, dtype), 0)
        scatter = np.where(same, own[None, :] * combine_bytes_per_token(h), 0)
        g_node = wl.transfers(stage_ranks, gather, list(gate.values()), f"{tag}.shared_gather", "shared_comm",
                              self.via)
        done = {}
        for i, r in enumerate(stage_ranks):
            rows = pad_rows(int(own[(i // t) * t:(i // t + 1) * t].sum()))
            ids = [g_node, gate[r]]
            if rows:
                up = self.gemm(rows, h, 2 * width, dtype, cores=self.moe_cores)
                down = self.gemm(rows, width, h, dtype, cores=self.moe_cores)
                ids = [wl.compute(r, down, [wl.compute(r, up, ids, f"{tag}.shared_up", "moe_compute", self.moe_stream)],
                                  f"{tag}.shared_down", "moe_compute", self.moe_stream)]
            done[r] = ids
        s_node = wl.transfers(stage_ranks, scatter, [d for ids in done.values() for d in ids], f"{tag}.shared_scatter",
                              "shared_comm", self.via)
        return done, s_node

    # the end of the step -----------------------------------------------------------------------
    def head_shares(self, ranks, seqs: int) -> list[tuple[int, int, int]]:
        """(rank, sequences, vocabulary split) of the LM head: the group's sequences over a
        vocabulary split ``tp`` ways (``lm_head: tp``), or each rank's share of the sequences over
        the whole vocabulary (``dp``)."""
        if self.plan.lm_head == "tp" or len(ranks) == 1:
            return [(r, seqs, self.plan.tp) for r in ranks]
        return [(r, s, 1) for r, s in zip(ranks, _split(seqs, len(ranks))) if s]

    def mtp_module(self, ranks, seqs: int, mtp: int, prev: dict, tag: str) -> dict:
        """The MTP module besides its decoder layer: ``eh_proj`` over the step's tokens and the draft
        tokens' pass through the (shared) LM head, on each rank as the LM head is split."""
        cfg, s = self.cfg, self.shape
        out = {}
        for r, n, vocab_split in self.head_shares(ranks, seqs):
            eh = self.gemm(n * s.tokens_per_seq, 2 * cfg.hidden_size, cfg.hidden_size, self.plan.gemm_dtype)
            draft = self.wl.kernel({"type": "layer", "part": "head", "layer": -1, "phase": "decode", "batch": n,
                                    "seq_len": mtp, "kv_len": s.kv_len, "precision": self.plan.graph_precision,
                                    "kv_dtype": self.plan.kv_dtype, "vocab_split": vocab_split})
            e = self.wl.compute(r, eh, [prev[r]], f"{tag}.eh_proj", "mtp_module")
            out[r] = self.wl.compute(r, draft, [e], f"{tag}.draft_head", "mtp_module")
        return {**prev, **out}

    def head(self, ranks, seqs: int, prev: dict, tag: str) -> dict:
        prev = self.settle(ranks, prev)
        out = {r: self.wl.compute(r, self.layer_kernel("head", -1, n, vocab_split=split), [prev[r]], f"{tag}.lm_head",
                                  "lm_head") for r, n, split in self.head_shares(ranks, seqs)}
        if self.plan.lm_head == "tp" and len(ranks) > 1:  # the logits gathered for sampling
            rows = seqs if self.shape.phase == "prefill" else seqs * self.shape.tokens_per_seq
            node = self.wl.collective("allgather", ranks, rows * self.cfg.vocab_size * ACT_BYTES, list(out.values()),
                                      f"{tag}.logits_allgather", "lm_head", TP_ALGORITHM)
            out = dict.fromkeys(ranks, node)
        return {**prev, **out}


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Consecutive layers per stage, the first stages taking one more when they do not divide."""
    sizes = _split(num_layers, pp)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [range(int(starts[s]), int(starts[s + 1])) for s in range(pp)]


def build_step(cfg, plan: ParallelPlan, shape: StepShape, dies_per_npu: int = 1, routing: str = "uniform",
               seed: int = 0, copies: str = "per_rank", overheads: Overheads | None = None) -> Workload:
    """The workload of one step (see the module docstring). ``copies``: how dispatch sends a token
    to a rank holding several of its experts (``per_rank`` once, ``per_expert`` once per expert: the
    system's decode or prefill operators, ``moe_operators.*_copies``). ``overheads``: calibrated
    times a deployment adds (none by default). Raises ConfigError when the batch cannot be split
    as the plan says."""
    check_phase(plan, shape.phase)
    if shape.batch < plan.dp * plan.microbatches:
        raise ConfigError(f"--batch {shape.batch}: fewer sequences than dp {plan.dp} x microbatches "
                          f"{plan.microbatches} (each part needs one)")
    mtp = plan.mtp if shape.phase == "decode" else 0
    if mtp:  # each sequence's step verifies its new token and the speculative ones
        shape = StepShape("decode", shape.batch, 1 + mtp, shape.kv_len, shape.kv_min)
    b = _Builder(cfg, plan, chunk_shape(shape, plan.cp), dies_per_npu, routing, seed, copies, overheads)
    wl = b.wl
    stages = stage_layers(cfg.num_layers, plan.pp)
    moe_from = cfg.first_dense_layers if cfg.num_experts else cfg.num_layers
    # per microbatch m, per token group (DP group g's CP ranks in turn): sequences
    seqs = [[s for s in _split(g_seqs, plan.microbatches)] for g_seqs in _split(shape.batch, plan.dp)]
    seqs = [[seqs[g][m] for g in range(plan.dp) for _ in range(plan.cp)] for m in range(plan.microbatches)]
    if shape.kv_min is not None and shape.phase == "decode":
        b.kv_top, b.kv_weights = _context_spread(shape, plan.dp, seed)
    repeated_from = moe_from if moe_from < cfg.num_layers else 0  # the first of the identical layers
    repeat = plan.pp == 1 and cfg.num_layers - repeated_from > SIM_LAYERS
    simulated = _simulated_layers(cfg, moe_from) if repeat else list(range(cfg.num_layers))
    prev: list[dict] = [{} for _ in range(plan.microbatches)]
    marks = []
    start = -1
    one_stream_moe = plan.overlap == "dma"  # every microbatch's attention and dispatch, then their experts

    def layers(stage: int, parts: list[int], idx: int) -> None:
        """Layer ``idx`` of the microbatches ``parts`` on ``stage``."""
        tag = f"L{idx}"
        if idx < moe_from:
            for m in parts:
                out = {}
                for g, s in enumerate(seqs[m]):
                    out.update(b.dense_layer(b.group_ranks(stage, g), g, s, prev[m], f"{tag}.mb{m}"))
                prev[m] = out
        elif one_stream_moe:
            fronts = [b.moe_front(stage, seqs[m], prev[m], f"{tag}.mb{m}") for m in parts]
            for m, f in zip(parts, fronts):
                prev[m] = b.moe_back(f)
        else:
            for m in parts:
                prev[m] = b.moe_back(b.moe_front(stage, seqs[m], prev[m], f"{tag}.mb{m}"))

    def send_on(stage: int, m: int) -> None:
        nxt = {}
        for g, s in enumerate(seqs[m]):
            prev[m] = b.settle(b.group_ranks(stage, g), prev[m])
            for j, r in enumerate(b.group_ranks(stage, g)):
                to = b.group_ranks(stage + 1, g)[j]
                nbytes = s * b.shape.tokens_per_seq * cfg.hidden_size * ACT_BYTES
                nxt[to] = wl.collective("sendrecv", [r, to], nbytes, [prev[m][r]], f"S{stage}.mb{m}.send", "pp_comm")
        prev[m] = nxt

    everyone = list(range(plan.microbatches))
    if plan.pp == 1:
        for idx in simulated:  # layer by layer, the microbatches interleaved (one's comm under the other's compute)
            if repeat and idx == repeated_from:
                start = wl.barrier([d for p in prev for d in p.values()], "repeated_layers.start")
            layers(0, everyone, idx)
            if repeat and idx >= repeated_from:
                marks.append(wl.barrier([d for p in prev for d in p.values()], f"L{idx}.end"))
        if not repeat:  # the MTP module's decoder layer, once per speculative token
            for _ in range(mtp):
                layers(0, everyone, cfg.num_layers - 1)
    else:
        for s, stage in enumerate(stages):  # a stage runs its microbatches one after another
            for m in everyone:
                for idx in [*stage, *([cfg.num_layers - 1] * mtp if s == plan.pp - 1 else [])]:
                    layers(s, [m], idx)
                if s + 1 < plan.pp:
                    send_on(s, m)
    last = plan.pp - 1
    if plan.pp == 1 and plan.microbatches > 1:  # one LM head pass for all microbatches (its weights read once)
        prev = [b.settle(range(wl.ranks), p) for p in prev]
        prev = [{r: wl.barrier([p[r] for p in prev], "head.ready", rank=r) for r in sorted(prev[0])}]
        seqs = [[sum(col) for col in zip(*seqs)]]
    for m in range(len(prev)):
        for g, s in enumerate(seqs[m]):
            if g % plan.cp:  # zig-zag: CP rank 0 holds each prompt's last piece, the token the head samples
                prev[m] = b.settle(b.group_ranks(last, g), prev[m])
                continue
            ranks = b.group_ranks(last, g)
            prev[m].update(b.head(ranks, s, prev[m], f"head.mb{m}"))
            if mtp:
                prev[m].update(b.mtp_module(ranks, s, mtp, prev[m], f"mtp.mb{m}"))
    ends: dict[int, list[int]] = {}
    for p in prev:
        for r, node in p.items():
            ends.setdefault(r, []).append(node)
    add_step_overhead(wl, b.oh.step_us, b.oh.step_source or b.oh.source, ends)
    accepted = 1 + mtp * plan.mtp_acceptance  # tokens a sequence gains per step
    wl.meta = {"model": cfg.to_dict(), "plan": plan.to_dict(), "phase": shape.phase, "batch": shape.batch,
               "seq_len": shape.seq_len, "kv_len": shape.kv_len,
               "tokens": shape.batch * (shape.seq_len if shape.phase == "prefill" else accepted),
               "tokens_per_sequence": accepted if shape.phase == "decode" else 1.0,
               "simulated_layers": len(simulated), "routing": routing, "seed": seed}
    if b.expert_load is not None:
        wl.meta["expert_load"] = [int(x) for x in b.expert_load]
        wl.meta["dispatch_copies"] = [int(x) for x in b.dispatch_copies]
    if repeat:
        wl.meta["repeat"] = {"start": start, "marks": marks, "layers": cfg.num_layers - repeated_from + mtp}
    return wl


def rank_ends(wl: Workload) -> dict[int, list[int]]:
    """Each rank's last nodes so far: the last compute node on each of its streams, the last
    collective or transfers node that includes it and its last barrier of its own (``rank``); a
    node waiting on all of them starts after everything the rank takes part in (a rank waits only
    for its own part of a multi-rank node)."""
    last: dict[tuple[int, str], int] = {}
    for i, n in enumerate(wl.nodes):
        if n["kind"] == "compute":
            last[(n["rank"], "compute." + n.get("stream", "compute"))] = i
        elif n["kind"] in ("collective", "transfers"):
            for r in n["ranks"]:
                last[(r, "comm")] = i
        elif "rank" in n:
            last[(n["rank"], "barrier")] = i
    out: dict[int, list[int]] = {}
    for (r, _), i in last.items():
        out.setdefault(r, []).append(i)
    return {r: sorted(v) for r, v in out.items()}


def add_step_overhead(wl: Workload, us: float, source: str, ends: dict[int, list[int]] | None = None) -> None:
    """The runtime's per-step host overhead (scheduling, sampling, post-processing: one fixed time a
    step, ``calibrated``) on every rank after that rank's own last work (:func:`rank_ends`, plus
    ``ends``: nodes a rank must also follow). The ranks' overheads run side by side, so the step
    pays it once, after its last work: a pipeline's earlier stages spend theirs while the later
    stages compute (the host overhead is per step, not per stage). Nothing when ``us`` is 0."""
    if us <= 0:
        return
    k = wl.kernel({"type": "fixed", "us": float(us), "source": source or "the mapping"})
    own = rank_ends(wl)
    for r in range(wl.ranks):
        deps = sorted({*own.get(r, []), *(ends or {}).get(r, [])})
        wl.compute(r, k, deps, "step_overhead", "calibrated")


def chunk_shape(shape: StepShape, cp: int) -> StepShape:
    """What each token group computes of ``shape``: with context parallelism (``cp > 1``, prefill)
    a chunk of each prompt, ``seq_len / cp`` tokens (two zig-zag pieces of ``seq_len / (2 cp)``);
    ConfigError unless the prompt splits into ``2 cp`` equal pieces."""
    if cp == 1:
        return shape
    if shape.seq_len % (2 * cp):
        raise ConfigError(f"--seq {shape.seq_len}: cp {cp} splits each prompt into 2 x cp = {2 * cp} equal pieces "
                          f"(zig-zag, two a CP rank); the prompt length must be a multiple of {2 * cp}")
    chunk = shape.seq_len // cp
    return StepShape(shape.phase, shape.batch, chunk, chunk)


def _context_spread(shape: StepShape, groups: int, seed: int) -> tuple[int, np.ndarray]:
    """(top of the context range, each DP group's weight between ``kv_len`` and it) for
    ``shape.kv_min``: contexts drawn uniformly per sequence (seeded), a group's mean taken."""
    kv, lo = shape.kv_len, shape.kv_min
    if not 0 < lo < kv:
        raise ConfigError(f"--kv-min {lo}: the shortest context, between 0 and --kv {kv} (the mean)")
    top = 2 * kv - lo
    per_group = max(1, int(round(shape.batch / groups)))
    means = np.random.default_rng([seed, 1]).uniform(lo, top, size=(groups, per_group)).mean(axis=1)
    return top, (means - kv) / (top - kv)


def _simulated_layers(cfg, moe_from: int) -> list[int]:
    """Dense models: the first SIM_LAYERS layers. MoE models: their dense layers, then SIM_LAYERS MoE layers."""
    if moe_from >= cfg.num_layers:
        return list(range(SIM_LAYERS))
    return list(range(moe_from)) + list(range(moe_from, moe_from + SIM_LAYERS))


#: GB (10^9 bytes) in a GiB (2^30 bytes): the memory figures are computed in GiB, as the chips' HBM
#: capacities are given (``hbm.capacity_gb`` counts 2^30 bytes), and reported in both
GB_PER_GIB = 2**30 / 1e9


def memory_figures(weights_gib: float, kv_gib: float, hbm_gib: float | None = None) -> dict:
    """A step's memory per die as its JSON reports it: ``weights_gb_per_die``, ``kv_gb_per_die`` and
    ``hbm_gb_per_die`` in GB (10^9 bytes, as the keys say), the same ``*_gib_per_die`` in GiB."""
    out = {"weights_gb_per_die": round(weights_gib * GB_PER_GIB, 3), "kv_gb_per_die": round(kv_gib * GB_PER_GIB, 3)}
    if hbm_gib is not None:
        out["hbm_gb_per_die"] = round(hbm_gib * GB_PER_GIB, 3)
    out.update(weights_gib_per_die=round(weights_gib, 3), kv_gib_per_die=round(kv_gib, 3))
    if hbm_gib is not None:
        out["hbm_gib_per_die"] = hbm_gib
    return out


def memory_per_rank_gb(cfg, plan: ParallelPlan, shape: StepShape) -> tuple[float, float]:
    """(weights, KV cache) in GiB (2^30 bytes) on the busiest rank: each stage's layers (sharded as the
    plan says), its routed experts (with ``expert_tp``, ``expert_tp`` times the slots, each a shard of
    ``1 / expert_tp`` of the width), the embedding (first stage) and the LM head (last stage); the KV
    of its group's sequences at the step's context (with ``cp``, its chunk: ``1 / cp`` of each
    prompt's tokens; the chunks passing through during ring attention are not counted); the stage
    whose sum is largest."""
    moe_from = cfg.first_dense_layers if cfg.num_experts else cfg.num_layers
    stages = stage_layers(cfg.num_layers, plan.pp)
    return max((_stage_memory(cfg, plan, shape, layers, moe_from, s == 0, s == plan.pp - 1)
                for s, layers in enumerate(stages)), key=sum)


def _stage_memory(cfg, plan: ParallelPlan, shape: StepShape, stage: range, moe_from: int, first: bool,
                  last: bool) -> tuple[float, float]:
    layers = len(stage)
    spec = {"phase": "decode", "batch": 1, "seq_len": 1, "kv_len": 2, "precision": plan.graph_precision,
            "kv_dtype": plan.kv_dtype}

    def part_bytes(part, layer, **split):
        g = layer_part_graph(cfg, {**spec, "type": "layer", "part": part, "layer": layer, **split})
        return sum(op.weight_bytes for op in g.ops), sum(op.kv_bytes_per_token for op in g.ops
                                                         if op.kind == "attention")
    att_w, kv_tok = part_bytes("attention", moe_from if moe_from < cfg.num_layers else 0, heads_split=plan.tp)
    dense_layers = len([i for i in stage if i < moe_from])
    moe_layers = layers - dense_layers
    w = att_w * layers
    if dense_layers:
        w += part_bytes("ffn", 0, ffn_split=plan.tp if plan.dense_ffn == "tp" else 1)[0] * dense_layers
    if moe_layers:  # a routed-expert rank's slots, or a dedicated die's shared experts, whichever is larger
        elem = 1 if plan.precision == "w8a8" else 2
        shard = cfg.moe_intermediate_size // plan.expert_tp  # an expert's width on one rank
        routed = 3 * cfg.hidden_size * shard * elem * plan.expert_slots(cfg.num_experts)
        shared = part_bytes("shared", moe_from)[0] if cfg.num_shared_experts else 0
        per_layer = max(routed, shared) if plan.shared_dies else routed + shared / plan.shared_tp
        w += moe_layers * (per_layer + part_bytes("router", moe_from)[0])
    emb = cfg.vocab_size * cfg.hidden_size * 2
    head = emb / (plan.tp if plan.lm_head == "tp" else 1)
    w += (emb if first else 0) + (head if last and (plan.pp > 1 or not cfg.tie_word_embeddings) else 0)
    seqs_group = math.ceil(shape.batch / plan.dp)
    context = shape.kv_len if shape.phase == "decode" else shape.seq_len
    kv = seqs_group * math.ceil(context / plan.cp) * kv_tok * layers  # kv_tok: per layer, in the plan's KV dtype
    return w / 2**30, kv / 2**30


def build_onnx_step(path: str, plan: ParallelPlan, shape: StepShape, dies_per_npu: int = 1,
                    overheads: Overheads | None = None) -> Workload:
    """An ONNX-exported model's step: data parallel only (the export names no heads or layers to
    split), every rank the whole model for its share of the batch, no communication; then the
    step's host overhead (``overheads.step_us``, as :func:`build_step` charges a config-built
    model). Raises ConfigError for a plan with tp, ep or pp above 1."""
    from pathlib import Path

    if plan.tp * plan.ep * plan.pp != 1:
        raise ConfigError(f"{path}: an ONNX-exported model runs data parallel only on a system (tp 1, ep 1, pp 1; "
                          f"got tp {plan.tp}, ep {plan.ep}, pp {plan.pp}): the export names no heads or layers to split")
    ranks = plan.npus * dies_per_npu
    if shape.batch < ranks:
        raise ConfigError(f"--batch {shape.batch}: fewer sequences than the {ranks} data-parallel dies")
    wl = Workload(ranks)
    dtype = plan.gemm_dtype
    for r, seqs in enumerate(_split(shape.batch, ranks)):
        kernel = {"type": "onnx", "path": str(Path(path).resolve()), "phase": shape.phase, "batch": seqs,
                  "seq_len": shape.seq_len, "kv_len": shape.kv_len,
                  "dtype": dtype}
        wl.compute(r, kernel, (), "forward", "model")
    oh = overheads or Overheads()
    add_step_overhead(wl, oh.step_us, oh.step_source or oh.source)
    wl.meta = {"model": {"name": Path(path).stem, "onnx": str(Path(path).resolve())}, "plan": plan.to_dict(),
               "phase": shape.phase, "batch": shape.batch, "seq_len": shape.seq_len, "kv_len": shape.kv_len,
               "tokens": shape.batch * (shape.seq_len if shape.phase == "prefill" else 1), "simulated_layers": None}
    return wl
