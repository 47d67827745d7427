"""DeepSeek-V3/R1 deployments on CloudMatrix384 and Atlas 800I A2 vs the published figures.

Sources (npusim/validate/published.yaml, each row naming its publication): the Huawei best-practice
report (Atlas 800I A2 decode B1 and prefill B2) and the CloudMatrix384 paper (decode B3; prefill
throughput, read from the abstract). One set of hardware parameters per chip and fabric (the presets),
no per-deployment factor; rows marked "calib" are the figures a preset parameter was calibrated on
(not counted as validation); the kind column says which rows were seen while modelling (fitted:
they are not validation either). The model is partial (see
npusim/system/moe_step.py): each row's breakdown says where the layer's time goes.

    python validation/deepseek_deployments.py
"""

from __future__ import annotations

import sys

from npusim.mapping.spec import MAPPER_DIR, load_deployment
from npusim.system.load import load_system
from npusim.validate.published import published
from npusim.system.moe_step import simulate_step

TOLERANCE = 0.10


def main() -> int:
    rows = published()["deepseek_deployments"]
    systems = {}
    misses = 0
    print(f"{'case':36s} {'metric':22s} {'published':>10s} {'simulated':>10s} {'error':>7s}  verdict  {'kind':11s} "
          "layer breakdown (us)")
    for row in rows:
        loaded = systems.setdefault(row["system"], load_system(row["system"]))
        dep = load_deployment(MAPPER_DIR / row["mapping"])
        r = simulate_step(loaded, dep, batch=row.get("batch"), kv=row.get("kv", 4096),
                          batch_tokens=row.get("batch_tokens"), seq=row.get("seq", 4096), mtp=row.get("mtp"),
                          mtp_acceptance=row.get("mtp_acceptance"), eplb=row.get("eplb"), kv_min=row.get("kv_min"))
        sim = r.metric(row["metric"])
        err = sim / row["published"] - 1
        ok = abs(err) <= TOLERANCE
        calib = row.get("role") == "calibration"
        kind = "calibration" if calib else "fitted" if row.get("fitted") else "outside"
        misses += not ok and not calib
        parts = ", ".join(f"{k} {v:.0f}" for k, v in r.breakdown_us.items() if v)
        steps = ", ".join(f"{k} {v:.1f}" for k, v in r.step_breakdown_ms.items() if v)
        print(f"{row['name']:36s} {row['metric']:22s} {row['published']:>10g} {sim:>10.1f} {err:>+7.1%}  "
              f"{'calib' if calib else 'ok' if ok else 'MISS':7s}  {kind:11s} layer {r.layer_us:.0f}: {parts}; step (ms) {steps}")
    print(f"\n{misses} of {len(rows)} rows outside ±{TOLERANCE:.0%}. {r.note}")
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
