"""The npusim command: help everywhere, JSON contracts, clean errors, output files."""

import json
import subprocess
import sys

import h5py
import pytest

from npusim.cli import SUBCOMMANDS, main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_help_on_every_subcommand(capsys):
    assert main(["--help"]) == 0
    for name in SUBCOMMANDS:
        assert main([name, "--help"]) == 0
        assert name in capsys.readouterr().out


def test_info_json_contract(capsys):
    code, out, _ = run_cli(capsys, "info", "npusim-64c", "--json")
    d = json.loads(out)
    assert code == 0
    assert {"peak_tflops", "sram_mb_total", "hbm_gb", "hbm_bandwidth_gbps"} <= d.keys()
    assert d["peak_tflops"]["fp16"] > 0


def test_info_of_a_slice_says_its_own_node_count(capsys):
    """Issue 41: ``info cloudmatrix384 --nodes 3`` said "48 nodes" (the file's description)."""
    code, out, _ = run_cli(capsys, "info", "cloudmatrix384", "--nodes", "3")
    first = out.splitlines()[0]
    assert code == 0 and "3 of its 48 nodes x 8 Ascend 910C" in first and "CloudMatrix384, 48 nodes" not in first
    code, out, _ = run_cli(capsys, "info", "cloudmatrix384", "--nodes", "3", "--json")
    assert code == 0 and json.loads(out)["description"].startswith("CloudMatrix384, 3 of its 48 nodes")
    code, out, _ = run_cli(capsys, "info", "atlas-800i-a2", "--nodes", "2")  # a description without a count
    assert code == 0 and "(--nodes 2: 2 of its 4 nodes)" in out.splitlines()[0]
    code, _, err = run_cli(capsys, "info", "npusim-64c", "--nodes", "2")  # was ignored
    assert code == 2 and "--nodes 2" in err and "one chip" in err


def test_gemm_json_contract(capsys):
    code, out, _ = run_cli(capsys, "gemm", "--m", "256", "--k", "512", "--n", "384", "--array", "64x64",
                           "--dataflow", "os", "--json")
    d = json.loads(out)
    assert code == 0 and {"cycles", "utilization", "macs"} <= d.keys()
    assert d["macs"] == 256 * 512 * 384 and 0 < d["utilization"] <= 1


def test_mem_json_contract(capsys):
    code, out, _ = run_cli(capsys, "mem", "--pattern", "stream", "--bytes", "1MiB", "--json")
    d = json.loads(out)
    assert code == 0
    assert {"bandwidth_gbps", "peak_bandwidth_gbps", "latency_ns_mean", "latency_ns_p99"} <= d.keys()
    assert 0 < d["bandwidth_gbps"] <= d["peak_bandwidth_gbps"]


def test_mem_repeat_shows_the_l2_hit_rate(capsys):
    """A second pass over 3 MiB on a chip with a 192 MiB L2 hits there (TLM); the analytical
    fidelity does not simulate the cache; a chip without an L2 reports none."""
    code, out, _ = run_cli(capsys, "mem", "--arch", "ascend-910b", "--bytes", "3MiB", "--repeat", "2", "--json")
    d = json.loads(out)
    assert code == 0 and d["repeat"] == 2 and d["l2_hit_rate"] == 0.5 and d["l2_read_bytes"] == 6 * 2**20
    code, out, _ = run_cli(capsys, "mem", "--arch", "ascend-910b", "--bytes", "3MiB", "--repeat", "2")
    assert code == 0 and "L2 hits           50.0%" in out and "HBM traffic" in out
    for argv in (("--arch", "ascend-910b", "--mode", "analytical"), ()):
        code, out, _ = run_cli(capsys, "mem", *argv, "--bytes", "1MiB", "--repeat", "2", "--json")
        assert code == 0 and json.loads(out)["l2_hit_rate"] is None


