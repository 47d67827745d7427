"""The iteration cache's KV buckets against exact shapes: how many shapes each simulates, the CPU
it takes, and every result of the run key by key (issue 25: results within 1% of the exact cache).

Runs ``npusim run --trace traces/mooncake_sample.jsonl`` (the README's trace replay on the default
chip; ``--requests N``: its first N requests) once with exact buckets (every compiled shape
simulated) and once per bucket setting given, each in its own process, and prints per setting the
shapes simulated, the CPU seconds, and the largest relative differences over every number of the
summary JSON (wall-clock and bookkeeping keys left out). The stage replay interpolates between
bucket edges on one KV axis per attention group (``npusim/serving/itercache.py``).

    python validation/serving_kv_interpolation.py [--requests 50] [--buckets kv=8192,kv_edges=pow2 ...]
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SKIP = ("iteration_cache", "compiled", "wall", "tasks", "events")  # not results: bookkeeping and timing


def flat(d, prefix: str = "") -> dict[str, float]:
    """Every number of a nested summary, by dotted key."""
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else k))
    elif isinstance(d, (int, float)) and not isinstance(d, bool) and not math.isnan(d):
        out[prefix] = float(d)
    return out


def run(requests: int | None, buckets: str, folder: Path) -> tuple[dict, float]:
    """The run's summary and its CPU seconds (user + system, its own process)."""
    out = folder / f"{buckets.replace(',', '_').replace('=', '-')}.json"
    argv = [sys.executable, "-m", "npusim", "run", "--trace", str(ROOT / "traces" / "mooncake_sample.jsonl"),
            "--no-progress", "--iteration-cache-buckets", buckets, "--json"]
    if requests:
        argv += ["--requests", str(requests)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with out.open("w") as f:
        subprocess.run(argv, check=True, stdout=f, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(out.read_text()), cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=50, help="the trace's first N requests (0: all 200)")
    ap.add_argument("--buckets", nargs="+", default=["kv=8192,kv_edges=pow2", "kv=4096,kv_edges=pow2"])
    ap.add_argument("--show", type=int, default=6, help="largest differences shown per setting")
    args = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="npusim-kv-interp-"))
    exact, cpu0 = run(args.requests or None, "exact", folder)
    ref = flat(exact)
    print(f"trace: traces/mooncake_sample.jsonl, {exact['requests']} requests; exact: "
          f"{exact['iteration_cache']['shapes_simulated']:,} shapes, {cpu0:.0f} CPU s")
    for b in args.buckets:
        s, cpu = run(args.requests or None, b, folder)
        diffs = sorted(((abs(v / ref[k] - 1) if ref[k] else abs(v), k, ref[k], v) for k, v in flat(s).items()
                        if k in ref and not any(x in k for x in SKIP)), reverse=True)
        within = sum(d <= 0.01 for d, *_ in diffs)
        print(f"\n{b}: {s['iteration_cache']['shapes_simulated']:,} shapes, {cpu:.0f} CPU s "
              f"({cpu0 / max(cpu, 1e-9):.1f}x less); {within} of {len(diffs)} keys within 1% of exact")
        for d, k, x, y in diffs[:args.show]:
            print(f"  {100 * d:6.2f}%  {k:36s} {x:14.6g} -> {y:14.6g}")
    print(machine_line())


if __name__ == "__main__":
    main()
