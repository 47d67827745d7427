"""Fuzz every input surface of the command line (issue 24): numbers given to each subcommand's flags
(0, negative, NaN, infinities, 1e30, huge integers, text), system files, sweep files and ONNX graphs
with shapes that do not agree. The property: exit 0 with strict JSON of finite numbers, or exit 2 with
one line on stderr; never a traceback. (A run the flags make too long to finish is refused up front,
with ``--force`` to insist; the values here stay within what the refusals let through quickly.)

The example counts come from the hypothesis profile (tests/conftest.py: a small ``dev`` count, the
full count in CI)."""

import copy
import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from mutation import key_paths, loads_or_raises_our_error
from npusim.cli import main
from npusim.errors import ConfigError, NpusimError

ROOT = Path(__file__).resolve().parent.parent

#: what a user (or a script) might type for a number
NUMBERS = st.one_of(
    st.sampled_from(["0", "-1", "-1e9", "nan", "NaN", "inf", "-inf", "1e30", "1e-300", str(2**70), str(2**63),
                     str(2**53), str(2**31), "1.5", "abc", "", "0x10", "1e5", " 7 "]),
    st.integers(-3, 64).map(str),
)

#: (cheap base command, its numeric flags)
SURFACES = {
    "gemm": (["gemm", "--m", "64", "--k", "64", "--n", "64", "--json"], ["--m", "--k", "--n", "--batch", "--t-inj"]),
    "gemm-chip": (["gemm", "--chip", "--arch", "ascend-910b", "--m", "256", "--k", "256", "--n", "256", "--no-cache",
                   "--json"], ["--m", "--k", "--n", "--batch", "--cores", "--l2-bytes-per-cycle"]),
    "mem": (["mem", "--mode", "analytical", "--bytes", "1MiB", "--json"], ["--bytes", "--initiators", "--stride"]),
    "info": (["info", "cloudmatrix384", "--json"], ["--nodes"]),
    "model": (["model", "qwen3-0.6b", "--json"], ["--batch", "--seq", "--kv", "--layers", "--moe-skew", "--seed"]),
    "fabric": (["fabric", "--system", "cloudmatrix384", "--nodes", "2", "--bytes", "1MiB", "--json"],
               ["--bytes", "--nodes"]),
    "collective": (["collective", "--bytes", "64KiB", "--fidelity", "analytical", "--json"], ["--bytes"]),
    "dispatch": (["collective", "--system", "cloudmatrix384", "--nodes", "1", "--op", "dispatch", "--ep", "8",
                  "--experts", "64", "--json", "--no-progress"],
                 ["--tokens-per-rank", "--top-k", "--hidden", "--experts", "--ep", "--seed", "--nodes"]),
    "noc": (["noc", "--mesh", "4x4", "--cycles", "300", "--warmup", "50", "--json"],
            ["--rate", "--packet-flits", "--cycles", "--warmup", "--vcs", "--buffer-flits", "--seed",
             "--hotspot-fraction"]),
    "forward": (["run", "--model", "qwen3-0.6b", "--layers", "1", "--forward", "--fidelity", "analytical", "--json",
                 "--no-progress"], ["--batch", "--seq", "--kv", "--tp", "--stages", "--layers"]),
    "system-plan": (["run", "--system", "atlas-800i-a2", "--nodes", "1", "--model", "qwen3-0.6b", "--npus", "2",
                     "--batch", "4", "--kv", "256", "--json", "--no-progress"],
                    ["--npus", "--tp", "--dp", "--ep", "--pp", "--microbatches", "--batch", "--kv", "--seq", "--nodes"]),
    "plan": (["plan", "--system", "atlas-800i-a2", "--nodes", "1", "--npus", "1", "--model", "qwen3-0.6b",
              "--batches", "1,4", "--workers", "1", "--json", "--no-progress"],
             ["--npus", "--kv", "--seq", "--slo-tpot-ms", "--max-pp", "--seed", "--nodes"]),
    "serve": (["run", "--model", "qwen3-0.6b", "--layers", "1", "--requests", "2", "--input-len", "32",
               "--output-len", "4", "--fidelity", "analytical", "--json", "--no-progress"],
              ["--rate", "--requests", "--budget", "--chunk", "--max-batch", "--slo-ttft-ms", "--slo-tbt-ms",
               "--seed", "--max-input", "--max-output"]),
}


