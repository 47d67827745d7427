"""``npusim sweep SWEEP.yaml --out DIR``: run every point of a sweep file, collect one results table.

A sweep file names a base configuration (arch, model, mapping, workload, run options) and axes
over dotted key paths of any of them (``arch.cores.sram.capacity_mb: [8, 16, 32]``) as a grid,
zipped lists or seeded random samples (see ``examples/sweeps/``). Points run on a local process
pool (``--workers N``, default: one per CPU) or on a Dask distributed cluster (``--scheduler
tcp://HOST:PORT``); a point that fails records its error and the sweep goes on. Results go to
DIR/results.h5 (HDF5, one row per point: axis values, every metric of the point's
``npusim run --json`` output, provenance). Rerunning skips finished points, so an interrupted
sweep resumes where it stopped; the table says which points are missing. ``npusim report DIR``
draws it.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from npusim.errors import ConfigError
from npusim.files import json_text
from npusim.cli.util import add_force_arg, positive_int


def add_parser(sub):
    p = sub.add_parser("sweep", help="run a sweep file's points (process pool or Dask), resumably, into one table",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("sweep", type=Path, help="sweep YAML file (e.g. examples/sweeps/smoke.yaml)")
    p.add_argument("--out", type=Path, required=True, help="directory for results.h5 (reused: finished points are "
                   "skipped)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=positive_int, default=None,
                       help="local worker processes (default: one per CPU; 1 runs points in this process)")
    where.add_argument("--scheduler", default=None, help="Dask distributed scheduler address, tcp://HOST:PORT")
    p.add_argument("--retry-failed", action="store_true", help="run points that failed last time again")
    p.add_argument("--dry-run", action="store_true", help="validate the file and list its points; run nothing")
    p.add_argument("--json", action="store_true", help="print one JSON object: points, ran, skipped, failed, results")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_force_arg(p, "a sweep of more than 10,000 points")
    return p


def run(args) -> int:
    from npusim.cli.progress import point_progress
    from npusim.pool import default_workers
    from npusim.sweep.runner import run_sweep
    from npusim.sweep.spec import MAX_POINTS, load_sweep

    if args.workers is not None and args.workers < 1:
        raise ConfigError(f"--workers must be at least 1, got {args.workers}")
    sweep = load_sweep(args.sweep, max_points=None if args.force else MAX_POINTS)
    if args.dry_run:
        return _dry_run(sweep, args.json)
    workers = args.workers if args.workers is not None else default_workers()
    # a job scheduler's stop (SIGTERM) saves the table like Ctrl-C; SIGINT interrupts even when the shell
    # started the sweep in the background with SIGINT ignored (then `kill -INT` would otherwise do nothing)
    previous = _on_signal(signal.SIGTERM, _interrupt), _on_signal(signal.SIGINT, signal.default_int_handler)
    try:
        with point_progress(len(sweep.points), enabled=not args.no_progress) as bar:
            outcome = run_sweep(sweep, args.out, workers=workers, scheduler=args.scheduler,
                                retry_failed=args.retry_failed,
                                progress=lambda done, total, failed: bar(failed, done, total))
    except KeyboardInterrupt:
        print(f"npusim sweep: interrupted; {args.out / 'results.h5'} holds the finished points and marks the "
              "rest 'missing': run the same command again to finish", file=sys.stderr)
        raise
    finally:
        _on_signal(signal.SIGTERM, previous[0])
        _on_signal(signal.SIGINT, previous[1])
    result = {"points": outcome.points, "ran": outcome.ran, "skipped": outcome.skipped, "failed": outcome.failed,
              "results": str(outcome.results)}
    if args.json:
        print(json_text(result))
        return 0
    print(f"{sweep.spec.name}: {outcome.points} points; ran {outcome.ran}, skipped {outcome.skipped} "
          f"(already in the table), {outcome.failed} failed")
    if outcome.failed:
        print(f"  failed points keep their error in the table's 'error' column; --retry-failed runs them again")
    print(f"  wrote {outcome.results}")
    print(f"  draw it: npusim report {args.out}")
    return 0


def _on_signal(signum, handler):
    try:
        return signal.signal(signum, handler)
    except ValueError:  # not the main thread (npusim.cli.main called from a thread): leave it alone
        return handler


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _dry_run(sweep, as_json: bool) -> int:
    rows = [{"point": p.index, "config_hash": p.config_hash[:12], **p.axes, "argv": " ".join(p.argv)}
            for p in sweep.points]
    if as_json:
        print(json_text({"points": len(rows), "axes": sweep.axis_names, "rows": rows}))
        return 0
    print(f"{sweep.spec.name}: {len(rows)} points over {', '.join(sweep.axis_names) or 'no axes'}")
    for r in rows:
        print("  " + "  ".join(f"{k}={v}" for k, v in r.items()))
    return 0
