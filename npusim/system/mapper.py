"""The system mapper: a model and a parallel plan -> the workload of one serving step.

One step is one decode iteration (``batch`` sequences of the instance, one new token each, at
context ``kv_len``) or one prefill batch (``batch`` prompts of ``seq_len`` tokens). The batch is
split over the plan's ``dp`` attention groups, then into ``microbatches``; each part flows
through the pipeline stages (:mod:`npusim.system.plan` defines the terms). Per layer and part,
on the ranks of a data-parallel group of ``tp`` ranks:

* dense layer: attention (heads / tp) -> all-reduce of the hidden states (bf16) -> FFN
  (width / tp) -> all-reduce (tensor-parallel collectives by ``TP_ALGORITHM``);
* MoE layer: attention (heads / tp) -> all-reduce -> router and gate (each rank for the group's
  tokens) -> each rank dispatches its 1/tp of the group's tokens to the ranks of its
  expert-parallel group holding their top-k experts (INT8 or BF16 activations as the precision
  says, one copy per destination rank or per selected expert, as the system's operators send) ->
  grouped expert GEMMs on each rank for the token copies it received (spread evenly over its
  experts, rows padded to 16, the cube's tile), shared experts on each rank for its own tokens ->
  combine (BF16 outputs back) -> the weighted sum and residual -> with tp > 1, an all-gather of
  the group's tokens;
* speculative tokens (``plan.mtp``, models with an MTP module): each sequence's step carries 1 +
  mtp tokens through every layer, the MTP decoder layer runs once per speculative token (as one
  more layer of the repeated kind), then ``eh_proj`` and the drafts' LM-head pass; a step gains
  ``1 + mtp x mtp_acceptance`` tokens a sequence;
* between stages, each rank sends its hidden states to the rank of the same index in the next
  stage; the last stage runs the final norm and the LM head (vocabulary / tp) and all-gathers
  the logits (bf16) over the group.

Routing is drawn (:mod:`npusim.system.moe`, seeded; group-limited when the model groups its experts:
DeepSeek-V3's ``n_group``/``topk_group``, Mixture of Grouped Experts); experts sit in order on the ranks of an EP
group (expert ``e`` on rank ``e // (experts / ep)``), no redundant copies. With ``pp = 1`` and
more than ``SIM_LAYERS`` identical layers, ``SIM_LAYERS`` are simulated and the rest extrapolated
at the period between the last two (``meta.repeat``); with ``pp > 1`` every layer is simulated.
Not modelled here: the embedding lookup, the expert SwiGLU and quantisation kernels between the
GEMMs (the chip cost of the GEMMs only), the MTP layer's own weights in the memory check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from npusim.errors import ConfigError
from npusim.system.moe import combine_bytes_per_token, dispatch_bytes_per_token, expert_weights, pad_rows, \
    route_tokens, token_copies
from npusim.system.parts import layer_part_graph
from npusim.system.plan import ParallelPlan
from npusim.system.workload import Workload

SIM_LAYERS = 3
#: the tensor-parallel collectives' algorithm: one-shot ("mesh") reduce-scatter and all-gather through
#: every peer at once, as HCCL runs them on fully connected servers (ring and halving-doubling are
#: the alternatives a workload file may name)
TP_ALGORITHM = "direct"
ACT_BYTES = 2  # bf16 hidden states between ranks


@dataclass(frozen=True)
class StepShape:
    """What one step computes: ``batch`` sequences (decode: context ``kv_len`` after the new token;
    prefill: prompts of ``seq_len`` tokens)."""

    phase: str
    batch: int
    seq_len: int = 1
    kv_len: int = 1

    @property
    def tokens_per_seq(self) -> int:
        """New tokens of a sequence in the step (decode: 1, or 1 + the speculative tokens)."""
        return self.seq_len


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


class _Builder:
    def __init__(self, cfg, plan: ParallelPlan, shape: StepShape, dies_per_npu: int, routing: str, seed: int,
                 copies: str):
        self.cfg, self.plan, self.shape, self.seed, self.copies = cfg, plan, shape, seed, copies
        ranks = plan.npus * dies_per_npu
        self.per_stage = ranks // plan.pp
        self.wl = Workload(ranks)
        self.weights = expert_weights(routing, cfg.num_experts, seed) if cfg.num_experts else None
        self.moe_layer_calls = 0

    # kernels -----------------------------------------------------------------------------------
    def layer_kernel(self, part: str, layer: int, seqs: int, **split) -> int:
        s = self.shape
        return self.wl.kernel({"type": "layer", "part": part, "layer": layer, "phase": s.phase, "batch": max(1, seqs),
                "seq_len": s.seq_len, "kv_len": s.kv_len if s.phase == "decode" else s.seq_len,
                "precision": self.plan.graph_precision, "kv_dtype": self.plan.kv_dtype, **split})

    def group_ranks(self, stage: int, group: int) -> list[int]:
        base = stage * self.per_stage + group * self.plan.tp
        return list(range(base, base + self.plan.tp))

    # one layer of one microbatch of one DP group --------------------------------------------------
    def attention(self, ranks, layer_kind: int, seqs: int, prev: dict, tag: str) -> dict:
        wl, tp = self.wl, self.plan.tp
        k = self.layer_kernel("attention", layer_kind, seqs, heads_split=tp)
        out = {r: wl.compute(r, k, [prev.get(r)], f"{tag}.attention", "attention") for r in ranks}
        return self.allreduce(ranks, seqs, out, f"{tag}.attention_allreduce")

    def allreduce(self, ranks, seqs: int, prev: dict, name: str) -> dict:
        if len(ranks) == 1:
            return prev
        nbytes = seqs * self.shape.tokens_per_seq * self.cfg.hidden_size * ACT_BYTES
        node = self.wl.collective("allreduce", ranks, nbytes, list(prev.values()), name, "tp_comm", TP_ALGORITHM)
        return dict.fromkeys(ranks, node)

    def dense_ffn(self, ranks, seqs: int, prev: dict, tag: str) -> dict:
        k = self.layer_kernel("ffn", 0, seqs, ffn_split=self.plan.tp)
        out = {r: self.wl.compute(r, k, [prev[r]], f"{tag}.ffn", "ffn") for r in ranks}
        return self.allreduce(ranks, seqs, out, f"{tag}.ffn_allreduce")

    def moe(self, stage: int, seqs_by_group: list[int], prev: dict, tag: str) -> dict:
        """The MoE block of one layer for all DP groups of a stage (dispatch crosses groups)."""
        cfg, plan, wl = self.cfg, self.plan, self.wl
        tp, layer = plan.tp, cfg.first_dense_layers
        stage_ranks = list(range(stage * self.per_stage, (stage + 1) * self.per_stage))
        tokens_of = {}  # rank -> tokens it dispatches (its 1/tp of its group's)
        gate = {}
        for g, seqs in enumerate(seqs_by_group):
            ranks = self.group_ranks(stage, g)
            k = self.layer_kernel("router", layer, seqs)
            for r, share in zip(ranks, _split(seqs * self.shape.tokens_per_seq, tp)):
                tokens_of[r] = share
                gate[r] = wl.compute(r, k, [prev[r]], f"{tag}.router", "moe_compute")
        n = len(stage_ranks)
        most = max(tokens_of.values())
        picks = route_tokens(n, max(1, most), cfg.experts_per_token, cfg.num_experts, self.weights,
                             self.seed * 1_000_003 + self.moe_layer_calls, cfg.expert_groups, cfg.groups_per_token,
                             cfg.experts_per_group_balanced)
        self.moe_layer_calls += 1
        valid = np.arange(max(1, most))[None, :] < np.array([tokens_of[r] for r in stage_ranks])[:, None]
        per_rank_experts = cfg.num_experts // plan.ep
        group_base = (np.arange(n) // plan.ep) * plan.ep
        dest = group_base[:, None, None] + picks // per_rank_experts
        dest = np.where(valid[:, :, None], dest, -1)
        copies = token_copies(np.where(dest >= 0, dest, np.arange(n)[:, None, None]), n, self.copies)
        pairs = np.zeros(n, np.int64)  # token-expert pairs each rank computes
        np.add.at(pairs, dest[dest >= 0], 1)
        dtype = plan.gemm_dtype
        h, width = cfg.hidden_size, cfg.moe_intermediate_size
        disp = copies * dispatch_bytes_per_token(h, dtype)
        comb = copies.T * combine_bytes_per_token(h)
        np.fill_diagonal(disp, 0)
        np.fill_diagonal(comb, 0)
        d_node = wl.transfers(stage_ranks, disp, list(gate.values()), f"{tag}.dispatch", "ep_comm")
        shared, scatter = self.shared_experts(stage_ranks, tokens_of, gate, dtype, tag) if cfg.num_shared_experts \
            else ({}, -1)
        experts = {}
        for i, r in enumerate(stage_ranks):
            deps = [d_node, gate[r], *shared.get(r, [])]
            rows = pad_rows(math.ceil(pairs[i] / per_rank_experts))
            if rows:
                up = wl.kernel({"type": "gemm", "m": rows, "k": h, "n": 2 * width, "batch": per_rank_experts,
                                "dtype": dtype})
                down = wl.kernel({"type": "gemm", "m": rows, "k": width, "n": h, "batch": per_rank_experts,
                                  "dtype": dtype})
                u = wl.compute(r, up, deps, f"{tag}.experts_up", "moe_compute")
                deps = [wl.compute(r, down, [u], f"{tag}.experts_down", "moe_compute")]
            experts[r] = deps
        c_node = wl.transfers(stage_ranks, comb, [d for deps in experts.values() for d in deps], f"{tag}.combine",
                              "ep_comm")
        out = {}
        for g, seqs in enumerate(seqs_by_group):
            ranks = self.group_ranks(stage, g)
            k = self.layer_kernel("moe_tail", layer, seqs)
            tail = {r: wl.compute(r, k, [c_node, scatter] + experts[r], f"{tag}.moe_tail", "moe_compute")
                    for r in ranks}
            if tp > 1:
                nbytes = seqs * self.shape.tokens_per_seq * h * ACT_BYTES
                node = wl.collective("allgather", ranks, nbytes, list(tail.values()), f"{tag}.moe_allgather", "tp_comm",
                                     TP_ALGORITHM)
                tail = dict.fromkeys(ranks, node)
            out.update(tail)
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
            out = {}
            for r in stage_ranks:
                if tokens_of[r]:
                    k = wl.kernel({"type": "layer", "part": "shared", "layer": layer, "phase": self.shape.phase,
                                   "batch": tokens_of[r], "seq_len": 1, "kv_len": 1,
                                   "precision": plan.graph_precision, "kv_dtype": plan.kv_dtype})
                    out[r] = [wl.compute(r, k, [gate[r]], f"{tag}.shared_experts", "moe_compute")]
            return out, -1
        n, h = len(stage_ranks), cfg.hidden_size
        width = cfg.moe_intermediate_size * cfg.num_shared_experts // t
        same = (np.arange(n)[:, None] // t == np.arange(n)[None, :] // t) & ~np.eye(n, dtype=bool)
        own = np.array([tokens_of[r] for r in stage_ranks], np.int64)
        gather = np.where(same, own[:, None] * dispatch_bytes_per_token(h, dtype), 0)
        scatter = np.where(same, own[None, :] * combine_bytes_per_token(h), 0)
        g_node = wl.transfers(stage_ranks, gather, list(gate.values()), f"{tag}.shared_gather", "shared_comm")
        done = {}
        for i, r in enumerate(stage_ranks):
            rows = pad_rows(int(own[(i // t) * t:(i // t + 1) * t].sum()))
            ids = [g_node, gate[r]]
            if rows:
                up = wl.kernel({"type": "gemm", "m": rows, "k": h, "n": 2 * width, "dtype": dtype})
                down = wl.kernel({"type": "gemm", "m": rows, "k": width, "n": h, "dtype": dtype})
                ids = [wl.compute(r, down, [wl.compute(r, up, ids, f"{tag}.shared_up", "moe_compute")],
                                  f"{tag}.shared_down", "moe_compute")]
            done[r] = ids
        s_node = wl.transfers(stage_ranks, scatter, [d for ids in done.values() for d in ids], f"{tag}.shared_scatter",
                              "shared_comm")
        return done, s_node

    def mtp_module(self, ranks, seqs: int, mtp: int, prev: dict, tag: str) -> dict:
        """The MTP module besides its decoder layer: ``eh_proj`` over the step's tokens and the draft
        tokens' pass through the (shared, vocabulary-split) LM head, on each rank of the group."""
        cfg, s = self.cfg, self.shape
        dtype = self.plan.gemm_dtype
        eh = self.wl.kernel({"type": "gemm", "m": seqs * s.tokens_per_seq, "k": 2 * cfg.hidden_size,
                             "n": cfg.hidden_size, "dtype": dtype})
        draft = self.wl.kernel({"type": "layer", "part": "head", "layer": -1, "phase": "decode", "batch": seqs,
                                "seq_len": mtp, "kv_len": s.kv_len, "precision": self.plan.graph_precision,
                                "kv_dtype": self.plan.kv_dtype, "vocab_split": self.plan.tp})
        out = {}
        for r in ranks:
            e = self.wl.compute(r, eh, [prev[r]], f"{tag}.eh_proj", "mtp_module")
            out[r] = self.wl.compute(r, draft, [e], f"{tag}.draft_head", "mtp_module")
        return out

    def head(self, ranks, seqs: int, prev: dict, tag: str) -> dict:
        k = self.layer_kernel("head", -1, seqs, vocab_split=self.plan.tp)
        out = {r: self.wl.compute(r, k, [prev[r]], f"{tag}.lm_head", "lm_head") for r in ranks}
        if len(ranks) > 1:  # the logits gathered for sampling
            rows = seqs if self.shape.phase == "prefill" else seqs * self.shape.tokens_per_seq
            node = self.wl.collective("allgather", ranks, rows * self.cfg.vocab_size * ACT_BYTES, list(out.values()),
                                      f"{tag}.logits_allgather", "lm_head", TP_ALGORITHM)
            out = dict.fromkeys(ranks, node)
        return out


