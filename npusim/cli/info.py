"""``npusim info ARCH|SYSTEM``: the derived figures a user checks first about a chip or a system."""

from __future__ import annotations

import dataclasses
import re

from npusim.choices import DEFAULT_ARCH
from npusim.resources import preset_names
from npusim.files import json_text
from npusim.cli.util import NODES_HELP, positive_int
from npusim.errors import ConfigError


def add_parser(sub):
    p = sub.add_parser(
        "info",
        help="print peak TFLOPS, SRAM, HBM and NoC figures of an arch file, or NPUs and fabrics of a system",
        description="Print the derived figures of an arch file or preset, or of a multi-NPU system file "
        f"(presets: {', '.join(preset_names())}).",
    )
    p.add_argument("arch", nargs="?", default=DEFAULT_ARCH,
                   help=f"arch or system YAML path or preset name (default {DEFAULT_ARCH})")
    p.add_argument("--nodes", type=positive_int, default=None, help=NODES_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def _print_rows(rows) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def run(args) -> int:
    from npusim.system.load import is_system_file

    if is_system_file(args.arch):
        return run_system(args)
    if args.nodes is not None:
        raise ConfigError(f"--nodes {args.nodes}: slices a system (cloudmatrix384, atlas-800i-a2 or a system file); "
                          f"{args.arch} is one chip")
    from npusim.arch import load_arch, summarize

    s = summarize(load_arch(args.arch))
    if args.json:
        print(json_text(s.to_dict()))
        return 0
    peak = ", ".join(f"{d} {v:,.1f}" for d, v in s.peak_tflops.items())
    _print_rows([
        ("chip", f"{s.name}: {s.cores} cores on a {s.mesh} mesh at {s.clock_ghz} GHz"),
        ("peak TFLOPS", peak),
        ("SRAM", f"{s.sram_mb_per_core:g} MB/core, {s.sram_mb_total:,.1f} MB total"),
        ("HBM", f"{s.hbm_gb:g} GB in {s.hbm_channels} channels, {s.hbm_bandwidth_gbps:,.1f} GB/s"),
        ("NoC", f"{s.noc_link_gbps:,.1f} GB/s per link per direction, bisection {s.noc_bisection_gbps:,.1f} GB/s"),
    ])
    return 0


def _description_of_nodes(description: str, nodes: int, file_nodes: int) -> str:
    """The system file's description for ``--nodes``: its node count (e.g. CloudMatrix384's "48
    nodes") becomes the slice's ("3 of its 48 nodes"), else the slice is said after it."""
    if nodes == file_nodes or not description:
        return description
    what = (f"{nodes} of its {file_nodes} nodes" if nodes < file_nodes else
            f"{nodes} nodes, its node repeated beyond the file's {file_nodes}")
    said = re.compile(rf"\b{file_nodes} nodes\b")
    if said.search(description):
        return said.sub(what, description, count=1)
    return f"{description} (--nodes {nodes}: {what})"


def run_system(args) -> int:
    from npusim.system.load import load_system
    from npusim.system.summary import summarize_system

    s = summarize_system(load_system(args.arch, nodes=args.nodes))
    if args.nodes is not None:
        file_nodes = load_system(args.arch).system.nodes
        s = dataclasses.replace(s, description=_description_of_nodes(s.description, s.nodes, file_nodes))
    if args.json:
        print(json_text(s.to_dict()))
        return 0
    rows = [
        ("system", f"{s.name}: {s.description}" if s.description else s.name),
        ("NPUs", f"{s.npus} in {s.nodes} node{'s' * (s.nodes > 1)}, {s.dies_per_npu} {s.chip} "
                 f"die{'s' * (s.dies_per_npu > 1)} each = {s.dies} dies; {s.cpus} CPUs"),
        ("peak TFLOPS", ", ".join(f"{d} {v:,.0f}" for d, v in s.peak_tflops.items())),
        ("per NPU", ", ".join(f"{d} {v:,.1f}" for d, v in s.peak_tflops_per_npu.items())),
        ("HBM", f"{s.hbm_gb:,.0f} GB in all, {s.hbm_gb_per_npu:g} GB and {s.hbm_bandwidth_gbps_per_npu:,.0f} GB/s per NPU"),
    ]
    if s.die_link_gbps:
        rows.append(("die-to-die", f"{s.die_link_gbps:g} GB/s per direction"))
    if s.cpus:
        rows.append(("CPU DRAM", f"{s.cpu_dram_gb:,.0f} GB in {s.cpus} CPUs (the caching pool)"))
    for name, f in s.fabrics.items():
        bis = f"{f['bisection_gbps']:,.0f} GB/s" if f["bisection_gbps"] else "n/a (the halves are not joined on it)"
        rows.append((f"fabric {name}", f"{f['per_npu_gbps']:,.0f} GB/s per NPU per direction "
                     f"({f['per_die_gbps']:,.0f} per die), bisection {bis}"))
    _print_rows(rows)
    return 0
