"""``npusim mem``: achieved HBM bandwidth and latency for an access pattern."""

from __future__ import annotations

from npusim.choices import MEMORY_FIDELITIES, MEMORY_PATTERNS
from npusim.cli.util import add_arch_arg, add_force_arg, parse_size, positive_int, refuse_unless_forced
from npusim.files import json_text


def add_parser(sub):
    p = sub.add_parser(
        "mem",
        help="measure HBM bandwidth and latency for an access pattern",
        description="Stream, random or strided reads (or writes) through all cores' DMA engines into the "
        "arch's HBM; prints achieved bandwidth vs peak and vs the analytical DRAM bound for the pattern "
        "(bound_gbps: data bus after refresh for stream; ACT rate from tRRD/tFAW and row cycle per bank for "
        "random), and mean/p99 latency per channel. On a chip with an L2 the TLM fidelity simulates it too: "
        "--repeat re-reads the region, and the L2's hit rate is printed.",
    )
    add_arch_arg(p)
    p.add_argument("--pattern", choices=MEMORY_PATTERNS, default="stream")
    p.add_argument("--bytes", type=parse_size, default="64MiB", help="total bytes moved (e.g. 64MiB, 1e6; default 64MiB)")
    p.add_argument("--mode", choices=MEMORY_FIDELITIES, default="tlm", help="memory model fidelity (default tlm)")
    p.add_argument("--initiators", type=positive_int, default=None, help="DMA engines used (default: all)")
    p.add_argument("--write", action="store_true", help="write instead of read")
    p.add_argument("--stride", type=parse_size, default=4096, help="bytes between requests for --pattern strided")
    p.add_argument("--request-bytes", type=parse_size, default=None,
                   help="bytes per random request for --pattern random (a power of two; default the DMA "
                   "transaction size). Random reads are activation-bound: the fraction of peak grows with "
                   "the bytes read per row activation (e.g. 32 = one HBM2/HBM3 burst, as Ramulator2's random "
                   "traffic)")
    p.add_argument("--repeat", type=positive_int, default=1, metavar="N",
                   help="run the pattern N times over the same addresses (--bytes per pass; random draws new "
                   "ones): on a chip with an L2, at --mode tlm, later passes over a region that fits it hit "
                   "there (l2_hit_rate)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_force_arg(p, f"more than {MAX_TRANSACTIONS:.0e} DMA transactions at --mode tlm")
    return p


#: DMA transactions the TLM model takes without --force: ~3 minutes (~500,000 a second on one core)
MAX_TRANSACTIONS = 1e8


def _fmt(x, spec=".1f"):
    return "-" if x is None else format(x, spec)


def run(args) -> int:
    from npusim.arch import load_arch
    from npusim.sim.memory_probe import measure_memory

    from npusim.errors import ConfigError
    from npusim.sim.memory_probe import random_request_arch

    arch = load_arch(args.arch)
    if args.request_bytes is not None and args.pattern != "random":
        raise ConfigError("--request-bytes applies to --pattern random only")
    run_arch = arch if args.request_bytes is None else random_request_arch(arch, args.request_bytes)
    if args.mode == "tlm":
        txn = run_arch.cores.dma.transaction_bytes
        n = args.bytes * args.repeat / txn
        refuse_unless_forced(args, n, MAX_TRANSACTIONS, f"{txn}-byte DMA transactions",
                             f"~{n / 5e5 / 60:,.0f} minutes of TLM simulation; --mode analytical times any size")
    r = measure_memory(arch, args.pattern, args.bytes, args.mode, args.initiators, args.write, args.stride,
                       request_bytes=args.request_bytes, repeat=args.repeat)
    if args.json:
        print(json_text(r.to_dict()))
        return 0
    op = "write" if r.write else "read"
    size = f" in {r.request_bytes:,}-byte requests" if r.request_bytes else ""
    passes = f", {r.repeat} passes" if r.repeat > 1 else ""
    print(f"{arch.name}: {r.pattern} {op} of {r.bytes:,} B{size}{passes} by {r.initiators} DMA engines, {r.mode} model")
    print(f"  time              {r.time_ns / 1e3:,.2f} us ({r.cycles:,} cycles)")
    dram_gbps = r.efficiency * r.peak_bandwidth_gbps
    if r.l2_hit_bytes:  # the L2 served part of it: the DRAM moved the rest
        print(f"  bandwidth         {r.bandwidth_gbps:,.1f} GB/s delivered (L2 hits and HBM)")
        print(f"  HBM traffic       {dram_gbps:,.1f} GB/s of {r.peak_bandwidth_gbps:,.1f} peak "
              f"({100 * r.efficiency:.1f}%; the rest from the L2)")
    else:
        print(f"  bandwidth         {r.bandwidth_gbps:,.1f} GB/s of {r.peak_bandwidth_gbps:,.1f} peak "
              f"({100 * r.efficiency:.1f}%)")
    if r.bound_gbps is not None:
        terms = ", ".join(f"{k} {v:,.1f}" for k, v in r.bound_terms_gbps.items())
        print(f"  DRAM bound        {r.bound_gbps:,.1f} GB/s ({r.bound_limit}; {terms}); achieved "
              f"{100 * dram_gbps / r.bound_gbps:.1f}% of it")
    p99 = f"> {r.latency_ns_hist_max:,.0f}" if r.latency_ns_p99 is None and r.latency_ns_mean else _fmt(r.latency_ns_p99)
    print(f"  latency           mean {_fmt(r.latency_ns_mean)} ns, p99 {p99} ns "
          f"(unloaded row-conflict read {r.unloaded_latency_ns:.1f} ns)")
    if r.row_hit_rate is not None:
        print(f"  row-buffer hits   {100 * r.row_hit_rate:.1f}%")
    if r.l2_hit_rate is not None:
        print(f"  L2 hits           {100 * r.l2_hit_rate:.1f}% of {r.l2_read_bytes:,} B read "
              f"({r.l2_hit_bytes:,} B served by the L2, not HBM)")
    elif arch.l2 is not None and r.mode == "analytical":
        print("  L2                not simulated at the analytical fidelity (--mode tlm simulates it)")
    if r.mode == "analytical":
        print("  note: the analytical model shares channel bandwidth between transfers but has no DRAM")
        print("        timing, request queues or row-buffer effects; latencies are not simulated")
    if r.per_channel:
        print("  channel  GB/s    lat mean  lat p99  hits/miss/conflict")
        for c in r.per_channel:
            if c["bytes"]:
                print(f"  {c['channel']:>7}  {c['bandwidth_gbps']:6.1f}  {_fmt(c['latency_ns_mean']):>8}  "
                      f"{_fmt(c['latency_ns_p99']):>7}  {c['row_hits']}/{c['row_misses']}/{c['row_conflicts']}")
    return 0
