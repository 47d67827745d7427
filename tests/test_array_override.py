"""Array overrides keep the array consistent: parameters derived from the array (T_inj) follow it
through ``npusim gemm --array``, ``extends:`` files and core classes, unless the user sets them."""

import contextlib
import io
import json
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.arch import load_arch
from npusim.arch.load import PRESET_DIR
from npusim.arch.schema import Arch, merge_arch_data
from npusim.cli import main
from npusim.config import load_yaml


def _gemm_json(*argv) -> dict:
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(["gemm", *argv, "--json"]) == 0
    return json.loads(buf.getvalue())


def _fresh_arch_file(directory: Path, rows: int, cols: int) -> Path:
    """npusim-64c written out again with a rows x cols array, as a user would write it: the
    array's own keys changed, nothing derived carried over from the 128x128 array."""
    data = load_yaml(PRESET_DIR / "npusim-64c.yaml")
    sa = data["cores"]["systolic_array"]
    sa.update(rows=rows, cols=cols)
    sa.pop("weight_injection_cycles", None)
    path = directory / f"fresh-{rows}x{cols}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_issue_case_64x64_follows_the_array():
    """1x2560x2560 on 64x64, serial weights: 305,600 cycles (T_inj = 64), not 408,000 (T_inj = 128)."""
    d = _gemm_json("--m", "1", "--k", "2560", "--n", "2560", "--array", "64x64", "--no-double-buffer")
    assert (d["cycles"], d["t_inj"]) == (305_600, 64)
    # the user's own T_inj wins
    d = _gemm_json("--m", "1", "--k", "2560", "--n", "2560", "--array", "64x64", "--no-double-buffer",
                   "--t-inj", "128")
    assert (d["cycles"], d["t_inj"]) == (408_000, 128)


@settings(max_examples=examples(60), deadline=None)
@given(rows=st.integers(1, 256), cols=st.integers(1, 256), m=st.integers(1, 600), k=st.integers(1, 3000),
       n=st.integers(1, 3000))
def test_ws_serial_matches_the_documented_fold_formula(rows, cols, m, k, n):
    """``T = N_tile * (T_inj + S + F)`` with ``N_tile = ceil(K/R) ceil(N/C)``, ``S = M``,
    ``F = R + C - 2`` and T_inj = R (npusim-64c: fp16, one MAC per PE), for every array size."""
    d = _gemm_json("--m", str(m), "--k", str(k), "--n", str(n), "--array", f"{rows}x{cols}",
                   "--dataflow", "ws", "--no-double-buffer")
    folds = -(-k // rows) * -(-n // cols)
    assert d["folds"] == folds
    assert d["cycles"] == folds * (rows + m + rows + cols - 2)


@pytest.mark.parametrize("size", [8, 16, 32, 64, 128, 256])
def test_ws_serial_fold_formula_square_arrays(size):
    d = _gemm_json("--m", "1", "--k", "2560", "--n", "2560", "--array", f"{size}x{size}", "--dataflow", "ws",
                   "--no-double-buffer")
    folds = (-(-2560 // size)) ** 2
    assert d["cycles"] == folds * (size + 1 + 2 * size - 2)


@settings(max_examples=examples(25), deadline=None)
@given(rows=st.integers(1, 200), cols=st.integers(1, 200), m=st.integers(1, 400), k=st.integers(1, 2000),
       n=st.integers(1, 2000), dataflow=st.sampled_from(["ws", "os"]), double=st.booleans())
def test_override_equals_a_fresh_arch_file(rows, cols, m, k, n, dataflow, double):
    """``--array RxC`` on the preset and an arch file written with that array give identical results."""
    shape = ["--m", str(m), "--k", str(k), "--n", str(n), "--dataflow", dataflow,
             "--double-buffer" if double else "--no-double-buffer"]
    with tempfile.TemporaryDirectory() as tmp:
        fresh = _fresh_arch_file(Path(tmp), rows, cols)
        from_file = _gemm_json("--arch", str(fresh), *shape)
    overridden = _gemm_json("--arch", "npusim-64c", "--array", f"{rows}x{cols}", *shape)
    assert overridden == from_file


def test_extends_that_resizes_the_array_rescales_an_inherited_t_inj(tmp_path):
    parent = tmp_path / "parent.yaml"
    data = load_yaml(PRESET_DIR / "npusim-64c.yaml")
    data["name"] = "parent"
    data["cores"]["systolic_array"]["weight_injection_cycles"] = 256  # two cycles per row
    parent.write_text(yaml.safe_dump(data))
    child = tmp_path / "child.yaml"
    child.write_text("extends: parent.yaml\nname: child\ncores:\n  systolic_array: {rows: 32, cols: 32}\n")
    assert load_arch(child).cores.systolic_array.t_inj == 64  # 2 cycles per row kept
    # the preset leaves T_inj to the rows: a child of it follows its own rows
    child2 = tmp_path / "child2.yaml"
    child2.write_text(f"extends: {PRESET_DIR / 'npusim-64c.yaml'}\nname: c2\n"
                      "cores:\n  systolic_array: {rows: 64, cols: 64}\n")
    sa = load_arch(child2).cores.systolic_array
    assert (sa.rows, sa.t_inj, sa.macs_per_pe_per_cycle) == (64, 64, {"fp16": 1, "bf16": 1, "int8": 2})
    # a child that sets T_inj keeps it
    child3 = tmp_path / "child3.yaml"
    child3.write_text("extends: parent.yaml\nname: c3\ncores:\n  systolic_array: {rows: 32, weight_injection_cycles: 5}\n")
    assert load_arch(child3).cores.systolic_array.t_inj == 5


def test_core_class_array_inherits_the_chip_array_and_its_t_inj_follows():
    base = load_arch("ascend-910b").model_dump()
    data = merge_arch_data(base, {"core_classes": {"small": {"cores": [0], "systolic_array": {"rows": 8, "cols": 8}}}})
    arch = Arch.model_validate(data)
    cls = arch.systolic_for(0)
    chip = arch.systolic_for(1)
    # the class keeps the chip's cube (16 MACs per PE along K, OS dataflow) and T_inj follows its 8 rows
    assert (cls.rows, cls.cols, cls.dataflow, cls.macs_per_pe_per_cycle, cls.t_inj) == (
        8, 8, chip.dataflow, chip.macs_per_pe_per_cycle, 8)
    assert chip.t_inj == 16


def test_resized_keeps_a_given_rate_and_leaves_an_unset_one_to_the_rows():
    sa = load_arch("npusim-64c").cores.systolic_array
    assert sa.weight_injection_cycles is None and sa.t_inj == sa.rows
    assert sa.resized(32, 16).t_inj == 32
    explicit = sa.model_copy(update={"weight_injection_cycles": 64})  # half a cycle per row
    assert explicit.resized(32, 32).t_inj == 16
    assert explicit.resized(33, 32).t_inj == 17  # rounded up
    assert explicit.resized(32, 32, t_inj=3).t_inj == 3


def test_negative_t_inj_is_one_clear_error(capsys):
    assert main(["gemm", "--m", "4", "--k", "4", "--n", "4", "--t-inj", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--t-inj" in err and "Traceback" not in err
