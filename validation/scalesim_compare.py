#!/usr/bin/env python3
"""Compare npusim's systolic-array GEMM model with SCALE-Sim 3.0.0.

For LLM-shaped GEMMs (Qwen3-4B projections: hidden 2560, 32 q heads x 128,
8 kv heads x 128 = 1024, FFN 9728; whole projections where SCALE-Sim can run
them in seconds, otherwise the per-core shard of a tensor-parallel split), both
dataflows and square arrays of 32, 64 and 128 PEs, this script runs

* npusim: ``gemm_cost(m, k, n, R, R, df, weight_injection_cycles=R)`` -- SCALE-Sim
  shifts a weight tile in one array row per cycle, so T_inj = R; serial folds;
* SCALE-Sim 3.0.0 in its own venv (subprocess; needs numpy < 2.4), GEMM mode
  (topology columns M, N, K), ``InterfaceBandwidth: CALC`` (stall-free), and
  reads ``Total Cycles`` and ``Stall Cycles`` of COMPUTE_REPORT.csv and the SRAM
  read counts of DETAILED_ACCESS_REPORT.csv,

and prints shape, array, dataflow, npusim cycles, SCALE-Sim stall-free cycles
(Total - Stall), their difference and error %, whether the SRAM operand reads
agree, and the wall time of each tool.  SCALE-Sim builds cycle-by-cycle demand
matrices in Python (about 0.15-0.3 ms per simulated cycle here), so the shapes
are chosen to keep the whole default run to a few minutes on 2 cores.

Usage:
    python validation/scalesim_compare.py [--quick] [--jobs 2] [--markdown]
                                          [--scalesim-python PATH]

Exit status: 0 ok, 2 SCALE-Sim's python missing or unusable, 1 a run failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from npusim.hw.compute import gemm_cost  # noqa: E402

DEFAULT_SCALESIM_PYTHON = "/tmp/scalesim-venv/bin/python"
SETUP_HINT = (
    "SCALE-Sim 3.0.0 needs its own venv (it requires numpy < 2.4):\n"
    "    python3 -m venv /tmp/scalesim-venv\n"
    "    /tmp/scalesim-venv/bin/pip install 'numpy<2.4' scalesim==3.0.0\n"
    "then rerun, or pass --scalesim-python /path/to/that/venv/bin/python"
)

# SCALE-Sim 3.0.0 config; every section is read by scale_config.read_conf_file.
CONFIG_TEMPLATE = """\
[general]
run_name = run

[architecture_presets]
ArrayHeight:    {rows}
ArrayWidth:     {cols}
IfmapSramSzkB:   2048
FilterSramSzkB:  2048
OfmapSramSzkB:   2048
IfmapOffset:    0
FilterOffset:   10000000
OfmapOffset:    20000000
Bandwidth : 10
Dataflow : {dataflow}
MemoryBanks:   1
ReadRequestBuffer: 32
WriteRequestBuffer: 32

[layout]
IfmapCustomLayout: False
IfmapSRAMBankBandwidth: 10
IfmapSRAMBankNum: 10
IfmapSRAMBankPort: 2
FilterCustomLayout: False
FilterSRAMBankBandwidth: 10
FilterSRAMBankNum: 10
FilterSRAMBankPort: 2

[sparsity]
SparsitySupport : false
SparseRep : ellpack_block
OptimizedMapping : false
BlockSize : 8
RandomNumberGeneratorSeed : 40

