"""The event engine: queue order, dependencies, incremental runs, determinism, deadlocks."""

from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.errors import ConfigError, DeadlockError
from npusim.sim import Simulator


def test_in_order_queue_and_dependencies(small_arch):
    sim = Simulator(small_arch)
    a = sim.add_compute(0, "cube", 100, name="a")
    b = sim.add_compute(0, "cube", 50, name="b")  # same queue: starts when a ends
    c = sim.add_compute(1, "vector", 10, deps=[a], name="c")  # other core, waits for a
    d = sim.add_compute(1, "vector", 5, name="d")  # behind c in its queue although free
    sim.run()
    start, end = sim.task_times()
    assert (start[a], end[a]) == (0, 100)
    assert (start[b], end[b]) == (100, 150)
    assert (start[c], end[c]) == (100, 110)
    assert (start[d], end[d]) == (110, 115)
    busy = sim.busy_cycles()
    assert busy[0, 0] == 150 and busy[1, 1] == 15


def test_unqueued_barrier_task(small_arch):
    sim = Simulator(small_arch)
    a = sim.add_compute(0, "cube", 30)
    b = sim.add_compute(1, "cube", 70)
    barrier = sim.engine.submit(queue=-1, param=(0,), deps=[a, b])
    after = sim.add_compute(0, "vector", 1, deps=[barrier])
    sim.run()
    start, end = sim.task_times()
    assert end[barrier] == 70 and start[after] == 70


def _random_dag(rng, n, n_queues):
    queues = rng.integers(0, n_queues, n)
    durations = rng.integers(0, 50, n)
    deps = [sorted(set(rng.integers(0, i, rng.integers(0, 3)).tolist())) if i else [] for i in range(n)]
    return queues, durations, deps


def _submit_all(sim, queues, durations, deps, lo, hi):
    ptr = np.zeros(hi - lo + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(deps[i]) for i in range(lo, hi)])
    idx = np.array([d for i in range(lo, hi) for d in deps[i]], dtype=np.int64)
    return sim.submit_batch(np.zeros(hi - lo), queues[lo:hi], durations[lo:hi, None], ptr, idx)


@settings(max_examples=examples(25), deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 300), pieces=st.integers(1, 5))
def test_incremental_submit_before_time_advances_equals_one_shot(small_arch, seed, n, pieces):
    """Submitting in batches (with runs that stop before any time passes) is the same as one shot."""
    rng = np.random.default_rng(seed)
    queues, durations, deps = _random_dag(rng, n, 5 * 4)
    one = Simulator(small_arch)
    _submit_all(one, queues, durations, deps, 0, n)
    one.run()
    inc = Simulator(small_arch)
    bounds = np.linspace(0, n, pieces + 1).astype(int)
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        _submit_all(inc, queues, durations, deps, lo, hi)
        inc.run(until=0)
    inc.run()
    np.testing.assert_array_equal(one.task_times()[0], inc.task_times()[0])
    np.testing.assert_array_equal(one.task_times()[1], inc.task_times()[1])


def test_run_until_time_and_task_then_continue(small_arch):
    sim = Simulator(small_arch)
    tasks = [sim.add_compute(0, "cube", 10) for _ in range(10)]
    out = sim.run(until=35)
    assert out.reason == "time_limit" and sim.now == 35
    assert sim.engine.num_done == 3
    out = sim.run(until_task=tasks[6])
    assert out.reason == "task_done" and out.cycle == 70
    late = sim.add_compute(1, "cube", 5, deps=[tasks[9]])
    out = sim.run()
    assert out.reason == "finished"
    assert sim.task_times()[0][late] == 100


def test_submitting_later_starts_no_earlier_than_now(small_arch):
    sim = Simulator(small_arch)
    sim.add_compute(0, "cube", 10)
    sim.run(until=500)
    t = sim.add_compute(1, "cube", 10)
    sim.run()
    assert sim.task_times()[0][t] == 500


