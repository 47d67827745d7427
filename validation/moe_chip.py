"""MoE on one chip: the FLOPs the mapped program executes against the model's analytical FLOPs,
and where a MoE decode step's time and NoC traffic go (issue 12, section 4).

The case of the issue: Qwen3-30B-A3B decode, 8 sequences at KV 2048 (2047 cached + the new
token), TP 4 on npusim-64c with 16 pipeline stages — what

    npusim run --model qwen3-30b-a3b --phase decode --batch 8 --tp 4 --kv 2047 [--partition tp_mn]

maps and simulates (memory analytical, NoC path). The analytical FLOPs are the model's own:
``npusim model qwen3-30b-a3b --json`` gives ``flops_per_token_decode`` at 2048 keys, batch 1;
every op of a decode step is per token (attention per sequence), so the step's FLOPs are 8 times
that. "Counted" sums what the program's compute tasks do: 2 FLOPs per multiply-add of each GEMM
task, one per element of each vector task (the IR's convention), by what the task belongs to
(from its name). Reductions inside collectives (an all-reduce's adds, the MoE combine's sum of
partials) are listed apart: they are the communication's, not the model's.

Per MoE block (the ops from the router to the layer's residual add, collectives included, in
program order): its span on the simulated timeline (first start to last end), the bytes its
NoC messages carry, and cube / vector busy time summed over the cores.

With the default partitions (all ``tp_k`` here) the MoE block's input is replicated on the
group's cores, so dispatch moves nothing and combine is the all-to-all; with ``--partition
tp_mn`` the activation is split by tokens and dispatch is an all-to-all too.

    python validation/moe_chip.py [--partition tp_mn] [--even-counts] [--layers N] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.model.builder import build_graph  # noqa: E402
from npusim.model.summary import model_summary  # noqa: E402
from npusim.scenarios.forward import simulate_forward  # noqa: E402
from npusim.sim.program import COST_GEMM, COST_VECTOR  # noqa: E402

MODEL, BATCH, KV, TP = "qwen3-30b-a3b", 8, 2048, 4

# task name -> category (first match wins); names are "<tag><op name>[ suffix]"
CATEGORIES = (
    ("expert GEMMs", re.compile(r"moe\.experts e\d+ (up|gate_up|down)")),
    ("expert activation", re.compile(r"moe\.experts(_act| e\d+ act)")),
    ("expert weighted sum", re.compile(r"moe\.(experts weighted sum|combine$)")),
    ("MoE dispatch vector pass", re.compile(r"moe\.dispatch")),
    ("collective reductions", re.compile(r"reduce step|combine sum")),
    ("attention", re.compile(r"attn\.attention")),
)


def category(name: str, cost_kind: int) -> str:
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return "other GEMMs" if cost_kind == COST_GEMM else "other vector"


def analytical(graph) -> dict:
    """The graph's FLOPs by the same categories, from op fields (routed tokens R = sum of
    expert_tokens: expert GEMMs 2 R k n x 3, SwiGLU R n, weighted sum R k)."""
    out = dict.fromkeys([c for c, _ in CATEGORIES] + ["other GEMMs", "other vector"], 0)
    for op in graph.ops:
        if op.kind == "moe":
            r = sum(op.expert_tokens)
            out["expert GEMMs"] += 2 * r * op.k * op.n * (3 if op.gated else 2)
            out["expert activation"] += r * op.n
            out["expert weighted sum"] += r * op.k
        elif op.name.endswith(("moe.experts_act", "moe.combine", "moe.dispatch")):
            pass  # counted with the moe op above (the same quantities, per routed token)
        elif op.kind == "attention":
            out["attention"] += op.flops
        elif op.kind == "gemm":
            out["other GEMMs"] += op.flops
        else:
            out["other vector"] += op.flops
    return out


def counted(prog) -> dict:
    out: dict[str, int] = {}
    for i, ck in enumerate(prog.cost_kind):
        a = prog.cost_args[i]
        if ck == COST_GEMM:
            f = 2 * a[0] * a[1] * a[2] * a[3]
        elif ck == COST_VECTOR:
            f = a[1]
        else:
            continue
        c = category(prog.names[i], ck)
        out[c] = out.get(c, 0) + int(f)
    return out


def moe_blocks(run) -> dict:
    """Per MoE block (router .. before the residual add, program order): span, NoC bytes, busy."""
    prog, sim = run.mapped.program, run.sim
    start, end = sim.task_times()
    names = prog.names
    spans, noc, cube, vec, disp, comb = [], [], [], [], [], []
    i, n = 0, len(prog)
    while i < n:
        if ".moe.router" not in names[i]:
            i += 1
            continue
        j = i
        while j < n and "mlp_residual" not in names[j]:
            j += 1
        sel = np.arange(i, j)
        ran = sel[(start[sel] >= 0) & (end[sel] >= start[sel])]
        spans.append(int(end[ran].max() - start[ran].min()))
        sends = [t for t in sel if prog.unit[t] == "noc"]
        noc.append(sum(int(prog.param[t][2]) for t in sends))
        disp.append(sum(int(prog.param[t][2]) for t in sends if " dispatch " in names[t]))
        comb.append(sum(int(prog.param[t][2]) for t in sends if " combine " in names[t]))
        dur = end[sel] - start[sel]
        cube.append(int(dur[[prog.unit[t] == "cube" for t in sel]].sum()))
        vec.append(int(dur[[prog.unit[t] == "vector" for t in sel]].sum()))
        i = j
    ghz = sim.arch.clock_ghz
    return {"blocks": len(spans), "span_us_mean": float(np.mean(spans)) / ghz / 1e3,
            "noc_bytes_total": int(sum(noc)), "dispatch_bytes_total": int(sum(disp)),
            "combine_bytes_total": int(sum(comb)),
            "cube_busy_us_total": sum(cube) / ghz / 1e3, "vector_busy_us_total": sum(vec) / ghz / 1e3}


def even_counts(graph):
    """The graph with each MoE op's per-token routing replaced by the even count profile npusim
    used before per-token routing (uniform popularity: ``T k / E`` tokens per expert, the remainder
    one more each for the first experts of the layer's seeded permutation), so the mapper's change
    can be told apart from the routing's (the mapper then assigns tokens to meet the counts)."""
    ops = []
    for op in graph.ops:
        if op.kind == "moe":
            seed = graph.meta.get("seed", 0) * 1_000_003 + op.layer
            base, left = divmod(op.m * op.top_k, op.experts)
            counts = np.full(op.experts, base, dtype=np.int64)
            counts[np.random.default_rng(seed).permutation(op.experts)[:left]] += 1
            op = replace(op, expert_tokens=tuple(counts.tolist()), expert_routing=())
        ops.append(op)
    return replace(graph, ops=ops)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=None, help="build only the first N layers")
    ap.add_argument("--partition", default=None, choices=["tp_k", "tp_mn", "tp_mnk", "auto"],
                    help="GEMM partition for all classes (default auto, as npusim run's; it picks tp_k here, "
                    "so the MoE input is replicated; tp_mn splits it by tokens)")
    ap.add_argument("--even-counts", action="store_true",
                    help="route by the even per-expert count profile of earlier versions instead of per token")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    arch = load_arch("npusim-64c")
    graph = build_graph(MODEL, "decode", batch=BATCH, seq_len=1, kv_len=KV, layers=args.layers)
    if args.even_counts:
        graph = even_counts(graph)
    stages = max(1, min(len(graph.layers()), arch.num_cores // TP))
    spec = spec_from_flags(tp=TP, partition=args.partition, layout="ring", stages=stages)
    spec = spec.model_copy(update={"data_parallel": 1})
    t0 = time.perf_counter()
    run = simulate_forward(graph, arch, spec, memory_mode="analytical", noc_mode="path")
    wall = time.perf_counter() - t0
    model = model_summary(MODEL, decode_kv_len=KV)
    want, got = analytical(graph), counted(run.mapped.program)
    reductions = got.pop("collective reductions", 0)
    s = run.summary
    out = {
        "case": f"{MODEL} decode batch {BATCH} KV {KV}, TP {TP} x {stages} stages on {arch.name}, "
                f"partition {args.partition or 'auto'}" + (", even expert counts" if args.even_counts else ""),
        "model_flops_analytical": int(model["flops_per_token_decode"] * BATCH) if args.layers is None else None,
        "graph_flops": graph.flops, "flops_counted": int(sum(got.values())),
        "flops_collective_reductions": int(reductions),
        "by_category": {c: {"analytical": int(want.get(c, 0)), "counted": int(got.get(c, 0))}
                        for c in dict.fromkeys([*want, *got]) if c != "collective reductions"},
        "latency_ms": s["latency_ms"], "breakdown_ms": s["breakdown_ms"], "hbm_gib": s["hbm_bytes"] / 2**30,
        "active_experts_per_layer": float(np.mean([sum(1 for c in op.expert_tokens if c)
                                                   for op in graph.ops if op.kind == "moe"])),
        "moe": moe_blocks(run), "wall_s": wall,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return
    print(machine_line())
    print(out["case"] + " (memory analytical, NoC path)")
    ref = out["model_flops_analytical"] or out["graph_flops"]
    print(f"  FLOPs: model analytical {ref / 1e9:,.3f} G (npusim model: flops_per_token_decode x {BATCH}); "
          f"graph {out['graph_flops'] / 1e9:,.3f} G; counted in the program {out['flops_counted'] / 1e9:,.3f} G "
          f"({out['flops_counted'] / ref:.3f}x); collective reductions {reductions / 1e9:,.4f} G on top")
    print(f"  {'category':<26}{'analytical GFLOP':>18}{'counted GFLOP':>16}{'ratio':>8}")
    for c, v in out["by_category"].items():
        ratio = f"{v['counted'] / v['analytical']:.3f}" if v["analytical"] else "-"
        print(f"  {c:<26}{v['analytical'] / 1e9:>18,.4f}{v['counted'] / 1e9:>16,.4f}{ratio:>8}")
    bd = out["breakdown_ms"]
    print(f"  latency {out['latency_ms']:.3f} ms: " + ", ".join(f"{k} {v:.3f} ms" for k, v in bd.items())
          + f"; HBM {out['hbm_gib']:.2f} GiB; {out['active_experts_per_layer']:.1f} experts active per layer")
    m = out["moe"]
    print(f"  MoE blocks ({m['blocks']}): span {m['span_us_mean']:.1f} us each (mean); NoC {m['noc_bytes_total'] / 2**20:.2f}"
          f" MiB in all (dispatch {m['dispatch_bytes_total'] / 2**20:.2f}, combine "
          f"{m['combine_bytes_total'] / 2**20:.2f}); cube busy {m['cube_busy_us_total']:.1f} us, vector busy "
          f"{m['vector_busy_us_total']:.1f} us (summed over cores)")
    print(f"  (simulated in {wall:.1f} s)")


if __name__ == "__main__":
    main()
