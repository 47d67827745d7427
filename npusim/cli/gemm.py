"""``npusim gemm``: cycles and utilisation of one GEMM on one core (the compute model alone), or with
``--chip`` spread over a chip's cores with its HBM traffic (:mod:`npusim.system.chipcost`)."""

from __future__ import annotations

from npusim.choices import MEMORY_FIDELITIES
from npusim.cli.util import (add_arch_arg, add_force_arg, non_negative_float, non_negative_int, parse_grid,
                              positive_float, positive_int, refuse_unless_forced)
from npusim.errors import ConfigError
from npusim.files import json_text


def add_parser(sub):
    p = sub.add_parser(
        "gemm",
        help="cycles and utilisation of one GEMM on one core's systolic array (or, with --chip, on the chip)",
        description="Time C[M x N] = A[M x K] . B[K x N] on one core with operands already in SRAM "
        "(the systolic-array model alone); --array and --dataflow override the arch file. --memory tlm "
        "(the detailed fidelity) serves the array's operand, weight and output streams through the "
        "SRAM's ports and reports the cycles it stalls (sram_stall_cycles); analytical (default) is the "
        "stall-free closed form. With --chip: "
        "spread over all of the chip's cores (or --cores N of them) by the chip simulator, A and B read "
        "from HBM and C written back, as a vendor's operator benchmark reports it; on a chip with an L2 "
        "(the arch's l2 section) re-reads hit there: --memory tlm simulates the cache transaction by "
        "transaction (l2_model: tlm), the analytical fidelity counts hits by reuse distance (reuse).",
    )
    add_arch_arg(p)
    p.add_argument("--m", type=positive_int, required=True)
    p.add_argument("--k", type=positive_int, required=True)
    p.add_argument("--n", type=positive_int, required=True)
    p.add_argument("--dtype", default="fp16", help="fp16, bf16, int8, ... (must be supported by the array)")
    p.add_argument("--array", type=parse_grid, default=None, metavar="RxC", help="array rows x cols, e.g. 128x128")
    p.add_argument("--dataflow", choices=["ws", "os", "cube"], default=None)
    p.add_argument("--t-inj", dest="t_inj", type=non_negative_int, default=None, metavar="CYCLES",
                   help="weight-injection cycles per WS fold (default: the arch's, which follows --array: "
                   "rows unless the arch file sets it, then scaled with the rows)")
    p.add_argument("--batch", type=positive_int, default=1, help="independent GEMMs back to back (default 1)")
    p.add_argument("--double-buffer", dest="double_buffer", action="store_true", default=None,
                   help="load the next fold's weights during the current fold (default: the arch's "
                   "systolic_array.double_buffered_weights)")
    p.add_argument("--no-double-buffer", dest="double_buffer", action="store_false")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    chip = p.add_argument_group("whole chip (--chip)")
    chip.add_argument("--chip", action="store_true",
                      help="time the GEMM on all of the chip's cores with its HBM traffic (the chip simulator)")
    chip.add_argument("--cores", type=positive_int, default=None, metavar="N", help="only the first N cores (a share)")
    p.add_argument("--memory", choices=MEMORY_FIDELITIES, default="analytical",
                   help="memory fidelity (default analytical): on one core, tlm puts the SRAM ports in the "
                   "timing path; with --chip, the HBM (and SRAM) fidelity of the chip simulator")
    chip.add_argument("--out-dtype", dest="out_dtype", default=None,
                      help="dtype of C (default: bf16 for int8/int4/fp8 inputs, else --dtype)")
    chip.add_argument("--l2-mb", dest="l2_mb", type=non_negative_float, default=None, metavar="MB",
                      help="what-if: the chip's shared L2 with this capacity in MiB (0: no L2, every load "
                      "from HBM); default: the arch file's l2 section")
    chip.add_argument("--l2-bytes-per-cycle", dest="l2", type=positive_float, default=None, metavar="B",
                      help="bracket: an ideal shared L2 of unlimited capacity serving operand re-reads at B "
                      "bytes/cycle per core, in place of the arch's L2")
    chip.add_argument("--no-cache", dest="cache", action="store_false",
                      help="do not read or write the on-disk chip-cost cache")
    add_force_arg(p, f"a GEMM of more than {MAX_FOLDS:.0e} array folds (one core) or {MAX_CHIP_UNITS:.0e} "
                  "128x512x128 units (--chip)")
    return p


