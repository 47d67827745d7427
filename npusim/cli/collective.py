"""``npusim collective``: time one collective over cores of a chip, or over dies of a system."""

from __future__ import annotations

from npusim.choices import CHIP_COLLECTIVES as CHIP_OPS
from npusim.choices import FABRIC_FIDELITIES, MOE_OPS, NOC_FIDELITIES, SYSTEM_ALGORITHMS
from npusim.choices import SYSTEM_COLLECTIVES as SYSTEM_OPS
from npusim.cli.util import (NODES_HELP, add_arch_arg, add_force_arg, chip_arch, non_negative_int, parse_grid,
                             parse_int_list, parse_size, positive_int, refuse_arch_with_system, refuse_many_packets,
                             refuse_unless_forced)
from npusim.errors import ConfigError
from npusim.files import json_text

#: flits the cycle-accurate NoC moves without --force (~1 M a second on one core)
MAX_FLITS = 1e8
ALGORITHM_CHOICES = sorted({a for algs in SYSTEM_ALGORITHMS.values() for a in algs})


def add_parser(sub):
    p = sub.add_parser(
        "collective",
        help="time a collective over an ordered list of cores (chip) or dies (--system), incl. MoE dispatch/combine",
        description="Run one collective on an idle chip (--cores, the NoC) or system (--system, the fabric "
        "between NPUs) and print its time and bus bandwidth. On a chip the --cores order is the ring order "
        "(--op alltoall sends straight from every core to every other, as MoE dispatch/combine do). "
        "On a system, --ranks N takes the first N dies (npu0.die0, npu0.die1, npu1.die0, ...) or a list of "
        "endpoint names; --op dispatch/combine times MoE expert-parallel token traffic over the first --ep dies.",
    )
    add_arch_arg(p, system=True)
    p.add_argument("--op", choices=sorted(set(CHIP_OPS) | set(SYSTEM_OPS) | set(MOE_OPS)), default="allreduce")
    p.add_argument("--cores", type=parse_int_list, default="0,1,2,3", help="chip: comma-separated core ids, ring order")
    p.add_argument("--bytes", type=parse_size, default="1MiB",
                   help="chip: bytes per core (all-reduce, reduce-scatter, multicast), in total (all-gather) or "
                   "what each core sends, 1/n to every core (all-to-all); "
                   "system: per rank, nccl-tests convention (all-gather: output size; all-to-all: what each rank sends)")
    p.add_argument("--grid", type=parse_grid, default=None, metavar="RxC", help="chip: rows x cols of --cores for 2D ops")
    p.add_argument("--fidelity", choices=NOC_FIDELITIES + FABRIC_FIDELITIES, default=None,
                   help="chip: NoC model path|analytical|flit (default path); system: fabric model flow|packet (default flow)")
    p.add_argument("--dtype", default=None, help="chip: element type of reductions (default bf16); "
                   "dispatch: int8 (with scales, default) or bf16")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    s = p.add_argument_group("multi-NPU system (--system)")
    s.add_argument("--system", default=None, help="system YAML path or preset (cloudmatrix384, atlas-800i-a2)")
    s.add_argument("--nodes", type=positive_int, default=None, help=NODES_HELP)
    s.add_argument("--ranks", default="16", help="first N dies, or names like npu0.die0,npu8.die1 (default 16)")
    s.add_argument("--algorithm", choices=ALGORITHM_CHOICES, default=None,
                   help="all-reduce: ring|halving_doubling|hierarchical; all-to-all: direct|hierarchical")
    s.add_argument("--via", choices=["sdma", "aiv"], default=None,
                   help="SDMA engines or AIV-direct writes (default: the system's; dispatch/combine: aiv)")
    s.add_argument("--ep", type=positive_int, default=32, help="dispatch/combine: EP ranks = the first EP dies (default 32)")
    s.add_argument("--tokens-per-rank", type=positive_int, default=128, help="dispatch/combine: tokens per rank (default 128)")
    s.add_argument("--top-k", type=positive_int, default=8, help="dispatch/combine: experts per token (default 8)")
    s.add_argument("--hidden", type=positive_int, default=7168, help="dispatch/combine: hidden size (default 7168)")
    s.add_argument("--experts", type=positive_int, default=256, help="dispatch/combine: routed experts (default 256)")
    s.add_argument("--copies", choices=["per-expert", "per-rank"], default=None,
                   help="dispatch/combine: one copy per selected expert (the low-latency kernels) or once per "
                        "destination rank (DeepEP's normal kernels); default: the system's decode kernels "
                        "(moe_operators.decode_copies)")
    s.add_argument("--routing", default="uniform",
                   help="dispatch/combine: uniform, zipf:S (skewed expert popularity) or a load-profile file")
    s.add_argument("--seed", type=non_negative_int, default=0, help="routing seed (default 0)")
    s.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    add_force_arg(p, "more than 1e8 packets (--system --fidelity packet) or flits (--fidelity flit)")
    return p