def test_gemm_chip_reports_who_decided_the_l2_hits(capsys):
    argv = ("gemm", "--arch", "ascend-910c-die", "--chip", "--m", "256", "--k", "1024", "--n", "512", "--dtype",
            "int8", "--no-cache", "--json")
    models = {}
    for memory in ("analytical", "tlm"):
        code, out, _ = run_cli(capsys, *argv, "--memory", memory)
        d = json.loads(out)
        assert code == 0 and 0 < d["l2_hit_rate"] < 1
        models[d["l2_model"]] = d["l2_hit_rate"]
    assert set(models) == {"reuse", "tlm"} and models["tlm"] == pytest.approx(models["reuse"], abs=1e-3)


def test_run_json_contract_outputs_and_replay(capsys, tmp_path):
    argv = ["run", "--model", "qwen3-0.6b", "--layers", "2", "--phase", "prefill", "--batch", "2", "--seq", "64",
            "--tp", "4", "--stages", "2", "--out", str(tmp_path), "--json", "--no-progress"]
    code, out, _ = run_cli(capsys, *argv)
    d = json.loads(out)
    assert code == 0 and d["latency_ms"] > 0 and d["tflops_achieved"] > 0
    assert set(d["breakdown_ms"]) == {"compute", "memory", "communication", "idle"}
    assert sum(d["breakdown_ms"].values()) == pytest.approx(d["latency_ms"], rel=1e-6)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["cycles"] == d["cycles"]
    trace = json.loads((tmp_path / "timeline.json").read_text())
    assert any(e["ph"] == "X" for e in trace["traceEvents"])
    with h5py.File(tmp_path / "tasks.h5") as f:
        assert f["tasks/end_cycle"][:].max() == d["cycles"]
    assert not list(tmp_path.glob("*.partial"))
    # the saved program replays to the same time on the same chip and fidelities
    code, out, _ = run_cli(capsys, "replay", str(tmp_path / "program.h5"), "--json", "--no-progress")
    assert code == 0 and json.loads(out)["cycles"] == d["cycles"]


def test_bad_inputs_are_one_line_errors(capsys, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nclock_ghz: 1\ncores: {grid: {width: 2, hieght: 2}}\n")
    code, _, err = run_cli(capsys, "info", str(bad))
    assert code == 2 and "did you mean 'height'" in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "gemm", "--m", "0", "--k", "1", "--n", "1")
    assert code == 2 and "error" in err
    code, _, err = run_cli(capsys, "run", "--model", "qwen3-4bb", "--no-progress")
    assert code == 2 and "qwen3-4b" in err
    code, _, err = run_cli(capsys, "run", "--batch", "0", "--no-progress")
    assert code == 2 and "--batch" in err
    code, _, err = run_cli(capsys, "mem", "--bytes", "lots")
    assert code == 2 and err.count("\n") == 1 and "--bytes" in err


def test_console_script_runs_as_module():
    out = subprocess.run([sys.executable, "-m", "npusim", "info", "--json"], capture_output=True, text=True)
    assert out.returncode == 0 and "peak_tflops" in out.stdout


def test_run_an_exported_onnx_model(capsys):
    code, out, _ = run_cli(capsys, "run", "--model", "examples/onnx/qwen3_tiny_opset18.onnx", "--phase", "prefill",
                           "--batch", "2", "--seq", "64", "--tp", "4", "--stages", "1", "--json", "--no-progress")
    d = json.loads(out)
    assert code == 0 and d["latency_ms"] > 0 and d["flops"] > 0


def test_no_progress_bar_leaves_tqdm_unimported():
    """``--no-progress`` costs no start-up: the disabled bar is a no-op callback, tqdm (and the
    multiprocessing lock it creates) is never imported (issue 42 item 6: the peers' PD case is a
    ~1 s process)."""
    code = ("import sys\n"
            "from npusim.cli.progress import request_progress, task_progress\n"
            "with request_progress(3, enabled=False) as p:\n"
            "    p(0.5, 1, 3)\n"
            "with task_progress(1.0, enabled=False) as p:\n"
            "    p(10, 1, 0)\n"
            "print('tqdm' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
