"""NpuSim A10 (PD fusion vs heterogeneous disaggregation), an ablation of what sets the gap.

The study (arXiv 2510.05632) reports disaggregation 1.34x fusion's throughput on a prefill-heavy
load (10:1 in:out) and fusion 2.3x on a decode-heavy one (1:5); npusim's setup
(``npusim/validate/serving_pd.py``: Qwen3-4B, fusion in 7 stages of TP 9 on the homogeneous
per-core-DRAM chip, disaggregation 42:21 with 7:7 stages on the heterogeneous one) has fusion ahead
on both. This script varies one assumption at a time on both loads and prints throughput, mean TTFT
and mean TBT:

* fusion with whole prompts in one iteration (budget and chunk 2,048) instead of chunked prefill
  (budget 512, chunks of 256): does prefill/decode interference under fusion cost throughput?
* disaggregation with the decode cores of the homogeneous chip (60 GB/s DRAM, not 240 GB/s): is
  the disaggregated decode instance bound by its DRAM bandwidth, as the study's heterogeneous
  decode cores assume?
* disaggregation 49:14: more prefill cores.

    python validation/pd_a10_ablation.py [--requests 16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.serving.requests import synthetic_requests  # noqa: E402
from npusim.validate.chips import hetero_chip, homogeneous  # noqa: E402
from npusim.validate.serving_pd import A10_LOADS, PdSetup, serve  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=16)
    args = ap.parse_args()
    setup = PdSetup(requests=args.requests)
    hetero = hetero_chip()
    homo = homogeneous(hetero)
    variants = (("fusion, chunked prefill (the study check)", dict(arch=homo)),
                ("fusion, whole prompts (budget/chunk 2048)", dict(arch=homo, budget=2048, chunk=2048)),
                ("disagg 42:21, heterogeneous decode (check)", dict(arch=hetero, pd=(42, 21))),
                ("disagg 42:21, homogeneous decode cores", dict(arch=homo, pd=(42, 21))),
                ("disagg 49:14, heterogeneous decode", dict(arch=hetero, pd=(49, 14))))
    print(f"{setup.describe()}")
    print(f"{'in:out':>6} {'variant':44s} {'tok/s':>8} {'TTFT ms':>8} {'TBT ms':>7} {'wall s':>6}")
    for label, inp, outp in A10_LOADS:
        if label == "1:1":
            continue
        reqs = synthetic_requests(setup.requests, setup.rate, input_len=inp, output_len=outp, seed=2)
        for name, kw in variants:
            t = time.perf_counter()
            s = serve(reqs=reqs, setup=setup, **kw)
            print(f"{label:>6} {name:44s} {s['throughput_tokens_per_s']:8.1f} {s['ttft_ms']['mean']:8.1f} "
                  f"{s['tbt_ms']['mean']:7.2f} {time.perf_counter() - t:6.0f}", flush=True)
    print(machine_line())


if __name__ == "__main__":
    main()
