"""Scale curve: wall time against the work, level by level (issue 25, item 5).

Each level runs the same command at growing sizes, in this process (kernels loaded once, start-up
excluded), and prints the wall time, the work the simulator did (events, iterations or steps), and
the wall time per unit of size (core, request, die) and per unit of work, each relative to the
smallest size: a ratio near 1 means the cost grows with the size (the work) and no faster (below 1:
caches and fixed costs amortise). The two differ where the work itself grows faster than the size:
a ring all-reduce over N ranks is 2(N-1) steps of N transfers, N^2 work for N ranks, so its wall
time per die grows with N while its wall time per event does not.

* chip cores: one decode step of Qwen3-4B (16 sequences at KV 1,024, 4 layers) on 4x4, 8x8 and
  16x16-core chips (npusim-64c's cores; TP 16 groups, as many stages as fit);
* chip requests: serving N synthetic requests (the default scenario's lengths and rate; the iteration
  cache on), N = 8, 32, 128;
* system ranks: a 16 MiB all-reduce over 16, 64 and 256 CloudMatrix384 dies (flow fidelity);
* system requests: serving N synthetic requests of DeepSeek-R1 on CloudMatrix384, N = 16, 64, 256.

    python validation/perf/bench_scale.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

from npusim.cli import main as npusim  # noqa: E402


def run_json(argv: list[str]) -> tuple[float, dict]:
    """Wall seconds and the ``--json`` summary of one ``npusim`` command run in this process."""
    buf = io.StringIO()
    t = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        code = npusim(argv + ["--json"])
    seconds = time.perf_counter() - t
    if code != 0:
        raise SystemExit(f"npusim {' '.join(argv)} exited {code}")
    return seconds, json.loads(buf.getvalue())


def chip_arch(side: int, folder: Path) -> str:
    path = folder / f"grid{side}.yaml"
    path.write_text(f"extends: npusim-64c\nname: grid{side}x{side}\ncores: {{grid: {{width: {side}, height: {side}}}}}\n")
    return str(path)


def levels(quick: bool, folder: Path):
    """(level, size, size unit, argv, work key in the summary)."""
    sides = (4, 8) if quick else (4, 8, 16)
    for side in sides:
        yield ("chip cores", side * side, "cores", ["run", "--arch", chip_arch(side, folder), "--forward",
                                                       "--layers", "4", "--no-progress"], "events")
    for n in ((8, 32) if quick else (8, 32, 128)):
        yield ("chip requests", n, "requests", ["run", "--requests", str(n), "--iteration-cache", "on",
                                                  "--no-progress"], "iterations")
    for ranks in ((16, 64) if quick else (16, 64, 256)):
        yield ("system ranks", ranks, "dies", ["collective", "--system", "cloudmatrix384", "--op", "allreduce",
                                                 "--ranks", str(ranks), "--bytes", "16MiB", "--no-progress"],
               "events")
    for n in ((16, 64) if quick else (16, 64, 256)):
        yield ("system requests", n, "requests", ["run", "--system", "cloudmatrix384", "--requests", str(n),
                                                    "--no-progress"], "decode_steps")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="two sizes per level")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="npusim-bench-scale-"))
    print(f"{'level':<16} {'size':<14} {'wall s':>8} {'work':>12} {'':<12} {'wall per size vs first':>22} "
          f"{'wall per work vs first':>22}")
    first: dict[str, float] = {}
    first_work: dict[str, float] = {}
    warmed = set()
    for level, size, unit, argv, key in levels(args.quick, folder):
        if level not in warmed:  # load (or compile) this level's kernels outside the timing
            run_json(argv)
            warmed.add(level)
        seconds, s = run_json(argv)
        per, per_work = seconds / size, seconds / max(1, s[key])
        first.setdefault(level, per)
        first_work.setdefault(level, per_work)
        print(f"{level:<16} {f'{size} {unit}':<14} {seconds:8.2f} {int(s[key]):12,} {key:<12} "
              f"{per / first[level]:22.2f} {per_work / first_work[level]:22.2f}")
    print(machine_line())


if __name__ == "__main__":
    main()
