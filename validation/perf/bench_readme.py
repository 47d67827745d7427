"""The README's times, measured in one run beside the machine's speed, so a reader can compare.

Every row is a command the README gives a time for, run as a subprocess as a user's shell would
(Python's bytecode cache on: ``machine.user_env``), with its wall and CPU seconds. Above the table
it runs ``../shared/machine_speed.py`` (when the checkout has ``../shared`` beside it; else the
same three workloads are not available and the index is shown as unknown): its speed index is 1.0
on a machine whose pure-Python loop of 10M steps takes 1 s, so ``wall x index`` is the time on
such a machine, the column the README quotes beside its own figures.

Rows (``--only`` picks some by name):

* ``run``: plain ``npusim run`` (the default serving scenario), warm;
* ``trace``: ``npusim run --trace traces/mooncake_sample.jsonl`` (the README's chip trace replay);
* ``tests``: ``pytest -q`` (the fast suite), warm: the Numba cache already holds the kernels;
* ``tests-cold``: ``pytest -q`` with an empty Numba cache, as on a fresh clone (it compiles every
  simulation kernel; ``--skip-cold`` leaves it out).

All rows share one fresh Numba cache directory: the cold row runs first and leaves it warm; without
it, each warm row runs once untimed first.

    python validation/perf/bench_readme.py [--only run,trace,tests] [--skip-cold]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
from machine import machine_line, user_env  # noqa: E402

#: (name, what the README says it is, argv, cold Numba cache?)
ROWS = [
    ("run", "npusim run (default scenario), warm", [sys.executable, "-m", "npusim", "run", "--no-progress"], False),
    ("trace", "npusim run --trace traces/mooncake_sample.jsonl, warm",
     [sys.executable, "-m", "npusim", "run", "--trace", "traces/mooncake_sample.jsonl", "--no-progress"], False),
    ("tests", "pytest -q (fast suite), warm Numba cache", [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
     False),
    ("tests-cold", "pytest -q (fast suite), cold Numba cache (a fresh clone's first run)",
     [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], True),
]


def machine_speed() -> dict | None:
    """``../shared/machine_speed.py --json``'s figures, or None where the checkout has no ``../shared``."""
    script = ROOT.parent / "shared" / "machine_speed.py"
    if not script.exists():
        return None
    out = subprocess.run([sys.executable, str(script), "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def timed(argv: list[str], cache_dir: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system, the process and its children) of one command run from the
    repository's root; fails loudly if the command does."""
    env = user_env(NUMBA_CACHE_DIR=cache_dir)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default=None, help="comma list of rows: " + ", ".join(r[0] for r in ROWS))
    ap.add_argument("--skip-cold", action="store_true", help="leave out the cold-cache test run (several minutes)")
    args = ap.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else [r[0] for r in ROWS]
    unknown = sorted(set(names) - {r[0] for r in ROWS})
    if unknown:
        ap.error(f"--only {','.join(unknown)}: no such row; expected {', '.join(r[0] for r in ROWS)}")
    rows = [r for r in ROWS if r[0] in names and not (args.skip_cold and r[3])]
    speed = machine_speed()
    index = speed["speed_index"] if speed else None
    print(f"machine speed: {json.dumps(speed) if speed else 'unknown (no ../shared/machine_speed.py beside the checkout)'}")
    head = f"{'row':70s} {'wall s':>8s} {'cpu s':>8s} {'wall x index':>13s}"
    print(head + "\n" + "-" * len(head))
    rows.sort(key=lambda r: not r[3])  # the cold run first: it leaves the cache warm for the others
    with tempfile.TemporaryDirectory(prefix="npusim-bench-numba-") as cache:
        warm = False
        for _, what, argv, cold in rows:
            if not cold and not warm:  # no cold run before: an untimed run fills the cache
                timed(argv, cache)
            wall, cpu = timed(argv, cache)
            warm = warm or cold
            scaled = f"{wall * index:13.0f}" if index else f"{'-':>13s}"
            print(f"{what:70s} {wall:8.1f} {cpu:8.1f} {scaled}", flush=True)
    print(machine_line())
    print("wall x index: the wall time on a machine of speed index 1.0 (a 10M-step pure-Python loop in 1 s)")


if __name__ == "__main__":
    main()