#: the most array folds (x batch) one core's model walks fold by fold unless --force (~1 minute)
MAX_FOLDS = 1e9
#: the most 128 x 512 x 128 (m x k x n) units (x batch) a chip GEMM is built from unless --force: the
#: kernel's tasks and the Python that plans them grow with them (~20 s per million)
MAX_CHIP_UNITS = 1e6
#: the largest GEMM at all, in MACs: its cycles must fit a 64-bit integer on any array
MAX_MACS = 2**62


def check_size(args, work: int, limit: float, what: str) -> None:
    """Refuse, up front and with the estimate, a GEMM the model cannot represent, or whose ``work``
    (folds or units of ``what``) exceeds ``limit`` without --force."""
    macs = args.m * args.k * args.n * args.batch
    if macs > MAX_MACS:
        raise ConfigError(f"--m x --k x --n x --batch = {macs:.2e} MACs: more than {MAX_MACS:.2e}, beyond 64-bit cycle "
                          "counts")
    refuse_unless_forced(args, work, limit, f"{what} (x --batch)", "minutes to hours of simulation")


CHIP_ONLY = (("cores", "--cores"), ("out_dtype", "--out-dtype"), ("l2", "--l2-bytes-per-cycle"), ("l2_mb", "--l2-mb"))
CORE_ONLY = (("array", "--array"), ("dataflow", "--dataflow"), ("double_buffer", "--double-buffer"),
             ("t_inj", "--t-inj"))


