"""HDF5 results: per-task table and per-queue totals of one simulation.

Layout: ``/tasks/{kind,queue,start_cycle,end_cycle,param}`` (one row per task),
``/queues/{name,busy_cycles}``, attributes ``arch``, ``clock_ghz`` and any given
``attrs``. The same task table is what a program trace stores.
"""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np

from npusim.files import write_with


def write_task_hdf5(path: str | Path, *, kind, queue, param, start, end, queue_names, busy_cycles,
                    attrs: dict | None = None) -> Path:
    def writer(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            t = f.create_group("tasks")
            for name, arr in (("kind", kind), ("queue", queue), ("start_cycle", start), ("end_cycle", end),
                              ("param", param)):
                t.create_dataset(name, data=np.asarray(arr), compression="gzip", compression_opts=1)
            q = f.create_group("queues")
            q.create_dataset("name", data=np.array(queue_names, dtype=h5py.string_dtype()))
            q.create_dataset("busy_cycles", data=np.asarray(busy_cycles))
            for key, value in (attrs or {}).items():
                f.attrs[key] = value

    return write_with(path, writer)
