"""The results table of a sweep: one HDF5 file, one row per point, rewritten atomically.

Why HDF5 and not Parquet: h5py is already one of npusim's dependencies (``serving.h5``,
``tasks.h5``), so the table needs nothing new on a fresh install, while Parquet needs pyarrow
(~100 MB); a sweep's table is small (hundreds to thousands of rows), so Parquet's compression
and predicate push-down buy nothing here. Any HDF5 reader opens it (pandas:
``pandas.DataFrame({k: f["points"][k][()] for k in f["points"]})`` after decoding strings).

Layout: group ``/points`` holds one 1-D dataset per column, every column as long as the sweep
has points (attribute ``columns`` lists their names in order; a dataset's name is its column
name with ``/`` written as ``%2F``; attribute ``kind`` is int, float, bool, str or json).
Columns, in order:

- ``point`` (index in the sweep file's order), ``status`` (``ok``, ``failed``, or ``missing``
  for a point not run yet — an interrupted sweep's table says which), ``error``;
- one column per axis, named by its key path (``arch.cores.sram.capacity_mb``);
- provenance: ``config_hash`` (SHA-256 of the point's resolved configuration, how a rerun
  recognises it), ``npusim_version``, ``seed``, ``wall_s`` (wall time of the point's run);
- every metric of the point's ``npusim run --json`` output, nested keys flattened with dots
  (``breakdown_ms.compute``, ``tbt_ms.p99``), lists as JSON text, plus ``area_mm2`` (7 nm area
  model) and throughput per mm²; a metric whose name is already a column gets ``result.``;
- ``config`` (the point's resolved configuration, JSON) and ``record`` (the point's whole
  result, JSON: what a rerun reads back, so a resumed table equals an uninterrupted one).

Missing values: NaN in float columns, ``""`` in text columns (an int or bool column with a
missing value is stored as float). File attributes: sweep name, description, the sweep file's
text, the published trend, axes, report defaults and the counts ``points``, ``ok``, ``failed``,
``missing`` and ``complete``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from npusim.errors import ConfigError
from npusim.files import write_with

FORMAT = "npusim-sweep-results"
FORMAT_VERSION = 1
RESULTS_NAME = "results.h5"
LEAD = ("point", "status", "error")
PROVENANCE = ("config_hash", "npusim_version", "seed", "wall_s")
TAIL = ("config", "record")


def flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts -> ``{"a.b": value}``; lists become JSON text; other values kept."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if isinstance(v, dict) and v:
                out.update(flatten(v, key))
            else:
                out.update(flatten(v, key) if isinstance(v, dict) else {key: _scalar(v)})
        return out
    return {prefix: _scalar(obj)}


def _scalar(v: Any) -> Any:
    if isinstance(v, (list, tuple, dict)):
        return json.dumps(v, sort_keys=True, default=str)
    if isinstance(v, (np.generic,)):
        return v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def missing_record(point) -> dict[str, Any]:
    return {"point": point.index, "status": "missing", "error": None, "axes": point.axes,
            "config_hash": point.config_hash, "npusim_version": None, "seed": point.seed, "wall_s": None,
            "metrics": {}, "config": point.config}


def build_columns(records: list[dict[str, Any]], axis_names: list[str]) -> dict[str, list[Any]]:
    """The table's columns (python values, None where missing) from the per-point records."""
    fixed = set(LEAD) | set(axis_names) | set(PROVENANCE) | set(TAIL)
    metric_names = sorted({k for r in records for k in r["metrics"]})
    renamed = {k: (f"result.{k}" if k in fixed else k) for k in metric_names}
    cols: dict[str, list[Any]] = {}
    for name in LEAD:
        cols[name] = [r.get(name) for r in records]
    for name in axis_names:
        cols[name] = [_scalar(r["axes"].get(name)) for r in records]
    for name in PROVENANCE:
        cols[name] = [r.get(name) for r in records]
    for k in metric_names:
        cols[renamed[k]] = [r["metrics"].get(k) for r in records]
    cols["config"] = [json.dumps(r["config"], sort_keys=True, default=str) for r in records]
    cols["record"] = [json.dumps({k: v for k, v in r.items() if k != "config"}, sort_keys=True, default=str)
                      if r["status"] != "missing" else None for r in records]
    return cols