[run_presets]
InterfaceBandwidth: CALC
UseRamulatorTrace: False
"""

# Runs inside SCALE-Sim's venv: argv = run directory holding c.cfg, t.csv, l.csv.
RUNNER = r'''
import json, os, sys, time, contextlib, io
from scalesim.scale_sim import scalesim
d = sys.argv[1]
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()):
    s = scalesim(save_disk_space=True, verbose=False, config=d + "/c.cfg",
                 topology=d + "/t.csv", layout=d + "/l.csv", input_type_gemm=True)
    s.run_scale(top_path=d)
sim_s = time.perf_counter() - t0
def row(name):
    lines = open(os.path.join(d, "run", name)).read().strip().splitlines()
    return [x.strip() for x in lines[1].split(",")]
c = row("COMPUTE_REPORT.csv")
a = row("DETAILED_ACCESS_REPORT.csv")
print(json.dumps({"total": int(float(c[2])), "stall": int(float(c[3])),
                  "ifmap_reads": int(float(a[3])), "filter_reads": int(float(a[6])),
                  "sim_s": sim_s}))
'''


@dataclass(frozen=True)
class Case:
    label: str
    m: int
    k: int
    n: int
    arrays: tuple[int, ...]


# Qwen3-4B: hidden 2560, q 4096 (32x128), kv 1024 (8x128), FFN 9728.  "/tpN" = the
# per-core shard of an N-way tensor-parallel split of the output (or K) dimension.
CASES_FULL = [
    Case("toy 4x4x4", 4, 4, 4, (4,)),
    Case("toy 5x9x7 (padding)", 5, 9, 7, (4,)),
    Case("decode o_proj (full)", 1, 2560, 2560, (128,)),
    Case("decode k/v_proj (full)", 16, 2560, 1024, (64, 128)),
    Case("decode up_proj /tp32", 64, 2560, 304, (32, 64, 128)),
    Case("decode down_proj /tp32", 32, 304, 2560, (32, 64, 128)),
    Case("prefill q_proj /tp16", 128, 2560, 256, (32, 64, 128)),
    Case("prefill k/v_proj /tp8", 256, 2560, 128, (32, 64, 128)),
    Case("prefill up_proj /tp32", 512, 2560, 304, (128,)),
    Case("prefill q_proj /tp64", 2048, 2560, 64, (128,)),
]
CASES_QUICK = [
    Case("toy 4x4x4", 4, 4, 4, (4,)),
    Case("toy 5x9x7 (padding)", 5, 9, 7, (4,)),
    Case("decode up_proj /tp32", 64, 2560, 304, (128,)),
    Case("decode down_proj /tp32", 32, 304, 2560, (64,)),
    Case("prefill k/v_proj /tp8", 256, 2560, 128, (128,)),
]
DATAFLOWS = ("ws", "os")


@dataclass
class Result:
    case: Case
    array: int
    dataflow: str
    npusim_cycles: int
    npusim_db_cycles: int
    npusim_us: float
    npusim_reads: int
    scalesim_cycles: int | None = None
    scalesim_stall: int | None = None
    scalesim_reads: int | None = None
    scalesim_wall_s: float | None = None
    error: str | None = None

    @property
    def diff(self) -> int:
        return self.npusim_cycles - self.scalesim_cycles

    @property
    def err_pct(self) -> float:
        return 100.0 * self.diff / self.scalesim_cycles


def run_npusim(case: Case, array: int, dataflow: str) -> Result:
    """Cost one configuration with npusim and time it (mean of repeated calls)."""
    args = (case.m, case.k, case.n, array, array, dataflow)
    cost = gemm_cost(*args, weight_injection_cycles=array)
    reps = 2000
    t0 = time.perf_counter()
    for _ in range(reps):
        gemm_cost(*args, weight_injection_cycles=array)
    us = (time.perf_counter() - t0) / reps * 1e6
    db = gemm_cost(*args, weight_injection_cycles=array, double_buffer=True).cycles
    return Result(case, array, dataflow, cost.cycles, db, us,
                  cost.a_read_elems + cost.b_read_elems)


def run_scalesim(python: str, workdir: Path, res: Result) -> Result:
    """Run SCALE-Sim on one configuration in a subprocess; fill ``res`` in place."""
    c = res.case
    d = workdir / f"{c.m}x{c.k}x{c.n}_{res.array}_{res.dataflow}"
    d.mkdir(parents=True, exist_ok=True)
    (d / "c.cfg").write_text(CONFIG_TEMPLATE.format(rows=res.array, cols=res.array,
                                                    dataflow=res.dataflow))
    # GEMM topology: Layer, M, N, K -- each row must end with a comma
    (d / "t.csv").write_text(f"Layer, M, N, K,\ngemm, {c.m}, {c.n}, {c.k},\n")
    (d / "l.csv").write_text("Layer name,\n")   # layouts unused (no custom layout)
    runner = workdir / "runner.py"
    t0 = time.perf_counter()
    proc = subprocess.run([python, str(runner), str(d)], capture_output=True, text=True)
    res.scalesim_wall_s = time.perf_counter() - t0
    if proc.returncode != 0:
        res.error = (proc.stderr.strip().splitlines() or ["exit %d" % proc.returncode])[-1]
        return res
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    res.scalesim_stall = out["stall"]
    res.scalesim_cycles = out["total"] - out["stall"]
    res.scalesim_reads = out["ifmap_reads"] + out["filter_reads"]
    return res


def check_scalesim_python(python: str) -> None:
    """Exit 2 with setup instructions unless ``python`` can import scalesim."""
    if not Path(python).exists():
        print(f"SCALE-Sim python not found: {python}\n{SETUP_HINT}", file=sys.stderr)
        sys.exit(2)
    probe = subprocess.run([python, "-c", "import scalesim.scale_sim"], capture_output=True,
                           text=True)
    if probe.returncode != 0:
        print(f"{python} cannot import scalesim:\n{probe.stderr.strip()}\n{SETUP_HINT}",
              file=sys.stderr)
        sys.exit(2)


COLUMNS = ("shape (MxKxN)", "array", "df", "npusim", "SCALE-Sim", "diff", "err %",
           "SRAM reads", "npusim db", "npusim us", "SCALE-Sim s")


def table_rows(results: list[Result]) -> list[tuple[str, ...]]:
    rows = []
    for r in results:
        c = r.case
        shape = f"{c.label}: {c.m}x{c.k}x{c.n}"
        if r.error:
            rows.append((shape, f"{r.array}x{r.array}", r.dataflow, str(r.npusim_cycles),
                         "FAILED", "", "", "", str(r.npusim_db_cycles), f"{r.npusim_us:.1f}",
                         f"{r.scalesim_wall_s:.1f}"))
            continue
        reads = "equal" if r.npusim_reads == r.scalesim_reads else \
            f"{r.npusim_reads} vs {r.scalesim_reads}"
        rows.append((shape, f"{r.array}x{r.array}", r.dataflow, str(r.npusim_cycles),
                     str(r.scalesim_cycles), f"{r.diff:+d}", f"{r.err_pct:+.4f}", reads,
                     str(r.npusim_db_cycles), f"{r.npusim_us:.1f}", f"{r.scalesim_wall_s:.1f}"))
    return rows


def print_table(results: list[Result], markdown: bool) -> None:
    rows = table_rows(results)
    if markdown:
        print("| " + " | ".join(COLUMNS) + " |")
        print("|" + "|".join("---" for _ in COLUMNS) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(COLUMNS)]
    print("  ".join(h.ljust(w) for h, w in zip(COLUMNS, widths)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(v.ljust(w) if i < 3 else v.rjust(w)
                        for i, (v, w) in enumerate(zip(row, widths))))


def time_vectorised(n: int = 10_000) -> float:
    """Seconds for gemm_cycles_array to cost ``n`` random LLM-sized GEMMs (after warm-up)."""
    import numpy as np

    from npusim.hw.compute import gemm_cycles_array

    rng = np.random.default_rng(0)
    m, k, n_ = (rng.integers(1, 8192, size=n) for _ in range(3))
    gemm_cycles_array(m[:2], k[:2], n_[:2], 128, 128, "ws", 1, 128)   # compile / load cache
    t0 = time.perf_counter()
    gemm_cycles_array(m, k, n_, 128, 128, "ws", 1, 128)
    return time.perf_counter() - t0


def print_summary(results: list[Result], npusim_s: float, scalesim_s: float) -> None:
    ok = [r for r in results if not r.error]
    print()
    for df in DATAFLOWS:
        sel = [r for r in ok if r.dataflow == df]
        if sel:
            diffs = sorted({r.diff for r in sel})
            print(f"{df}: {len(sel)} runs, npusim - SCALE-Sim in {diffs} cycles, "
                  f"max |err| {max(abs(r.err_pct) for r in sel):.4f} %, "
                  f"mean |err| {sum(abs(r.err_pct) for r in sel) / len(sel):.4f} %")
    reads_eq = sum(r.npusim_reads == r.scalesim_reads for r in ok)
    print(f"SRAM operand reads (A+B elements) equal in {reads_eq}/{len(ok)} runs")
    print(f"stall cycles reported by SCALE-Sim: {sorted({r.scalesim_stall for r in ok})}")
    print(f"wall time: npusim {npusim_s * 1e3:.1f} ms total for all configurations; "
          f"SCALE-Sim {scalesim_s:.1f} s summed over runs")
    print(f"npusim gemm_cycles_array (numba): {time_vectorised() * 1e3:.2f} ms for 10000 GEMMs")
    failed = [r for r in results if r.error]
    for r in failed:
        print(f"FAILED {r.case.label} {r.array} {r.dataflow}: {r.error}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scalesim-python", default=DEFAULT_SCALESIM_PYTHON,
                    help=f"python of a venv with scalesim==3.0.0 (default {DEFAULT_SCALESIM_PYTHON})")
    ap.add_argument("--quick", action="store_true", help="small subset (about half a minute)")
    ap.add_argument("--jobs", type=int, default=2, help="parallel SCALE-Sim runs (default 2)")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args(argv)
    check_scalesim_python(args.scalesim_python)

    cases = CASES_QUICK if args.quick else CASES_FULL
    t0 = time.perf_counter()
    results = [run_npusim(c, a, df) for c in cases for a in c.arrays for df in DATAFLOWS]
    npusim_s = sum(r.npusim_us for r in results) * 1e-6
    print(f"# machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}; SCALE-Sim jobs: {args.jobs}", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="scalesim_cmp_") as tmp:
        work = Path(tmp)
        (work / "runner.py").write_text(RUNNER)
        order = sorted(results, key=lambda r: -r.npusim_cycles)  # longest first
        with cf.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = {pool.submit(run_scalesim, args.scalesim_python, work, r): r for r in order}
            for i, fut in enumerate(cf.as_completed(futures), 1):
                r = fut.result()
                print(f"  [{i}/{len(results)}] {r.case.label} {r.array}x{r.array} {r.dataflow}: "
                      f"{r.scalesim_wall_s:.1f} s", file=sys.stderr)
    scalesim_s = sum(r.scalesim_wall_s for r in results)
    print_table(results, args.markdown)
    print_summary(results, npusim_s, scalesim_s)
    print(f"(elapsed {time.perf_counter() - t0:.1f} s)")
    return 1 if any(r.error for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
