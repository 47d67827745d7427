"""Physics probes: statements any real machine obeys, checked on system steps of models, systems and
plans drawn at random (the library call ``npusim run --system`` makes,
:func:`npusim.system.step.simulate_plan_step`).

* more work (batch, context, layers) never makes a step faster;
* more HBM bandwidth, fabric link bandwidth or cube peak never makes a step slower;
* W8A8 never makes a weight-bound dense decode step slower than BF16;
* pipeline stages add no more than their hand-offs (one microbatch: the stages run the one-stage
  step's kernels one after another; a hand-off is its sends and the next stage's wait for the last
  of them, the bubble at that boundary);
* an ONNX export of a model and its config pay the system runtime's same fixed costs;
* a step lies between its roofline (its work at the die's peak and HBM bandwidth, each operator
  plus the runtime's launch, plus the runtime's per-step scheduler time) and the sum of its parts
  (every node's span one after another, and the runtime's host tasks).

Models are built-in configs cut to a few layers (the per-layer physics is the full model's), on
one node of Atlas 800I A2 and of CloudMatrix384, each with its runtime section (graph decode, eager
prefill by default).
Systems with more bandwidth or peak are presets with one value scaled (:func:`scaled`).

Slack: the chip's GEMM kernel is the fastest simulated of the plans *estimated* within
:data:`~npusim.system.chipcost.PLAN_WINDOW` of the best estimate, so a change of shape or hardware
that moves the estimates can land on another plan (a GEMM with 4 rows can come out slower than
with 8; the expert GEMM of Qwen3-30B-A3B on a CloudMatrix384 die ~3% slower with twice the cube
rate). The monotonicity probes allow ``PLAN_WINDOW`` of the step's simulated part (the step less its
calibrated constants); the others allow nothing but rounding.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.arch import summarize
from npusim.arch.schema import Arch
from npusim.config import deep_merge
from npusim.model.builder import build_graph
from npusim.model.zoo import get_config
from npusim.system import mapper as system_mapper
from npusim.mapping.gemm_kernel import PLAN_WINDOW
from npusim.system.load import load_system
from npusim.system.mapper import StepShape
from npusim.system.parts import layer_part_graph, onnx_graph
from npusim.system.plan import ParallelPlan, default_plan
from npusim.system.step import simulate_plan_step
from npusim.validate.calibrate import _variant

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "onnx"
TINY_CONFIG = EXAMPLES / "qwen3_tiny_config.json"
TINY_ONNX = (EXAMPLES / "qwen3_tiny_opset18.onnx", EXAMPLES / "qwen3_tiny_opset23.onnx")
SYSTEMS = ("atlas-800i-a2", "cloudmatrix384")
MODELS = ("qwen3-0.6b", "qwen3-4b", "llama-3-8b", "gpt2", "qwen3-30b-a3b")
# The fast suite's probes draw few examples (each ~1-2 s: mostly GEMM shapes simulated for the first
# time); those with a slow ``_many`` twin (60 examples, larger models too) draw 3, the others 6.
PROBE = settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROBE_FEW = settings(max_examples=examples(3), deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROBE_SLOW = settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
BIG = ("llama-3-70b", "qwen3-32b", "deepseek-v3")  # the slow variants' larger models (DeepSeek: MLA, MoE after 3 dense)


# -- systems, models, steps ----------------------------------------------------------------------
@lru_cache(maxsize=None)
def system(name: str):
    return load_system(name, nodes=1)


@lru_cache(maxsize=None)
def scaled(name: str, what: str, factor: int):
    """``name`` with one resource ``factor`` times larger: ``hbm`` (every channel's bandwidth),
    ``link`` (every fabric link's and the die-to-die link's bandwidth) or ``cube`` (MACs per PE per
    cycle, every dtype)."""
    base = system(name)
    if what == "link":
        s = base.system.model_dump()
        fabrics = {f: {"links": [{**link, "bandwidth_gbps": link["bandwidth_gbps"] * factor} for link in fab["links"]]}
                   for f, fab in s["fabrics"].items()}
        changes = {"fabrics": fabrics}
        if s["npu"].get("die_link"):
            changes["npu"] = {"die_link": {"bandwidth_gbps": s["npu"]["die_link"]["bandwidth_gbps"] * factor}}
        return _variant(base, changes)
    chip = base.chip
    if what == "hbm":
        changes = {"hbm": {"channel_bandwidth_gbps": chip.hbm.bandwidth_per_channel_gbps * factor}}
    else:
        macs = chip.cores.systolic_array.macs_per_pe_per_cycle
        changes = {"cores": {"systolic_array": {"macs_per_pe_per_cycle": {d: v * factor for d, v in macs.items()}}}}
    return replace(base, chip=Arch.model_validate(deep_merge(chip.model_dump(), changes)))


def no_runtime(name: str):
    return _variant(system(name), {"runtime": {"host_dispatch_us": 0.0, "attention_dispatch_us": 0.0, "graph_launch_us": 0.0,
                                               "kernel_launch_us": 0.0, "scheduler_us": 0.0}})


@lru_cache(maxsize=None)
def model(name: str, layers: int):
    """``name``'s first ``layers`` layers (a model of more layers holds the same first ones)."""
    cfg = get_config(str(TINY_CONFIG) if name == "qwen3-tiny" else name)
    n = min(layers, cfg.num_layers)
    return replace(cfg, num_layers=n, first_dense_layers=min(cfg.first_dense_layers, n))


def step(loaded, cfg, plan, shape):
    """(result, workload, timing) of one step; the HBM fit is not checked (physics only)."""
    return simulate_plan_step(loaded, cfg, plan, shape, fit=False)


def simulated_ms(out: dict) -> float:
    """The step less what is not simulated hardware work (host, launch, calibrated constants)."""
    return out["step_ms"] * (1 - out["fixed_share"])


def slack_ms(out: dict) -> float:
    return PLAN_WINDOW * simulated_ms(out)


@st.composite
def setups(draw, systems=SYSTEMS, models=MODELS, pp: int = 1, layers=(1, 3)):
    """(system name, model name, layers, plan, shape): a plan of tp x dp dies a stage (whole NPUs:
    even on CloudMatrix384's two-die NPUs), MoE experts over every die of a stage, decode or
    prefill. ``onnx`` among ``models`` stands for the tiny Qwen3 export (its config sizes the plan)."""
    sys_name = draw(st.sampled_from(systems))
    name = draw(st.sampled_from(models))
    n_layers = draw(st.integers(max(layers[0], pp), max(layers[1], pp)))
    cfg = model("qwen3-tiny" if name == "onnx" else name, n_layers)
    loaded = system(sys_name)
    dies, ranks = loaded.system.npu.dies, loaded.system.num_npus * loaded.system.npu.dies
    tp = draw(st.sampled_from([t for t in (1, 2, 4) if cfg.num_heads % t == 0 and t * pp <= ranks]))
    dp = draw(st.sampled_from([d for d in (1, 2) if tp * d * pp <= ranks]))
    if (tp * dp) % dies:  # whole NPUs a stage
        dp *= 2
    plan = default_plan(cfg, tp * dp * pp // dies, dies, tp=tp, dp=dp, pp=pp)
    phase = draw(st.sampled_from(["decode", "prefill"]))
    if phase == "decode":
        shape = StepShape("decode", draw(st.integers(dp, 32)), 1,
                          draw(st.integers(64, min(2048, cfg.max_position_embeddings))))
    else:
        seq = draw(st.integers(16, min(512, cfg.max_position_embeddings)))
        shape = StepShape("prefill", draw(st.integers(dp, 4)), seq, seq)
    return sys_name, name, n_layers, plan, shape


# -- more work is never faster -------------------------------------------------------------------
@PROBE_FEW
@given(setups(), st.sampled_from(["batch", "context", "layers"]), st.integers(1, 3))
def test_more_work_never_makes_a_step_faster(setup, axis, grow):
    check_more_work(setup, axis, grow)


@pytest.mark.slow
@PROBE_SLOW
@given(setups(models=(*MODELS, *BIG), layers=(1, 5)), st.sampled_from(["batch", "context", "layers"]),
       st.integers(1, 3))
def test_more_work_never_makes_a_step_faster_many(setup, axis, grow):
    check_more_work(setup, axis, grow)


def check_more_work(setup, axis, grow):
    sys_name, name, n_layers, plan, shape = setup
    cfg = model(name, n_layers)
    if axis == "batch":
        more = (cfg, replace(shape, batch=shape.batch * (1 + grow)))
    elif axis == "context" and shape.phase == "decode":
        more = (cfg, replace(shape, kv_len=min(shape.kv_len * (1 + grow), cfg.max_position_embeddings)))
    elif axis == "context":
        seq = min(shape.seq_len * (1 + grow), cfg.max_position_embeddings)
        more = (cfg, replace(shape, seq_len=seq, kv_len=seq))
    else:
        more = (model(name, n_layers + grow), shape)
    loaded = system(sys_name)
    base, _, _ = step(loaded, cfg, plan, shape)
    bigger, _, _ = step(loaded, more[0], plan, more[1])
    assert bigger["step_ms"] >= base["step_ms"] - slack_ms(base), (axis, base["step_ms"], bigger["step_ms"])


# -- more hardware is never slower ---------------------------------------------------------------
@PROBE_FEW
@given(setups(), st.sampled_from(["hbm", "link", "cube"]), st.sampled_from([2, 4]))
def test_more_bandwidth_or_peak_never_makes_a_step_slower(setup, what, factor):
    check_more_hardware(setup, what, factor)


@pytest.mark.slow
@PROBE_SLOW
@given(setups(models=(*MODELS, *BIG), layers=(1, 5)), st.sampled_from(["hbm", "link", "cube"]),
       st.sampled_from([2, 4]))
def test_more_bandwidth_or_peak_never_makes_a_step_slower_many(setup, what, factor):
    check_more_hardware(setup, what, factor)


def test_a_faster_cube_never_slows_a_decode_lm_head():
    """Found by the probe above in CI: a decode step of Qwen3-0.6B (1 layer, batch 1, KV 64) on one
    Atlas 800I A2 NPU was 5% slower with twice the cube's MACs (its LM head, 1 x 1024 x 151936, 210.9
    -> 227.4 us): a tile too wide for one fold in L1 streamed in chunks of one fold (rows x MACs per
    PE), so a faster cube doubled the last chunk, whose L1 -> L0 feed is charged after its load; such
    tiles now stream in L0 steps (:meth:`npusim.mapping.gemm_kernel.Planner.chunk`)."""
    plan = ParallelPlan(npus=1, tp=1, dp=1, precision="bf16")
    check_more_hardware(("atlas-800i-a2", "qwen3-0.6b", 1, plan, StepShape("decode", 1, 1, 64)), "cube", 2)


def check_more_hardware(setup, what, factor):
    sys_name, name, n_layers, plan, shape = setup
    cfg = model(name, n_layers)
    base, _, _ = step(system(sys_name), cfg, plan, shape)
    faster, _, _ = step(scaled(sys_name, what, factor), cfg, plan, shape)
    assert faster["step_ms"] <= base["step_ms"] + slack_ms(base), (what, base["step_ms"], faster["step_ms"])


# -- W8A8 ---------------------------------------------------------------------------------------
DENSE = ("llama-3-8b", "llama-3-70b", "qwen3-8b", "qwen3-32b", "qwen3-4b")
FUSABLE = {"rmsnorm", "layernorm", "swiglu"}  # producers a CANN kernel fuses the quantisation into


def w8a8_margin_us(loaded, cfg, plan, shape) -> tuple[float, float]:
    """(weight time W8A8 saves a layer on a die, launches of the quantisations no fused kernel covers
    a layer), from the operator graphs: each INT8 GEMM's weight read at the die's HBM bandwidth
    halves; each extra kernel costs the runtime's launch; a quantisation is covered
    when its producer is a norm or SwiGLU (counted the same whether or not the graph fuses it); each
    INT8 GEMM is a MIX kernel (QuantBatchMatmulV3's UB dequant, bf16 out) whose extra start is at most
    the one on every cube core of the die (gemm_kernel.mix_start_us), counted with the launches."""
    from npusim.mapping.gemm_kernel import mix_start_us

    floor = loaded.system.runtime.kernel_launch_us  # each kernel's launch (no floor any more: added)
    die = loaded.chip
    mix = mix_start_us(die, die.num_cores, die.num_cores)  # an INT8 GEMM's MIX start, at most
    bw = summarize(loaded.chip).hbm_bandwidth_gbps * 1e3  # bytes per us
    spec = {"phase": "decode", "batch": max(1, shape.batch // plan.dp), "seq_len": 1, "kv_len": shape.kv_len,
            "type": "layer", "layer": 0, "heads_split": plan.tp, "ffn_split": plan.tp}
    bf16 = layer_part_graph(cfg, {**spec, "precision": "bf16"})
    saved = sum(op.weight_bytes / bw - op.weight_bytes / 2 / bw for op in bf16.ops if op.kind == "gemm" and op.weight)
    unfused = build_graph(cfg, "decode", spec["batch"], 1, shape.kv_len, precision="a8w8", layers=1).ops
    by_name = {op.name: op for op in unfused}
    separate = 0
    for op in unfused:
        if op.op_class == "quantize":
            src = by_name[op.inputs[0]] if len(op.inputs) == 1 else None
            if src is None or (src.fn if src.op_class == "activation" else src.op_class) not in FUSABLE:
                separate += 1
    gemms = sum(1 for op in bf16.ops if op.kind == "gemm" and op.weight)
    return saved, separate * floor + gemms * mix


W8A8_DRAWS = (st.sampled_from(SYSTEMS), st.sampled_from(DENSE), st.sampled_from([1, 2, 4, 8]), st.integers(1, 64),
              st.integers(128, 4096))


@PROBE_FEW
@given(*W8A8_DRAWS)
def test_w8a8_never_slows_a_weight_bound_decode_step(sys_name, name, tp, batch, kv):
    """A step is weight-bound here when the weight read time W8A8 saves exceeds twice the launches
    of the quantisations no fused kernel covers (the attention output before ``o_proj``)."""
    check_w8a8(sys_name, name, tp, batch, kv)


@pytest.mark.slow
@PROBE_SLOW
@given(*W8A8_DRAWS)
def test_w8a8_never_slows_a_weight_bound_decode_step_many(sys_name, name, tp, batch, kv):
    check_w8a8(sys_name, name, tp, batch, kv)


def check_w8a8(sys_name, name, tp, batch, kv):
    cfg = model(name, 2)
    assume(cfg.num_heads % tp == 0)
    loaded = system(sys_name)
    dies = loaded.system.npu.dies
    npus = max(1, tp // dies)
    plan = default_plan(cfg, npus, dies, tp=tp, dp=npus * dies // tp)
    shape = StepShape("decode", max(batch, plan.dp), 1, kv)
    saved, launches = w8a8_margin_us(loaded, cfg, plan, shape)
    assume(saved > 2 * launches)
    bf16, _, _ = step(loaded, cfg, plan, shape)
    w8a8, _, _ = step(loaded, cfg, replace(plan, precision="w8a8"), shape)
    assert w8a8["step_ms"] <= bf16["step_ms"] * (1 + 1e-9), (saved, launches, bf16["step_ms"], w8a8["step_ms"])


@pytest.mark.parametrize("batch", [1, 16, 64])
def test_w8a8_llama_3_70b_tp8_decode_is_faster_than_bf16(batch):
    """Issue 41's case, two layers of it: 7.9 GB fewer weight bytes a die must show."""
    loaded, cfg = system("atlas-800i-a2"), model("llama-3-70b", 2)
    plan, shape = default_plan(cfg, 8, 1, tp=8), StepShape("decode", batch, 1, 1536)
    bf16 = step(loaded, cfg, plan, shape)[0]["step_ms"]
    assert step(loaded, cfg, replace(plan, precision="w8a8"), shape)[0]["step_ms"] < bf16


# -- pipeline stages ------------------------------------------------------------------------------
@PROBE_FEW
@given(st.sampled_from([2, 4]), st.data())
def test_pipeline_stages_add_no_more_than_their_transfers(pp, data):
    check_pipeline(pp, data.draw(setups(pp=pp, layers=(pp, 4))))


@pytest.mark.slow
@PROBE_SLOW
@given(st.sampled_from([2, 4, 8]), st.data())
def test_pipeline_stages_add_no_more_than_their_transfers_many(pp, data):
    check_pipeline(pp, data.draw(setups(models=(*MODELS, *BIG), pp=pp, layers=(pp, 8))))


def check_pipeline(pp, setup):
    """One microbatch: the stages run the one-stage step's kernels one after another; the step may
    gain only its stage hand-offs, each the window from the first rank's send leaving to the last
    rank's arriving (the sends themselves, and ranks of the next stage waiting for a later rank of
    this one: the pipeline's bubble at that boundary). Every layer is simulated on both sides (no
    extrapolation)."""
    sys_name, name, n_layers, plan, shape = setup
    cfg = model(name, n_layers)
    loaded = system(sys_name)
    one = replace(plan, npus=plan.npus // pp, pp=1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(system_mapper, "SIM_LAYERS", 10_000)
        staged, wl, timing = step(loaded, cfg, plan, shape)
        single, _, _ = step(loaded, cfg, one, shape)
    handoffs_us = 0.0
    for s in range(pp - 1):
        sends = [i for i, n in enumerate(wl.nodes) if n["name"].startswith(f"S{s}.") and n["category"] == "pp_comm"]
        assert sends
        handoffs_us += timing.node_end_us[sends].max() - timing.node_start_us[sends].min()
    assert staged["step_ms"] <= (single["step_ms"] + handoffs_us / 1e3) * (1 + 1e-12), (
        staged["breakdown_us"], single["breakdown_us"], handoffs_us)


# -- ONNX and config ------------------------------------------------------------------------------
@PROBE
@given(st.sampled_from(SYSTEMS), st.sampled_from(TINY_ONNX), st.sampled_from(["decode", "prefill"]),
       st.integers(1, 4), st.integers(16, 256))
def test_an_onnx_export_and_its_config_pay_the_same_fixed_costs(sys_name, onnx, phase, per_die, length):
    """The tiny Qwen3 as its torch export and as its config.json, data parallel on two dies: the
    runtime's scheduler time once on each critical path, and the runtime's fixed costs (the step less
    the same step with no launch floor and no step overhead) at least that overhead on both."""
    loaded = system(sys_name)
    dies = loaded.system.npu.dies
    plan = default_plan(model("qwen3-tiny", 2), max(1, 2 // dies), dies, tp=1, dp=2)
    shape = StepShape(phase, 2 * per_die, 1 if phase == "decode" else length, length)
    overhead = loaded.system.runtime.scheduler_us
    for m in (str(onnx), model("qwen3-tiny", 2)):
        out, _, _ = step(loaded, m, plan, shape)
        bare, _, _ = step(no_runtime(sys_name), m, plan, shape)
        assert out["breakdown_us"]["host"] >= overhead * (1 - 1e-9) and out["breakdown_us"]["launch"] > 0, m
        assert out["step_ms"] - bare["step_ms"] >= overhead / 1e3 * (1 - 1e-9), m


# -- roofline and sum of parts --------------------------------------------------------------------
def _ops_bound_us(ops, peak: dict, bw: float, floor: float) -> float:
    """Each operator at the die's peak and HBM bandwidth (its GEMM/attention FLOPs; its weights and
    cached keys/values read once), no shorter than the launch floor, one after another."""
    total = 0.0
    for op in ops:
        flops = op.flops if op.kind in ("gemm", "attention", "moe") else 0
        nbytes = op.weight_bytes + op.kv_read_bytes
        total += floor + max(flops / (peak[op.dtype] * 1e6), nbytes / bw)
    return total


def roofline_us(wl, loaded, floor: float) -> float:
    """The busiest rank's stream: its kernels' bounds one after another, plus the runtime's
    per-step overhead (taken from the system, not from the workload)."""
    s = summarize(loaded.chip)
    peak = {**s.peak_tflops, "fp32": s.peak_tflops["bf16"] / 2}
    bw = s.hbm_bandwidth_gbps * 1e3
    cfg = get_config(wl.meta["model"]) if "onnx" not in wl.meta["model"] else None
    kernel = []
    for spec in wl.kernels:
        kind = spec["type"]
        if kind in ("layer", "onnx"):
            graph = layer_part_graph(cfg, spec) if kind == "layer" else onnx_graph(spec)
            kernel.append(_ops_bound_us(graph.ops, peak, bw, floor))
        elif kind == "gemm":
            e = 1 if spec.get("dtype") == "int8" else 2
            flops = 2 * spec.get("batch", 1) * spec["m"] * spec["k"] * spec["n"]
            kernel.append(floor + max(flops / (peak[spec.get("dtype", "bf16")] * 1e6), spec["k"] * spec["n"] * e / bw))
        elif kind == "vector":
            kernel.append(floor)
        else:  # fixed (the step overhead is added below, from the system), sum, blend: no bound taken
            kernel.append(0.0)
    busy: dict[tuple, float] = {}
    for n in wl.nodes:
        if n["kind"] == "compute" and n["name"] != "step_overhead":
            key = (n["rank"], n.get("stream", "compute"))
            busy[key] = busy.get(key, 0.0) + kernel[n["kernel"]]
    return max(busy.values(), default=0.0) + loaded.system.runtime.scheduler_us


@PROBE
@given(setups(models=(*MODELS, "onnx")), st.sampled_from(TINY_ONNX))
def test_a_step_lies_between_its_roofline_and_the_sum_of_its_parts(setup, onnx):
    sys_name, name, n_layers, plan, shape = setup
    loaded = system(sys_name)
    if name == "onnx":  # an export runs data parallel: one die per part of the batch
        plan = default_plan(model("qwen3-tiny", 2), plan.npus, loaded.system.npu.dies, tp=1,
                            dp=plan.npus * loaded.system.npu.dies)
        shape = replace(shape, batch=max(shape.batch, plan.dp))
    m = str(onnx) if name == "onnx" else model(name, n_layers)
    out, wl, timing = step(loaded, m, plan, shape)
    assume("repeat" not in wl.meta)  # the step is the simulated makespan (no extrapolated layers)
    parts = float((timing.node_end_us - timing.node_start_us).sum()) + timing.host_busy_us
    bound = roofline_us(wl, loaded, loaded.system.runtime.kernel_launch_us)
    assert bound * (1 - 1e-9) <= timing.step_us <= parts * (1 + 1e-9), (bound, timing.step_us, parts)
