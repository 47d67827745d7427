"""Pictures and a page from a sweep's results table (``npusim report``).

- *lines*: the metric ``y`` against ``x``, one line per value of ``hue``, one panel per
  combination of the other axes that vary (at most 12 panels);
- *heatmap*: ``y`` over ``x`` × ``hue`` (the mean where several points share a cell), one panel
  per combination of the other axes;
- *Pareto front*: throughput per mm² of silicon (7 nm area model, :mod:`npusim.serving.area`)
  against the time between tokens, where the points have both (serving runs:
  ``throughput_tokens_per_s_per_mm2`` and ``tbt_ms.mean``; decode forward passes, whose step
  *is* the time between tokens: ``tokens_per_s_per_mm2`` and ``latency_ms``, decode rows only); the front is the
  points no other point beats on both;
- *index.html*: the sweep's description, the published trend it reproduces (the sweep file's
  ``published:``), counts of finished, failed and missing points, the pictures, the pivot table
  of ``y`` and every point with its axes, ``y`` and error.

Only ``ok`` rows are drawn. Pictures need matplotlib (the ``plot`` extra); without it the page
and the tables are still written and the report says the pictures were skipped.
"""

from __future__ import annotations

import difflib
import html
import importlib.util
import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from npusim.errors import ConfigError
from npusim.files import atomic_path
from npusim.sweep.table import Table, read_table

MAX_PANELS = 12
Y_DEFAULTS = ("latency_ms", "throughput_tokens_per_s", "tokens_per_s")
PARETO = (("throughput_tokens_per_s_per_mm2", "tbt_ms.mean", "output tokens/s per mm²", "mean TBT (ms)"),
          ("tokens_per_s_per_mm2", "latency_ms", "tokens/s per mm²", "decode step = TBT (ms)"))


def make_report(results: str | Path, x: str | None = None, y: str | None = None, hue: str | None = None,
                out: str | Path | None = None, fmt: str = "png") -> dict[str, Any]:
    """Draw the pictures and write index.html; return what was written and the pivot table."""
    table = read_table(results)
    ok = [i for i, s in enumerate(table.columns["status"]) if s == "ok"]
    defaults = table.attrs.get("report") or {}
    axes = _independent(table, ok) or table.axes
    x = x or defaults.get("x") or (axes[0] if axes else None)
    if x is None:
        raise ConfigError(f"{table.path}: the sweep has no axes; name a column with --x")
    y = y or defaults.get("y") or next((c for c in Y_DEFAULTS if c in table.columns), None)
    if y is None:
        raise ConfigError(f"{table.path}: no default metric in the table; name one with --y")
    hue = hue if hue is not None else defaults.get("hue") or next((a for a in axes if a != x), None)
    for flag, name in (("--x", x), ("--y", y), ("--hue", hue)):
        if name is not None and name not in table.columns:
            hint = difflib.get_close_matches(name, list(table.columns), n=1, cutoff=0.5)
            raise ConfigError(f"{table.path}: {flag} {name}: no such column"
                              + (f"; did you mean '{hint[0]}'?" if hint else "")
                              + f" (axes: {', '.join(table.axes) or 'none'})")
    if hue == x:
        hue = None
    out = Path(out) if out is not None else table.path.parent / "report"
    facets = [a for a in axes if a not in (x, hue)]
    groups = _groups(table, ok, facets)
    pivot = _pivot(table, groups, x, y, hue)
    rep: dict[str, Any] = {"results": str(table.path), "name": table.attrs.get("name"), "x": x, "y": y, "hue": hue,
                           "facets": facets, "axes": axes, "points": int(table.attrs.get("points", len(table))),
                           "ok": int(table.attrs.get("ok", 0)), "failed": int(table.attrs.get("failed", 0)),
                           "missing": int(table.attrs.get("missing", 0)), "published": table.attrs.get("published") or {},
                           "pivot": pivot, "files": {}, "notes": []}
    if not ok:
        rep["notes"].append("no finished points: nothing to draw")
    elif importlib.util.find_spec("matplotlib") is None:
        rep["notes"].append("pictures skipped: matplotlib is not installed (pip install 'npusim[plot]')")
    else:
        rep["files"].update(_draw(table, groups, x, y, hue, out, fmt, rep))
    rep["files"]["html"] = str(_write_html(out / "index.html", table, rep))
    return rep


