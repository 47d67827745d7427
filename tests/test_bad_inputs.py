"""Issue 24: every input a newcomer tried that ended in a traceback, a hang or a silently wrong
answer now exits 0 with a sensible result (and a warning where it changed the input) or 2 with one
line naming the flag, file or limit. The commands are the issue's own, run as written (in-process,
through ``npusim.cli.main``); the serving ones use small models so the suite stays fast."""

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npusim.cli import main
from npusim.cli import progress as progress_mod
from npusim.errors import ConfigError
from npusim.files import result_files
from npusim.serving.requests import Request, fit_context

ROOT = Path(__file__).resolve().parent.parent


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *words):
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in lines[0], (w, lines[0])


@pytest.mark.parametrize("argv, words", [
    (["run", "--forward", "--tp", "0"], ["--tp", "positive"]),
    (["run", "--arch", "/bin/ls"], ["not UTF-8", "YAML"]),
    (["info", "/bin/ls"], ["not UTF-8"]),
    (["fabric", "--system", "cloudmatrix384", "--src", "npu0.die0", "--dst", "npu8.die0", "--bytes", "1e30"],
     ["--bytes"]),
    (["fabric", "--system", "cloudmatrix384", "--src", "npu0.die0", "--dst", "npu8.die0", "--bytes", "1e18"],
     ["--bytes"]),
    (["run", "--rate", "1e-12", "--no-progress"], ["arrives", "--rate"]),
    (["run", "--rate", "1e-9", "--no-progress"], ["arrives", "--rate"]),
    (["run", "--rate", "nan"], ["--rate"]),
    (["gemm", "--m", "10000000000", "--n", "10000000000", "--k", "10000000000"], ["MACs"]),
    (["run", "--requests", "100000000"], ["--requests", "--force", "GB"]),
    (["fabric", "--system", "cloudmatrix384", "--src", "npu0.die0", "--dst", "npu8.die0", "--bytes", "1e15",
      "--fidelity", "packet"], ["packets", "--force"]),
    (["run", "--system", "cloudmatrix384", "--model", "qwen3-4b", "--mapping", "mappers/cm384-deepseek-decode.yaml",
      "--phase", "decode", "--batch", "8"], ["qwen3-4b", "is dense"]),
    (["run", "--system", "cloudmatrix384", "--model", "qwen3-30b-a3b", "--mapping",
      "mappers/cm384-deepseek-decode.yaml", "--phase", "decode", "--batch", "8"], ["ep 288", "128 routed experts"]),
    (["run", "--system", "cloudmatrix384", "--mapping", "mappers/cm384-deepseek-decode.yaml", "--phase", "decode",
      "--batch", "8", "--kv", "0"], ["--kv 0"]),
    (["run", "--system", "cloudmatrix384", "--mapping", "mappers/cm384-deepseek-decode.yaml", "--phase", "decode",
      "--batch", "8", "--mtp", "1", "--mtp-acceptance", "1.5"], ["--mtp-acceptance"]),
    (["run", "--system", "cloudmatrix384", "--mapping", "mappers/cm384-deepseek-decode.yaml", "--phase", "decode",
      "--batch", "8", "--mtp", "1", "--mtp-acceptance", "-0.2"], ["--mtp-acceptance"]),
    (["collective", "--system", "cloudmatrix384", "--op", "dispatch", "--ep", "32", "--tokens-per-rank", "0"],
     ["--tokens-per-rank"]),
    (["run", "--slo-ttft-ms", "-5", "--requests", "2"], ["--slo-ttft-ms"]),
    (["run", "--forward", "--seq", "50000"], ["context", "40,960"]),
    (["mem", "--bytes", "1e15"], ["--force", "analytical"]),
    (["noc", "--cycles", "100000000"], ["router-cycles", "--force"]),
    (["collective", "--bytes", "1e15", "--fidelity", "flit"], ["flits", "--force"]),
])
def test_issue_inputs_are_one_line_errors(capsys, monkeypatch, argv, words):
    monkeypatch.chdir(ROOT)
    assert_one_line_error(*run(capsys, *argv)[::2], *words)


