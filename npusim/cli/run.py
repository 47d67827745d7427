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

import functools
import sys
from pathlib import Path

from npusim.choices import LAYOUTS, MEMORY_FIDELITIES, NOC_FIDELITIES, PARTITIONS
from npusim.cli.run_system import add_system_run_args, run_system
from npusim.cli.serve import MAX_REQUESTS, add_serving_args, is_serving, run_serving, serve
from npusim.cli.util import (add_arch_arg, add_force_arg, chip_arch, chip_noc, chip_precision, non_negative_int,
                             positive_int, refuse_arch_with_system)
from npusim.errors import ConfigError
from npusim.files import json_text

DEFAULT_MODEL = "qwen3-4b"
SYSTEM_DEFAULT_MODEL = "deepseek-r1"
SERVING_DEFAULT_TP = 4  # many short pipeline stages: iterations of disjoint requests overlap


def add_parser(sub):
    p = sub.add_parser(
        "run",
        help="serve requests on a chip (default scenario: Qwen3-4B on npusim-64c), or one forward pass",
        description=" ".join(__doc__.split("\n\n")[1:4]),
    )
    add_model_args(p)
    add_mapping_args(p)
    add_fidelity_args(p, memory_default="analytical", system=True)
    add_serving_args(p)
    add_system_run_args(p)
    p.add_argument("--out", type=Path, default=None,
                   help="directory for summary.json, tasks.h5, program.h5 and timeline.json (Perfetto); "
                   "serving: summary.json, serving.h5, timeline.json (Perfetto) and, with matplotlib, plots")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_force_arg(p, f"more than {MAX_REQUESTS:,} synthetic requests")
    return p


def add_model_args(p):
    add_arch_arg(p, system=True)
    p.add_argument("--model", default=None, help=f"built-in model, config .json or .onnx file (default {DEFAULT_MODEL}; "
                   f"with --system {SYSTEM_DEFAULT_MODEL})")
    p.add_argument("--forward", action="store_true", help="simulate one forward pass (implied by the next four)")
    p.add_argument("--phase", choices=["prefill", "decode"], default=None, help="forward pass: phase (default decode)")
    p.add_argument("--batch", type=positive_int, default=None, help="forward pass: sequences (default 16)")
    p.add_argument("--seq", type=positive_int, default=None,
                   help="forward pass: prefill prompt tokens per sequence, or decode tokens already cached "
                   "(default 1024)")
    p.add_argument("--kv", type=non_negative_int, default=None,
                   help="tokens already in the KV cache (decode: default --seq; prefill: a cached prefix, default "
                   "none); with --system: the decode step's context, new token included (at least 1), not for prefill")
    p.add_argument("--precision", choices=["bf16", "fp16", "a8w8", "w8a8"], default=None,
                   help="default bf16 (with --system: the mapping's plan, else bf16); bf16, fp16 (run as bf16: same width and cube rate on the modelled chips), or A8W8 = W8A8 "
                   "(int8 GEMM operands); ONNX models' floating-point tensors are re-labelled bf16 or int8 accordingly")
    p.add_argument("--layers", type=positive_int, default=None, help="build only the first N layers (quick what-ifs)")
    p.add_argument("--allow-unsupported", action="store_true",
                   help="ONNX: cost unsupported ops as data movement instead of failing")


def add_mapping_args(p):
    p.add_argument("--mapping", default=None, help="mapping spec YAML (default: derived from the flags below)")
    p.add_argument("--tp", type=positive_int, default=None, help="tensor-parallel degree: cores of a TP group on a chip "
                   "(default 16, or all cores if fewer); dies of a TP group with --system")
    p.add_argument("--partition", choices=PARTITIONS, default=None, help="GEMM partition for all classes")
    p.add_argument("--layout", choices=LAYOUTS, default=None, help="core layout of TP groups (default ring)")
    p.add_argument("--stages", type=positive_int, default=None, help="pipeline stages (default: fill the chip)")


def add_fidelity_args(p, memory_default="tlm", system: bool = False):
    """--fidelity (NoC) and --memory (HBM); ``system``: the command also runs --system, whose chip
    costs default to the analytical NoC (the flag's default is then resolved by :func:`chip_noc`)."""
    p.add_argument("--fidelity", choices=NOC_FIDELITIES, default=None if system else "path",
                   help="NoC model (default path" + ("; with --system: the chip costs' NoC, default analytical"
                                                     if system else "") + "). Against flit + TLM memory on the "
                   "fidelity ladder's quick set (docs/FIDELITY.md): path up to 12.7%% off, analytical up to "
                   "56.4%%; no cheaper NoC is within 5%%")
    p.add_argument("--memory", choices=MEMORY_FIDELITIES, default=memory_default,
                   help=f"HBM model (default {memory_default}). Against TLM at the flit NoC on the fidelity "
                   "ladder's quick set (docs/FIDELITY.md): analytical up to 62.2%% off (an INT8 prefill GEMM), "
                   "+0.1%% on a decode step")


FORWARD_DEFAULTS = {"phase": "decode", "batch": 16, "seq": 1024}


