"""Progress fed by the simulators' progress callbacks, on stderr: a tqdm bar on a terminal, and
a plain line every :data:`LOG_EVERY_S` seconds otherwise (a log, CI, a pipe), so that no long run
is silent."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from contextlib import contextmanager

#: seconds between progress lines when stderr is not a terminal
LOG_EVERY_S = 30.0


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class _LogLines:
    """``progress(now, done, total)`` printing one line at most every ``every_s`` seconds: done of
    total, the simulated clock, wall time so far and, with a total, an estimate of the time left."""

    def __init__(self, desc: str, unit: str, clock: Callable[[float], str], every_s: float):
        self.desc, self.unit, self.clock, self.every_s = desc, unit, clock, every_s
        self.start = time.monotonic()
        self.next_at = self.start + every_s

    def __call__(self, now: float, done: int, total: int) -> None:
        t = time.monotonic()
        if t < self.next_at:
            return
        self.next_at = t + self.every_s
        elapsed = t - self.start
        count = f"{done:,}/{total:,}" if total else f"{done:,}"
        left = f", ~{_duration(elapsed * (total - done) / done)} left" if total and 0 < done <= total else ""
        print(f"{self.desc}: {count} {self.unit}s, {self.clock(now)}, {_duration(elapsed)} elapsed{left}",
              file=sys.stderr, flush=True)


#: the Numba kernels a run may compile on first use: (module, function)
KERNELS = {"chip": ("npusim.sim.kernel", "run_loop"), "system": ("npusim.system.kernel", "system_loop")}


def compile_notice(kernels: tuple[str, ...]) -> None:
    """One line on stderr when a run is about to compile a simulation kernel (the first run after an
    install or a change to npusim's compiled sources), so the wait before the progress bar is said."""
    import importlib

    from npusim._jitcache import will_compile

    names = [k for k in kernels if will_compile(getattr(importlib.import_module(KERNELS[k][0]), KERNELS[k][1]))]
    if names:
        print(f"npusim: compiling the {' and '.join(names)} simulation kernel{'s' * (len(names) > 1)} with Numba, once "
              "after an install or an update (about 10-15 s on a 2-core machine; later runs load it from the cache)",
              file=sys.stderr, flush=True)


@contextmanager
def _bar(desc: str, unit: str, total: int, enabled: bool, clock: Callable[[float], str],
         kernels: tuple[str, ...] = ()):
    """Yield ``progress(now, done, total)``: ``done`` of ``total`` items, ``clock(now)`` as postfix;
    first say if one of ``kernels`` (:data:`KERNELS`) is about to be compiled."""
    if enabled and kernels:
        compile_notice(kernels)
    if enabled and not sys.stderr.isatty():
        yield _LogLines(desc, unit, clock, LOG_EVERY_S)
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, disable=None if enabled else True, leave=False, dynamic_ncols=True)

    def update(now: float, done: int, new_total: int) -> None:
        bar.total = new_total
        bar.n = done
        bar.set_postfix_str(clock(now), refresh=False)
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()


def task_progress(clock_ghz: float, enabled: bool = True, desc: str = "simulating"):
    """Tasks done, with simulated time (the callback gets cycles)."""
    return _bar(desc, "task", 0, enabled, lambda now: f"t={now / clock_ghz / 1e3:,.1f} us", ("chip",))


def request_progress(total: int, enabled: bool = True, kernels: tuple[str, ...] = ("chip",)):
    """Requests finished, with simulated time (the callback gets seconds)."""
    return _bar("serving", "req", total, enabled, lambda now: f"t={now:,.3f} s", kernels)


def system_progress(enabled: bool = True, desc: str = "simulating"):
    """System-level tasks done, with simulated time (the callback gets picoseconds)."""
    return _bar(desc, "task", 0, enabled, lambda now: f"t={now / 1e6:,.1f} us", ("chip", "system"))


def point_progress(total: int, enabled: bool = True):
    """Sweep points finished (this run's and earlier runs'), with how many failed (the callback gets the count)."""
    return _bar("sweep", "pt", total, enabled, lambda failed: f"{int(failed)} failed")


def plan_progress(total: int, enabled: bool = True):
    """Plan points finished (the total shrinks as plans stop early: memory or the latency objective)."""
    return _bar("plan", "pt", total, enabled, lambda _: "", ("chip", "system"))
