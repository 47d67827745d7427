"""The DeepSeek deployments away from their published batch: each decode row of
``npusim/validate/published.yaml`` re-run at a fraction of its batch (far below the published point
and at it), and its step's calibrated share.

A model whose constants were set at one operating point looks right there and drifts away from it;
this prints, per row and batch, TPOT, tokens/s per NPU, the MoE layer's period, the share of the
step in calibrated constants and in the runtime's kernel launches, and (at the published batch) the
error against the published figure with the row's kind (``fitted``: seen while modelling;
``calibration``; ``outside``). Only the CloudMatrix384 15 ms row is a published point at small
batch; the other small-batch rows have no figure to compare with (they show how the step scales).

    python validation/deepseek_batch_sweep.py [--fractions 0.0833,0.25,1] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys

from npusim.mapping.spec import MAPPER_DIR, load_deployment
from npusim.system.chipcost import ChipCost
from npusim.system.load import load_system
from npusim.system.moe_step import simulate_step
from npusim.validate.published import published


def kind_of(row: dict) -> str:
    return "calibration" if row.get("role") == "calibration" else "fitted" if row.get("fitted") else "outside"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fractions", default="0.0833,0.25,1", help="fractions of each row's batch (default 1/12, 1/4, 1)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    systems, costs, out = {}, {}, []
    for row in published()["deepseek_deployments"]:
        if row.get("phase") != "decode" or row.get("metric") not in ("tpot_ms", "tokens_per_s_per_npu"):
            continue
        loaded = systems.setdefault(row["system"], load_system(row["system"]))
        cc = costs.setdefault(row["system"], ChipCost(loaded.chip))
        dep = load_deployment(MAPPER_DIR / row["mapping"])
        for f in fractions:
            batch = max(float(loaded.system.npu.dies), round(row["batch"] * f))  # at least a sequence a die
            r = simulate_step(loaded, dep, batch=batch, kv=row.get("kv", 4096), mtp=row.get("mtp"),
                              mtp_acceptance=row.get("mtp_acceptance"), eplb=row.get("eplb"),
                              kv_min=row.get("kv_min"), chip_cost=cc)
            point = {"row": row["name"], "kind": kind_of(row), "batch_per_npu": batch, "tpot_ms": r.tpot_ms,
                     "tokens_per_s_per_npu": r.tokens_per_s_per_npu, "layer_us": r.layer_us,
                     "microbatches": r.microbatches, "calibrated_share": r.calibrated_share,
                     "kernel_launch_share": r.kernel_launch_ms / r.step_ms if r.step_ms else 0.0}
            if f == 1:
                point["published"] = row["published"]
                point["error"] = r.metric(row["metric"]) / row["published"] - 1
            out.append(point)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"{'row':44s} {'kind':11s} {'batch':>7s} {'mb':>3s} {'TPOT ms':>8s} {'tok/s/NPU':>10s} {'layer us':>9s} "
          f"{'calib':>6s} {'launch':>7s}  vs published")
    for p in out:
        err = f"{p['error']:+.1%} of {p['published']:g}" if "error" in p else ""
        print(f"{p['row']:44s} {p['kind']:11s} {p['batch_per_npu']:7g} {p['microbatches']:3d} {p['tpot_ms']:8.2f} "
              f"{p['tokens_per_s_per_npu']:10.1f} {p['layer_us']:9.1f} {p['calibrated_share']:6.0%} "
              f"{p['kernel_launch_share']:7.0%}  {err}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
