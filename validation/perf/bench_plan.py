"""``npusim plan`` speed: plan points simulated per wall second for a large decode instance, with
chip costs cached (a first pass fills the chip-cost cache; the timed pass reads it).

The case is issue 22's: a 160-NPU (320-die) DeepSeek-R1 decode instance on CloudMatrix384, W8A8,
context 4,096, one pipeline stage (``--max-pp 1``: decode instances of this size are data and
expert parallel), TPOT objective 50 ms, batches of 640 to 10,240 sequences. Prints plans, points
simulated, wall time, points per minute and the best plan, for 1 and 2 workers.

    python validation/perf/bench_plan.py [--workers 1 2] [--batches 640,1280,2560,5120,10240]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

from npusim.system.search import plan_label, search_plans  # noqa: E402

CASE = dict(system="cloudmatrix384", nodes=None, model="deepseek-r1", npus=160, phase="decode", seq=1024, kv=4096,
            slo_ms=50.0, precision="w8a8", max_pp=1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batches", default="640,1280,2560,5120,10240")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    print(machine_line())
    print("case: DeepSeek-R1 decode, 160 NPUs of CloudMatrix384, W8A8, kv 4096, TPOT <= 50 ms, pp 1; batches",
          args.batches)
    t0 = time.perf_counter()
    search_plans(**CASE, batches=batches, workers=max(args.workers))  # fills the chip-cost cache
    print(f"cache-filling pass: {time.perf_counter() - t0:.1f} s")
    print(f"{'workers':>7} {'plans':>6} {'points':>7} {'wall s':>8} {'points/min':>11}  best")
    for w in args.workers:
        t0 = time.perf_counter()
        r = search_plans(**CASE, batches=batches, workers=w)
        wall = time.perf_counter() - t0
        best = r["best"]
        label = f"{plan_label(best['plan'])} b{best['batch']}: {best['tpot_ms']:.1f} ms, " \
                f"{best['tokens_per_s_per_npu']:.0f} tok/s/NPU" if best else "none feasible"
        print(f"{w:>7} {r['plans']:>6} {r['evaluated']:>7} {wall:>8.1f} {60 * r['evaluated'] / wall:>11.1f}  {label}")


if __name__ == "__main__":
    main()
