"""``npusim gemm``: cycles and utilisation of one GEMM on one core (the compute model alone)."""

from __future__ import annotations

import json

from npusim.arch import load_arch
from npusim.arch.schema import DTYPE_BYTES
from npusim.cli.util import add_arch_arg, parse_grid
from npusim.errors import ConfigError
from npusim.hw.compute.systolic import gemm_cost
from npusim.hw.memory.sram import sram_access_cost


def add_parser(sub):
    p = sub.add_parser(
        "gemm",
        help="cycles and utilisation of one GEMM on one core's systolic array",
        description="Time C[M x N] = A[M x K] . B[K x N] on one core with operands already in SRAM "
        "(the systolic-array model alone); --array and --dataflow override the arch file.",
    )
    add_arch_arg(p)
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--k", type=int, required=True)
    p.add_argument("--n", type=int, required=True)
    p.add_argument("--dtype", default="fp16", help="fp16, bf16, int8, ... (must be supported by the array)")
    p.add_argument("--array", type=parse_grid, default=None, metavar="RxC", help="array rows x cols, e.g. 128x128")
    p.add_argument("--dataflow", choices=["ws", "os"], default=None)
    p.add_argument("--batch", type=int, default=1, help="independent GEMMs back to back (default 1)")
    p.add_argument("--double-buffer", dest="double_buffer", action="store_true", default=None,
                   help="load the next fold's weights during the current fold (default: the arch's "
                   "systolic_array.double_buffered_weights)")
    p.add_argument("--no-double-buffer", dest="double_buffer", action="store_false")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def run(args) -> int:
    arch = load_arch(args.arch)
    sa = arch.cores.systolic_array
    rows, cols = args.array or (sa.rows, sa.cols)
    dataflow = args.dataflow or sa.dataflow
    if args.dtype not in sa.macs_per_pe_per_cycle:
        raise ConfigError(f"--dtype {args.dtype}: {arch.name}'s array supports {sorted(sa.macs_per_pe_per_cycle)}")
    k_per_pe = sa.macs_per_pe_per_cycle[args.dtype]
    elem = DTYPE_BYTES[args.dtype]
    try:
        cost = gemm_cost(args.m, args.k, args.n, rows, cols, dataflow, k_per_pe, sa.weight_injection_cycles,
                         bytes_per_elem=max(1, int(elem)), batch=args.batch,
                         double_buffer=sa.double_buffered_weights if args.double_buffer is None else args.double_buffer)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    sram = arch.cores.sram
    traffic = cost.sram_read_bytes + cost.sram_write_bytes
    sram_cycles = sram_access_cost(sram, count=max(1, -(-traffic // 64)), access_bytes=64).cycles if traffic else 0
    tflops = 2 * cost.macs / (cost.cycles / arch.clock_ghz) / 1e3 if cost.cycles else 0.0  # macs include batch
    out = {
        "m": args.m, "k": args.k, "n": args.n, "batch": cost.batch, "dtype": args.dtype,
        "array": f"{rows}x{cols}", "k_per_pe": k_per_pe, "dataflow": dataflow,
        "cycles": cost.cycles, "time_ns": cost.cycles / arch.clock_ghz, "macs": cost.macs,
        "utilization": cost.utilization, "tflops": tflops, "folds": cost.folds,
        "t_tile": cost.t_tile, "n_tile": cost.n_tile, "t_inj": cost.t_inj, "fill_drain": cost.fill_drain,
        "formula": cost.formula,
        "sram_read_bytes": cost.sram_read_bytes, "sram_write_bytes": cost.sram_write_bytes,
        "sram_bound_cycles": sram_cycles, "sram_bound": sram_cycles > cost.cycles,
    }
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    print(f"GEMM {args.m}x{args.k}x{args.n} ({args.dtype}, batch {cost.batch}) on a {rows}x{cols} "
          f"{dataflow.upper()} array, {k_per_pe} MAC/PE/cycle")
    print(f"  cycles        {cost.cycles:,} ({out['time_ns']:,.1f} ns at {arch.clock_ghz} GHz)")
    print(f"  utilisation   {100 * cost.utilization:.1f}%  ({tflops:,.2f} TFLOPS on one core)")
    print(f"  tiling        {cost.folds} folds: {cost.formula}")
    print(f"  SRAM traffic  {cost.sram_read_bytes:,} B read, {cost.sram_write_bytes:,} B written "
          f"(>= {sram_cycles:,} cycles at the SRAM's bandwidth{'; SRAM-bound' if out['sram_bound'] else ''})")
    return 0
