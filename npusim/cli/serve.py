"""The serving mode of ``npusim run`` (its default): a stream of requests.

Requests come from a Mooncake JSONL / CSV trace (``--trace FILE``) or a synthetic Poisson
source (``--rate R --requests N``; without either, the default scenario's 32 requests at 8
per second, prompts of 128-512 tokens, 32-128 output tokens); the scheduler (``--schedule``)
decides each iteration in Python and the engine executes it (see
``npusim.serving.simulate``). ``--schedule disagg --pd-ratio P:D`` splits the cores into a
prefill and a decode instance (PP-first layout: decode cores in the middle columns), or with
``--pd-layout dp_first --replicas R`` each of R bands of columns into its own pair. Flags
override the mapping spec's ``serving:`` section.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

from npusim.errors import ConfigError
from npusim.files import check_output_dir, json_text
from npusim.cli.util import chip_noc, chip_precision, non_negative_int, positive_float, positive_int, refuse_unless_forced

#: the benchmark client's flags (vllm bench serve's names): any of them makes a serving run a client's
CLIENT_FLAGS = ("dataset", "num_prompts", "max_concurrency", "request_rate", "sweep_concurrency")
SERVING_FLAGS = ("trace", "rate", "requests", *CLIENT_FLAGS)
#: --dataset's choices (npusim.serving.client.DATASETS; here so --help imports no NumPy)
DATASETS = ("random", "sharegpt-like", "mooncake-like")
#: synthetic requests a run takes without --force, and the memory each costs (request, record and
#: its token times, measured on the default scenario's lengths)
MAX_REQUESTS = 1_000_000
BYTES_PER_REQUEST = 3_000
LONG_PROMPT_TOKENS = 4096  # --iteration-cache auto: longer prompts use the long buckets (see _iteration_cache)
DEFAULT_RATE, DEFAULT_REQUESTS, DEFAULT_INPUT, DEFAULT_OUTPUT = 8.0, 32, "128:512", "32:128"
#: --dataset random's lengths when --input-len/--output-len are not given (vllm bench serve's defaults)
RANDOM_INPUT, RANDOM_OUTPUT = 1024, 128


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
    return any(getattr(args, f, None) is not None for f in SERVING_FLAGS)


def is_client(args) -> bool:
    """Whether a benchmark client flag (:data:`CLIENT_FLAGS`) was given."""
    return any(getattr(args, f, None) is not None for f in CLIENT_FLAGS)


def check_client_args(args) -> None:
    """The benchmark client's flags, checked against each other and the older serving flags
    (one-line errors naming the flag)."""
    for new, old in (("num_prompts", "requests"), ("request_rate", "rate")):
        if getattr(args, new, None) is not None and getattr(args, old, None) is not None:
            raise ConfigError(f"--{new.replace('_', '-')} and --{old}: the same setting by two names; give one")
    if getattr(args, "max_concurrency", None) is not None and getattr(args, "sweep_concurrency", None) is not None:
        raise ConfigError("--max-concurrency and --sweep-concurrency: a sweep sets the concurrency of each run; "
                          "give one")
    if args.trace is not None:
        for flag in ("dataset", "request_rate", "burstiness", "range_ratio"):
            if getattr(args, flag, None) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')}: --trace FILE brings its own prompts and arrival "
                                  "times; drop one of them")
    if getattr(args, "range_ratio", None) is not None and getattr(args, "dataset", None) != "random":
        raise ConfigError("--range-ratio: the spread of --dataset random's lengths; add --dataset random")
    if getattr(args, "burstiness", None) is not None and getattr(args, "request_rate", None) is None:
        raise ConfigError("--burstiness: the shape of --request-rate's gaps; add --request-rate R")
    if getattr(args, "dataset", None) not in (None, "random"):
        for flag in ("input_len", "output_len"):
            if getattr(args, flag, None) is not None:
                raise ConfigError(f"--{flag.replace('_', '-')}: --dataset {args.dataset} draws its own lengths "
                                  "(use --dataset random, or no --dataset, to set them)")


def _client_int(text, flag: str, default: int) -> int:
    if text is None:
        return default
    try:
        value = int(str(text))
    except ValueError:
        raise ConfigError(f"{flag} '{text}': --dataset random takes one number of tokens, the centre of the "
                          "--range-ratio spread (I1:I2 ranges and lognormal:... are for the source without "
                          "--dataset)") from None
    if value < 1:
        raise ConfigError(f"{flag} {value}: expected a positive number of tokens")
    return value


def _lengths(args):
    """The input and output length distributions the flags give."""
    from npusim.serving.client import DATASET_PRESETS, random_lengths
    from npusim.serving.requests import PRESETS

    dataset = getattr(args, "dataset", None)
    if dataset == "random":
        ratio = 0.0 if args.range_ratio is None else args.range_ratio
        return (random_lengths(_client_int(args.input_len, "--input-len", RANDOM_INPUT), ratio, "--input-len"),
                random_lengths(_client_int(args.output_len, "--output-len", RANDOM_OUTPUT), ratio, "--output-len"))
    if dataset in DATASET_PRESETS:
        preset = PRESETS[DATASET_PRESETS[dataset]]
        return preset.input_len, preset.output_len
    return (_length(DEFAULT_INPUT if args.input_len is None else args.input_len, "--input-len"),
            _length(DEFAULT_OUTPUT if args.output_len is None else args.output_len, "--output-len"))


def requests_from_args(args):
    """The requests the flags describe: (requests, how many lengths were clipped, how many
    prompts were clipped to the model's context). With a benchmark client flag the arrival times
    are the client's planned sends (:func:`npusim.serving.client.send_times`: all at 0 unless
    --request-rate); without, the older Poisson source at --rate."""
    import math

    from npusim.serving.client import send_times
    from npusim.serving.requests import cap_lengths, synthetic_requests
    from npusim.serving.traces import load_trace

    check_client_args(args)
    n_given = args.requests if args.requests is not None else getattr(args, "num_prompts", None)
    if args.trace is not None:
        window = (0.0, args.duration) if args.duration else None
        reqs = load_trace(args.trace, first=n_given, window=window, scale=args.time_scale)
    else:
        n = DEFAULT_REQUESTS if n_given is None else n_given
        refuse_unless_forced(args, n, MAX_REQUESTS, "--num-prompts" if args.requests is None else "--requests",
                             f"~{n * BYTES_PER_REQUEST / 1e9:,.1f} GB of request records and days of simulation")
        input_len, output_len = _lengths(args)
        if is_client(args):
            rate = args.request_rate if args.request_rate is not None else args.rate
            rate = math.inf if rate is None else rate
            times = send_times(n, rate, 1.0 if args.burstiness is None else args.burstiness, args.seed)
            reqs = synthetic_requests(n, math.inf, input_len=input_len, output_len=output_len, seed=args.seed)
            reqs = [replace(r, arrival_s=float(t)) for r, t in zip(reqs, times)]
        else:
            rate = DEFAULT_RATE if args.rate is None else args.rate
            reqs = synthetic_requests(n, rate, input_len=input_len, output_len=output_len, seed=args.seed)
    clipped = 0
    if args.max_input or args.max_output:
        reqs, clipped = cap_lengths(reqs, args.max_input, args.max_output, policy="clip")
    reqs, over = _fit_context(args.model, reqs)
    return reqs, clipped, over


def _fit_context(model: str, reqs):
    """Requests clipped to ``model``'s context (said once on stderr), and how many were."""
    from npusim.model.zoo import get_config
    from npusim.serving.requests import fit_context

    cfg = get_config(model)
    if cfg.max_position_embeddings <= 0:  # a config that does not say
        return reqs, 0
    reqs, over = fit_context(reqs, cfg.max_position_embeddings)
    if over:
        print(f"npusim run: warning: {over} of {len(reqs)} requests are longer than {cfg.name}'s context of "
              f"{cfg.max_position_embeddings:,} tokens (prompt + output); their prompts are clipped to fit",
              file=sys.stderr)
    return reqs, over


