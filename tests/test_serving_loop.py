"""One serving loop at every level (npusim.serving.loop): the chip and the system call the same loop,
neither keeps a loop of its own, and a fake instance of constant step cost served by the loop on
either level's clock (the chip's engine, the system's event heap) gives the same records, conserves
tokens and obeys Little's law."""

import ast
import inspect
import math
import textwrap
from dataclasses import replace
from types import SimpleNamespace

import pytest

from npusim.mapping.spec import spec_from_flags
from npusim.serving.requests import Fixed, synthetic_requests
from npusim.serving.scheduler import Live, Scheduler, SchedulerConfig
from npusim.serving.simulate import ServingConfig, ServingSimulator, simulate_serving
from npusim.sim import Simulator
from npusim.system import serving as system_serving
from npusim.system.load import load_system
from npusim.system.plan import ParallelPlan
from npusim.system.serving import PoolSpec, serve_pools

STEP_S = 0.004  # the fake instance's iteration time, whatever it runs


class _Fake:
    """An instance whose every iteration takes ``STEP_S``, one at a time: FCFS admission up to
    ``max_batch``, continuous batching; ``launch`` gives the clock its ticket (``submit``)."""

    def __init__(self, name, submit, max_batch=4):
        self.name, self.submit, self.max_batch = name, submit, max_batch
        self.scheduler = Scheduler(SchedulerConfig(policy="continuous", max_batch=max_batch, max_tokens=4096,
                                                   chunk_tokens=0))
        self.waiting, self.running, self.busy = [], [], False

    def admit(self, records, t):
        while self.waiting and len(self.running) < self.max_batch:
            live = self.waiting.pop(0)
            records[live.req.id].first_scheduled_s = t
            self.running.append(live)
        return 0

    def can_launch(self):
        return not self.busy and bool(self.running)

    def plan(self):
        return self.scheduler.plan(self.running)

    def launch(self, slots, records, t):
        self.busy = True
        return self.submit(t)

    def complete(self, slots, records, t):
        from npusim.serving.loop import advance

        self.busy = False
        made = advance(slots, records, t, lambda rid, n: None)
        return [x.live for x in slots if x.live.done], [], made, None

    def release(self, live):
        self.running.remove(live)


class _FakeLevel:
    def __init__(self, instances):
        self.instances = instances

    def arrive(self, req, record, t):
        min(self.instances, key=lambda i: len(i.waiting) + len(i.running)).waiting.append(Live(req))
        return True

    def hand_off(self, inst, leaving, records, t):
        assert not leaving

    def on_event(self, event, records, t):
        raise AssertionError(event)

    def after_iteration(self, inst, finished, records, t):
        pass

    def reject_stuck(self, records):
        return False

    def busy(self):
        return any(i.waiting or i.running for i in self.instances)


def _requests(n=40):
    reqs = synthetic_requests(n, math.inf, input_len=Fixed(64), output_len=Fixed(9), seed=1)
    return [replace(r, arrival_s=0.0) for r in reqs]


def _heap_run(reqs, concurrency):
    from npusim.serving import loop
    from npusim.system.serving import _HeapClock

    clock = _HeapClock(None)
    level = _FakeLevel([_Fake(f"i{k}", lambda t: t + STEP_S) for k in range(2)])
    return loop.serve(level, clock, reqs, max_concurrency=concurrency)


def _engine_run(arch, reqs, concurrency):
    from npusim.serving import loop
    from npusim.serving.simulate import _EngineClock

    sim = Simulator(arch, memory_mode="analytical", noc_mode="analytical")
    hz = arch.clock_ghz * 1e9
    cycles = round(STEP_S * hz)

    def submit(core):
        return lambda t: sim.add_notify([sim.add_compute(core, sim.units[0], cycles)])

    level = _FakeLevel([_Fake(f"i{k}", submit(k)) for k in range(2)])
    clock = _EngineClock(SimpleNamespace(sim=sim, hz=hz, instances=[], tasks_total=0))
    return loop.serve(level, clock, reqs, max_concurrency=concurrency)


