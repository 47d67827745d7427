"""``npusim fabric``: one point-to-point transfer on a system's fabric (the Table 1 microbenchmark)."""

from __future__ import annotations

from npusim.choices import FABRIC_FIDELITIES
from npusim.cli.util import add_force_arg, add_system_args, parse_size, refuse_many_packets
from npusim.files import json_text


def add_parser(sub):
    p = sub.add_parser(
        "fabric",
        help="time one read or write between two endpoints of a multi-NPU system",
        description="Time one transfer on an idle system fabric: --src initiates it, --dst is the memory it "
        "reads or writes. Endpoints are npuN.dieD (npuN = its die 0) and cpuN; NPUs 8k..8k+7 and CPUs "
        "4k..4k+3 sit in node k of the presets. Bandwidth = bytes / (completion time), so small transfers "
        "show latency and large ones the sustained rate.",
    )
    add_system_args(p)
    p.add_argument("--src", default="npu0.die0", help="initiating endpoint (default npu0.die0)")
    p.add_argument("--dst", default="npu8.die0", help="target endpoint (default npu8.die0: another node)")
    p.add_argument("--op", choices=["read", "write"], default="write")
    p.add_argument("--bytes", type=parse_size, default="64MiB", help="transfer size: 512, 64KiB, 256MiB (default 64MiB)")
    p.add_argument("--fabric", default=None, help="fabric to use (default: the first that connects them, e.g. ub)")
    p.add_argument("--via", choices=["sdma", "aiv"], default=None, help="SDMA engine or AIV-direct (default: the system's)")
    p.add_argument("--fidelity", choices=FABRIC_FIDELITIES, default="flow", help="fabric model (default flow)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_force_arg(p, "more than 1e8 packets at --fidelity packet")
    return p


def run(args) -> int:
    from npusim.system.load import load_system
    from npusim.system.measure import point_to_point

    loaded = load_system(args.system, nodes=args.nodes)
    refuse_many_packets(args, loaded, args.bytes)
    r = point_to_point(loaded, args.src, args.dst, args.op, args.bytes, args.fidelity, args.via, args.fabric)
    if args.json:
        print(json_text(r.to_dict()))
        return 0
    print(f"{loaded.system.name}: {r.op} of {r.bytes:,} B, {r.src} -> {r.dst} over {r.fabric} "
          f"({r.fidelity} model, {r.via})")
    print(f"  latency     {r.latency_us:,.3f} us")
    print(f"  bandwidth   {r.bandwidth_gbps:,.2f} GB/s ({r.wire_bytes:,} wire bytes)")
    print(f"  data path   {' -> '.join(r.path)} ({r.hops} hops)")
    return 0
