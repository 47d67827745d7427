"""Utilisation over time in a serving run, from the engine's per-queue busy counters.

Busy time is measured exactly inside each window: the counters plus the elapsed part of
the tasks occupying a queue at the window's edges (``Simulator.busy_cycles(include_running=
True)``), so every fraction lies in [0, 1]. Two series:

* ``utilization``: at every sample (each iteration end), the fraction of the chip's units of
  each class (cube, vector, DMA engines, NoC port) busy since the previous sample;
* ``core_utilization``: per core and class over windows of at least ``core_window_s``
  simulated seconds (columns ``core<i>.<class>``), coarse enough to keep long runs' files small.
"""

from __future__ import annotations

import numpy as np

from npusim.serving.metrics import TimeSeries

CLASSES = ("cube", "vector", "dma", "noc")


class UtilizationSampler:
    def __init__(self, sim, core_window_s: float = 0.05):
        self.sim = sim
        self.hz = sim.arch.clock_ghz * 1e9
        self.core_window = max(1, int(core_window_s * self.hz))
        units = sim.units
        self.members = [[i for i, u in enumerate(units) if u == c or (c == "dma" and u.startswith("dma"))]
                        for c in CLASSES]
        self.units_per_class = np.array([len(m) for m in self.members], dtype=np.float64)
        self.of_class = np.zeros((len(units), len(CLASSES)), dtype=np.int64)  # unit -> its class (0/1)
        for c, m in enumerate(self.members):
            self.of_class[m, c] = 1
        cores = sim.arch.num_cores
        self.chip = TimeSeries(list(CLASSES), "fraction of the chip's units busy")
        self.cores = TimeSeries([f"core{i}.{c}" for i in range(cores) for c in CLASSES],
                                "fraction of the core's units of the class busy")
        self._last = self._core_last = self._busy()
        self._t = self._core_t = sim.now

    def _busy(self) -> np.ndarray:
        """Busy cycles (cores, classes) summed over each class's units."""
        return self.sim.busy_cycles(include_running=True) @ self.of_class  # integer sums per class

    def sample(self, final: bool = False) -> None:
        """Record the chip series; the per-core one once its window is full (or, ``final``, at
        the end of the run whatever the window's length)."""
        now = self.sim.now
        busy = self._busy()
        units = self.units_per_class
        if now > self._t:
            frac = (busy - self._last).sum(axis=0) / ((now - self._t) * units * busy.shape[0])
            self.chip.record(now / self.hz, frac)
        self._last, self._t = busy, now
        if now - self._core_t >= self.core_window or (final and now > self._core_t):
            frac = (busy - self._core_last) / ((now - self._core_t) * units)
            self.cores.record(now / self.hz, frac.ravel())
            self._core_last, self._core_t = busy, now

    def series(self) -> dict[str, TimeSeries]:
        return {"utilization": self.chip, "core_utilization": self.cores}
