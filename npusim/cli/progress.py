"""tqdm progress bars fed by the simulators' progress callbacks (stderr, TTY only)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager


@contextmanager
def _bar(desc: str, unit: str, total: int, enabled: bool, clock: Callable[[float], str]):
    """Yield ``progress(now, done, total)``: ``done`` of ``total`` items, ``clock(now)`` as postfix."""
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