def _length(text, flag):
    from npusim.serving.requests import parse_length

    try:
        return parse_length(text)
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"{flag}: {exc}") from None


def serving_options(args, spec) -> dict:
    """The spec's ``serving:`` section with the command-line flags applied."""
    from npusim.config import validate
    from npusim.mapping.spec import Serving

    opts = spec.serving.model_dump()
    for key, flag in (("schedule", "schedule"), ("pd_layout", "pd_layout"), ("replicas", "replicas"),
                      ("budget", "budget"), ("chunk_tokens", "chunk"), ("max_batch", "max_batch"),
                      ("max_tokens", "max_tokens")):
        if getattr(args, flag, None) is not None:
            opts[key] = getattr(args, flag)
    if getattr(args, "pd_stages", None):
        opts["pd_stages"] = _pair(args.pd_stages, "--pd-stages")
    if getattr(args, "pd_layout", None) is not None and getattr(args, "replicas", None) is None:
        opts["replicas"] = None  # a layout from the command line brings its own default
    opts = validate(Serving, opts, "command-line serving options").model_dump()
    disagg = opts["schedule"] == "disagg"
    for flag in ("pd_stages", "pd_layout"):
        if getattr(args, flag, None) is not None and not disagg:
            raise ConfigError(f"--{flag.replace('_', '-')} needs --schedule disagg")
    if opts["replicas"] is None:
        opts["replicas"] = 2 if disagg and opts["pd_layout"] == "dp_first" else 1
    if opts["pd_layout"] == "pp_first" and opts["replicas"] > 1 and disagg:
        raise ConfigError("PD disaggregation over several replicas is the dp_first layout: add --pd-layout dp_first")
    return opts


