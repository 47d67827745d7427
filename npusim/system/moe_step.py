"""One serving step of a MoE model deployed by a deployment file (DeepSeek-V3/R1 on CloudMatrix384
or Atlas 800I A2: ``mappers/cm384-deepseek-*.yaml``, ``mappers/a2-deepseek-*.yaml``).

A deployment is a parallel plan (:mod:`npusim.system.plan`) with a phase and the system's
calibrated constants; this module turns it into one (:func:`deployment_plan`), builds the step with
the one system mapper (:func:`npusim.system.mapper.build_step`), times it
(:func:`npusim.system.execute.time_workload`) and reports the step the way the published
deployments are reported: TPOT, tokens/s per NPU, the MoE layer's period and where it goes, the
step's parts.

What one step is made of (each piece simulated, except the calibrated constants):

* per die, the **chip simulator** (through :class:`~npusim.system.chipcost.ChipCost`) times the
  attention block of each layer for the die's sequences (norms, MLA projections with weight
  absorption, attention over the KV cache read from HBM, the router), the routed (and shared)
  expert GEMMs for the tokens that actually arrive (padded to 16 rows, the cube's tile), the dense
  layers, the LM head and the MTP module -- on the die's core share (``core_split``);
* the **fabric** times dispatch and combine with the drawn routing's real token counts, and the
  attention group's reduce-scatter / all-gather;
* the layer's **small kernels** (norms, dynamic quantisation, RoPE, routing, the experts'
  activation, the final add) are simulated as work where the model has the op;
* the **runtime** is the system's (``runtime:``, :class:`~npusim.system.schema.Runtime`), added
  by :func:`~npusim.system.execute.time_workload` exactly as for a parallel plan: a graph replay
  (or eager host dispatch) per step, a launch per kernel (``launch``), the step's synchronize and
  the scheduler's time per step (``host``; a deployment file's ``step_overhead_us``, when given,
  replaces the system's ``runtime.scheduler_us``: one of the deployment's choices, not a second
  cost model);
* **calibrated constants** (the system's ``moe_operators`` per-call dispatch and combine overheads:
  the operators' synchronisation and bookkeeping on the die, calibrated on DeepEP-Ascend operator
  benchmarks) are ``fixed`` kernels filed under ``calibrated``; ``calibrated_share`` says how much
  of the step they are.

``breakdown_us`` is the step's critical path by category (summing to the step time, as on every
path); the repeated MoE layer's parts as the published reports give them are ``layer_breakdown_us``.

Not modelled (the output says so): a TLM L2 (the die's L2 serves GEMM operands and shared KV
through its analytical reuse model); the gating top-k and the router's fp32 cast as work (their
launches are counted).
"""

from __future__ import annotations

from copy import deepcopy
from dataclasses import dataclass, field, fields

import numpy as np

from npusim.arch import summarize
from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment
from npusim.model.zoo import get_config
from npusim.system.chipcost import ChipCost
from npusim.system.execute import StepRuntime, fixed_share, time_workload
from npusim.system.load import LoadedSystem
from npusim.system.mapper import GB_PER_GIB, Overheads, StepShape, build_step, memory_per_rank_gb
from npusim.system.plan import ParallelPlan, check_plan, default_plan
from npusim.system.workload import Workload

PARTIAL_NOTE = ("partial model: the die's L2 is a reuse-distance model of GEMM operand and shared-KV re-reads (a "
                "transaction-level cache with --memory tlm); the runtime (graph replay or eager dispatch, a launch "
                "per kernel, the scheduler) is the system's runtime section, as for any plan; dispatch/combine's "
                "per-call overheads are calibrated; see validation/deepseek_deployments.py")
