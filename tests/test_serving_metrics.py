"""Serving metrics, time series, the HDF5 result file, plots and the area model."""

import json
import os
import sys

import h5py
import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.serving import (Request, RequestRecord, TimeSeries, chip_area_mm2, core_area_mm2, hbm_area_mm2,
                            latency_stats_ms, meets_slo, per_mm2, plot_latency_cdfs, plot_series, summarize,
                            write_serving_hdf5)
from npusim.arch import area


def records():
    """Two completed requests, one rejected, one unfinished (values chosen for hand arithmetic)."""
    a = RequestRecord(0, 0.0, 100, 3, first_scheduled_s=0.5, token_times_s=[1.0, 1.2, 1.5], finish_s=1.5,
                      prefix_hit_tokens=50)
    b = RequestRecord(1, 1.0, 200, 1, first_scheduled_s=1.0, token_times_s=[1.4], finish_s=1.4)
    c = RequestRecord(2, 2.0, 300, 2, rejected_reason="input longer than the KV capacity")
    d = RequestRecord(3, 2.5, 10, 4, first_scheduled_s=2.6, token_times_s=[3.0])
    return [a, b, c, d]


def test_record_properties():
    a, b, c, d = records()
    assert a.ttft_s == 1.0 and a.tbt_s == pytest.approx([0.2, 0.3]) and a.tpot_s == pytest.approx(0.25)
    assert (a.e2e_s, a.queueing_s, a.max_tbt_s) == (1.5, 0.5, pytest.approx(0.3))
    assert b.ttft_s == pytest.approx(0.4) and b.tbt_s == [] and b.tpot_s is None and b.max_tbt_s is None
    assert c.ttft_s is None and c.e2e_s is None and not c.completed
    assert d.e2e_s is None and d.tpot_s is None and not d.completed
    fresh = RequestRecord.from_request(Request(7, 1.5, 64, 8))
    assert (fresh.id, fresh.arrival_s, fresh.input_len, fresh.output_len, fresh.token_times_s) == (7, 1.5, 64, 8, [])


def test_latency_stats_ms():
    assert latency_stats_ms([]) == {"mean": None, "median": None, "std": None, "p50": None, "p90": None, "p99": None,
                                    "max": None, "count": 0}
    s = latency_stats_ms([0.4, 1.0])
    assert s == pytest.approx({"mean": 700.0, "median": 700.0, "std": 300.0, "p50": 700.0, "p90": 940.0,
                               "p99": 994.0, "max": 1000.0, "count": 2})


def test_summarize_by_hand():
    s = summarize(records())
    assert (s["requests_total"], s["requests_completed"], s["requests_rejected"], s["requests_unfinished"]) == \
        (4, 2, 1, 1)
    assert s["rejected_reasons"] == {"input longer than the KV capacity": 1}
    assert s["duration_s"] == 1.5  # last finish 1.5 s - first arrival 0 s
    assert (s["input_tokens"], s["output_tokens"]) == (300, 4)
    assert s["throughput_tokens_per_s"] == pytest.approx(4 / 1.5)
    assert s["throughput_total_tokens_per_s"] == pytest.approx(304 / 1.5)
    assert s["requests_per_s"] == pytest.approx(2 / 1.5)
    assert s["ttft_ms"]["mean"] == pytest.approx(700) and s["ttft_ms"]["p99"] == pytest.approx(994)
    assert s["tbt_ms"]["mean"] == pytest.approx(250) and s["tbt_ms"]["count"] == 2
    assert s["tpot_ms"]["mean"] == pytest.approx(250) and s["tpot_ms"]["count"] == 1
    assert s["e2e_ms"]["mean"] == pytest.approx(950) and s["queueing_ms"]["mean"] == pytest.approx(250)
    assert s["prefix_hit_rate"] == pytest.approx(50 / 300)
    assert s["slo_attainment"] is None and s["goodput_requests_per_s"] is None
    json.dumps(s)  # JSON-ready
    assert summarize(records(), duration_s=3.0)["throughput_tokens_per_s"] == pytest.approx(4 / 3)


def test_slo_attainment_and_goodput():
    recs = records()
    s = summarize(recs, slo_ttft_s=0.5, slo_tbt_s=0.25)  # a misses TTFT; only b meets
    assert (s["slo_met_requests"], s["slo_attainment"]) == (1, 0.25)
    assert s["goodput_requests_per_s"] == pytest.approx(1 / 1.5)
    assert s["goodput_tokens_per_s"] == pytest.approx(1 / 1.5)
    assert (s["slo_ttft_ms"], s["slo_tbt_ms"]) == (500.0, 250.0)
    assert summarize(recs, slo_ttft_s=2.0)["slo_met_requests"] == 2
    # the TBT SLO applies to the largest gap: a's worst gap is 0.3 s
    assert meets_slo(recs[0], None, 0.31) and not meets_slo(recs[0], None, 0.29)
    assert not meets_slo(recs[2], 10.0, 10.0) and not meets_slo(recs[3], 10.0, 10.0)


