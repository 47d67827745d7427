"""The system serving run's step-time table against simulating each step (npusim itself, not an
outside figure): how far the bilinear interpolation between simulated grid points
(npusim/system/step_table.py) is from ``simulate_step`` at the same shape.

Off-grid step shapes (seeded) of the Atlas 800I A2 DeepSeek decode and prefill deployments (the
smallest published ones, so the check runs in minutes); prints each point's table and direct step
times and the error.

    python validation/system_step_table.py [--points 6] [--seed 0]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from npusim.mapping.spec import load_deployment
from npusim.system.chipcost import ChipCost
from npusim.system.load import load_system
from npusim.system.moe_step import simulate_step
from npusim.system.step_table import StepTable, deployment_step

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--points", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    a2 = load_system("atlas-800i-a2")
    cc = ChipCost(a2.chip)
    print(f"{'phase':8s} {'x':>8s} {'y':>8s} {'table ms':>10s} {'direct ms':>10s} {'error':>7s}")
    errors = []
    for phase, x_max, y_max in (("decode", 72, 6144), ("prefill", 4096, 8192)):
        dep = load_deployment(ROOT / "mappers" / f"a2-deepseek-{phase}.yaml")
        table = StepTable(deployment_step(a2, dep, "deepseek-r1", chip_cost=cc), phase, x_max=x_max, y_max=y_max,
                          x_min=1 if phase == "decode" else 128)
        for _ in range(args.points):
            x = float(rng.uniform(table.xs[0], x_max))
            y = float(rng.uniform(512, y_max))
            got = table.step_ms(x, y)
            if phase == "decode":
                ref = simulate_step(a2, dep, batch=x, kv=int(round(y)), chip_cost=cc, check_fit=False).step_ms
            else:
                ref = simulate_step(a2, dep, batch_tokens=int(round(x)), seq=int(round(y)), chip_cost=cc,
                                    check_fit=False).step_ms
            errors.append(got / ref - 1)
            print(f"{phase:8s} {x:8.1f} {y:8.0f} {got:10.2f} {ref:10.2f} {got / ref - 1:+7.1%}")
    e = np.abs(errors)
    print(f"\n|error| mean {e.mean():.1%}, max {e.max():.1%} over {len(e)} off-grid shapes "
          "(the table runs a step at its grid's shapes; sequences and tokens are rounded in the direct step)")


if __name__ == "__main__":
    main()