#: added to a prefill step's note: its operators' per-call overheads are the decode kernels'. The one
#: published normal-kernel table (sgl-kernel-npu's README; its bytes are those of the script that printed
#: it, test_intranode.py) times a call at 4096 tokens per rank only, 3-8 ms and bandwidth-bound, so a fixed
#: per-call cost cannot be told apart from the kernels' bandwidth (published.yaml moe_normal_kernels)
PREFILL_NOTE = ("; prefill's dispatch/combine per-call overheads are the decode (low-latency) kernels': the normal "
                "kernels' published times are at one token count, bandwidth-bound, and fix no per-call cost "
                "(validation/moe_normal_kernels.py)")


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
    breakdown_us: dict  # the step's critical path by category (sums to the step; host and launch included)
    step_breakdown_ms: dict  # dense_layers, moe_layers (incl. the MTP module's layer), lm_head, mtp_module, scheduler
    microbatches: int
    mtp: int
    mtp_acceptance: float
    eplb: str
    kv_gb_per_die: float  # GB (10^9 bytes); kv_gib_per_die: the same in GiB
    weights_gb_per_die: float
    imbalance: float
    attention_imbalance: float  # slowest die's attention / the mean (1 unless contexts are spread: kv_min)
    chip_cost: dict
    plan: dict = field(default_factory=dict)  # the deployment in plan keys (npusim.system.plan)
    calibrated_ms: float = 0.0  # the step's time in calibrated constants (dispatch/combine per-call overheads)
    calibrated_share: float = 0.0  # calibrated_ms / step_ms
    kernel_launch_ms: float = 0.0  # the step's time in kernel launches (the runtime's ``launch`` on the critical path)
    host_ms: float = 0.0  # the step's time on the host (dispatch waited for, graph launch, scheduler)
    fixed_share: float = 0.0  # (host + launch + calibrated) / step: what is not simulated hardware work
    runtime: dict = field(default_factory=dict)  # the runtime mode and constants the step was timed with
    layer_breakdown_us: dict = field(default_factory=dict)  # the repeated MoE layer's parts (published reports' terms)
    fidelity: dict = field(default_factory=dict)  # the chip costs' memory and NoC fidelity, the fabric's
    note: str = PARTIAL_NOTE
    workload: Workload | None = field(default=None, repr=False, compare=False)
    kv_gib_per_die: float = 0.0
    weights_gib_per_die: float = 0.0

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
            return self.layer_breakdown_us[name.split("_")[0]] / self.microbatches
        return getattr(self, name)


def deployment_plan(dep: Deployment, cfg, dies_per_npu: int, microbatches: int | None = None) -> ParallelPlan:
    """The deployment's plan: its plan keys, the rest from :func:`~npusim.system.plan.default_plan`;
    ``microbatches`` overrides the file's (1 when a die has too few sequences for two: no overlap)."""
    keys = {k: v for k, v in dep.plan_keys().items() if k != "npus"}
    if microbatches is not None:
        keys["microbatches"] = microbatches
    if keys.get("microbatches", 1) == 1:
        keys.update(overlap="none", attention_cores=0, moe_cores=0)
    return default_plan(cfg, dep.npus, dies_per_npu, **keys)


def deployment_overheads(loaded: LoadedSystem, dep: Deployment) -> Overheads:
    """The fixed times a deployment's step carries besides the runtime: the system's MoE operators'
    calibrated per-call overheads (and the ``other_kernels_us`` what-if). The runtime (launches,
    host, scheduler) is added by :func:`~npusim.system.execute.time_workload`, as for any plan."""
    ops = loaded.system.moe_operators
    src = f"{loaded.system.name} moe_operators: {ops.source}"
    return Overheads(small_kernels_us=ops.other_kernels_us, dispatch_us=ops.dispatch_overhead_us,
                     combine_us=ops.combine_overhead_us, source=src,
                     small_kernels_source=ops.other_kernels_source or src)


def _shape(dep: Deployment, dies_per_npu: int, mb: int, batch, kv: int, batch_tokens, seq: int,
           kv_min: int | None) -> StepShape:
    """The step's sequences over the instance: decode ``batch`` per NPU at context ``kv``; prefill
    ``batch_tokens`` per NPU of ``seq``-token prompts (shorter chunks when a microbatch on a die has
    fewer tokens than a prompt)."""
    if dep.phase == "decode":
        if batch is None or batch <= 0:
            raise ConfigError("--batch: sequences per NPU, a positive number, is needed for a decode step")
        if kv < 1:
            raise ConfigError(f"--kv {kv}: a decode step attends to at least one cached token")
        return StepShape("decode", max(1, int(round(batch * dep.npus))), 1, kv, kv_min)
    if batch_tokens is None or batch_tokens <= 0:
        raise ConfigError("--batch-tokens: prompt tokens per NPU, a positive number, is needed for a prefill step")
    part = batch_tokens / dies_per_npu / mb  # a microbatch's tokens on a die
    if part < seq:
        return StepShape("prefill", dep.npus * dies_per_npu * mb, max(1, int(part)), max(1, int(part)))
    return StepShape("prefill", max(1, int(round(batch_tokens * dep.npus / seq))), seq, seq)


