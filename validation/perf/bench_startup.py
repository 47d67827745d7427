"""Start-up and compile: whole-process wall time of the commands a user runs by the hundred, with a
cold Numba cache (a fresh ``NUMBA_CACHE_DIR``: the first run after an install or an update) and a
warm one, beside issue 25's targets on a 2-core machine.

Rows: ``npusim --help`` and ``npusim run --help`` (import time only: the parsers load no
simulator); ``npusim run --forward --layers 2`` cold (it compiles the chip kernel of the default
fidelity: analytical memory, path NoC) and warm; ``npusim mem`` (a transfer through the TLM memory
model: the kernel variant with it) cold and warm; plain ``npusim run`` (the default serving scenario) warm;
NPU-SIM's small serving case (a 16-core chip, PD fusion, 10 requests) warm; a system command
(``npusim fabric``) cold (it compiles the fabric kernel) and warm. Each warm row is the median of
``--repeat`` runs. Every command runs as a subprocess, as a user's shell would; ``cpu s`` is its
user + system CPU time, steadier than the wall time on a machine shared with other jobs; Python's
bytecode cache is on for it, as in a user's shell (``machine.user_env``). ``--python`` runs npusim in
another environment, e.g. a fresh venv with only npusim installed (``python -m venv v && v/bin/pip
install -e .``), as a user gets it: the dev environment may hold packages that slow start-up (scipy:
the line under the table says).

    python validation/perf/bench_startup.py [--repeat 5] [--skip-cold] [--python v/bin/python]
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import environment_line, machine_line, user_env  # noqa: E402

FORWARD = ["run", "--forward", "--layers", "2", "--no-progress"]
FABRIC = ["fabric", "--system", "cloudmatrix384", "--bytes", "1MiB"]
#: NPU-SIM's own example scale: a 16-core chip (npusim-64c's cores, 4x4) serving 10 requests, PD fusion
SMALL_ARCH = "extends: npusim-64c\nname: npusim-16c\ncores: {grid: {width: 4, height: 4}}\n"
SMALL = ["run", "--arch", "{small_arch}", "--requests", "10", "--no-progress"]
#: (row, argv, cold cache?, target seconds or None): issue 25's targets on a 2-core machine
ROWS = [
    ("npusim --help", ["--help"], False, 0.3),
    ("npusim run --help", ["run", "--help"], False, 0.3),
    ("npusim run --forward --layers 2, cold", FORWARD, True, 30.0),
    ("npusim run --forward --layers 2, warm", FORWARD, False, 1.0),
    ("npusim mem --bytes 1MiB (TLM memory), cold", ["mem", "--bytes", "1MiB"], True, None),
    ("npusim mem --bytes 1MiB (TLM memory), warm", ["mem", "--bytes", "1MiB"], False, None),
    ("npusim run (default scenario), warm", ["run", "--no-progress"], False, None),
    ("16 cores, PD fusion, 10 requests, warm", SMALL, False, None),
    ("npusim fabric --bytes 1MiB, cold", FABRIC, True, None),
    ("npusim fabric --bytes 1MiB, warm", FABRIC, False, None),
]


def wall_s(python: str, argv: list[str], cache_dir: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one ``npusim`` subprocess."""
    env = user_env(NUMBA_CACHE_DIR=cache_dir)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([python, "-m", "npusim", *argv], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5, help="runs per warm row (the median is shown)")
    ap.add_argument("--skip-cold", action="store_true", help="leave out the cold-cache rows (minutes each)")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter whose environment runs npusim (e.g. a fresh venv's bin/python, as a "
                         "user installs it; default: this one)")
    args = ap.parse_args()
    cache = tempfile.mkdtemp(prefix="npusim-bench-startup-")  # cold, then warmed by the cold rows
    small_arch = Path(tempfile.mkdtemp(prefix="npusim-bench-arch-")) / "npusim-16c.yaml"
    small_arch.write_text(SMALL_ARCH)
    print(f"{'command':<42} {'wall s':>8} {'cpu s':>7} {'target s':>9}  verdict")
    for name, argv, cold, target in ROWS:
        argv = [a.format(small_arch=small_arch) for a in argv]
        if cold and args.skip_cold:
            continue
        if cold:
            seconds, cpu = wall_s(args.python, argv, tempfile.mkdtemp(prefix="npusim-cold-"))
            wall_s(args.python, argv, cache)  # warm the shared cache for the warm rows
        else:
            wall_s(args.python, argv, cache)  # the first warm run may still load from disk
            runs = sorted(wall_s(args.python, argv, cache) for _ in range(args.repeat))
            seconds, cpu = runs[len(runs) // 2]  # the median run (by wall time)
        verdict = "-" if target is None else ("met" if seconds <= target else "not met")
        print(f"{name:<42} {seconds:8.2f} {cpu:7.2f} {'-' if target is None else f'{target:g}':>9}  {verdict}",
              flush=True)
    print(machine_line())
    print(environment_line(args.python))


if __name__ == "__main__":
    main()
