"""npusim sweep / report: sweep files, local pool vs Dask, resuming, failures, the table, plots."""

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.cli import main
from npusim.errors import ConfigError
from npusim.sweep.report import make_report, pareto_front
from npusim.sweep.runner import run_sweep
from npusim.sweep.spec import load_sweep
from npusim.sweep.table import flatten, read_table

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "examples" / "sweeps" / "smoke.yaml"

TINY = """
name: tiny
base:
  arch: npusim-64c
  model: qwen3-4b
  mapping: {extends: tp4-pipeline, pipeline: {stages: 1}}
  workload: {phase: decode, batch: 2, seq: 128}
  run: {layers: 1, memory: analytical}
grid:
  arch.cores.sram.capacity_mb: [8, 32]
  workload.batch: [2, 4]
"""


def write(tmp_path, text, name="s.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def comparable(table):
    """A table's columns without wall time (inside the stored records too)."""
    cols = {k: v for k, v in table.columns.items() if k not in ("wall_s", "record")}
    cols["record"] = [None if r is None else {k: v for k, v in r.items() if k != "wall_s"} for r in table.records()]
    return cols


# --- sweep files -------------------------------------------------------------------------------------------------


def test_grid_zip_random_expand_in_order(tmp_path):
    path = write(tmp_path, TINY + """
zip:
  run.fidelity: [path, analytical]
  workload.seq: [128, 256]
random:
  samples: 3
  seed: 7
  axes:
    arch.hbm.frontend_latency_ns: {low: 5, high: 20, integer: true}
""")
    sweep = load_sweep(path)
    samples = {p.axes["arch.hbm.frontend_latency_ns"] for p in sweep.points}
    assert len(sweep.points) == 2 * 2 * 2 * len(samples) and 1 <= len(samples) <= 3
    assert sweep.axis_names == ["arch.cores.sram.capacity_mb", "workload.batch", "run.fidelity", "workload.seq",
                                "arch.hbm.frontend_latency_ns"]
    first = sweep.points[0]
    assert first.axes["arch.cores.sram.capacity_mb"] == 8 and first.axes["run.fidelity"] == "path"
    assert first.config["arch"]["cores"]["sram"]["capacity_mb"] == 8
    assert "--batch" in first.argv and first.argv[first.argv.index("--batch") + 1] == "2"
    # zipped values move together; random samples are seeded (same file, same points)
    assert {(p.axes["run.fidelity"], p.axes["workload.seq"]) for p in sweep.points} == {("path", 128),
                                                                                         ("analytical", 256)}
    again = load_sweep(path)
    assert [p.config_hash for p in again.points] == [p.config_hash for p in sweep.points]
    assert all(5 <= s <= 20 and isinstance(s, int) for s in samples)
    other = load_sweep(write(tmp_path, path.read_text().replace("seed: 7", "seed: 8"), "t.yaml"))
    assert [p.config_hash for p in other.points] != [p.config_hash for p in sweep.points]


@pytest.mark.parametrize("patch, message", [
    (("grid:", "gird:"), "did you mean 'grid'"),
    (("arch.cores.sram.capacity_mb", "arch.cores.sram.capacity_mbb"), "did you mean 'capacity_mb'"),
    (("workload.batch", "workload.btach"), "did you mean 'workload.batch'"),
    (("workload.batch", "workloads.batch"), "did you mean 'workload'"),
    (("run: {layers: 1, memory: analytical}", "run: {layers: 1, memory: tlmm}"), "memory"),
    (("[8, 32]", "[8, -1]"), "capacity_mb"),
])
def test_bad_sweep_files_are_one_clear_error(tmp_path, patch, message):
    path = write(tmp_path, TINY.replace(*patch))
    with pytest.raises(ConfigError) as exc:
        load_sweep(path)
    assert message in str(exc.value) and str(path) in str(exc.value)


def test_zip_lengths_and_duplicate_points_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="equal lengths"):
        load_sweep(write(tmp_path, TINY + "zip:\n  run.fidelity: [path]\n  workload.seq: [1, 2]\n"))
    with pytest.raises(ConfigError, match="same configuration"):
        load_sweep(write(tmp_path, TINY.replace("[8, 32]", "[8, 8]")))


