"""``npusim run``: serve a stream of requests on a chip, or simulate one forward pass.

Plain ``npusim run`` serves the default scenario: 32 synthetic requests of Qwen3-4B arriving
at 8 per second (Poisson, seed 0; prompts of 128-512 tokens, 32-128 output tokens) on
npusim-64c under PD fusion, TP-4 groups in a 16-stage pipeline, memory at the analytical
fidelity and the NoC at the path level; about 10 s on a 2-core machine once the kernel is compiled
(the first run compiles it for about 15 s). ``--trace`` or
``--rate`` choose other request streams (see the serving options).

A forward-pass flag (``--phase``, ``--batch``, ``--seq``, ``--kv``, or ``--forward``) simulates
one forward pass instead. The model is a built-in name (``npusim model --list``) or an
``.onnx`` file; the mapping is a spec file (``--mapping``) or derived from the chip and the ``--tp``,
``--partition``, ``--layout`` and ``--stages`` flags: by default one copy of the model
fills the chip — TP groups of 16 cores (4 when serving; 4x4 blocks in ring order), as many pipeline
stages as there are groups (at most one per layer), partitions chosen per GEMM
(``auto``).

``npusim run --forward`` simulates one decode step of Qwen3-4B for 16 sequences with
1,024 cached tokens each on npusim-64c, memory at the analytical fidelity and the NoC
at the path level (a TLM memory run of the same step moves ~8 GB of weights through
the transaction model and takes minutes: ``--memory tlm``).
"""

from __future__ import annotations

from pathlib import Path

from npusim.files import json_text
# the run's options live below the CLI (sweeps parse them too)
from npusim.scenarios.options import (add_run_options, chip_arch, fill_model_default, forward_asked,
                                      refuse_unread_flags)


def add_parser(sub):
    p = sub.add_parser(
        "run",
        help="serve requests on a chip (default scenario: Qwen3-4B on npusim-64c), or one forward pass",
        description=" ".join(__doc__.split("\n\n")[1:4]),
    )
    add_run_options(p)
    return p


def run(args) -> int:
    """The run path the flags choose: a deployment file, a --system step or serving run, serving on a
    chip, or one forward pass; each built by :mod:`npusim.scenarios.run`."""
    if getattr(args, "deployment", None) is not None:
        from npusim.cli.run_system import run_deployment

        return run_deployment(args)
    fill_model_default(args)
    refuse_unread_flags(args)
    if args.system is not None:
        from npusim.cli.run_system import run_system

        return run_system(args)
    from npusim.arch import load_arch

    arch = load_arch(chip_arch(args))
    if not forward_asked(args):
        from npusim.cli.serve import run_serving
        from npusim.scenarios.run import chip_serving_scenario

        return run_serving(args, chip_serving_scenario(args, arch))
    from npusim.cli.progress import task_progress
    from npusim.scenarios.run import simulate_forward_options

    with task_progress(arch.clock_ghz, enabled=not args.no_progress) as progress:
        result = simulate_forward_options(args, arch, progress=progress)
    summary = result.summary
    if args.out:
        summary["files"] = write_outputs(args.out, result.sim, summary, result.mapped.program)
    if args.json:
        print(json_text(summary))
        return 0
    print_summary(summary, arch)
    return 0


def print_summary(s: dict, arch) -> None:
    mp = s["mapping"]
    what = f"{s['phase']} of {s['batch']} x {s['seq_len']} tokens" if s["phase"] == "prefill" else \
        f"decode step of {s['batch']} sequences at KV {s['kv_len']}"
    print(f"{s['model']} on {s['arch']}: {what}  (memory {s['memory_fidelity']}, NoC {s['noc_fidelity']})")
    print(f"  mapping        TP {mp['tp']} x {mp['stages']} stage(s) x {mp['replicas']} replica(s), "
          f"{mp['microbatches']} micro-batch(es); partitions {mp['partitions']}")
    print(f"  weights        {'resident in SRAM' if mp['weights_resident'] else 'streamed from HBM'} "
          f"({mp['weight_mb_per_core']:.1f} MB per core); KV cache in {'HBM' if mp['kv_cache_in_hbm'] else 'SRAM'}")
    print(f"  latency        {s['latency_ms']:.3f} ms ({s['cycles']:,} cycles), {s['tokens_per_s']:,.0f} tokens/s")
    print(f"  compute        {s['tflops_achieved']:.1f} TFLOPS achieved")
    if s.get("memory_fidelity") == "tlm":
        print(f"  SRAM stalls    {s['sram_stall_cycles']:,} compute cycles waited on SRAM ports, summed over tasks "
              f"({s['sram_dma_stall_cycles']:,} of them behind DMA traffic)")
    else:
        print("  SRAM stalls    not modelled at the analytical memory fidelity (operands always arrive)")
    bd, frac = s["breakdown_ms"], s["breakdown_fraction"]
    print("  time went to   " + ", ".join(f"{k} {bd[k]:.3f} ms ({100 * frac[k]:.0f}%)" for k in bd))
    util = ", ".join(f"{u} {100 * v:.0f}%" for u, v in s["core_utilization"].items())
    print(f"  busy per core  {util} (mean over {s['cores_used']} cores)")
    print(f"  HBM            {s['hbm_bytes'] / 2**30:.2f} GiB at {s['hbm_bandwidth_gbps']:.1f} GB/s of "
          f"{arch.hbm.total_bandwidth_gbps:.1f} peak; {s['hbm_bytes_over_noc'] / 2**30:.2f} GiB of it over the NoC")
    print(f"  NoC links      max {100 * s['noc_link_utilization_max']:.1f}%, mean {100 * s['noc_link_utilization_mean']:.1f}%"
          f" (at the HBM routers: max {100 * s['noc_link_utilization_at_hbm_max']:.1f}%, "
          f"mean {100 * s['noc_link_utilization_at_hbm_mean']:.1f}%)")
    print(f"  simulated      {s['tasks']:,} tasks, {s['events']:,} events")
    for note in mp["notes"]:
        print(f"  note           {note}")
    for name, path in s.get("files", {}).items():
        print(f"  wrote {name:<9} {path}")


def write_outputs(out: Path, sim, summary: dict, program) -> dict:
    from npusim.files import result_files, write_json
    from npusim.report.hdf5 import write_task_hdf5
    from npusim.report.perfetto import write_perfetto

    eng = sim.engine
    n = eng.num_tasks
    start, end = sim.task_times()
    files = {"summary": out / "summary.json", "tasks": out / "tasks.h5", "program": out / "program.h5",
             "timeline": out / "timeline.json"}
    with result_files(files) as staged:
        write_task_hdf5(staged["tasks"], kind=eng.tt.kind[:n], queue=eng.tt.queue[:n], param=eng.tt.param[:n],
                        start=start, end=end, queue_names=eng.queue_names, busy_cycles=eng.busy_cycles(),
                        attrs={"arch": sim.arch.name, "clock_ghz": sim.arch.clock_ghz})
        program.save(staged["program"])
        write_perfetto(staged["timeline"], queue_names=eng.queue_names, task_queue=eng.tt.queue[:n], start=start,
                       end=end, clock_ghz=sim.arch.clock_ghz, task_names=eng.task_names)
        paths = {k: str(v) for k, v in files.items()}
        write_json(staged["summary"], {**summary, "files": paths})
    return paths
