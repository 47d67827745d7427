"""``npusim validate``: run every comparison with published figures and peer simulators, print
one table (name, source, published, simulated, error, tolerance, verdict, a naive model's error)
and a verdict in two lines that mean different things:

* **the install check** (the exit code): every *calibration* row (it matches by construction)
  and *self* row (the project against itself) within its tolerance, and every check able to run.
  Exit 0 means the install is sound; 1 that one of those rows missed (a broken install, or a
  change to the model that broke its own consistency).
* **the model's accuracy** (a summary line, not the exit code unless ``--strict``): how many
  *outside* rows (published figures no modelling choice was steered by) are within tolerance;
  those that miss are listed with a naive model's error beside them.

Fitted, peer and timing rows (wall-time comparisons: they depend on the machine and its load)
are shown, not counted."""

from __future__ import annotations

import argparse
import sys
import time

from npusim.validate import CHECKS, could_not_run, run_checks, select
from npusim.validate.rows import fmt_value
from npusim.files import json_text

SECTIONS = (("outside", "published figures (held out)"),
            ("fitted", "fitted (figures modelling choices were steered by: matching them proves little)"),
            ("peer", "peer simulators"),
            ("calibration", "calibration (the preset was derived from these figures; they match by construction)"),
            ("self", "the project compared with itself (not an outside figure)"),
            ("timing", "wall-time comparisons (they depend on the machine and its load: shown, not counted)"))


def add_parser(sub) -> argparse.ArgumentParser:
    checks = "\n".join(f"  {c.name:22s} {c.title}" + (f"\n  {'':22s} [quick{': ' + c.reduced if c.reduced else ''}]"
                                                        if c.quick else "") for c in CHECKS)
    p = sub.add_parser(
        "validate", help="compare the simulator with published figures and peer simulators",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run every comparison npusim makes with published figures (papers, vendor reports) and\n"
                    "peer simulators, and print one table: name, source, published, simulated, error,\n"
                    "tolerance, verdict. Every simulated figure is computed now; the published ones are in\n"
                    "npusim/validate/published.yaml with their sources.\n\n"
                    "Exit 0 when the install is sound: every calibration row (it matches by construction)\n"
                    "and self row (the project against itself) is within its tolerance and every check ran;\n"
                    "1 otherwise. Outside rows (published figures no modelling choice was steered by) are\n"
                    "the model's accuracy: a summary line counts those within tolerance and lists those\n"
                    "that miss beside a naive model's error; they set the exit code only with --strict.\n"
                    "Some outside rows miss today: that is the model's state, not a broken install.\n\n"
                    "checks:\n" + checks)
    p.add_argument("--quick", action="store_true",
                   help="only the checks marked [quick] (reduced where a row says so): ~10 min on 2 cores")
    p.add_argument("--only", metavar="NAME", help="run only this check (or a comma list of checks)")
    p.add_argument("--strict", action="store_true",
                   help="exit 1 also when an outside row is outside its tolerance (the model's accuracy as a gate)")
    p.add_argument("--json", action="store_true",
                   help='print {"rows": [...], "verdict": {...}} instead of the table')
    return p


def run(args) -> int:
    checks = select(args.only, args.quick)
    t0 = time.perf_counter()

    def progress(check):  # on stderr, --json too
        print(f"running {check.name}: {check.title} ...", file=sys.stderr, flush=True)

    results = run_checks(checks, args.quick, progress)
    rows = [(c, r) for c, rs, _ in results for r in rs]
    verdict = judge([r for _, r in rows], args.strict)
    if args.json:
        print(json_text({"rows": [{"check": c.name, **r.to_dict()} for c, r in rows], "verdict": verdict}, 1))
        return verdict["exit"]
    print_table([r for _, r in rows])
    print_verdict(verdict, [r for _, r in rows])
    print("checks: " + ", ".join(f"{c.name} {t:.0f} s" for c, _, t in results)
          + f"; total {time.perf_counter() - t0:.0f} s")
    return verdict["exit"]


def judge(rows, strict: bool = False) -> dict:
    """The install check (calibration and self rows, and every check able to run) and the outside
    rows' count; ``exit`` 0 when the install is sound (and, with ``strict``, every outside row is
    within tolerance), else 1."""
    install = [r for r in rows if r.kind in ("calibration", "self") or could_not_run(r)]
    outside = [r for r in rows if r.kind == "outside" and not could_not_run(r)]
    install_ok = all(r.within_tolerance for r in install)
    outside_ok = sum(r.within_tolerance for r in outside)
    return {"install_sound": install_ok, "install_rows": len(install),
            "install_missed": [r.name for r in install if not r.within_tolerance],
            "outside_rows": len(outside), "outside_within_tolerance": outside_ok,
            "outside_missed": [r.name for r in outside if not r.within_tolerance],
            "not_counted": len(rows) - len(install) - len(outside), "strict": strict,
            "exit": 0 if install_ok and (not strict or outside_ok == len(outside)) else 1}


def print_verdict(v: dict, rows) -> None:
    """The two verdict lines (install, accuracy) and the outside rows that miss, each beside a
    naive model's error on it."""
    missed = ", ".join(v["install_missed"])
    print(f"\ninstall check: {v['install_rows']} calibration and self rows; "
          + ("none in the checks run" if not v["install_rows"] else
             "all within tolerance: the install is sound" if v["install_sound"] else
             f"{len(v['install_missed'])} missed ({missed}): the install or the model's own consistency is broken"))
    gate = "they set the exit code (--strict)" if v["strict"] else "they do not set the exit code (--strict makes them)"
    print(f"model accuracy: {v['outside_within_tolerance']} of {v['outside_rows']} outside rows (published figures "
          f"held out) within tolerance; {gate}; {v['not_counted']} fitted, peer and timing rows not counted")
    off = [r for r in rows if r.name in set(v["outside_missed"]) and r.kind == "outside"]
    if off:
        print(f"  missed: {'name':46s} {'error':>8s} {'tol':>5s} {'naive':>7s}")
        for r in off:
            err = "-" if r.error is None else f"{r.error:+.1%}"
            naive = "-" if r.baseline_error is None else f"{r.baseline_error:+.0%}"
            print(f"          {r.name[:46]:46s} {err:>8s} {tol(r.tolerance):>5s} {naive:>7s}")


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
