"""The serving loop: one for every level (a chip's instances on the engine, a system's instances of
dies timed by their step tables).

What the loop owns, the same at every level:

* **arrivals and the client**: it hands the requests (or, with ``max_concurrency``, the first of a
  :class:`~npusim.serving.client.ClosedLoop`) to the clock, makes each request's
  :class:`~npusim.serving.metrics.RequestRecord` when it arrives, and sends the client's next request
  the moment one finishes or is rejected (after the launches at that instant);
* **admission and launch**: after every event, each instance admits what its own rule lets in
  (:meth:`Instance.admit`) and launches iterations while it may (:meth:`Instance.can_launch`,
  :meth:`Instance.plan` -- the :class:`~npusim.serving.scheduler.Scheduler`'s slots --,
  :meth:`Instance.launch`), in instance order; the clock reports each iteration's end;
* **completion**: an ended iteration's tokens exist (:func:`advance` grows each slot's progress and
  KV and stamps its tokens); finished requests are released (their KV freed) and stamped; requests
  whose prompt is done on an instance that hands off are given to the level's hand-off (the KV
  transfer starts on the clock; its arrival event gives the request to the decode side);
* **rejection** of what can never be admitted: when nothing is in flight and nothing will arrive, the
  level rejects a request it can never hold (:meth:`Level.reject_stuck`) instead of spinning; a
  request the level refuses at arrival (:meth:`Level.arrive` returns False) is rejected then;
* **progress** (``progress(t_s, finished, total)`` after every iteration) and the records.

What a level gives it (two small adapters, :class:`Clock` and :class:`Level` with its instances):

* a **clock / transport**: :meth:`Clock.send` (requests to arrive at their ``arrival_s``),
  :meth:`Clock.watch` (an iteration's ticket: report ``what`` when it ends), :meth:`Clock.next`
  (advance to the next event(s); None when nothing is in flight or pending), :meth:`Clock.settle`
  (after the events were handled). The chip's is the discrete-event engine (a ticket is an
  iteration's notify task; KV moves as NoC messages ending in a notify); a system's is an event heap
  beside one flow simulation of the fabric (a ticket is an iteration's end time; KV moves as fabric
  transfers). The chip's clock hands over every arrival due by the engine's time at once, after the
  event that stopped it; the heap hands over one event at a time but arrivals, which it hands over
  together when they are due at the same instant (a serving engine drains its input queue before it
  schedules a step: vLLM's ``EngineCoreProc._process_input_queue``);
* **instances**: each a step-cost model behind one interface (``name``, ``admit``, ``can_launch``,
  ``plan``, ``launch``, ``complete``, ``release``): a chip instance times an
  iteration by a compiled program on the engine; a system instance by its plan's step table
  (:class:`npusim.system.serving.StepCost`). Admission rules that differ stay each instance's own.
* a **level** (:meth:`Level.arrive` routes an arrival, :meth:`Level.hand_off` starts KV transfers,
  :meth:`Level.on_event` takes the level's own events -- a KV arrival, a caching pool's read --,
  :meth:`Level.after_iteration` -- the chip samples its cores and memory, a system offers freed
  decode room to prompts waiting for it --, :meth:`Level.reject_stuck`, :meth:`Level.busy`), each
  level counting its KV hand-offs in a :class:`Transfers`.

Times are seconds. Deterministic: instances in a fixed order, events in the clock's order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from npusim.errors import ConfigError
from npusim.serving.client import ClosedLoop
from npusim.serving.metrics import RequestRecord

#: event kinds a clock reports: ``(ARRIVE, [requests])``, ``(ITERATION, instance, slots)``, and the
#: level's own (``KV_ARRIVED``, ``READY``, ... passed to :meth:`Level.on_event`)
ARRIVE, ITERATION, KV_ARRIVED, READY = "arrive", "iteration", "kv_arrived", "ready"


class Clock(Protocol):
    """A level's time and transport (see the module docstring)."""

    def now_s(self) -> float: ...
    def send(self, requests: list) -> None: ...
    def watch(self, ticket, what: tuple) -> None: ...
    def next(self) -> list[tuple] | None: ...
    def settle(self) -> None: ...


class Instance(Protocol):
    """A step-cost model the loop launches iterations on (see the module docstring)."""

    name: str

    def admit(self, records: dict, t_s: float) -> int: ...  # requests rejected for good
    def can_launch(self) -> bool: ...
    def plan(self) -> list: ...
    def launch(self, slots: list, records: dict, t_s: float): ...  # the clock's ticket
    # (requests finished, requests leaving for another instance, tokens made, the iteration's record or None)
    def complete(self, slots: list, records: dict, t_s: float) -> tuple[list, list, int, dict | None]: ...
    def release(self, live) -> None: ...


