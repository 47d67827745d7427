"""The iteration cache's KV buckets against exact shapes: how many shapes each simulates, the CPU
and wall time it takes, and every result of the run key by key (issue 25: results within 1% of the
exact cache).

Default settings: ``long`` (what ``--iteration-cache auto`` picks for this trace: chunk lengths and
prefixes interpolated, the decode groups on one KV axis, see ``npusim/serving/itercache.py``) and,
as the naive comparator, one linear cell over the whole context on every axis
(``kv=40960,chunk_edges=interp,chunk_ratio=32,decode_kv=shared``): attention's cost is linear in
KV, but the pipeline's period at full load is convex in it below ~8k tokens, which one cell misses.

Runs ``npusim run --trace traces/mooncake_sample.jsonl`` (the README's trace replay on the default
chip; ``--requests N``: its first N requests) once with exact buckets (every compiled shape
simulated) and once per bucket setting given, each in its own process, and prints per setting the
shapes simulated, the CPU seconds, and the largest relative differences over every number of the
summary JSON (wall-clock and bookkeeping keys left out). The stage replay interpolates between
bucket edges on one KV axis per attention group (``npusim/serving/itercache.py``).

``--grid`` instead measures one iteration structure directly (a 512-token prefill chunk beside one
decode, Qwen3-4B on npusim-64c, the stage replay's measurement) on a grid of the two groups' KV
lengths, and prints how far interpolating from coarser corners lands from the measured duration:
per group (multilinear, the stage replay's) and at one shared position (two corners, the skeleton
replay's).

    python validation/serving_kv_interpolation.py [--requests 0] [--buckets long kv=8192,kv_edges=pow2 ...]
    python validation/serving_kv_interpolation.py --grid
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SKIP = ("iteration_cache", "compiled", "wall", "tasks", "events")  # not results: bookkeeping and timing
NAIVE = "kv=40960,chunk_edges=interp,chunk_ratio=32,decode_kv=shared"  # one linear cell on every axis


def flat(d, prefix: str = "") -> dict[str, float]:
    """Every number of a nested summary, by dotted key."""
    out = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flat(v, f"{prefix}.{k}" if prefix else k))
    elif isinstance(d, (int, float)) and not isinstance(d, bool) and not math.isnan(d):
        out[prefix] = float(d)
    return out


def run(requests: int | None, buckets: str, folder: Path) -> tuple[dict, float, float]:
    """The run's summary, its CPU seconds (user + system, its own process) and its wall seconds."""
    out = folder / f"{buckets.replace(',', '_').replace('=', '-')}.json"
    argv = [sys.executable, "-m", "npusim", "run", "--trace", str(ROOT / "traces" / "mooncake_sample.jsonl"),
            "--no-progress", "--iteration-cache-buckets", buckets, "--json"]
    if requests:
        argv += ["--requests", str(requests)]
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    with out.open("w") as f:
        subprocess.run(argv, check=True, stdout=f, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return json.loads(out.read_text()), cpu, wall


def grid() -> None:
    """Interpolation error on a grid of (chunk KV, decode KV) shapes (see the module docstring)."""
    import contextlib
    import io

    import npusim.serving.itercache as itercache
    from npusim.cli import main as npusim

    measure = {}
    init = itercache.IterationCostCache.__init__

    def keep(self, buckets, measure_fn, store=None, measure_many=None):
        measure["fn"] = measure_fn
        init(self, buckets, measure_fn, store, measure_many)

    itercache.IterationCostCache.__init__ = keep
    try:  # one request builds the instance whose measurement the cache would call
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            npusim(["run", "--trace", str(ROOT / "traces" / "mooncake_sample.jsonl"), "--requests", "1",
                    "--no-progress", "--json"])
    finally:
        itercache.IterationCostCache.__init__ = init
    chunk, dec = (1024, 3072, 4096, 6144, 8192), (256, 1024, 2048, 4096, 8192)
    d = {(c, k): measure["fn"]([(1, 512, c, True), (1, 1, k, False)], 1, 1.0).duration for c in chunk for k in dec}
    print("stage replay, 512-token chunk + 1 decode (Qwen3-4B, npusim-64c): duration in Mcycles")
    print("chunk KV \\ decode KV " + "".join(f"{k:>9}" for k in dec))
    for c in chunk:
        print(f"{c:>20} " + "".join(f"{d[c, k] / 1e6:9.2f}" for k in dec))
    print("\ninterpolated from the cell's corners (per group: multilinear; shared: two corners by KV tokens)")
    for (c, k), (c0, c1, k0, k1) in (((3072, 1024), (1024, 4096, 256, 2048)), ((4096, 2048), (1024, 8192, 1024, 4096)),
                                     ((6144, 4096), (4096, 8192, 2048, 8192)), ((3072, 2048), (1024, 4096, 1024, 4096))):
        tx, ty = (c - c0) / (c1 - c0), (k - k0) / (k1 - k0)
        per_group = (d[c0, k0] * (1 - tx) * (1 - ty) + d[c1, k0] * tx * (1 - ty) + d[c0, k1] * (1 - tx) * ty
                     + d[c1, k1] * tx * ty)
        t = ((c - c0) + (k - k0)) / ((c1 - c0) + (k1 - k0))
        shared = d[c0, k0] + (d[c1, k1] - d[c0, k0]) * t
        print(f"  chunk {c}, decode {k} (cell {c0}-{c1} x {k0}-{k1}): per group {100 * (per_group / d[c, k] - 1):+.2f}%, "
              f"shared {100 * (shared / d[c, k] - 1):+.2f}%")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=0, help="the trace's first N requests (0: all 200)")
    ap.add_argument("--buckets", nargs="+", default=["long", NAIVE])
    ap.add_argument("--show", type=int, default=6, help="largest differences shown per setting")
    ap.add_argument("--grid", action="store_true", help="interpolation error on a grid of one structure's shapes")
    args = ap.parse_args()
    if args.grid:
        grid()
        return
    folder = Path(tempfile.mkdtemp(prefix="npusim-kv-interp-"))
    exact, cpu0, wall0 = run(args.requests or None, "exact", folder)
    ref = flat(exact)
    print(f"trace: traces/mooncake_sample.jsonl, {exact['requests']} requests; exact: "
          f"{exact['iteration_cache']['shapes_simulated']:,} shapes, {cpu0:.0f} CPU s, {wall0:.0f} s wall")
    for b in args.buckets:
        s, cpu, wall = run(args.requests or None, b, folder)
        diffs = sorted(((abs(v / ref[k] - 1) if ref[k] else abs(v), k, ref[k], v) for k, v in flat(s).items()
                        if k in ref and not any(x in k for x in SKIP)), reverse=True)
        within = sum(d <= 0.01 for d, *_ in diffs)
        label = f"{b} (naive: one linear cell)" if b == NAIVE else b
        print(f"\n{label}: {s['iteration_cache']['shapes_simulated']:,} shapes, {cpu:.0f} CPU s "
              f"({cpu0 / max(cpu, 1e-9):.1f}x less), {wall:.0f} s wall ({wall0 / max(wall, 1e-9):.1f}x less); "
              f"{within} of {len(diffs)} keys within 1% of exact")
        for d, k, x, y in diffs[:args.show]:
            print(f"  {100 * d:6.2f}%  {k:36s} {x:14.6g} -> {y:14.6g}")
    print(machine_line())


if __name__ == "__main__":
    main()
