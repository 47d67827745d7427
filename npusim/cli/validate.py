"""``npusim validate``: run every comparison with published figures and peer simulators, print
one table (name, source, published, simulated, error, tolerance, verdict, a naive model's error)
and exit 0 when every *outside* row (a figure no modelling choice was steered by) is within its
tolerance, 1 otherwise; fitted, calibration, peer and self rows are shown, not counted."""

from __future__ import annotations

import argparse
import sys
import time

from npusim.validate import CHECKS, run_checks, select
from npusim.validate.rows import fmt_value
from npusim.files import json_text

SECTIONS = (("outside", "published figures (held out)"),
            ("fitted", "fitted (figures modelling choices were steered by: matching them proves little)"),
            ("peer", "peer simulators"),
            ("calibration", "calibration (the preset was derived from these figures; they match by construction)"),
            ("self", "the project compared with itself (not an outside figure)"))


def add_parser(sub) -> argparse.ArgumentParser:
    checks = "\n".join(f"  {c.name:22s} {c.title}" + (f"\n  {'':22s} [quick{': ' + c.reduced if c.reduced else ''}]"
                                                        if c.quick else "") for c in CHECKS)
    p = sub.add_parser(
        "validate", help="compare the simulator with published figures and peer simulators",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run every comparison npusim makes with published figures (papers, vendor reports) and\n"
                    "peer simulators, and print one table: name, source, published, simulated, error,\n"
                    "tolerance, verdict. Every simulated figure is computed now; the published ones are in\n"
                    "npusim/validate/published.yaml with their sources. Exit 0 when every outside row (a\n"
                    "figure no modelling choice was steered by) is within its tolerance, 1 otherwise.\n\n"
                    "checks:\n" + checks)
    p.add_argument("--quick", action="store_true",
                   help="only the checks marked [quick] (reduced where a row says so): ~10 min on 2 cores")
    p.add_argument("--only", metavar="NAME", help="run only this check (or a comma list of checks)")
    p.add_argument("--json", action="store_true", help='print {"rows": [...]} instead of the table')
    return p


def run(args) -> int:
    checks = select(args.only, args.quick)
    t0 = time.perf_counter()

    def progress(check):
        if not args.json:
            print(f"running {check.name}: {check.title} ...", file=sys.stderr, flush=True)

    results = run_checks(checks, args.quick, progress)
    rows = [(c, r) for c, rs, _ in results for r in rs]
    outside = [r for _, r in rows if r.kind == "outside"]
    ok = all(r.within_tolerance for r in outside)
    if args.json:
        print(json_text({"rows": [{"check": c.name, **r.to_dict()} for c, r in rows]}, 1))
        return 0 if ok else 1
    print_table([r for _, r in rows])
    bad = sum(not r.within_tolerance for r in outside)
    print(f"\n{len(outside)} outside rows, {len(outside) - bad} within tolerance, {bad} not; "
          f"{len(rows) - len(outside)} fitted, calibration, peer and self rows not counted; checks: "
          + ", ".join(f"{c.name} {t:.0f} s" for c, _, t in results) + f"; total {time.perf_counter() - t0:.0f} s")
    return 0 if ok else 1


def print_table(rows) -> None:
    """The rows grouped by kind (outside figures, peers, calibration, self), with their notes; ``naive``:
    a naive model's error on the row (a roofline or a constant), where the row has one."""
    head = (f"{'name':46s} {'published':>14s} {'simulated':>11s} {'error':>8s} {'tol':>5s} {'verdict':7s} "
            f"{'naive':>7s} source")
    for kind, title in SECTIONS:
        these = [r for r in rows if r.kind == kind]
        if not these:
            continue
        print(f"\n== {title}\n{head}\n{'-' * len(head)}")
        notes: list[str] = []
        for r in these:
            err = "-" if r.error is None else f"{r.error:+.1%}"
            verdict = "ok" if r.within_tolerance else "OFF" if r.error is not None else "n/a"
            mark = ""
            if r.note:
                if r.note not in notes:
                    notes.append(r.note)
                mark = f" [{notes.index(r.note) + 1}]"
            naive = "-" if r.baseline_error is None else f"{r.baseline_error:+.0%}"
            print(f"{r.name[:46]:46s} {fmt_value(r.published, r.unit, r.relation):>14s} "
                  f"{fmt_value(r.simulated, r.unit):>11s} {err:>8s} {tol(r.tolerance):>5s} {verdict:7s} {naive:>7s} "
                  f"{r.source}{mark}")
        for i, note in enumerate(notes, 1):
            print(f"  [{i}] {note}")


def tol(t: float) -> str:
    return f"{t:.0%}" if t == 0 or t >= 0.01 else f"{t:.1%}"