def _independent(table: Table, rows: list[int]) -> list[str]:
    """Axes that vary over ``rows``, leaving out any that moves in lockstep with an earlier one
    (zipped axes such as an array's rows and cols)."""
    out, seen = [], set()
    for a in table.axes:
        labels = [_key(table.columns[a][i]) for i in rows]
        first = {}
        pattern = tuple(first.setdefault(v, len(first)) for v in labels)
        if len(first) > 1 and pattern not in seen:
            seen.add(pattern)
            out.append(a)
    return out


def _key(v) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def _groups(table: Table, rows: list[int], facets: list[str]) -> list[tuple[str, list[int]]]:
    """Rows grouped by the values of the facet axes (first-seen order); the label names them."""
    groups: dict[str, list[int]] = {}
    for i in rows:
        label = ", ".join(f"{_short(a)}={table.columns[a][i]}" for a in facets)
        groups.setdefault(label, []).append(i)
    return list(groups.items())


def _short(name: str) -> str:
    """A key path's last two parts (``systolic_array.rows``) for labels."""
    return ".".join(name.split(".")[-2:])


def _sorted_values(values) -> list:
    uniq = list(dict.fromkeys(values))
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in uniq):
        return sorted(uniq)
    return sorted(uniq, key=str)


def _num(v) -> float:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else math.nan


def _pivot(table: Table, groups, x: str, y: str, hue: str | None) -> list[dict[str, Any]]:
    """``y`` by (facet, hue) row and ``x`` column; the mean where several points share a cell."""
    rows = []
    for label, idx in groups:
        hues = _sorted_values(table.columns[hue][i] for i in idx) if hue else [None]
        xs = _sorted_values(table.columns[x][i] for i in idx)
        for h in hues:
            cells = {}
            for xv in xs:
                vals = [_num(table.columns[y][i]) for i in idx
                        if table.columns[x][i] == xv and (hue is None or table.columns[hue][i] == h)]
                vals = [v for v in vals if not math.isnan(v)]
                cells[str(xv)] = float(np.mean(vals)) if vals else None
            rows.append({"facet": label, "hue": h, "values": cells})
    return rows


