"""npusim against NPU-SIM (issue 25, item 2): npusim's whole-process time on NPU-SIM's own
example scale beside NPU-SIM's simulation phase; the issue's target is 10x.

Cases, each from a configuration shipped with NPU-SIM (github.com/doulujiyao12/npu-sim, also
UNIQUEDDHY/WaferAI-SIM), and the closest npusim command:

* ``pd16``: PD fusion serving on a 16-core chip. NPU-SIM: ``llm/test/llama3.2_0.5B/pd_fuse_16*1.json``
  (hidden 1280, 20 heads of 64, K/V heads 20/R with R = 2, FFN 4C SwiGLU, 16 pipeline stages of one
  layer and one core each; prompts of 128 tokens in 4 chunks, 2 / eof_chance = 20 output tokens, all
  arriving at 1 ns) with ``requests.count`` 20 -> 10 and the fields its current parser wants
  (``_patch_pd_llama``), on ``core_4x4.json`` with ``--sram-max`` 32 MiB. npusim: the same model as a
  config file (16 layers, 10 K/V heads, vocabulary 256: the embedding and LM head, which NPU-SIM
  does not simulate, cost next to nothing) on npusim-64c's cores in a 4x4 mesh, TP 1 x 16 stages,
  10 requests of 128 -> 20 tokens at once, chunks of 32, budget 33 (one chunk and one decode, as
  NPU-SIM's 5 credits: 4 a chunk, 1 a decode). A second row runs it with ``--iteration-cache off``
  (NPU-SIM simulates every iteration).
* ``pd16toy``: NPU-SIM's ``llm/test/chores/pd_fuse.json`` unchanged: 10 requests, PD fusion, the
  default 16 cores as 2 instances of 4 stages x TP 2; hidden 512, prompts of 64 in 2 chunks, 4
  output tokens; every stage runs only LayerNorm and the QKV GEMM (a parser test). npusim: 4 GPT-2
  layers of hidden 512, TP 2 x 4 stages x 2 replicas, 10 requests of 64 -> 4 tokens.
* ``tpk240``: one TP-K prefill on a 64-core chip. NPU-SIM: ``llm/test/gpt2_small/tp/
  tp_k_seq_1024_2048.json`` (GPT-2 blocks, hidden 2048, 16 heads of 128, batch 1, 1,024 tokens; 12
  pipeline stages of TP-4 K-split groups, each looping its block L = 20 times: 240 layers on 48 of
  the 64 cores), brought to its current primitive names (``_patch_tp_k``), on ``core_8x8_32M.json``
  (8x8, 128x128 arrays, 32 MiB SRAM). npusim: ``npusim run --phase prefill --batch 1 --seq 1024`` of
  the same 240-layer model on npusim-64c, ``--partition tp_k --tp 4 --stages 12``.

Differences that stay: fidelity (npusim's default NoC at the path level and analytical HBM;
NPU-SIM's default build a behavioural NoC, ``USE_BEHA_NOC 1``, and behavioural per-core DRAM,
``--beha_dram true``), clocks (NPU-SIM 2 ns a cycle, npusim-64c 1 GHz), npusim's HBM stacks at the
mesh edge vs NPU-SIM's DRAM per core, the schedulers, npusim's iteration cache (on by default for
one instance), NPU-SIM's toy stages (LayerNorm + QKV only) vs npusim's whole layers.

Times: npusim's whole process as a user's shell runs it (a subprocess with Python's bytecode cache
on, ``machine.user_env``; Numba cache warm: one run first; ``--python`` picks the environment, e.g.
a fresh venv with only npusim installed, as a user gets it: the line under the table says whether
that environment has scipy, which Numba imports at start-up when present), wall and CPU (user + system) seconds of the median run by wall time of ``--repeat``.
NPU-SIM's simulation phase is the time it prints itself (``花费了 X 秒``, appended to
``simulation_result_df_pd.txt`` too: ``clock()`` CPU seconds of ``sc_main``, config parsing and
elaboration included, process start-up not), median of ``--npu-sim-repeat`` runs with stdout to
/dev/null and ``--verbose-level 0`` (its least logging; one run with its output kept comes first
for the simulated time), its whole-process wall and CPU beside it. Ratio: NPU-SIM's simulation
phase over npusim's whole-process CPU time (both CPU: wall times follow the load of a shared
machine; the wall ratio is printed too). Load averages are shown beside every timing.

Without ``--npu-sim`` the NPU-SIM columns come from ``npu_sim_timings.yaml`` (date, machine, commit,
commands, config changes, times and load of the recorded measurement). With ``--npu-sim DIR``, DIR
is an NPU-SIM checkout whose ``build/npusim`` was built per NPU-SIM's own README (it needs SystemC
2.3.x, SFML, Cairo, nlohmann-json and CMake; its CMakeLists compiles with ``-Ofast``); the runs
happen in ``DIR/build`` (NPU-SIM reads ``../DRAMSys/configs`` and writes logs there); ``--record``
rewrites ``npu_sim_timings.yaml``. The build steps used for the recorded numbers are in the
measurement's report, not in this repository (no build recipe for third-party code is kept here).

    python validation/perf/bench_npu_sim.py [--repeat 3] [--cases pd16,pd16toy,tpk240] [--no-cache-off]
        [--python v/bin/python]
    python validation/perf/bench_npu_sim.py --npu-sim DIR [--npu-sim-repeat 3] [--record]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import environment_line, git_head, machine_line, user_env  # noqa: E402

from npusim.cli.util import positive_int  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
TIMINGS = HERE / "npu_sim_timings.yaml"
TARGET = 10.0

#: npusim-64c's cores on NPU-SIM's default 4x4 mesh
ARCH_16C = "extends: npusim-64c\nname: npusim-16c\ncores: {grid: {width: 4, height: 4}}\n"
#: NPU-SIM's llama3.2_0.5B PD configurations' model (``config_helper_pd``: C = heads x head_size,
#: R = heads / kv_heads = 2 by integer division, QKV width C + 2C/R, FFN 4C with SwiGLU, RMSNorm, RoPE)
MODEL_PD = {"name": "npu-sim-llama3.2-0.5B", "family": "llama", "vocab_size": 256, "hidden_size": 1280,
            "num_layers": 16, "num_heads": 20, "num_kv_heads": 10, "head_dim": 64, "intermediate_size": 5120,
            "max_position_embeddings": 4096}
#: NPU-SIM's tp_k_seq_1024_2048 model: GPT-2 blocks (LayerNorm, fused QKV 3C, GELU FFN 4C), C = 2048,
#: 16 heads of 128, 12 stages x L = 20 blocks
MODEL_TPK = {"name": "npu-sim-gpt2-2048x240", "family": "gpt2", "vocab_size": 256, "hidden_size": 2048,
             "num_layers": 240, "num_heads": 16, "num_kv_heads": 16, "head_dim": 128, "intermediate_size": 8192,
             "norm": "layernorm", "activation": "gelu", "gated_ffn": False, "tie_word_embeddings": True,
             "bias": True, "rope": False, "max_position_embeddings": 2048, "fused_qkv": True}
#: NPU-SIM's chores/pd_fuse.json (hidden 8 x 64 = 512, 4 stages of TP 2 on each half of the 4x4
#: mesh): a toy whose stages run only LayerNorm and the QKV GEMM; npusim runs 4 whole GPT-2 layers
MODEL_TOY = {"name": "npu-sim-chores-pd", "family": "gpt2", "vocab_size": 256, "hidden_size": 512,
             "num_layers": 4, "num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "intermediate_size": 2048,
             "norm": "layernorm", "activation": "gelu", "gated_ffn": False, "tie_word_embeddings": True,
             "bias": True, "rope": False, "max_position_embeddings": 2048, "fused_qkv": True}


def _patch_pd_llama(cfg: dict) -> list[str]:
    """NPU-SIM's llama3.2_0.5B PD configurations predate its current parser: in PD mode every
    worklist entry needs a ``cast`` list and ``rope_forward_pd`` a ``job_type``."""
    done = []
    cfg["requests"]["count"] = 10
    done.append("requests.count 20 -> 10")
    for core in cfg["chips"][0]["cores"]:
        for work in core["worklist"]:
            if "cast" not in work:
                work["cast"] = []
                done.append("worklist cast: [] added")
            for prim in work["prims"]:
                if prim["type"] == "rope_forward_pd" and "job_type" not in prim:
                    prim["job_type"] = 2  # JOB_BOTH, as config_helper_pd's cores (PD fusion)
                    done.append("rope_forward_pd job_type: 2 (JOB_BOTH) added")
    return sorted(set(done), key=done.index)


def _patch_tp_k(cfg: dict) -> list[str]:
    """NPU-SIM's gpt2_small/tp configurations predate its current primitives: ``Matmul_f_pd`` is
    now ``matmul_forward_pd`` (with R, chunk and job_type), ``Attention_f_pd`` takes a job_type,
    sources an ``is_end``; filled as the current-format chores/dataflow_tp.json (the same 48-core
    TP-4 x 12-stage template at toy size) has them: R = 1, CHUNK = 1, job_type 2, is_end false."""
    done = []
    for v in ("R", "CHUNK"):
        if v not in cfg["vars"]:
            cfg["vars"][v] = 1
            done.append(f"vars {v} = 1 added")
    for src in cfg["source"]:
        if "is_end" not in src:
            src["is_end"] = False
            done.append("source is_end: false added")
    for core in cfg["chips"][0]["cores"]:
        for work in core["worklist"]:
            for prim in work.get("prims", []):
                if prim["type"] == "Matmul_f_pd":
                    prim.update(type="matmul_forward_pd", R="R", chunk="CHUNK", job_type=2)
                    done.append("Matmul_f_pd -> matmul_forward_pd (R, chunk CHUNK, job_type 2)")
                if prim["type"] == "Attention_f_pd" and "job_type" not in prim:
                    prim["job_type"] = 2
                    done.append("Attention_f_pd job_type: 2 added")
    return sorted(set(done), key=done.index)


@dataclass(frozen=True)
class Case:
    key: str
    name: str
    npusim: list[str]  # ``{arch}`` / ``{model}`` are filled with files written at start
    model: dict
    arch: str | None
    npu_sim_config: str  # relative to the NPU-SIM checkout
    npu_sim_core_config: str
    npu_sim_flags: list[str] = field(default_factory=list)
    npu_sim_patch: Callable[[dict], list[str]] | None = None  # edits a copy of the config, says what
    serving: bool = False
    cache_off_row: bool = False


#: every NPU-SIM run: its least logging (plain couts stay; stdout goes to /dev/null when timed)
NPU_SIM_FLAGS = ["--verbose-level", "0"]
#: NPU-SIM's core_4x4.json has no sram_size: npusim-64c's 32 MiB a core instead of its 8 MiB default
SRAM_32M = ["--sram-max", "33554432"]

CASES = [
    Case("pd16", "16 cores, PD fusion, 10 requests (llama 0.5B)",
         ["run", "--arch", "{arch}", "--model", "{model}", "--requests", "10", "--input-len", "128",
          "--output-len", "20", "--rate", "1e9", "--tp", "1", "--stages", "16", "--chunk", "32",
          "--budget", "33", "--no-progress", "--json"],
         MODEL_PD, ARCH_16C,
         "llm/test/llama3.2_0.5B/pd_fuse_16*1.json", "llm/test/core_configs/core_4x4.json",
         SRAM_32M, _patch_pd_llama, serving=True, cache_off_row=True),
    Case("pd16toy", "16 cores, PD fusion, 10 requests (chores toy)",
         ["run", "--arch", "{arch}", "--model", "{model}", "--requests", "10", "--input-len", "64",
          "--output-len", "4", "--rate", "1e9", "--tp", "2", "--stages", "4", "--replicas", "2",
          "--chunk", "32", "--budget", "33", "--no-progress", "--json"],
         MODEL_TOY, ARCH_16C,
         "llm/test/chores/pd_fuse.json", "llm/test/core_configs/core_4x4.json", SRAM_32M, serving=True),
    Case("tpk240", "64 cores, TP-K prefill, 240 layers",
         ["run", "--model", "{model}", "--phase", "prefill", "--batch", "1", "--seq", "1024",
          "--partition", "tp_k", "--tp", "4", "--stages", "12", "--no-progress", "--json"],
         MODEL_TPK, None,
         "llm/test/gpt2_small/tp/tp_k_seq_1024_2048.json", "llm/test/core_configs/core_8x8_32M.json",
         [], _patch_tp_k),
]


def load_avg() -> str:
    return "{:.2f} {:.2f} {:.2f}".format(*os.getloadavg())


def timed(argv: list[str], cwd: Path | None = None, env: dict | None = None,
          stdout=subprocess.PIPE) -> tuple[float, float, subprocess.CompletedProcess]:
    """Wall and CPU (user + system) seconds of one subprocess, and the process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=env, stdout=stdout, stderr=subprocess.DEVNULL, text=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), p