def _iteration_cache(args, shared_chip: bool, reqs, context: int):
    """The iteration cache's buckets, or None (every iteration simulated): ``--iteration-cache
    on``, or ``auto`` when one instance runs on the chip (``shared_chip``: PD disaggregation or
    replicas, whose interference the cache does not see). Without ``--iteration-cache-buckets``:
    exact, or the long buckets when a prompt of ``reqs`` is longer than ``LONG_PROMPT_TOKENS``
    (exact keys then hardly repeat: every chunk of a long prompt has its own cached prefix);
    ``context``: the model's context length, which the long buckets span."""
    from npusim.serving.itercache import EXACT, long_context, parse_buckets

    text = getattr(args, "iteration_cache_buckets", None)
    mode = getattr(args, "iteration_cache", "auto")
    if mode == "off" or (mode == "auto" and shared_chip):
        why = ("" if mode == "off" else " (auto turns it off when instances share the chip, PD disaggregation "
               "or replicas, where its error is large; --iteration-cache on uses it anyway)")
        for flag in ("buckets", "dir", "replay"):
            if getattr(args, f"iteration_cache_{flag}", None) is not None:
                raise ConfigError(f"--iteration-cache-{flag} needs the iteration cache on{why}")
        return None
    if getattr(args, "iteration_cache_dir", None) is not None:
        check_output_dir(args.iteration_cache_dir, "--iteration-cache-dir")
    if text is not None:
        return parse_buckets(text, context)
    if context > 0 and max((r.input_len for r in reqs), default=0) > LONG_PROMPT_TOKENS:
        return long_context(context)
    return EXACT


def _pair(text: str, flag: str) -> tuple[int, int]:
    try:
        a, b = (int(x) for x in text.split(":"))
    except ValueError:
        raise ConfigError(f"{flag} '{text}': expected two positive integers A:B, e.g. 7:7") from None
    if a < 1 or b < 1:
        raise ConfigError(f"{flag} '{text}': both parts must be positive")
    return a, b