HF_CONFIG = {"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
             "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
             "tie_word_embeddings": True, "max_position_embeddings": 4096, "rope_theta": 1e6}


@pytest.mark.parametrize("key, value, words", [
    ("hidden_size", "big", ["'hidden_size'", "positive integer", '"big"']),  # was a ValueError traceback
    ("num_hidden_layers", 64.5, ["'num_hidden_layers'", "positive integer", "64.5"]),  # was a TypeError traceback
    ("num_attention_heads", True, ["'num_attention_heads'", "positive integer", "true"]),
    ("vocab_size", 0, ["'vocab_size'", "positive integer"]),
    ("max_position_embeddings", -1, ["'max_position_embeddings'", "non-negative integer"]),
    ("intermediate_size", [128], ["'intermediate_size'", "integer"]),
    ("head_dim", 10**12, ["'head_dim'", "at most 2,147,483,647"]),
    ("tie_word_embeddings", "yes", ["'tie_word_embeddings'", "true or false"]),
    ("model_type", 3, ["'model_type'", "a string"]),
])
def test_a_model_config_field_of_the_wrong_type_is_one_line_naming_the_file_and_key(capsys, tmp_path, key, value,
                                                                                    words):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps({**HF_CONFIG, key: value}))
    assert_one_line_error(*run(capsys, "run", "--model", str(path), "--forward", "--no-progress")[::2],
                          str(path), *words)


def test_a_model_config_takes_null_for_a_default(tmp_path):
    """Hugging Face writes null for "the default" (GPT-2's n_inner, DeepSeek-V2-Lite's q_lora_rank)."""
    from npusim.model.zoo import get_config

    path = tmp_path / "config.json"
    path.write_text(json.dumps({**HF_CONFIG, "head_dim": None, "max_position_embeddings": None}))
    cfg = get_config(str(path))
    assert cfg.head_dim == 16 and cfg.max_position_embeddings == 0 and cfg.num_layers == 2


A2_PLAN = ["run", "--system", "atlas-800i-a2", "--npus", "8", "--model", "qwen3-32b", "--tp", "8"]


@pytest.mark.parametrize("argv, words", [
    # issue 41 item 4: each ran and ignored the flag (--kv 0 ran at context 1024)
    ([*A2_PLAN, "--phase", "decode", "--batch", "8", "--kv", "0"], ["--kv 0", "at least one token", "--kv 1"]),
    (["plan", "--npus", "8", "--model", "qwen3-32b", "--kv", "0"], ["--kv", "positive integer"]),
    (["plan", "--npus", "1", "--model", "qwen3-0.6b", "--batches", "1", "--seq", "512"], ["--seq 512", "--kv"]),
    (["plan", "--npus", "1", "--model", "qwen3-0.6b", "--batches", "1", "--phase", "prefill", "--kv", "512"],
     ["--kv 512", "--seq"]),
    ([*A2_PLAN, "--phase", "prefill", "--batch", "2", "--kv", "512"], ["--kv 512", "prefill", "drop --kv"]),
    ([*A2_PLAN, "--phase", "decode", "--batch", "8", "--arch", "ascend-910b"], ["--arch ascend-910b", "own die"]),
    (["collective", "--system", "cloudmatrix384", "--arch", "ascend-910b"], ["--arch ascend-910b", "own die"]),
    (["run", "--forward", "--kv-dtype", "int8"], ["--kv-dtype", "--system only"]),
    ([*A2_PLAN, "--phase", "decode", "--batch", "8", "--layers", "2", "--partition", "tp_n"],
     ["--layers, --partition", "chip run"]),
    ([*A2_PLAN, "--requests", "4", "--max-batch", "8", "--phase", "decode"], ["--phase, --max-batch", "serving"]),
    ([*A2_PLAN, "--phase", "decode", "--batch", "8", "--caching-pool", "on"], ["--caching-pool", "serving"]),
    (["run", "--forward", "--input-len", "64"], ["--input-len", "forward pass"]),
    (["run", "--system", "atlas-800i-a2", "--npus", "2", "--model", "examples/onnx/qwen3_tiny_opset18.onnx",
      "--allow-unsupported"], ["--allow-unsupported", "chip run"]),
])
def test_flags_the_run_would_ignore_are_one_line_errors(capsys, monkeypatch, argv, words):
    monkeypatch.chdir(ROOT)
    assert_one_line_error(*run(capsys, *argv)[::2], *words)


