"""Rows against the peer simulator SCALE-Sim 3.0.0: npusim's systolic-array GEMM cycles
(``gemm_cost`` with T_inj = rows and serial folds, SCALE-Sim's schedule) beside SCALE-Sim's Total
Cycles for the same GEMM, array and dataflow (``published.yaml`` ``scalesim``; produced by
``validation/scalesim_compare.py``, which reruns SCALE-Sim when it is installed)."""

from __future__ import annotations

from npusim.hw.compute import gemm_cost
from npusim.validate.published import published
from npusim.validate.rows import Row


def scalesim_rows(quick: bool = False) -> list[Row]:
    sec = published()["scalesim"]
    rows = []
    for label, m, k, n, array, df, cycles in sec["rows"]:
        sim = gemm_cost(m, k, n, array, array, df, weight_injection_cycles=array).cycles
        rows.append(Row(name=f"GEMM {label} {array}x{array} {df}", source=sec["source"], published=float(cycles),
                        simulated=float(sim), tolerance=float(sec["tolerance"]), unit=" cyc", kind="peer",
                        note="npusim counts the duration, SCALE-Sim the last cycle's index (+1 by design)"))
    return rows
