"""``npusim collective``: time one collective over an ordered list of cores."""

from __future__ import annotations

import json

from npusim.arch import load_arch
from npusim.cli.util import add_arch_arg, parse_grid, parse_int_list, parse_size
from npusim.comm.collectives import OPS
from npusim.comm.run import run_collective


def add_parser(sub):
    p = sub.add_parser(
        "collective",
        help="time a collective (all-reduce, all-gather, ...) over an ordered list of cores",
        description="Run one collective on an idle chip and print its time and bus bandwidth. The --cores "
        "order is the ring order: reorder the cores to see how the layout changes hop counts.",
    )
    add_arch_arg(p)
    p.add_argument("--op", choices=OPS, default="allreduce")
    p.add_argument("--cores", type=parse_int_list, default="0,1,2,3", help="comma-separated core ids, ring order")
    p.add_argument("--bytes", type=parse_size, default="1MiB",
                   help="bytes per core (all-reduce, reduce-scatter, multicast) or in total (all-gather)")
    p.add_argument("--grid", type=parse_grid, default=None, metavar="RxC", help="rows x cols of --cores for 2D ops")
    p.add_argument("--fidelity", choices=["path", "analytical", "flit"], default="path", help="NoC model (default path)")
    p.add_argument("--dtype", default="bf16", help="element type of reductions (default bf16)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def run(args) -> int:
    arch = load_arch(args.arch)
    r = run_collective(arch, args.op, args.cores, args.bytes, args.fidelity, args.grid, args.dtype)
    if args.json:
        print(json.dumps(r.to_dict(), indent=2))
        return 0
    print(f"{arch.name}: {r.op} of {r.bytes:,} B over cores {','.join(map(str, r.cores))} ({r.fidelity} NoC)")
    print(f"  time           {r.time_us:,.3f} us ({r.cycles:,} cycles)")
    print(f"  bandwidth      algbw {r.algbw_gbps:,.1f} GB/s, busbw {r.busbw_gbps:,.1f} GB/s "
          f"(link peak {arch.noc.link_bytes_per_cycle * arch.clock_ghz:,.1f} GB/s)")
    print(f"  ring hops      {r.ring_hops} = {r.total_ring_hops} mesh hops per ring step")
    print(f"  messages       {r.messages:,}")
    return 0
