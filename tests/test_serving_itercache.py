"""The serving iteration-cost cache: its key, exact replay, interpolation bounds, determinism, the CLI."""

import json

import numpy as np
import pytest

from npusim.cli import main
from npusim.errors import ConfigError
from npusim.mapping.spec import spec_from_flags
from npusim.serving.itercache import EXACT, Buckets, corners, grid_corners, measure, parse_buckets
from npusim.serving.requests import synthetic_requests
from npusim.serving.scheduler import SchedulerConfig
from npusim.serving.simulate import ServingConfig, ServingSimulator, simulate_serving
from npusim.sim import Simulator
from npusim.sim.program import submit_materialized

SCHED = SchedulerConfig(policy="fusion", budget=256, chunk_tokens=64, max_batch=8)


def _spec(stages):
    return spec_from_flags(tp=4, stages=stages, layout="ring").model_copy(update={"data_parallel": 1})


def _run(arch, cache, stages=2, n=10, rate=200.0, seed=3):
    reqs = synthetic_requests(n, rate, input_len=(16, 600), output_len=(2, 10), seed=seed)
    cfg = ServingConfig(model="qwen3-0.6b", layers=2, debug=True, scheduler=SCHED, iteration_cache=cache)
    return simulate_serving(arch, _spec(stages), reqs, cfg)


def _times(run):
    return [(r.first_scheduled_s, tuple(r.token_times_s), r.finish_s) for r in run.records]


def test_buckets_parse_and_validate():
    assert parse_buckets("exact") == EXACT and EXACT.exact
    b = parse_buckets("kv=1024, chunk=64")
    assert (b.kv, b.batch, b.chunk) == (1024, 8, 64) and not b.exact
    for bad in ("kv=100", "kv=0", "chunk=20", "batch=0", "tokens=5", "kv=abc"):
        with pytest.raises(ConfigError):
            parse_buckets(bad)


def test_corners_bracket_the_shape():
    groups = ((1, 48, 512, True), (16, 1, 768, False), (3, 1, 1280, False))  # compiled shapes: KV in 256s
    lo, hi, t = corners(groups, EXACT)  # exact: the key is the shape itself
    assert lo == hi == groups and t == 1.0
    lo, hi, t = corners(groups, Buckets(kv=1024, batch=8, chunk=64))
    assert [g[1] for g in hi] == [64, 1, 1]  # the chunk padded to 64 tokens, its prefix kept
    assert hi[0][2] == 1024 and lo[0][2] == 256 and [g[2] for g in hi[1:]] == [1024, 2048]
    assert [g[2] for g in lo[1:]] == [256, 1024]
    assert 0 < t < 1
    assert all(a[0] == b[0] for a, b in zip(lo, hi))


def test_grid_corners_interpolate_each_group_on_its_own_axis():
    """Multilinear weights: they sum to 1, every corner sits on bucket edges, and the weighted
    corners give back each group's own KV length (a chunk and a decode at different places in
    their buckets keep their places)."""
    groups = ((1, 512, 2560, True), (8, 1, 3328, False), (1, 1, 4096, False))
    assert grid_corners(groups, EXACT) == [(groups, 1.0)]
    cell = grid_corners(groups, Buckets(kv=2048))
    assert len(cell) == 4  # the third group sits on an edge: one axis fewer
    assert sum(w for _, w in cell) == pytest.approx(1.0)
    assert all(g[2] % 2048 == 0 or g[2] == max(g[1], 256) for c, _ in cell for g in c)
    for i, (_, _, kv, _) in enumerate(groups):
        assert sum(w * c[i][2] for c, w in cell) == pytest.approx(kv)


def test_combined_stage_costs_keep_the_weighted_totals():
    """A combination of stage costs has the weighted mean duration, wave, summed alone and busy
    cycles and bytes, laid out over the lanes as its heaviest corner's."""
    from npusim.serving.stagecost import StageCost

    def cost(scale, alone):
        alone = np.asarray(alone, dtype=np.int64)
        return StageCost(duration=int(alone.sum()), alone=alone, loaded=alone * 2 * scale // scale,
                         unit_queue=np.arange(3), unit_lane=np.arange(3), unit_busy=alone // 2,
                         hbm_bytes=1000 * scale)

    a, b = cost(1, [100, 300, 200]), cost(2, [300, 300, 600])
    c = StageCost.combine([(a, 0.25), (b, 0.75)])
    assert c.duration == pytest.approx(0.25 * a.duration + 0.75 * b.duration, abs=1)
    assert c.alone.sum() == pytest.approx(0.25 * a.alone.sum() + 0.75 * b.alone.sum(), abs=3)
    assert c.wave == pytest.approx(0.25 * a.wave + 0.75 * b.wave, abs=1)
    assert c.hbm_bytes == 1750
    assert np.allclose(c.alone / c.alone.sum(), b.alone / b.alone.sum(), atol=1e-2)  # b's layout
    single = StageCost.combine([(a, 1.0)])
    assert single.duration == a.duration and (single.alone == a.alone).all() and single.wave == a.wave