@pytest.mark.parametrize("argv, words", [
    # issue 41 item 9: a raw HDF5 error over three lines; a directory is a system workload
    (["replay", "examples"], ["examples: a system workload", "add --system"]),
    (["replay", "examples/workload.json"], ["a system workload", "add --system"]),
    (["replay", "no-such-program.h5"], ["no-such-program.h5: no such file", "program.h5"]),
    (["replay", "README.md"], ["README.md: not an HDF5 file", "program.h5"]),
    (["replay", "examples", "--system", "cloudmatrix384", "--arch", "ascend-910b"], ["--arch ascend-910b", "own die"]),
    (["replay", "program.h5", "--nodes", "2"], ["--nodes 2", "--system"]),
])
def test_replay_inputs_are_one_line_errors(capsys, monkeypatch, argv, words):
    monkeypatch.chdir(ROOT)
    assert_one_line_error(*run(capsys, *argv)[::2], *words)


@pytest.mark.parametrize("argv", [
    ["plan", "--npus", "1", "--model", "qwen3-30b-a3b", "--batches", "1", "--workers", "1"],
    [*A2_PLAN[:-3], "qwen3-30b-a3b", "--phase", "decode", "--batch", "8"],
    ["collective", "--system", "cloudmatrix384", "--op", "dispatch"],
])
@pytest.mark.parametrize("routing, words", [
    ("no-such-profile.json", ["--routing no-such-profile.json: no such load-profile file", "zipf:S"]),
    ("zipf:x", ["--routing zipf:x", "exponent"]),
    ("examples", ["--routing examples: is a directory"]),
])
def test_a_bad_routing_is_named_before_anything_runs(capsys, monkeypatch, argv, routing, words):
    """Issue 41 item 9: a missing --routing file got the generic message (and npusim plan printed it
    as the reason of every point)."""
    monkeypatch.chdir(ROOT)
    assert_one_line_error(*run(capsys, *argv, "--routing", routing)[::2], *words)


def test_every_system_flag_is_refused_on_a_chip_run(capsys):
    """Each option of ``npusim run``'s --system group, on a chip run, is an error naming it (a flag
    added to the group later is covered too)."""
    from npusim.scenarios import options

    _, flags, groups = options._options()
    actions = {a.dest: a for a in options.run_parser()._actions}
    for dest in groups[options.SYSTEM_GROUP]:
        if dest in ("system", "deployment"):  # each selects the system path itself (the file names its system)
            continue
        a = actions[dest]
        value = [] if a.nargs == 0 else [a.choices[-1] if a.choices else
                                         "0.5" if getattr(a.type, "base_type", None) is float else "2"]
        argv = ["run", "--forward", "--model", "qwen3-0.6b", "--layers", "1", "--fidelity", "analytical",
                "--no-progress", flags[dest], *value]
        assert_one_line_error(*run(capsys, *argv)[::2], flags[dest], "--system only")