def test_cli_bad_file_exits_2_with_one_line(tmp_path, capsys):
    code = main(["sweep", str(write(tmp_path, TINY.replace("grid:", "gird:"))), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("npusim sweep: error:") and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_flatten_nested_keys():
    assert flatten({"a": {"b": 1, "c": {"d": 2.5}}, "e": [1, 2], "f": None}) == {"a.b": 1, "a.c.d": 2.5,
                                                                                 "e": "[1, 2]", "f": None}


# --- running -----------------------------------------------------------------------------------------------------


def _smoke_on_the_local_pool(tmp_path, capsys):
    """The smoke sweep on a local pool of two workers: a complete table that shows the physics."""
    code = main(["sweep", str(SMOKE), "--out", str(tmp_path / "pool"), "--workers", "2", "--json", "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out == {"points": 8, "ran": 8, "skipped": 0, "failed": 0, "results": str(tmp_path / "pool" / "results.h5")}
    pool = read_table(tmp_path / "pool")
    assert pool.attrs["complete"] and set(pool.columns["status"]) == {"ok"}
    # physics the table must show: more DRAM bandwidth never makes a decode step slower
    lat = {(p["arch.cores.sram.capacity_mb"], p["arch.cores.systolic_array.rows"], p["arch.hbm.channel_bandwidth_gbps"]):
           p["latency_ms"] for p in _rows(pool)}
    for (sram, rows, bw), v in lat.items():
        if bw == 60:
            assert lat[(sram, rows, 240)] <= v
    # nor does a bigger array (it takes in a weight row of twice the width per cycle)
    assert all(lat[(s, 128, bw)] <= lat[(s, 64, bw)] for s, _, bw in lat)
    assert all(a > 0 for a in pool.columns["area_mm2"])
    return pool


@pytest.mark.slow  # several seconds warm (session 48): left out of the fast suite, run by CI's slow pass
def test_smoke_on_a_local_pool_is_complete_and_physical(tmp_path, capsys):
    _smoke_on_the_local_pool(tmp_path, capsys)


@pytest.mark.slow  # a Dask LocalCluster: starting its worker processes takes seconds
def test_smoke_local_pool_and_dask_cluster_give_the_same_table(tmp_path, capsys):
    pool = _smoke_on_the_local_pool(tmp_path, capsys)
    from distributed import LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        code = main(["sweep", str(SMOKE), "--out", str(tmp_path / "dask"), "--scheduler", cluster.scheduler_address,
                     "--json", "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["ran"] == 8 and out["failed"] == 0
    assert comparable(read_table(tmp_path / "dask")) == comparable(pool)


def _rows(table):
    return [dict(zip(table.columns, vals)) for vals in zip(*table.columns.values())]


@pytest.mark.slow  # several seconds warm (session 48): left out of the fast suite, run by CI's slow pass
def test_interrupted_sweep_resumes_to_the_uninterrupted_table(tmp_path):
    sweep = load_sweep(write(tmp_path, TINY))
    whole = run_sweep(sweep, tmp_path / "whole", workers=1)
    assert (whole.ran, whole.skipped, whole.failed, whole.missing) == (4, 0, 0, 0)
    # stopped after two points: the table is valid and says which are missing
    part = run_sweep(sweep, tmp_path / "part", workers=1, only=[1, 2])
    assert part.missing == 2
    t = read_table(tmp_path / "part")
    assert t.columns["status"] == ["missing", "ok", "ok", "missing"] and not t.attrs["complete"]
    assert t.attrs["missing"] == 2 and t.columns["latency_ms"][0] is None
    rest = run_sweep(sweep, tmp_path / "part", workers=2)
    assert (rest.ran, rest.skipped, rest.missing) == (2, 2, 0)
    assert comparable(read_table(tmp_path / "part")) == comparable(read_table(tmp_path / "whole"))
    again = run_sweep(sweep, tmp_path / "part", workers=1)
    assert (again.ran, again.skipped) == (0, 4)


def test_a_failing_point_is_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    path = write(tmp_path, TINY.replace("pipeline: {stages: 1}", "pipeline: {stages: 2}").replace(
        "grid:", "grid:\n  run.layers: [1, 2]"))
    code = main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1", "--json", "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["points"] == 8 and out["failed"] == 4 and out["ran"] == 8
    t = read_table(tmp_path / "o")
    for layers, status, error in zip(t.columns["run.layers"], t.columns["status"], t.columns["error"]):
        assert (status == "failed") == (layers == 1)
        assert (error is not None and "exceeds the model's 1 layers" in error) == (layers == 1)
    # failed points count as finished unless asked to retry them
    code = main(["sweep", str(path), "--out", str(tmp_path / "o"), "--workers", "1", "--json", "--retry-failed",
                 "--no-progress"])
    out = json.loads(capsys.readouterr().out)
    assert (out["ran"], out["skipped"], out["failed"]) == (4, 4, 4)


def test_serving_points(tmp_path):
    path = write(tmp_path, """
name: serving
base:
  workload: {rate: 50, requests: 3, input_len: 64, output_len: 4}
  run: {layers: 2, memory: analytical, schedule: disagg}
zip:
  run.pd_ratio: ["16:48", "32:32"]
""")
    out = run_sweep(load_sweep(path), tmp_path / "o", workers=1)
    t = read_table(tmp_path / "o")
    assert out.failed == 0, t.columns["error"]
    assert all(v > 0 for v in t.columns["throughput_tokens_per_s"])
    assert all(v > 0 for v in t.columns["tbt_ms.mean"]) and "throughput_tokens_per_s_per_mm2" in t.columns
    assert t.columns["requests_completed"] == [3, 3]


# --- report ------------------------------------------------------------------------------------------------------


def test_report_writes_pictures_and_page(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    path = write(tmp_path, TINY + 'published: {source: "a paper", trend: "bigger is better"}\n')
    run_sweep(load_sweep(path), tmp_path / "o", workers=1, only=[0, 1, 2])
    code = main(["report", str(tmp_path / "o"), "--y", "latency_ms", "--format", "svg", "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert code == 0 and rep["missing"] == 1 and rep["x"] == "arch.cores.sram.capacity_mb"
    assert rep["hue"] == "workload.batch"
    for name in ("lines", "heatmap", "pareto", "html"):
        assert Path(rep["files"][name]).is_file()
    page = Path(rep["files"]["html"]).read_text()
    assert "bigger is better" in page and "missing" in page
    with pytest.raises(ConfigError, match="did you mean 'latency_ms'"):
        make_report(tmp_path / "o", y="latncy_ms")


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.floats(0.1, 100), st.floats(0.1, 100)), min_size=1, max_size=30))
def test_pareto_front_is_exactly_the_undominated_points(pts):
    cost, gain = np.array([p[0] for p in pts]), np.array([p[1] for p in pts])
    front = set(pareto_front(cost, gain))

    def dominated(k):
        return any((cost[j] <= cost[k] and gain[j] >= gain[k]) and (cost[j] < cost[k] or gain[j] > gain[k])
                   for j in range(len(pts)))

    for k in range(len(pts)):
        if k in front:
            assert not dominated(k)
        elif not dominated(k):  # an exact duplicate of a front point
            assert any(cost[j] == cost[k] and gain[j] == gain[k] for j in front)