def fill_model_default(args) -> None:
    """``--model`` when not given: Qwen3-4B on a chip, DeepSeek-R1 on a system."""
    if getattr(args, "model", None) is None:
        args.model = DEFAULT_MODEL if getattr(args, "system", None) is None else SYSTEM_DEFAULT_MODEL


def is_forward(args) -> bool:
    """A forward pass was asked for: ``--forward`` or any forward-pass flag."""
    return getattr(args, "forward", True) or any(getattr(args, k, None) is not None
                                                  for k in (*FORWARD_DEFAULTS, "kv"))


def fill_forward_defaults(args) -> None:
    for key, value in FORWARD_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)


def build_model(args):
    """The operator graph the flags describe (built-in builder or ONNX import)."""
    fill_forward_defaults(args)  # --batch and --seq are positive: the parser's types say so
    if str(args.model).endswith(".onnx"):
        from npusim.model.onnx_import import load_onnx

        decode = args.phase == "decode"
        # exporters write fp32; an NPU runs the model at the chosen precision
        dtype = {"bf16": "bf16", "a8w8": "int8"}[chip_precision(args)]
        graph = load_onnx(args.model, batch=args.batch, seq_len=1 if decode else args.seq,
                          kv_len=_kv(args) + (1 if decode else 0), allow_unsupported=args.allow_unsupported,
                          dtype=dtype)
        from npusim.model.onnx_import import allowed_unsupported_notes

        for note in allowed_unsupported_notes(graph.meta):  # also in the summary's mapping.notes
            print(f"npusim run: warning: {note}", file=sys.stderr)
        return graph
    from npusim.model.builder import build_graph
    from npusim.model.zoo import get_config

    context = get_config(args.model).max_position_embeddings
    tokens = _kv(args) + 1 if args.phase == "decode" else max(_kv(args), args.seq)
    if context and tokens > context:
        raise ConfigError(f"--seq/--kv: {tokens:,} tokens in the KV cache, more than {args.model}'s context of "
                          f"{context:,} (max_position_embeddings)")
    if args.phase == "decode":  # one new token per sequence, attending to the cache and itself
        return build_graph(args.model, phase="decode", batch=args.batch, seq_len=1, kv_len=_kv(args) + 1,
                           precision=chip_precision(args), layers=args.layers)
    return build_graph(args.model, phase="prefill", batch=args.batch, seq_len=args.seq,
                       kv_len=max(_kv(args), args.seq), precision=chip_precision(args), layers=args.layers)


def _kv(args) -> int:
    """Tokens in the KV cache: ``--kv``, else ``--seq``."""
    return args.seq if args.kv is None else args.kv


def build_graph_for_spec(args):
    """A small graph of the model (one decode token) to derive a serving mapping from."""
    from npusim.model.builder import build_graph

    if str(args.model).lower().endswith(".onnx"):
        raise ConfigError(f"--model {args.model}: serving builds each iteration's graph from a model config (a "
                          "built-in name or a config.json); an ONNX graph runs one forward pass (--forward) but "
                          "cannot be served yet")

    return build_graph(args.model, phase="decode", batch=1, seq_len=1, kv_len=2, precision=chip_precision(args),
                       layers=args.layers)


