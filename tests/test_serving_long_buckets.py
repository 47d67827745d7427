"""The iteration cache's long buckets: chunk lengths and prefixes interpolated, the decode groups on
one shared KV axis, sampled rows bucketed, the all-in-SRAM blend on its own cell; the pipelined
measurement; the memo of interpolated ends; ``auto`` choosing them for long prompts."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.cli import main
from npusim.errors import ConfigError
from npusim.mapping.spec import spec_from_flags
from npusim.serving import itercache
from npusim.serving.itercache import (EXACT, Buckets, _chunk_edges, grid_corners, long_context, parse_buckets,
                                      preset_name)
from npusim.serving.requests import Request
from npusim.serving.scheduler import SchedulerConfig
from npusim.serving.simulate import ServingConfig, ServingSimulator, simulate_serving

LONG = long_context(40960)


def _spec(stages):
    return spec_from_flags(tp=4, stages=stages, layout="ring").model_copy(update={"data_parallel": 1})


def test_long_preset_parses_and_names_itself():
    assert parse_buckets("long", 40960) == LONG and preset_name(LONG, 40960) == "long"
    assert preset_name(EXACT, 40960) == "exact" and preset_name(Buckets(kv=1024), 40960) == "custom"
    assert LONG.stage_only and not LONG.exact and LONG.blend is not None
    assert LONG.blend.blend is None and LONG.blend.kv_edges == "linear"
    custom = parse_buckets("kv=4096,chunk_edges=interp,decode_kv=shared,sampled=8,chunk_ratio=4,blend_kv=8192")
    assert (custom.chunk_ratio, custom.sampled, custom.blend_kv) == (4, 8, 8192)
    with pytest.raises(ConfigError, match="context"):
        parse_buckets("long")  # the model gives no context to span
    for bad in ("chunk_edges=wide", "decode_kv=one", "sampled=0", "chunk_ratio=1", "prefix_min=0",
                "prefix_min=768", "mixed_kv=300", "blend_kv=-256"):
        with pytest.raises(ConfigError):
            parse_buckets(bad)


@given(st.integers(1, 160).map(lambda k: 16 * k), st.sampled_from([2, 4, 32]))
def test_chunk_edges_bracket_the_chunk(q, ratio):
    lo, hi = _chunk_edges(q, ratio)
    assert 16 <= lo <= q <= hi and lo % 16 == 0 and hi % 16 == 0
    assert (lo == hi) == (q in (lo, hi))
    if q >= 512:
        assert hi - lo in (0, 512)  # multiples of 512 from it


@settings(max_examples=60)
@given(st.integers(0, 150).map(lambda k: 256 * k), st.sampled_from([16, 48, 208, 272, 512]),
       st.lists(st.tuples(st.sampled_from([1, 2, 4, 8]), st.integers(1, 160).map(lambda k: 256 * k)),
                min_size=0, max_size=2))
def test_long_cells_reproduce_what_is_linear_in_each_axis(prefix, q, decodes):
    """The corners' weights sum to 1 and give back the chunk's length, its cached prefix and the
    decode groups' KV tokens (each axis is interpolated linearly): so a cost linear in each of
    them — and attention's, the product of a chunk's length and prefix — comes out exact."""
    kv = -(-(prefix + q) // 256) * 256
    groups = ((1, q, kv, True),) + tuple((n, 1, k, False) for n, k in decodes)
    cell = grid_corners(groups, LONG)
    assert sum(w for _, w in cell) == pytest.approx(1.0)
    assert all(w > 0 for _, w in cell)
    assert sum(w * c[0][1] for c, w in cell) == pytest.approx(q)
    # corner KV lengths round up to 256 tokens as compiled shapes do: the prefix comes back to within that
    assert sum(w * (c[0][2] - c[0][1]) for c, w in cell) == pytest.approx(kv - q, abs=256)
    if decodes:  # every decode group on one axis: the KV tokens of the real groups are kept
        assert all(len(c) == len(groups) for c, _ in cell)
        tokens = sum(n * k for n, k in decodes)
        assert sum(w * sum(g[0] * g[2] for g in c[1:]) for c, w in cell) == pytest.approx(tokens)
        assert all(len({g[2] for g in c[1:]}) == 1 for c, _ in cell)  # all at the same edge


def _request(rid, prompt, output, at=0.0):
    return Request(id=rid, arrival_s=at, input_len=prompt, output_len=output)


@pytest.fixture(scope="module")
def long_runs(arch64):
    """A long prompt beside short ones, with the long buckets: the run as it is, and without the
    memo of interpolated ends."""
    reqs = [_request(0, 4500, 6), _request(1, 300, 12, 0.001), _request(2, 900, 8, 0.002)]
    sched = SchedulerConfig(policy="fusion", budget=1024, chunk_tokens=512, max_batch=8)
    cfg = ServingConfig(model="qwen3-0.6b", layers=2, scheduler=sched, iteration_cache=LONG)
    first = simulate_serving(arch64, _spec(2), reqs, cfg)
    kept = itercache.ENDS_KEPT
    itercache.ENDS_KEPT = 0  # nothing kept: every iteration interpolated anew
    try:
        cleared = simulate_serving(arch64, _spec(2), reqs, cfg)
    finally:
        itercache.ENDS_KEPT = kept
    return first, cleared


def test_memo_of_interpolated_ends_changes_nothing(long_runs):
    first, cleared = long_runs
    times = [[(r.first_scheduled_s, tuple(r.token_times_s), r.finish_s) for r in run.records] for run in long_runs]
    assert times[0] == times[1]
    assert first.summary["iteration_cache"] == cleared.summary["iteration_cache"]
    ic = first.summary["iteration_cache"]
    assert ic["interpolated"] > 0 and ic["hits"] > ic["misses"] > 0


def test_pipelined_measurement_equals_one_by_one(arch64):
    sim = ServingSimulator(arch64, _spec(2), ServingConfig(model="qwen3-0.6b", layers=2, iteration_cache=LONG))
    inst = sim.instances[0]
    shapes = [([(1, 512, 4608, True), (2, 1, 1024, False)], 8, 1.0), ([(1, 64, 256, True)], 1, 0.0),
              ([(4, 1, 2048, False)], 4, 1.0), ([(1, 512, 512, True), (1, 1, 768, False)], 1, 0.0)]
    many = inst._measure_many(shapes)
    for shape, cost in zip(shapes, many):
        one = inst._measure(*shape)
        assert cost.duration == one.duration and cost.hbm_bytes == one.hbm_bytes
        for name in ("alone", "loaded", "unit_queue", "unit_lane", "unit_busy"):
            assert np.array_equal(getattr(cost, name), getattr(one, name)), name


def test_skeleton_replay_refuses_the_long_buckets():
    with pytest.raises(ConfigError, match="stage replay"):
        ServingConfig(model="qwen3-0.6b", iteration_cache=LONG, iteration_replay="skeleton")


def test_auto_picks_long_buckets_for_long_prompts(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    args = ["run", "--model", "qwen3-0.6b", "--layers", "2", "--tp", "4", "--stages", "2", "--trace", str(trace),
            "--no-progress", "--json"]
    for prompt, preset in ((600, "exact"), (5000, "long")):
        trace.write_text(json.dumps({"timestamp": 0, "input_length": prompt, "output_length": 2}) + "\n")
        assert main(args) == 0
        ic = json.loads(capsys.readouterr().out)["iteration_cache"]
        assert ic["enabled"] and ic["preset"] == preset and ic["requested"] == "auto"
    assert main(args + ["--iteration-cache-buckets", "exact"]) == 0  # the flag wins
    assert json.loads(capsys.readouterr().out)["iteration_cache"]["preset"] == "exact"
    assert main(args + ["--iteration-cache-buckets", "long", "--iteration-cache-replay", "skeleton"]) == 2
