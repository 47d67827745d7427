"""``npusim replay PROGRAM``: run a saved program (``npusim run --out``) on a chip; ``npusim replay DIR
--system S``: re-time a saved system step (``npusim run --system ... --save-workload DIR``) on a system."""

from __future__ import annotations

from pathlib import Path

from npusim.cli.run import write_outputs
from npusim.cli.util import (NODES_HELP, add_arch_arg, chip_arch, chip_noc, chip_streams, positive_int,
                             refuse_arch_with_system, system_chip_cost)
from npusim.errors import ConfigError
from npusim.files import json_text
from npusim.scenarios.options import add_fidelity_args


def add_parser(sub):
    p = sub.add_parser(
        "replay",
        help="run a saved program (program.h5 from npusim run --out) on a chip of the same core count, or a saved "
        "system step (--save-workload DIR) on a system",
        description="Replay a compiled program on an arch file with the same number of cores: compute tasks "
        "are re-timed for its arrays and vector units, memory and NoC are simulated again. With --system, "
        "PROGRAM is a workload directory (or its workload.json) from `npusim run --system ... --save-workload "
        "DIR`: its kernels are costed on that system's die and its collectives and transfers timed on its fabric.",
    )
    p.add_argument("program", type=Path, help="program.h5 written by `npusim run --out DIR`, or with --system a "
                   "workload directory")
    p.add_argument("--system", default=None, help="system preset or file: re-time a saved system workload on it")
    p.add_argument("--nodes", type=positive_int, default=None, help="with --system: " + NODES_HELP)
    add_arch_arg(p, system=True)
    add_fidelity_args(p, memory_default="analytical", system=True)
    p.add_argument("--runtime", choices=["eager", "graph"], default=None, help="with --system: the runtime the step "
                   "is re-timed under (default: the system's runtime section for the workload's phase)")
    p.add_argument("--out", type=Path, default=None, help="directory for summary.json, tasks.h5, timeline.json")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true")
    return p


def run(args) -> int:
    if args.system is not None:
        refuse_arch_with_system(args)
        return run_system_workload(args)
    if args.nodes is not None:
        raise ConfigError(f"--nodes {args.nodes}: slices a --system; replaying a program on a chip (--arch) takes none")
    if args.runtime is not None:
        raise ConfigError(f"--runtime {args.runtime}: the host runtime of a system step (--system); a chip program "
                          "replayed on a chip has none")
    if args.program.is_dir() or args.program.suffix == ".json":
        raise ConfigError(f"{args.program}: a system workload (npusim run --system ... --save-workload DIR) replays "
                          "on a system: add --system S (a chip program is the program.h5 of npusim run --out DIR)")
    from npusim.arch import load_arch
    from npusim.cli.progress import task_progress
    from npusim.report.breakdown import time_breakdown
    from npusim.sim import Simulator
    from npusim.sim.program import load_program

    prog = load_program(args.program)
    arch = load_arch(chip_arch(args))
    sim = Simulator(arch, memory_mode=args.memory, noc_mode=chip_noc(args), **chip_streams(args))
    prog.submit(sim)
    with task_progress(arch.clock_ghz, enabled=not args.no_progress) as progress:
        sim.run(progress=progress, chunk_events=500_000)
    cycles = sim.makespan()
    bd = time_breakdown(sim)
    summary = {
        "program": str(args.program), "arch": arch.name, "meta": prog.meta, "tasks": len(prog),
        "cycles": cycles, "latency_ms": cycles / (arch.clock_ghz * 1e6),
        "breakdown_ms": {k: v / (arch.clock_ghz * 1e6) for k, v in bd["cycles"].items()},
    }
    if args.out:
        summary["files"] = write_outputs(args.out, sim, summary, prog)
    if args.json:
        print(json_text(summary))
        return 0
    m = prog.meta
    print(f"replayed {args.program} ({m.get('model', '?')} {m.get('phase', '')}, {len(prog):,} tasks) on {arch.name}")
    print(f"  latency        {summary['latency_ms']:.3f} ms ({cycles:,} cycles)")
    print("  time went to   " + ", ".join(f"{k} {v:.3f} ms" for k, v in summary["breakdown_ms"].items()))
    return 0


def run_system_workload(args) -> int:
    from npusim.cli.run_system import print_plan_step, write_plan_outputs
    from npusim.system.execute import StepRuntime, time_workload
    from npusim.system.load import load_system
    from npusim.system.step import summarize_timing
    from npusim.system.workload import Workload

    wl = Workload.load(args.program)
    loaded = load_system(args.system, nodes=args.nodes)
    cc = system_chip_cost(args, loaded)
    scheduler = (wl.meta.get("deployment") or {}).get("step_overhead_us")  # a deployment's own, if it gave one
    runtime = StepRuntime.of(loaded, wl.meta.get("phase", "decode"), args.runtime, scheduler)
    timing = time_workload(wl, loaded, cc, runtime=runtime)
    out = summarize_timing(wl, timing, loaded, cc)
    out.update(replayed=str(args.program), chip_cost=cc.stats.as_dict())
    if args.out:
        write_plan_outputs(args.out, out, wl, timing)
    if args.json:
        print(json_text(out))
        return 0
    print(f"replayed {args.program} on {loaded.system.name}")
    print_plan_step(out)
    return 0