def simulate_step(loaded: LoadedSystem, dep: Deployment, model: str = "deepseek-r1", batch: float | None = None,
                  kv: int = 4096, batch_tokens: int | None = None, seq: int = 4096, mtp: int | None = None,
                  mtp_acceptance: float | None = None, microbatches: int | None = None, eplb: str | None = None,
                  routing: str = "uniform", seed: int = 0, chip_cost: ChipCost | None = None,
                  fidelity: str = "flow", check_fit: bool = True, kv_min: int | None = None,
                  runtime: str | None = None) -> StepResult:
    """One decode step (``batch`` sequences per NPU at context ``kv``) or prefill step
    (``batch_tokens`` per NPU of ``seq``-token prompts); flags override the deployment.
    ``kv_min`` (decode): contexts spread over ``[kv_min, 2 kv - kv_min]`` (see
    :class:`~npusim.system.mapper.StepShape`). ``check_fit=False`` times a step whose KV would not
    fit (a serving run's cost table, whose own KV manager enforces the capacity). ``runtime``:
    ``eager`` / ``graph`` (None: the system's default for the phase)."""
    s = loaded.system
    cfg = get_config(model)
    if not cfg.num_experts:
        raise ConfigError(f"--model {model}: a deployment file lays out a MoE model's experts; {cfg.name} is dense "
                          "(run it by a parallel plan: drop --mapping, or use a mapping with a 'plan:' section)")
    dep = dep.overridden(mtp=mtp, mtp_acceptance=mtp_acceptance, microbatches=microbatches, eplb=eplb)
    if dep.npus > s.num_npus:
        raise ConfigError(f"mapping: npus {dep.npus} but {s.name} has {s.num_npus} NPUs (use a bigger --nodes or system)")
    dpn = s.npu.dies
    dies = dep.npus * dpn
    mb = dep.microbatches or 1
    if mb > 1 and dep.phase == "decode" and (batch or 0) / dpn < mb:
        mb = 1  # fewer sequences on a die than microbatches: nothing to overlap with
    plan = deployment_plan(dep, cfg, dpn, mb)
    check_plan(plan, cfg, dpn, s.num_npus)
    ncores = loaded.chip.num_cores
    if plan.attention_cores > ncores or plan.moe_cores > ncores:
        raise ConfigError(f"mapping: core_split asks for {plan.attention_cores} / {plan.moe_cores} cube cores; the die "
                          f"has {ncores}")
    shape = _shape(dep, dpn, mb, batch, kv, batch_tokens, seq, kv_min)
    weights_gb, kv_gb = memory_per_rank_gb(cfg, plan, shape)
    hbm_gb = summarize(loaded.chip).hbm_gb
    if check_fit and kv_gb + weights_gb > hbm_gb:
        raise ConfigError(f"batch does not fit: {kv_gb * GB_PER_GIB:.1f} GB of KV cache + {weights_gb * GB_PER_GIB:.1f} "
                          f"GB of weights per die > {hbm_gb * GB_PER_GIB:.1f} GB of HBM ({hbm_gb:g} GiB; fewer "
                          "sequences per NPU, or a shorter --kv)")
    ops = s.moe_operators
    oh = deployment_overheads(loaded, dep)
    wl = build_step(cfg, plan, shape, dpn, routing, seed, ops.decode_copies if dep.phase == "decode" else
                    ops.prefill_copies, oh)
    wl.meta["deployment"] = dep.model_dump(mode="json")
    rt = StepRuntime.of(loaded, dep.phase, runtime, dep.step_overhead_us)
    cc = chip_cost or ChipCost(loaded.chip)
    timing = time_workload(wl, loaded, cc, fidelity, rt)
    layer_us, breakdown, parts = _layer_report(wl, timing, oh, plan.microbatches, rt)
    imbalance = parts.pop("attention_imbalance")
    step_us = timing.step_us
    tokens_step = wl.meta["tokens_per_sequence"]
    per_npu_tokens = wl.meta["tokens"] / dep.npus
    calibrated_us = timing.breakdown_us.get("calibrated", 0.0)  # on the step's critical path
    load = np.asarray(wl.meta.get("expert_load", [1]), float)[: dies - plan.shared_dies]
    seqs = shape.batch if dep.phase == "decode" else shape.batch * shape.seq_len / seq  # whole prompts in prefill
    note = PARTIAL_NOTE + (PREFILL_NOTE if dep.phase == "prefill" else "")
    return StepResult(
        system=s.name, model=cfg.name, phase=dep.phase, npus=dep.npus, dies=dies,
        batch_per_npu=seqs / dep.npus, batch_per_die=seqs / dies,
        tokens_per_step=tokens_step, step_ms=step_us / 1e3,
        tpot_ms=step_us / 1e3 / tokens_step if dep.phase == "decode" else step_us / 1e3,
        tokens_per_s_per_npu=per_npu_tokens / (step_us / 1e6), layer_us=layer_us,
        breakdown_us=timing.breakdown_us, layer_breakdown_us={k: round(v, 3) for k, v in breakdown.items()},
        step_breakdown_ms={k: round(v / 1e3, 4) for k, v in parts.items()}, microbatches=plan.microbatches,
        mtp=plan.mtp, mtp_acceptance=plan.mtp_acceptance, eplb=plan.eplb,
        kv_gb_per_die=kv_gb * GB_PER_GIB, weights_gb_per_die=weights_gb * GB_PER_GIB,
        kv_gib_per_die=kv_gb, weights_gib_per_die=weights_gb, imbalance=float(load.max() / load.mean()) if load.mean() > 0 else 1.0,
        attention_imbalance=imbalance, chip_cost=cc.stats.as_dict(), plan=plan.to_dict(),
        workload=wl, calibrated_ms=calibrated_us / 1e3, calibrated_share=calibrated_us / step_us if step_us else 0.0,
        kernel_launch_ms=timing.breakdown_us.get("launch", 0.0) / 1e3, host_ms=timing.breakdown_us.get("host", 0.0) / 1e3,
        fixed_share=round(fixed_share(timing.breakdown_us, step_us), 6), runtime=timing.runtime,
        fidelity={"chip_memory": cc.memory, "chip_noc": cc.noc, "fabric": fidelity}, note=note)