def pd_split(args, arch, opts: dict) -> tuple[int, int] | None:
    """``--schedule disagg`` with ``--pd-ratio P:D`` (core counts, or a ratio scaled to the chip)."""
    if opts["schedule"] != "disagg":
        if args.pd_ratio:
            raise ConfigError("--pd-ratio needs --schedule disagg")
        return None
    explicit = args.pd_ratio or (":".join(map(str, opts["pd_ratio"])) if opts["pd_ratio"] else None)
    text = explicit or "2:1"
    p, d = _pair(text, "--pd-ratio")
    if p + d <= arch.num_cores and explicit:
        return p, d
    # a ratio: as many whole multiples as fit the chip (and split evenly over the replicas)
    r = opts["replicas"]
    scale = (arch.num_cores // r // (p + d)) * r
    if scale < 1:
        raise ConfigError(f"--pd-ratio {text} needs {(p + d) * r} cores; {arch.name} has {arch.num_cores}")
    return p * scale, d * scale


def client_fields(args, max_concurrency: int | None) -> dict:
    """The benchmark client's settings, as the summary records them (None: not a client run)."""
    import math

    if not is_client(args):
        return {}
    rate = args.request_rate if args.request_rate is not None else args.rate
    return {"dataset": args.dataset, "max_concurrency": max_concurrency,
            "request_rate": "trace" if args.trace is not None else "inf" if rate is None or math.isinf(rate) else rate,
            "burstiness": None if rate is None else ("inf" if args.burstiness is not None and math.isinf(args.burstiness)
                                                     else args.burstiness or 1.0)}


def serve(args, arch, spec, max_concurrency: int | None = None):
    """Simulate the request stream the options describe: (summary dict, the serving run).
    ``max_concurrency``: the client's limit on requests in flight (default: --max-concurrency)."""
    from npusim.cli.progress import request_progress
    from npusim.model.zoo import get_config
    from npusim.serving.scheduler import SchedulerConfig
    from npusim.serving.simulate import ServingConfig, simulate_serving

    opts = serving_options(args, spec)
    spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"pd_stages": opts["pd_stages"]})})
    pd = pd_split(args, arch, opts)
    reqs, clipped, over_context = requests_from_args(args)
    context = get_config(args.model).max_position_embeddings
    sched = SchedulerConfig(policy="continuous" if pd else opts["schedule"], max_batch=opts["max_batch"],
                            max_tokens=opts["max_tokens"], chunk_tokens=opts["chunk_tokens"], budget=opts["budget"])
    cfg = ServingConfig(model=args.model, precision=chip_precision(args), layers=args.layers, scheduler=sched,
                        memory_mode=args.memory, noc_mode=chip_noc(args), admission=args.admission,
                        prefix_cache=args.prefix_cache, slo_ttft_ms=args.slo_ttft_ms, slo_tbt_ms=args.slo_tbt_ms,
                        slo_tpot_ms=getattr(args, "slo_tpot_ms", None),
                        iteration_cache=_iteration_cache(args, pd is not None or opts["replicas"] > 1, reqs, context),
                        iteration_cache_dir=getattr(args, "iteration_cache_dir", None),
                        iteration_replay=getattr(args, "iteration_cache_replay", None) or "stages")
    if max_concurrency is None:
        max_concurrency = getattr(args, "max_concurrency", None)
    with request_progress(len(reqs), enabled=not args.no_progress) as progress:
        run = simulate_serving(arch, spec, reqs, cfg, progress=progress, pd=pd, replicas=opts["replicas"],
                               max_concurrency=max_concurrency)
    s = run.summary
    s.update({"model": args.model, "arch": arch.name, "requests": len(reqs), "lengths_clipped": clipped,
              "context_clipped": over_context,
              "memory_fidelity": args.memory, "noc_fidelity": chip_noc(args), **client_fields(args, max_concurrency)})
    s["iteration_cache"]["requested"] = getattr(args, "iteration_cache", "auto")
    if cfg.iteration_cache is not None:
        from npusim.serving.itercache import preset_name

        s["iteration_cache"]["preset"] = preset_name(cfg.iteration_cache, context)
    return s, run


