"""Argument types and flags shared by every command and by the library's run paths (sweeps parse
``npusim run``'s options below the CLI): range-checked numbers (finite, at most 2^53), ``--force``,
``--arch``, the ``--nodes`` help. Imports only the standard library and ``errors``."""

from __future__ import annotations

import argparse
import math

from npusim.errors import ConfigError


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


def add_force_arg(p, what: str) -> None:
    """``--force``: run a size the command would otherwise refuse as too big (``what``)."""
    p.add_argument("--force", action="store_true", help=f"run {what} anyway (refused by default: hours of "
                   "simulation or more memory than a workstation has)")


def refuse_unless_forced(args, amount: float, limit: float, what: str, estimate: str) -> None:
    """A ConfigError, before anything runs, when ``amount`` of ``what`` exceeds ``limit`` and
    ``--force`` was not given; ``estimate`` says what the run would cost."""
    if amount > limit and not getattr(args, "force", False):
        raise ConfigError(f"{what}: {amount:,.0f}, more than {limit:,.0f} ({estimate}); add --force to run it anyway")


def add_arch_arg(p, system: bool = False) -> None:
    """The ``--arch`` option every chip-level subcommand takes; ``system``: the command also runs on
    a ``--system``, whose die is the system file's (then --arch is refused: :func:`chip_arch`)."""
    from npusim.choices import DEFAULT_ARCH

    if system:
        p.add_argument("--arch", default=None, help=f"arch YAML path or preset (default {DEFAULT_ARCH}; not with "
                       "--system, which runs on its own die: system.npu.chip in the system file)")
    else:
        p.add_argument("--arch", default=DEFAULT_ARCH, help=f"arch YAML path or preset (default {DEFAULT_ARCH})")


NODES_HELP = ("nodes of the system: fewer than the file's takes its first N (a slice, e.g. 1, 2, 4, 20 of "
              "CloudMatrix384's 48), more repeats its node (a bigger system of the same design, if its switches "
              "have the ports)")