def _layer_report(wl: Workload, timing, oh: Overheads, mb: int, rt: StepRuntime) -> tuple[float, dict, dict]:
    """The repeated MoE layer's period and what it is made of (the last simulated layer's nodes:
    the slowest rank's attention and expert compute, the dispatch and combine spans with their
    local work (quantise and pack, reorder; the weighted sum) and per-call overheads, the TP and
    shared-expert communication, the kernel launches and host time on the layer's critical path;
    ``other`` / ``overlap_hidden``: what the parts leave over or hide under one another), and the
    step's parts (ms-level pieces: dense layers, MoE layers, LM head, MTP module, step overhead)."""
    start_us, end_us, node_us = timing.node_start_us, timing.node_end_us, timing.node_us
    repeat = wl.meta["repeat"]
    marks = repeat["marks"]
    layer_us = float(end_us[marks[-1]] - end_us[marks[-2]])
    prefix = wl.nodes[marks[-1]]["name"].removesuffix("end")  # "L<i>."
    per_rank: dict[str, dict[int, float]] = {}
    spans: dict[str, float] = {}
    for i, n in enumerate(wl.nodes):
        cat = n["category"]
        if n["kind"] == "compute":
            if n["name"].startswith(prefix) or cat in ("lm_head", "mtp_module"):
                acc = per_rank.setdefault(cat if n["name"].startswith(prefix) else "step." + cat, {})
                acc[n["rank"]] = acc.get(n["rank"], 0.0) + node_us[i]
        elif n["kind"] in ("transfers", "collective") and n["name"].startswith(prefix):
            spans[cat] = spans.get(cat, 0.0) + float(end_us[i] - start_us[i])

    def slowest(cat: str) -> float:
        return max(per_rank.get(cat, {0: 0.0}).values())
    att = per_rank.get("attention", {0: 1.0})
    breakdown = {"attention": slowest("attention"), "moe_compute": slowest("moe_compute"),
                 "dispatch": spans.get("dispatch", 0.0) + slowest("dispatch") + mb * oh.dispatch_us,
                 "combine": spans.get("combine", 0.0) + slowest("combine") + mb * oh.combine_us,
                 "shared_expert_comm": spans.get("shared_comm", 0.0), "attention_comm": spans.get("tp_comm", 0.0),
                 "other_kernels": mb * oh.small_kernels_us,
                 "launch": timing.period_breakdown_us.get("launch", 0.0),
                 "host": timing.period_breakdown_us.get("host", 0.0)}
    total = sum(breakdown.values())
    breakdown.update(other=max(0.0, layer_us - total), overlap_hidden=max(0.0, total - layer_us),
                     calibrated=timing.period_breakdown_us.get("calibrated", 0.0))
    parts = {"dense_layers": float(end_us[repeat["start"]]), "moe_layers": repeat["layers"] * layer_us,
             "lm_head": slowest("step.lm_head"), "mtp_module": slowest("step.mtp_module"), "scheduler": rt.scheduler_us + rt.sync_us,
             "attention_imbalance": float(max(att.values()) / (sum(att.values()) / len(att)))}
    return layer_us, breakdown, parts


def kv_bytes_per_token(cfg) -> int:
    """Bytes of KV cache one token keeps over all layers, in BF16: MLA keeps the compressed latent
    (``kv_lora_rank``) and the decoupled RoPE key (``qk_rope_head_dim``) per layer; other
    attention keeps K and V of every KV head."""
    per_layer = (cfg.kv_lora_rank + cfg.qk_rope_head_dim) if cfg.is_mla else 2 * cfg.num_kv_heads * cfg.head_dim
    return per_layer * 2 * cfg.num_layers


def weights_per_die_gb(cfg, dep: Deployment, dies_per_npu: int) -> float:
    """Weights the busiest die of the deployment holds, GiB (:func:`~npusim.system.mapper.memory_per_rank_gb`)."""
    plan = deployment_plan(dep, cfg, dies_per_npu)
    return memory_per_rank_gb(cfg, plan, StepShape(dep.phase, plan.dp * plan.microbatches, 1, 1))[0]
