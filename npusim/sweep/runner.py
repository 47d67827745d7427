"""Running a sweep's points: a local process pool, one process, or a Dask distributed cluster.

Each point runs ``npusim run``'s own path (:func:`npusim.scenarios.run.run_summary`) on its chip
(the arch dict with the axis overrides applied, validated in the worker) and returns a record:
status, error, the flattened JSON summary, the chip's area (:mod:`npusim.serving.area`) and
throughput per mm², and provenance (config hash, npusim version, seed, wall time). A point that
fails records its error (an :class:`~npusim.errors.NpusimError`'s message, or the exception's type
and message for anything else) and the sweep goes on.

Finished points are skipped on a rerun (matched by config hash: a table row whose status is
``ok``, or ``failed`` unless ``retry_failed``); the table is rewritten atomically after points
finish (at most once a second, and always at the end), so an interrupted sweep (Ctrl-C,
SIGTERM, a lost cluster) leaves a valid table whose ``missing`` rows are the points still to
run. Rows are in the sweep file's order whatever order points finish in, so a resumed sweep's
table equals an uninterrupted one except for the wall-time column.

Workers: :func:`npusim.pool.run_points` (this process, a ``spawn`` process pool, or a Dask cluster
whose workers can import the same npusim and read the same input files: traces, ONNX models).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from npusim import __version__
from npusim.errors import ConfigError, NpusimError
from npusim.pool import connect, run_points
from npusim.sweep.spec import Point, Sweep
from npusim.sweep.table import RESULTS_NAME, flatten, missing_record, read_table, write_table

WRITE_EVERY_S = 1.0


def run_point(point: Point) -> dict[str, Any]:
    """Run one point (in whatever process holds it) and return its record; never raises for the
    point's own failures."""
    t0 = time.perf_counter()
    record = {"point": point.index, "axes": point.axes, "config_hash": point.config_hash,
              "npusim_version": __version__, "seed": point.seed, "config": point.config, "metrics": {},
              "error": None}
    try:
        summary, area = _simulate(point)
        metrics = flatten(summary)
        metrics.update(_per_area(metrics, area))
        record.update(status="ok", metrics=metrics)
    except NpusimError as exc:
        record.update(status="failed", error=str(exc))
    except Exception as exc:  # a bug or a resource problem: recorded, the sweep goes on
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}")
    record["wall_s"] = time.perf_counter() - t0
    return record


def _simulate(point: Point) -> tuple[dict, dict]:
    from npusim.arch.schema import Arch
    from npusim.config import validate
    from npusim.mapping.spec import MappingSpec
    from npusim.scenarios.run import run_summary
    from npusim.serving.area import arch_area_mm2
    from npusim.sweep.spec import parse_options

    where = f"point {point.index}"
    arch = validate(Arch, point.config["arch"], f"{where}: arch")
    mapping = point.config["mapping"]
    base = None if mapping is None else validate(MappingSpec, mapping, f"{where}: mapping")
    args = parse_options(point.argv, where)
    args.arch, args.model = arch.name, point.config["model"]
    return run_summary(args, arch, base=base), arch_area_mm2(arch)


def _per_area(metrics: dict, area: dict) -> dict:
    total = area["total_mm2"]
    out = {"area_mm2": total}
    for key in ("throughput_tokens_per_s", "tokens_per_s"):
        if isinstance(metrics.get(key), (int, float)) and total > 0:
            out[f"{key}_per_mm2"] = metrics[key] / total
    return out


@dataclass
class SweepOutcome:
    points: int
    ran: int
    skipped: int
    failed: int
    results: Path
    missing: int


def run_sweep(sweep: Sweep, out: str | Path, workers: int | None = None, scheduler: str | None = None,
              retry_failed: bool = False, only: list[int] | None = None,
              progress: Callable[[int, int, int], None] | None = None) -> SweepOutcome:
    """Run the points of ``sweep`` not already in ``out``'s table; write the table; return the counts.

    ``only`` restricts this run to some point indices (the rest stay as they are: how a test
    stands in for an interruption). ``progress(done, total, failed)`` is called as points finish.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    path = out / RESULTS_NAME
    done = _previous(path, sweep, retry_failed)
    todo = [p for p in sweep.points if p.config_hash not in done and (only is None or p.index in only)]
    records = {p.config_hash: done[p.config_hash] for p in sweep.points if p.config_hash in done}
    attrs = _attrs(sweep)
    state = {"last": 0.0, "ran": 0, "failed": 0}

    def save() -> None:
        rows = [records.get(p.config_hash) or missing_record(p) for p in sweep.points]
        rows = [{**r, "config": p.config} for r, p in zip(rows, sweep.points)]
        write_table(path, rows, sweep.axis_names, attrs)
        state["last"] = time.monotonic()

    def finished(record: dict) -> None:
        records[record["config_hash"]] = record
        state["ran"] += 1
        state["failed"] += record["status"] == "failed"
        if progress:
            progress(len(records), len(sweep.points), state["failed"])
        if time.monotonic() - state["last"] >= WRITE_EVERY_S:
            save()

    client = connect(scheduler) if scheduler and todo else None  # before any file is written
    save()
    if progress:
        progress(len(records), len(sweep.points), 0)
    try:
        run_points(run_point, todo, finished, _died, workers, client, key=lambda p: f"npusim-point-{p.config_hash}")
    finally:  # also on Ctrl-C: the table then lists the points still missing
        save()
        if client is not None:
            client.close()
    failed_total = sum(r["status"] == "failed" for r in records.values())
    return SweepOutcome(points=len(sweep.points), ran=state["ran"], skipped=len(done), failed=failed_total,
                        results=path, missing=len(sweep.points) - len(records))


def _previous(path: Path, sweep: Sweep, retry_failed: bool) -> dict[str, dict]:
    """Finished points of an earlier run of this sweep, by config hash."""
    if not path.exists():
        return {}
    table = read_table(path)
    wanted = {p.config_hash for p in sweep.points}
    keep = ("ok",) if retry_failed else ("ok", "failed")
    return {r["config_hash"]: r for r in table.records()
            if r is not None and r["config_hash"] in wanted and r["status"] in keep}


def _attrs(sweep: Sweep) -> dict[str, Any]:
    spec = sweep.spec
    return {"name": spec.name, "description": spec.description, "sweep_file": str(sweep.path),
            "sweep_yaml": sweep.text, "published": spec.published.model_dump() if spec.published else {},
            "report": spec.report.model_dump()}


def _died(point: Point, exc: BaseException) -> dict:
    """The record of a point whose worker died."""
    return {"point": point.index, "axes": point.axes, "config_hash": point.config_hash, "npusim_version": __version__,
            "seed": point.seed, "config": point.config, "metrics": {}, "status": "failed", "wall_s": None,
            "error": f"the worker running this point died ({type(exc).__name__}: {exc}); rerun with --retry-failed"}