def run_serving(args, arch, spec) -> int:
    from npusim.files import result_files, write_json
    from npusim.report.perfetto import write_serving_timeline
    from npusim.serving.metrics import write_serving_hdf5

    if getattr(args, "sweep_concurrency", None) is not None:
        from npusim.serving.client import bench_row, parse_concurrencies

        rows = []
        for c in parse_concurrencies(args.sweep_concurrency):
            s, _ = serve(args, arch, spec, max_concurrency=c)
            rows.append(bench_row(s, c))
        return print_sweep(args, {"model": args.model, "arch": arch.name, "requests": s["requests"],
                                  **client_fields(args, None), "rows": rows})
    s, run = serve(args, arch, spec)
    if args.out:
        files = {"summary": args.out / "summary.json", "serving": args.out / "serving.h5",
                 "timeline": args.out / "timeline.json"}
        plots = {k: args.out / name for k, name in PLOTS.items()}
        with result_files({**files, **plots}) as staged:
            write_serving_hdf5(staged["serving"], run.records, run.iterations, run.series,
                               attrs={"arch": arch.name, "model": args.model})
            write_serving_timeline(staged["timeline"], run.records, run.iterations)
            if _plots(run, {k: staged[k] for k in plots}):
                files.update(plots)
            s["files"] = {k: str(v) for k, v in files.items()}
            write_json(staged["summary"], s)
    if args.json:
        print(json_text(s))
        return 0
    _print(s)
    return 0


def print_sweep(args, out: dict) -> int:
    """A concurrency sweep's result: JSON ``{..., "rows": [...]}`` with --json (and in
    ``--out``/summary.json), else a benchmark table, one row per concurrency."""
    from npusim.files import write_json
    from npusim.serving.client import sweep_table

    out.pop("max_concurrency", None)  # each row has its own
    if args.out:
        out["files"] = {"summary": str(args.out / "summary.json")}
        write_json(args.out / "summary.json", out)
    if args.json:
        print(json_text(out))
        return 0
    where = out.get("arch") or out.get("system")
    print(f"{out['model']} on {where}: {out['requests']} prompts (dataset {out.get('dataset') or 'synthetic'}, "
          f"request rate {out.get('request_rate')}), one run per max concurrency")
    print(sweep_table(out["rows"]))
    for name, path in out.get("files", {}).items():
        print(f"  wrote {name:<9} {path}")
    return 0


#: the serving plots written with --out when matplotlib (the plot extra) is installed
PLOTS = {"latency_plot": "latency_cdf.png", "series_plot": "over_time.png"}


def _plots(run, files: dict) -> bool:
    """Latency CDFs and utilisation over time as PNGs at ``files`` (keys of :data:`PLOTS`); False
    without matplotlib."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return False
    from npusim.serving.metrics import plot_latency_cdfs, plot_series

    plot_latency_cdfs(run.records, files["latency_plot"])
    plot_series(run.series, files["series_plot"])
    return True


def fmt(value, spec: str = ",.1f") -> str:
    """``value`` formatted, or ``-`` when there is none (e.g. a rate when no request completed)."""
    return "-" if value is None else format(value, spec)


def latency_line(stats: dict | None) -> str:
    """``mean .. p50 .. p99 ..`` of a :func:`npusim.serving.metrics.latency_stats_ms` dict (``-`` if empty)."""
    v = stats or {}
    return "-" if v.get("mean") is None else f"mean {v['mean']:.1f}  p50 {v['p50']:.1f}  p99 {v['p99']:.1f}"


def client_line(s: dict) -> str:
    """The benchmark client's line of a text summary: its settings and the mean in flight."""
    who = (f"dataset {s.get('dataset') or 'synthetic'}, max concurrency {s.get('max_concurrency') or 'none'}, "
           f"request rate {s.get('request_rate', '-')}; " if "max_concurrency" in s else "")
    return (f"  client         {who}{fmt(s.get('mean_concurrency'), '.2f')} requests in flight on average "
            f"(request throughput x mean E2E), {fmt(s.get('total_token_throughput'), ',.1f')} total tokens/s")


