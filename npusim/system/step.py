"""One step of any model on a system under a parallel plan: map, check memory, time, summarise.

:func:`simulate_plan_step` is the library entry ``npusim run --system`` (without a DeepSeek
deployment file) and ``npusim plan`` call; :func:`summarize_timing` turns a timed workload (built
here or loaded from ``--save-workload``) into the result keys: ``step_ms``, ``tpot_ms`` (decode) or
``ttft_ms`` (prefill: the batch's prompts all arrive together), ``tokens_per_s_per_npu`` (output
tokens of decode, prompt tokens of prefill, per NPU of the instance), ``breakdown_us`` (the
critical path by category, with ``host`` and ``launch``: :mod:`npusim.system.execute`),
``fixed_share`` (host + launch + calibrated over the step), ``runtime`` (mode and constants),
``plan``, memory per die.
"""

from __future__ import annotations

from npusim.arch import summarize
from npusim.errors import ConfigError
from npusim.model.zoo import get_config
from npusim.system.chipcost import ChipCost
from npusim.system.execute import StepRuntime, WorkloadTiming, fixed_share, time_workload
from npusim.system.load import LoadedSystem
from npusim.system.mapper import (GB_PER_GIB, StepShape, build_onnx_step, build_step, memory_figures,
                                  memory_per_rank_gb)
from npusim.system.plan import ParallelPlan, check_plan, default_plan
from npusim.system.workload import Workload

NOTE = ("derived step: every kernel timed by the chip simulator, every collective and MoE transfer by the fabric "
        "model, the system's runtime (eager host dispatch or a graph replay, a launch per kernel, the scheduler's "
        "time per step: runtime.sources) added the same way on every path; not modelled on this path: the "
        "embedding lookup")


def check_fit(cfg, plan: ParallelPlan, shape: StepShape, hbm_gb: float) -> tuple[float, float]:
    """(weights, KV) GiB per die; ConfigError when they do not fit the die's HBM (``hbm_gb``: the
    chip's capacity, in GiB as the arch file gives it)."""
    weights, kv = memory_per_rank_gb(cfg, plan, shape)
    if weights + kv > hbm_gb:
        raise ConfigError(f"plan does not fit: {weights * GB_PER_GIB:.1f} GB of weights + {kv * GB_PER_GIB:.1f} GB of "
                          f"KV cache per die > {hbm_gb * GB_PER_GIB:.1f} GB of HBM ({hbm_gb:g} GiB; more NPUs, a "
                          "larger tp/ep/pp, w8a8, --kv-dtype int8, or a smaller batch or context)")
    return weights, kv


def default_npus(loaded: LoadedSystem, cfg, given: dict) -> int:
    """The instance a plan runs on when neither a flag nor a mapping file gives ``npus``: one node's
    NPUs, or, when :func:`~npusim.system.plan.default_plan` (with the plan keys ``given``) would not
    hold the model's weights in one node's dies' HBM, the fewest whole nodes of the system whose
    default plan is valid and holds them. The KV cache is not counted here (the step checks it
    with its batch and context, :func:`check_fit`); one node when no node count holds the weights
    (the step then says the plan does not fit)."""
    one = loaded.system.npus_per_node
    dies = loaded.system.npu.dies
    hbm_gb = summarize(loaded.chip).hbm_gb
    probe = StepShape("decode", 1, 1, 2)  # weights do not depend on the shape
    for nodes in range(1, loaded.system.nodes + 1):
        try:
            plan = default_plan(cfg, nodes * one, dies, **given)
            check_plan(plan, cfg, dies, loaded.system.num_npus)
        except ConfigError:
            continue
        if memory_per_rank_gb(cfg, plan, probe)[0] < hbm_gb:
            return nodes * one
    return one


