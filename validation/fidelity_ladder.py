"""The fidelity ladder on the workloads users run (issue 42, item 3).

Every case is simulated at each rung of the ladder, NoC ``flit`` / ``path`` / ``path+streams`` /
``analytical`` x memory ``tlm`` / ``analytical``; the **reference** is the most detailed rung, flit NoC + TLM memory
(the transaction-level HBM and, on the Ascend dies, the transaction-level L2). The table prints
each rung's result, its error against the reference and its wall time (simulation only: no disk
cache, the Numba kernels warmed up first). At the end, the cheapest rung (least wall time over the
set) whose every case is within 5% of the reference: per level (the NoC with the memory at TLM,
the memory with the NoC at flit) and overall.

Cases (``--quick`` keeps the ones marked Q, and shrinks the ones marked q: under ~5 minutes on 2
cores; the output says what it left out):

* operators on one ascend-910c-die (:class:`~npusim.system.chipcost.ChipCost`, the whole die;
  result: the kernel's time in us)

  - Q  decode GEMM  m=16 k=5120 n=3200 bf16 (a decode batch's projection)
  - q  prefill GEMM m=2048 k=2048 n=7168 int8 (quick: m=512; TLM takes 10-150 s at full size)
  - Q  RMSNorm 256 x 7168 bf16 (vector operator)
  - Q  FlashAttention q=kv=1024, 8 heads, d=128, causal, bf16 (through the mapper)

* forward passes of Qwen3-4B on npusim-64c, first 2 layers (``npusim run --forward --layers 2``;
  :func:`npusim.scenarios.run.run_summary`; result: latency in ms)

  - Q  decode step, batch 16, KV 1024 (~3.5 minutes over the six rungs: its 0.8 GB LM head and two
       layers' weights stream through the TLM HBM and, at flit, across the mesh flit by flit; a
       smaller model's weights stay in SRAM and the step never touches HBM)
  -    prefill step, batch 1, 512 tokens

* serving on npusim-64c (``npusim run --requests 4 --layers 2 --output-len 8`` with ``--fidelity X
  --memory Y``: the default scenario's first 4 requests, Qwen3-4B cut to 2 layers and 8 output
  tokens so the TLM rungs stay minutes, not hours; result: mean end-to-end latency in ms)

Wall time: ``--quick`` 3.7 minutes on a 2-core Xeon of speed index 3.8 with one path rung
(the Qwen3-4B decode step takes 3.5 of them); 34 minutes with two on the same machine loaded
to speed index 0.4 (session 40, docs/FIDELITY.md); the full set was not timed end to end (the serving case alone takes ~3 minutes
at flit + analytical memory, more at flit + TLM).

The ``path`` rung carries HBM traffic as the path NoC's default, the max-min flows of issue 42 item 2
(:mod:`npusim.hw.noc.memflow`: exact in a chip run, their passes held in a serving run, session 64); the
``path+streams`` rung as the old ``reserve`` streams, the default before (``memory_streams="reserve"``; every
simulator built in the case uses them), so the two stream models are judged on the same set (at analytical
memory, per workload, also ``validation/memory_flows_vs_flit.py``). Before session 64 the columns were
``path`` (the streams) and ``path+flows``.

    python validation/fidelity_ladder.py [--quick] [--only SUBSTRING]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "validation" / "perf"))
sys.path.insert(0, str(ROOT / "validation"))

NOCS = ("flit", "path", "path+streams", "analytical")  # most detailed first
STREAMS = {"path+streams": ("path", "reserve")}  # a rung's NoC label -> (NoC fidelity, memory stream model)
MEMORIES = ("tlm", "analytical")
RUNGS = [(n, m) for n in NOCS for m in MEMORIES]
REFERENCE = ("flit", "tlm")
TOLERANCE = 0.05
DIE, CHIP = "ascend-910c-die", "npusim-64c"


def at_rung(fn, noc, memory):
    """``fn(noc, memory)`` at a rung: ``path+streams`` is the path NoC with every simulator built
    inside carrying HBM traffic as the old reserved streams."""
    if noc not in STREAMS:
        return fn(noc, memory)
    from memory_flows_vs_flit import stream_model

    noc, streams = STREAMS[noc]
    with stream_model(streams):
        return fn(noc, memory)


def chip_cost(noc, memory):
    """A fresh, memory-only ChipCost per call: every case simulated, nothing read from a cache."""
    from npusim.system.chipcost import ChipCost
    return ChipCost(DIE, memory=memory, noc=noc, persist=False)


def gemm(m, k, n, dtype):
    return lambda noc, memory: chip_cost(noc, memory).gemm(m, k, n, dtype).time_us


def rmsnorm(rows, width):
    from npusim.model.ir import Op
    vec = Op("rmsnorm", "vector", elements=rows * width, op_class="rmsnorm", row_len=width)
    return lambda noc, memory: chip_cost(noc, memory).op(vec).time_us


def attention(q, kv, heads, d):
    from npusim.model.ir import Op
    att = Op("flash_attention", "attention", batch=1, q_len=q, kv_len=kv, heads=heads, kv_heads=heads, head_dim=d,
             causal=True)
    return lambda noc, memory: chip_cost(noc, memory).op(att).time_us


def run_cli(argv, metric):
    """``npusim run ARGV --fidelity X --memory Y`` through the CLI's own run path."""
    def go(noc, memory):
        from npusim.arch import load_arch
        from npusim.cli import build_parser
        from npusim.scenarios.run import run_summary

        args = build_parser().parse_args(["run", *argv, "--fidelity", noc, "--memory", memory, "--no-progress"])
        return metric(run_summary(args, load_arch(CHIP)))
    return go