def test_a_huge_sweep_is_refused_before_it_expands(capsys, tmp_path):
    axes = "\n".join(f"  run.{k}: [{', '.join(map(str, range(1, 11)))}]" for k in ("tp", "stages", "layers"))
    axes += "\n" + "\n".join(f"  workload.{k}: [{', '.join(map(str, range(1, 11)))}]" for k in ("batch", "seq", "kv"))
    sweep = tmp_path / "big.yaml"
    sweep.write_text(f"name: big\nbase: {{model: qwen3-0.6b, workload: {{forward: true}}}}\ngrid:\n{axes}\n")
    code, _, err = run(capsys, "sweep", str(sweep), "--out", str(tmp_path / "out"))
    assert_one_line_error(code, err, "1,000,000 points", "--force")
    assert not (tmp_path / "out").exists()  # a refused run leaves no empty result directory


def test_system_defaults_to_deepseek_and_says_which_model(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, out, err = run(capsys, "run", "--system", "cloudmatrix384", "--nodes", "1", "--mapping",
                         "mappers/cm384-deepseek-decode.yaml", "--phase", "decode", "--batch", "4", "--kv", "256",
                         "--json")
    if code == 2:  # the slice may be too small for the deployment: still one line, naming the limit
        assert_one_line_error(code, err)
        return
    assert code == 0 and "deepseek" in json.loads(out)["model"].lower()


def test_nothing_completed_prints_a_summary_not_a_traceback(capsys, tmp_path):
    """Every request longer than the KV capacity of a chip with 2 GB of HBM: all rejected, and the
    text summary says so (a TypeError formatting None before)."""
    arch = tmp_path / "tiny-hbm.yaml"
    arch.write_text("extends: npusim-64c\nname: tiny-hbm\nhbm: {capacity_gb: 2}\n")
    code, out, err = run(capsys, "run", "--arch", str(arch), "--model", "qwen3-0.6b", "--requests", "2",
                         "--input-len", "30000", "--output-len", "8", "--no-progress", "--fidelity", "analytical")
    assert code == 0, err
    assert "0 completed, 2 rejected" in out and "no request completed" in out and "Traceback" not in err
    assert "throughput     - output tokens/s" in out


def test_prompts_beyond_the_context_are_clipped_with_one_warning(capsys):
    code, out, err = run(capsys, "run", "--model", "gpt2", "--input-len", "2000", "--output-len", "4",
                         "--requests", "2", "--no-progress", "--json", "--fidelity", "analytical")
    assert code == 0, err
    s = json.loads(out)
    assert s["context_clipped"] == 2 and s["requests_completed"] == 2
    assert err.count("warning") == 1 and "1,024" in err


def test_fit_context_keeps_every_request_within_the_context():
    reqs = [Request(i, 0.1 * i, n, o) for i, (n, o) in enumerate([(10, 5), (40_000, 2_000), (100, 50_000)])]
    fitted, clipped = fit_context(reqs, 40_960)
    assert clipped == 2
    assert all(r.input_len >= 1 and r.output_len >= 1 and r.input_len + r.output_len <= 40_960 for r in fitted)
    assert fitted[0] == reqs[0] and fitted[1].output_len == 2_000  # the output kept, the prompt cut
    with pytest.raises(ConfigError):
        fit_context(reqs, 1)


def _onnx(path, nodes, inputs, outputs, inits, value_info=()):
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, inits, value_info=list(value_info))),
              path)
    return str(path)


def test_onnx_shapes_that_disagree_are_an_error(capsys, tmp_path):
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)
    w = numpy_helper.from_array(np.zeros((4, 5), np.float32), "W")
    model = _onnx(tmp_path / "bad.onnx", [helper.make_node("MatMul", ["A", "W"], ["Y"], name="mm")], [a], [y], [w])
    assert_one_line_error(*run(capsys, "run", "--model", model, "--forward")[::2], "mm", "MatMul", "K 3 vs 4")
    assert_one_line_error(*run(capsys, "model", model)[::2], "inner dimensions disagree")