def check_outcome(code: int, out: str, err: str) -> None:
    assert "Traceback" not in err, err
    if code == 2:
        assert len([line for line in err.splitlines() if line.strip()]) == 1, err
        return
    assert code == 0, (code, err)
    finite = [True]

    def number(text):
        value = float(text)
        finite[0] &= math.isfinite(value)
        return value

    json.loads(out, parse_float=number, parse_constant=lambda c: pytest.fail(f"{c} in JSON output"))
    assert finite[0], out


def run_with_one_flag_changed(capsys, data, base: list[str], flags: list[str], values) -> None:
    """Run ``base`` with one of ``flags`` set to a value drawn from ``values``; check the outcome."""
    flag = data.draw(st.sampled_from(flags), label="flag")
    value = data.draw(values, label="value")
    argv = list(base)
    if flag in argv:
        argv[argv.index(flag) + 1] = value
    else:
        argv += [flag, value]
    code = main(argv)
    out, err = capsys.readouterr()
    check_outcome(code, out, err)


VALUES = st.one_of(st.integers(-2, 3), st.sampled_from([2**70, 1e308, -1e308, float("nan"), float("inf"), 0.5]),
                   st.text(max_size=5), st.none(), st.booleans(), st.lists(st.integers(-3, 9), max_size=3))
def _load_system(path):
    from npusim.system.load import load_system

    return load_system(path, nodes=1)


def _load_sweep(path):
    from npusim.sweep.spec import load_sweep

    return load_sweep(path)


#: (a shipped file, the loader a user's edited copy goes through)
FILES = {"system": (ROOT / "arch" / "atlas-800i-a2.yaml", _load_system),
         "sweep": (ROOT / "examples" / "sweeps" / "smoke.yaml", _load_sweep)}


@pytest.mark.parametrize("kind", sorted(FILES))
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_file_mutations_load_or_raise_our_error(tmp_path_factory, kind, data):
    """A shipped system or sweep file with one key set to an odd value: it loads, or raises the
    project's own error (never another exception)."""
    source, load = FILES[kind]
    doc = yaml.safe_load(source.read_text())
    path = data.draw(st.sampled_from(sorted(key_paths(doc), key=str)), label="key")
    value = data.draw(VALUES, label="value")
    loads_or_raises_our_error(load, tmp_path_factory.mktemp(kind) / source.name, doc, path, value)


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(a=st.lists(st.integers(1, 6), min_size=1, max_size=4), b=st.lists(st.integers(1, 6), min_size=1, max_size=4),
       tmp=st.integers(0, 10**9))
def test_onnx_matmul_of_any_shapes_converts_or_raises_our_error(tmp_path_factory, a, b, tmp):
    """A MatMul of arbitrary (often incompatible) static shapes: an IR op whose FLOPs match the shapes,
    or one error naming the node; never a 0-FLOP graph from shapes that do not agree."""
    from npusim.model.onnx_import import load_onnx

    x = helper.make_tensor_value_info("A", TensorProto.FLOAT, a)
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.zeros(b, np.float32), "W")
    path = tmp_path_factory.mktemp("onnx") / "mm.onnx"
    onnx.save(helper.make_model(helper.make_graph([helper.make_node("MatMul", ["A", "W"], ["Y"], name="mm")], "g",
                                                  [x], [y], [w])), path)
    try:
        graph = load_onnx(path)
    except NpusimError as exc:
        assert "\n" not in str(exc).strip() or "mm" in str(exc)
        return
    ref = np.matmul(np.zeros(a, np.float32), np.zeros(b, np.float32))  # numpy agrees the shapes are valid
    k = a[-1]
    assert sum(op.flops for op in graph.ops) == 2 * ref.size * k


#: what a user might type for a flag that takes a structured string (ranges, ratios, lists, grids)
TEXTS = st.one_of(
    st.sampled_from(["0:0", "-1:5", "5:2", "1e30:3", "3:nan", "a:b", "", ":", ":::", "7", "0", "-3", "2:1",
                     "128:512", "kv=300", "kv=1024,batch=0", "batch=-1", "chunk=7", "exact", "zipf:-1", "zipf:nan",
                     "zipf:1e308", "0,1,2,3", "0-3", "3-0", "0,0,0", "99999", "4x4", "0x4", "9999999x9999999",
                     "npu0.die0,npu0.die0", "1,2,a"]),
    st.text(alphabet="0123456789:,-x.=ab", max_size=8),
)