def median_run(runs: list[dict]) -> dict:
    """The median run by wall time (its CPU time with it), with the spread of both."""
    runs = sorted(runs, key=lambda r: r["wall_s"])
    out = dict(runs[len(runs) // 2])
    out["wall_all"] = [round(r["wall_s"], 3) for r in runs]
    out["cpu_all"] = [round(r["cpu_s"], 3) for r in runs]
    return out


def npusim_simulated(case: Case, js: dict) -> str:
    if case.serving:
        return (f"{js['requests_completed']} req, {js['iterations']} iterations, {js['simulated_s'] * 1e3:.1f} ms "
                f"simulated, mean TTFT {js['ttft_ms']['mean']:.1f} ms, TBT {js['tbt_ms']['mean']:.2f} ms")
    return f"latency {js['latency_ms']:.1f} ms ({js['cycles']:,} cycles, {js['cores_used']} cores)"


def run_npusim(case: Case, files: dict[str, Path], repeat: int, extra: list[str] = (),
               python: str = sys.executable) -> dict:
    argv = [python, "-m", "npusim"] + [a.format(**files) for a in case.npusim] + list(extra)
    env = user_env(PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    w, c, p = timed(argv, env=env)  # compiles on a cold Numba cache; loads it from disk once
    if p.returncode:
        raise SystemExit(f"npusim failed ({p.returncode}): {' '.join(argv)}")
    runs = []
    for _ in range(repeat):
        load = load_avg()
        w, c, p = timed(argv, env=env)
        runs.append({"wall_s": w, "cpu_s": c, "load": load, "stdout": p.stdout})
    med = median_run(runs)
    med["simulated"] = npusim_simulated(case, json.loads(med.pop("stdout")))
    return med


def npu_sim_config(case: Case, npu_sim: Path, tmp: Path) -> tuple[Path, list[str]]:
    """NPU-SIM's configuration file for the case (a patched copy under ``tmp`` if the case patches
    it) and what was changed."""
    src = npu_sim / case.npu_sim_config
    if case.npu_sim_patch is None:
        return src, []
    cfg = json.loads(src.read_text())
    changes = case.npu_sim_patch(cfg)
    out = tmp / f"{case.key}_{src.name.replace('*', 'x')}"
    out.write_text(json.dumps(cfg, indent=1))
    return out, changes


def npu_sim_command(case: Case, config: Path | str) -> list[str]:
    return ["./npusim", "--config-file", str(config), "--core-config-file", f"../{case.npu_sim_core_config}",
            *case.npu_sim_flags, *NPU_SIM_FLAGS]


def _appended(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def run_npu_sim(case: Case, npu_sim: Path, repeat: int, tmp: Path) -> dict:
    """One run with its output kept (simulated time; it also warms the page cache), then ``repeat``
    timed runs with stdout to /dev/null. Its printed time is read from the file it appends it to
    (``simulation_result_df_pd.txt`` in its working directory)."""
    build = npu_sim / "build"
    if not (build / "npusim").exists():
        raise SystemExit(f"{build / 'npusim'} not found: build NPU-SIM first (see its README)")
    config, changes = npu_sim_config(case, npu_sim, tmp)
    argv = npu_sim_command(case, config)
    result_file = build / "simulation_result_df_pd.txt"
    log_path = tmp / f"{case.key}.log"
    with open(log_path, "w") as log:
        _, _, p = timed(argv, cwd=build, stdout=log)
    catch = re.findall(r"\[CATCH TEST\]\s*(\d+(?:\.\d+)?\s*\w+)", log_path.read_text(errors="replace"))
    if p.returncode or not catch:
        raise SystemExit(f"NPU-SIM failed ({p.returncode}) or finished no simulation (no [CATCH TEST] line): "
                         f"{' '.join(argv)} in {build}; its output: {log_path}")
    runs = []
    for _ in range(repeat):
        load = load_avg()
        offset = result_file.stat().st_size if result_file.exists() else 0
        w, c, p = timed(argv, cwd=build, stdout=subprocess.DEVNULL)
        printed = re.findall(r"花费了([0-9.eE+-]+)秒", _appended(result_file, offset))
        if p.returncode or not printed:
            raise SystemExit(f"NPU-SIM failed ({p.returncode}) or printed no time: {' '.join(argv)} in {build}")
        runs.append({"wall_s": w, "cpu_s": c, "load": load, "sim_phase_s": float(printed[-1])})
    med = median_run(runs)
    med["sim_phase_all"] = sorted(round(r["sim_phase_s"], 3) for r in runs)
    med["sim_phase_s"] = statistics.median(r["sim_phase_s"] for r in runs)
    med["simulated"] = f"{catch[-1]} simulated ([CATCH TEST])"
    med["command"] = " ".join(npu_sim_command(case, case.npu_sim_config + (" (patched copy)" if changes else "")))
    med["config"] = case.npu_sim_config
    med["core_config"] = case.npu_sim_core_config
    med["config_changes"] = changes
    return med


def verdict(ratio: float | None) -> str:
    if ratio is None:
        return "-"
    return "met" if ratio >= TARGET else "not met"


def record(path: Path, peer: dict[str, dict], npu_sim: Path) -> None:
    """Write the NPU-SIM measurements to ``path`` (``--record``)."""
    keep = ("sim_phase_s", "sim_phase_all", "wall_s", "cpu_s", "wall_all", "cpu_all", "load", "simulated",
            "command", "config", "core_config", "config_changes")
    def rounded(v):
        if isinstance(v, float):
            return round(v, 3)
        return [rounded(x) for x in v] if isinstance(v, list) else v

    old = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    data = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "machine": machine_line(),
        "npu_sim_commit": git_head(npu_sim),
        "npu_sim_repository": "github.com/doulujiyao12/npu-sim (also UNIQUEDDHY/WaferAI-SIM)",
        "npu_sim_build": old.get("npu_sim_build", "unknown (fill in: toolchain and library versions)"),
        "measured_with": "python validation/perf/bench_npu_sim.py --npu-sim DIR --record (runs in DIR/build)",
        "sim_phase": "NPU-SIM's own printed time (clock() CPU seconds of sc_main: config parsing and "
                     "elaboration included, process start-up not); wall_s / cpu_s: its whole process",
        "load": "load averages (1, 5, 15 min) just before each timed run; the median run's is kept",
        "cases": {k: {f: rounded(v[f]) for f in keep if f in v} for k, v in peer.items()},
    }
    if "differences" in old:  # written by hand: how the npusim commands differ from these runs
        data["differences"] = old["differences"]
    path.write_text("# NPU-SIM timings for validation/perf/bench_npu_sim.py (written by its --record)\n"
                    + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=110))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=positive_int, default=3, help="npusim runs per case (the median is shown)")
    ap.add_argument("--npu-sim", type=Path, default=None, help="a built NPU-SIM checkout (DIR/build/npusim)")
    ap.add_argument("--npu-sim-repeat", type=positive_int, default=3, help="timed NPU-SIM runs per case")
    ap.add_argument("--record", action="store_true", help=f"with --npu-sim: write {TIMINGS.name}")
    ap.add_argument("--cases", default=",".join(c.key for c in CASES), help="comma-separated case keys")
    ap.add_argument("--python", default=sys.executable,
                    help="the interpreter whose environment runs npusim (e.g. a fresh venv's bin/python, as a "
                         "user installs it; default: this one)")
    ap.add_argument("--no-cache-off", action="store_true",
                    help="leave out the --iteration-cache off row of the llama PD case")
    args = ap.parse_args()
    keys = args.cases.split(",")
    cases = [c for c in CASES if c.key in keys]
    tmp = Path(tempfile.mkdtemp(prefix="npusim-bench-npu-sim-"))

    peer: dict[str, dict] = {}
    if args.npu_sim is not None:
        npu_sim = args.npu_sim.resolve()
        src = f"measured now ({npu_sim}, commit {git_head(npu_sim)[:12]})"
        for case in cases:
            print(f"NPU-SIM {case.key}: {' '.join(npu_sim_command(case, case.npu_sim_config))}", flush=True)
            peer[case.key] = run_npu_sim(case, npu_sim, args.npu_sim_repeat, tmp)
        if args.record:
            record(TIMINGS, peer, npu_sim)
            print(f"recorded in {TIMINGS}")
    else:
        recorded = yaml.safe_load(TIMINGS.read_text()) if TIMINGS.exists() else None
        recorded = recorded or {}
        src = (f"recorded in {TIMINGS.name} ({recorded.get('date', '?')}, commit "
               f"{str(recorded.get('npu_sim_commit', '?'))[:12]})") if recorded else f"none ({TIMINGS.name} missing)"
        for case in cases:
            rec = (recorded.get("cases") or {}).get(case.key)
            if rec and rec.get("sim_phase_s") is not None:
                peer[case.key] = rec
            else:
                reason = (rec or {}).get("not_measured") or recorded.get("not_measured") or "no NPU-SIM timing recorded"
                peer[case.key] = {"not_measured": reason}

    rows = []
    for case in cases:
        files = {}
        if case.arch:
            files["arch"] = tmp / f"{case.key}-arch.yaml"
            files["arch"].write_text(case.arch)
        files["model"] = tmp / f"{case.key}-model.json"
        files["model"].write_text(json.dumps(case.model))
        variants = [("", [])]
        if case.cache_off_row and not args.no_cache_off:
            variants.append((", cache off", ["--iteration-cache", "off"]))
        for suffix, extra in variants:
            ours = run_npusim(case, files, args.repeat, extra, args.python)
            rows.append((case, case.name + suffix, ours, peer[case.key]))

    print(f"\nNPU-SIM timings: {src}")
    head = (f"{'case':<50} {'npusim wall s':>13} {'cpu s':>6} {'load':>15}  {'NPU-SIM sim s':>13} "
            f"{'whole wall/cpu':>15} {'load':>15}  {'ratio cpu':>9} {'ratio wall':>10} {'target':>6}  verdict")
    print(head)
    print("-" * len(head))
    for case, name, ours, theirs in rows:
        if "not_measured" in theirs:
            print(f"{name:<50} {ours['wall_s']:13.2f} {ours['cpu_s']:6.2f} {ours['load']:>15}  "
                  f"not measured ({theirs['not_measured']})")
            continue
        sim = float(theirs["sim_phase_s"])
        r_cpu = sim / ours["cpu_s"] if ours["cpu_s"] > 0 else float("nan")
        r_wall = sim / ours["wall_s"] if ours["wall_s"] > 0 else float("nan")
        whole = f"{float(theirs.get('wall_s', 'nan')):.1f} / {float(theirs.get('cpu_s', 'nan')):.1f}"
        print(f"{name:<50} {ours['wall_s']:13.2f} {ours['cpu_s']:6.2f} {ours['load']:>15}  {sim:13.2f} "
              f"{whole:>15} {str(theirs.get('load', '?')):>15}  {r_cpu:8.1f}x {r_wall:9.1f}x {TARGET:5g}x  "
              f"{verdict(r_cpu)}")
    print("(ratio: NPU-SIM's simulation phase / npusim's whole process; the verdict is on the CPU ratio)")
    print("\nsimulated (not comparable one to one: different fidelities, clocks and memory systems):")
    for case, name, ours, theirs in rows:
        print(f"  {name}: npusim {ours['simulated']}; NPU-SIM {theirs.get('simulated', '-')}")
    print("\nnpusim runs, wall s / cpu s:")
    for _, name, ours, _ in rows:
        print(f"  {name}: {ours['wall_all']} / {ours['cpu_all']}")
    print(machine_line())
    print(environment_line(args.python))


if __name__ == "__main__":
    main()
