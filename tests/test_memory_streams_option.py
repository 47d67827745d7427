"""The path NoC's memory stream model as an option: ``Simulator(memory_streams=...)`` and ``npusim run
--memory-streams``, with the flows' speed variants ``flow@Q~S`` (a head-of-line pass held ``Q`` cycles, a
sharing kept ``S`` cycles, :func:`npusim.sim.mempath.parse_streams`)."""

from __future__ import annotations

import json

import pytest

from npusim.arch import load_arch
from npusim.cli import main
from npusim.errors import ConfigError
from npusim.hw.noc import memflow
from npusim.hw.noc.memflow import P_HOL_PERIOD, P_SHARE_PERIOD
from npusim.sim import Simulator
from npusim.sim.mempath import parse_streams


@pytest.mark.parametrize("spec, parsed", [
    ("reserve", ("reserve", None, None)), ("hop", ("hop", None, None)), ("flow", ("flow", None, None)),
    ("flow@4096", ("flow", 4096, None)), ("flow~64", ("flow", None, 64)), ("flow@16384~256", ("flow", 16384, 256)),
    ("flow@0~0", ("flow", 0, 0)),
])
def test_stream_specs_parse(spec, parsed):
    assert parse_streams(spec) == parsed


@pytest.mark.parametrize("spec", ["flows", "reserve@8", "hop~4", "flow@", "flow~", "flow@-1", "flow@1e3", "flow~4@8", ""])
def test_a_bad_stream_spec_says_what_was_expected(spec):
    with pytest.raises(ValueError, match="flow@CYCLES"):
        parse_streams(spec)
    with pytest.raises(ConfigError, match="expected one of flow, reserve, hop"):
        Simulator(load_arch("npusim-64c"), memory_mode="analytical", noc_mode="path", memory_streams=spec)


def test_a_variant_sets_the_flows_periods_and_the_plain_flows_keep_the_modules():
    arch = load_arch("npusim-64c")
    fl = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow@16384~256").mempath.fl
    assert (int(fl.prm[P_HOL_PERIOD]), int(fl.prm[P_SHARE_PERIOD])) == (16384, 256)
    fl = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow~64").mempath.fl
    assert (int(fl.prm[P_HOL_PERIOD]), int(fl.prm[P_SHARE_PERIOD])) == (memflow.HOL_PERIOD, 64)
    fl = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow").mempath.fl
    assert (int(fl.prm[P_HOL_PERIOD]), int(fl.prm[P_SHARE_PERIOD])) == (memflow.HOL_PERIOD, memflow.SHARE_PERIOD)


def _forward(capsys, *extra):
    code = main(["run", "--forward", "--layers", "2", "--batch", "4", "--seq", "256", "--memory", "analytical",
                 "--json", "--no-progress", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def test_run_takes_memory_streams_at_the_path_noc_and_moves_the_same_bytes(capsys):
    """Each stream model carries the same HBM bytes over the mesh (only their timing differs), and the summary
    says which model ran."""
    runs = {s: _forward(capsys, "--fidelity", "path", "--memory-streams", s) for s in ("reserve", "flow@4096~64")}
    assert runs["reserve"]["memory_streams"] == "reserve" and runs["flow@4096~64"]["memory_streams"] == "flow@4096~64"
    assert runs["flow@4096~64"]["hbm_bytes_over_noc"] == runs["reserve"]["hbm_bytes_over_noc"] > 0
    assert runs["flow@4096~64"]["hbm_bytes"] == runs["reserve"]["hbm_bytes"]
    assert _forward(capsys)["memory_streams"] == "flow"  # the default of a forward pass (session 64)


def test_the_defaults_are_the_flows_exact_for_a_chip_run_and_held_for_serving():
    """The flows are the path NoC's default (closer to flit than the old streams on every memory workload); the serving
    loop holds their passes (``SERVING_STREAMS``), a parseable variant of them, and a serving config says so."""
    from npusim.serving.simulate import ServingConfig
    from npusim.sim.mempath import DEFAULT_STREAMS, SERVING_STREAMS, parse_streams

    assert parse_streams(DEFAULT_STREAMS) == ("flow", None, None)
    assert parse_streams(SERVING_STREAMS) == ("flow", 16384, 256)
    assert ServingConfig().memory_streams == SERVING_STREAMS
    arch = load_arch("npusim-64c")
    assert Simulator(arch, memory_mode="analytical").memory_streams == DEFAULT_STREAMS


@pytest.mark.parametrize("argv, words", [
    (["--fidelity", "analytical", "--memory-streams", "flow"], ["--memory-streams flow", "--fidelity analytical"]),
    (["--memory-streams", "flow@x"], ["--memory-streams flow@x", "flow@CYCLES"]),
    (["--system", "cloudmatrix384", "--memory-streams", "flow"], ["--memory-streams flow", "--system"]),
])
def test_memory_streams_where_it_is_not_read_is_a_one_line_error(capsys, argv, words):
    code = main(["run", "--forward", "--no-progress", *argv])
    _, err = capsys.readouterr()
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_without_the_flag_a_run_keeps_the_simulators_default_which_validation_scripts_set(capsys):
    """``validation/memory_flows_vs_flit.py`` and ``fidelity_ladder.py`` compare stream models through the CLI's
    runs by setting the simulators' default (``stream_model``): a run without ``--memory-streams`` must not
    pass one of its own."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "validation"))
    try:
        from memory_flows_vs_flit import stream_model
    finally:
        sys.path.pop(0)
    with stream_model("reserve"):
        run = _forward(capsys, "--fidelity", "path")
    assert run["memory_streams"] == "reserve"