def _unsupported_onnx(tmp_path) -> str:
    """A MatMul followed by a Hardmax (an op npusim does not compute)."""
    a = helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 4])
    h = helper.make_tensor_value_info("H", TensorProto.FLOAT, [2, 5])
    y = helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 5])
    w = numpy_helper.from_array(np.zeros((4, 5), np.float32), "W")
    return _onnx(tmp_path / "unsup.onnx", [helper.make_node("MatMul", ["A", "W"], ["H"], name="mm"),
                                           helper.make_node("Hardmax", ["H"], ["Y"], name="hm")],
                 [a], [y], [w], [h])


def test_allow_unsupported_lists_what_it_did_not_compute(capsys, tmp_path):
    model = _unsupported_onnx(tmp_path)
    code, _, err = run(capsys, "run", "--model", model, "--forward", "--allow-unsupported", "--no-progress",
                       "--fidelity", "analytical")
    assert code == 0 and "Hardmax x1" in err and "not computed" in err
    # serving an ONNX graph is refused plainly (it was "unknown model" for a file that exists)
    assert_one_line_error(*run(capsys, "run", "--model", model, "--rate", "5", "--requests", "5")[::2],
                          "cannot be served")


def test_allow_unsupported_records_what_it_did_not_compute_in_the_json_notes(capsys, tmp_path):
    """Issue 41: the JSON's notes were empty; they now name the op types and nodes costed as data movement."""
    code, out, err = run(capsys, "run", "--model", _unsupported_onnx(tmp_path), "--forward", "--allow-unsupported",
                         "--no-progress", "--fidelity", "analytical", "--json")
    assert code == 0, err
    notes = [n for n in json.loads(out)["mapping"]["notes"] if "--allow-unsupported" in n]
    assert len(notes) == 1 and "1 unsupported ONNX node(s) costed as data movement" in notes[0]
    assert "Hardmax x1 [hm]" in notes[0]


def test_mem_json_is_strict_json(capsys):
    code, out, _ = run(capsys, "mem", "--pattern", "strided", "--bytes", "4MiB", "--json")
    assert code == 0
    d = json.loads(out, parse_constant=lambda c: pytest.fail(f"{c} in JSON output"))
    assert d["latency_ns_p99"] is None or d["latency_ns_p99"] <= d["latency_ns_hist_max"]


def test_long_runs_print_progress_lines_when_not_on_a_terminal(capsys, monkeypatch):
    monkeypatch.setattr(progress_mod, "LOG_EVERY_S", 0.0)
    with progress_mod.request_progress(10) as update:
        update(1.5, 4, 10)
        update(2.5, 6, 10)
    err = capsys.readouterr().err
    assert "serving: 4/10 reqs" in err and "t=1.500 s" in err and "serving: 6/10 reqs" in err
    assert "left" in err.splitlines()[-1]


def test_no_estimate_of_the_time_left_before_it_has_a_basis(capsys, monkeypatch):
    """Issue 41 item 7: "~8h00m left" on a 7-minute run: the first request done (after the
    compile and the pipeline's fill) was extrapolated to all. The estimate now waits for
    ETA_AFTER of the items and a rate measured since the first one."""
    monkeypatch.setattr(progress_mod, "LOG_EVERY_S", 0.0)
    with progress_mod.request_progress(200) as update:
        update(0.5, 1, 200)
        update(1.0, 15, 200)  # 7.5% done: no basis yet
        update(1.5, 40, 200)
    lines = capsys.readouterr().err.splitlines()
    assert [("left" in line) for line in lines[-3:]] == [False, False, True]


def test_plan_progress_lines_have_no_empty_fields(capsys, monkeypatch):
    monkeypatch.setattr(progress_mod, "LOG_EVERY_S", 0.0)
    with progress_mod._bar("plan", "pt", 0, True, lambda _: "") as update:
        update(0, 33, 52)
    err = capsys.readouterr().err
    assert "plan: 33/52 pts, 0m00s elapsed" in err and ", ," not in err


