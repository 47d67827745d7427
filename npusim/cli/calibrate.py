"""``npusim calibrate``: recompute every calibrated constant of the system presets from its cited figure.

Each constant (a protocol efficiency or overhead, a switch latency, a MoE operator's per-call
overhead, a runtime cost, a die's kernel costs) is recomputed by running the simulator with the constant neutral and
taking the difference to the published figure it was calibrated on (``published.yaml``); the table
shows the stored value, the recomputed one and their drift. ``--check`` exits 1 when a stored
constant drifted more than 2% from its recomputation (a model change made it stale); ``--out FILE``
writes the recomputed constants with their provenance as JSON (copy them into the preset).
"""

from __future__ import annotations

from pathlib import Path

from npusim.errors import ConfigError
from npusim.files import json_text, write_json


def add_parser(sub):
    from npusim.choices import CALIBRATION_GROUPS as GROUPS

    p = sub.add_parser("calibrate", help="recompute the presets' calibrated constants from their cited figures",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--only", default=None, help=f"groups, comma-separated: {', '.join(GROUPS)} (default all)")
    p.add_argument("--check", action="store_true", help="exit 1 if a stored constant drifted more than 2%%")
    p.add_argument("--out", type=Path, default=None, help="write the recomputed constants (JSON) to this file")
    p.set_defaults(out_is_file=True)  # not a results directory: the CLI's --out DIR checks skip it
    p.add_argument("--json", action="store_true", help="print one JSON object: constants, drifted")
    return p


def run(args) -> int:
    from npusim.choices import CALIBRATION_GROUPS as GROUPS
    from npusim.validate.calibrate import DRIFT_LIMIT, calibrate

    groups = None
    if args.only:
        groups = [g.strip() for g in args.only.split(",") if g.strip()]
        bad = [g for g in groups if g not in GROUPS]
        if bad:
            raise ConfigError(f"--only {', '.join(bad)}: expected groups among {', '.join(GROUPS)}")
    constants = calibrate(groups)
    drifted = [c for c in constants if abs(c.drift) > DRIFT_LIMIT]
    out = {"constants": [c.to_dict() for c in constants], "drifted": [c.name for c in drifted],
           "drift_limit": DRIFT_LIMIT}
    if args.out:
        write_json(args.out, out)
    if args.json:
        print(json_text(out))
    else:
        print(f"{'preset':15s} {'constant':52s} {'stored':>10s} {'recomputed':>11s} {'drift':>7s}")
        for c in constants:
            flag = "  DRIFTED" if c in drifted else ""
            print(f"{c.preset:15s} {c.name:52s} {c.value:10.4g} {c.recomputed:11.4g} {100 * c.drift:+6.2f}%{flag}")
        print(f"{len(constants)} constants, {len(drifted)} drifted more than {DRIFT_LIMIT:.0%}")
    return 1 if args.check and drifted else 0
