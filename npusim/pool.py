"""Run independent points in this process, a local process pool, or a Dask distributed cluster.

One function, :func:`run_points`, serves every search that runs many independent simulations
(``npusim sweep``'s points, ``npusim plan``'s candidate plans): ``fn(item)`` must be a
module-level function (picklable) that returns its record and never raises for the item's own
failures; ``finished(record)`` is called in this process as records arrive, in item order within
each batch that completes together. A worker that dies turns into ``failed(item, exc)``'s record.

``workers=1`` (or one item) runs in this process; more use a ``spawn`` process pool (fresh
interpreters: no state forked from the parent, Numba's on-disk cache shared); ``scheduler``
(``tcp://host:port``) submits to a Dask cluster whose workers import the same npusim. On Ctrl-C or
an error the records finished meanwhile are still delivered, then the workers are stopped.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

from npusim.errors import ConfigError


def default_workers() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def connect(scheduler: str):
    """A Dask client for ``scheduler``; a ConfigError when Dask is missing or nothing answers."""
    try:
        from distributed import Client
    except ImportError:
        raise ConfigError("--scheduler needs Dask's distributed scheduler: pip install 'dask[distributed]'") from None
    try:
        return Client(scheduler, timeout="10s")
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(f"--scheduler {scheduler}: cannot connect to a Dask scheduler there ({exc})") from None


def run_points(fn: Callable, items: Sequence, finished: Callable[[dict], None], failed: Callable,
               workers: int | None = 1, client=None, key: Callable | None = None) -> None:
    """Run ``fn`` on every item (see the module docstring); ``client``: a Dask client (from
    :func:`connect`; the caller closes it), ``key(item)``: its task name there."""
    if client is not None:
        _run_dask(fn, items, client, finished, failed, key or (lambda item: None))
    elif (workers or 1) <= 1 or len(items) <= 1:
        for item in items:
            finished(fn(item))
    else:
        _run_pool(fn, items, min(workers, len(items)), finished, failed)


def _run_pool(fn, items, workers: int, finished, failed) -> None:
    ctx = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_ignore_sigint)
    futures = {pool.submit(fn, item): i for i, item in enumerate(items)}
    pending, delivered = set(futures), set()
    try:
        while pending:
            ready, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in sorted(ready, key=lambda f: futures[f]):
                exc = fut.exception()
                finished(fut.result() if exc is None else failed(items[futures[fut]], exc))
                delivered.add(fut)
    except BaseException:
        # keep what finished meanwhile, then stop the workers this pool started (running items
        # are abandoned)
        for fut in futures:
            if fut not in delivered and fut.done() and not fut.cancelled() and fut.exception() is None:
                finished(fut.result())
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)  # returns at once: its workers are gone
        raise
    pool.shutdown()


def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which saves what it has and then stops them."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_dask(fn, items, client, finished, failed, key) -> None:
    from distributed import as_completed

    futures = {}
    for item in items:
        futures[client.submit(fn, item, key=key(item), pure=False)] = item
    try:
        for fut in as_completed(list(futures)):
            if fut.status == "finished":
                finished(fut.result())
                continue
            try:
                exc = fut.exception()
            except Exception as err:  # cancelled
                exc = err
            finished(failed(futures[fut], exc))
    except BaseException:
        client.cancel(list(futures))
        raise
