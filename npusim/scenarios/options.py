"""``npusim run``'s options, below the CLI: the flags (:func:`add_run_options`, the one definition the
command line shows and sweeps parse, :func:`run_parser`), which run path they choose (a forward pass,
serving on a chip, a --system step or serving, a deployment file) and what each path refuses to
ignore (:func:`refuse_unread_flags`), and the readers of the chip's fidelity and precision.

Imports only the standard library and the shared light modules (``argtypes``, ``choices``,
``errors``) at its top, so ``npusim --help`` builds its parsers without NumPy.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

from npusim.argtypes import (NODES_HELP, add_arch_arg, add_force_arg, fraction, non_negative_int, positive_float,
                             positive_int)
from npusim.choices import (DATASETS, DEFAULT_INPUT, DEFAULT_OUTPUT, DEFAULT_RATE, DEFAULT_REQUESTS,
                            LAYOUTS, LONG_PROMPT_TOKENS, MAX_REQUESTS, MEMORY_FIDELITIES, NOC_FIDELITIES,
                            PARTITIONS, RANDOM_INPUT, RANDOM_OUTPUT, SERVING_FLAGS)
from npusim.errors import ConfigError

DEFAULT_MODEL = "qwen3-4b"
SYSTEM_DEFAULT_MODEL = "deepseek-r1"
SERVING_DEFAULT_TP = 4  # many short pipeline stages: iterations of disjoint requests overlap


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
                   "fidelity ladder's quick set (docs/FIDELITY.md, session 64): path up to 9.5%% off (its memory streams as "
                   "flows, the default since session 64; 18.1%% with the old reserved streams), analytical up to 19.5%%; no cheaper NoC is within 5%%, so this default is not the rule's (the "
                   "cheapest within 5%%): it is kept for speed")
    p.add_argument("--memory-streams", default=None, metavar="MODEL",
                   help="at the path NoC, how HBM traffic crosses the mesh (npusim.sim.mempath): flow (the default of a "
                   "forward pass: one max-min flow per DMA engine with the routers' head-of-line coupling, within 6.6%% of "
                   "flit on the memory workloads, docs/FIDELITY.md), flow@Q~S, the flows with a head-of-line pass held Q "
                   "cycles and a sharing kept S cycles, a drained flow's rate held that long for its engine's next DMA "
                   "(serving's default flow@16384~256: on 100 uncached Mooncake requests a fifth of flow's time and within "
                   "0.2%% of its makespan, TTFT and time per output token over four draws of the arrivals; not for single "
                   "operators shorter than the hold), or the old streams reserving their paths, reserve, or moving hop by "
                   "hop, hop (22.5%% from flit; the default before session 64)")
    p.add_argument("--memory", choices=MEMORY_FIDELITIES, default=memory_default,
                   help=f"HBM model (default {memory_default}). Against TLM at the flit NoC on the fidelity "
                   "ladder's quick set (docs/FIDELITY.md, session 56): analytical up to 33.1%% off (an INT8 prefill "
                   "GEMM), -0.0%% on a decode step; only TLM is within 5%%")


FORWARD_DEFAULTS = {"phase": "decode", "batch": 16, "seq": 1024}


def fill_model_default(args) -> None:
    """``--model`` when not given: Qwen3-4B on a chip, DeepSeek-R1 on a system."""
    if getattr(args, "model", None) is None:
        args.model = DEFAULT_MODEL if getattr(args, "system", None) is None else SYSTEM_DEFAULT_MODEL


def is_forward(args) -> bool:
    """A forward pass was asked for: ``--forward`` or any forward-pass flag."""
    return getattr(args, "forward", True) or any(getattr(args, k, None) is not None
                                                  for k in (*FORWARD_DEFAULTS, "kv"))


def _positive_or_inf(text: str, expected: str) -> float:
    """A positive number or inf, else argparse's one-line error saying ``expected``."""
    import argparse
    import math

    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or math.isnan(value):
        raise argparse.ArgumentTypeError(f"'{text}' is not {expected}")
    return value


def rate_or_inf(text: str) -> float:
    """--request-rate: a positive number of requests per second, or inf (all sent at once)."""
    return _positive_or_inf(text, "a positive number of requests per second or inf")


