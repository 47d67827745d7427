"""Small argument parsers shared by subcommands."""

from __future__ import annotations

import argparse
import re

# the shared flag types and the run's option readers (below the CLI), for the subcommands
from npusim.argtypes import (NODES_HELP, add_arch_arg, add_force_arg, fraction, non_negative_float,  # noqa: F401
                             non_negative_int, positive_float, positive_int, refuse_unless_forced)
from npusim.scenarios.options import (chip_arch, chip_noc, chip_streams, refuse_arch_with_system,  # noqa: F401
                                      system_chip_cost)

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30}


#: the largest size a flag takes, in bytes (1 PB: a thousand times a CloudMatrix384's HBM)
MAX_SIZE = 1e15


def parse_size(text: str) -> int:
    """``4096``, ``1e6``, ``64KiB``, ``2MB``, ``1GiB`` -> bytes (positive int)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (examples: 4096, 1e6, 64KiB, 2MB, 1GiB)")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"'{text}' must be a positive whole number of bytes")
    if value > MAX_SIZE:
        raise argparse.ArgumentTypeError(f"'{text}' is more than {MAX_SIZE:.0e} bytes (1 PB), beyond any memory "
                                         "or fabric npusim models")
    return int(value)


def parse_grid(text: str) -> tuple[int, int]:
    """``8x8`` -> (8, 8)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a grid like 8x8 (positive integers)")
    return int(m.group(1)), int(m.group(2))


def parse_int_list(text: str) -> list[int]:
    """``0,1,2,3`` or ``0-3`` (ranges allowed) -> [0, 1, 2, 3]."""
    out: list[int] = []
    try:
        for part in str(text).split(","):
            part = part.strip()
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if hi < lo:
                    raise ValueError
                out.extend(range(lo, hi + 1))
            elif part:
                out.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a list of core ids like 0,1,2,3 or 0-7") from None
    if not out:
        raise argparse.ArgumentTypeError("the list of core ids is empty")
    return out


#: packets the packet-level fabric model simulates without --force (~500,000 a second on one core)
MAX_PACKETS = 1e8


def refuse_many_packets(args, loaded, total_bytes: float) -> None:
    """At ``--fidelity packet``, refuse up front a transfer of more packets than :data:`MAX_PACKETS`."""
    if args.fidelity != "packet":
        return
    packet = min(f.packet_bytes for f in loaded.system.fabrics.values())
    refuse_unless_forced(args, total_bytes / packet, MAX_PACKETS, f"packets of {packet:,} B",
                         f"~{total_bytes / packet / 5e5 / 3600:,.1f} hours at the packet fidelity; the flow "
                         "fidelity times any size at once")


def add_system_args(p, required: bool = False) -> None:
    """``--system`` (a system preset or file) and ``--nodes`` (a slice of it)."""
    p.add_argument("--system", default=None if required else "cloudmatrix384", required=required,
                   help="system YAML path or preset: cloudmatrix384, atlas-800i-a2 (default cloudmatrix384)")
    p.add_argument("--nodes", type=positive_int, default=None, help=NODES_HELP)