def test_determinism(arch64):
    def once():
        sim = Simulator(arch64)
        rng = np.random.default_rng(7)
        prev = []
        for i in range(200):
            core = int(rng.integers(0, 64))
            deps = prev[-2:] if i % 3 else []
            if i % 2:
                prev.append(sim.add_dma(core, int(rng.integers(1, 64)) * 1024, address=i * 65536, deps=deps))
            else:
                prev.append(sim.add_compute(core, "cube", int(rng.integers(1, 500)), deps=deps))
        sim.run()
        return sim.task_times(), sim.mem.ch_bytes.copy()

    (s1, e1), b1 = once()
    (s2, e2), b2 = once()
    assert (s1 == s2).all() and (e1 == e2).all() and (b1 == b2).all()


def test_deadlock_cycle_is_detected_and_named(small_arch):
    sim = Simulator(small_arch)
    ids = sim.submit_batch([0, 0], [0, 1], [[5], [5]], [0, 1, 2], [1, 0], names=["alpha", "beta"])
    with pytest.raises(DeadlockError) as err:
        sim.run()
    msg = str(err.value)
    assert "alpha" in msg and "beta" in msg and "can never start" in msg
    assert len(ids) == 2


def test_deadlock_through_queue_order_is_detected(small_arch):
    """a (queue q1) waits for d, which is queued behind c (queue q2), which waits for b, behind a."""
    sim = Simulator(small_arch)
    q1, q2 = sim.queue(0, "cube"), sim.queue(1, "cube")
    # a: q1 deps [d]; b: q1; c: q2 deps [b]; d: q2
    sim.submit_batch([0] * 4, [q1, q1, q2, q2], [[1]] * 4, [0, 1, 1, 2, 2], [3, 1], names=list("abcd"))
    with pytest.raises(DeadlockError) as err:
        sim.run()
    assert "queued behind" in str(err.value)


def test_bad_submissions_are_clear_errors(small_arch):
    sim = Simulator(small_arch)
    with pytest.raises(ConfigError, match="out of range"):
        sim.submit_batch([0], [999], [[1]], [0, 0], [])
    with pytest.raises(ConfigError, match="depends on itself"):
        sim.submit_batch([0], [0], [[1]], [0, 1], [0])
    with pytest.raises(ConfigError, match="task ids"):
        sim.submit_batch([0], [0], [[1]], [0, 1], [5])
    with pytest.raises(ConfigError, match="unknown task kind"):
        sim.submit_batch([9], [0], [[1]], [0, 0], [])
    with pytest.raises(ConfigError, match="unit"):
        sim.add_compute(0, "tensor", 1)


