"""Prefill's MoE dispatch/combine on CloudMatrix384 beside DeepEP-Ascend's normal (prefill) kernels:
why no per-call overhead of the normal kernels is calibrated.

Source (npusim/validate/published.yaml, ``moe_normal_kernels``; fitted: seen while modelling
prefill's operators): sgl-project/sgl-kernel-npu README, "Normal Kernels with Pure HCCS" (PR #106):
A3 384 SuperPOD, 4096 tokens per rank, hidden 7168, top-8 of 256 experts, INT8 dispatch, BF16
combine, a "bottleneck bandwidth" per EP. Its bytes are those of tests/python/deepep/test_intranode.py
at that commit (``recv_x.numel() * 2``: one row per (token, selected expert) a rank holds, its own
tokens included, in BF16 bytes), so a call took ``4096 x 8 x 7168 x 2 B / bandwidth`` (``published``).

Columns: ``published`` the call's time; ``sim/expert`` and ``sim/rank`` npusim's operator with no
per-call overhead (fabric + the chip simulator's local work) sending one copy per selected expert
(as DeepEP-Ascend's normal kernels do, and the Ascend presets' ``prefill_copies``: what a prefill
step uses) or once per destination rank (NVIDIA DeepEP's normal kernels); ``residual`` = published - sim/expert, what a
per-call constant would be by the decode overheads' recipe; ``wire GB/s``: the bytes an expert
rank receives (dispatch: INT8 rows with a 512 B scale slot) or sends back (combine: BF16 rows) over
the fabric, one row per selected expert on another rank, over the published call's time and over
the simulated one (sim/expert, local work included).

What it shows: every row is one token count, 3-8 ms a call, bandwidth-bound; the residual is
milliseconds (the decode kernels' whole calibrated overheads are 64 / 23 us) and it grows with EP
at the same bytes per rank. A fixed per-call cost and the kernels' sustained bandwidth cannot be
told apart from one message size, so none is calibrated: a constant fitted here would be charged
as fixed on every prefill call, whatever its tokens.

    python validation/moe_normal_kernels.py [--ep 32]
"""

from __future__ import annotations

import argparse
import sys

from npusim.system.load import load_system
from npusim.system.measure import run_moe
from npusim.validate.calibrate import _variant
from npusim.validate.published import published
from npusim.validate.systems import normal_kernel_time_us


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ep", type=int, action="append", default=None, help="only these EP sizes (repeatable)")
    args = ap.parse_args()
    print(f"{'system':15s} {'op':9s} {'EP':>4s} {'GB/s':>5s} {'published':>10s} {'sim/expert':>10s} {'sim/rank':>9s} "
          f"{'residual':>9s} {'wire GB/s pub':>13s} {'sim':>5s}")
    for entry in published()["moe_normal_kernels"]:
        base = load_system(entry["system"])
        bare = _variant(base, {"moe_operators": {"dispatch_overhead_us": 0.0, "combine_overhead_us": 0.0}})
        for row in entry["rows"]:
            if args.ep and row["ep"] not in args.ep:
                continue
            pub = normal_kernel_time_us(entry, row)
            runs = {c: run_moe(bare, row["op"], row["ep"], entry["tokens_per_rank"], entry["top_k"], entry["hidden"],
                               entry["experts"], "uniform", entry["dispatch_dtype"], "flow", "aiv", copies=c)
                    for c in ("per_expert", "per_rank")}
            pe = runs["per_expert"]
            wire = pe.extra["mean_rank_bytes"] / 1e3  # B / us / 1e3 = GB/s
            print(f"{entry['system']:15s} {row['op']:9s} {row['ep']:>4d} {row['gbps']:>5g} {pub:>8.0f}us "
                  f"{pe.time_us:>8.0f}us {runs['per_rank'].time_us:>7.0f}us {pub - pe.time_us:>7.0f}us "
                  f"{wire / pub:>13.1f} {wire / pe.time_us:>5.1f}")
    print("\nsim/rank: one copy per destination rank (NVIDIA DeepEP's normal kernels). No per-call constant is "
          "calibrated on these rows (one token count, bandwidth-bound): a prefill step charges the decode kernels' "
          "per-call overheads.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
