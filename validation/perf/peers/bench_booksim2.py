"""npusim's flit NoC beside BookSim2 on the same machine and the same case (issue 42, item 6).

The case is BookSim2's own sample configuration ``runfiles/meshconfig``: an 8x8 mesh, dimension-order
routing, 16 VCs x 8-flit buffers, iSLIP allocators, 1-flit packets, uniform random traffic at
0.2 flits/node/cycle, 3 warm-up periods of 1,000 cycles then sampling until its latency converges
(6,110 cycles on BookSim2's commit here). npusim runs ``npusim noc`` with the same parameters and
BookSim2's router conventions (``--booksim-compatible``; ``--router-stages 3``: meshconfig's
routing_delay 0 + VC, switch allocation and switch traversal of a cycle each) for the cycles BookSim2
simulated; the latency and accepted rate of both are printed, so the two runs can be seen to agree.

Columns, each the median of ``--repeat`` runs:

* ``sim s``: the simulation phase. BookSim2: its own ``Total run time`` (the wall time of its
  ``Simulate()``; configuration parsing and network construction are before it, process start-up
  not in it). npusim: ``wall_seconds`` of its JSON (state building and the run; Numba kernels
  loaded from the disk cache before it). The ratio is BookSim2's over npusim's.
* ``process wall / cpu s``: the whole process as a shell runs it (npusim's includes Python's
  start-up and loading its Numba cache, ~1 s that no C++ program pays).
* ``M rc/s``: router-cycles simulated per second of the simulation phase.

No BookSim2 code or build recipe is in this repository (the fetch tool's terms: nothing that builds a
fetched program is committed); build it per its own README and pass the binary::

    python validation/perf/peers/bench_booksim2.py --booksim PATH/TO/booksim2/src/booksim [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from bench_npu_sim import load_avg, timed  # noqa: E402
from machine import machine_line, user_env  # noqa: E402

MESH, RATE, VCS, BUF = 8, 0.2, 16, 8
#: BookSim2's runfiles/meshconfig, the values it sets (everything else at BookSim2's defaults)
BOOKSIM_CONFIG = f"""
num_vcs = {VCS}; vc_buf_size = {BUF}; wait_for_tail_credit = 1;
vc_allocator = islip; sw_allocator = islip; alloc_iters = 2;
credit_delay = 2; routing_delay = 0; vc_alloc_delay = 1; sw_alloc_delay = 1; st_final_delay = 1;
input_speedup = 1; output_speedup = 1; internal_speedup = 1.0;
sim_type = latency; warmup_periods = 3; sample_period = 1000; sim_count = 1;
topology = mesh; k = {MESH}; n = 2; routing_function = dor;
packet_size = 1; use_read_write = 0; traffic = uniform; injection_rate = {RATE};
"""
TARGET = 5.0


def run_booksim(binary: str, repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "meshconfig"
        cfg.write_text(BOOKSIM_CONFIG)
        runs = []
        for _ in range(repeat):
            load = load_avg()
            wall, cpu, p = timed([binary, str(cfg)], cwd=Path(tmp))
            out = p.stdout
            cycles = re.search(r"Time taken is (\d+) cycles", out)
            sim = re.search(r"Total run time ([0-9.]+)", out)
            lat = re.search(r"Packet latency average = ([0-9.]+)", out)
            acc = re.search(r"Accepted flit rate average = ([0-9.]+)", out)
            if not (cycles and sim):
                raise SystemExit(f"{binary}: no 'Time taken' / 'Total run time' in its output (exit {p.returncode})")
            runs.append(dict(wall=wall, cpu=cpu, sim=float(sim.group(1)), cycles=int(cycles.group(1)),
                             latency=float(lat.group(1)) if lat else float("nan"),
                             accepted=float(acc.group(1)) if acc else float("nan"), load=load))
    return _median(runs)


def run_npusim(cycles: int, repeat: int) -> dict:
    warmup = 3000
    argv = [sys.executable, "-m", "npusim", "noc", "--mesh", f"{MESH}x{MESH}", "--rate", str(RATE),
            "--vcs", str(VCS), "--buffer-flits", str(BUF), "--booksim-compatible", "--router-stages", "3",
            "--warmup", str(warmup),
            "--cycles", str(max(cycles - warmup, 1)), "--json"]
    env = user_env()
    timed(argv, env=env)  # loads (or on a cold cache compiles) the Numba kernels once
    runs = []
    for _ in range(repeat):
        load = load_avg()
        wall, cpu, p = timed(argv, env=env)
        if p.returncode:
            raise SystemExit(f"npusim failed ({p.returncode}): {' '.join(argv)}")
        js = json.loads(p.stdout)
        runs.append(dict(wall=wall, cpu=cpu, sim=js["wall_seconds"], cycles=js["cycles_simulated"],
                         latency=js["avg_packet_latency_cycles"], accepted=js["accepted_flits_per_node_cycle"],
                         load=load))
    return _median(runs)


def _median(runs: list[dict]) -> dict:
    runs = sorted(runs, key=lambda r: r["sim"])
    out = dict(runs[len(runs) // 2])
    out["sim_all"] = [round(r["sim"], 3) for r in runs]
    out["mrcs"] = MESH * MESH * out["cycles"] / out["sim"] / 1e6
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--booksim", required=True, help="path of a built BookSim2 binary (booksim2/src/booksim)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs of each program (the median is shown)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()
    if not Path(args.booksim).is_file():
        raise SystemExit(f"--booksim {args.booksim}: no such file (build BookSim2 per its README, pass src/booksim)")
    book = run_booksim(args.booksim, max(args.repeat, 1))
    ours = run_npusim(book["cycles"], max(args.repeat, 1))
    ratio = book["sim"] / ours["sim"]
    if args.json:
        print(json.dumps({"case": f"{MESH}x{MESH} mesh uniform {RATE}", "booksim2": book, "npusim": ours,
                          "sim_ratio": ratio, "target": TARGET, "machine": machine_line()}, indent=1))
        return
    print(f"case: {MESH}x{MESH} mesh, uniform {RATE} flits/node/cycle, 1-flit packets, {VCS} VCs x {BUF} flits "
          "(BookSim2's runfiles/meshconfig)")
    print(f"{'program':>9} {'cycles':>7} {'sim s':>7} {'M rc/s':>7} {'proc wall':>9} {'proc cpu':>8} "
          f"{'latency':>8} {'accepted':>8} {'load':>15}")
    for name, r in (("BookSim2", book), ("npusim", ours)):
        print(f"{name:>9} {r['cycles']:>7} {r['sim']:>7.3f} {r['mrcs']:>7.2f} {r['wall']:>9.2f} {r['cpu']:>8.2f} "
              f"{r['latency']:>8.2f} {r['accepted']:>8.4f} {r['load']:>15}")
    verdict = "meets" if ratio >= TARGET else "misses"
    print(f"npusim's simulation phase is {ratio:.1f}x BookSim2's ({verdict} the issue's {TARGET:.0f}x); "
          f"whole process {book['wall'] / ours['wall']:.1f}x (wall), {book['cpu'] / ours['cpu']:.1f}x (cpu)")
    print(machine_line())
    print(f"sim phase of every run: BookSim2 {book['sim_all']}, npusim {ours['sim_all']} "
          f"(spread: {statistics.pstdev(book['sim_all']):.3f} / {statistics.pstdev(ours['sim_all']):.3f} s)")


if __name__ == "__main__":
    main()