def _print(s: dict) -> None:
    print(f"{s['model']} serving on {s['arch']}: {s['requests']} requests, schedule {s['scheduler']['policy']} "
          f"(memory {s['memory_fidelity']}, NoC {s['noc_fidelity']})")
    print(f"  completed      {s['requests_completed']} completed, {s['requests_rejected']} rejected, "
          f"{s['iterations']} iterations over {s['simulated_s']:.3f} s simulated")
    if not s["requests_completed"]:
        print("  NOTE           no request completed in the simulated time: no throughput or latency to report "
              "(a request rejected says why in serving.h5; see the rejected count above)")
    print(f"  throughput     {fmt(s['throughput_tokens_per_s'])} output tokens/s, {fmt(s['requests_per_s'], '.2f')} "
          "requests/s")
    if s.get("memory_fidelity") == "tlm" and "sram_stall_cycles" in s:
        print(f"  SRAM stalls    {s['sram_stall_cycles']:,} compute cycles waited on SRAM ports, summed over tasks")
    for key, label in (("ttft_ms", "TTFT ms"), ("tbt_ms", "TBT/ITL ms"), ("tpot_ms", "TPOT ms"), ("e2e_ms", "E2E ms"),
                       ("queueing_ms", "queueing ms")):
        print(f"  {label:<14} {latency_line(s.get(key))}")
    print(client_line(s))
    if s.get("slo_attainment") is not None:
        print(f"  SLO            {100 * s['slo_attainment']:.1f}% of requests met it; goodput "
              f"{fmt(s['goodput_requests_per_s'], '.2f')} requests/s")
    kvm = s.get("kv_manager", {})
    if len(s["instances"]) > 1:  # one manager per instance
        kvm = {k: sum(m.get(k, 0) for m in kvm.values()) for k in ("spills", "spilled_bytes", "preemptions")}
        inst = ", ".join(f"{n} {v['cores']} cores (TP {v['tp']} x {v['stages']} stages)"
                         for n, v in s["instances"].items())
        print(f"  instances      {inst}" + (f"; {s['kv_transfers']} KV transfers, "
                                            f"{s['kv_transfer_bytes'] / 2**20:,.1f} MiB over the NoC"
                                            if s["scheduler"]["policy"] == "disagg" else ""))
    ic = s.get("iteration_cache") or {}
    if not ic.get("enabled"):
        why = "auto: instances share the chip" if ic.get("requested") == "auto" else ic.get("requested", "off")
        print(f"  iter. cache    off ({why}): every iteration simulated")
    else:
        b = ic["buckets"]
        print(f"  iter. cache    on ({ic.get('requested', 'on')}), {ic.get('preset', 'custom')} buckets, {ic['replay']} replay (kv {b['kv']}"
              f"{', powers of two below' if b.get('kv_edges') == 'pow2' else ''}, batch {b['batch']}, chunk {b['chunk']}): "
              f"{ic['shapes_simulated']} "
              f"shapes simulated ({ic['shapes_from_disk']} more from disk), {ic['hits']} hits, {ic['misses']} misses, {ic['interpolated']} interpolated"
              + ("; KV spills timed by the memory model alone (nothing waits for them)"
                 if ic.get("kv_spills_over_mesh") is False else ""))
        for limit in ic.get("limits", []):
            print(f"  NOTE           iteration cache: {limit}")
    hit = s.get("prefix_hit_rate")
    print(f"  KV cache       {s['kv_bytes_per_token']:,} B/token; {kvm.get('spills', 0)} spills SRAM->HBM "
          f"({kvm.get('spilled_bytes', 0) / 2**20:,.1f} MiB), {kvm.get('preemptions', 0)} preemptions"
          + (f", prefix hit rate {100 * hit:.1f}%" if hit else ""))
    for name, path in s.get("files", {}).items():
        print(f"  wrote {name:<9} {path}")
