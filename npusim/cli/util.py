"""Small argument parsers shared by subcommands."""

from __future__ import annotations

import argparse
import math
import re

from npusim.errors import ConfigError

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30}


#: the largest integer a flag takes: beyond it no simulation could run (and NumPy's int64 overflows)
MAX_INT = 2**53


def _number(base: type, low: float, low_open: bool, high: float | None, what: str):
    """An argparse ``type`` for a finite number of ``base`` in a range; says what it expected."""

    def parse(text: str):
        try:
            value = base(text)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"'{text}' is not {what}") from None
        ok = math.isfinite(value) and (value > low if low_open else value >= low) and abs(value) <= MAX_INT
        if not ok or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"'{text}' is not {what}")
        return value

    parse.base_type = base  # the sweep schema types options by it (npusim.sweep.spec)
    parse.__name__ = what.replace(" ", "_")
    return parse


positive_int = _number(int, 0, True, None, "a positive integer")
non_negative_int = _number(int, 0, False, None, "a non-negative integer")
positive_float = _number(float, 0.0, True, None, "a positive finite number")
non_negative_float = _number(float, 0.0, False, None, "a non-negative finite number")
fraction = _number(float, 0.0, False, 1.0, "a number in [0, 1]")


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


def add_force_arg(p, what: str) -> None:
    """``--force``: run a size the command would otherwise refuse as too big (``what``)."""
    p.add_argument("--force", action="store_true", help=f"run {what} anyway (refused by default: hours of "
                   "simulation or more memory than a workstation has)")


def refuse_unless_forced(args, amount: float, limit: float, what: str, estimate: str) -> None:
    """A ConfigError, before anything runs, when ``amount`` of ``what`` exceeds ``limit`` and
    ``--force`` was not given; ``estimate`` says what the run would cost."""
    if amount > limit and not getattr(args, "force", False):
        raise ConfigError(f"{what}: {amount:,.0f}, more than {limit:,.0f} ({estimate}); add --force to run it anyway")


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


def add_arch_arg(p, system: bool = False) -> None:
    """The ``--arch`` option every chip-level subcommand takes; ``system``: the command also runs on
    a ``--system``, whose die is the system file's (then --arch is refused: :func:`chip_arch`)."""
    from npusim.choices import DEFAULT_ARCH

    if system:
        p.add_argument("--arch", default=None, help=f"arch YAML path or preset (default {DEFAULT_ARCH}; not with "
                       "--system, which runs on its own die: system.npu.chip in the system file)")
    else:
        p.add_argument("--arch", default=DEFAULT_ARCH, help=f"arch YAML path or preset (default {DEFAULT_ARCH})")


def chip_arch(args) -> str:
    """The chip a command without ``--system`` runs on: ``--arch``, default npusim-64c."""
    from npusim.choices import DEFAULT_ARCH

    return args.arch or DEFAULT_ARCH


def refuse_arch_with_system(args) -> None:
    """``--arch`` beside ``--system`` is an error, not ignored: a system runs on the die its file names."""
    if getattr(args, "arch", None) is not None:
        raise ConfigError(f"--arch {args.arch}: --system {args.system} runs on its own die (system.npu.chip in the "
                          "system file); drop --arch (for another die, copy the system file and name it there)")


NODES_HELP = ("nodes of the system: fewer than the file's takes its first N (a slice, e.g. 1, 2, 4, 20 of "
              "CloudMatrix384's 48), more repeats its node (a bigger system of the same design, if its switches "
              "have the ports)")


def add_system_args(p, required: bool = False) -> None:
    """``--system`` (a system preset or file) and ``--nodes`` (a slice of it)."""
    p.add_argument("--system", default=None if required else "cloudmatrix384", required=required,
                   help="system YAML path or preset: cloudmatrix384, atlas-800i-a2 (default cloudmatrix384)")
    p.add_argument("--nodes", type=positive_int, default=None, help=NODES_HELP)


#: the operator graph's precision for a ``--precision`` choice (fp16 runs as bf16: same width and rate)
CHIP_PRECISION = {"bf16": "bf16", "fp16": "bf16", "a8w8": "a8w8", "w8a8": "a8w8"}


def chip_precision(args) -> str:
    """The chip path's operator-graph precision for ``--precision`` (default bf16)."""
    return CHIP_PRECISION[getattr(args, "precision", None) or "bf16"]


def chip_noc(args) -> str:
    """The chip path's NoC fidelity: ``--fidelity``, default path."""
    return getattr(args, "fidelity", None) or "path"


def system_chip_cost(args, loaded):
    """The chip-cost model of a --system run at the chip fidelity the flags ask for: ``--memory``
    (default analytical) and ``--fidelity`` (the NoC; default analytical)."""
    from npusim.system.chipcost import ChipCost

    return ChipCost(loaded.chip, memory=getattr(args, "memory", None) or "analytical",
                    noc=getattr(args, "fidelity", None) or "analytical")