def burstiness_value(text: str) -> float:
    """--burstiness: a positive gamma shape (1: Poisson), or inf (constant spacing)."""
    return _positive_or_inf(text, "a positive number (1: Poisson) or inf (constant gaps)")


def add_serving_args(p) -> None:
    g = p.add_argument_group("serving (a request stream; selected by --trace or --rate)")
    g.add_argument("--trace", type=Path, default=None, help="request trace: Mooncake .jsonl or .csv")
    g.add_argument("--rate", type=positive_float, default=None,
                   help=f"synthetic Poisson arrivals, requests per second (default {DEFAULT_RATE:g})")
    g.add_argument("--requests", type=positive_int, default=None,
                   help=f"number of requests (synthetic: default {DEFAULT_REQUESTS}; trace: the first N)")
    g.add_argument("--input-len", default=None, help=f"synthetic prompt tokens: N, I1:I2 uniform or "
                   f"lognormal:MEAN:SIGMA[:MAX] (default {DEFAULT_INPUT}); with --dataset random one number N, "
                   f"the centre of the --range-ratio spread (default {RANDOM_INPUT})")
    g.add_argument("--output-len", default=None, help=f"synthetic output tokens: N, O1:O2 uniform or "
                   f"lognormal:MEAN:SIGMA[:MAX] (default {DEFAULT_OUTPUT}); with --dataset random one number N "
                   f"(default {RANDOM_OUTPUT})")
    g.add_argument("--dataset", choices=DATASETS, default=None,
                   help="benchmark client (as vllm bench serve): random (vLLM's: lengths uniform in "
                   "[floor(I(1-R)), ceil(I(1+R))] around --input-len/--output-len), sharegpt-like (short prompts, "
                   "long replies: the decode-dominated preset) or mooncake-like (long prompts: the prefill-dominated "
                   "preset); a Mooncake trace is --trace FILE. Any client flag sends every request at once "
                   "unless --request-rate says otherwise")
    g.add_argument("--range-ratio", type=float, default=None,
                   help="--dataset random: spread R of the lengths, in [0, 1) (default 0: every length exactly N)")
    g.add_argument("--num-prompts", type=positive_int, default=None,
                   help=f"benchmark client: requests to send (--requests by vLLM's name; default {DEFAULT_REQUESTS})")
    g.add_argument("--max-concurrency", type=positive_int, default=None,
                   help="benchmark client: at most C requests in flight, the next sent the moment one completes "
                   "(a closed loop with --request-rate inf); latencies count from each request's send")
    g.add_argument("--request-rate", type=rate_or_inf, default=None,
                   help="benchmark client: planned sends per second, or inf (default: all at t=0, limited only by "
                   "--max-concurrency); --rate is the same for the default source (default 8)")
    g.add_argument("--burstiness", type=burstiness_value, default=None,
                   help="--request-rate's gaps: gamma with this shape, mean 1/rate (default 1: Poisson; inf: constant "
                   "gaps of 1/rate)")
    g.add_argument("--sweep-concurrency", default=None, metavar="C1,C2,...",
                   help="benchmark client: one run per --max-concurrency value (same prompts, same seed), one row "
                   "each (JSON: rows)")
    g.add_argument("--duration", type=positive_float, default=None, help="trace: only arrivals in the first S seconds")
    g.add_argument("--time-scale", type=positive_float, default=1.0, help="trace: multiply arrival times by this")
    g.add_argument("--max-input", type=positive_int, default=None, help="clip prompts to this many tokens")
    g.add_argument("--max-output", type=positive_int, default=None, help="clip outputs to this many tokens")
    g.add_argument("--schedule", choices=["fusion", "continuous", "disagg"], default=None,
                   help="PD fusion under a budget, continuous batching, or PD disaggregation (default: the "
                   "mapping spec's serving.schedule, else fusion)")
    g.add_argument("--pd-ratio", default=None,
                   help="--schedule disagg: prefill:decode cores, e.g. 42:21 (a ratio like 2:1 is scaled to the "
                   "chip; default 2:1)")
    g.add_argument("--pd-layout", choices=["pp_first", "dp_first"], default=None,
                   help="--schedule disagg: one P/D split of the chip (pp_first, default: decode cores in the middle "
                   "columns), or one per data-parallel replica (dp_first)")
    g.add_argument("--pd-stages", default=None,
                   help="--schedule disagg: pipeline stages of the prefill and decode instances, P:D (default: the "
                   "fewest with at most 32 cores a stage)")
    g.add_argument("--replicas", type=positive_int, default=None,
                   help="data-parallel copies, each on an equal band of columns (default 1; dp_first: 2)")
    g.add_argument("--budget", type=positive_int, default=None, help="fusion: units per iteration (decode 1, chunk = tokens; "
                   "default 1024)")
    g.add_argument("--chunk", type=non_negative_int, default=None, help="prefill chunk tokens (0: whole prompts, continuous only; "
                   "default 512)")
    g.add_argument("--max-batch", type=positive_int, default=None, help="running requests at most (default 256)")
    g.add_argument("--max-tokens", type=positive_int, default=None, help="continuous: tokens per iteration at most "
                   "(default 8192)")
    g.add_argument("--admission", choices=["queue", "preempt"], default="queue",
                   help="when KV memory is full: make arrivals wait, or preempt the newest running request")
    g.add_argument("--prefix-cache", action="store_true", help="reuse KV of shared prompt prefixes (trace hash_ids)")
    g.add_argument("--slo-ttft-ms", type=positive_float, default=None, help="goodput: TTFT objective")
    g.add_argument("--slo-tbt-ms", type=positive_float, default=None, help="goodput: time-between-tokens objective")
    g.add_argument("--slo-tpot-ms", type=positive_float, default=None, help="goodput: TPOT objective (each request's "
                   "mean gap; with --system default: the mapping's; --slo-tbt-ms bounds every gap instead)")
    g.add_argument("--seed", type=non_negative_int, default=0, help="synthetic arrivals and lengths")
    g.add_argument("--iteration-cache", choices=["auto", "on", "off"], default="auto",
                   help="replay each iteration shape's chip timing, simulated once, instead of simulating every "
                   "iteration: a cheaper fidelity, 6-16x less CPU, within 3%% of off on throughput and 7.3%% on mean "
                   "TTFT/TBT when one instance runs on the chip, far off when instances share it (PD "
                   "disaggregation: TTFT -70%%; validation/serving_iteration_cache.py). auto (default): on for "
                   "one instance, off for PD disaggregation or data-parallel replicas")
    g.add_argument("--iteration-cache-buckets", default=None,
                   help="iteration cache key buckets: kv=TOKENS (multiple of 256; the stage replay interpolates "
                   "between bucket edges on one KV axis per attention group), kv_edges=linear|pow2 (pow2: powers "
                   "of two below the kv bucket, its multiples above), batch=N (decode counts rounded up), "
                   "chunk=TOKENS (multiple of 16), chunk_edges=round|interp (interp: chunk lengths interpolated "
                   "between 16, 16R, 16R^2, ... below 512 and multiples of 512 with chunk_ratio=R, default 2, and "
                   "their cached prefix between KV edges from prefix_min=TOKENS), decode_kv=group|shared (shared: an iteration's decode groups on one KV axis; "
                   "mixed_kv=TOKENS its bucket beside a prefill chunk), sampled=N (LM-head rows rounded up), "
                   "blend_kv=TOKENS (one coarse cell for the all-in-SRAM shapes a KV share in HBM blends with), any "
                   "of them; exact (kv=256,batch=8,chunk=16); or long (kv=16384,kv_edges=pow2,chunk_edges=interp,"
                   "decode_kv=shared,sampled=8,chunk_ratio=4,prefix_min=4096,blend_kv=16384,mixed_kv=the model's "
                   "context: 422 shapes instead of 4,864 on the README's Mooncake replay, within 1%% of exact but the TBT median; "
                   "validation/serving_kv_interpolation.py). Default: auto, exact unless a prompt is longer than "
                   f"{LONG_PROMPT_TOKENS:,} tokens, then long")
    g.add_argument("--iteration-cache-replay", choices=["stages", "skeleton"], default=None,
                   help="how a cached iteration replays: stages (one hold per pipeline stage, set by how many "
                   "iterations are in flight; the default) or skeleton (each DMA replayed, compute and NoC held)")
    g.add_argument("--iteration-cache-dir", type=Path, default=None,
                   help="keep the iteration cache's measured shapes in this directory and reuse them in later runs "
                   "(keyed by chip, mapping, model, fidelity and npusim's code; default: this run only)")


