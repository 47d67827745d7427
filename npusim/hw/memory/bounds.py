"""Analytical bandwidth bounds of the HBM for an access pattern (what ``npusim mem`` compares with).

All from the DRAM timings (:mod:`npusim.hw.memory.params`, integer ps), per pseudo-channel
(PC), summed over PCs:

* data bus: one ``burst_bytes`` burst per ``max(burst time, tCCD_S)``;
* random (every transaction opens a row): the ACT-rate limit — one ACT per
  ``max(tRRD_S, tFAW / 4)`` on a PC (ACTs alternating bank groups, so tRRD_L never binds),
  one transaction per ACT — and the row-cycle limit — each bank opens one row per
  ``max(tRC, the ACT-to-ACT cycle of one transaction)``; the bound is the least of these
  and the data bus. As a fraction of peak the ACT-rate term is ``bursts per transaction x
  burst time / max(tRRD_S, tFAW/4)``: the transaction size sets it (on HBM2-2400, 5 tCK per
  ACT and 2 tCK per 32 B burst: 0.40 for 32 B, 0.80 for 64 B; ``npusim mem --request-bytes``,
  ``validation/hbm_random_request_size.py``);
* stream: the data bus (row openings amortised over a row);
* refresh: all-bank refresh takes a PC away for ``tRP + tRFC`` every tREFI (every term
  scales by what is left; for a run of a given length, the refreshes that fall in it); per-bank refresh takes one bank away for ``tRP + tRFCsb`` of every
  tREFI (only the row-cycle term scales; the bus and the ACT rate are not lost).

No bound is computed for ``strided`` (it depends on how the stride falls on the channels).
Initiator limits (DMA ports, tags) are not part of the bound: they are the chip's, not the
DRAM's.
"""

from __future__ import annotations

import numpy as np

from npusim.hw.memory.params import (
    P_BANKS, P_BURST_BYTES, P_PCS, P_REFRESH_PER_BANK, P_TCCD, P_TCCD_L, P_TFAW, P_TRC, P_TRCD, P_TRCDWR, P_TREFI,
    P_TRFC, P_TRFCSB, P_TRP, P_TRRD_S, P_TRTP, P_TWL, P_TWR, P_TXN_BYTES,
)


def _refreshes(p: np.ndarray, units: int, duration_ps: float | None) -> np.ndarray:
    """All-bank refreshes per PC per tREFI: 1 in the long run; in a run of ``duration_ps`` the
    ones that fall inside it (the model's first is at tREFI, the PCs of a channel staggered by
    tREFI / pseudo_channels), per tREFI of the run."""
    refi = float(p[P_TREFI])
    if duration_ps is None or duration_ps <= 0:
        return np.ones(units)
    npc = int(p[P_PCS])
    first = refi + (np.arange(units) % npc) * (refi // npc)
    count = np.maximum(0.0, np.floor((duration_ps - first) / refi) + 1)
    return count * refi / duration_ps


def bandwidth_bound(p: np.ndarray, burst_ps: np.ndarray, tccd_ps: np.ndarray, pattern: str,
                    write: bool = False, duration_ps: float | None = None) -> dict | None:
    """``{"bound_gbps", "limit", "terms_gbps"}`` for ``pattern`` (``stream`` or ``random``) over
    the PCs whose burst times (and tCCD_S, scaled alike) are given; None for other patterns.
    ``duration_ps``: count the all-bank refreshes that fall in a run that long (short runs
    see fewer than one per tREFI); None = the long-run rate."""
    if pattern not in ("stream", "random"):
        return None
    burst_bytes = int(p[P_BURST_BYTES])
    slot = np.maximum(burst_ps, tccd_ps).astype(float)
    bus = burst_bytes / slot  # bytes per ps per PC
    refi = float(p[P_TREFI])
    per_bank = bool(p[P_REFRESH_PER_BANK])
    if refi > 0 and not per_bank:
        keep_all = 1.0 - _refreshes(p, len(bus), duration_ps) * (p[P_TRP] + p[P_TRFC]) / refi
        keep_bank = 1.0
    elif refi > 0:
        keep_all, keep_bank = 1.0, 1.0 - (p[P_TRP] + p[P_TRFCSB]) / refi
    else:
        keep_all = keep_bank = 1.0
    terms = {"data_bus": bus * keep_all}
    if pattern == "random":
        txn = int(p[P_TXN_BYTES])
        bursts = -(-txn // burst_bytes)
        act_interval = max(float(p[P_TRRD_S]), p[P_TFAW] / 4.0)
        terms["act_rate"] = (np.full_like(bus, txn / act_interval) if act_interval > 0
                             else np.full_like(bus, np.inf)) * keep_all
        # one transaction's own ACT-to-ACT cycle on its bank
        if write:
            cycle = p[P_TRCDWR] + p[P_TWL] + (bursts - 1) * p[P_TCCD_L] + slot + p[P_TWR] + p[P_TRP]
        else:
            cycle = p[P_TRCD] + (bursts - 1) * max(p[P_TCCD_L], p[P_TCCD]) + p[P_TRTP] + p[P_TRP] + 0 * slot
        cycle = np.maximum(float(p[P_TRC]), cycle)
        terms["row_cycle"] = p[P_BANKS] * txn / cycle * keep_all * keep_bank
    per_pc = np.minimum.reduce(list(terms.values()))
    totals = {k: float(v.sum() * 1000.0) for k, v in terms.items()}  # bytes/ps -> GB/s
    return {"bound_gbps": float(per_pc.sum() * 1000.0), "limit": min(totals, key=totals.get),
            "terms_gbps": totals}