@pytest.mark.parametrize("clock", ["heap", "engine"])
@pytest.mark.parametrize("concurrency", [1, 6])
def test_a_constant_step_instance_conserves_tokens_and_obeys_littles_law(arch64, clock, concurrency):
    reqs = _requests()
    run = _heap_run(reqs, concurrency) if clock == "heap" else _engine_run(arch64, reqs, concurrency)
    recs = [run.records[r.id] for r in reqs]
    assert all(rec.completed for rec in recs)
    assert run.tokens_made == sum(r.output_len for r in reqs)  # every token made once
    assert all(len(rec.token_times_s) == rec.output_len for rec in recs)
    # an iteration is STEP_S: a request's prompt is one, each further token one more
    assert min(rec.finish_s - rec.arrival_s for rec in recs) == pytest.approx(9 * STEP_S, rel=1e-6)
    # Little's law: mean requests in flight = throughput x mean latency = the client's concurrency
    # (the closed loop stays full until its last wave: 40 requests, the tail is short)
    duration = max(rec.finish_s for rec in recs)
    mean_latency = sum(rec.finish_s - rec.arrival_s for rec in recs) / len(recs)
    assert len(recs) / duration * mean_latency == pytest.approx(concurrency, rel=0.15)


@pytest.mark.parametrize("case", ["closed1", "closed6", "poisson"])
def test_the_loop_serves_alike_on_either_clock(arch64, case):
    """The same instances on the chip's engine and on the system's heap give the same records (to the
    engine's cycle): one request at a time (closed loop at 1), a closed loop's first wave of 6 sent at
    once (both clocks hand same-instant arrivals over together), and Poisson arrivals."""
    open_loop = case == "poisson"
    reqs = synthetic_requests(30, 150.0, input_len=Fixed(64), output_len=Fixed(5), seed=4) if open_loop \
        else _requests()
    conc = None if open_loop else int(case[-1])
    heap, engine = _heap_run(reqs, conc), _engine_run(arch64, reqs, conc)
    assert max(engine.records[r.id].finish_s for r in reqs) > 10 * STEP_S
    for r in reqs:
        a, b = heap.records[r.id], engine.records[r.id]
        assert a.arrival_s == pytest.approx(b.arrival_s, abs=1e-8)
        assert a.token_times_s == pytest.approx(b.token_times_s, abs=1e-8)


def _has_while(fn) -> bool:
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    return any(isinstance(node, ast.While) for node in ast.walk(tree))


def test_neither_level_keeps_a_serving_loop_of_its_own():
    assert not _has_while(system_serving.serve_pools)
    assert not _has_while(ServingSimulator._run) and not _has_while(ServingSimulator.run)
    from npusim.serving import loop

    assert _has_while(loop.serve)


def test_the_chip_and_the_system_both_serve_through_the_one_loop(monkeypatch, arch64):
    from npusim.serving import loop

    calls = []
    real = loop.serve

    def spy(level, clock, requests, *a, **kw):
        calls.append(type(clock).__name__)
        return real(level, clock, requests, *a, **kw)

    monkeypatch.setattr(loop, "serve", spy)
    reqs = synthetic_requests(3, 50.0, input_len=Fixed(32), output_len=Fixed(3), seed=2)
    spec = spec_from_flags(tp=16)
    chip = simulate_serving(arch64, spec, reqs, ServingConfig(model="qwen3-0.6b", layers=2,
                                                              memory_mode="analytical", noc_mode="analytical"))
    assert chip.summary["requests_completed"] == 3
    cm = load_system("cloudmatrix384", nodes=1)
    pools = [PoolSpec("aggregated", 1, ParallelPlan(npus=1, tp=2), max_batch_per_npu=4, tokens_per_npu=256)]
    run = serve_pools(cm, pools, reqs, "qwen3-0.6b", runtime="eager")
    assert run.summary["requests_completed"] == 3
    assert calls == ["_EngineClock", "_HeapClock"]


def test_same_instant_arrivals_share_the_first_iteration_on_the_heap_clock():
    """A closed loop's first wave (6 requests sent at t=0 to one instance that batches 6) is one
    iteration: the heap hands the wave over together, as a serving engine drains its input queue
    before it schedules (one by one, the first request would run alone and the other five wait)."""
    from npusim.serving import loop
    from npusim.system.serving import _HeapClock

    level = _FakeLevel([_Fake("i0", lambda t: t + STEP_S, max_batch=6)])
    run = loop.serve(level, _HeapClock(None), _requests(12), max_concurrency=6)
    first = sorted(run.records.values(), key=lambda rec: rec.arrival_s)[:6]
    assert [rec.token_times_s[0] for rec in first] == pytest.approx([STEP_S] * 6)
