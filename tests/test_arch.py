"""Arch files: presets load, derived figures are right, every bad input is a clear error."""

import copy

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.arch import load_arch, summarize
from npusim.arch.load import PRESET_DIR, list_presets
from npusim.errors import ConfigError


def test_presets_load_and_cite_sources():
    assert {"npusim-64c", "npusim-256c", "ascend-910b"} <= set(list_presets())
    for name in list_presets():
        arch = load_arch(name)
        assert arch.num_cores >= 1
        head = (PRESET_DIR / f"{name}.yaml").read_text().splitlines()[0]
        assert head.startswith("#"), f"{name} must open with a comment citing its sources"


def test_derived_figures_npusim_64c():
    s = summarize(load_arch("npusim-64c"))
    # 64 cores x 128x128 MACs x 2 FLOP x 1 GHz
    assert s.peak_tflops["fp16"] == pytest.approx(64 * 128 * 128 * 2 * 1.0 / 1e3)
    assert s.peak_tflops["int8"] == pytest.approx(2 * s.peak_tflops["fp16"])
    assert s.sram_mb_total == 64 * 32
    # 64 pseudo-channels x 64 bit x 2 (DDR) / 0.833 ns
    assert s.hbm_bandwidth_gbps == pytest.approx(64 * 8 * 2 / 0.833)
    # an 8x8 mesh cut in half crosses 8 links, both directions, 64 B/cycle at 1 GHz
    assert s.noc_bisection_gbps == pytest.approx(2 * 8 * 64)


def test_ascend_910b_matches_public_peak():
    s = summarize(load_arch("ascend-910b"))
    # 24 AIC x 16x16x16 MAC x 2 x 1.85 GHz; the datasheet's 376 TFLOPS implies ~1.91 GHz
    assert s.peak_tflops["fp16"] == pytest.approx(24 * 4096 * 2 * 1.85 / 1e3)
    assert abs(s.peak_tflops["fp16"] - 376) / 376 < 0.05
    assert s.hbm_gb == 64 and s.hbm_bandwidth_gbps == pytest.approx(1638.4)


def test_extends_overrides_only_what_it_says():
    base, big = load_arch("npusim-64c"), load_arch("npusim-256c")
    assert big.num_cores == 256 and big.hbm.channels == 128
    assert big.cores.systolic_array == base.cores.systolic_array
    assert big.hbm.timing == base.hbm.timing


def _write(tmp_path, data, name="a.yaml"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def _base():
    return yaml.safe_load((PRESET_DIR / "npusim-64c.yaml").read_text())


def _error(tmp_path, data) -> str:
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_arch(path)
    msg = str(err.value)
    assert str(path) in msg
    return msg


def test_unknown_key_suggests_the_right_one(tmp_path):
    data = _base()
    data["cores"]["sram"]["capacty_mb"] = data["cores"]["sram"].pop("capacity_mb")
    msg = _error(tmp_path, data)
    assert "cores.sram.capacty_mb" in msg and "did you mean 'capacity_mb'" in msg
    assert "cores.sram.capacity_mb: required key is missing" in msg


def test_wrong_type_and_range_name_the_key(tmp_path):
    data = _base()
    data["clock_ghz"] = "fast"
    data["cores"]["systolic_array"]["rows"] = -4
    data["cores"]["systolic_array"]["dataflow"] = "rs"
    msg = _error(tmp_path, data)
    assert "clock_ghz" in msg and "'fast'" in msg
    assert "cores.systolic_array.rows" in msg and "greater than 0" in msg
    assert "cores.systolic_array.dataflow" in msg and "'ws'" in msg


def test_yaml_syntax_error_names_the_line(tmp_path):
    msg = _error(tmp_path, "name: x\ncores: [1, 2\nclock_ghz: 1\n")
    assert "line" in msg and "invalid YAML" in msg


def test_empty_missing_and_non_mapping_files(tmp_path):
    assert "empty" in _error(tmp_path, "")
    assert "mapping" in _error(tmp_path, "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="not a preset"):
        load_arch(tmp_path / "nope.yaml")


def test_extends_cycle_and_missing_parent(tmp_path):
    _write(tmp_path, {"extends": "b.yaml", "name": "a"}, "a.yaml")
    _write(tmp_path, {"extends": "a.yaml", "name": "b"}, "b.yaml")
    with pytest.raises(ConfigError, match="cycle"):
        load_arch(tmp_path / "a.yaml")
    _write(tmp_path, {"extends": "missing-preset", "name": "c"}, "c.yaml")
    with pytest.raises(ConfigError, match="missing-preset"):
        load_arch(tmp_path / "c.yaml")


def test_hbm_attachment_is_checked(tmp_path):
    data = _base()
    data["hbm"]["attach"] = "per_core"
    data["hbm"]["channels"] = 32
    assert "per_core" in _error(tmp_path, data)
    data["hbm"]["channels"] = 3
    data["hbm"]["attach"] = [0, 1, 999]
    assert "attach" in _error(tmp_path, data)


def test_unknown_dtype_is_rejected(tmp_path):
    data = _base()
    data["cores"]["systolic_array"]["macs_per_pe_per_cycle"]["fp12"] = 1
    assert "fp12" in _error(tmp_path, data)


def test_gemm_base_blocks_are_checked(tmp_path):
    """``kernel.base_blocks``: a dtype the arch knows and three positive sizes, else one line naming
    the key; the Ascend presets give CATLASS's basic matmul blocks."""
    assert load_arch("ascend-910b").kernel.base_blocks["bf16"] == (128, 256, 256)
    assert load_arch("ascend-910c-die").kernel.base_blocks["int8"] == (128, 256, 512)
    data = _base()
    data["kernel"] = {"base_blocks": {"fp12": [128, 256, 256]}}
    assert "unknown dtype 'fp12'" in _error(tmp_path, data)
    data["kernel"] = {"base_blocks": {"fp16": [128, 0, 256]}}
    assert "base_blocks" in _error(tmp_path, data)


def _paths(d, prefix=()):
    for k, v in d.items():
        yield (*prefix, k)
        if isinstance(v, dict):
            yield from _paths(v, (*prefix, k))


ALL_PATHS = list(_paths(_base()))
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.floats(allow_nan=True), st.text(max_size=5),
                 st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=st.lists(st.tuples(st.sampled_from(ALL_PATHS), st.sampled_from(["delete", "junk", "extra"]), JUNK),
                      min_size=1, max_size=3))
def test_broken_configs_never_crash(tmp_path, edits):
    """Any mutation of a valid file either still loads or raises one ConfigError naming the file."""
    data = copy.deepcopy(_base())
    for path, action, junk in edits:
        parent = data
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict):
            continue
        if action == "delete":
            parent.pop(path[-1], None)
        elif action == "junk":
            parent[path[-1]] = junk
        else:
            parent[path[-1] + "_x"] = junk
    path = _write(tmp_path, data, "fuzz.yaml")
    try:
        load_arch(path)
    except ConfigError as err:
        assert str(path) in str(err)



def test_gemm_default_kernel_is_checked(tmp_path):
    """``kernel.gemm_default``: one of the GEMM kernels, else one line naming the key."""
    assert load_arch("ascend-910b").kernel.gemm_default == "aclnn"
    data = _base()
    data["kernel"] = {"gemm_default": "cublas"}
    assert "gemm_default" in _error(tmp_path, data)
