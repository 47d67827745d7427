"""Request sources, options and trace files (npusim.serving.requests / traces)."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.errors import ConfigError
from npusim.serving import (PRESETS, Empirical, Fixed, Lognormal, Request, Uniform, as_length, cap_lengths,
                            load_trace, parse_csv, parse_length, parse_mooncake, renumber, scale_arrivals,
                            synthetic_requests, take_first, time_window, write_trace)

ROOT = Path(__file__).resolve().parents[1]
SAMPLE = ROOT / "traces" / "mooncake_sample.jsonl"
SAMPLE_CSV = ROOT / "traces" / "sample.csv"
SHARED = ROOT.parent / "shared" / "traces" / "mooncake"


def line(**fields) -> str:
    obj = {"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}
    obj.update(fields)
    return json.dumps({k: v for k, v in obj.items() if v is not ...})


# ----------------------------------------------------------------------------- Request


def test_request_validates_and_normalises():
    r = Request(np.int64(3), 1, np.int32(600), 5, [7, 8])
    assert (r.id, r.arrival_s, r.input_len, r.hash_ids) == (3, 1.0, 600, (7, 8))
    assert type(r.id) is int and type(r.arrival_s) is float
    for bad in (dict(input_len=0), dict(output_len=-1), dict(arrival_s=-0.1), dict(arrival_s=math.nan),
                dict(input_len=1.5), dict(output_len=True), dict(id=-1), dict(hash_ids=(1,))):
        kwargs = dict(id=0, arrival_s=0.0, input_len=600, output_len=5) | bad
        with pytest.raises(ConfigError, match="request"):
            Request(**kwargs)


# ----------------------------------------------------------------------------- length specs


def test_parse_length_forms():
    assert parse_length("128") == Fixed(128)
    assert parse_length("64:512") == Uniform(64, 512)
    assert parse_length("lognormal:2000:0.8") == Lognormal(2000, 0.8)
    assert parse_length("lognormal:2000:0.8:8192") == Lognormal(2000, 0.8, max=8192)
    for bad in ("", "abc", "0", "-5", "512:64", "1:2:3", "lognormal:1", "lognormal:x:1", "1.5"):
        with pytest.raises(ConfigError, match="length"):
            parse_length(bad)


def test_as_length_accepts_ints_tuples_and_config_dicts():
    assert as_length(7) == Fixed(7)
    assert as_length((1, 9)) == Uniform(1, 9)
    assert as_length({"dist": "lognormal", "mean": 100, "sigma": 0.5}) == Lognormal(100, 0.5)
    assert as_length({"dist": "empirical", "values": [3, 4]}) == Empirical((3, 4))
    with pytest.raises(ConfigError, match="'dist' must be one of"):
        as_length({"dist": "zipf"})
    with pytest.raises(ConfigError, match="bad fields"):
        as_length({"dist": "fixed", "value": 3, "typo": 1})
    with pytest.raises(ConfigError, match="expected an int"):
        as_length("128")


def test_length_samples_respect_bounds_and_means():
    rng = np.random.default_rng(0)
    u = Uniform(3, 5).sample(rng, 5000)
    assert set(u.tolist()) == {3, 4, 5}
    ln = Lognormal(1000, 0.5).sample(rng, 50_000)
    assert abs(ln.mean() / 1000 - 1) < 0.02 and ln.min() >= 1
    clipped = Lognormal(1000, 2.0, max=1500, min=10).sample(rng, 5000)
    assert clipped.max() == 1500 and clipped.min() == 10
    assert set(Empirical((5, 9)).sample(rng, 100).tolist()) == {5, 9}


# ----------------------------------------------------------------------------- synthetic sources


def test_synthetic_is_deterministic_and_streams_are_independent():
    a = synthetic_requests(300, 5.0, input_len=(10, 100), output_len=Lognormal(50, 1.0), seed=7)
    b = synthetic_requests(300, 5.0, input_len=(10, 100), output_len=Lognormal(50, 1.0), seed=7)
    assert a == b
    assert [r.id for r in a] == list(range(300))
    assert all(x.arrival_s <= y.arrival_s for x, y in zip(a, a[1:]))
    c = synthetic_requests(300, 5.0, input_len=(10, 100), output_len=64, seed=7)
    assert [r.arrival_s for r in c] == [r.arrival_s for r in a]  # other output spec, same arrivals
    assert [r.input_len for r in c] == [r.input_len for r in a]  # ... and same inputs
    assert synthetic_requests(300, 5.0, input_len=10, output_len=10, seed=8) != \
        synthetic_requests(300, 5.0, input_len=10, output_len=10, seed=7)


def test_poisson_rate_matches_request():
    rate = 4.0
    reqs = synthetic_requests(20_000, rate, input_len=1, output_len=1, seed=1, start_s=10.0)
    t = np.array([r.arrival_s for r in reqs])
    assert t[0] > 10.0
    # n / span estimates the rate with relative standard error 1/sqrt(n) = 0.7%
    assert (len(t) - 1) / (t[-1] - t[0]) == pytest.approx(rate, rel=0.03)
    gaps = np.diff(t)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("cv", [0.5, 2.0])
def test_gamma_cv_matches_request(cv):
    reqs = synthetic_requests(20_000, 10.0, arrival="gamma", cv=cv, input_len=1, output_len=1, seed=2)
    gaps = np.diff([0.0] + [r.arrival_s for r in reqs])
    assert gaps.mean() == pytest.approx(0.1, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.1)


def test_infinite_rate_is_one_batch_at_start():
    reqs = synthetic_requests(5, math.inf, input_len=4, output_len=4, start_s=2.5)
    assert [r.arrival_s for r in reqs] == [2.5] * 5


def test_presets_have_the_documented_shape():
    pre = synthetic_requests(20_000, 1.0, preset="prefill-dominated", seed=3)
    dec = synthetic_requests(20_000, 1.0, preset="decode-dominated", seed=3)
    mean = lambda reqs, key: np.mean([getattr(r, key) for r in reqs])  # noqa: E731
    assert mean(pre, "input_len") / mean(pre, "output_len") == pytest.approx(10, rel=0.1)
    assert mean(dec, "output_len") / mean(dec, "input_len") == pytest.approx(5, rel=0.1)
    assert max(r.input_len for r in pre) <= PRESETS["prefill-dominated"].input_len.max
    explicit = synthetic_requests(10, 1.0, preset="decode-dominated", output_len=3)
    assert all(r.output_len == 3 for r in explicit)
    assert all(p.description for p in PRESETS.values())


@pytest.mark.parametrize("kwargs, message", [
    (dict(preset="nope"), "unknown workload preset"),
    (dict(), "needs input_len and output_len"),
    (dict(preset="decode-dominated", cv=2.0), "only to arrival='gamma'"),
    (dict(preset="decode-dominated", arrival="uniform"), "'poisson' or 'gamma'"),
    (dict(preset="decode-dominated", arrival="gamma", cv=0), "must be > 0"),
    (dict(preset="decode-dominated", seed=-1), "seed"),
])
def test_synthetic_argument_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        synthetic_requests(3, 1.0, **kwargs)
    with pytest.raises(ConfigError, match="rate_per_s"):
        synthetic_requests(3, 0.0, preset="decode-dominated")


# ----------------------------------------------------------------------------- options


def reqs_at(*times, input_len=600, output_len=10):
    return [Request(i, t, input_len, output_len, (i, i + 1)) for i, t in enumerate(times)]


def test_take_first_window_scale_keep_ids_and_order():
    reqs = reqs_at(3.0, 1.0, 2.0, 1.0)
    assert [r.id for r in take_first(reqs, 3)] == [1, 3, 2]
    win = time_window(reqs, 1.5, 3.0)
    assert [(r.id, r.arrival_s) for r in win] == [(2, 0.5)]
    assert [r.id for r in time_window(reqs, 1.0)] == [1, 3, 2, 0]
    scaled = scale_arrivals(reqs, 0.5)
    assert [(r.id, r.arrival_s) for r in scaled] == [(1, 0.5), (3, 0.5), (2, 1.0), (0, 1.5)]
    assert [(r.id, r.arrival_s) for r in renumber(reqs)] == [(0, 1.0), (1, 1.0), (2, 2.0), (3, 3.0)]
    with pytest.raises(ConfigError, match="empty"):
        time_window(reqs, 2.0, 1.0)
    with pytest.raises(ConfigError, match="> 0"):
        scale_arrivals(reqs, 0)


def test_cap_lengths_clip_and_drop():
    reqs = [Request(0, 0, 1500, 10, (1, 2, 3)), Request(1, 0, 100, 900, (4,)), Request(2, 0, 100, 10)]
    clipped, n = cap_lengths(reqs, max_input=1024, max_output=512)
    assert n == 2
    assert (clipped[0].input_len, clipped[0].hash_ids) == (1024, (1, 2))
    assert (clipped[1].output_len, clipped[1].hash_ids) == (512, (4,))
    assert clipped[2] == reqs[2]
    dropped, n = cap_lengths(reqs, max_input=1024, max_output=512, policy="drop")
    assert n == 2 and [r.id for r in dropped] == [2]
    assert cap_lengths(reqs) == (reqs, 0)
    with pytest.raises(ConfigError, match="'clip' or 'drop'"):
        cap_lengths(reqs, 10, policy="cut")


# ----------------------------------------------------------------------------- trace files


def test_shipped_mooncake_sample_parses_unchanged():
    reqs = load_trace(SAMPLE)
    raw = [json.loads(x) for x in SAMPLE.read_text().splitlines()]
    assert len(reqs) == len(raw) == 200
    for r, obj in zip(reqs, raw):
        assert r.arrival_s == obj["timestamp"] / 1000
        assert (r.input_len, r.output_len, list(r.hash_ids)) == (obj["input_length"], obj["output_length"],
                                                                  obj["hash_ids"])
    assert (SAMPLE.parent / "NOTICE.md").read_text().count("Apache") >= 1


@pytest.mark.parametrize("name, count", [("conversation_trace.jsonl", 12_031), ("synthetic_trace.jsonl", 3_993)])
def test_full_shared_mooncake_traces_parse(name, count):
    path = SHARED / name
    if not path.exists():
        pytest.skip(f"the full Mooncake trace {name} is not beside this checkout (the team's shared folder, "
                    "which CI has; the repository ships traces/mooncake_sample.jsonl)")
    reqs = load_trace(path)
    assert len(reqs) == count
    assert all(r.hash_ids for r in reqs)


def test_shipped_csv_sample_and_arrival_ms(tmp_path):
    reqs = load_trace(SAMPLE_CSV)
    assert len(reqs) == 10 and reqs[2].input_len == 2048 and reqs[-1].arrival_s == 0.41
    p = tmp_path / "ms.csv"
    p.write_text("output_tokens, input_tokens ,arrival_ms\n5,7,250\n# comment\n6,8,100\n")
    reqs = load_trace(p)
    assert [(r.id, r.arrival_s, r.input_len, r.output_len) for r in reqs] == [(1, 0.1, 8, 6), (0, 0.25, 7, 5)]


def test_non_monotonic_timestamps_are_sorted_stably():
    reqs = parse_mooncake([line(timestamp=5000), line(timestamp=1000), line(timestamp=1000)], "t.jsonl")
    assert [(r.id, r.arrival_s) for r in reqs] == [(1, 1.0), (2, 1.0), (0, 5.0)]


def test_load_trace_first_window_scale(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(line(timestamp=t, hash_ids=...) + "\n" for t in (0, 1000, 2000, 3000, 4000)))
    reqs = load_trace(p, window=(1.0, 4.0), first=2, scale=0.5)
    assert [(r.id, r.arrival_s) for r in reqs] == [(1, 0.0), (2, 0.5)]
    assert len(load_trace(p, window=(2.0, None))) == 3
    with pytest.raises(ConfigError, match=r"selects no requests; the trace's arrivals span 0\.\.4 s"):
        load_trace(p, window=(10, 20))
    with pytest.raises(ConfigError, match="first=0 selects no requests"):
        load_trace(p, first=0)


def test_load_trace_file_level_errors(tmp_path):
    with pytest.raises(ConfigError, match="no such trace file"):
        load_trace(tmp_path / "missing.jsonl")
    (tmp_path / "t.txt").write_text("x")
    with pytest.raises(ConfigError, match="cannot tell the trace format"):
        load_trace(tmp_path / "t.txt")
    (tmp_path / "t.txt").write_text(SAMPLE_CSV.read_text())
    assert len(load_trace(tmp_path / "t.txt", fmt="csv")) == 10
    with pytest.raises(ConfigError, match="trace format must be one of"):
        load_trace(SAMPLE, fmt="parquet")
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(ConfigError, match="holds no requests"):
        load_trace(tmp_path / "empty.jsonl")
    (tmp_path / "bin.jsonl").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_trace(tmp_path / "bin.jsonl")


BAD_JSONL = [
    ("", "empty line"),
    ("   ", "empty line"),
    ("{", "not valid JSON"),
    ("[1, 2]", "expected a JSON object, got list"),
    (line(output_length=-3), "'output_length' must be a positive integer, got -3"),
    (line(input_length=0), "'input_length' must be a positive integer, got 0"),
    (line(input_length=600.0), "'input_length' must be a positive integer, got 600.0"),
    (line(output_length="10"), "'output_length' must be a positive integer, got \"10\""),
    (line(output_length=True), "'output_length' must be a positive integer, got true"),
    (line(timestamp=-1), "'timestamp' must be a number >= 0, got -1"),
    (line(timestamp="0"), "'timestamp' must be a number >= 0"),
    ('{"timestamp": NaN, "input_length": 1, "output_length": 1}', "NaN is not a valid number"),
    (line(timestamp=...), "missing key 'timestamp'"),
    (line(output_length=...), "missing key 'output_length'"),
    (line(extra=1), "unknown key 'extra'"),
    ('{"timestamp": 0, "timestamp": 1, "input_length": 1, "output_length": 1}', "key 'timestamp' appears twice"),
    (line(hash_ids=[1]), "'hash_ids' has 1 entries but input_length 600 needs 2"),
    (line(hash_ids=[1, -2]), "'hash_ids' must be a list of integers >= 0"),
    (line(hash_ids="1,2"), "'hash_ids' must be a list of integers >= 0"),
]


@pytest.mark.parametrize("bad, message", BAD_JSONL)
def test_malformed_jsonl_line_names_file_line_and_problem(tmp_path, bad, message):
    p = tmp_path / "x.jsonl"
    p.write_text(f"{line()}\n{line(timestamp=5)}\n{bad}\n{line()}\n")
    with pytest.raises(ConfigError) as err:
        load_trace(p)
    assert str(err.value).startswith(f"{p} line 3: ")
    assert message in str(err.value)


def test_trailing_blank_line_is_reported(tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(f"{line()}\n\n")
    with pytest.raises(ConfigError, match=r"line 2: empty line"):
        load_trace(p)
    p.write_text(f"{line()}\r\n{line()}\r\n")  # CRLF files are fine
    assert len(load_trace(p)) == 2


BAD_CSV = [
    ("arrival_s,input_tokens\n0,1\n", 1, "missing column 'output_tokens'"),
    ("arrival_s,input_tokens,output_tokens,user\n", 1, "unknown column 'user'"),
    ("arrival_s,arrival_ms,input_tokens,output_tokens\n", 1, "both arrival_s and arrival_ms"),
    ("input_tokens,output_tokens\n", 1, "no arrival column"),
    ("arrival_s,input_tokens,input_tokens,output_tokens\n", 1, "column 'input_tokens' appears twice"),
    ("arrival_s,input_tokens,output_tokens\n0,1,1\n0,1\n", 3, "expected 3 fields"),
    ("arrival_s,input_tokens,output_tokens\n0,1,1\n\n", 3, "empty line"),
    ("arrival_s,input_tokens,output_tokens\n0,1.5,1\n", 2, "'input_tokens' must be a positive integer, got '1.5'"),
    ("arrival_s,input_tokens,output_tokens\n0,1,-3\n", 2, "'output_tokens' must be a positive integer, got -3"),
    ("arrival_s,input_tokens,output_tokens\n-1,1,1\n", 2, "'arrival_s' must be a number >= 0, got '-1'"),
    ("arrival_s,input_tokens,output_tokens\nnan,1,1\n", 2, "'arrival_s' must be a number >= 0"),
    ("# only a comment\n", None, "no header row"),
]


@pytest.mark.parametrize("text, lineno, message", BAD_CSV)
def test_malformed_csv_names_file_line_and_problem(tmp_path, text, lineno, message):
    p = tmp_path / "y.csv"
    p.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_trace(p)
    where = f"{p} line {lineno}: " if lineno else f"{p}: "
    assert str(err.value).startswith(where) and message in str(err.value)


# ----------------------------------------------------------------------------- property tests

VALID = st.fixed_dictionaries({
    "timestamp": st.integers(0, 10**9) | st.floats(0, 1e9, allow_nan=False),
    "input_length": st.integers(1, 5000),
    "output_length": st.integers(1, 5000),
})
BAD_VALUES = st.sampled_from([None, -1, 0, 1.5, "7", True, [], {}, -1e-9])


@settings(max_examples=examples(60), deadline=None)
@given(good=st.lists(VALID, min_size=1, max_size=6), bad_at=st.integers(0, 5),
       key=st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids"]), value=BAD_VALUES)
def test_any_single_bad_field_is_reported_at_its_line(good, bad_at, key, value):
    lines = [json.dumps(obj) for obj in good]
    bad_at = min(bad_at, len(lines) - 1)
    broken = dict(good[bad_at])
    broken[key] = value
    if key == "timestamp" and value in (0, 1.5):
        return  # those are valid timestamps
    lines[bad_at] = json.dumps(broken)
    with pytest.raises(ConfigError, match=rf"^t\.jsonl line {bad_at + 1}: .*'{key}'"):
        parse_mooncake(lines, "t.jsonl")


@settings(max_examples=examples(150), deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_lines_parse_or_raise_config_error(text):
    for parser in (parse_mooncake, parse_csv):
        try:
            parser([text], "f")
        except ConfigError as exc:
            assert str(exc).startswith("f")


@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(reqs=st.lists(st.builds(lambda t, i, o: (t, i, o), st.floats(0, 1e5, allow_nan=False),
                               st.integers(1, 3000), st.integers(1, 3000)), max_size=8),
       fmt=st.sampled_from([".jsonl", ".csv"]))
def test_write_then_load_round_trips(tmp_path, reqs, fmt):
    original = [Request(i, t, n_in, n_out) for i, (t, n_in, n_out) in enumerate(reqs)]
    path = tmp_path / f"round{fmt}"
    write_trace(path, original)
    if not original:
        return
    back = load_trace(path)
    assert [(r.input_len, r.output_len) for r in back] == [(r.input_len, r.output_len) for r in renumber(original)]
    assert np.allclose([r.arrival_s for r in back], sorted(r.arrival_s for r in original), rtol=1e-12, atol=1e-9)


def test_write_trace_keeps_hash_ids(tmp_path):
    reqs = load_trace(SAMPLE, first=5)
    write_trace(tmp_path / "five.jsonl", reqs)
    assert load_trace(tmp_path / "five.jsonl") == reqs
    assert (tmp_path / "five.jsonl").read_text().splitlines() == SAMPLE.read_text().splitlines()[:5]