class Level(Protocol):
    """A level's instances (in the order they admit and launch) and how requests move between them."""

    instances: list

    def arrive(self, req, record: RequestRecord, t_s: float) -> bool: ...
    def hand_off(self, inst, leaving: list, records: dict, t_s: float) -> None: ...
    def on_event(self, event: tuple, records: dict, t_s: float) -> None: ...
    def after_iteration(self, inst, finished: list, records: dict, t_s: float) -> None: ...
    def reject_stuck(self, records: dict) -> bool: ...
    def busy(self) -> bool: ...


@dataclass
class Transfers:
    """KV hand-offs counted: bytes and requests sent, bytes received, each transfer's duration (s)."""

    sent_bytes: int = 0
    count: int = 0
    received_bytes: int = 0
    durations_s: list = field(default_factory=list)


@dataclass
class LoopResult:
    records: dict  # request id -> RequestRecord (every request that arrived)
    iterations: list  # what the instances' ``complete`` returned (not None), in completion order
    tokens_made: int  # tokens stamped by iterations (conservation: against the completed outputs)


def advance(slots: list, records: dict, t_s: float, append, extra_tokens=None) -> int:
    """An iteration's tokens exist at ``t_s``: each slot's KV grows by what it computed (``append(req id,
    tokens)``; a decode slot's by the tokens it made), a prompt's progress by its ``q`` tokens, the slot
    that completes a prompt makes the first token and a decoding one ``1 + extra_tokens()`` (MTP's
    accepted drafts; None: 1) up to the output's length. Returns the tokens made."""
    made_total = 0
    for s in slots:
        live = s.live
        rec = records[live.req.id]
        if live.prefilling:
            live.prefilled += s.q
            append(live.req.id, s.q)
            if s.samples and live.generated == 0:
                live.generated = 1
                rec.token_times_s.append(t_s)
                made_total += 1
            continue
        made = 1 if extra_tokens is None else 1 + extra_tokens()
        made = min(made, live.req.output_len - live.generated)
        append(live.req.id, made)
        live.generated += made
        rec.token_times_s.extend([t_s] * made)
        made_total += made
    return made_total


def serve(level: Level, clock: Clock, requests: list, progress=None, max_concurrency: int | None = None) -> LoopResult:
    """Serve ``requests`` on ``level``'s instances by ``clock`` (see the module docstring);
    ``max_concurrency``: at most that many in flight, each further request sent when one finishes or
    is rejected (:class:`~npusim.serving.client.ClosedLoop`, its ``arrival_s`` the planned send)."""
    client = None if max_concurrency is None else ClosedLoop(requests, max_concurrency)
    clock.send(list(requests) if client is None else client.initial())
    records: dict[int, RequestRecord] = {}
    iterations: list = []
    total = len(requests)
    finished = released = tokens = 0

    def finish(inst, lives: list, t_s: float) -> None:
        nonlocal finished
        for live in lives:
            inst.release(live)
            records[live.req.id].finish_s = t_s
            finished += 1

    while True:
        t = clock.now_s()
        for inst in level.instances:
            finished += inst.admit(records, t)
            while inst.can_launch():
                slots = inst.plan()
                if not slots:
                    break
                clock.watch(inst.launch(slots, records, t), (ITERATION, inst, slots))
        if client is not None and released < finished:  # slots freed: the next requests are sent now
            for _ in range(finished - released):
                clock.send(client.on_finish(t))
            released = finished
        events = clock.next()
        if events is None:  # nothing in flight, nothing to arrive
            if level.reject_stuck(records):  # nothing runs and nothing can be admitted: never spin
                finished += 1
                continue
            if level.busy():
                raise ConfigError("the scheduler planned an empty iteration with requests running "
                                  "(check max_batch, max_tokens and budget)")
            break
        t = clock.now_s()
        for event in events:
            kind = event[0]
            if kind == ARRIVE:
                for req in event[1]:
                    rec = records[req.id] = RequestRecord.from_request(req)
                    if not level.arrive(req, rec, t):
                        finished += 1
            elif kind == ITERATION:
                _, inst, slots = event
                done, leaving, made, step = inst.complete(slots, records, t)
                tokens += made
                finish(inst, done, t)
                level.hand_off(inst, leaving, records, t)
                level.after_iteration(inst, done, records, t)
                if step is not None:
                    iterations.append(step)
                if progress:
                    progress(t, finished, total)
            else:
                level.on_event(event, records, t)
        clock.settle()
    return LoopResult(records, iterations, tokens)