def run(args) -> int:
    if args.chip:
        return run_chip(args)
    given = [flag for attr, flag in CHIP_ONLY if getattr(args, attr) is not None]
    if not args.cache:
        given.append("--no-cache")
    if given:
        raise ConfigError(f"{', '.join(given)} need --chip")
    from npusim.arch import load_arch
    from npusim.arch.schema import DTYPE_BYTES
    from npusim.hw.compute.systolic import gemm_cost
    from npusim.hw.memory.sram import sram_access_cost
    from npusim.hw.memory.sram_timing import gemm_sram_timing

    arch = load_arch(args.arch)
    sa = arch.cores.systolic_array
    # an override resizes the array: derived parameters (T_inj) follow unless --t-inj sets them
    sa = sa.resized(*(args.array or (sa.rows, sa.cols)), t_inj=args.t_inj)
    rows, cols = sa.rows, sa.cols
    dataflow = args.dataflow or sa.dataflow
    if args.dtype not in sa.macs_per_pe_per_cycle:
        raise ConfigError(f"--dtype {args.dtype}: {arch.name}'s array supports {sorted(sa.macs_per_pe_per_cycle)}")
    k_per_pe = sa.macs_per_pe_per_cycle[args.dtype]
    dataflow_folds = -(-args.k // (rows * k_per_pe)) if dataflow == "ws" else -(-args.m // rows)
    check_size(args, dataflow_folds * -(-args.n // cols) * args.batch, MAX_FOLDS, "array folds")
    elem = DTYPE_BYTES[args.dtype]
    try:
        cost = gemm_cost(args.m, args.k, args.n, rows, cols, dataflow, k_per_pe, sa.t_inj,
                         bytes_per_elem=max(1, int(elem)), batch=args.batch,
                         double_buffer=sa.double_buffered_weights if args.double_buffer is None else args.double_buffer)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    sram = arch.cores.sram
    double_buffer = sa.double_buffered_weights if args.double_buffer is None else args.double_buffer
    timing = gemm_sram_timing(args.m, args.k, args.n, rows, cols, dataflow, k_per_pe, sa.t_inj,
                              sram if args.memory == "tlm" else None, args.dtype, args.batch, double_buffer,
                              out_dtype=args.dtype)
    traffic = cost.sram_read_bytes + cost.sram_write_bytes
    sram_cycles = sram_access_cost(sram, count=max(1, -(-traffic // 64)), access_bytes=64).cycles if traffic else 0
    cycles = timing.cycles
    tflops = 2 * cost.macs / (cycles / arch.clock_ghz) / 1e3 if cycles else 0.0  # macs include batch
    utilization = cost.macs / (cycles * rows * cols * k_per_pe)
    out = {
        "m": args.m, "k": args.k, "n": args.n, "batch": cost.batch, "dtype": args.dtype,
        "array": f"{rows}x{cols}", "k_per_pe": k_per_pe, "dataflow": dataflow,
        "memory_fidelity": args.memory,
        "cycles": cycles, "time_ns": cycles / arch.clock_ghz, "macs": cost.macs,
        "utilization": utilization, "tflops": tflops, "folds": cost.folds,
        "t_tile": cost.t_tile, "n_tile": cost.n_tile, "t_inj": cost.t_inj, "fill_drain": cost.fill_drain,
        "formula": cost.formula,
        "sram_read_bytes": cost.sram_read_bytes, "sram_write_bytes": cost.sram_write_bytes,
        "sram_bound_cycles": sram_cycles, "sram_bound": sram_cycles > cost.cycles,
        "stall_free_cycles": cost.cycles, "sram_stall_cycles": timing.stall_cycles,
        "sram_port_width_bits": sram.port_width_bits, "sram_feeds_compute": sram.feeds_compute,
        "sram_port_utilization": timing.port_utilization,
    }
    if args.json:
        print(json_text(out))
        return 0
    print(f"GEMM {args.m}x{args.k}x{args.n} ({args.dtype}, batch {cost.batch}) on a {rows}x{cols} "
          f"{dataflow.upper()} array, {k_per_pe} MAC/PE/cycle")
    print(f"  cycles        {cycles:,} ({out['time_ns']:,.1f} ns at {arch.clock_ghz} GHz)")
    print(f"  utilisation   {100 * utilization:.1f}%  ({tflops:,.2f} TFLOPS on one core)")
    print(f"  tiling        {cost.folds} folds: {cost.formula}")
    print(f"  SRAM traffic  {cost.sram_read_bytes:,} B read, {cost.sram_write_bytes:,} B written "
          f"(>= {sram_cycles:,} cycles at the SRAM's bandwidth{'; SRAM-bound' if out['sram_bound'] else ''})")
    if args.memory == "tlm" and sram.feeds_compute:
        print(f"  SRAM stalls   {timing.stall_cycles:,} cycles ({sram.banks} banks x {sram.port_width_bits}-bit ports, "
              f"{100 * timing.port_utilization:.1f}% busy; stall-free {cost.cycles:,})")
    elif args.memory == "tlm":
        print(f"  SRAM stalls   none: {arch.name}'s SRAM does not feed the array (sram.feeds_compute: false)")
    else:
        print("  SRAM stalls   not modelled at the analytical fidelity (--memory tlm times the SRAM ports)")
    return 0


def run_chip(args) -> int:
    """``--chip``: the GEMM over a chip (share) through the chip-cost interface."""
    from npusim.arch import load_arch
    from npusim.arch.schema import DTYPE_BYTES
    from npusim.system.chipcost import ChipCost

    given = [flag for attr, flag in CORE_ONLY if getattr(args, attr) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)} apply to the single-core model, not to --chip "
                          "(edit the arch file instead)")
    arch = load_arch(args.arch)
    sa = arch.cores.systolic_array
    if args.dtype not in sa.macs_per_pe_per_cycle:
        raise ConfigError(f"--dtype {args.dtype}: {arch.name}'s array supports {sorted(sa.macs_per_pe_per_cycle)}")
    if args.out_dtype is not None and args.out_dtype not in DTYPE_BYTES:
        raise ConfigError(f"--out-dtype {args.out_dtype}: expected one of {list(DTYPE_BYTES)}")
    if args.cores is not None and not 1 <= args.cores <= arch.num_cores:
        raise ConfigError(f"--cores {args.cores}: {arch.name} has {arch.num_cores} cores (1..{arch.num_cores})")
    if args.l2 is not None and args.l2 < 1e-3:
        raise ConfigError(f"--l2-bytes-per-cycle must be at least 0.001 bytes per cycle per core, got {args.l2:g}")
    units = -(-args.m // 128) * -(-args.k // 512) * -(-args.n // 128) * args.batch
    check_size(args, units, MAX_CHIP_UNITS, "128x512x128 units")
    if args.l2_mb is not None and args.l2 is not None:
        raise ConfigError("--l2-mb sizes the arch's L2, --l2-bytes-per-cycle replaces it by an ideal one: give one")
    if args.l2_mb is not None:
        arch = with_l2_capacity(arch, args.l2_mb)
    cc = ChipCost(arch, memory=args.memory, persist=args.cache, l2_bytes_per_cycle=args.l2)
    r = cc.gemm(args.m, args.k, args.n, args.dtype, args.cores, batch=args.batch, out_dtype=args.out_dtype)
    # who decided the hits: the simulator's transaction-level cache (--memory tlm), the reuse-distance
    # model (analytical), the ideal bracket (--l2-bytes-per-cycle), or nobody (no L2)
    l2_model = ("ideal" if args.l2 is not None else None if arch.l2 is None
                else "tlm" if args.memory == "tlm" else "reuse")
    out = {
        "m": args.m, "k": args.k, "n": args.n, "batch": args.batch, "dtype": args.dtype,
        "out_dtype": args.out_dtype or ("bf16" if args.dtype in ("int8", "int4", "fp8") else args.dtype),
        "arch": arch.name, "chip": True, "memory_fidelity": r.memory_fidelity,
        "cores": r.cores, "cores_used": r.cores_used, "chip_cores": r.chip_cores,
        "cycles": r.cycles, "time_us": r.time_us, "flops": r.flops, "tflops": r.tflops,
        "peak_tflops": r.peak_tflops_chip, "compute_utilization": r.compute_utilization,
        "share_compute_utilization": r.share_compute_utilization,
        "hbm_bytes": r.hbm_bytes, "hbm_read_bytes": r.hbm_read_bytes, "hbm_write_bytes": r.hbm_write_bytes,
        "min_hbm_bytes": r.min_hbm_bytes, "l2_read_bytes": r.l2_read_bytes, "l2_hit_rate": r.l2_hit_rate,
        "l2_mb": None if arch.l2 is None else arch.l2.capacity_mb, "l2_bytes_per_cycle": args.l2,
        "l2_model": l2_model,
        "hbm_bandwidth_gbps": r.hbm_bandwidth_gbps, "hbm_peak_bandwidth_gbps": r.hbm_peak_bandwidth_gbps,
        "hbm_utilization": r.hbm_utilization, "sram_stall_cycles": r.sram_stall_cycles, "mapping": r.mapping,
    }
    if args.json:
        print(json_text(out))
        return 0
    share = f"{r.cores} of {r.chip_cores} cores" if r.cores < r.chip_cores else f"all {r.chip_cores} cores"
    print(f"GEMM {'%dx' % args.batch if args.batch > 1 else ''}{args.m}x{args.k}x{args.n} ({args.dtype} -> "
          f"{out['out_dtype']}) on {arch.name}, {share}, {r.memory_fidelity} HBM")
    print(f"  time          {r.time_us:,.2f} us ({r.cycles:,} cycles at {arch.clock_ghz} GHz)")
    print(f"  compute       {r.tflops:,.1f} TFLOPS = {100 * r.compute_utilization:.1f}% of the chip's "
          f"{r.peak_tflops_chip:,.1f}" + (f" ({100 * r.share_compute_utilization:.1f}% of the share's)"
                                          if r.cores < r.chip_cores else ""))
    print(f"  HBM           {r.hbm_bytes / 1e6:,.2f} MB ({r.hbm_read_bytes / 1e6:,.2f} read, "
          f"{r.hbm_write_bytes / 1e6:,.2f} written; compulsory {r.min_hbm_bytes / 1e6:,.2f}) at "
          f"{r.hbm_bandwidth_gbps:,.1f} GB/s = {100 * r.hbm_utilization:.1f}% of {r.hbm_peak_bandwidth_gbps:,.0f}")
    if args.l2 is not None:
        print(f"  ideal L2      {r.l2_read_bytes / 1e6:,.2f} MB of re-reads at {args.l2:g} B/cycle per core "
              f"({100 * r.l2_hit_rate:.1f}% of the loads)")
    elif arch.l2 is not None:
        how = (f"measured by the TLM cache, {arch.l2.ways}-way, {arch.l2.line_bytes} B lines, "
               f"{arch.l2.slices} slice{'s' if arch.l2.slices > 1 else ''}" if l2_model == "tlm"
               else "by the reuse-distance model; --memory tlm simulates the cache")
        print(f"  L2            {100 * r.l2_hit_rate:.1f}% of the loads hit ({r.l2_read_bytes / 1e6:,.2f} MB) in "
              f"{arch.l2.capacity_mb:g} MiB at {arch.l2.bandwidth_gbps:,.0f} GB/s ({how})")
    else:
        print(f"  L2            none on {arch.name}: every load from HBM")
    print(f"  kernel        {r.mapping}")
    if r.kernel_start_us:
        print(f"  start         {r.kernel_start_us:.2f} us kernel start inside the time (the arch's kernel.start_us), "
              "then each core's prologue (kernel.cube_setup_us)")
    return 0


def with_l2_capacity(arch, capacity_mb: float):
    """``arch`` with its L2 resized to ``capacity_mb`` MiB (0: without an L2); a chip whose arch file
    has no L2 cannot be given one this way (its bandwidth would be invented)."""
    if capacity_mb == 0:
        return arch.model_copy(update={"l2": None})
    if arch.l2 is None:
        raise ConfigError(f"--l2-mb {capacity_mb:g}: {arch.name} has no l2 section to resize (add one to the "
                          "arch file: capacity_mb, bandwidth_gbps)")
    return arch.model_copy(update={"l2": arch.l2.model_copy(update={"capacity_mb": capacity_mb})})