def simulate_plan_step(loaded: LoadedSystem, model, plan: ParallelPlan, shape: StepShape,
                       chip_cost: ChipCost | None = None, fidelity: str = "flow", routing: str = "uniform",
                       seed: int = 0, fit: bool = True, runtime: StepRuntime | str | None = None,
                       ) -> tuple[dict, Workload, WorkloadTiming]:
    """Map ``model`` by ``plan`` for ``shape`` and time it on ``loaded``: (result, workload, timing).
    An ``.onnx`` path runs data parallel (:func:`npusim.system.mapper.build_onnx_step`). ``runtime``:
    ``eager`` / ``graph`` (or a :class:`~npusim.system.execute.StepRuntime`); None: the system's
    default for the phase."""
    if str(model).endswith(".onnx"):
        return _onnx_step(loaded, str(model), plan, shape, chip_cost, fidelity, fit, runtime)
    cfg = get_config(model)
    dpn = loaded.system.npu.dies
    check_plan(plan, cfg, dpn, loaded.system.num_npus)
    if shape.phase == "decode" and shape.kv_len > cfg.max_position_embeddings:
        raise ConfigError(f"--kv {shape.kv_len}: longer than {cfg.name}'s context of {cfg.max_position_embeddings}")
    if shape.phase == "prefill" and shape.seq_len > cfg.max_position_embeddings:
        raise ConfigError(f"--seq {shape.seq_len}: longer than {cfg.name}'s context of {cfg.max_position_embeddings}")
    hbm_gb = summarize(loaded.chip).hbm_gb
    weights, kv = check_fit(cfg, plan, shape, hbm_gb) if fit else memory_per_rank_gb(cfg, plan, shape)
    ops = loaded.system.moe_operators
    wl = build_step(cfg, plan, shape, dpn, routing, seed,
                    ops.decode_copies if shape.phase == "decode" else ops.prefill_copies)
    cc = chip_cost or ChipCost(loaded.chip)
    timing = time_workload(wl, loaded, cc, fidelity, runtime)
    out = summarize_timing(wl, timing, loaded, cc)
    out.update(memory_figures(weights, kv, hbm_gb), chip_cost=cc.stats.as_dict())
    return out, wl, timing


def summarize_timing(wl: Workload, timing: WorkloadTiming, loaded: LoadedSystem, cc: ChipCost) -> dict:
    m = wl.meta
    plan = m["plan"]
    step_ms = timing.step_us / 1e3
    npus = -(-wl.ranks // loaded.system.npu.dies)  # the plan's, or as many as the ranks fill on another system
    out = {"system": loaded.system.name, "model": m["model"]["name"], "phase": m["phase"], "npus": npus,
           "dies": wl.ranks, "plan": plan, "batch": m["batch"], "batch_per_npu": m["batch"] / npus,
           "seq": m["seq_len"], "kv": m["kv_len"], "step_ms": step_ms}
    if m["phase"] == "decode":  # speculative (MTP) steps emit more than one token per sequence
        out["tpot_ms"] = step_ms / m.get("tokens_per_sequence", 1.0)
    else:
        out["ttft_ms"] = step_ms
    out.update(tokens_per_s_per_npu=m["tokens"] / (timing.step_us / 1e6) / npus if timing.step_us else None,
               breakdown_us=timing.breakdown_us, fixed_share=round(fixed_share(timing.breakdown_us, timing.step_us), 6),
               runtime=timing.runtime, simulated_layers=m.get("simulated_layers"),
               fidelity={"chip_memory": cc.memory, "chip_noc": cc.noc, "fabric": timing.fabric["fidelity"]},
               fabric=timing.fabric, busiest_links=timing.links[:5], note=NOTE)
    return out


def _onnx_step(loaded: LoadedSystem, path: str, plan: ParallelPlan, shape: StepShape, chip_cost: ChipCost | None,
               fidelity: str, fit: bool, runtime=None) -> tuple[dict, Workload, WorkloadTiming]:
    from npusim.system.parts import onnx_graph

    if plan.npus > loaded.system.num_npus:
        raise ConfigError(f"plan: {plan.npus} NPUs but the system has {loaded.system.num_npus}")
    wl = build_onnx_step(path, plan, shape, loaded.system.npu.dies)
    busiest = onnx_graph(wl.kernels[wl.nodes[0]["kernel"]])  # rank 0 has the most sequences
    weights = sum(op.weight_bytes for op in busiest.ops) / 2**30
    kv = sum(op.kv_read_bytes for op in busiest.ops if op.kind == "attention") / 2**30
    hbm_gb = summarize(loaded.chip).hbm_gb
    if fit and weights + kv > hbm_gb:
        raise ConfigError(f"plan does not fit: {weights * GB_PER_GIB:.1f} GB of weights + {kv * GB_PER_GIB:.1f} GB "
                          f"of KV cache per die > {hbm_gb * GB_PER_GIB:.1f} GB of HBM ({hbm_gb:g} GiB)")
    cc = chip_cost or ChipCost(loaded.chip)
    timing = time_workload(wl, loaded, cc, fidelity, runtime)
    out = summarize_timing(wl, timing, loaded, cc)
    out.update(memory_figures(weights, kv, hbm_gb), chip_cost=cc.stats.as_dict(),
               note="ONNX export, data parallel: each die runs the whole model for its sequences, no communication; "
                    "the system's runtime (host dispatch or graph replay, launches, scheduler) as for a config-built "
                    "model (runtime.sources)")
    return out, wl, timing
