"""The chip mapper's time for a GEMM against ChipCost's kernel for the same GEMM (issue 39 item 2:
"one GEMM lowering serves the chip simulator and ChipCost"). The mapper runs the GEMM as one weight
op of a graph, tensor parallel over all of the die's cores with the weights in HBM (ChipCost's
default mapping for a graph); ChipCost runs it alone. On a die with ``kernel.base_blocks`` both now
emit the same plan's tasks (:mod:`npusim.mapping.gemm_kernel`); what may still differ at the
detailed fidelities is only what surrounds them: which cores form the share (the mapper's TP group
in its layout's order, ChipCost's snake order: the same cores, other mesh positions per task list)
and where the operands sit in HBM (the mapper's weight and activation areas; ChipCost's from 0).

    python validation/gemm_lowerings.py [--arch ascend-910b4] [--dtype bf16] [--memory analytical]
                                        [--noc analytical] [--shapes all|main|decode|int8]
"""

from __future__ import annotations

import argparse

from npusim.config import validate
from npusim.mapping.spec import MappingSpec
from npusim.model.ir import Op
from npusim.system.chipcost import ChipCost

#: the four session-40 shapes (bf16), decode shapes (M = 1..64) and INT8 ones
SHAPES = {"main": [(16, 7168, 4096), (128, 4096, 4096), (1024, 4096, 4096), (4096, 4096, 4096)],
          "decode": [(1, 7168, 2048), (8, 4096, 4096), (64, 7168, 4096)],
          "int8": [(16, 7168, 4096), (512, 2048, 7168)]}


def lowering_rows(arch: str, shapes, dtype: str, memory: str = "analytical", noc: str = "analytical") -> list[dict]:
    """One row per ``(m, k, n)``: ChipCost's time, the mapper's, their ratio."""
    cc = ChipCost(arch, memory=memory, noc=noc, persist=False)
    spec = validate(MappingSpec, {"name": "lowerings", "tensor_parallel": {"degree": cc.arch.num_cores},
                                  "data_parallel": 1, "memory": {"weights": "hbm", "kv_cache": "hbm"}},
                    "gemm_lowerings mapping")
    rows = []
    for m, k, n in shapes:
        kernel = cc.gemm(m, k, n, dtype)
        mapped = cc.op(Op("gemm", "gemm", dtype=dtype, m=m, k=k, n=n, weight=True), spec=spec)
        rows.append({"shape": f"{m}x{k}x{n}", "dtype": dtype, "chipcost_us": kernel.time_us,
                     "mapper_us": mapped.time_us, "ratio": mapped.time_us / kernel.time_us,
                     "chipcost_mapping": kernel.mapping, "mapper_mapping": mapped.mapping})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="ascend-910b4")
    ap.add_argument("--dtype", default=None, help="default: bf16, int8 for --shapes int8")
    ap.add_argument("--memory", default="analytical")
    ap.add_argument("--noc", default="analytical")
    ap.add_argument("--shapes", default="main", choices=[*SHAPES, "all"])
    args = ap.parse_args()
    sets = list(SHAPES) if args.shapes == "all" else [args.shapes]
    print(f"{args.arch}, memory {args.memory}, NoC {args.noc}")
    print(f"{'m x k x n':>18s} {'dtype':>5s} {'ChipCost us':>12s} {'mapper us':>10s} {'mapper/ChipCost':>16s}")
    for name in sets:
        dtype = args.dtype or ("int8" if name == "int8" else "bf16")
        for r in lowering_rows(args.arch, SHAPES[name], dtype, args.memory, args.noc):
            print(f"{r['shape']:>18s} {r['dtype']:>5s} {r['chipcost_us']:12.2f} {r['mapper_us']:10.2f} "
                  f"{r['ratio']:16.4f}")


if __name__ == "__main__":
    main()