def test_empty_and_inconsistent_records():
    s = summarize([])
    assert s["requests_total"] == 0 and s["throughput_tokens_per_s"] is None and s["ttft_ms"]["mean"] is None
    bad = RequestRecord(0, 1.0, 10, 3, token_times_s=[0.5, 0.4], finish_s=0.4)
    with pytest.raises(ValueError, match="request 0: token times go backwards.*before arrival.*finished with 2 of 3"):
        summarize([bad])


def test_time_series():
    ts = TimeSeries(["core0", "core1"], unit="fraction")
    ts.record(0.0, 0.5, 1.0)
    ts.record(1.0, [0.0, 1.0])
    ts.record(3.0, np.array([1.0, 0.0]))
    t, v = ts.to_arrays()
    assert t.tolist() == [0.0, 1.0, 3.0] and v.shape == (3, 2) and len(ts) == 3
    assert ts.time_average() == pytest.approx([(0.5 * 1 + 0.0 * 2) / 3, 1.0])
    with pytest.raises(ValueError, match="has 1 values, expected 2"):
        ts.record(4.0, 1.0)
    with pytest.raises(ValueError, match="earlier than the previous"):
        ts.record(2.0, 1.0, 1.0)
    assert TimeSeries(["x"]).to_arrays()[1].shape == (0, 1)


def test_write_serving_hdf5(tmp_path):
    util = TimeSeries(["core0", "core1"], unit="fraction")
    util.record(0.0, 0.25, 0.5)
    util.record(0.1, 1.0, 0.0)
    iterations = [{"step": 0, "batch": 2, "phase": "prefill", "latency_s": 0.1, "tokens_per_core": [3, 4]},
                  {"step": 1, "batch": 1, "phase": "decode", "latency_s": None, "tokens_per_core": [1, 0]}]
    path = write_serving_hdf5(tmp_path / "out" / "serving.h5", records(), iterations, {"util": util},
                              {"arch": "npusim-64c", "summary": {"ttft_ms": 1.0}})
    assert [p.name for p in path.parent.iterdir()] == ["serving.h5"]  # no temporary left behind
    with h5py.File(path) as f:
        req = f["requests"]
        assert req["id"][:].tolist() == [0, 1, 2, 3]
        assert req["ttft_s"][:2] == pytest.approx([1.0, 0.4]) and np.isnan(req["ttft_s"][2])
        assert [x.decode() for x in req["rejected_reason"][:]] == ["", "", "input longer than the KV capacity", ""]
        offsets = req["token_offsets"][:]
        assert offsets.tolist() == [0, 3, 4, 4, 5]
        assert req["token_times_s"][offsets[0]:offsets[1]] == pytest.approx([1.0, 1.2, 1.5])
        assert req["completed"][:].tolist() == [True, True, False, False]
        it = f["iterations"]
        assert it["batch"][:].tolist() == [2, 1] and it["tokens_per_core"].shape == (2, 2)
        assert np.isnan(it["latency_s"][1]) and it["phase"][0].decode() == "prefill"
        assert f["series/util/values"].shape == (2, 2) and f["series/util/t"][:].tolist() == [0.0, 0.1]
        assert json.loads(f["series/util"].attrs["columns"]) == ["core0", "core1"]
        assert f.attrs["arch"] == "npusim-64c" and json.loads(f.attrs["summary"]) == {"ttft_ms": 1.0}
    with pytest.raises(ValueError, match="iteration 1 has different keys"):
        write_serving_hdf5(tmp_path / "bad.h5", [], [{"a": 1}, {"b": 2}])
    assert not (tmp_path / "bad.h5").exists()


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def test_plots_without_matplotlib_say_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    with pytest.raises(ConfigError, match=r"pip install -e '\.\[plot\]'"):
        plot_latency_cdfs(records(), tmp_path / "cdf.png")
    ts = TimeSeries(["x"])
    ts.record(0.0, 1.0)
    with pytest.raises(ConfigError, match="install the plot extra"):
        plot_series({"x": ts}, tmp_path / "series.png")
    assert not list(tmp_path.iterdir())