def _draw(table, groups, x, y, hue, out: Path, fmt: str, rep: dict) -> dict[str, str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = {}
    shown = groups[:MAX_PANELS]
    if len(groups) > MAX_PANELS:
        rep["notes"].append(f"{len(groups)} combinations of the other axes; the pictures show the first {MAX_PANELS}")
    n = len(shown)
    cols = min(3, n)
    rows = -(-n // cols)

    fig, axs = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (label, idx) in zip(axs.flat, shown):
        xs_all = _sorted_values(table.columns[x][i] for i in idx)
        numeric_x = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in xs_all)
        pos = {v: (v if numeric_x else k) for k, v in enumerate(xs_all)}
        for h in (_sorted_values(table.columns[hue][i] for i in idx) if hue else [None]):
            pts = sorted(((pos[table.columns[x][i]], _num(table.columns[y][i])) for i in idx
                          if hue is None or table.columns[hue][i] == h), key=lambda p: p[0])
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=None if hue is None else f"{h}")
        if not numeric_x:
            ax.set_xticks(range(len(xs_all)), [str(v) for v in xs_all], rotation=30)
        ax.set_xlabel(x)
        ax.set_ylabel(y)
        ax.set_title(label or table.attrs.get("name", ""), fontsize=9)
        ax.grid(alpha=0.3)
        if hue:
            ax.legend(title=_short(hue), fontsize=8, title_fontsize=8)
    for ax in list(axs.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    files["lines"] = _save(fig, out / f"lines.{fmt}", plt)

    if hue:
        fig, axs = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
        for ax, (label, idx) in zip(axs.flat, shown):
            xs = _sorted_values(table.columns[x][i] for i in idx)
            hs = _sorted_values(table.columns[hue][i] for i in idx)
            grid = np.full((len(hs), len(xs)), np.nan)
            for r, h in enumerate(hs):
                for c, xv in enumerate(xs):
                    vals = [_num(table.columns[y][i]) for i in idx
                            if table.columns[x][i] == xv and table.columns[hue][i] == h]
                    vals = [v for v in vals if not math.isnan(v)]
                    grid[r, c] = np.mean(vals) if vals else np.nan
            im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis")
            lo, hi = np.nanmin(grid), np.nanmax(grid)
            for r in range(len(hs)):
                for c in range(len(xs)):
                    if not np.isnan(grid[r, c]):
                        bright = hi > lo and (grid[r, c] - lo) / (hi - lo) > 0.6  # viridis is light at the top
                        ax.text(c, r, f"{grid[r, c]:.3g}", ha="center", va="center", fontsize=7,
                                color="k" if bright else "w")
            ax.set_xticks(range(len(xs)), [str(v) for v in xs], rotation=30)
            ax.set_yticks(range(len(hs)), [str(v) for v in hs])
            ax.set_xlabel(x)
            ax.set_ylabel(hue)
            ax.set_title(label or y, fontsize=9)
            fig.colorbar(im, ax=ax, label=y)
        for ax in list(axs.flat)[n:]:
            ax.axis("off")
        fig.tight_layout()
        files["heatmap"] = _save(fig, out / f"heatmap.{fmt}", plt)

    pareto = _pareto_columns(table)
    if pareto is not None:
        thr_col, tbt_col, thr_label, tbt_label = pareto
        idx = [i for _, g in groups for i in g]
        if tbt_col == "latency_ms":  # forward passes: only decode steps have a time between tokens
            idx = [i for i in idx if table.columns["phase"][i] == "decode"]
        thr = np.array([_num(table.columns[thr_col][i]) for i in idx])
        tbt = np.array([_num(table.columns[tbt_col][i]) for i in idx])
        good = ~(np.isnan(thr) | np.isnan(tbt))
        idx, thr, tbt = [i for i, g in zip(idx, good) if g], thr[good], tbt[good]
        if len(idx):
            front = pareto_front(tbt, thr)
            fig, ax = plt.subplots(figsize=(6.5, 4.5))
            ax.scatter(tbt, thr, s=18, color="0.6", label="points")
            order = sorted(front, key=lambda k: tbt[k])
            ax.plot(tbt[order], thr[order], "o-", color="C3", label="Pareto front")
            for k in order:
                text = ", ".join(f"{_short(a)}={table.columns[a][idx[k]]}" for a in rep["axes"])
                ax.annotate(text, (tbt[k], thr[k]), fontsize=6, xytext=(3, 3), textcoords="offset points")
            ax.set_xlabel(tbt_label)
            ax.set_ylabel(thr_label)
            ax.set_title(f"{table.attrs.get('name', '')}: throughput per area vs TBT", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
            fig.tight_layout()
            files["pareto"] = _save(fig, out / f"pareto.{fmt}", plt)
            rep["pareto"] = [{"point": table.columns["point"][idx[k]], tbt_col: float(tbt[k]),
                              thr_col: float(thr[k])} for k in order]
    return files


def _pareto_columns(table: Table):
    for thr, tbt, a, b in PARETO:
        if thr in table.columns and tbt in table.columns:
            if tbt == "latency_ms" and "decode" not in table.columns.get("phase", []):
                continue  # a prefill pass's latency is not a time between tokens
            return thr, tbt, a, b
    return None


def pareto_front(cost: np.ndarray, gain: np.ndarray) -> list[int]:
    """Indices of the points no other point beats: lower ``cost`` and higher ``gain`` (ties kept once)."""
    order = np.lexsort((-gain, cost))  # by cost, then by gain descending
    front, best = [], -math.inf
    for k in order:
        if gain[k] > best:
            front.append(int(k))
            best = gain[k]
    return front


def _save(fig, path: Path, plt) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix[1:], dpi=120)
    plt.close(fig)
    return str(path)


def _write_html(path: Path, table: Table, rep: dict) -> Path:
    e = html.escape
    pub = rep["published"]
    parts = [f"<!doctype html><meta charset='utf-8'><title>{e(str(rep['name']))}</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;"
             "font-size:12px}td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}img{max-width:100%}"
             ".err{color:#a00;text-align:left}</style>",
             f"<h1>{e(str(rep['name']))}</h1><p>{e(str(table.attrs.get('description', '')))}</p>",
             f"<p>{rep['points']} points: {rep['ok']} finished, {rep['failed']} failed, {rep['missing']} missing. "
             f"Table: <code>{e(rep['results'])}</code></p>"]
    if pub:
        parts.append(f"<h2>Published trend</h2><p>{e(pub.get('trend', ''))}</p><p><i>{e(pub.get('source', ''))}</i></p>")
    for note in rep["notes"]:
        parts.append(f"<p><b>Note:</b> {e(note)}</p>")
    for name in ("lines", "heatmap", "pareto"):
        if name in rep["files"]:
            parts.append(f"<h2>{name}</h2><img src='{e(Path(rep['files'][name]).name)}'>")
    xs = list(dict.fromkeys(k for r in rep["pivot"] for k in r["values"]))
    parts.append(f"<h2>{e(rep['y'])} by {e(rep['x'])}</h2><table><tr><th>{e(', '.join(rep['facets']) or '')}</th>"
                 f"<th>{e(str(rep['hue'] or ''))}</th>" + "".join(f"<th>{e(x)}</th>" for x in xs) + "</tr>")
    for r in rep["pivot"]:
        cells = "".join("<td>" + _fmt(r["values"].get(x)) + "</td>" for x in xs)
        parts.append(f"<tr><td>{e(r['facet'])}</td><td>{e(str(r['hue'] if r['hue'] is not None else ''))}</td>{cells}</tr>")
    parts.append("</table><h2>Points</h2><table><tr><th>point</th><th>status</th>"
                 + "".join(f"<th>{e(a)}</th>" for a in table.axes) + f"<th>{e(rep['y'])}</th><th>error</th></tr>")
    for i in range(len(table)):
        val = table.columns[rep["y"]][i]
        parts.append(f"<tr><td>{table.columns['point'][i]}</td><td>{e(table.columns['status'][i])}</td>"
                     + "".join(f"<td>{e(str(table.columns[a][i]))}</td>" for a in table.axes)
                     + "<td>" + e(_fmt(val)) + "</td>"
                     + f"<td class='err'>{e(table.columns['error'][i] or '')}</td></tr>")
    parts.append("</table>")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(parts) + "\n")
    return path


