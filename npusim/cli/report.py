"""``npusim report RESULTS``: draw a sweep's results table (lines, heatmaps, Pareto front) and an HTML page.

RESULTS is a sweep's output directory or its results.h5. ``--y METRIC`` against ``--x KEY`` with one
line per ``--hue KEY`` value (small multiples for the other axes); a heatmap of the metric over
x and hue; and, when the points have a throughput and a time between tokens (serving runs:
``throughput_tokens_per_s`` and ``tbt_ms.mean``; decode forward passes: ``tokens_per_s`` and
``latency_ms``), the Pareto front of throughput per mm² (7 nm area model) against TBT. Defaults
come from the sweep file's ``report:`` section, else the first two axes. Pictures are PNG or SVG
(matplotlib, the ``plot`` extra), with index.html beside them; the sweep's published trend, when it
names one, is printed beside a table of the simulated metric.
"""

from __future__ import annotations

from pathlib import Path
from npusim.files import json_text


def add_parser(sub):
    p = sub.add_parser("report", help="plot a sweep's results (lines, heatmaps, Pareto front) and write an HTML page",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("results", type=Path, help="sweep output directory or its results.h5")
    p.add_argument("--x", default=None, help="column on the x axis (default: the sweep's report.x, else its first axis)")
    p.add_argument("--y", default=None, help="metric column to plot (default: the sweep's report.y, else latency_ms "
                   "or throughput_tokens_per_s)")
    p.add_argument("--hue", default=None, help="column with one line per value (default: report.hue, else the "
                   "second axis)")
    p.add_argument("--out", type=Path, default=None, help="directory for the pictures and index.html "
                   "(default: RESULTS_DIR/report)")
    p.add_argument("--format", choices=["png", "svg"], default="png", help="picture format (default png)")
    p.add_argument("--json", action="store_true", help="print one JSON object: the files written and the pivot table")
    return p


def run(args) -> int:
    from npusim.sweep.report import make_report, print_report

    rep = make_report(args.results, x=args.x, y=args.y, hue=args.hue, out=args.out, fmt=args.format)
    if args.json:
        print(json_text(rep))
        return 0
    print_report(rep)
    return 0
