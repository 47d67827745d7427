"""Core-local SRAM: banked scratchpad, transaction-level cost of an access pattern.

Assumptions (units in names):

* ``banks`` banks, each serving up to ``bytes_per_cycle_per_bank`` bytes per cycle;
  addresses interleave across banks every ``bank_interleave_bytes``.
* An access pattern is ``count`` accesses of ``access_bytes`` each, ``stride_bytes``
  apart (contiguous when ``stride_bytes == access_bytes``). Accesses proceed in
  parallel across banks; accesses to the same bank serialise (a *bank conflict*).
* Cost = the busiest bank's cycles + ``access_latency_cycles`` once (pipelined).
  The bank sequence of a strided pattern is periodic, so the busiest bank is found
  exactly from one period (at most ``banks`` distinct interleave units).
* Not modelled: read/write port conflicts, ECC, arbitration between requesters
  (the cube, vector unit and DMA share the SRAM through their own queues).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from npusim.arch.schema import Sram


@dataclass(frozen=True)
class SramCost:
    cycles: int
    bytes: int
    banks_used: int
    conflict_factor: float  # cycles / conflict-free cycles (1.0 = no conflicts)

    @property
    def bytes_per_cycle(self) -> float:
        return self.bytes / self.cycles if self.cycles else 0.0


def sram_access_cost(sram: Sram, count: int, access_bytes: int, stride_bytes: int | None = None) -> SramCost:
    if count < 0 or access_bytes <= 0:
        raise ValueError(f"SRAM access needs count >= 0 and access_bytes > 0, got {count}, {access_bytes}")
    stride = access_bytes if stride_bytes is None else stride_bytes
    if stride <= 0:
        raise ValueError(f"stride_bytes must be positive, got {stride}")
    total = count * access_bytes
    if count == 0:
        return SramCost(0, 0, 0, 1.0)
    unit, nb, bw = sram.bank_interleave_bytes, sram.banks, sram.bytes_per_cycle_per_bank
    # bytes each bank serves over one period of the pattern
    span = nb * unit
    period = span // math.gcd(stride % span or span, span)
    period = min(period, count)
    per_bank = np.zeros(nb, dtype=np.int64)
    starts = np.arange(period, dtype=np.int64) * stride
    # split every access into interleave units (an access may straddle banks)
    first_unit = starts // unit
    last_unit = (starts + access_bytes - 1) // unit
    for offset in range(int((last_unit - first_unit).max()) + 1):
        u = first_unit + offset
        lo = np.maximum(starts, u * unit)
        hi = np.minimum(starts + access_bytes, (u + 1) * unit)
        valid = hi > lo
        np.add.at(per_bank, (u[valid] % nb), hi[valid] - lo[valid])
    full_periods, rest = divmod(count, period)
    busiest = per_bank * full_periods
    if rest:
        busiest = busiest + _partial(starts[:rest], access_bytes, unit, nb)
    busy_cycles = int(np.ceil(busiest / bw).max())
    ideal = math.ceil(total / (nb * bw))
    return SramCost(
        cycles=busy_cycles + sram.access_latency_cycles,
        bytes=total,
        banks_used=int(np.count_nonzero(per_bank)),
        conflict_factor=busy_cycles / ideal if ideal else 1.0,
    )


def _partial(starts: np.ndarray, access_bytes: int, unit: int, nb: int) -> np.ndarray:
    per_bank = np.zeros(nb, dtype=np.int64)
    for s in starts.tolist():
        pos, end = s, s + access_bytes
        while pos < end:
            nxt = min(end, (pos // unit + 1) * unit)
            per_bank[(pos // unit) % nb] += nxt - pos
            pos = nxt
    return per_bank