def stage_layers(num_layers: int, pp: int) -> list[range]:
    """Consecutive layers per stage, the first stages taking one more when they do not divide."""
    sizes = _split(num_layers, pp)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [range(int(starts[s]), int(starts[s + 1])) for s in range(pp)]


def build_step(cfg, plan: ParallelPlan, shape: StepShape, dies_per_npu: int = 1, routing: str = "uniform",
               seed: int = 0, copies: str = "per_rank") -> Workload:
    """The workload of one step (see the module docstring). ``copies``: how dispatch sends a token
    to a rank holding several of its experts (``per_rank`` once, ``per_expert`` once per expert: the
    system's decode or prefill operators, ``moe_operators.*_copies``). Raises ConfigError when the
    batch cannot be split as the plan says."""
    if shape.batch < plan.dp * plan.microbatches:
        raise ConfigError(f"--batch {shape.batch}: fewer sequences than dp {plan.dp} x microbatches "
                          f"{plan.microbatches} (each part needs one)")
    mtp = plan.mtp if shape.phase == "decode" else 0
    if mtp:  # each sequence's step verifies its new token and the speculative ones
        shape = StepShape("decode", shape.batch, 1 + mtp, shape.kv_len)
    b = _Builder(cfg, plan, shape, dies_per_npu, routing, seed, copies)
    wl = b.wl
    stages = stage_layers(cfg.num_layers, plan.pp)
    moe_from = cfg.first_dense_layers if cfg.num_experts else cfg.num_layers
    # per microbatch m, per DP group g: sequences
    seqs = [[s for s in _split(g_seqs, plan.microbatches)] for g_seqs in _split(shape.batch, plan.dp)]
    seqs = [[seqs[g][m] for g in range(plan.dp)] for m in range(plan.microbatches)]
    repeated_from = moe_from if moe_from < cfg.num_layers else 0  # the first of the identical layers
    repeat = plan.pp == 1 and cfg.num_layers - repeated_from > SIM_LAYERS
    simulated = _simulated_layers(cfg, moe_from) if repeat else list(range(cfg.num_layers))
    prev: list[dict] = [{} for _ in range(plan.microbatches)]
    marks = []
    start = -1

    def layer(stage: int, m: int, idx: int) -> None:
        tag = f"L{idx}.mb{m}"
        out = {}
        if idx < moe_from:
            for g, s in enumerate(seqs[m]):
                ranks = b.group_ranks(stage, g)
                a = b.attention(ranks, 0, s, prev[m], tag)
                out.update(b.dense_ffn(ranks, s, a, tag))
        else:
            att = {}
            for g, s in enumerate(seqs[m]):
                att.update(b.attention(b.group_ranks(stage, g), moe_from, s, prev[m], tag))
            out = b.moe(stage, seqs[m], att, tag)
        prev[m] = out

    def send_on(stage: int, m: int) -> None:
        nxt = {}
        for g, s in enumerate(seqs[m]):
            for j, r in enumerate(b.group_ranks(stage, g)):
                to = b.group_ranks(stage + 1, g)[j]
                nbytes = s * shape.tokens_per_seq * cfg.hidden_size * ACT_BYTES
                nxt[to] = wl.collective("sendrecv", [r, to], nbytes, [prev[m][r]], f"S{stage}.mb{m}.send", "pp_comm")
        prev[m] = nxt

    if plan.pp == 1:
        for idx in simulated:  # layer by layer, the microbatches interleaved (one's comm under the other's compute)
            if repeat and idx == repeated_from:
                start = wl.barrier([d for p in prev for d in p.values()], "repeated_layers.start")
            for m in range(plan.microbatches):
                layer(0, m, idx)
            if repeat and idx >= repeated_from:
                marks.append(wl.barrier([d for p in prev for d in p.values()], f"L{idx}.end"))
        if not repeat:  # the MTP module's decoder layer, once per speculative token
            for _ in range(mtp):
                for m in range(plan.microbatches):
                    layer(0, m, cfg.num_layers - 1)
    else:
        for s, layers in enumerate(stages):  # a stage runs its microbatches one after another
            for m in range(plan.microbatches):
                for idx in [*layers, *([cfg.num_layers - 1] * mtp if s == plan.pp - 1 else [])]:
                    layer(s, m, idx)
                if s + 1 < plan.pp:
                    send_on(s, m)
    last = plan.pp - 1
    for m in range(plan.microbatches):
        for g, s in enumerate(seqs[m]):
            ranks = b.group_ranks(last, g)
            prev[m].update(b.head(ranks, s, prev[m], f"head.mb{m}"))
            if mtp:
                prev[m].update(b.mtp_module(ranks, s, mtp, prev[m], f"mtp.mb{m}"))
    accepted = 1 + mtp * plan.mtp_acceptance  # tokens a sequence gains per step
    wl.meta = {"model": cfg.to_dict(), "plan": plan.to_dict(), "phase": shape.phase, "batch": shape.batch,
               "seq_len": shape.seq_len, "kv_len": shape.kv_len,
               "tokens": shape.batch * (shape.seq_len if shape.phase == "prefill" else accepted),
               "tokens_per_sequence": accepted if shape.phase == "decode" else 1.0,
               "simulated_layers": len(simulated), "routing": routing, "seed": seed}
    if repeat:
        wl.meta["repeat"] = {"start": start, "marks": marks, "layers": cfg.num_layers - repeated_from + mtp}
    return wl


