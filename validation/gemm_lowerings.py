"""The chip mapper's time for a GEMM against ChipCost's kernel for the same GEMM (issue 39 item 2:
"one GEMM lowering serves the chip simulator and ChipCost" -- not yet: this prints how far apart the
two lowerings are). The mapper runs the GEMM as one weight op, tensor parallel over all of the die's
cores with the weights streamed from HBM (ChipCost's default mapping for a graph); ChipCost runs
its own kernel (the arch's base blocks dealt in waves, or the even split).

    python validation/gemm_lowerings.py [--arch ascend-910b4] [--dtype bf16]
"""

from __future__ import annotations

import argparse

from npusim.config import validate
from npusim.mapping.spec import MappingSpec
from npusim.model.ir import Op
from npusim.system.chipcost import ChipCost

SHAPES = [(16, 7168, 4096), (128, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="ascend-910b4")
    ap.add_argument("--dtype", default="bf16")
    args = ap.parse_args()
    cc = ChipCost(args.arch, persist=False)
    spec = validate(MappingSpec, {"name": "lowerings", "tensor_parallel": {"degree": cc.arch.num_cores},
                                  "data_parallel": 1, "memory": {"weights": "hbm", "kv_cache": "hbm"}},
                    "gemm_lowerings mapping")
    print(f"{'m x k x n':>18s} {'ChipCost us':>12s} {'mapper us':>10s} {'mapper/ChipCost':>16s}")
    for m, k, n in SHAPES:
        kernel = cc.gemm(m, k, n, args.dtype).time_us
        mapped = cc.op(Op("gemm", "gemm", dtype=args.dtype, m=m, k=k, n=n, weight=True), spec=spec).time_us
        print(f"{f'{m}x{k}x{n}':>18s} {kernel:12.2f} {mapped:10.2f} {mapped / kernel:16.2f}")


if __name__ == "__main__":
    main()
