"""Describe the machine a benchmark ran on (printed under every benchmark table)."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path


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


def user_env(**extra: str) -> dict[str, str]:
    """The environment a user's shell gives an ``npusim`` subprocess, plus ``extra``. Python's
    bytecode cache is on, as it is by default: ``PYTHONDONTWRITEBYTECODE`` (set on some sandboxes
    and CI machines) is dropped, since with it every process recompiles each module whose ``.pyc``
    is stale (~60 ms for npusim's after an edit), a cost no installed npusim has."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(extra)
    return env


def environment_line(python: str) -> str:
    """Which interpreter ran npusim, and whether its environment has scipy: Numba imports
    ``scipy.linalg`` at start-up when it is installed (to find BLAS; ~0.13 s on a 2-core machine),
    and npusim does not need it (a fresh ``pip install npusim`` has none)."""
    import subprocess

    code = "import importlib.util as u; print('yes' if u.find_spec('scipy') else 'no')"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    scipy = out.stdout.strip() or f"unknown ({out.stderr.strip()[-80:]})"
    return f"npusim's Python: {python}; scipy installed there: {scipy}"


def git_head(path: Path) -> str:
    """The commit checked out at ``path`` (a peer's checkout), or "unknown"."""
    try:
        return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
