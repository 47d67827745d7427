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

from copy import deepcopy
from dataclasses import dataclass, field, fields, replace

import numpy as np

from npusim.arch import summarize
from npusim.errors import ConfigError
from npusim.model.builder import build_graph
from npusim.model.zoo import get_config
from npusim.system.chipcost import ChipCost
from npusim.mapping.deployment import Deployment
from npusim.system.load import LoadedSystem
from npusim.system.moe import (combine_bytes_per_token, dispatch_bytes_per_token, expert_weights, pad_rows,
                               route_tokens, token_copies)
from npusim.system.execute import time_workload
from npusim.system.workload import Workload

SIM_LAYERS = 2
EPLB_SAMPLE_SEED = 7919  # offsets the seed of the routing sample greedy EPLB places experts by
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
    plan: dict = field(default_factory=dict)  # the deployment in plan keys (npusim.system.plan)
    calibrated_ms: float = 0.0  # the step's time in calibrated constants (small kernels, operator overheads, step overhead)
    calibrated_share: float = 0.0  # calibrated_ms / step_ms
    fidelity: dict = field(default_factory=dict)  # the chip costs' memory and NoC fidelity, the fabric's
    note: str = PARTIAL_NOTE
    workload: Workload | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "workload"}
        return deepcopy(d)

    def metric(self, name: str) -> float:
        """A field by name, or ``dispatch_us_per_call`` / ``combine_us_per_call`` (one operator
        call's span: a layer's breakdown over its microbatches) or their sum,
        ``dispatch_combine_us_per_call``."""
        if name == "dispatch_combine_us_per_call":
            return self.metric("dispatch_us_per_call") + self.metric("combine_us_per_call")
        if name in ("dispatch_us_per_call", "combine_us_per_call"):
            return self.breakdown_us[name.split("_")[0]] / self.microbatches
        return getattr(self, name)


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
    att_t = _attention_tp(cfg, dep, dies)
    if dep.phase == "decode":
        if batch is None or batch <= 0:
            raise ConfigError("--batch: sequences per NPU, a positive number, is needed for a decode step")
        q_len = 1 + dep.mtp
        seqs_die = batch / dpn
        tokens_die = seqs_die * q_len
        seqs_mb = max(1, int(round(seqs_die / mb)))

        def decode_args(seqs: int) -> dict:
            return {"phase": "decode", "batch": seqs, "seq_len": q_len, "kv_len": kv}
        graph_args = decode_args(seqs_mb)
        att_graph_args = {**decode_args(seqs_mb * att_t), "heads_split": att_t}
        kv_tokens = kv
    else:
        if batch_tokens is None or batch_tokens <= 0:
            raise ConfigError("--batch-tokens: prompt tokens per NPU, a positive number, is needed for a prefill step")
        tokens_die = batch_tokens / dpn

        def prefill_args(tokens: float) -> dict:
            q = min(seq, int(tokens)) or 1
            return {"phase": "prefill", "batch": max(1, int(round(tokens / q))), "seq_len": q, "kv_len": q}
        graph_args = prefill_args(tokens_die / mb)
        att_graph_args = {**prefill_args(tokens_die * att_t / mb), "heads_split": att_t}  # the group's prompts
        seqs_die = tokens_die / seq
        kv_tokens = seq
        q_len = seq
    moe_layer = cfg.first_dense_layers
    # routing: the die's tokens of each microbatch pick top-k experts
    tokens_mb = int(round(tokens_die / mb))
    load_w = expert_weights(routing, cfg.num_experts, seed)
    picks = route_tokens(dies, tokens_mb, cfg.experts_per_token, cfg.num_experts, load_w, seed)
    # greedy EPLB places experts by the load of an earlier routing sample (as deployments do, from
    # the loads they observed), not by this step's own routing, which no deployment knows ahead
    observed = route_tokens(dies, tokens_mb, cfg.experts_per_token, cfg.num_experts, load_w, seed + EPLB_SAMPLE_SEED)
    homes = _expert_placement(cfg, dep, expert_dies, np.bincount(observed.ravel(), minlength=cfg.num_experts))
    copies = s.moe_operators.decode_copies if dep.phase == "decode" else s.moe_operators.prefill_copies
    tokens, per_die = _traffic(picks, homes, shared, dies, dep.eplb, copies)

    # memory check: KV of the die's sequences and the weights a die holds
    kv_gb = seqs_die * att_t * kv_tokens * kv_bytes_per_token(cfg) / 2**30  # attention TP: the group's KV on each
    weights_gb = weights_per_die_gb(cfg, dep)
    hbm_gb = summarize(chip).hbm_gb
    if check_fit and kv_gb + weights_gb > hbm_gb:
        raise ConfigError(f"batch does not fit: {kv_gb:.1f} GB of KV cache + {weights_gb:.1f} GB of weights per die "
                          f"> {hbm_gb:g} GB of HBM (fewer sequences per NPU, or a shorter --kv)")

    shape = _Shapes(dep.phase, graph_args, att_graph_args, att_t, att_cores, moe_cores, ncores, moe_layer)
    kv_blend = None
    if kv_min is not None and dep.phase == "decode":
        if not 0 < kv_min < kv:
            raise ConfigError(f"--kv-min {kv_min}: the shortest context, between 0 and --kv {kv} (the mean)")
        kv_hi = 2 * kv - kv_min
        rng = np.random.default_rng([seed, 1])
        per_group = max(1, int(round(seqs_die * att_t)))
        means = rng.uniform(kv_min, kv_hi, size=(dies // att_t, per_group)).mean(axis=1).repeat(att_t)
        kv_blend = (kv_hi, (means - kv) / (kv_hi - kv))
    tokens_step = 1 + dep.mtp * dep.mtp_acceptance if dep.phase == "decode" else 1.0
    per_npu_tokens = (batch * tokens_step) if dep.phase == "decode" else batch_tokens
    n_moe = cfg.num_layers - cfg.first_dense_layers + (1 if dep.mtp > 0 else 0)  # the MTP module is a MoE layer
    lm_tokens = int(round(seqs_die * (1 + dep.mtp))) if dep.phase == "decode" else int(round(seqs_die))
    built = _build_workload(s, cfg, dep, shape, mb, split, dies, shared, tokens, per_die, tokens_mb, kv_blend,
                            lm_tokens, int(round(seqs_die * dep.mtp)), n_moe)
    wl = built.workload
    wl.meta.update(model=cfg.to_dict(), plan=deployment_plan(dep, dies, att_t, mb), phase=dep.phase,
                   batch=float(batch * dep.npus) if dep.phase == "decode" else float(seqs_die * dies),
                   seq_len=q_len if dep.phase == "decode" else seq, kv_len=kv_tokens,
                   tokens=float(per_npu_tokens * dep.npus), tokens_per_sequence=tokens_step, simulated_layers=SIM_LAYERS,
                   deployment=dep.model_dump(mode="json"))
    timing = time_workload(wl, loaded, cc, fidelity)
    k_us = timing.kernel_us
    node_start, node_end = timing.node_start_us, timing.node_end_us

    def span_us(nodes: list[int]) -> float:
        nodes = [n for n in nodes if n >= 0]
        return float(node_end[nodes].max() - node_start[nodes].min()) if nodes else 0.0

    marks = wl.meta["repeat"]["marks"]
    layer_us = float(node_end[marks[-1]] - node_end[marks[-2]])
    ops = s.moe_operators
    last = built.last_layer
    other_us = mb * ops.other_kernels_us
    k_dense = k_us[built.dense_kernel] + ops.other_kernels_us if cfg.first_dense_layers else 0.0
    dispatch_us = sum(span_us([lm["dispatch"]]) for lm in last) + mb * ops.dispatch_overhead_us
    combine_us = sum(span_us([lm["combine"]]) for lm in last) + mb * ops.combine_overhead_us
    moe_us = max(k_us[k] for k in built.expert_kernels) * mb
    shared_comm_us = sum(span_us([lm["gather"], lm["scatter"]]) for lm in last)
    att_comm_us = sum(span_us([lm["att_in"], lm["att_out"]]) for lm in last)
    att_die_us = np.array([k_us[k] for k in built.attention_kernels])
    att_us = float(att_die_us.max()) * mb  # the slowest die's
    parts = att_us + moe_us + dispatch_us + combine_us + shared_comm_us + att_comm_us + other_us
    breakdown = {"attention": att_us, "moe_compute": moe_us, "dispatch": dispatch_us, "combine": combine_us,
                 "shared_expert_comm": shared_comm_us, "attention_comm": att_comm_us, "other_kernels": other_us,
                 "other": max(0.0, layer_us - parts), "overlap_hidden": max(0.0, parts - layer_us),
                 # the layer's critical path through calibrated constants rather than simulated work
                 "calibrated": timing.period_breakdown_us.get("calibrated", 0.0)}
    step_parts_us = {"dense_layers": k_dense * mb * cfg.first_dense_layers, "moe_layers": n_moe * layer_us, "lm_head": k_us[built.lm_head_kernel],
                     "mtp_module": k_us[built.mtp_kernel] if built.mtp_kernel >= 0 else 0.0,
                     "step_overhead": dep.step_overhead_us}
    step_us = timing.step_us
    calibrated_us = timing.breakdown_us.get("calibrated", 0.0)  # on the step's critical path
    tokens_per_s = per_npu_tokens / (step_us / 1e6)
    received = per_die[:expert_dies]
    result = StepResult(
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
        chip_cost=cc.stats.as_dict(), plan=wl.meta["plan"], workload=wl,
        calibrated_ms=calibrated_us / 1e3, calibrated_share=calibrated_us / step_us if step_us else 0.0,
        fidelity={"chip_memory": cc.memory, "chip_noc": cc.noc, "fabric": fidelity},
    )
    return result


@dataclass(frozen=True)
class _Shapes:
    """The chip-cost shapes of one microbatch on a die: the layer graph arguments (the die's own
    tokens; ``att``: as the attention group splits the heads), the core shares, the MoE layer's index."""

    phase: str
    graph: dict
    att: dict
    att_t: int
    att_cores: int
    moe_cores: int
    cores: int
    moe_layer: int

    def layer(self, args: dict, layer: int, cores: int, **cut) -> dict:
        return {"type": "layer", "layer": layer, "precision": "a8w8", "cores": cores, **args, **cut}


@dataclass
class _Built:
    workload: Workload
    last_layer: list[dict]  # per microbatch of the last simulated layer: node ids by role
    attention_kernels: list[int]  # per die (without the small kernels' share)
    expert_kernels: list[int]  # per die: routed (or shared, on a dedicated die) experts plus the shared expert
    dense_kernel: int
    lm_head_kernel: int
    mtp_kernel: int


def _gemm(m: int, k: int, n: int, dtype: str, cores: int) -> dict:
    return {"type": "gemm", "m": int(m), "k": int(k), "n": int(n), "dtype": dtype, "cores": int(cores)}


def _build_workload(s, cfg, dep: Deployment, sh: _Shapes, mb: int, split: bool, dies: int, shared: list[int],
                    tokens: np.ndarray, per_die: np.ndarray, tokens_mb: int, kv_blend, lm_tokens: int,
                    draft_tokens: int, n_moe: int) -> _Built:
    """The step as a workload: the dense layers, two MoE layers (microbatches overlapping as the
    deployment says), the LM head, the MTP module and the step overhead, on every die of the instance."""
    wl = Workload(dies)
    K = wl.kernel
    ops = s.moe_operators
    src = f"{s.name} moe_operators: {ops.source}"
    half_other = K({"type": "fixed", "us": ops.other_kernels_us / 2, "source": ops.other_kernels_source or src})
    other = K({"type": "fixed", "us": ops.other_kernels_us, "source": ops.other_kernels_source or src})
    disp_over = K({"type": "fixed", "us": ops.dispatch_overhead_us, "source": src})
    comb_over = K({"type": "fixed", "us": ops.combine_overhead_us, "source": src})
    # attention (to the router) per die: every die the same, or blended by its sequences' mean context
    att = K(sh.layer(sh.att, sh.moe_layer, sh.att_cores, upto="moe.route"))
    att_k = [att] * dies
    if kv_blend is not None:
        top = K(sh.layer({**sh.att, "kv_len": kv_blend[0]}, sh.moe_layer, sh.att_cores, upto="moe.route"))
        att_k = [K({"type": "blend", "a": att, "b": top, "weight": float(w)}) for w in kv_blend[1]]
    disp_task = K({"type": "sum", "of": [disp_over, half_other]})
    # experts: a die's tokens split over its routed experts (per_die of them), rows padded to the cube's tile
    experts = dep.routed_experts.per_die
    per_expert = np.ceil(per_die / np.where(np.isin(np.arange(dies), shared), 1, experts))
    exp_k = []
    for d in range(dies):
        rows = pad_rows(int(per_expert[d]))
        if rows == 0:
            exp_k.append(K({"type": "sum", "of": []}))
            continue
        width = cfg.moe_intermediate_size * (cfg.num_shared_experts if d in shared else 1)
        up = K(_gemm(rows, cfg.hidden_size, 2 * width, "int8", sh.moe_cores))
        down = K(_gemm(rows, width, cfg.hidden_size, "int8", sh.moe_cores))
        exp_k.append(K({"type": "sum", "of": [up, down], "times": 1 if d in shared else experts}))
    shared_k, group = _shared_expert_kernel(cfg, dep, K, tokens_mb, sh.moe_cores, dies)
    att_bytes = _group_bytes(dies, sh.att_t, tokens_mb * 2 * cfg.hidden_size)  # bf16 activations each way
    disp_bytes = tokens * dispatch_bytes_per_token(cfg.hidden_size, "int8")
    comb_bytes = tokens.T * combine_bytes_per_token(cfg.hidden_size)
    np.fill_diagonal(disp_bytes, 0)
    np.fill_diagonal(comb_bytes, 0)
    moe_unit = "moe" if split else "compute"
    via = "sdma" if mb == 2 and dep.overlap == "dma" else "aiv"
    ranks = list(range(dies))

    def moves(matrix, deps, name, cat) -> int:
        return wl.transfers(ranks, matrix, deps, name, cat, via) if matrix.any() else -1

    # the dense layers, then the MoE stretch from a common start
    if cfg.first_dense_layers:
        if sh.att_t == 1:
            parts = [K(sh.layer(sh.graph, 0, sh.cores))]
        else:  # the dense layer's attention as the group splits it, its FFN on the die's own tokens
            parts = [K(sh.layer(sh.att, 0, sh.cores, upto="mlp_norm")), K(sh.layer(sh.graph, 0, sh.cores,
                                                                                   after="mlp_norm"))]
        dense = K({"type": "sum", "of": parts})
        for d in ranks:
            prev = -1
            for _ in range(mb * cfg.first_dense_layers):
                prev = wl.compute(d, dense, [prev], "dense_layer", "dense_layers")
                prev = wl.compute(d, other, [prev], "dense_layer.small_kernels", "calibrated")
    else:
        dense = K({"type": "sum", "of": []})
    start = wl.barrier(range(len(wl.nodes)), "moe_layers.start")
    done = [[start] * dies for _ in range(mb)]
    marks, last = [], []

    def attention_then_small_kernels(d: int, deps: list[int], tag: str) -> int:
        """The die's attention, then its share of the layer's small kernels (a calibrated time)."""
        att_node = wl.compute(d, att_k[d], deps, f"{tag}.attention", "attention")
        return wl.compute(d, half_other, [att_node], f"{tag}.small_kernels", "calibrated")

    def attention_and_dispatch(m: int, tag: str) -> dict:
        # attention TP: the group's inputs all-gathered before, the outputs reduce-scattered after
        att_in = moves(att_bytes, done[m], f"{tag}.attention_gather", "attention_comm")
        att_ids = [attention_then_small_kernels(d, [att_in, done[m][d]], tag) for d in ranks]
        att_out = moves(att_bytes, att_ids, f"{tag}.attention_scatter", "attention_comm")
        disp_start = [wl.compute(d, disp_task, [att_ids[d], att_out], f"{tag}.dispatch_launch",
                                 "calibrated", moe_unit) for d in ranks]
        gather = moves(group["gather_bytes"], att_ids, f"{tag}.shared_gather", "shared_expert_comm")
        disp = moves(disp_bytes, disp_start, f"{tag}.dispatch", "dispatch")
        return {"att_in": att_in, "att_out": att_out, "disp_start": disp_start, "gather": gather, "dispatch": disp}

    def experts_and_combine(m: int, a: dict, tag: str) -> dict:
        # the shared expert runs while the dispatch is in flight (its tokens are the die's own, or
        # under TP its group's, all-gathered after attention)
        shared_ids = [wl.compute(d, shared_k, [a["gather"], a["disp_start"][d]], f"{tag}.shared_expert",
                                 "moe_compute", moe_unit) if shared_k is not None else a["disp_start"][d]
                      for d in ranks]
        exp_ids = [wl.compute(e, exp_k[e], [a["dispatch"], shared_ids[e]], f"{tag}.experts",
                              "moe_compute", moe_unit) for e in ranks]
        scatter = moves(group["scatter_bytes"], shared_ids, f"{tag}.shared_scatter", "shared_expert_comm")
        comb_start = [wl.compute(e, comb_over, [exp_ids[e]], f"{tag}.combine_launch", "calibrated",
                                 moe_unit) for e in ranks]
        comb = moves(comb_bytes, comb_start, f"{tag}.combine", "combine")
        for d in ranks:
            done[m][d] = wl.barrier([comb, scatter, exp_ids[d]], f"{tag}.done", rank=d)
        return {**a, "scatter": scatter, "combine": comb}

    for layer in range(SIM_LAYERS):
        tags = [f"L{sh.moe_layer + layer}.mb{m}" for m in range(mb)]
        if split or mb == 1:  # each microbatch's MoE stream in order, beside the attention stream
            last = [experts_and_combine(m, attention_and_dispatch(m, tags[m]), tags[m]) for m in range(mb)]
        else:  # one stream (overlap: dma): attention of both microbatches, then their experts, while
            # the SDMA engines move one microbatch's tokens under the other's compute
            started = [attention_and_dispatch(m, tags[m]) for m in range(mb)]
            last = [experts_and_combine(m, a, tags[m]) for m, a in enumerate(started)]
        marks.append(wl.barrier([done[m][d] for m in range(mb) for d in ranks], f"L{sh.moe_layer + layer}.end"))
    # the LM head (bf16: W8A8 recipes keep it in floating point), the MTP module (eh_proj over the
    # step's tokens, its own head pass for the drafts), the step overhead
    lm_head = K(_gemm(max(1, lm_tokens), cfg.hidden_size, cfg.vocab_size, "bf16", sh.cores))
    mtp = -1
    if sh.phase == "decode" and dep.mtp > 0:
        mtp = K({"type": "sum", "of": [K(_gemm(max(1, lm_tokens), 2 * cfg.hidden_size, cfg.hidden_size, "int8",
                                               sh.cores)),
                                       K(_gemm(max(1, draft_tokens), cfg.hidden_size, cfg.vocab_size, "bf16",
                                               sh.cores))]})
    overhead = K({"type": "fixed", "us": dep.step_overhead_us, "source": dep.step_overhead_source or "mapping"})
    for d in ranks:
        t = wl.compute(d, lm_head, [marks[-1]], "lm_head", "lm_head")
        if mtp >= 0:
            t = wl.compute(d, mtp, [t], "mtp_module", "mtp_module")
        wl.compute(d, overhead, [t], "step_overhead", "calibrated")
    wl.meta["repeat"] = {"start": start, "marks": marks, "layers": n_moe}
    return _Built(wl, last, att_k, [_plus(wl, exp_k[d], shared_k) for d in ranks], dense, lm_head, mtp)


def _plus(wl: Workload, a: int, b: int | None) -> int:
    return a if b is None else wl.kernel({"type": "sum", "of": [a, b]})


def deployment_plan(dep: Deployment, dies: int, att_t: int, mb: int) -> dict:
    """The deployment in plan keys (:mod:`npusim.system.plan`): attention TP groups, DP over them,
    experts over the expert dies, one stage."""
    expert_dies = dies - (dep.shared_expert.degree if dep.shared_expert.mode == "dedicated" else 0)
    shared_tp = dep.shared_expert.degree if dep.shared_expert.mode == "tp" else 1
    return {"npus": dep.npus, "tp": att_t, "dp": dies // att_t, "ep": expert_dies, "pp": 1, "microbatches": mb,
            "precision": "w8a8", "kv_dtype": "bf16", "mtp": dep.mtp, "mtp_acceptance": dep.mtp_acceptance,
            "shared_tp": shared_tp}


def _attention_tp(cfg, dep: Deployment, dies: int) -> int:
    """The attention TP degree (groups of that many dies split the heads)."""
    if dep.attention.mode != "tp" or dep.attention.degree == 1:
        return 1
    t = dep.attention.degree
    if dies % t or cfg.num_heads % t:
        raise ConfigError(f"mapping: attention tp {t} must divide the instance's {dies} dies and the model's "
                          f"{cfg.num_heads} heads")
    return t


def _heads_share(cfg, t: int):
    """The model as one of ``t`` dies splitting its attention heads sees it."""
    if t == 1:
        return cfg
    return replace(cfg, num_heads=max(1, cfg.num_heads // t), num_kv_heads=max(1, cfg.num_kv_heads // t))


def _group_bytes(dies: int, t: int, per_peer: int) -> np.ndarray:
    """``bytes[i, j]``: ``per_peer`` between different dies of the same group of ``t`` consecutive dies."""
    same = (np.arange(dies)[:, None] // t == np.arange(dies)[None, :] // t) & ~np.eye(dies, dtype=bool)
    return np.where(same, per_peer, 0).astype(np.int64)


def _shared_expert_kernel(cfg, dep: Deployment, kernel, tokens_mb: int, cores: int, dies: int):
    """The shared expert on every die for one microbatch, unless dedicated dies hold it
    (``dedicated``: costed there as a routed destination, none here). ``dp``: each die computes the
    whole shared FFN for its own ``tokens_mb`` tokens. ``tp: T``: groups of T consecutive dies
    (the dies of a node when T is the node's size) split its intermediate dimension: each die
    all-gathers its group's tokens (INT8 with their scales, as dispatched), computes its 1/T slice
    for all of them, and sends each peer the BF16 partial sums of the peer's tokens (the
    reduce-scatter; the adds ride on the combine). Returns the kernel index (``kernel(spec)``
    adds a kernel; None: no shared expert here) and the group's ``gather_bytes`` / ``scatter_bytes``
    matrices (die x die)."""
    zero = np.zeros((dies, dies), np.int64)
    mode, t = dep.shared_expert.mode, dep.shared_expert.degree
    if mode == "dedicated" or cfg.num_shared_experts <= 0 or tokens_mb <= 0:
        return None, {"gather_bytes": zero, "scatter_bytes": zero}
    t = t if mode == "tp" else 1
    if dies % t:
        raise ConfigError(f"mapping: shared_expert tp {t} does not divide the instance's {dies} dies")
    width = cfg.moe_intermediate_size * cfg.num_shared_experts
    if width % t:
        raise ConfigError(f"mapping: shared_expert tp {t} does not divide the shared FFN width {width}")
    m = pad_rows(tokens_mb * t)
    up = kernel(_gemm(m, cfg.hidden_size, 2 * width // t, "int8", cores))
    down = kernel(_gemm(m, width // t, cfg.hidden_size, "int8", cores))
    gather = _group_bytes(dies, t, tokens_mb * dispatch_bytes_per_token(cfg.hidden_size, "int8"))
    scatter = _group_bytes(dies, t, tokens_mb * combine_bytes_per_token(cfg.hidden_size))
    return kernel({"type": "sum", "of": [up, down]}), {"gather_bytes": gather, "scatter_bytes": scatter}


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