@pytest.mark.skipif(not _has_matplotlib() and not os.environ.get("CI"),
                    reason="matplotlib (in the test and plot extras) is not installed; CI never skips this")
def test_plots_write_png(tmp_path):
    png = b"\x89PNG\r\n\x1a\n"
    assert plot_latency_cdfs(records(), tmp_path / "cdf.png").read_bytes().startswith(png)
    few, many = TimeSeries(["a", "b"], unit="fraction"), TimeSeries([f"core{i}" for i in range(16)])
    for t in range(5):
        few.record(t, t / 5, 1 - t / 5)
        many.record(t, np.linspace(0, 1, 16) * t)
    cores = TimeSeries([f"core{i}.{c}" for i in range(4) for c in ("cube", "dma")])
    for t in range(3):
        cores.record(t, np.full(8, t / 3))
    out = plot_series({"util": few, "sram": many, "cores": cores}, tmp_path / "s.png")
    assert out.read_bytes().startswith(png)
    from npusim.serving.metrics import _per_core

    assert _per_core(cores.columns) == (4, 2) and _per_core(many.columns) is None


# ----------------------------------------------------------------------------- area model


def test_area_constants_match_published_figures():
    assert area.PE_FP16_UM2 == pytest.approx(263, abs=0.5)  # LLMCompass 7 nm cost model: one FP16 PE ~263 um^2
    assert 128 * 128 * area.PE_FP16_UM2 * 1e-6 == pytest.approx(4.3, abs=0.02)  # 128x128 array ~4.3 mm^2
    assert area.SRAM_MM2_PER_MB == pytest.approx(2.37, abs=0.005)  # ~2.37 mm^2 per MB
    assert area.HBM2E_PHY_MM2_PER_STACK == 10.45


def test_core_and_chip_area_by_hand():
    figures = dict(pe_um2=263.0, vector_lane_um2=1000.0, control_um2_per_lane=500.0, sram_mm2_per_mb=2.37,
                   router_mm2=0.5)
    core = core_area_mm2(10, 10, 2.0, 8, **figures)
    assert core == pytest.approx({"systolic_array_mm2": 0.0263, "vector_unit_mm2": 0.008, "control_mm2": 0.004,
                                  "sram_mm2": 4.74, "router_mm2": 0.5, "total_mm2": 5.2783})
    assert core_area_mm2(10, 10, 2.0, 8, macs_per_pe=16, **figures)["systolic_array_mm2"] == pytest.approx(0.4208)
    hbm = hbm_area_mm2(2, phy_mm2_per_stack=10.45, ctrl_mm2_per_stack=5.0)
    assert hbm == pytest.approx({"hbm_phy_mm2": 20.9, "hbm_controller_mm2": 10.0, "total_mm2": 30.9})
    chip = chip_area_mm2(4, 10, 10, 2.0, 2, 8, **figures)
    assert chip["core_mm2"] == pytest.approx(5.2783)
    assert chip["sram_mm2"] == pytest.approx(4 * 4.74) and chip["hbm_phy_mm2"] == pytest.approx(20.9)
    assert chip["total_mm2"] == pytest.approx(4 * 5.2783 + 2 * (10.45 + area.HBM2E_CTRL_MM2_PER_STACK))
    parts = {k: v for k, v in chip.items() if k not in ("core_mm2", "total_mm2")}
    assert sum(parts.values()) == pytest.approx(chip["total_mm2"])


def test_default_64_core_design_point():
    # S32A128: 64 cores, 128x128 array, 32 MiB SRAM, 128 lanes, 4 HBM2e stacks (LLMCompass figures)
    chip = chip_area_mm2(64, 128, 128, 32, 4)
    per_core = 128 * 128 * 263.169e-6 + 128 * (1392.2 + 10344.8) * 1e-6 + 32 * 2.36895 + 0.46002
    assert chip["core_mm2"] == pytest.approx(per_core, rel=1e-4)
    assert chip["total_mm2"] == pytest.approx(64 * per_core + 4 * (10.45 + 5.73980), rel=1e-4)


def test_arch_area_and_per_mm2(arch64):
    from npusim.serving import arch_area_mm2
    assert arch_area_mm2(arch64)["total_mm2"] == pytest.approx(chip_area_mm2(64, 128, 128, 32, 4)["total_mm2"])
    assert per_mm2(100.0, {"total_mm2": 50.0}) == 2.0 and per_mm2(9.0, 3.0) == 3.0
    with pytest.raises(ConfigError, match="positive number of mm"):
        per_mm2(1.0, 0.0)
    with pytest.raises(ConfigError, match="sram_mb must be a number >= 0"):
        core_area_mm2(8, 8, -1.0)
