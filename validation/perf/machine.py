"""Describe the machine a benchmark ran on (printed under every benchmark table)."""

from __future__ import annotations

import os
import platform


def machine_line() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    import numba
    import numpy

    return (f"machine: {cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, "
            f"numpy {numpy.__version__}, numba {numba.__version__}")