def is_serving(args) -> bool:
    """Whether a request stream was asked for (any of :data:`npusim.choices.SERVING_FLAGS`)."""
    return any(getattr(args, f, None) is not None for f in SERVING_FLAGS)


def add_system_run_args(p) -> None:
    g = p.add_argument_group("multi-NPU system (--system)")
    g.add_argument("--system", default=None, help="system preset or file (cloudmatrix384, atlas-800i-a2): simulate "
                   "one step of a MoE model deployed by --mapping's system section, or, with --trace/--rate/"
                   "--requests, serve requests by its system_serving section (default: mappers/cm384-deepseek-"
                   "serving.yaml or a2-deepseek-serving.yaml)")
    g.add_argument("--nodes", type=positive_int, default=None, help=NODES_HELP)
    g.add_argument("--batch-tokens", type=positive_int, default=None, help="prefill: prompt tokens per NPU in the step")
    g.add_argument("--mtp", type=non_negative_int, default=None, help="speculative (MTP) tokens per step (default: the mapping's, 0)")
    g.add_argument("--mtp-acceptance", type=fraction, default=None, help="MTP acceptance rate (default 0.7)")
    g.add_argument("--microbatches", type=positive_int, default=None, help="micro-batches per step (default: the "
                   "mapping's, or 1)")
    g.add_argument("--npus", type=positive_int, default=None, help="NPUs of the instance (plan path; default: one node "
                   "of the system)")
    g.add_argument("--dp", type=positive_int, default=None, help="attention data-parallel groups (plan path)")
    g.add_argument("--ep", type=positive_int, default=None, help="expert-parallel degree (plan path; default: every "
                   "rank of a stage for MoE models, 1 for dense)")
    g.add_argument("--expert-tp", type=positive_int, default=None, help="tensor parallelism inside one routed expert: "
                   "its intermediate width split over this many dies of an EP group (default: the mapping's, or 1)")
    g.add_argument("--cp", type=positive_int, default=None, help="context parallelism (prefill): each prompt split "
                   "over this many groups of --tp dies, attention as ring attention (tp x dp x cp x pp = dies; "
                   "default: the mapping's, or 1)")
    g.add_argument("--pp", type=positive_int, default=None, help="pipeline stages across NPUs (plan path; default 1)")
    g.add_argument("--kv-dtype", choices=["bf16", "int8"], default=None, help="KV-cache dtype (plan path; default bf16)")
    g.add_argument("--shared-tp", type=positive_int, default=None, help="shared experts split over groups of this many "
                   "dies (plan path; default 1: every die computes them for its own tokens)")
    g.add_argument("--save-workload", type=Path, default=None, metavar="DIR",
                   help="write the step's workload (workload.json) to DIR; re-time it with `npusim replay DIR --system S`")
    g.add_argument("--eplb", choices=["none", "greedy", "perfect"], default=None, help="expert placement by load")
    g.add_argument("--runtime", choices=["eager", "graph"], default=None, help="the software runtime a step runs "
                   "under: eager (the host dispatches operator by operator, the device waits when the host is "
                   "behind) or graph (one graph replay per step); default: the system's runtime section (graph "
                   "for decode, eager for prefill on the presets)")
    g.add_argument("--routing", default="uniform", help="expert popularity: uniform, zipf:S or a load-profile file")
    g.add_argument("--kv-min", type=non_negative_int, default=None, help="decode: spread the sequences' contexts uniformly over "
                   "[KV_MIN, 2 x --kv - KV_MIN] (seeded), so the die with the longest sets the pace (default: all "
                   "at --kv)")
    g.add_argument("--kv-fabric", default=None, help="serving: the fabric KV moves over from prefill to decode "
                   "(e.g. rdma or ub; default: the mapping's)")
    g.add_argument("--caching-pool", choices=["on", "off"], default=None,
                   help="serving: the EMS-style prefix KV pool in the CPUs' DRAM (default: the mapping's)")
    g.add_argument("--prefill-instances", type=positive_int, default=None, help="serving: prefill instances (default: the "
                   "mapping's)")
    g.add_argument("--deployment", type=Path, default=None, metavar="FILE",
                   help="serve a deployment file (DIR/deployment.yaml from `npusim plan --serving --out DIR`: its "
                   "system, model, pools and plans) with the benchmark client's flags (--dataset random --input-len "
                   "--output-len --num-prompts --max-concurrency ...)")