FORWARD = ["--forward", "--layers", "2"]
DECODE = [*FORWARD, "--phase", "decode", "--batch", "16", "--seq", "1024"]
SERVING = ["--requests", "4", "--layers", "2", "--output-len", "8"]


def cases(quick: bool):
    """(label, unit, function of (noc, memory) -> value, in the quick set); then what quick left out."""
    out = [
        ("GEMM decode 16x5120x3200 bf16", "us", gemm(16, 5120, 3200, "bf16"), True),
        ("GEMM prefill 2048x2048x7168 int8", "us", gemm(2048, 2048, 7168, "int8"), False),
        ("GEMM prefill 512x2048x7168 int8", "us", gemm(512, 2048, 7168, "int8"), "quick"),
        ("RMSNorm 256x7168 bf16", "us", rmsnorm(256, 7168), True),
        ("FlashAttention 1024/1024 h8 d128", "us", attention(1024, 1024, 8, 128), True),
        ("fwd decode b16 kv1024 (2 layers)", "ms", run_cli(DECODE, lambda s: s["latency_ms"]), True),
        ("fwd prefill b1 s512 (2 layers)", "ms",
         run_cli([*FORWARD, "--phase", "prefill", "--batch", "1", "--seq", "512"], lambda s: s["latency_ms"]), False),
        ("serve 4 req (2 layers, 8 out) E2E", "ms",
         run_cli(SERVING, lambda s: s["e2e_ms"]["mean"]), False),
    ]
    keep = [c for c in out if (c[3] is True or (c[3] == "quick") == quick)]
    left = [c[0] for c in out if quick and c[3] is False]
    return keep, left


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="fewer, smaller cases: under ~5 minutes on 2 cores")
    ap.add_argument("--only", default=None, help="only the cases whose label contains this")
    args = ap.parse_args()
    t_start = time.perf_counter()

    speed = ROOT.parent / "shared" / "machine_speed.py"
    if speed.exists():
        out = subprocess.run([sys.executable, str(speed)], capture_output=True, text=True).stdout.strip()
        print(out.splitlines()[0] if out else "speed index unknown (machine_speed.py printed nothing)", flush=True)

    for noc, memory in RUNGS:  # warm up (load) each fidelity's Numba kernels outside the timings
        at_rung(lambda n, m: chip_cost(n, m).gemm(128, 256, 256, "bf16", cores=4), noc, memory)

    todo, left = cases(args.quick)
    if args.only:
        todo = [c for c in todo if args.only.lower() in c[0].lower()]
    head = f"{'case':36s} {'NoC':>10s} {'memory':>10s} {'result':>12s} {'error':>8s} {'wall s':>8s}"
    print(f"reference: NoC {REFERENCE[0]} + memory {REFERENCE[1]}; error = rung / reference - 1\n{head}\n"
          + "-" * len(head), flush=True)
    errors, walls = {r: [] for r in RUNGS}, {r: 0.0 for r in RUNGS}
    for label, unit, fn, _ in todo:
        ref = None
        for noc, memory in RUNGS:  # the reference first
            t0 = time.perf_counter()
            value = at_rung(fn, noc, memory)
            wall = time.perf_counter() - t0
            ref = value if ref is None else ref
            err = value / ref - 1
            errors[(noc, memory)].append(abs(err))
            walls[(noc, memory)] += wall
            print(f"{label:36s} {noc:>10s} {memory:>10s} {value:9.2f} {unit:2s} {err:+8.1%} {wall:8.1f}", flush=True)
        print(flush=True)

    if not todo:
        sys.exit("no case matches --only")
    print(f"over the set ({len(todo)} cases): worst |error| and total wall time per rung")
    for r in RUNGS:
        print(f"  NoC {r[0]:>10s} memory {r[1]:>10s}: worst {max(errors[r], default=0):6.1%}, "
              f"wall {walls[r]:7.1f} s")

    def cheapest(rungs):
        ok = [r for r in rungs if max(errors[r], default=0) <= TOLERANCE]
        return min(ok, key=lambda r: walls[r])

    noc = cheapest([(n, REFERENCE[1]) for n in NOCS])
    mem = cheapest([(REFERENCE[0], m) for m in MEMORIES])
    both = cheapest(RUNGS)
    only = " (only the reference itself)"
    print(f"cheapest rung within {TOLERANCE:.0%} of the reference on every case:\n"
          f"  NoC level (memory {REFERENCE[1]}):  {noc[0]}{only if noc == REFERENCE else ''}\n"
          f"  memory level (NoC {REFERENCE[0]}): {mem[1]}{only if mem == REFERENCE else ''}\n"
          f"  overall:                  NoC {both[0]} + memory {both[1]}{only if both == REFERENCE else ''}")
    if left:
        print("left out by --quick (run without it): " + "; ".join(left)
              + "; the prefill GEMM runs at m=512 instead of 2048")
    from machine import machine_line

    print(f"total wall {time.perf_counter() - t_start:.0f} s")
    print(machine_line())


if __name__ == "__main__":
    main()