#: the serving surfaces' outputs clipped: "99999" for --output-len parses and served each request's
#: 99,999 tokens (~100 s; 9,999: 8 s), longer than the whole fast suite's other tests of this file
SERVE_CLIPPED = SURFACES["serve"][0] + ["--max-output", "64"]

#: (cheap base command, its structured-string flags)
TEXT_SURFACES = {
    "serve": (SERVE_CLIPPED, ["--input-len", "--output-len", "--iteration-cache-buckets"]),
    "disagg": (SERVE_CLIPPED + ["--schedule", "disagg"], ["--pd-ratio", "--pd-stages"]),
    "collective": (SURFACES["collective"][0], ["--cores", "--grid"]),
    "dispatch": (SURFACES["dispatch"][0], ["--routing", "--ranks"]),
    "noc": (SURFACES["noc"][0], ["--mesh", "--hotspot-nodes", "--routing", "--topology", "--traffic"]),
    "mem": (SURFACES["mem"][0], ["--bytes", "--stride"]),
    "gemm": (SURFACES["gemm"][0], ["--array", "--dtype"]),
    "plan": (SURFACES["plan"][0], ["--batches", "--routing"]),
    "system-plan": (SURFACES["system-plan"][0], ["--routing", "--model"]),
}


#: (what a flag takes, the surface): numbers on every surface's number flags, structured strings on
#: every surface's string flags
CASES = [("numbers", s) for s in sorted(SURFACES)] + [("strings", s) for s in sorted(TEXT_SURFACES)]


@pytest.mark.parametrize("kind, surface", CASES)
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_cli_flags_exit_cleanly(capsys, monkeypatch, kind, surface, data):
    monkeypatch.chdir(ROOT)
    base, flags = (SURFACES if kind == "numbers" else TEXT_SURFACES)[surface]
    run_with_one_flag_changed(capsys, data, base, flags, NUMBERS if kind == "numbers" else TEXTS)


# -- saved system workloads (npusim replay DIR --system S) ------------------------------------------

def _small_workloads():
    from npusim.model.zoo import get_config
    from npusim.system.mapper import StepShape, build_step
    from npusim.system.plan import ParallelPlan

    dense = build_step(get_config("qwen3-0.6b"), ParallelPlan(npus=2, tp=2), StepShape("decode", 4, 1, 128))
    moe = build_step(get_config("qwen3-30b-a3b"), ParallelPlan(npus=2, dp=2, ep=2), StepShape("decode", 4, 1, 128))
    return [dense.to_dict(), moe.to_dict()]


WORKLOADS = _small_workloads()
ODD = st.sampled_from([None, -1, 0, "x", 1e20, 2**70, [], {}, True, 3.5, [[1]], {"a": 1}, float("nan")])


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(which=st.integers(0, 1), section=st.sampled_from(["nodes", "kernels", "meta", "top"]), pick=st.integers(0, 10**6),
       value=ODD)
def test_a_mutated_workload_replays_or_is_one_clear_error(which, section, pick, value):
    """One field of a saved workload (a node's, a kernel's, the meta's or a top-level key) set to an odd
    value: it times, or the project's own error says what is wrong (no traceback, no hang, no runaway
    memory: kernel shapes are bounded)."""
    from npusim.system.execute import time_workload
    from npusim.system.load import load_system
    from npusim.system.workload import Workload

    d = copy.deepcopy(WORKLOADS[which])
    target = d if section == "top" else d["meta"] if section == "meta" else d[section][pick % len(d[section])]
    keys = sorted(target)
    target[keys[pick % len(keys)]] = value
    try:
        wl = Workload.from_dict(json.loads(json.dumps(d, allow_nan=True)))
        time_workload(wl, load_system("atlas-800i-a2", nodes=1))
    except NpusimError:
        pass


@pytest.mark.parametrize("key, value", [("fn", None), ("fn", [[1]]), ("fn", "x"), ("dtype", "x")])
def test_a_saved_vector_kernel_needs_a_known_function_and_dtype(key, value):
    """Found by the fuzz above: a vector kernel of class activation whose 'fn' was missing or not a
    name, or any vector kernel of an unknown dtype, crashed in the vector model; it is now the
    workload check's error, naming the key."""
    from npusim.system.workload import Workload

    d = copy.deepcopy(WORKLOADS[1])
    d["kernels"].append({"type": "vector", "op_class": "activation", "elements": 64, "row_len": 64, "fn": "silu",
                         key: value})
    with pytest.raises(ConfigError, match=f"'{key}'"):
        Workload.from_dict(d)