def _fmt(v) -> str:
    if v is None:
        return ""
    return format(v, ".4g") if isinstance(v, float) else str(v)


def print_report(rep: dict) -> None:
    """The pivot table of the simulated metric, the published trend beside it, and the files written."""
    print(f"{rep['name']}: {rep['points']} points ({rep['ok']} finished, {rep['failed']} failed, "
          f"{rep['missing']} missing)")
    xs = list(dict.fromkeys(k for r in rep["pivot"] for k in r["values"]))
    print(f"  simulated {rep['y']} by {rep['x']}" + (f" (rows: {rep['hue']})" if rep["hue"] else ""))
    facet = None
    width = max([len(str(r["hue"])) for r in rep["pivot"]] + [6])
    print("    " + " " * width + "".join(f"{x:>12}" for x in xs))
    for r in rep["pivot"]:
        if r["facet"] != facet and r["facet"]:
            print(f"    [{r['facet']}]")
        facet = r["facet"]
        cells = "".join(f"{'-' if r['values'].get(x) is None else format(r['values'][x], '.4g'):>12}" for x in xs)
        print(f"    {str(r['hue'] if r['hue'] is not None else ''):>{width}}{cells}")
    pub = rep.get("published") or {}
    if pub:
        print(f"  published      {pub.get('trend', '')}")
        print(f"  source         {pub.get('source', '')}")
    for front in rep.get("pareto", [])[:8]:
        print("  pareto         " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                              for k, v in front.items()))
    for note in rep["notes"]:
        print(f"  note           {note}")
    for name, path in rep["files"].items():
        print(f"  wrote {name:<9} {path}")