def test_skeleton_replays_the_iteration_exactly_when_alone(arch64):
    """Alone on an idle chip the replayed skeleton ends when the simulated iteration did (within
    0.5%: a segment's hold does not wait for the tasks inside it; every DMA replays as itself, its
    memory streams crossing the mesh), with the same HBM bytes and fewer tasks."""
    sim = ServingSimulator(arch64, _spec(2), ServingConfig(model="qwen3-0.6b", layers=2, iteration_cache=EXACT))
    inst = sim.instances[0]
    for groups, sampled, placement in (([(1, 1, 512, False)], 1, 0.0), ([(1, 64, 256, True), (4, 1, 768, False)], 5, 0.0),
                                       ([(8, 1, 1024, False)], 8, 1.0)):
        comp = inst._compile(groups, sampled, placement)
        cost = measure(arch64, "analytical", "path", comp.arrays, comp.kv_reads, placement)
        arrays, last = cost.tasks(placement)
        assert len(arrays[0]) < cost.tasks_simulated
        replay = Simulator(arch64, memory_mode="analytical", noc_mode="path")
        ids = submit_materialized(replay, arrays)
        replay.run()
        assert replay.task_times()[1][ids[last]] == pytest.approx(cost.duration, rel=5e-3)
        dma = arrays[0] == 1
        assert arrays[2][dma, 0].sum() == cost.hbm_bytes == comp.arrays[2][comp.arrays[0] == 1, 0].sum()


def test_exact_buckets_reproduce_the_uncached_run_when_iterations_run_alone(arch64):
    """One pipeline stage and sparse arrivals: every iteration runs alone, so the cache with exact
    buckets gives the uncached run's request times, to the skeleton's replay error (< 0.5%)."""
    off = _run(arch64, None, stages=1, n=4, rate=5.0)
    on = _run(arch64, EXACT, stages=1, n=4, rate=5.0)
    assert on.summary["iteration_cache"]["hits"] > on.summary["iteration_cache"]["misses"] > 0
    for a, b in zip(_times(on), _times(off)):
        assert a[0] == b[0]  # the same schedule
        assert np.allclose(a[1], b[1], rtol=5e-3) and a[2] == pytest.approx(b[2], rel=5e-3)
    assert on.summary["iterations"] == off.summary["iterations"]


def test_cache_is_deterministic_and_keeps_serving_semantics(arch64):
    a, b = _run(arch64, Buckets(kv=1024)), _run(arch64, Buckets(kv=1024))
    assert _times(a) == _times(b) and a.summary["iteration_cache"] == b.summary["iteration_cache"]
    off = _run(arch64, None)
    s, t = a.summary, off.summary
    # KV management, scheduling and metrics run as without the cache: every request completes
    assert s["requests_completed"] == t["requests_completed"] == len(a.records)
    for rec in a.records:
        assert len(rec.token_times_s) == rec.output_len
    assert s["kv_manager"]["freed"] == t["kv_manager"]["freed"]
    ic = s["iteration_cache"]
    assert ic["enabled"] and ic["hits"] + ic["misses"] == s["iterations"] and ic["interpolated"] > 0
    assert t["iteration_cache"] == {"enabled": False}
    # and the chip timing stays close to the simulated one on this small case
    assert s["throughput_tokens_per_s"] == pytest.approx(t["throughput_tokens_per_s"], rel=0.1)
    # busy counters: holds count only their busy cycles, so utilisation stays a fraction
    util = a.series["utilization"].to_arrays()[1]
    assert np.all(util >= 0) and np.all(util <= 1 + 1e-9)


def test_interpolation_is_bounded_by_its_corners(arch64):
    """An iteration between two KV buckets replays no faster than its lower corner and no slower
    than its upper one."""
    sim = ServingSimulator(arch64, _spec(2), ServingConfig(model="qwen3-0.6b", layers=2,
                                                           iteration_cache=Buckets(kv=2048),
                                                           iteration_replay="skeleton"))
    cache = sim.instances[0].costs

    def replayed(groups):
        arrays, last = cache.tasks(groups, sum(n for n, q, _, _ in groups), 0.0, 0.0)
        eng = Simulator(arch64, memory_mode="analytical", noc_mode="path")
        ids = submit_materialized(eng, arrays)
        eng.run()
        return eng.task_times()[1][ids[last]]

    mid = replayed(((8, 1, 1280, False),))
    low, high = replayed(((8, 1, 256, False),)), replayed(((8, 1, 2048, False),))
    lo_shape, hi_shape, _ = corners(((8, 1, 1280, False),), cache.buckets)
    assert cache.shapes[(hi_shape, 8, 0.0)].duration == pytest.approx(high, rel=5e-3)
    assert low <= mid <= high and cache.shapes[(lo_shape, 8, 0.0)].duration <= high