def _simulated_layers(cfg, moe_from: int) -> list[int]:
    """Dense models: the first SIM_LAYERS layers. MoE models: their dense layers, then SIM_LAYERS MoE layers."""
    if moe_from >= cfg.num_layers:
        return list(range(SIM_LAYERS))
    return list(range(moe_from)) + list(range(moe_from, moe_from + SIM_LAYERS))


def memory_per_rank_gb(cfg, plan: ParallelPlan, shape: StepShape) -> tuple[float, float]:
    """(weights, KV cache) in GiB (2^30 bytes) on the busiest rank: each stage's layers (sharded as the
    plan says), its routed experts, the embedding (first stage) and the LM head (last stage); the KV
    of its group's sequences at the step's context; the stage whose sum is largest."""
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
        w += part_bytes("ffn", 0, ffn_split=plan.tp)[0] * dense_layers
    if moe_layers:
        elem = 1 if plan.precision == "w8a8" else 2
        w += moe_layers * (3 * cfg.hidden_size * cfg.moe_intermediate_size * elem * cfg.num_experts / plan.ep
                           + part_bytes("router", moe_from)[0])
        if cfg.num_shared_experts:
            w += moe_layers * part_bytes("shared", moe_from)[0] / plan.shared_tp
    emb = cfg.vocab_size * cfg.hidden_size * 2
    head = emb / plan.tp
    w += (emb if first else 0) + (head if last and (plan.pp > 1 or not cfg.tie_word_embeddings) else 0)
    seqs_group = math.ceil(shape.batch / plan.dp)
    context = shape.kv_len if shape.phase == "decode" else shape.seq_len
    kv = seqs_group * context * kv_tok * layers  # kv_tok: per layer, in the plan's KV dtype
    return w / 2**30, kv / 2**30


def build_onnx_step(path: str, plan: ParallelPlan, shape: StepShape, dies_per_npu: int = 1) -> Workload:
    """An ONNX-exported model's step: data parallel only (the export names no heads or layers to
    split), every rank the whole model for its share of the batch, no communication. Raises
    ConfigError for a plan with tp, ep or pp above 1."""
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
    wl.meta = {"model": {"name": Path(path).stem, "onnx": str(Path(path).resolve())}, "plan": plan.to_dict(),
               "phase": shape.phase, "batch": shape.batch, "seq_len": shape.seq_len, "kv_len": shape.kv_len,
               "tokens": shape.batch * (shape.seq_len if shape.phase == "prefill" else 1), "simulated_layers": None}
    return wl