def test_large_fanout_grows_heap(small_arch):
    sim = Simulator(small_arch)
    root = sim.add_compute(0, "cube", 1)
    n = 5000
    ids = sim.submit_batch(np.zeros(n), np.full(n, -1), np.arange(n)[:, None] % 97, np.arange(n + 1), np.full(n, root))
    sim.run()
    start, end = sim.task_times()
    assert (start[ids] == 1).all() and (end[ids] == 1 + np.arange(n) % 97).all()


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31), pieces=st.integers(2, 6), mode=st.sampled_from(["path", "analytical", "flit"]))
def test_compaction_between_runs_changes_nothing(small_arch, seed, pieces, mode):
    """Submit work in batches, run part of the way, compact, continue: every task starts and ends
    when it would have without compaction (compute, DMA and NoC tasks in flight across compactions;
    tasks with several successors that become ready at once and contend for the NoC and HBM, so
    the order in which a finishing task releases its successors must survive a compaction)."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(pieces):
        batch = []
        for _ in range(int(rng.integers(1, 30))):
            kind = int(rng.integers(0, 3))
            core = int(rng.integers(0, 4))
            back = sorted({int(b) for b in rng.integers(1, 6, int(rng.integers(0, 3)))})  # 1-5 tasks back
            batch.append((kind, core, int(rng.integers(1, 4000)), int(rng.integers(0, 4)), back))
        batches.append(batch)

    def play(compact):
        sim = Simulator(small_arch, noc_mode=mode)
        ids = []  # current id of every task submitted so far (-1 once compacted away: it had finished)
        times = {}  # submission index -> (start, end), read before its task is compacted away
        for batch in batches:
            for kind, core, size, other, back in batch:
                deps = [ids[-b] for b in back if b <= len(ids) and ids[-b] >= 0]
                if kind == 0:
                    t = sim.add_compute(core, "cube", size // 10, deps=deps)
                elif kind == 1:
                    t = sim.add_dma(core, size, address=size * 64, deps=deps)
                else:
                    t = sim.add_send(core, other, size, deps=deps)
                ids.append(t)
            sim.run(until=sim.now + 300)
            if compact:
                start, end = sim.task_times()
                times.update({k: (int(start[i]), int(end[i])) for k, i in enumerate(ids) if i >= 0 and end[i] >= 0})
                new_id = sim.compact()
                ids = [int(new_id[i]) if i >= 0 else -1 for i in ids]
        sim.run()
        start, end = sim.task_times()
        times.update({k: (int(start[i]), int(end[i])) for k, i in enumerate(ids) if i >= 0})
        return sim.makespan(), sim.events, times

    assert play(True) == play(False)  # same end, same number of events, every task's times


def test_compaction_keeps_the_order_successors_start_in(small_arch):
    """Two messages to one router released by the same task: the first started takes the shared
    links first. A compaction while their predecessor runs must not reverse which one that is
    (it did: the successor lists were copied reversed, so results depended on when compaction ran)."""
    def play(compact):
        sim = Simulator(small_arch, noc_mode="path")
        a = sim.add_compute(0, "cube", 1000)
        ids = [a, sim.add_send(1, 3, 4096, deps=[a]), sim.add_send(2, 3, 4096, deps=[a])]
        sim.run(until=10)
        if compact:
            new_id = sim.compact()
            ids = [int(new_id[i]) for i in ids]
        sim.run()
        start, end = sim.task_times()
        return [(int(start[i]), int(end[i])) for i in ids]

    plain = play(False)
    assert plain[1][1] != plain[2][1]  # the two contend: who goes first shows
    assert play(True) == plain


@settings(max_examples=examples(20), deadline=None)
@given(seed=st.integers(0, 2**31), mode=st.sampled_from(["path", "analytical"]))
def test_task_rows_change_where_tasks_lie_not_what_they_do(small_arch, seed, mode):
    """A batch stored at any permutation of rows runs exactly as stored in order: every task (by
    its place in the batch) starts and ends at the same cycles, with the same number of events
    (fan-out into contending NoC messages and DMAs included, where start order shows)."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    kind = rng.integers(0, 3, n)
    core = rng.integers(0, 4, n)
    sim = Simulator(small_arch, noc_mode=mode)  # for the chip's queue and initiator numbering
    unit = np.where(kind == 0, sim.units.index("cube"), np.where(kind == 1, sim.units.index("dma0"),
                                                                    sim.units.index("noc")))
    queue = core * sim.queues_per_core + unit
    size = rng.integers(64, 4000, n)
    other = rng.integers(0, 4, n)
    param = np.array([(int(sz) // 10, 0, 0, 0) if k == 0 else
                      (int(sz), int(sz) * 64, 0, sim.initiator(int(c), 0)) if k == 1 else
                      (int(c), int(o), int(sz), 0) for k, c, sz, o in zip(kind, core, size, other)], dtype=np.int64)
    deps = [sorted({int(d) for d in rng.integers(0, i, int(rng.integers(0, 3)))}) if i else [] for i in range(n)]
    ptr = np.concatenate([[0], np.cumsum([len(d) for d in deps])])
    idx = np.array([d for ds in deps for d in ds], dtype=np.int64)

    def play(rows):
        s = Simulator(small_arch, noc_mode=mode)
        s.add_compute(0, "cube", 5)
        ids = s.submit_batch(kind, queue, param, ptr, idx + 1, rows=rows)
        s.run()
        start, end = s.task_times()
        return ids, [(int(start[i]), int(end[i])) for i in ids], s.events

    rows = rng.permutation(n)
    ids, times, events = play(rows)
    _, plain, plain_events = play(None)
    assert (ids == 1 + rows).all()
    assert times == plain and events == plain_events


@pytest.mark.parametrize("released_by_a_task", [False, True])
def test_task_rows_keep_the_start_order_of_contending_tasks(small_arch, released_by_a_task):
    """Two messages to one router and two DMAs whose streams cross the mesh, ready at once: the
    order they start in decides who takes the links first (their ends differ with it). Stored at
    any of the 24 permutations of rows, they start in the batch's order: the same ends every time."""
    import itertools

    def play(rows):
        sim = Simulator(small_arch, memory_mode="analytical", noc_mode="path")
        first = [sim.add_compute(0, "cube", 1000)] if released_by_a_task else []
        base = sim.engine.num_tasks
        noc, dma = sim.units.index("noc"), sim.units.index("dma0")
        q = [1 * sim.queues_per_core + noc, 2 * sim.queues_per_core + noc,
             1 * sim.queues_per_core + dma, 2 * sim.queues_per_core + dma]
        param = [[1, 3, 4096, 0], [2, 3, 4096, 0], [1 << 16, 0, 0, sim.initiator(1, 0)],
                 [1 << 12, 64, 0, sim.initiator(2, 0)]]
        ptr = np.arange(5) * len(first)
        ids = sim.submit_batch([2, 2, 1, 1], q, param, ptr, np.array(first * 4, dtype=np.int64), rows=rows)
        assert (ids == base + (np.arange(4) if rows is None else np.asarray(rows))).all()
        sim.run()
        return [int(sim.task_times()[1][i]) for i in ids]

    plain = play(None)
    assert {tuple(play(list(r))) for r in itertools.permutations(range(4))} == {tuple(plain)}


def _successor_lists(tt, n):
    lists = []
    for t in range(n):
        out, e = [], int(tt.succ_head[t])
        while e >= 0:
            out.append(int(tt.e_dst[e]))
            e = int(tt.e_next[e])
        lists.append(out)
    return lists


@settings(max_examples=examples(20), deadline=None)
@given(seed=st.integers(0, 2**31), mode=st.sampled_from(["path", "analytical"]))
def test_a_template_adds_what_its_batch_adds(small_arch, seed, mode):
    """A batch linked once as a template (``make_template``) and added behind tasks already
    running -- with some of its tasks' parameters replaced and some of its tasks also waiting for
    earlier tasks, done or not -- leaves the task table as ``submit_batch`` of the same batch does
    (every field, each successor list in the same order, the same ready tasks) and runs the same."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    kind = rng.integers(0, 3, n)
    core = rng.integers(0, 4, n)
    probe = Simulator(small_arch, noc_mode=mode)
    unit = np.where(kind == 0, probe.units.index("cube"), np.where(kind == 1, probe.units.index("dma0"),
                                                                      probe.units.index("noc")))
    queue = core * probe.queues_per_core + unit

    def params(k, c, sz, o):
        return ((int(sz) // 10, 0, 0, 0, 0, 0) if k == 0 else (int(sz), int(sz) * 64, 0, probe.initiator(int(c), 0), 0, 0)
                if k == 1 else (int(c), int(o), int(sz), 0, 0, 0))

    param = np.array([params(*a) for a in zip(kind, core, rng.integers(64, 4000, n), rng.integers(0, 4, n))],
                     dtype=np.int64)
    deps = [sorted({int(d) for d in rng.integers(0, i, int(rng.integers(0, 3)))}) if i else [] for i in range(n)]
    ptr = np.concatenate([[0], np.cumsum([len(d) for d in deps])]).astype(np.int64)
    idx = np.array([d for ds in deps for d in ds], dtype=np.int64)
    rows = rng.permutation(n)
    patch_rows = np.sort(rng.choice(n, int(rng.integers(0, n + 1)), replace=False))
    patch = np.array([params(kind[r], core[r], s, o) for r, s, o in
                      zip(patch_rows, rng.integers(64, 4000, n), rng.integers(0, 4, n))], dtype=np.int64).reshape(-1, 6)
    extra_rows = np.sort(rng.choice(n, int(rng.integers(0, n + 1)), replace=False))

    def earlier(sim):  # tasks on the batch's queues, some done by now, and the extra predecessors among them
        ids = [sim.add_compute(int(c), "cube", int(d)) for c, d in zip(rng.integers(0, 4, 6), rng.integers(1, 400, 6))]
        ids += [sim.add_send(int(a), int(b), int(sz)) for a, b, sz in zip(core[:3], core[-3:], rng.integers(8, 900, 3))]
        sim.run(until=int(rng.integers(0, 300)))
        return np.array(ids[::2], dtype=np.int64)

    def by_batch(sim, preds):
        first = sim.engine.num_tasks
        p = param.copy()
        p[patch_rows] = patch
        lists = [[d + first for d in ds] + (preds.tolist() if i in set(extra_rows.tolist()) else [])
                 for i, ds in enumerate(deps)]
        ptr2 = np.concatenate([[0], np.cumsum([len(x) for x in lists])]).astype(np.int64)
        return sim.submit_batch(kind, queue, p, ptr2, np.array([d for x in lists for d in x], dtype=np.int64), rows=rows)

    def by_template(sim, preds):
        tmpl = sim.make_template((kind, queue, param, ptr, idx), rows)
        return sim.submit_template(tmpl, patch_rows=patch_rows, patch_param=patch, extra_rows=extra_rows,
                                   extra_preds=preds)

    state = rng.bit_generator.state
    played = []
    for submit in (by_batch, by_template):
        rng.bit_generator.state = state
        sim = Simulator(small_arch, noc_mode=mode)
        ids = submit(sim, earlier(sim))
        tt, m = sim.engine.tt, sim.engine.num_tasks
        table = {f: getattr(tt, f)[:m].tolist() for f in ("kind", "queue", "param", "deps_left", "state", "start", "end",
                                                            "qnext")}
        table.update({f: getattr(tt, f).tolist() for f in ("q_head", "q_tail", "q_running", "q_busy", "sc")})
        table["ready"] = tt.ready[tt.sc[4]:tt.sc[5]].tolist()
        table["successors"] = _successor_lists(tt, m)
        sim.run()
        played.append((ids.tolist(), table, sim.task_times()[1].tolist(), sim.events))
    assert played[0] == played[1]


def test_task_rows_must_be_a_permutation(small_arch):
    sim = Simulator(small_arch)
    with pytest.raises(ConfigError, match="permutation"):
        sim.submit_batch([0, 0], [0, 0], [[1], [1]], [0, 0, 0], [], rows=[0, 0])


def test_notify_tasks_return_control_in_completion_order(small_arch):
    sim = Simulator(small_arch)
    a = sim.add_compute(0, "cube", 50)
    b = sim.add_compute(1, "cube", 20)
    na = sim.add_notify([a], "a done")
    nb = sim.add_notify([b], "b done")
    seen = []
    while True:
        out = sim.run()
        if out.reason != "notify":
            break
        seen.append((out.task, out.cycle))
    assert seen == [(nb, 20), (na, 50)] and out.reason == "finished"



@lru_cache(maxsize=None)
def _event_queues():
    """(push, pop, next_time, new) of both event queues, their inline-only pop and next-time each
    called from a compiled wrapper as the kernels call them (compiled once a process, not once an
    example: a compile is ~0.5 s)."""
    from numba import njit

    from npusim.engine import eventlist, heap as binary

    def wrapped(pop_fn, next_fn):
        return njit(lambda heap, hs: pop_fn(heap, hs)), njit(lambda heap, hs: next_fn(heap, hs))

    return ((binary.heap_push, *wrapped(binary.heap_pop, binary.heap_next_time), binary.new_heap),
            (eventlist.event_push, *wrapped(eventlist.event_pop, eventlist.event_next_time),
             eventlist.new_event_list))


@settings(max_examples=examples(60), deadline=None)
@given(ops=st.lists(st.one_of(st.none(), st.integers(-3, 6)), min_size=1, max_size=300))
def test_event_queues_pop_in_time_then_push_order(ops):
    """Both event queues (the system level's binary heap, the chip loop's sorted list) pop exactly
    what ``heapq`` on ``(time, seq)`` pops, ties in push order, for any mix of pushes (``int``: at
    that offset from the last popped time, past times included) and pops (``None``), and say the
    next time right: the kernels' event order, hence every result, depends on nothing else."""
    import heapq

    for push, pop, next_time, new in _event_queues():
        heap, hs = new(len(ops) + 1)
        ref, now = [], 0
        for i, op in enumerate(ops):
            if op is None:
                if ref:
                    assert next_time(heap, hs) == ref[0][0]
                    time, etype, eid = pop(heap, hs)
                    want = heapq.heappop(ref)
                    assert (time, etype, eid) == (want[0], want[1] % 43, want[2])
                    now = time
            else:
                push(heap, hs, now + op, i % 43, i)  # event types 0..42, as the models use
                heapq.heappush(ref, (now + op, i, i))
        assert hs[0] == len(ref)
