"""How much of a decode step is not simulated hardware work, and how a step grows with batch.

Prints (a) the fixed share of a batch-1 and a batch-96 decode step -- host, launch and calibrated
time on the step's critical path over the step -- for Llama-3-70B TP8 FP16 on one Atlas 800I A2
node (context 1536) and for DeepSeek-R1's decode deployment on CloudMatrix384
(``mappers/cm384-deepseek-decode.yaml``, batch per NPU -- batch 1 runs as 2, one sequence a die --,
context 4096, HBM fit not checked), and (b) the step time against
batch 1, 2, 4 ... 128 for the same two steps (``--json``: one object).

It runs on the code before issue 39 item 3 too (``PYTHONPATH=<that checkout>``), which had no
runtime model: there a plan's fixed costs were a launch floor inside every operator
(``runtime.launch_us``) and a per-step overhead, a deployment's the ``calibrated`` and
``kernel_launch`` categories. The script then takes the fixed share as (calibrated + kernel_launch
+ the floor's excess) / step, the floor's excess being the step with the floor minus the same step
with ``launch_us`` 0 (a difference of two simulated steps: approximate where the floor moved the
critical path). ``--runtime`` (new code only) picks eager or graph; default: the system's.

    python validation/runtime_fixed_share.py [--runtime eager|graph] [--batches 1,2,4] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from npusim.config import deep_merge
from npusim.mapping.spec import load_deployment
from npusim.system.chipcost import ChipCost
from npusim.system.load import load_system
from npusim.system.mapper import StepShape
from npusim.system.moe_step import simulate_step
from npusim.system.plan import ParallelPlan
from npusim.system.schema import System
from npusim.system.step import simulate_plan_step
from npusim.system.topology import build_topology

try:  # the runtime model (issue 39 item 3)
    from npusim.system.execute import StepRuntime  # noqa: F401
    NEW = True
except ImportError:
    NEW = False

BATCHES = (1, 2, 4, 8, 16, 32, 64, 96, 128)
DENSE = ("atlas-800i-a2", "llama-3-70b", 1536)
MOE = ("cloudmatrix384", "deepseek-r1", 4096, "mappers/cm384-deepseek-decode.yaml")


def _variant(loaded, changes):
    system = System.model_validate(deep_merge(loaded.system.model_dump(), changes))
    return replace(loaded, system=system, topology=build_topology(system))


def dense_step(batch: int, runtime: str | None, cache: dict) -> dict:
    name, model, kv = DENSE
    loaded = cache.setdefault(name, load_system(name, nodes=1))
    cc = cache.setdefault(name + ".cc", ChipCost(loaded.chip))
    plan = ParallelPlan(npus=8, tp=8, dp=1, ep=1, pp=1, microbatches=1, precision="fp16")
    shape = StepShape("decode", batch, 1, kv)
    if NEW:
        out, _, _ = simulate_plan_step(loaded, model, plan, shape, chip_cost=cc, runtime=runtime)
        return {"step_ms": out["step_ms"], "fixed_share": out["fixed_share"], "breakdown_us": out["breakdown_us"]}
    out, _, _ = simulate_plan_step(loaded, model, plan, shape, chip_cost=cc)
    bare = _variant(loaded, {"runtime": {"launch_us": 0.0}})
    no_floor, _, _ = simulate_plan_step(bare, model, plan, shape, chip_cost=cc)
    step_us = out["step_ms"] * 1e3
    excess = step_us - no_floor["step_ms"] * 1e3
    fixed = excess + out["breakdown_us"].get("calibrated", 0.0)
    return {"step_ms": out["step_ms"], "fixed_share": fixed / step_us, "breakdown_us": out["breakdown_us"],
            "floor_excess_us": excess}


def moe_step(batch: int, runtime: str | None, cache: dict) -> dict:
    name, model, kv, mapping = MOE
    loaded = cache.setdefault(name, load_system(name))
    cc = cache.setdefault(name + ".cc", ChipCost(loaded.chip))
    dep = load_deployment(mapping)
    kw = {"runtime": runtime} if NEW else {}
    # a die needs a sequence: batch 1 per NPU runs as 2 (1 per die); the HBM fit is not checked (128)
    r = simulate_step(loaded, dep, model, batch=max(2, batch), kv=kv, chip_cost=cc, check_fit=False, **kw)
    if NEW:
        return {"step_ms": r.step_ms, "fixed_share": r.fixed_share, "breakdown_us": r.breakdown_us}
    fixed = r.calibrated_ms + r.kernel_launch_ms
    return {"step_ms": r.step_ms, "fixed_share": fixed / r.step_ms, "breakdown_us": r.breakdown_us}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runtime", choices=["eager", "graph"], default=None)
    p.add_argument("--batches", default=",".join(map(str, BATCHES)))
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    if a.runtime and not NEW:
        print("--runtime: this checkout has no runtime model", file=sys.stderr)
        return 2
    batches = [int(x) for x in a.batches.split(",")]
    cache: dict = {}
    rows = {"dense": {}, "moe": {}}
    for b in sorted(set(batches) | {1, 96}):
        rows["dense"][b] = dense_step(b, a.runtime, cache)
        rows["moe"][b] = moe_step(b, a.runtime, cache)
    out = {"code": "runtime model" if NEW else "before (launch floor + step overhead)", "runtime": a.runtime,
           "dense": {"system": DENSE[0], "model": DENSE[1], "plan": "tp8 fp16", "kv": DENSE[2]},
           "moe": {"system": MOE[0], "model": MOE[1], "mapping": MOE[3], "kv": MOE[2], "batch": "per NPU"},
           "fixed_share": {k: {str(b): rows[k][b]["fixed_share"] for b in (1, 96)} for k in rows},
           "step_ms": {k: {str(b): rows[k][b]["step_ms"] for b in batches} for k in rows},
           "breakdown_us": {k: {str(b): rows[k][b]["breakdown_us"] for b in (1, 96)} for k in rows}}
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{out['code']}; runtime {a.runtime or 'the system default'}")
    print("(a) fixed share of a decode step (host + launch + calibrated on the critical path / step)")
    print(f"  {'step':58s} {'batch 1':>8s} {'batch 96':>9s}")
    for k, label in (("dense", "A2 llama-3-70b TP8 fp16, kv 1536 (batch = sequences)"),
                     ("moe", "CM384 DeepSeek-R1 decode deployment, kv 4096 (batch/NPU, 1 -> 2)")):
        print(f"  {label:58s} {out['fixed_share'][k]['1']:8.1%} {out['fixed_share'][k]['96']:9.1%}")
    print("(b) step time (ms) against batch")
    print(f"  {'batch':>6s} {'A2 llama-3-70b':>15s} {'CM384 DeepSeek-R1':>18s}")
    for b in batches:
        print(f"  {b:6d} {out['step_ms']['dense'][str(b)]:15.3f} {out['step_ms']['moe'][str(b)]:18.3f}")
    d, m = out["step_ms"]["dense"], out["step_ms"]["moe"]
    lo, hi = str(batches[0]), str(batches[-1])
    print(f"  growth {lo} -> {hi}: {d[hi] / d[lo]:.2f}x (A2), {m[hi] / m[lo]:.2f}x (CM384)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
