"""HBM traffic over the mesh at the path NoC: flows (max-min shares) and the old streams, against flit.

Issue 42 item 2. The flit NoC (cycle-accurate routers; a DMA a closed loop of one-flit requests
within its tags, the controllers answering in arrival order; checked against BookSim2 on
many-to-few request-reply traffic, ``validation/noc_hotspot_booksim.py``) is the reference. The path
NoC carries a DMA's traffic either as one max-min fair *flow* per DMA engine (``memory_streams=
"flow"``, :mod:`npusim.hw.noc.memflow`, the default since session 64) or as per-router *streams* with hop and
release events (``"reserve"``, the default before); the flows with plain max-min shares and with the
head-of-line coupling at the routers' input ports (:mod:`npusim.hw.noc.hol`,
``memflow.HOL_COUPLING``, on by default since session 49). For each workload: the simulated time at each model, the
error against flit and the wall time of the run (kernel compiled beforehand: the first run of each
fidelity is a warm-up, not timed).

Workloads (memory at the analytical fidelity everywhere, so that only the NoC differs; the DRAM
side is the same model at every NoC fidelity):

* ChipCost GEMMs (``ChipCost(...).gemm``, its own plan and lowering): decode 16x5120x3200 bf16 and
  prefill 512x2048x7168 int8 on ascend-910c-die, decode 16x4096x4096 bf16 on ascend-910b, decode
  16x2560x9728 bf16 and prefill 512x2560x9728 bf16 on npusim-64c;
* memory patterns on npusim-64c, every DMA engine of every core at once: ``stream`` (linear reads,
  256 KiB a core in 4 DMAs an engine), ``stream-write``, ``random`` (64 B transactions spread over
  all channels; the path/flow models spread a random DMA evenly over the channels);
* the README forward pass (``npusim run --forward --layers 2``: Qwen3-4B decode, batch 16, KV 1025);
* a serving run (``npusim run --requests 4 --layers 2 --output-len 8``: the default scenario's first
  4 requests on npusim-64c, 2 layers, 8 output tokens; its mean end-to-end latency).

The last two columns are the serving runs' speed-ups, options: a head-of-line pass held for 1,024 cycles
(``memflow.HOL_PERIOD``, session 52), and a sharing of the links kept for 64 cycles (``memflow.SHARE_PERIOD``,
session 53: flows starting or draining within it wait for the next sharing); the others make a pass at
every update and share at every change (the defaults).

``--rtt`` prints instead the micro-benchmark behind the flows' round trip
(:data:`npusim.hw.noc.memflow.RTT_OVERHEAD`): one DMA engine of npusim-64c, every HBM channel
attached at router 0, reads 64 and 128 KiB from cores 3, 7, 15 and 63 hops away; with 8 bursts in
flight it is window-limited, so (time(128 KiB) - time(64 KiB)) / 32 is one round trip, at the flit
NoC and at the path flows, beside the zero-load formula ``2 ((h + 1) S + h L) + f - 1``.

``--hol-regime`` prints instead, for each case at the path flows with the head-of-line coupling,
where the coupling takes its throughput (session 50): every ``--sample`` cycles, for each mesh link
whose ``eta`` is below 1, its port's cycles lost a cycle to each next output, ``lambda_o (t_o - 1)``
(:func:`npusim.hw.noc.hol.port_eta`), summed by the output's kind (a mesh link, the core's ejection
port, the memory port) and by the others ahead there, ``N_o`` (:func:`npusim.hw.noc.hol.others_ahead`,
rounded to 0.5), and by the link's busiest input slot's share of its flits and the output's share of
them (session 55; rounded to 0.1): the regime of ``validation/noc_link_saturation.py``'s micro-benchmarks
the case lives in (part G builds the one the 64c GEMMs live in). The times are those of a plain run (it
only stops and resumes). The serving run is long: ``--skip serve``, or a ``--sample`` of 100,000 cycles
or more for it.

``--jitter CYCLES`` starts each core of a memory pattern after 0..CYCLES cycles, drawn per core, and makes the
pattern's row the mean of ``--draws`` draws (seeds 1..N; each draw printed below it). The saturated flit mesh
settles into one of two mirror-image states by its start (session 59, docs/FIDELITY.md): at 16 cycles the reference
moves by about 1%, so a row started all at once is one draw of it.

    python validation/memory_flows_vs_flit.py [--only SUBSTRING] [--skip SUBSTRING] [--skip-flit] [--rtt]
        [--hol-regime [--sample CYCLES]] [--jitter CYCLES [--draws N]]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.hw.memory.hbm import PATTERN_RANDOM  # noqa: E402
from npusim.sim import Simulator  # noqa: E402

# (label, NoC fidelity, memory streams, head-of-line coupling of the flows: npusim.hw.noc.memflow.HOL_COUPLING,
# one-window DMAs timed as mice: memflow.MICE, cycles a head-of-line pass holds: memflow.HOL_PERIOD, cycles a sharing
# is kept: memflow.SHARE_PERIOD; None the defaults)
MODELS = [("flit", "flit", "flow", True, True, None, None),
          ("path streams (old)", "path", "reserve", True, True, None, None),
          ("path flows, max-min", "path", "flow", False, True, None, None),
          ("path flows + HOL", "path", "flow", True, True, None, None),
          ("flows + HOL, no mice", "path", "flow", True, False, None, None),
          ("flows + HOL, pass held 1024", "path", "flow", True, True, 1024, None),
          ("flows + HOL, sharing kept 64", "path", "flow", True, True, None, 64)]


def _set_default(func, name: str, value):
    """Set the default of parameter ``name`` of ``func``; returns the old defaults."""
    code = func.__code__
    names = code.co_varnames[:code.co_argcount]
    old = func.__defaults__
    defaults = list(old)
    defaults[names.index(name) - (len(names) - len(defaults))] = value
    func.__defaults__ = tuple(defaults)
    return old


@contextlib.contextmanager
def stream_model(name: str, hol: bool = True, mice: bool = True, period: int | None = None,
                 share: int | None = None):
    """Every Simulator built inside (by ChipCost, the forward pass, the serving loop) uses memory
    stream model ``name``, its flows with the head-of-line coupling or not (``hol``), its one-window
    DMAs timed as mice or as flows of the filling (``mice``), a head-of-line pass holding ``period``
    cycles (None: ``memflow.HOL_PERIOD``'s default; 0: a pass every update), a sharing kept ``share``
    cycles (None: ``memflow.SHARE_PERIOD``'s default; 0: a sharing at every change)."""
    from npusim.hw.noc import memflow
    from npusim.scenarios.forward import simulate_forward
    from npusim.serving.simulate import ServingConfig
    funcs = (Simulator.__init__, simulate_forward, ServingConfig.__init__)
    olds = [_set_default(f, "memory_streams", name) for f in funcs]
    saved = memflow.HOL_COUPLING, memflow.MICE, memflow.HOL_PERIOD, memflow.SHARE_PERIOD
    memflow.HOL_COUPLING, memflow.MICE = hol, mice
    memflow.HOL_PERIOD = saved[2] if period is None else period
    memflow.SHARE_PERIOD = saved[3] if share is None else share
    try:
        yield
    finally:
        memflow.HOL_COUPLING, memflow.MICE, memflow.HOL_PERIOD, memflow.SHARE_PERIOD = saved
        for f, old in zip(funcs, olds):
            f.__defaults__ = old


def gemm(arch, m, k, n, dtype):
    def go(noc):
        from npusim.system.chipcost import ChipCost
        return ChipCost(arch, memory="analytical", noc=noc, persist=False).gemm(m, k, n, dtype).time_us
    return go


#: ``--jitter``: each core of a memory pattern starts after 0..JITTER cycles (drawn per core, ``--draws`` draws)
JITTER = {"cycles": 0, "draws": 3}


def pattern(arch_name, kind, per_core=256 << 10, pieces=4):
    def once(noc, start_rng):
        arch = load_arch(arch_name)
        sim = Simulator(arch, memory_mode="analytical", noc_mode=noc)
        engines = sim.dma_engines
        size = per_core // engines // pieces
        a = 0
        for c in range(arch.num_cores):
            d = int(start_rng.integers(0, JITTER["cycles"] + 1)) if start_rng is not None else 0
            start = (sim.add_compute(c, "vector", d),) if d > 0 else ()
            for e in range(engines):
                prev = start
                for _ in range(pieces):
                    t = sim.add_dma(c, size, address=a, write=kind == "stream-write", dma_engine=e,
                                    pattern=PATTERN_RANDOM if kind == "random" else 0, deps=prev)
                    prev = (t,)
                    a += size
        sim.run()
        return sim.makespan() / arch.clock_ghz / 1000.0  # us

    def go(noc):
        if JITTER["cycles"] <= 0:
            return once(noc, None)
        import numpy as np
        go.draws = [once(noc, np.random.default_rng(seed)) for seed in range(1, JITTER["draws"] + 1)]
        return sum(go.draws) / len(go.draws)
    go.draws = []
    return go


def run_cli(argv, metric):
    def go(noc):
        from npusim.cli import build_parser
        from npusim.scenarios.run import run_summary
        args = build_parser().parse_args(["run", *argv, "--fidelity", noc, "--memory", "analytical", "--no-progress"])
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            return metric(run_summary(args, load_arch("npusim-64c")))
    return go


CASES = [
    ("GEMM 16x5120x3200 bf16, 910C die", "us", gemm("ascend-910c-die", 16, 5120, 3200, "bf16")),
    ("GEMM 512x2048x7168 int8, 910C die", "us", gemm("ascend-910c-die", 512, 2048, 7168, "int8")),
    ("GEMM 16x4096x4096 bf16, 910B", "us", gemm("ascend-910b", 16, 4096, 4096, "bf16")),
    ("GEMM 16x2560x9728 bf16, 64c", "us", gemm("npusim-64c", 16, 2560, 9728, "bf16")),
    ("GEMM 512x2560x9728 bf16, 64c", "us", gemm("npusim-64c", 512, 2560, 9728, "bf16")),
    ("mem stream, 64c", "us", pattern("npusim-64c", "stream")),
    ("mem stream-write, 64c", "us", pattern("npusim-64c", "stream-write")),
    ("mem random, 64c", "us", pattern("npusim-64c", "random")),
    ("fwd decode b16 (2 layers), 64c", "ms", run_cli(["--forward", "--layers", "2"], lambda s: s["latency_ms"])),
    ("serve 4 req (2 layers, 8 out) E2E", "ms",
     run_cli(["--requests", "4", "--layers", "2", "--output-len", "8"], lambda s: s["e2e_ms"]["mean"])),
]


def round_trips() -> None:
    """The ``--rtt`` micro-benchmark (module docstring)."""
    base = load_arch("npusim-64c")
    arch = base.model_copy(update={"hbm": base.hbm.model_copy(update={"attach": [0] * 64})})
    S, L = arch.noc.router_pipeline_cycles, arch.noc.link_latency_cycles
    print(f"{'core':>4} {'hops':>4} {'flit RTT':>9} {'flows RTT':>9} {'zero-load':>9}")
    for core in (3, 7, 15, 63):
        rtt = []
        for noc in ("flit", "path"):
            t = []
            for nb in (64 << 10, 128 << 10):
                sim = Simulator(arch, memory_mode="analytical", noc_mode=noc, memory_streams="flow")
                sim.add_dma(core, nb)
                sim.run()
                t.append(sim.makespan())
            rtt.append((t[1] - t[0]) / ((64 << 10) // 256 // 8))
        h = core % 8 + core // 8
        print(f"{core:4d} {h:4d} {rtt[0]:9.1f} {rtt[1]:9.1f} {2 * ((h + 1) * S + h * L) + 256 // 64 - 1:9d}")


@contextlib.contextmanager
def sampled_runs(every: int, sample):
    """Every Simulator's ``run()`` (to completion) built inside runs ``every`` cycles at a time and
    calls ``sample(sim)`` in between (the results do not change: the run only stops and resumes)."""
    orig = Simulator.run

    def run(self, until=None, until_task=None, **kw):
        if until is not None or until_task is not None:
            return orig(self, until=until, until_task=until_task, **kw)
        t = self.now
        while self.engine.num_done < self.engine.num_tasks:
            t += every
            orig(self, until=t, **kw)
            sample(self)
        return orig(self, **kw)

    Simulator.run = run
    try:
        yield
    finally:
        Simulator.run = orig


def hol_regime(cases, every: int) -> None:
    """``--hol-regime`` (module docstring)."""
    import numpy as np

    from npusim.hw.noc import memflow as M
    print(f"path flows + HOL: port cycles lost a cycle to each next output, lambda_o (t_o - 1), summed over the "
          f"links with eta < 1 every {every} cycles; share by the output's kind and its others ahead N_o")
    for label, unit, fn in cases:
        loss: dict = {}
        by_input: dict = {}  # the same loss by the link's busiest input's share of its flits
        by_output: dict = {}  # and by the output's share of them

        def sample(sim):
            mf = sim.mempath.fl
            nl, nr = int(mf.prm[M.P_NLINKS]), int(mf.prm[M.P_NR])
            mf.sc[M.S_LOADS_STAMP] += 1  # the resources' slot loads at the rates now (no pass's memo key moves)
            for l in range(nl):
                if mf.rv[l] == 0 or mf.eta[l] >= 1.0:
                    continue
                M._slot_loads(mf, l)
                loads, inputs = mf.hso[l].copy(), mf.hsi[l].copy()  # inputs: by the input slot at the link's source router
                n = int(np.count_nonzero(loads > 0.0))
                M._hol_link(mf, l)  # fills the scratch hlam, hN, hres, ht for the link's n outputs
                total = float(loads.sum())
                for j in range(n):
                    o = int(mf.hres[j])
                    kind = "ejection" if nl <= o < nl + nr else ("memory port" if nl + nr <= o < nl + 2 * nr else "link")
                    key = (kind, round(2.0 * float(mf.hN[j])) / 2.0)
                    lost = float(mf.hlam[j]) * (float(mf.ht[j]) - 1.0)
                    loss[key] = loss.get(key, 0.0) + lost
                    dom, share = round(float(inputs.max()) / total, 1), round(float(mf.hlam[j]) / total, 1)
                    by_input[dom] = by_input.get(dom, 0.0) + lost
                    by_output[share] = by_output.get(share, 0.0) + lost

        with stream_model("flow", True), sampled_runs(every, sample):
            v = fn("path")
        tot = sum(loss.values())
        if tot <= 0.0:
            print(f"{label} ({v:.3f} {unit}): no sample (no link's eta fell below 1)", flush=True)
            continue
        by_kind: dict = {}
        for (kind, _), x in loss.items():
            by_kind[kind] = by_kind.get(kind, 0.0) + x
        print(f"{label} ({v:.3f} {unit}): " + ", ".join(f"{k} {x / tot:.2f}" for k, x in sorted(by_kind.items()))
              + "; " + ", ".join(f"{k[0]} N~{k[1]:.1f} {x / tot:.2f}" for k, x in sorted(loss.items()) if x / tot >= 0.005),
              flush=True)
        print("    by the link's busiest input's share of its flits: "
              + ", ".join(f"{k:.1f} {x / tot:.2f}" for k, x in sorted(by_input.items()) if x / tot >= 0.005)
              + "; by the output's share of them: "
              + ", ".join(f"{k:.1f} {x / tot:.2f}" for k, x in sorted(by_output.items()) if x / tot >= 0.005), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="", help="run the cases whose label contains this")
    ap.add_argument("--skip-flit", action="store_true", help="path models only (no reference: no errors)")
    ap.add_argument("--skip", default="", help="leave out the cases whose label contains this")
    ap.add_argument("--rtt", action="store_true", help="the round-trip micro-benchmark instead (see above)")
    ap.add_argument("--hol-regime", action="store_true", help="where the flows' HOL coupling takes throughput (see above)")
    ap.add_argument("--sample", type=int, default=200, help="--hol-regime: cycles between samples")
    ap.add_argument("--jitter", type=int, default=0, metavar="CYCLES",
                    help="memory patterns: each core starts after 0..CYCLES cycles (a draw per core); the row is the "
                         "mean of --draws draws, each draw's value printed below it (default 0: all start at once)")
    ap.add_argument("--draws", type=int, default=3, help="--jitter: draws (seeds 1..N)")
    args = ap.parse_args(argv)
    if args.jitter < 0 or args.draws < 1:
        print("--jitter: at least 0 cycles; --draws: at least 1", file=sys.stderr)
        return 2
    JITTER["cycles"], JITTER["draws"] = args.jitter, args.draws
    if args.rtt:
        print(machine_line())
        round_trips()
        return 0
    cases = [c for c in CASES if args.only.lower() in c[0].lower()
             and not (args.skip and args.skip.lower() in c[0].lower())]
    if not cases:
        print(f"no case matches '{args.only}'", file=sys.stderr)
        return 2
    if args.hol_regime:
        if args.sample < 1:
            print("--sample: at least 1 cycle", file=sys.stderr)
            return 2
        print(machine_line())
        hol_regime(cases, args.sample)
        return 0
    models = MODELS[1:] if args.skip_flit else MODELS
    print(machine_line())
    print("memory analytical; error = model / flit - 1; wall = seconds of this run (kernels compiled before)")
    warmed = set()
    print(f"{'workload':36s} " + " ".join(f"{m[0]:>30s}" for m in models))
    worst = {m[0]: 0.0 for m in models[1:]}
    for label, unit, fn in cases:
        vals, draws = [], []
        for name, noc, streams, *switches in models:
            with stream_model(streams, *switches):
                if (noc, streams, *switches) not in warmed:  # compile / load the kernel outside the timing
                    pattern("npusim-64c", "stream", per_core=4096, pieces=1)(noc)
                    warmed.add((noc, streams, *switches))
                w0 = time.perf_counter()
                v = fn(noc)
                vals.append((v, time.perf_counter() - w0))
                draws.append(list(getattr(fn, "draws", [])))
        ref = vals[0][0] if not args.skip_flit else None
        cells = []
        for (name, *_), (v, w) in zip(models, vals):
            if ref is not None and name != "flit":
                err = v / ref - 1
                worst[name] = max(worst[name], abs(err))
                cells.append(f"{v:9.3f} {unit} {100 * err:+6.1f}% {w:6.1f}s")
            else:
                cells.append(f"{v:9.3f} {unit} {'':7s} {w:6.1f}s")
        print(f"{label:36s} " + " ".join(f"{c:>30s}" for c in cells), flush=True)
        if any(draws):  # --jitter: the draws behind each mean
            print(f"{'  draws (start 0-' + str(args.jitter) + ' cycles)':36s} "
                  + " ".join(f"{' / '.join(f'{x:.3f}' for x in d):>30s}" for d in draws), flush=True)
    if not args.skip_flit:
        print("largest |error| against flit: " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in worst.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