def add_run_options(p) -> None:
    """Every flag of ``npusim run`` on ``p``."""
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


class _RaisingParser(argparse.ArgumentParser):
    """A parser raising ConfigError instead of exiting (a sweep point's options are checked with it)."""

    def error(self, message):
        raise ConfigError(message)


@functools.lru_cache(maxsize=1)
def run_parser() -> argparse.ArgumentParser:
    """``npusim run``'s flags as a parser that raises :class:`ConfigError` on a bad option."""
    p = _RaisingParser(prog="npusim run", add_help=False)
    add_run_options(p)
    return p

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
    cmd = run_parser()
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


def forward_asked(args) -> bool:
    if is_serving(args) and is_forward(args):
        raise ConfigError("--trace/--rate/--requests serve a request stream; --forward, --phase, --batch, --seq "
                          "and --kv describe one forward pass: use one or the other")
    return is_forward(args)


def chip_arch(args) -> str:
    """The chip a command without ``--system`` runs on: ``--arch``, default npusim-64c."""
    from npusim.choices import DEFAULT_ARCH

    return args.arch or DEFAULT_ARCH


def refuse_arch_with_system(args) -> None:
    """``--arch`` (and the chip path's ``--memory-streams``) beside ``--system`` is an error, not ignored: a
    system runs on the die its file names, its chip costs at their own stream model."""
    if getattr(args, "memory_streams", None) is not None:
        raise ConfigError(f"--memory-streams {args.memory_streams}: the chip path's path NoC option; --system "
                          f"{args.system} costs its chips at the ChipCost defaults (drop the flag)")
    if getattr(args, "arch", None) is not None:
        raise ConfigError(f"--arch {args.arch}: --system {args.system} runs on its own die (system.npu.chip in the "
                          "system file); drop --arch (for another die, copy the system file and name it there)")