def build_spec(args, arch, graph, default_tp: int = 16, base=None):
    """The mapping: ``base`` (a MappingSpec, e.g. a sweep point's), else ``--mapping``, else derived from the chip."""
    from npusim.mapping.spec import load_mapping, spec_from_flags

    if base is None:
        base = load_mapping(args.mapping) if args.mapping else None
    tp = args.tp if args.tp is not None else (None if base else min(default_tp, arch.num_cores))
    stages = args.stages
    layout = args.layout if args.layout is not None else (None if base else "ring")
    if base is None and stages is None:
        stages = max(1, min(len(graph.layers()) or 1, arch.num_cores // tp))
    spec = spec_from_flags(base, tp=tp, partition=args.partition, layout=layout, stages=stages)
    if base is None:
        spec = spec.model_copy(update={"data_parallel": 1})
    return spec


#: ``npusim run`` flags of one chip (its mapping and ONNX import): a --system run maps the model by
#: its plan and runs on the system's die, so it refuses them rather than ignore them
CHIP_ONLY = ("arch", "layers", "partition", "layout", "stages", "allow_unsupported")
#: the serving group's flags that set up a chip's scheduler, which a --system serving run does not read
CHIP_SERVING_ONLY = ("schedule", "pd_ratio", "pd_layout", "pd_stages", "replicas", "budget", "chunk", "max_batch",
                     "max_tokens", "admission", "prefix_cache", "iteration_cache", "iteration_cache_buckets",
                     "iteration_cache_replay", "iteration_cache_dir")
#: the --system group's flags only a serving run reads, and only a one-step run reads
SYSTEM_SERVING_ONLY = ("kv_fabric", "caching_pool", "prefill_instances", "deployment")
SYSTEM_STEP_ONLY = ("batch_tokens", "save_workload", "eplb", "routing", "kv_min")
SERVING_GROUP = "serving (a request stream; selected by --trace or --rate)"
SYSTEM_GROUP = "multi-NPU system (--system)"


@functools.lru_cache(maxsize=1)
def _options() -> tuple[dict, dict, dict]:
    """``npusim run``'s options: default by dest, flag by dest, dests by option group title."""
    import argparse

    cmd = add_parser(argparse.ArgumentParser(add_help=False).add_subparsers())
    actions = [a for a in cmd._actions if a.option_strings]
    groups = {g.title: tuple(a.dest for a in g._group_actions) for g in cmd._action_groups}
    return {a.dest: a.default for a in actions}, {a.dest: a.option_strings[-1] for a in actions}, groups


def _given(args, dests) -> list[str]:
    """The flags among ``dests`` the command line set (to a value other than the default)."""
    defaults, flags, _ = _options()
    return [flags[d] for d in dests if d in defaults and getattr(args, d, defaults[d]) != defaults[d]]


def _refuse(given: list[str], why: str) -> None:
    if given:
        raise ConfigError(f"{', '.join(given)}: {why.format(it='them' if len(given) > 1 else 'it')}")


def refuse_system_flags_on_a_chip(args) -> None:
    """A chip run (no --system) refuses the --system group's flags, which it would not read."""
    _refuse(_given(args, [d for d in _options()[2][SYSTEM_GROUP] if d != "system"]),
            "taken with --system only (a run over many NPUs); this run is on one chip (--arch), which would "
            "ignore {it}: add --system S, or drop {it}")


def refuse_unread_flags(args) -> None:
    """What the run path the flags chose does not read is an error, never ignored: the --system
    group's flags on a chip; a chip's mapping flags (and --arch) on a system; chip-scheduler flags
    on a system serving run; a one-step run's flags on a serving run and the other way round."""
    groups = _options()[2]
    if args.system is None:
        refuse_system_flags_on_a_chip(args)
        if not is_serving(args) and is_forward(args):
            _refuse(_given(args, groups[SERVING_GROUP]), "serving flag(s) (a request stream: --trace, --rate or "
                    "--requests); a forward pass does not read {it}")
        return
    refuse_arch_with_system(args)
    _refuse(_given(args, CHIP_ONLY[1:]), "flag(s) of a chip run (its mapping, or an ONNX import with unsupported "
            "ops); --system maps the model by its plan (--tp, --dp, --ep, --pp ...) and does not read {it}")
    if is_serving(args):
        _refuse(_given(args, [*FORWARD_DEFAULTS, "kv", "forward", *SYSTEM_STEP_ONLY, *CHIP_SERVING_ONLY]),
                "not read by --system serving (a request stream): one step's shape and a chip's scheduler "
                "are not its; its instances and limits come from --mapping's system_serving section and the "
                "plan flags")
        return
    _refuse(_given(args, [*SYSTEM_SERVING_ONLY, *(d for d in groups[SERVING_GROUP] if d != "seed")]),
            "serving flag(s) (with --trace, --rate or --requests); a --system step does not read {it}")


def run(args) -> int:
    if getattr(args, "deployment", None) is not None:
        from npusim.cli.run_system import run_deployment

        return run_deployment(args)
    fill_model_default(args)
    refuse_unread_flags(args)
    if args.system is not None:
        return run_system(args)
    from npusim.arch import load_arch

    arch = load_arch(chip_arch(args))
    if not _forward_asked(args):
        probe = build_graph_for_spec(args)
        return run_serving(args, arch, build_spec(args, arch, probe, default_tp=SERVING_DEFAULT_TP))
    result = simulate_forward_args(args, arch)
    summary = result.summary
    if args.out:
        summary["files"] = write_outputs(args.out, result.sim, summary, result.mapped.program)
    if args.json:
        print(json_text(summary))
        return 0
    print_summary(summary, arch)
    return 0


def _forward_asked(args) -> bool:
    if is_serving(args) and is_forward(args):
        raise ConfigError("--trace/--rate/--requests serve a request stream; --forward, --phase, --batch, --seq "
                          "and --kv describe one forward pass: use one or the other")
    return is_forward(args)


def simulate_forward_args(args, arch, base=None):
    """The forward pass the options describe, simulated on ``arch`` (mapping ``base`` if given)."""
    from npusim.cli.progress import task_progress
    from npusim.scenarios.forward import simulate_forward

    graph = build_model(args)
    spec = build_spec(args, arch, graph, base=base)
    with task_progress(arch.clock_ghz, enabled=not args.no_progress) as progress:
        return simulate_forward(graph, arch, spec, memory_mode=args.memory, noc_mode=chip_noc(args),
                                progress=progress)


def run_summary(args, arch, base=None) -> dict:
    """What ``npusim run --json`` prints for parsed options on a loaded chip, without writing files or
    printing: the run path that sweeps (``npusim.sweep``) call for each point. ``base`` is a
    MappingSpec that replaces ``--mapping``."""
    fill_model_default(args)
    refuse_system_flags_on_a_chip(args)
    if not _forward_asked(args):
        probe = build_graph_for_spec(args)
        return serve(args, arch, build_spec(args, arch, probe, default_tp=SERVING_DEFAULT_TP, base=base))[0]
    return simulate_forward_args(args, arch, base).summary


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
