"""The SRAM ports shared by a core's compute and its DMA engines, inside the simulation kernel.

At the detailed (TLM) memory fidelity a compute task (``KIND_FIXED`` built from a GEMM or a
vector op) carries, besides its duration ``param[0]`` (already including the stalls the
array's own operand streams cause, :mod:`npusim.hw.memory.sram_timing`), its SRAM demand in
bits ``param[2]`` and those array-side stall cycles ``param[3]``. DMA transfers into the
SRAM (HBM reads) and out of it (HBM writes) use the same ports, and which of them overlap a
compute task is known only when it starts, so that part is decided here, once per task:

* ``X`` = bits the core's DMA engines still have to move (the memory model's ``in_left`` of
  every engine of the core with a transfer in flight), ``r`` = their rate into the ports at
  most (active engines x each engine's port limit: ``dma.bytes_per_cycle``, or one
  ``transaction_bytes`` per cycle), ``B`` = the ports' supply (bits/cycle), ``D`` = the task's
  demand, ``T1`` = its duration.
* In ``T`` cycles the DMAs take ``min(X, r T)`` of the ports' ``B T``; the task needs
  ``B T - min(X, r T) >= D``, so ``T* = min(ceil((D + X) / B), ceil(D / (B - r)))`` (the second
  only when ``r < B``), and the task lasts ``max(T1, T*)``.

A DMA that starts while the task runs is not charged to it (it was not in flight at the
start), and the DMA itself is not slowed (the ports give compute and DMA what each needs
when the sum fits; when it does not, compute yields). With no DMA in flight, or a demand the
ports easily carry, ``T1`` stands. ``counters``: ``C_ARRAY`` (array-side stall cycles of the
tasks started), ``C_DMA`` (cycles added by DMA competition), ``C_TASKS`` (tasks timed here).
At the analytical fidelity ``prm[SP_ON] = 0`` and tasks keep ``param[0]``.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

SramPorts = namedtuple("SramPorts", ["prm", "supply", "dma_rate", "counters"])
SP_ON, SP_QPC, SP_ENGINES = range(3)
C_ARRAY, C_DMA, C_TASKS = range(3)
#: task parameters of a compute task at the detailed fidelity
P_SRAM_BITS, P_SRAM_STALL = 2, 3


def new_sram_ports(on: bool, queues_per_core: int, engines: int, supply_bits, dma_rate_bits) -> SramPorts:
    """``supply_bits[core]``: the ports' bits per cycle; ``dma_rate_bits[core]``: one DMA
    engine's bits per cycle into them."""
    return SramPorts(prm=np.array([int(on), queues_per_core, engines], np.int64),
                     supply=np.asarray(supply_bits, np.int64), dma_rate=np.asarray(dma_rate_bits, np.int64),
                     counters=np.zeros(4, np.int64))


@njit(cache=True, _nrt=False, inline="always")
def sram_task_cycles(sp, in_task, in_left, queue, duration, demand_bits, array_stall):
    """Duration of a compute task starting now on ``queue`` (see module docstring)."""
    if sp.prm[SP_ON] == 0 or demand_bits <= 0 or queue < 0:
        return duration
    core = queue // sp.prm[SP_QPC]
    sp.counters[C_TASKS] += 1
    sp.counters[C_ARRAY] += array_stall
    e = sp.prm[SP_ENGINES]
    left = 0
    active = 0
    for init in range(core * e, core * e + e):
        if in_task[init] >= 0 and in_left[init] > 0:
            left += in_left[init] * 8
            active += 1
    if active == 0:
        return duration
    b = sp.supply[core]
    r = active * sp.dma_rate[core]
    t = -(-(demand_bits + left) // b)
    if r < b:
        t2 = -(-demand_bits // (b - r))
        if t2 < t:
            t = t2
    if t > duration:
        sp.counters[C_DMA] += t - duration
        return t
    return duration