@pytest.mark.slow  # several seconds warm (session 48): left out of the fast suite, run by CI's slow pass
def test_cli_flag(tmp_path, capsys):
    args = ["run", "--model", "qwen3-0.6b", "--layers", "2", "--tp", "4", "--stages", "2", "--rate", "100",
            "--requests", "4", "--no-progress", "--json"]
    assert main(args + ["--iteration-cache", "on", "--iteration-cache-buckets", "kv=512"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["iteration_cache"]["enabled"] and s["iteration_cache"]["buckets"]["kv"] == 512
    assert main(args + ["--iteration-cache", "off"]) == 0
    assert json.loads(capsys.readouterr().out)["iteration_cache"] == {"enabled": False, "requested": "off"}
    # the default, auto: on for one instance on the chip, off for PD disaggregation (instances share it)
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["iteration_cache"]["enabled"]
    disagg = args + ["--schedule", "disagg", "--pd-stages", "1:1"]
    assert main(disagg) == 0
    assert json.loads(capsys.readouterr().out)["iteration_cache"] == {"enabled": False, "requested": "auto"}
    assert main(disagg + ["--iteration-cache-buckets", "kv=512"]) == 2  # auto turned it off
    assert main(args + ["--iteration-cache", "off", "--iteration-cache-buckets", "kv=512"]) == 2  # needs it on
    assert main(args + ["--iteration-cache", "off", "--iteration-cache-dir", str(tmp_path)]) == 2  # likewise
    assert main(args + ["--iteration-cache", "on", "--iteration-cache-buckets", "kv=300"]) == 2
    assert main(args + ["--iteration-cache", "maybe"]) == 2


def test_shapes_kept_on_disk_are_reused(arch64, tmp_path):
    reqs = synthetic_requests(4, 200.0, input_len=(16, 300), output_len=(2, 6), seed=1)

    def run():
        cfg = ServingConfig(model="qwen3-0.6b", layers=2, scheduler=SCHED, iteration_cache=EXACT,
                            iteration_cache_dir=tmp_path)
        return simulate_serving(arch64, _spec(2), reqs, cfg)

    first = run()
    stored = list(tmp_path.rglob("*.npz"))
    assert first.summary["iteration_cache"]["shapes_simulated"] == len(stored) > 0
    second = run()
    ic = second.summary["iteration_cache"]
    assert ic["shapes_simulated"] == 0 and ic["shapes_from_disk"] == len(stored)
    assert _times(second) == _times(first)
    stored[0].write_bytes(b"not an npz")  # a corrupt file is measured again
    third = run()
    assert third.summary["iteration_cache"]["shapes_simulated"] == 1 and _times(third) == _times(first)


# -- the stage replay (the default replay) ---------------------------------------------------------

def _stage_cost(arch, stages=4, groups=((4, 1, 512, False),), sampled=4):
    sim = ServingSimulator(arch, _spec(stages), ServingConfig(model="qwen3-0.6b", layers=4, iteration_cache=EXACT))
    inst = sim.instances[0]
    return inst, inst.costs.stage_cost(groups, sampled, 0.0)


def _replay(arch, cost, lanes, ks):
    """Replay ``cost`` once per entry of ``ks`` (its in-flight count), back to back on a fresh chip;
    each replay's end."""
    eng = Simulator(arch, memory_mode="analytical", noc_mode="path")
    ends = []
    for k in ks:
        arrays, last = cost.tasks(lanes, k)
        ends.append(submit_materialized(eng, arrays)[last])
    eng.run()
    return eng.task_times()[1][ends]


def test_stage_replay_alone_ends_when_the_iteration_did(arch64):
    """One iteration in flight: each lane holds for what it added to the iteration alone, so the
    replay ends exactly when the simulated iteration did; the lanes are the mapping's stages."""
    inst, cost = _stage_cost(arch64)
    assert len(inst.lanes.prev) == 4 and inst.lanes.prev == (-1, 0, 1, 2) and inst.lanes.depth == 4
    assert cost.alone.sum() == cost.duration
    assert _replay(arch64, cost, inst.lanes, [1])[0] == cost.duration
    # every stage competing slows each lane, never below what it took alone
    assert np.all(cost.loaded >= 1) and cost.loaded.max() > cost.alone.max()


def test_stage_replay_full_pipeline_completes_one_iteration_per_wave(arch64):
    """A full pipeline of one shape: each lane holds min(loaded, wave) = its loaded span, so the
    iterations complete one per wave (the slowest lane's loaded span) once the pipeline is full."""
    inst, cost = _stage_cost(arch64)
    depth = inst.lanes.depth
    holds = cost.holds(depth, depth)
    assert np.array_equal(holds, np.maximum(cost.alone, cost.loaded))
    ends = _replay(arch64, cost, inst.lanes, [depth] * (3 * depth))
    assert np.all(np.diff(ends[depth:]) == holds.max())
    # between: the k/depth share of the wave, monotone in k
    prev = cost.holds(1, depth)
    assert np.array_equal(prev, cost.alone)
    for k in range(2, depth + 1):
        now = cost.holds(k, depth)
        assert np.all(now >= prev)
        prev = now


def test_stage_replay_keeps_bytes_and_busy_fractions(arch64):
    """Cached iterations move the HBM bytes the simulated ones do (counted, not simulated: the
    same schedule, iterations alone, moves the same bytes); a unit's hold is busy no longer than it
    lasts, so utilisation stays a fraction."""
    off, on = _run(arch64, None, stages=1, n=4, rate=5.0), _run(arch64, EXACT, stages=1, n=4, rate=5.0)
    assert on.summary["iteration_cache"]["replay"] == "stages"
    assert on.summary["iterations"] == off.summary["iterations"]
    assert on.summary["hbm_bytes"] == off.summary["hbm_bytes"] > 0
    util = on.series["utilization"].to_arrays()[1]
    assert np.all(util >= 0) and np.all(util <= 1 + 1e-9) and util.max() > 0


def test_stage_replay_retimes_holds_not_yet_started(arch64):
    """A launch raises the pipeline's fill: the holds of earlier iterations that have not started
    yet take the new in-flight count; the ones running keep theirs."""
    sim = ServingSimulator(arch64, _spec(4), ServingConfig(model="qwen3-0.6b", layers=4, iteration_cache=EXACT))
    inst = sim.instances[0]
    cost = inst.costs.stage_cost(((4, 1, 512, False),), 4, 0.0)
    arrays, last = cost.tasks(inst.lanes, 1)
    ids = submit_materialized(sim.sim, arrays)
    note = sim.sim.add_notify([int(ids[last])])
    inst.inflight.append((note, [], 0.0, 0.0))
    inst.holds.add(note, ids[cost.unit_rows()], cost)
    sim.sim.run(until=1)  # the first lane starts
    for _ in range(3):
        inst.inflight.append((-1, [], 0.0, 0.0))
    inst.retime()
    tt = sim.sim.engine.tt
    hold_ids = ids[cost.unit_rows()]
    first_lane = cost.unit_lane == 0
    assert np.all(tt.param[hold_ids[first_lane], 0] == cost.holds(1, 4)[0])
    assert np.all(tt.param[hold_ids[~first_lane], 0] == cost.holds(4, 4)[cost.unit_lane[~first_lane]])
    span, busy = cost.unit_params(4, 4)
    assert np.array_equal(tt.param[hold_ids[~first_lane], 1], busy[~first_lane])
    # the iteration ends (in launch order): its holds leave the table
    inst.inflight.popleft()
    inst.retime()
    assert not inst.holds.notes and inst.holds.ids.size == 0


def test_replay_option_is_checked():
    with pytest.raises(ConfigError, match="replay"):
        ServingConfig(iteration_replay="fast")


def test_cache_says_what_it_misses_when_instances_share_the_chip(arch64):
    """PD disaggregation: two instances on one chip. Each instance's cached iterations are timed
    without the other's traffic, and the summary says so (one instance: no such limit)."""
    reqs = synthetic_requests(3, 50.0, input_len=(16, 64), output_len=(2, 4), seed=1)
    cfg = ServingConfig(model="qwen3-0.6b", layers=2, iteration_cache=EXACT,
                        scheduler=SchedulerConfig(policy="continuous"))
    pd = simulate_serving(arch64, _spec(2), reqs, cfg, pd=(42, 21)).summary["iteration_cache"]
    assert len(pd["limits"]) == 1 and "--iteration-cache off" in pd["limits"][0]
    assert _run(arch64, EXACT, n=2).summary["iteration_cache"]["limits"] == []
