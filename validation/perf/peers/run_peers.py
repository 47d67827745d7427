"""Time the peer simulators beside npusim on one machine, in one run (issue 42, item 6).

Runs, one after the other, each printing its own table:

1. ``../shared/machine_speed.py`` (the machine's speed index, so the times can be compared across
   machines);
2. ``bench_booksim2.py --booksim BIN``: BookSim2's 8x8 mesh at 0.2 beside ``npusim noc`` (target:
   npusim's simulation phase >= 5x BookSim2's);
3. ``../bench_npu_sim.py --npu-sim DIR``: NPU-SIM's PD fusion of 10 requests on 16 cores and its
   64-core 240-layer TP-K pass beside the closest ``npusim run`` (target >= 10x NPU-SIM's simulation
   phase). Without ``--npu-sim`` its NPU-SIM columns come from the recorded ``npu_sim_timings.yaml``.

No peer code and no recipe that builds a peer is in this repository (the fetch tool's terms); build
each per its own README and pass the result::

    python validation/perf/peers/run_peers.py --booksim PATH/booksim2/src/booksim --npu-sim PATH/npu-sim [--record]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SPEED = HERE.parents[3] / "shared" / "machine_speed.py"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--booksim", help="a built BookSim2 binary (skipped when absent)")
    ap.add_argument("--npu-sim", help="a built NPU-SIM checkout (DIR/build/npusim); else its recorded timings")
    ap.add_argument("--repeat", default="3", help="timed runs per program and case (default 3)")
    ap.add_argument("--record", action="store_true",
                    help="with --npu-sim: rewrite npu_sim_timings.yaml from this run (bench_npu_sim.py --record)")
    args = ap.parse_args()
    steps = []
    if SPEED.is_file():
        steps.append([sys.executable, str(SPEED)])
    else:
        print(f"({SPEED} not found: no machine speed index)")
    if args.booksim:
        steps.append([sys.executable, str(HERE / "bench_booksim2.py"), "--booksim", args.booksim,
                      "--repeat", args.repeat])
    else:
        print("(no --booksim: BookSim2 skipped)")
    npu = [sys.executable, str(HERE.parent / "bench_npu_sim.py"), "--repeat", args.repeat]
    if args.npu_sim:
        npu += ["--npu-sim", args.npu_sim, "--npu-sim-repeat", args.repeat]
        if args.record:
            npu.append("--record")
    elif args.record:
        raise SystemExit("--record needs --npu-sim (it records NPU-SIM's timings measured in this run)")
    steps.append(npu)
    for argv in steps:
        print(f"\n$ {' '.join(Path(a).name if a.endswith('.py') else a for a in argv[1:])}", flush=True)
        if subprocess.run(argv).returncode:
            raise SystemExit(f"failed: {' '.join(argv)}")


if __name__ == "__main__":
    main()
