"""Large GEMMs on one Ascend die against measured kernel times (``published.yaml`` ``chip_gemms``).

Each row is one GEMM costed by :class:`npusim.system.chipcost.ChipCost` on the die's preset
(analytical memory and NoC, the arch's L2), judged in TFLOPS (``2 M N K / time``). The naive
baseline is the roofline of the same work: ``max(flops / peak, compulsory HBM bytes / HBM
bandwidth)``. Both rows are fitted (see the file's header): they show how far npusim's cube runs
above the vendor kernels' ~85% of peak (issue 23, the cube pipeline's efficiency).
"""

from __future__ import annotations

from npusim.validate.published import published
from npusim.validate.rows import Row


def chip_gemm_rows(quick: bool = False) -> list[Row]:
    from npusim.system.chipcost import ChipCost

    sec = published()["chip_gemms"]
    rows = []
    for r in sec["rows"]:
        res = ChipCost(r["arch"]).gemm(r["m"], r["k"], r["n"], r["dtype"])
        flops = 2.0 * r["m"] * r["k"] * r["n"]
        roofline_us = max(flops / (res.peak_tflops_chip * 1e6), res.min_hbm_bytes / (res.hbm_peak_bandwidth_gbps * 1e3))
        rows.append(Row(name=r["name"], source=r["source"], published=flops / r["us"] / 1e6,
                        simulated=flops / res.time_us / 1e6, tolerance=sec["tolerance"], unit="TFLOPS",
                        kind="fitted" if r.get("fitted") else "outside", baseline=flops / roofline_us / 1e6,
                        note=f"{r['arch']}: npusim at {100 * res.compute_utilization:.0f}% of the die's peak "
                             f"({res.peak_tflops_chip:.0f} TFLOPS), L2 hit rate {100 * res.l2_hit_rate:.0f}%; "
                             "seen while weighing the L2's per-core rate"))
    return rows
