"""A tqdm progress bar fed by the simulator's progress callback (stderr, TTY only)."""

from __future__ import annotations

from contextlib import contextmanager

from tqdm import tqdm


@contextmanager
def task_progress(clock_ghz: float, enabled: bool = True, desc: str = "simulating"):
    """Yield a ``progress(now_cycles, done, total)`` callback drawing a bar of tasks done."""
    bar = tqdm(total=0, desc=desc, unit="task", disable=None if enabled else True, leave=False, dynamic_ncols=True)

    def update(now: int, done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.set_postfix_str(f"t={now / clock_ghz / 1e3:,.1f} us", refresh=False)
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()


@contextmanager
def request_progress(total: int, enabled: bool = True):
    """Yield a ``progress(now_s, done, total)`` callback drawing a bar of requests finished."""
    bar = tqdm(total=total, desc="serving", unit="req", disable=None if enabled else True, leave=False,
               dynamic_ncols=True)

    def update(now_s: float, done: int, _total: int) -> None:
        bar.n = done
        bar.set_postfix_str(f"t={now_s:,.3f} s", refresh=False)
        bar.refresh()

    try:
        yield update
    finally:
        bar.close()
