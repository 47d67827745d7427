"""Progress on stderr, so that no run longer than a few seconds is silent, ``--json`` included:

* fed by the simulators' progress callbacks: a tqdm bar on a terminal, and a plain line every
  :data:`LOG_EVERY_S` seconds otherwise (a log, CI, a pipe);
* a **heartbeat** (:func:`heartbeat`, around every command) that holds the :data:`LOG_EVERY_S`
  beat when no callback comes -- a long kernel call (the kernels release the GIL), a long
  set-up, a command without callbacks -- by repeating the last progress line marked "working",
  or saying how long the command has run; on a terminal it redraws the bar's clock each second;
* an estimate of the time left only once it has a basis: :data:`ETA_AFTER` of the items done
  (requests, points), extrapolated from the rate since the first item finished (so the
  compile and the first items' start-up do not weigh on it).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from contextlib import contextmanager

#: seconds between progress lines when stderr is not a terminal
LOG_EVERY_S = 30.0
#: the fraction of the items done before an estimate of the time left is shown
ETA_AFTER = 0.1


def _duration(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


class _Beat:
    """What the heartbeat knows: when a progress line was last printed, the live progress (a
    ``_LogLines`` or a terminal bar) if any."""

    lock = threading.Lock()
    last_line = time.monotonic()
    live: object | None = None


class _LogLines:
    """``progress(now, done, total)`` printing one line at most every ``every_s`` seconds: done of
    total, the simulated clock, wall time so far and, once it has a basis, an estimate of the time left."""

    def __init__(self, desc: str, unit: str, clock: Callable[[float], str], every_s: float):
        self.desc, self.unit, self.clock, self.every_s = desc, unit, clock, every_s
        self.start = time.monotonic()
        self.next_at = self.start + every_s
        self.state: tuple | None = None  # (now, done, total) of the last call
        self.first: tuple | None = None  # (wall time, done) when the first item was done
        self.fresh = False  # a call came since the last line

    def __call__(self, now: float, done: int, total: int) -> None:
        t = time.monotonic()
        self.state = (now, done, total)
        self.fresh = True
        if self.first is None and done > 0:
            self.first = (t, done)
        if t >= self.next_at:
            self.print(t)

    def left(self, t: float) -> str:
        """The estimate of the time left, or "" while it has no basis (see the module docstring)."""
        if self.state is None or self.first is None:
            return ""
        now, done, total = self.state
        t0, d0 = self.first
        if not total or done >= total or done < ETA_AFTER * total or done <= d0 or t <= t0:
            return ""
        return f", ~{_duration((t - t0) / (done - d0) * (total - done))} left"

    def line(self, t: float, working: bool = False) -> str:
        elapsed = _duration(t - self.start)
        if self.state is None:
            return f"{self.desc}: working, nothing finished yet, {elapsed} elapsed"
        now, done, total = self.state
        count = f"{done:,}/{total:,}" if total else f"{done:,}"
        clock = self.clock(now)
        return (f"{self.desc}: {count} {self.unit}s" + (f", {clock}" if clock else "") + f", {elapsed} elapsed"
                + (" (working)" if working else self.left(t)))

    def print(self, t: float, working: bool = False) -> None:
        with _Beat.lock:
            self.fresh = False
            self.next_at = t + self.every_s
            _Beat.last_line = t
            print(self.line(t, working), file=sys.stderr, flush=True)


@contextmanager
def heartbeat(command: str, enabled: bool = True, every_s: float | None = None):
    """While the block runs, a daemon thread keeps stderr from going silent for longer than
    ``every_s`` (default :data:`LOG_EVERY_S`) when it is not a terminal: the live progress line
    again, marked "working", or ``npusim COMMAND: working, ... elapsed``; on a terminal it
    refreshes the live bar once a second (its clock keeps moving)."""
    if not enabled:
        yield
        return
    every = LOG_EVERY_S if every_s is None else every_s
    tty = sys.stderr.isatty()
    stop = threading.Event()
    start = time.monotonic()
    _Beat.last_line = start

    def beat() -> None:
        while not stop.wait(min(1.0, every)):
            t = time.monotonic()
            live = _Beat.live
            if tty:
                if live is not None:
                    live.refresh()
                continue
            if t - _Beat.last_line < every:
                continue
            if isinstance(live, _LogLines):
                live.print(t, working=not live.fresh)
            else:
                with _Beat.lock:
                    _Beat.last_line = t
                    print(f"npusim {command}: working, {_duration(t - start)} elapsed", file=sys.stderr, flush=True)

    thread = threading.Thread(target=beat, name="npusim-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


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
    if not enabled:  # no bar: a no-op callback (tqdm, its multiprocessing lock included, stays unimported)
        yield lambda now, done, new_total: None
        return
    if kernels:
        compile_notice(kernels)
    if not sys.stderr.isatty():
        lines = _LogLines(desc, unit, clock, LOG_EVERY_S)
        _Beat.live = lines
        try:
            yield lines
        finally:
            _Beat.live = None
        return
    from tqdm import tqdm

    bar = tqdm(total=total, desc=desc, unit=unit, disable=None, leave=False, dynamic_ncols=True)

    def update(now: float, done: int, new_total: int) -> None:
        bar.total = new_total
        bar.n = done
        bar.set_postfix_str(clock(now), refresh=False)
        bar.refresh()

    _Beat.live = bar
    try:
        yield update
    finally:
        _Beat.live = None
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