def test_the_heartbeat_speaks_while_a_call_blocks(capsys):
    """Issue 41 item 7: gaps of minutes in the "line every 30 s" while one long call ran (a
    kernel, a set-up). The heartbeat repeats the last progress line marked "working", or says
    the command is working, while the main thread is blocked (here in a GIL-free sleep)."""
    with progress_mod.heartbeat("run", every_s=0.05):
        with progress_mod._bar("serving", "req", 10, True, lambda now: f"t={now} s") as update:
            update(1.0, 2, 10)
            for _ in range(400):  # until the heartbeat has spoken (not a time limit: it ends when it has)
                if "(working)" in capsys.readouterr().err:
                    break
                time.sleep(0.05)
            else:
                pytest.fail("no heartbeat while the call blocked")
        for _ in range(400):
            if "npusim run: working" in capsys.readouterr().err:
                break
            time.sleep(0.05)
        else:
            pytest.fail("no heartbeat outside a progress bar")


def test_an_interrupted_result_set_leaves_the_previous_set_untouched(tmp_path):
    files = {"summary": tmp_path / "summary.json", "serving": tmp_path / "serving.h5"}
    for p in files.values():
        p.write_text("an earlier run")
    with pytest.raises(KeyboardInterrupt):
        with result_files(files) as staged:
            staged["serving"].write_text("new, half written")
            raise KeyboardInterrupt
    assert all(p.read_text() == "an earlier run" for p in files.values())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["serving.h5", "summary.json"]  # no staging left
    with result_files(files) as staged:  # a finished set replaces the old one whole
        staged["summary"].write_text("new")
    assert files["summary"].read_text() == "new" and not files["serving"].exists()
    (tmp_path / ".summary.json.abc.partial").write_text("left by a SIGKILL")
    (tmp_path / ".npusim-results.xyz.partial").mkdir()
    (tmp_path / ".npusim-results.xyz.partial" / "summary.json").write_text("left by a SIGKILL")
    assert main(["run", "--forward", "--seq", "50000", "--out", str(tmp_path)]) == 2  # a next run with --out removes it
    assert not list(tmp_path.glob(".*.partial"))


@pytest.mark.slow  # two serving runs and their plots, ~4 s; the fast suite checks result_files above
def test_ctrl_c_while_results_are_written_keeps_the_previous_results(tmp_path, capsys, monkeypatch):
    """Issue 41 item 6: an interrupt while a run writes its results left DIR empty and said no
    incomplete files were left; the previous run's files now stay as they were, and it says so."""
    import npusim.report.perfetto as perfetto

    argv = ["run", "--requests", "3", "--seed", "2", "--fidelity", "analytical", "--out", str(tmp_path),
            "--no-progress"]
    assert main(argv) == 0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert "summary.json" in before

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(perfetto, "write_serving_timeline", interrupted)
    capsys.readouterr()
    assert main(argv) == 130
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    err = capsys.readouterr().err
    assert "interrupted; nothing of this run was written" in err and "untouched" in err


def test_help_builds_no_simulator():
    """``npusim --help`` and every subcommand's parser import neither Numba nor NumPy (they made
    --help take 0.8 s)."""
    code = ("import sys; from npusim.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('numba', 'numpy', 'pydantic', 'h5py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_serving_library_refuses_requests_beyond_the_context(arch64):
    """The check is the serving layer's, not only the command line's: a caller of simulate_serving
    gets one error naming the fix (npusim run clips with a warning first)."""
    from npusim.mapping.spec import MappingSpec
    from npusim.serving.simulate import ServingConfig, simulate_serving

    reqs = [Request(0, 0.0, 1_000, 100)]
    with pytest.raises(ConfigError, match="gpt2's context of 1,024.*fit_context"):
        simulate_serving(arch64, MappingSpec(), reqs, ServingConfig(model="gpt2"))
