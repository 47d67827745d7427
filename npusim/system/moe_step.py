"""One serving step of a MoE model (DeepSeek-V3/R1) deployed over many NPUs: chip costs + fabric.

What one step is made of (each piece simulated, none a constant):

* per die, the **chip simulator** (through :class:`~npusim.system.chipcost.ChipCost`) times the
  attention block of one MoE layer for the die's own sequences (norms, MLA projections with weight
  absorption, attention over the KV cache read from HBM, the router), the routed (and shared)
  expert GEMMs for the tokens that actually arrive (token counts padded up to 16 rows, the cube's
  tile, as graph-mode engines pad), a dense layer, and the LM head — on the die's core share;
* the **fabric** times dispatch (each token once to every die holding one of its experts) and
  combine (results back) with the real routed-token counts (:mod:`npusim.system.moe` routing),
  AIV-direct writes, each operator call first paying the system's ``moe_operators`` overhead on
  the die's MoE stream; the slowest die sets the pace because the next layer's attention on a die
  waits for all of that die's combine transfers;
* the layer's small kernels the chip model does not cost (``moe_operators.other_kernels_us``,
  calibrated on a published kernel breakdown): half on each stream, per microbatch;
* two layers are simulated back to back and ``layer_us`` is the period between them (so two
  microbatches overlap one's MoE with the other's attention as they would in steady state);
  the step adds the dense layers, the MoE layers, the MTP module (its decoder layer, ``eh_proj``
  and its own LM-head pass for the drafts), the LM head (bf16) and the per-step overhead
  (``step_breakdown_ms``).

Not modelled (the output says so): the 910C's L2 (expert GEMMs run from HBM at 30-40% of
peak, see ``arch/ascend-910c-die.yaml``); quantisation and the other small kernels are one
calibrated time per layer, not simulated kernel by kernel. (The new tokens' KV writes are in the
chip cost of attention: the chip mapper writes them to HBM.)
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from npusim.arch import summarize
from npusim.errors import ConfigError
from npusim.model.builder import build_graph
from npusim.model.ir import Graph
from npusim.model.zoo import get_config
from npusim.system.chipcost import ChipCost
from npusim.system.collectives import matrix_transfers
from npusim.mapping.deployment import Deployment
from npusim.system.load import LoadedSystem
from npusim.system.moe import (combine_bytes_per_token, dispatch_bytes_per_token, expert_weights, route_tokens,
                               token_copies)
from npusim.system.simulator import PS_PER_US, SystemSim
from npusim.system.work import WorkBuilder

PAD_ROWS = 16
SIM_LAYERS = 2
PARTIAL_NOTE = ("partial model: the die's L2 is not modelled, a layer's small kernels (quantisation, "
                "gating, launch gaps) are one calibrated time; see validation/deepseek_deployments.py")


@dataclass
class StepResult:
    system: str
    model: str
    phase: str
    npus: int
    dies: int
    batch_per_npu: float
    batch_per_die: float
    tokens_per_step: float
    step_ms: float
    tpot_ms: float
    tokens_per_s_per_npu: float
    layer_us: float
    breakdown_us: dict
    step_breakdown_ms: dict  # dense_layers, moe_layers (incl. the MTP module's layer), lm_head, mtp_module, step_overhead
    microbatches: int
    mtp: int
    mtp_acceptance: float
    eplb: str
    kv_gb_per_die: float
    weights_gb_per_die: float
    imbalance: float
    attention_imbalance: float  # slowest die's attention / the mean (1 unless contexts are spread: kv_min)
    chip_cost: dict
    note: str = PARTIAL_NOTE

    def to_dict(self) -> dict:
        return asdict(self)

    def metric(self, name: str) -> float:
        """A field by name, or ``dispatch_us_per_call`` / ``combine_us_per_call`` (one operator
        call's span: a layer's breakdown over its microbatches) or their sum,
        ``dispatch_combine_us_per_call``."""
        if name == "dispatch_combine_us_per_call":
            return self.metric("dispatch_us_per_call") + self.metric("combine_us_per_call")
        if name in ("dispatch_us_per_call", "combine_us_per_call"):
            return self.breakdown_us[name.split("_")[0]] / self.microbatches
        return getattr(self, name)


def _pad(tokens: int) -> int:
    return int(math.ceil(tokens / PAD_ROWS) * PAD_ROWS) if tokens > 0 else 0


def _layer_subgraph(graph: Graph, layer: int, upto: str | None = None, after: str | None = None) -> Graph:
    """The ops of one decoder layer (up to and including the op whose name ends with ``upto``;
    from the op after the one whose name ends with ``after``)."""
    ops = [op for op in graph.ops if op.layer == layer]
    if upto is not None:
        cut = next(i for i, op in enumerate(ops) if op.name.endswith(upto))
        ops = ops[: cut + 1]
    if after is not None:
        cut = next(i for i, op in enumerate(ops) if op.name.endswith(after))
        ops = ops[cut + 1:]
    kept = {op.name for op in ops}
    ops = [replace(op, inputs=tuple(i for i in op.inputs if i in kept)) for op in ops]
    return Graph(graph.name, ops, graph.phase, graph.batch, graph.seq_len, graph.kv_len, graph.meta)


def _expert_placement(cfg, dep: Deployment, expert_dies: int, load: np.ndarray) -> list[list[int]]:
    """Dies holding each routed expert: one home die each (``per_die`` per die, in order), plus the
    redundant copies given to the most loaded experts (greedy EPLB; none without EPLB)."""
    n = cfg.num_experts
    slots = expert_dies * dep.routed_experts.per_die
    if slots < n:
        raise ConfigError(f"mapping: {expert_dies} expert dies x {dep.routed_experts.per_die} per die = {slots} slots "
                          f"for {n} routed experts")
    homes = [[e // dep.routed_experts.per_die] for e in range(n)]
    spare = slots - n
    if dep.eplb == "greedy" and spare > 0:
        copies = min(spare, dep.routed_experts.redundant or spare)
        share = load.astype(float).copy()
        for c in range(copies):
            e = int(np.argmax(share))
            homes[e].append((n + c) // dep.routed_experts.per_die)
            share[e] = load[e] / len(homes[e])
    return homes


def _traffic(picks: np.ndarray, homes: list[list[int]], shared_dies: list[int], dies: int, eplb: str,
             copies: str):
    """Token copies ``tokens[src, dst]`` (per selected expert or per destination die, as ``copies``
    says; see :mod:`npusim.system.moe`) and expert tokens per die."""
    ndies, ntok, k = picks.shape
    per_die = np.zeros(dies, np.int64)
    if eplb == "perfect":  # every expert slot gets the same share: spread (token, pick) pairs evenly
        slots = [d for h in homes for d in h]
        flat = np.arange(ndies * ntok * k) % len(slots)
        dest = np.asarray(slots)[flat].reshape(ndies, ntok, k)
    else:
        nhomes = np.array([len(h) for h in homes])
        table = np.full((len(homes), nhomes.max()), -1, np.int64)
        for e, h in enumerate(homes):
            table[e, : len(h)] = h
        src = np.arange(ndies)[:, None, None]
        tok = np.arange(ntok)[None, :, None]
        copy = (src + tok) % nhomes[picks]  # copies of an expert share its tokens round robin
        dest = table[picks, copy]
    tokens = token_copies(dest, dies, copies)
    np.add.at(per_die, dest.ravel(), 1)
    if shared_dies:  # each token also visits one shared-expert die (round robin by source die), once
        target = np.asarray(shared_dies)[np.arange(ndies) % len(shared_dies)]
        tokens[np.arange(ndies), target] += ntok
        np.add.at(per_die, target, ntok)
    return tokens, per_die


def simulate_step(loaded: LoadedSystem, dep: Deployment, model: str = "deepseek-r1", batch: float | None = None,
                  kv: int = 4096, batch_tokens: int | None = None, seq: int = 4096, mtp: int | None = None,
                  mtp_acceptance: float | None = None, microbatches: int | None = None, eplb: str | None = None,
                  routing: str = "uniform", seed: int = 0, chip_cost: ChipCost | None = None,
                  fidelity: str = "flow", check_fit: bool = True, kv_min: int | None = None) -> StepResult:
    """One decode step (``batch`` sequences per NPU at context ``kv``) or prefill step
    (``batch_tokens`` per NPU of ``seq``-token prompts); flags override the deployment.
    ``kv_min`` (decode): the sequences' contexts are spread uniformly over ``[kv_min, 2 kv -
    kv_min]`` (mean ``kv``; e.g. 2K prompts midway through 2K outputs), drawn per sequence
    (seeded), so dies' attention differs and the slowest die's sets the pace (each die's
    attention interpolated linearly in its mean context between chip costs at ``kv`` and at the
    top of the range); None: every sequence at ``kv``.
    ``check_fit=False`` times a step whose KV would not fit (a serving run's cost table, whose
    own KV manager enforces the capacity)."""
    s = loaded.system
    cfg = get_config(model)
    if not (cfg.is_mla and cfg.num_experts > 0):
        raise ConfigError(f"--model {model}: the multi-NPU step models DeepSeek-V3/R1's layer (MLA attention, routed "
                          f"and shared experts) only; {cfg.name} ({cfg.family}) cannot be placed on a system yet")
    if dep.phase == "decode" and kv < 1:
        raise ConfigError(f"--kv {kv}: a decode step attends to at least one cached token")
    dep = dep.overridden(mtp=mtp, mtp_acceptance=mtp_acceptance, microbatches=microbatches, eplb=eplb)
    if dep.microbatches == 2 and dep.overlap == "core_split" and set(dep.core_split) != {"attention", "moe"}:
        raise ConfigError("--microbatches 2 needs the mapping's core_split (attention and moe core shares) "
                          "or overlap: dma")
    dpn = s.npu.dies
    if dep.npus > s.num_npus:
        raise ConfigError(f"mapping: npus {dep.npus} but {s.name} has {s.num_npus} NPUs (use a bigger --nodes or system)")
    dies = dep.npus * dpn
    shared = [] if dep.shared_expert.mode != "dedicated" else list(range(dies - dep.shared_expert.degree, dies))
    expert_dies = dies - len(shared)
    chip = loaded.chip
    cc = chip_cost or ChipCost(chip)
    ncores = chip.num_cores
    mb = dep.microbatches
    if mb == 2 and (batch or 0) / dpn < 2 and dep.phase == "decode":
        mb = 1  # fewer than two sequences on a die: no second microbatch to overlap with
    split = mb == 2 and dep.overlap == "core_split"  # two core shares; else all cores, one stream
    att_cores = dep.core_split["attention"].cube if split else ncores
    moe_cores = dep.core_split["moe"].cube if split else ncores
    att_t, att_cfg = _attention_tp(cfg, dep, dies)
    layers = cfg.first_dense_layers + 1
    if dep.phase == "decode":
        if batch is None or batch <= 0:
            raise ConfigError("--batch: sequences per NPU, a positive number, is needed for a decode step")
        q_len = 1 + dep.mtp
        seqs_die = batch / dpn
        tokens_die = seqs_die * q_len
        seqs_mb = max(1, int(round(seqs_die / mb)))

        def decode_graph(model, seqs, kv_len):
            return build_graph(model, "decode", batch=seqs, seq_len=q_len, kv_len=kv_len, precision="a8w8",
                               layers=layers)
        graph = decode_graph(cfg, seqs_mb, kv)
        att_graph = graph if att_t == 1 else decode_graph(att_cfg, seqs_mb * att_t, kv)
        kv_tokens = kv
    else:
        if batch_tokens is None or batch_tokens <= 0:
            raise ConfigError("--batch-tokens: prompt tokens per NPU, a positive number, is needed for a prefill step")
        tokens_die = batch_tokens / dpn

        def prefill_graph(model, tokens):
            q = min(seq, int(tokens)) or 1
            return build_graph(model, "prefill", batch=max(1, int(round(tokens / q))), seq_len=q, kv_len=q,
                               precision="a8w8", layers=layers)
        graph = prefill_graph(cfg, tokens_die / mb)
        att_graph = graph if att_t == 1 else prefill_graph(att_cfg, tokens_die * att_t / mb)  # the group's prompts
        seqs_die = tokens_die / seq
        kv_tokens = seq
    moe_layer = cfg.first_dense_layers
    attention = cc.graph(_layer_subgraph(att_graph, moe_layer, "moe.route"), cores=att_cores)
    att_die_us = np.full(dies, attention.time_us)  # each die's attention block (one microbatch)
    if kv_min is not None and dep.phase == "decode":
        if not 0 < kv_min < kv:
            raise ConfigError(f"--kv-min {kv_min}: the shortest context, between 0 and --kv {kv} (the mean)")
        kv_hi = 2 * kv - kv_min
        top = cc.graph(_layer_subgraph(decode_graph(att_cfg, seqs_mb * att_t, kv_hi), moe_layer, "moe.route"),
                       cores=att_cores)
        rng = np.random.default_rng([seed, 1])
        per_group = max(1, int(round(seqs_die * att_t)))
        means = rng.uniform(kv_min, kv_hi, size=(dies // att_t, per_group)).mean(axis=1).repeat(att_t)
        att_die_us = np.maximum(0.0, attention.time_us + (top.time_us - attention.time_us) * (means - kv) / (kv_hi - kv))
    if not cfg.first_dense_layers:
        dense = None
    elif att_t == 1:
        dense = cc.graph(_layer_subgraph(graph, 0), cores=ncores)
    else:  # the dense layer's attention as the group splits it, its FFN on the die's own tokens
        dense = [cc.graph(_layer_subgraph(att_graph, 0, "mlp_norm"), cores=ncores),
                 cc.graph(_layer_subgraph(graph, 0, after="mlp_norm"), cores=ncores)]
    tokens_mb = int(round(tokens_die / mb))
    lm_tokens = int(round(seqs_die * (1 + dep.mtp))) if dep.phase == "decode" else int(round(seqs_die))
    # the LM head in bf16 (W8A8 recipes keep it in floating point, as npusim.model.builder does)
    lm_head = cc.gemm(max(1, lm_tokens), cfg.hidden_size, cfg.vocab_size, "bf16", cores=ncores)
    mtp_module_us = 0.0  # the MTP module besides its decoder layer: eh_proj over the step's tokens, its own head pass
    if dep.phase == "decode" and dep.mtp > 0:
        eh_proj = cc.gemm(max(1, lm_tokens), 2 * cfg.hidden_size, cfg.hidden_size, "int8", cores=ncores)
        draft_head = cc.gemm(max(1, int(round(seqs_die * dep.mtp))), cfg.hidden_size, cfg.vocab_size, "bf16",
                             cores=ncores)
        mtp_module_us = eh_proj.time_us + draft_head.time_us

    # memory check: KV of the die's sequences and the weights a die holds
    kv_gb = seqs_die * att_t * kv_tokens * kv_bytes_per_token(cfg) / 2**30  # attention TP: the group's KV on each
    weights_gb = weights_per_die_gb(cfg, dep)
    hbm_gb = summarize(chip).hbm_gb
    if check_fit and kv_gb + weights_gb > hbm_gb:
        raise ConfigError(f"batch does not fit: {kv_gb:.1f} GB of KV cache + {weights_gb:.1f} GB of weights per die "
                          f"> {hbm_gb:g} GB of HBM (fewer sequences per NPU, or a shorter --kv)")

    # routing: the die's tokens of each microbatch pick top-k experts
    load_w = expert_weights(routing, cfg.num_experts, seed)
    picks = route_tokens(dies, tokens_mb, cfg.experts_per_token, cfg.num_experts, load_w, seed)
    homes = _expert_placement(cfg, dep, expert_dies, np.bincount(picks.ravel(), minlength=cfg.num_experts))
    copies = s.moe_operators.decode_copies if dep.phase == "decode" else s.moe_operators.prefill_copies
    tokens, per_die = _traffic(picks, homes, shared, dies, dep.eplb, copies)
    expert_ps = {}

    def expert_time_ps(n_tok: int, d: int) -> int:
        if n_tok <= 0:
            return 0
        key = (_pad(n_tok), d in shared)
        if key not in expert_ps:
            m = key[0]
            width = cfg.moe_intermediate_size * (cfg.num_shared_experts if key[1] else 1)
            up = cc.gemm(m, cfg.hidden_size, 2 * width, "int8", cores=moe_cores)
            down = cc.gemm(m, width, cfg.hidden_size, "int8", cores=moe_cores)
            expert_ps[key] = int(round((up.time_us + down.time_us) * PS_PER_US))
        return expert_ps[key]

    # experts per die: a die's token count is split over its routed experts (per_die of them)
    per_expert = np.ceil(per_die / np.where(np.isin(np.arange(dies), shared), 1, dep.routed_experts.per_die))
    moe_ps = np.array([expert_time_ps(int(per_expert[d]), d) * (1 if d in shared else dep.routed_experts.per_die)
                       for d in range(dies)], np.int64)
    shared_ps, group = _shared_expert_cost(cfg, dep, cc, tokens_mb, moe_cores, dies)
    att_bytes = _group_bytes(dies, att_t, tokens_mb * 2 * cfg.hidden_size)  # bf16 activations each way

    sim = SystemSim(loaded, fidelity)
    w = WorkBuilder(sim)
    topo = loaded.topology
    ranks = np.asarray([topo.index[n] for n in topo.die_names[:dies]], np.int64)
    disp_bytes = tokens * dispatch_bytes_per_token(cfg.hidden_size, "int8")
    comb_bytes = tokens.T * combine_bytes_per_token(cfg.hidden_size)
    np.fill_diagonal(disp_bytes, 0)
    np.fill_diagonal(comb_bytes, 0)
    ops = s.moe_operators
    half_other_ps = int(round(ops.other_kernels_us / 2 * PS_PER_US))
    att_ps = np.round(att_die_us * PS_PER_US).astype(np.int64) + half_other_ps
    disp_ps = int(round(ops.dispatch_overhead_us * PS_PER_US)) + half_other_ps
    comb_ps = int(round(ops.combine_overhead_us * PS_PER_US))
    moe_unit = "moe" if split else "compute"
    via = "sdma" if mb == 2 and dep.overlap == "dma" else "aiv"
    done = [[-1] * dies for _ in range(mb)]
    marks = []  # per layer: ([(dispatch ids, combine ids, shared-expert TP ids) per microbatch], layer end barrier)

    def attention_and_dispatch(m: int) -> dict:
        # attention TP: the group's inputs all-gathered before, the outputs reduce-scattered after
        in_ids, inputs = matrix_transfers(w, ranks, att_bytes, via, done[m])
        att = [w.compute(int(ranks[d]), int(att_ps[d]), inputs[d] + ([done[m][d]] if done[m][d] >= 0 else []))
               for d in range(dies)]
        out_ids, outputs = matrix_transfers(w, ranks, att_bytes, via, att)
        disp_start = [w.compute(int(ranks[d]), disp_ps, [att[d]] + outputs[d], unit=moe_unit) for d in range(dies)]
        gather_ids, gathered = matrix_transfers(w, ranks, group["gather_bytes"], via, att)
        disp_ids, into = matrix_transfers(w, ranks, disp_bytes, via, disp_start)
        return dict(disp_start=disp_start, gather_ids=gather_ids, gathered=gathered, disp_ids=disp_ids, into=into,
                    att_comm=np.concatenate([in_ids, out_ids]))

    def experts_and_combine(m: int, a: dict) -> tuple:
        # the shared expert runs while the dispatch is in flight (its tokens are the die's own, or
        # under TP its group's, all-gathered after attention)
        shared_ids = [w.compute(int(ranks[d]), int(shared_ps), a["gathered"][d] + [a["disp_start"][d]], unit=moe_unit)
                      if shared_ps else a["disp_start"][d] for d in range(dies)]
        exp_ids = [w.compute(int(ranks[e]), int(moe_ps[e]), a["into"][e] + [shared_ids[e]], unit=moe_unit)
                   for e in range(dies)]
        scatter_ids, scattered = matrix_transfers(w, ranks, group["scatter_bytes"], via, shared_ids)
        comb_start = [w.compute(int(ranks[e]), comb_ps, [exp_ids[e]], unit=moe_unit) for e in range(dies)]
        comb_ids, back = matrix_transfers(w, ranks, comb_bytes, via, comb_start)
        for d in range(dies):
            done[m][d] = w.barrier(back[d] + scattered[d] + [exp_ids[d]])
        return a["disp_ids"], comb_ids, np.concatenate([a["gather_ids"], scatter_ids]), a["att_comm"]

    for layer in range(SIM_LAYERS):
        if split or mb == 1:  # each microbatch's MoE stream in order, beside the attention stream
            layer_marks = [experts_and_combine(m, attention_and_dispatch(m)) for m in range(mb)]
        else:  # one stream (overlap: dma): attention of both microbatches, then their experts, while
            # the SDMA engines move one microbatch's tokens under the other's compute
            started = [attention_and_dispatch(m) for m in range(mb)]
            layer_marks = [experts_and_combine(m, a) for m, a in enumerate(started)]
        end = w.barrier([done[m][d] for m in range(mb) for d in range(dies)])
        marks.append((layer_marks, end))
    w.submit()
    sim.run()
    tt = sim.engine.tt
    ends = [int(tt.end[end]) for _, end in marks]
    layer_ps = ends[-1] - ends[-2] if SIM_LAYERS > 1 else ends[0]

    def span_us(ids):
        return float((tt.end[ids].max() - tt.start[ids].min()) / PS_PER_US) if ids.shape[0] else 0.0

    last = marks[-1][0]
    other_us = mb * ops.other_kernels_us
    dispatch_us = sum(span_us(lm[0]) for lm in last) + mb * ops.dispatch_overhead_us
    combine_us = sum(span_us(lm[1]) for lm in last) + mb * ops.combine_overhead_us
    moe_us = float((moe_ps + shared_ps).max() * mb / PS_PER_US)
    shared_comm_us = sum(span_us(lm[2]) for lm in last)
    att_comm_us = sum(span_us(lm[3]) for lm in last)
    att_us = float(att_die_us.max()) * mb  # the slowest die's
    layer_us = layer_ps / PS_PER_US
    parts = att_us + moe_us + dispatch_us + combine_us + shared_comm_us + att_comm_us + other_us
    breakdown = {"attention": att_us, "moe_compute": moe_us, "dispatch": dispatch_us, "combine": combine_us,
                 "shared_expert_comm": shared_comm_us, "attention_comm": att_comm_us, "other_kernels": other_us,
                 "other": max(0.0, layer_us - parts), "overlap_hidden": max(0.0, parts - layer_us)}
    n_moe = cfg.num_layers - cfg.first_dense_layers + (1 if dep.mtp > 0 else 0)  # the MTP module is a MoE layer
    dense_parts = dense if isinstance(dense, list) else [dense] if dense else []
    dense_us = (sum(d.time_us for d in dense_parts) + ops.other_kernels_us) * mb * cfg.first_dense_layers
    step_parts_us = {"dense_layers": dense_us, "moe_layers": n_moe * layer_us, "lm_head": lm_head.time_us,
                     "mtp_module": mtp_module_us, "step_overhead": dep.step_overhead_us}
    step_us = sum(step_parts_us.values())
    tokens_step = 1 + dep.mtp * dep.mtp_acceptance if dep.phase == "decode" else 1.0
    per_npu_tokens = (batch * tokens_step) if dep.phase == "decode" else batch_tokens
    tokens_per_s = per_npu_tokens / (step_us / 1e6)
    received = per_die[:expert_dies]
    return StepResult(
        system=s.name, model=cfg.name, phase=dep.phase, npus=dep.npus, dies=dies,
        batch_per_npu=float(batch if dep.phase == "decode" else seqs_die * dpn), batch_per_die=float(seqs_die),
        tokens_per_step=tokens_step, step_ms=step_us / 1e3,
        tpot_ms=step_us / 1e3 / tokens_step if dep.phase == "decode" else step_us / 1e3,
        tokens_per_s_per_npu=tokens_per_s, layer_us=layer_us,
        breakdown_us={k: round(v, 3) for k, v in breakdown.items()},
        step_breakdown_ms={k: round(v / 1e3, 4) for k, v in step_parts_us.items()}, microbatches=mb, mtp=dep.mtp,
        mtp_acceptance=dep.mtp_acceptance, eplb=dep.eplb, kv_gb_per_die=kv_gb, weights_gb_per_die=weights_gb,
        imbalance=float(received.max() / received.mean()) if received.mean() > 0 else 1.0,
        attention_imbalance=float(att_die_us.max() / att_die_us.mean()),
        chip_cost=cc.stats.as_dict(),
    )


def _attention_tp(cfg, dep: Deployment, dies: int):
    """The attention TP degree and the model as one die of a group sees it (its share of the heads)."""
    if dep.attention.mode != "tp" or dep.attention.degree == 1:
        return 1, cfg
    t = dep.attention.degree
    if dies % t or cfg.num_heads % t:
        raise ConfigError(f"mapping: attention tp {t} must divide the instance's {dies} dies and the model's "
                          f"{cfg.num_heads} heads")
    return t, _heads_share(cfg, t)


def _heads_share(cfg, t: int):
    """The model as one of ``t`` dies splitting its attention heads sees it."""
    if t == 1:
        return cfg
    return replace(cfg, num_heads=max(1, cfg.num_heads // t), num_kv_heads=max(1, cfg.num_kv_heads // t))


def _group_bytes(dies: int, t: int, per_peer: int) -> np.ndarray:
    """``bytes[i, j]``: ``per_peer`` between different dies of the same group of ``t`` consecutive dies."""
    same = (np.arange(dies)[:, None] // t == np.arange(dies)[None, :] // t) & ~np.eye(dies, dtype=bool)
    return np.where(same, per_peer, 0).astype(np.int64)


def _shared_expert_cost(cfg, dep: Deployment, cc: ChipCost, tokens_mb: int, cores: int, dies: int):
    """The shared expert on every die for one microbatch, unless dedicated dies hold it
    (``dedicated``: costed there as a routed destination, 0 here). ``dp``: each die computes the
    whole shared FFN for its own ``tokens_mb`` tokens. ``tp: T``: groups of T consecutive dies
    (the dies of a node when T is the node's size) split its intermediate dimension: each die
    all-gathers its group's tokens (INT8 with their scales, as dispatched), computes its 1/T slice
    for all of them, and sends each peer the BF16 partial sums of the peer's tokens (the
    reduce-scatter; the adds ride on the combine). Returns the compute time (ps) per die and the
    group's ``gather_bytes`` / ``scatter_bytes`` matrices (die x die)."""
    zero = np.zeros((dies, dies), np.int64)
    mode, t = dep.shared_expert.mode, dep.shared_expert.degree
    if mode == "dedicated" or cfg.num_shared_experts <= 0 or tokens_mb <= 0:
        return 0, {"gather_bytes": zero, "scatter_bytes": zero}
    t = t if mode == "tp" else 1
    if dies % t:
        raise ConfigError(f"mapping: shared_expert tp {t} does not divide the instance's {dies} dies")
    width = cfg.moe_intermediate_size * cfg.num_shared_experts
    if width % t:
        raise ConfigError(f"mapping: shared_expert tp {t} does not divide the shared FFN width {width}")
    m = _pad(tokens_mb * t)
    up = cc.gemm(m, cfg.hidden_size, 2 * width // t, "int8", cores=cores)
    down = cc.gemm(m, width // t, cfg.hidden_size, "int8", cores=cores)
    gather = _group_bytes(dies, t, tokens_mb * dispatch_bytes_per_token(cfg.hidden_size, "int8"))
    scatter = _group_bytes(dies, t, tokens_mb * combine_bytes_per_token(cfg.hidden_size))
    return int(round((up.time_us + down.time_us) * PS_PER_US)), {"gather_bytes": gather, "scatter_bytes": scatter}


def kv_bytes_per_token(cfg) -> int:
    """Bytes of KV cache one token keeps over all layers, in BF16: MLA keeps the compressed latent
    (``kv_lora_rank``) and the decoupled RoPE key (``qk_rope_head_dim``) per layer; other
    attention keeps K and V of every KV head."""
    per_layer = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) if cfg.is_mla else 2 * cfg.num_kv_heads * cfg.head_dim
    return per_layer * 2 * cfg.num_layers


def weights_per_die_gb(cfg, dep: Deployment) -> float:
    """Weights a die holds (INT8; embedding and LM head bf16): attention of every layer (``dp``: a
    full copy; ``tp: T``: its heads' share, the low-rank down-projections whole), the dense FFNs
    (``dp``: full; ``tp: T``: 1/T), its routed experts of every MoE layer, the shared expert
    (``dp``: full; ``tp: T``: 1/T; ``dedicated``: on its own dies, not counted here), the
    embedding (full) and the LM head (``dp``: full; ``tp: T``: 1/T)."""
    h = cfg.hidden_size
    att_t = dep.attention.degree if dep.attention.mode == "tp" else 1
    graph = build_graph(_heads_share(cfg, att_t), "decode", batch=1, seq_len=1, kv_len=2, precision="a8w8",
                        layers=cfg.first_dense_layers + 1)
    att = sum(op.weight_bytes for op in graph.ops if op.layer == cfg.first_dense_layers and ".attn." in op.name)
    dense = sum(op.weight_bytes for op in graph.ops if op.layer == 0 and ".mlp." in op.name)
    dense /= dep.dense_ffn.degree if dep.dense_ffn.mode == "tp" else 1
    expert = 3 * h * cfg.moe_intermediate_size
    moe_layers = cfg.num_layers - cfg.first_dense_layers
    shared = expert * cfg.num_shared_experts * moe_layers
    shared = {"dp": shared, "tp": shared / dep.shared_expert.degree}.get(dep.shared_expert.mode, 0)
    emb = 2 * cfg.vocab_size * h * (1 + 1 / (dep.lm_head.degree if dep.lm_head.mode == "tp" else 1))  # bf16
    total = att * cfg.num_layers + dense * cfg.first_dense_layers + expert * dep.routed_experts.per_die * moe_layers \
        + shared + emb
    return total / 2**30
