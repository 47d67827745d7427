"""Step times of a deployed model over a grid of step shapes, simulated on demand, bilinear between.

A serving run on a multi-NPU system takes thousands of decode and prefill steps whose shapes
differ a little each time; simulating every one (chip costs plus a fabric run over hundreds of
dies, seconds each) would be slow, so a :class:`StepTable` simulates a step function (a DeepSeek
deployment's :func:`~npusim.system.moe_step.simulate_step`, or a parallel plan's step) only at grid
points and interpolates between them:

* decode: ``x`` = sequences (a DeepSeek deployment: per NPU, the busiest die's count times the dies
  of an NPU; a plan: of the busiest data-parallel group: the slowest sets the pace), ``y`` = the
  mean KV length of the step's sequences;
* prefill: ``x`` = prompt tokens per NPU computed in the step, ``y`` = the prompt length the
  tokens attend to.

Grid points are powers of two (and 1.5 times them, so neighbours differ by at most 1.5x) and are
simulated lazily, the first time a step falls next to them; between points the step time is
bilinear in ``(x, y)``. Below the first point the step is the first point's (a step never takes
less than the smallest simulated one); above the last the table raises. Each point is one
step without the HBM check (the serving run's KV accounting bounds what runs).
``points`` counts the simulated points; ``lookups`` the steps answered.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable

from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment
from npusim.system.chipcost import ChipCost
from npusim.system.load import LoadedSystem
from npusim.system.moe_step import simulate_step


def grid(lo: int, hi: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, ... (powers of two and 1.5 times them) from ``lo`` up to ``hi``."""
    pts, p = [], 1
    while p <= hi:
        for v in (p, p * 3 // 2):
            if lo <= v <= hi and v not in pts:
                pts.append(v)
        p *= 2
    return pts


class StepTable:
    """Step times (ms) of one instance for one phase (see module docstring). ``step(x, y)`` simulates
    one grid point (decode: sequences, context; prefill: prompt tokens per NPU, prompt length):
    :func:`deployment_step` for a DeepSeek deployment, :func:`npusim.system.instance.plan_step` for a
    parallel plan."""

    def __init__(self, step: Callable[[int, int], float], phase: str, x_max: int, y_max: int,
                 x_min: int = 1, y_min: int = 128):
        self.step, self.phase = step, phase
        self.xs = grid(x_min, max(x_min, x_max))
        self.ys = grid(y_min, max(y_min, y_max))
        if self.xs[-1] < x_max:
            self.xs.append(x_max)
        if self.ys[-1] < y_max:
            self.ys.append(y_max)
        self._ms: dict[tuple[int, int], float] = {}
        self.lookups = 0

    @property
    def points(self) -> int:
        return len(self._ms)

    def _point(self, x: int, y: int) -> float:
        if (x, y) not in self._ms:
            self._ms[(x, y)] = self.step(x, y)
        return self._ms[(x, y)]

    @staticmethod
    def _bracket(pts: list[int], v: float, what: str) -> tuple[int, int, float]:
        if v > pts[-1]:
            raise ConfigError(f"step table: {what} {v:g} is beyond the table's largest point {pts[-1]}")
        v = max(v, pts[0])
        i = bisect.bisect_left(pts, v)
        if pts[i] == v:
            return pts[i], pts[i], 0.0
        lo, hi = pts[i - 1], pts[i]
        return lo, hi, (v - lo) / (hi - lo)

    def step_ms(self, x: float, y: float) -> float:
        """The step time at ``(x, y)``, bilinear between the four grid points around it."""
        self.lookups += 1
        names = ("sequences", "KV length") if self.phase == "decode" else \
            ("prompt tokens per NPU", "prompt length")
        x0, x1, fx = self._bracket(self.xs, x, names[0])
        y0, y1, fy = self._bracket(self.ys, y, names[1])
        a = self._point(x0, y0) * (1 - fx) + (self._point(x1, y0) * fx if fx else 0.0)
        if not fy:
            return a
        b = self._point(x0, y1) * (1 - fx) + (self._point(x1, y1) * fx if fx else 0.0)
        return a * (1 - fy) + b * fy


def deployment_step(loaded: LoadedSystem, dep: Deployment, model: str, seed: int = 0, routing: str = "uniform",
                    chip_cost: ChipCost | None = None, runtime: str | None = None) -> Callable[[int, int], float]:
    """A DeepSeek deployment's step time (ms) at (sequences per NPU, KV) for decode or (prompt tokens
    per NPU, prompt length) for prefill, not checked against HBM (the serving run's KV manager is);
    ``runtime``: eager / graph (None: the system's default for the phase)."""
    cc = chip_cost or ChipCost(loaded.chip)

    def step(x: int, y: int) -> float:
        if dep.phase == "decode":
            return simulate_step(loaded, dep, model, batch=x, kv=y, seed=seed, routing=routing, chip_cost=cc,
                                 check_fit=False, runtime=runtime).step_ms
        return simulate_step(loaded, dep, model, batch_tokens=x, seq=y, seed=seed, routing=routing, chip_cost=cc,
                             check_fit=False, runtime=runtime).step_ms
    return step
