"""Fuzz the input parsers (arch files, mapping specs, request traces): every input either
loads or raises the project's own error (``NpusimError``), never another exception
(issue 13: 2**70 integers, 1e308 floats, infinities and huge queues once ended in
OverflowError or a 954 GiB allocation). A loaded arch must also build a simulator."""

import math

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyp import examples
from mutation import key_paths, loads_or_raises_our_error, mutated
from npusim.arch.load import PRESET_DIR
from npusim.arch.schema import MAX_CORES, Arch
from npusim.config import validate
from npusim.errors import NpusimError
from npusim.hw.noc.routing import DENSE_ROUTING_MAX_ROUTERS
from npusim.mapping.spec import MAPPER_DIR, load_mapping
from npusim.serving.traces import load_trace

BASE_ARCH = yaml.safe_load((PRESET_DIR / "npusim-64c.yaml").read_text())

VALUES = st.one_of(
    st.integers(-2, 3), st.integers(min_value=-(2**80), max_value=2**80), st.sampled_from([2**31, 2**63, 2**70]),
    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([1e308, -1e308, 1e9, 0.5]),
    st.text(max_size=6), st.none(), st.booleans(), st.lists(st.integers(-3, 70), max_size=4),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)


ARCH_PATHS = sorted(key_paths(BASE_ARCH), key=str)


def test_grid_limit_matches_the_routing_limit():
    assert MAX_CORES == DENSE_ROUTING_MAX_ROUTERS


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(ARCH_PATHS), value=VALUES)
def test_arch_single_key_mutations_load_or_raise_our_error(path, value):
    try:
        arch = validate(Arch, mutated(BASE_ARCH, path, value), "fuzz.yaml")
    except NpusimError:
        return
    for x in _numbers(arch.model_dump()):
        assert math.isfinite(x) and abs(x) < 2**53, (path, value)
    from npusim.sim import Simulator

    try:
        Simulator(arch, memory_mode="tlm", noc_mode="path")
    except NpusimError:
        pass


def _numbers(node):
    if isinstance(node, dict):
        for v in node.values():
            yield from _numbers(v)
    elif isinstance(node, list):
        for v in node:
            yield from _numbers(v)
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield node


MAPPING_FILES = sorted(MAPPER_DIR.glob("*.yaml"))


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=st.sampled_from(MAPPING_FILES), pick=st.integers(0, 10**6), value=VALUES, tmp=st.integers(0, 10**9))
def test_mapping_single_key_mutations_load_or_raise_our_error(tmp_path_factory, spec, pick, value, tmp):
    data = yaml.safe_load(spec.read_text())
    paths = sorted(key_paths(data), key=str)
    path = paths[pick % len(paths)]
    loads_or_raises_our_error(load_mapping, tmp_path_factory.mktemp("map") / spec.name, data, path, value)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(st.one_of(
    st.text(max_size=40),
    st.builds(lambda t, i, o: f"{t},{i},{o}", st.one_of(st.floats(), st.integers()), st.integers(-5, 2**70),
              st.integers(-5, 2**70)),
    st.builds(lambda t, i, o: '{"timestamp": %s, "input_length": %s, "output_length": %s}' % (t, i, o),
              st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers(-5, 2**70)),
              st.integers(-5, 2**70), st.one_of(st.integers(-5, 2**70), st.just('"x"'))),
), max_size=6), fmt=st.sampled_from(["csv", "mooncake"]))
def test_trace_parser_loads_or_raises_our_error(tmp_path_factory, lines, fmt):
    path = tmp_path_factory.mktemp("trace") / ("t.csv" if fmt == "csv" else "t.jsonl")
    try:
        path.write_text("\n".join(lines), encoding="utf-8")
    except UnicodeEncodeError:
        return
    try:
        reqs = load_trace(path, fmt)
    except NpusimError:
        return
    for r in reqs:
        assert math.isfinite(r.arrival_s) and r.arrival_s >= 0
