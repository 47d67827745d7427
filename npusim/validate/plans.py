"""Rows of the plan path (any model on a system, :mod:`npusim.system.step`): dense models on Atlas
800I A2 across batch sizes (prefill and decode steps) and a non-DeepSeek MoE model's decode bound.

Each row carries a roofline baseline: the same step's work on one die (its share of the model's
FLOPs and of its weight and KV bytes) at the die's peak compute or HBM bandwidth, whichever is
slower, communication free.
"""

from __future__ import annotations

from npusim.arch import summarize
from npusim.model.builder import build_graph
from npusim.model.zoo import get_config
from npusim.system.load import load_system
from npusim.system.mapper import StepShape
from npusim.system.plan import ParallelPlan
from npusim.system.step import simulate_plan_step
from npusim.validate.published import published
from npusim.validate.rows import Row

TOLERANCE = 0.25
NPUS_PER_NODE = 8  # an Atlas 800I A2 node
DECODE_CONTEXT = 1024 + 512  # 1,024-token prompts, the mean over 1,024 output tokens


def roofline_ms(loaded, model: str, plan: ParallelPlan, shape: StepShape) -> float:
    """max(FLOPs / peak, bytes / HBM bandwidth) of one die's share of the step."""
    cfg = get_config(model)
    g = build_graph(cfg, shape.phase, batch=shape.batch, seq_len=shape.seq_len, kv_len=shape.kv_len,
                    precision=plan.graph_precision)
    ranks = plan.npus * loaded.system.npu.dies
    s = summarize(loaded.chip)
    flops = sum(op.flops for op in g.ops) / ranks
    nbytes = sum(op.weight_bytes + (op.kv_read_bytes if op.kind == "attention" else 0) for op in g.ops) / ranks
    peak = s.peak_tflops[plan.gemm_dtype] * 1e12
    return max(flops / peak, nbytes / (s.hbm_bandwidth_gbps * 1e9)) * 1e3


def _plan_shape(r: dict) -> tuple[ParallelPlan, StepShape]:
    plan = ParallelPlan(npus=r["npus"], tp=r["tp"], dp=r.get("dp", 1), ep=r.get("ep", 1), precision=r["precision"])
    if r["phase"] == "decode":
        return plan, StepShape("decode", r["batch"], 1, r.get("kv", DECODE_CONTEXT))
    return plan, StepShape("prefill", r["batch"], 1024, 1024)


def simulated_step_ms(loaded, r: dict) -> float:
    """The simulated step of a published plan row on ``loaded``."""
    plan, shape = _plan_shape(r)
    return float(simulate_plan_step(loaded, r["model"], plan, shape)[0]["step_ms"])


def _row(loaded, r: dict, source: str, kind_note: str, fitted: bool = False) -> Row:
    plan, shape = _plan_shape(r)
    kind = "calibration" if r.get("role") == "calibration" else "fitted" if fitted else "outside"
    name = (f"{get_config(r['model']).name} {r['phase']} step, batch {r['batch']}, {r['npus']} NPU"
            f"{'s' if r['npus'] > 1 else ''} TP{r['tp']}" + (f" DP{plan.dp} EP{plan.ep}" if plan.ep > 1 else "")
            + f" {r['precision']}")
    return Row(name=name, source=source, published=float(r["ms"]), simulated=simulated_step_ms(loaded, r),
               tolerance=TOLERANCE, relation=r.get("relation", "eq"), unit=" ms",
               kind=kind,
               baseline=roofline_ms(loaded, r["model"], plan, shape), note=kind_note)


def plan_rows(quick: bool = False) -> list[Row]:
    """The dense rows (every one), then the MoE bound; --quick keeps one decode and one prefill row
    of each dense model."""
    dense = published()["ascend_plan_steps"]
    rows_in = dense["rows"]
    if quick:
        seen, kept = set(), []
        for r in rows_in:
            if (r["model"], r["phase"]) not in seen:
                seen.add((r["model"], r["phase"]))
                kept.append(r)
        rows_in = kept
    systems: dict[int, object] = {}

    def a2(npus: int):
        nodes = -(-npus // NPUS_PER_NODE)
        if nodes not in systems:
            systems[nodes] = load_system("atlas-800i-a2", nodes=nodes)
        return systems[nodes]

    fitted = bool(dense.get("fitted"))
    note = ("fitted: seen while choosing the session-24 chip model (per-operator costing, the then launch floor) and "
            "the two batch-1 decode rows calibrated the runtime until issue 39; "
            if fitted else "outside: found after the plan path was built; ") + "decode at the mean context 1,536"
    out = [_row(a2(r["npus"]), r, f"{dense['source']}, {r['where']}", note, fitted) for r in rows_in]
    out += [_row(a2(r["npus"]), r, r["source"], "outside; a bound only (a serving run's TPOT with chunked prefill): "
                 "the roofline passes it too, so it does not discriminate") for r in published()["moe_plan_steps"]]
    return out