def run(args) -> int:
    if args.system is not None:
        refuse_arch_with_system(args)
        return run_system(args)
    if args.op not in CHIP_OPS:
        raise ConfigError(f"--op {args.op} needs --system (on a chip: {', '.join(CHIP_OPS)})")
    fidelity = args.fidelity or "path"
    if fidelity not in NOC_FIDELITIES:
        raise ConfigError(f"--fidelity {fidelity} is a fabric model (with --system); the NoC: {', '.join(NOC_FIDELITIES)}")
    from npusim.arch import load_arch
    from npusim.comm.run import run_collective

    arch = load_arch(chip_arch(args))
    if fidelity == "flit":
        flits = args.bytes * len(args.cores) / arch.noc.link_bytes_per_cycle
        refuse_unless_forced(args, flits, MAX_FLITS, "flits at the flit fidelity",
                             f"~{flits / 1e6 / 60:,.0f} minutes; the path fidelity times any size at once")
    r = run_collective(arch, args.op, args.cores, args.bytes, fidelity, args.grid, args.dtype or "bf16")
    if args.json:
        print(json_text(r.to_dict()))
        return 0
    print(f"{arch.name}: {r.op} of {r.bytes:,} B over cores {','.join(map(str, r.cores))} ({r.fidelity} NoC)")
    print(f"  time           {r.time_us:,.3f} us ({r.cycles:,} cycles)")
    print(f"  bandwidth      algbw {r.algbw_gbps:,.1f} GB/s, busbw {r.busbw_gbps:,.1f} GB/s "
          f"(link peak {arch.noc.link_bytes_per_cycle * arch.clock_ghz:,.1f} GB/s)")
    if r.op != "alltoall":  # an all-to-all's messages go straight to every core, not around the ring
        print(f"  ring hops      {r.ring_hops} = {r.total_ring_hops} mesh hops per ring step")
    print(f"  messages       {r.messages:,}")
    return 0


def run_system(args) -> int:
    from npusim.cli.progress import system_progress
    from npusim.system.load import load_system
    from npusim.system.measure import parse_ranks, run_moe
    from npusim.system.measure import run_collective as run_system_collective

    fidelity = args.fidelity or "flow"
    if fidelity not in FABRIC_FIDELITIES:
        raise ConfigError(f"--fidelity {fidelity} is a NoC model; with --system: {', '.join(FABRIC_FIDELITIES)}")
    if args.op not in SYSTEM_OPS + MOE_OPS:
        raise ConfigError(f"--op {args.op} is a chip collective; with --system: {', '.join(SYSTEM_OPS + MOE_OPS)}")
    if args.op in MOE_OPS:
        from npusim.system.moe import check_routing

        check_routing(args.routing)
    loaded = load_system(args.system, nodes=args.nodes)
    if args.op in MOE_OPS:
        refuse_many_packets(args, loaded, args.ep * args.tokens_per_rank * args.top_k * args.hidden * 2)
    else:
        ranks = parse_ranks(loaded, args.ranks)
        refuse_many_packets(args, loaded, 2 * args.bytes * len(ranks))
    with system_progress(args.progress, args.op) as bar:
        if args.op in MOE_OPS:
            r = run_moe(loaded, args.op, args.ep, args.tokens_per_rank, args.top_k, args.hidden, args.experts,
                        args.routing, args.dtype or "int8", fidelity, args.via or "aiv", args.seed, progress=bar,
                        copies=args.copies and args.copies.replace("-", "_"))
        else:
            r = run_system_collective(loaded, args.op, ranks, args.bytes, args.algorithm,
                                      fidelity, args.via, progress=bar, dtype=args.dtype or "bf16")
    out = r.to_dict()
    out["system"] = loaded.system.name
    if args.json:
        print(json_text(out))
        return 0
    print(f"{loaded.system.name}: {r.op} ({r.algorithm}) over {r.ranks} ranks, {r.bytes_per_rank:,} B per rank "
          f"({r.fidelity} model, {r.via})")
    print(f"  time        {r.time_us:,.2f} us")
    print(f"  bandwidth   algbw {r.algbw_gbps:,.1f} GB/s, busbw {r.bus_bandwidth_gbps:,.1f} GB/s")
    if args.op in MOE_OPS:
        print(f"  per rank    max {out['max_rank_bytes']:,} B, mean {out['mean_rank_bytes']:,.0f} B "
              f"(imbalance {out['imbalance']:.3f}; hottest expert {out['max_expert_tokens']} tokens, "
              f"mean {out['mean_expert_tokens']:.1f})")
    peak = f"peak link load {100 * r.peak_link_load:.1f}%" if r.fidelity == "flow" else "packets serialised per link"
    print(f"  simulated   {r.transfers:,} transfers, {r.events:,} events, {r.rate_updates:,} rate updates, {peak}")
    if "chip_cost_misses" in out:
        print(f"  chip costs  {out['chip_cost_hits']} cached, {out['chip_cost_misses']} simulated (reductions on the dies)")
    return 0
