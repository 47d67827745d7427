"""The measured Ascend operator rows (``npusim validate --only operators``) summarised per family and
half: rows, median |error|, worst |error|, median signed error and the roofline's median |error|
(issue 39's done-when table). ``--json FILE`` reads a saved ``npusim validate --only operators --json``
instead of running the rows (e.g. one saved before a change, to print before -> after).

    python validation/operator_families.py [--json FILE] [--families gemm,vector]
"""

from __future__ import annotations

import argparse
import json
import statistics


def table(rows: list[dict], families: list[str] | None = None) -> list[dict]:
    out = []
    fams = families or sorted({r["family"] for r in rows if r.get("family")})
    for fam in fams:
        for half in ("calibration", "validation"):
            rr = [r for r in rows if r.get("family") == fam and r.get("half") == half and r.get("error") is not None]
            if not rr:
                continue
            err = [r["error"] for r in rr]
            base = [abs(r["baseline_error"]) for r in rr if r.get("baseline_error") is not None]
            out.append({"family": fam, "half": half, "rows": len(rr),
                        "median_abs_error": statistics.median(abs(e) for e in err),
                        "worst_abs_error": max(abs(e) for e in err), "median_error": statistics.median(err),
                        "roofline_median_abs_error": statistics.median(base) if base else None})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None, help="a saved `npusim validate --only operators --json` output")
    ap.add_argument("--families", default=None, help="comma-separated families (default all)")
    args = ap.parse_args()
    if args.json:
        with open(args.json) as f:
            rows = json.load(f)["rows"]
    else:
        from npusim.validate.operators import operator_rows

        rows = [r.to_dict() for r in operator_rows()]
    fams = args.families.split(",") if args.families else None
    print("| family | half | rows | median abs err | worst | median signed | roofline median abs err |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for t in table(rows, fams):
        roof = "" if t["roofline_median_abs_error"] is None else f"{100 * t['roofline_median_abs_error']:.0f}%"
        print(f"| {t['family']} | {t['half']} | {t['rows']} | {100 * t['median_abs_error']:.0f}% | "
              f"{100 * t['worst_abs_error']:.0f}% | {100 * t['median_error']:+.0f}% | {roof} |")


if __name__ == "__main__":
    main()
