"""Perfetto / Chrome trace-event JSON: one process per core, one track per queue.

Open the file at https://ui.perfetto.dev (or chrome://tracing). Times are in
microseconds of simulated time; each task is a complete ("X") event.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from npusim.files import atomic_path


def write_perfetto(path: str | Path, *, queue_names: list[str], task_queue: np.ndarray, start: np.ndarray,
                   end: np.ndarray, clock_ghz: float, task_names: dict[int, str] | None = None,
                   max_events: int = 2_000_000) -> dict:
    """Write the trace; returns ``{"events": n_written, "dropped": n_not_written}``.

    Tasks without a queue or that never ran are skipped; beyond ``max_events`` the
    latest-starting tasks are dropped (the count is returned and recorded in the file).
    """
    task_names = task_names or {}
    us_per_cycle = 1e-3 / clock_ghz
    ran = np.flatnonzero((task_queue >= 0) & (start >= 0) & (end >= start))
    order = ran[np.argsort(start[ran], kind="stable")]
    dropped = max(0, len(order) - max_events)
    order = order[:max_events]
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        f.write('{"displayTimeUnit": "ns", "otherData": {"dropped_tasks": %d}, "traceEvents": [\n' % dropped)
        first = True

        def emit(event: dict) -> None:
            nonlocal first
            f.write(("" if first else ",\n") + json.dumps(event, separators=(",", ":")))
            first = False

        used_queues = np.unique(task_queue[order]) if len(order) else np.zeros(0, dtype=np.int64)
        seen_pids = set()
        for q in used_queues.tolist():
            proc, _, thread = queue_names[q].partition(".")
            pid = _pid(proc, q)
            if pid not in seen_pids:
                seen_pids.add(pid)
                emit({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": proc}})
                emit({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
            emit({"ph": "M", "name": "thread_name", "pid": pid, "tid": q, "args": {"name": thread or proc}})
        for t in order.tolist():
            q = int(task_queue[t])
            proc = queue_names[q].partition(".")[0]
            emit({
                "ph": "X", "name": task_names.get(t, f"task{t}"), "pid": _pid(proc, q), "tid": q,
                "ts": round(float(start[t]) * us_per_cycle, 6), "dur": round(float(end[t] - start[t]) * us_per_cycle, 6),
                "args": {"task": t, "start_cycle": int(start[t]), "end_cycle": int(end[t])},
            })
        f.write("\n]}\n")
    return {"events": len(order), "dropped": dropped}


def _pid(proc: str, queue: int) -> int:
    digits = "".join(ch for ch in proc if ch.isdigit())
    return int(digits) if digits else 100_000 + queue


def write_serving_timeline(path: str | Path, records, iterations: list[dict], max_events: int = 2_000_000) -> dict:
    """A serving run as trace events: per instance, each iteration from its submission to its
    end; per request, its phases (queued, prefill, decode). Both as async slices (Perfetto gives
    overlapping ones their own rows). ``records`` are ``RequestRecord``-like objects,
    ``iterations`` the dicts of :class:`~npusim.serving.simulate.ServingRun`; times in seconds."""
    events: list[dict] = []

    def span(cat: str, name: str, ident: str, t0: float, t1: float, args: dict) -> None:
        base = {"cat": cat, "name": name, "id": ident, "pid": 1 if cat == "iteration" else 2}
        events.append({**base, "ph": "b", "ts": round(t0 * 1e6, 3), "args": args})
        events.append({**base, "ph": "e", "ts": round(t1 * 1e6, 3)})

    for i, it in enumerate(iterations):
        span("iteration", f"{it['instance']} iteration", f"it{i}", it["submitted_s"], it["end_s"],
             {k: it[k] for k in ("requests", "tokens", "decodes") if k in it})
    for r in records:
        phases = [("queued", r.arrival_s, r.first_scheduled_s)]
        if r.token_times_s:
            phases += [("prefill", r.first_scheduled_s, r.token_times_s[0]),
                       ("decode", r.token_times_s[0], r.finish_s if r.finish_s is not None else r.token_times_s[-1])]
        for name, t0, t1 in phases:
            if t0 is not None and t1 is not None and t1 >= t0:
                span("request", name, f"r{r.id}", t0, t1, {"request": r.id, "input": r.input_len,
                                                           "output": r.output_len})
    dropped = max(0, len(events) - max_events) // 2
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "iterations"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "requests"}}]
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump({"displayTimeUnit": "ms", "otherData": {"dropped_spans": dropped},
                   "traceEvents": meta + events[:max_events]}, f, separators=(",", ":"))
    return {"events": min(len(events), max_events), "dropped": dropped}


def write_workload_timeline(path: str | Path, nodes: list[dict], start_us: np.ndarray, end_us: np.ndarray) -> dict:
    """A system step's timeline: one process per rank (die), a track per compute stream and one
    for its communication (a collective or MoE transfer node appears on each of its ranks'
    ``comm`` track, from its first to its last transfer). Zero-time marks are left out."""
    tracks = {"compute": 0, "moe": 1, "comm": 2}
    events = []
    ranks = set()
    for i, n in enumerate(nodes):
        if n["kind"] == "barrier":
            continue
        members = [n["rank"]] if n["kind"] == "compute" else n["ranks"]
        track = n.get("stream", "compute") if n["kind"] == "compute" else "comm"
        for r in members:
            ranks.add(r)
            events.append({"ph": "X", "name": n["name"] or n["kind"], "cat": n["category"], "pid": r,
                           "tid": tracks[track], "ts": round(float(start_us[i]), 3),
                           "dur": round(float(end_us[i] - start_us[i]), 3), "args": {"node": i}})
    meta = []
    for r in sorted(ranks):
        meta.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        meta.extend({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}}
                    for name, tid in tracks.items())
    with atomic_path(path) as tmp, open(tmp, "w") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": meta + events}, f, separators=(",", ":"))
    return {"events": len(events)}
