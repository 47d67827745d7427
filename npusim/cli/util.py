"""Small argument parsers shared by subcommands."""

from __future__ import annotations

import argparse
import re

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6, "mib": 2**20,
          "g": 10**9, "gb": 10**9, "gib": 2**30}


def parse_size(text: str) -> int:
    """``4096``, ``1e6``, ``64KiB``, ``2MB``, ``1GiB`` -> bytes (positive int)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise argparse.ArgumentTypeError(f"'{text}' is not a size (examples: 4096, 1e6, 64KiB, 2MB, 1GiB)")
    value = float(m.group(1)) * _UNITS[unit]
    if value <= 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"'{text}' must be a positive whole number of bytes")
    return int(value)


def parse_grid(text: str) -> tuple[int, int]:
    """``8x8`` -> (8, 8)."""
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a grid like 8x8 (positive integers)")
    return int(m.group(1)), int(m.group(2))