#: the operator graph's precision for a ``--precision`` choice (fp16 runs as bf16: same width and rate)
CHIP_PRECISION = {"bf16": "bf16", "fp16": "bf16", "a8w8": "a8w8", "w8a8": "a8w8"}


def chip_precision(args) -> str:
    """The chip path's operator-graph precision for ``--precision`` (default bf16)."""
    return CHIP_PRECISION[getattr(args, "precision", None) or "bf16"]


def chip_noc(args) -> str:
    """The chip path's NoC fidelity: ``--fidelity``, default path."""
    return getattr(args, "fidelity", None) or "path"


def chip_streams(args) -> dict:
    """The chip path's memory stream model as keyword arguments: ``{"memory_streams": --memory-streams}``, or
    none when the flag is not given (the simulators' own defaults: ``flow``, and ``flow@16384~256`` when serving;
    validation scripts set those defaults to compare stream models through the CLI's runs). Given at another NoC fidelity than path, or a
    value :func:`npusim.sim.mempath.parse_streams` refuses, it is an error."""
    from npusim.sim.mempath import parse_streams

    streams = getattr(args, "memory_streams", None)
    if streams is None:
        return {}
    try:
        parse_streams(streams)
    except ValueError as e:
        raise ConfigError(f"--memory-streams {streams}: {e}") from None
    if chip_noc(args) != "path":
        raise ConfigError(f"--memory-streams {streams}: the path NoC's memory stream model; --fidelity "
                          f"{chip_noc(args)} has none (drop the flag, or use --fidelity path)")
    return {"memory_streams": streams}


def system_chip_cost(args, loaded):
    """The chip-cost model of a --system run at the chip fidelity the flags ask for: ``--memory``
    (default analytical) and ``--fidelity`` (the NoC; default analytical)."""
    from npusim.system.chipcost import ChipCost

    return ChipCost(loaded.chip, memory=getattr(args, "memory", None) or "analytical",
                    noc=getattr(args, "fidelity", None) or "analytical")


#: --precision choices as a plan names them
PLAN_PRECISION = {"bf16": "bf16", "fp16": "fp16", "a8w8": "w8a8", "w8a8": "w8a8"}
