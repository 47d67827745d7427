"""``npusim info ARCH``: the derived figures a user checks first about a chip."""

from __future__ import annotations

import json

from npusim.arch import load_arch, summarize
from npusim.arch.load import DEFAULT_ARCH, list_presets


def add_parser(sub):
    p = sub.add_parser(
        "info",
        help="print peak TFLOPS, SRAM, HBM and NoC figures of an arch file",
        description="Print the derived figures of an arch file or preset "
        f"(presets: {', '.join(list_presets())}).",
    )
    p.add_argument("arch", nargs="?", default=DEFAULT_ARCH, help=f"arch YAML path or preset name (default {DEFAULT_ARCH})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def run(args) -> int:
    s = summarize(load_arch(args.arch))
    if args.json:
        print(json.dumps(s.to_dict(), indent=2))
        return 0
    peak = ", ".join(f"{d} {v:,.1f}" for d, v in s.peak_tflops.items())
    rows = [
        ("chip", f"{s.name}: {s.cores} cores on a {s.mesh} mesh at {s.clock_ghz} GHz"),
        ("peak TFLOPS", peak),
        ("SRAM", f"{s.sram_mb_per_core:g} MB/core, {s.sram_mb_total:,.1f} MB total"),
        ("HBM", f"{s.hbm_gb:g} GB in {s.hbm_channels} channels, {s.hbm_bandwidth_gbps:,.1f} GB/s"),
        ("NoC", f"{s.noc_link_gbps:,.1f} GB/s per link per direction, bisection {s.noc_bisection_gbps:,.1f} GB/s"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    return 0