def _kind(values: list[Any]) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "float"
    if all(isinstance(v, bool) for v in present):
        return "bool" if len(present) == len(values) else "float"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in present):
        return "int" if len(present) == len(values) else "float"
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in present):
        return "float"
    if all(isinstance(v, str) for v in present):
        return "str"
    return "json"


def write_table(path: str | Path, records: list[dict[str, Any]], axis_names: list[str], attrs: dict[str, Any]) -> Path:
    """Write every point's row (atomically: a reader sees the old table or the new one, never half)."""
    cols = build_columns(records, axis_names)
    counts = {s: sum(r["status"] == s for r in records) for s in ("ok", "failed", "missing")}

    def writer(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = FORMAT
            f.attrs["format_version"] = FORMAT_VERSION
            for key, value in attrs.items():
                f.attrs[key] = json.dumps(value) if not isinstance(value, (str, int, float, bool)) else value
            f.attrs["axes"] = json.dumps(axis_names)
            f.attrs["points"] = len(records)
            for status, n in counts.items():
                f.attrs[status] = n
            f.attrs["complete"] = counts["missing"] == 0
            g = f.create_group("points")
            g.attrs["columns"] = json.dumps(list(cols))
            for name, values in cols.items():
                kind = _kind(values)
                if kind == "int":
                    data = np.asarray(values, dtype=np.int64)
                elif kind == "bool":
                    data = np.asarray(values, dtype=bool)
                elif kind == "float":
                    data = np.asarray([np.nan if v is None else float(v) for v in values], dtype=np.float64)
                else:
                    text = [("" if v is None else (v if kind == "str" else json.dumps(v))) for v in values]
                    data = np.asarray(text, dtype=h5py.string_dtype())
                ds = g.create_dataset(name.replace("/", "%2F"), data=data)
                ds.attrs["kind"] = kind

    return write_with(path, writer)


@dataclass
class Table:
    """A results table read back: columns as python lists (None where missing) and the file's attributes."""

    path: Path
    columns: dict[str, list[Any]]
    attrs: dict[str, Any]

    @property
    def axes(self) -> list[str]:
        return list(self.attrs.get("axes", []))

    def records(self) -> list[dict[str, Any] | None]:
        """Each row's stored record (None for a missing point)."""
        return [None if not r else json.loads(r) for r in self.columns["record"]]

    def numeric(self, name: str) -> np.ndarray:
        """A column as float64 (NaN where missing or not a number)."""
        return np.asarray([float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else
                           (float(v) if isinstance(v, bool) else np.nan) for v in self.columns[name]], dtype=float)

    def __len__(self) -> int:
        return len(self.columns.get("point", []))


def read_table(path: str | Path) -> Table:
    """Read a results table; ConfigError if it is not one."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_NAME
    if not path.is_file():
        raise ConfigError(f"{path}: no such results table (npusim sweep writes DIR/{RESULTS_NAME})")
    try:
        with h5py.File(path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise ConfigError(f"{path}: not an npusim sweep results table")
            attrs = {}
            for key, value in f.attrs.items():
                value = value.item() if isinstance(value, np.generic) else value
                if key in ("axes", "report", "published") and isinstance(value, str):
                    value = json.loads(value)
                attrs[key] = value
            g = f["points"]
            columns = {}
            for name in json.loads(g.attrs["columns"]):
                ds = g[name.replace("/", "%2F")]
                kind = ds.attrs["kind"]
                raw = ds[()]
                if kind in ("str", "json"):
                    text = [v.decode() if isinstance(v, bytes) else str(v) for v in raw]
                    columns[name] = [None if not t else (t if kind == "str" else json.loads(t)) for t in text]
                elif kind == "float":
                    columns[name] = [None if np.isnan(v) else float(v) for v in raw]
                elif kind == "int":
                    columns[name] = [int(v) for v in raw]
                else:
                    columns[name] = [bool(v) for v in raw]
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the results table: {exc}") from None
    return Table(path=path, columns=columns, attrs=attrs)
