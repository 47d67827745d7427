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


@contextmanager
def _bar(desc: str, unit: str, total: int, enabled: bool, clock: Callable[[float], str]):
    """Yield ``progress(now, done, total)``: ``done`` of ``total`` items, ``clock(now)`` as postfix."""
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
    return _bar(desc, "task", 0, enabled, lambda now: f"t={now / clock_ghz / 1e3:,.1f} us")


def request_progress(total: int, enabled: bool = True):
    """Requests finished, with simulated time (the callback gets seconds)."""
    return _bar("serving", "req", total, enabled, lambda now: f"t={now:,.3f} s")


def system_progress(enabled: bool = True, desc: str = "simulating"):
    """System-level tasks done, with simulated time (the callback gets picoseconds)."""
    return _bar(desc, "task", 0, enabled, lambda now: f"t={now / 1e6:,.1f} us")


def point_progress(total: int, enabled: bool = True):
    """Sweep points finished (this run's and earlier runs'), with how many failed (the callback gets the count)."""
    return _bar("sweep", "pt", total, enabled, lambda failed: f"{int(failed)} failed")
