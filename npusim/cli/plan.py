"""``npusim plan``: search parallel plans and batch sizes for a model on a system.

Every plan of the instance's NPUs (TP x DP x PP splits of its dies, EP for MoE models,
micro-batches) is tried at growing batch sizes; each point is one simulated step (chip costs
memoised on disk, the fabric simulated), checked against the dies' HBM and the latency
objective (``--slo-tpot-ms`` for decode, ``--slo-ttft-ms`` for prefill). Prints the ranking by
tokens/s per NPU, the Pareto front (tokens/s per NPU against latency) and why rejected plans
were rejected; ``--out DIR`` writes plan.json and, with matplotlib, pareto.png. Points run on
the local worker pool (``--workers``) or a Dask cluster (``--scheduler``), as ``npusim sweep``'s do.
"""

from __future__ import annotations

from pathlib import Path

from npusim.cli.util import NODES_HELP, positive_float, positive_int
from npusim.errors import ConfigError
from npusim.files import json_text, write_json


def add_parser(sub):
    p = sub.add_parser("plan", help="search parallel plans (TP/DP/EP/PP, micro-batches, batch) for a model on a system",
                       description=__doc__.split("\n\n", 1)[1])
    p.add_argument("--system", default="atlas-800i-a2", help="system preset or file (default atlas-800i-a2)")
    p.add_argument("--nodes", type=positive_int, default=None, help=NODES_HELP)
    p.add_argument("--npus", type=positive_int, default=None, help="NPUs of the instance (default: one node)")
    p.add_argument("--model", default="qwen3-30b-a3b", help="built-in model or config.json (default qwen3-30b-a3b)")
    p.add_argument("--phase", choices=["decode", "prefill"], default="decode")
    p.add_argument("--kv", type=positive_int, default=None, help="decode: context length attended (default 1024)")
    p.add_argument("--seq", type=positive_int, default=None, help="prefill: prompt tokens (default 1024)")
    p.add_argument("--slo-tpot-ms", type=positive_float, default=None, help="decode: TPOT objective")
    p.add_argument("--slo-ttft-ms", type=positive_float, default=None, help="prefill: TTFT objective")
    p.add_argument("--precision", choices=["bf16", "fp16", "a8w8", "w8a8"], default="bf16")
    p.add_argument("--kv-dtype", choices=["bf16", "int8"], default="bf16")
    p.add_argument("--batches", default=None, help="batch sizes of the instance to try, comma-separated (default: "
                   "1, 2, 4 ... 64 per NPU for decode, 16 per NPU for prefill)")
    p.add_argument("--max-pp", type=positive_int, default=None, help="most pipeline stages tried (default 8; "
                   "--serving: 1)")
    p.add_argument("--routing", default="uniform", help="MoE expert popularity: uniform, zipf:S or a load-profile file")
    p.add_argument("--seed", type=int, default=0, help="MoE routing seed")
    p.add_argument("--runtime", choices=["eager", "graph"], default=None, help="the steps' software runtime: eager or "
                   "graph (default: the system's runtime section, graph for decode and eager for prefill on the presets)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=positive_int, default=None,
                       help="local worker processes (default: one per CPU; 1 runs points in this process)")
    where.add_argument("--scheduler", default=None, help="Dask distributed scheduler address, tcp://HOST:PORT")
    g = p.add_argument_group("serving deployments (--serving)")
    g.add_argument("--serving", action="store_true", help="search serving deployments (aggregated: one plan x "
                   "replicas; disaggregated: prefill and decode pools) under --slo-ttft-ms and --slo-tpot-ms, each "
                   "candidate checked by serving requests; --out DIR writes DIR/deployment.yaml for npusim run "
                   "--deployment")
    g.add_argument("--input-len", type=positive_int, default=None, help="--serving: prompt tokens (default 2048)")
    g.add_argument("--output-len", type=positive_int, default=None, help="--serving: output tokens (default 256)")
    g.add_argument("--serve-top", type=positive_int, default=2, help="--serving: candidates of each mode served, "
                   "best first by their step estimate (default 2; each mode's best is also served at a quarter of "
                   "its batch limit)")
    g.add_argument("--max-concurrency", type=positive_int, default=None, help="--serving: the benchmark's "
                   "concurrency: candidates hold at most this many sequences (their batch limit x instances) and each "
                   "is served at the concurrency its batch limit implies (default: no limit)")
    g.add_argument("--plans-per-size", type=positive_int, default=None, help="--serving: a full-scale search's "
                   "coarse set: skip plans that cannot hold the model or meet TPOT by a roofline, keep the K best "
                   "(tp, ep) shapes of each instance size by that roofline (one micro-batch, the most MTP), decode "
                   "ladders from 16 sequences per NPU, prompt steps for instances of at most a quarter of the budget, "
                   "then the other micro-batch and MTP choices of the two best coarse plans; every skip is counted "
                   "and printed (default: every plan)")
    g.add_argument("--resume-steps", type=Path, default=None, help="--serving: an interrupted search's "
                   "steps.jsonl (--out DIR of the same search): a ladder whose every step is there is taken from it, "
                   "and a serving check logged there (phase: serve) too, not simulated again (a step record is a "
                   "deterministic function of its plan, batch and the search's arguments, a check of its deployment, "
                   "prompts and lengths: give the same ones)")
    g.add_argument("--kv-fabric", default=None, help="--serving: the fabric KV moves over between pools (default: "
                   "rdma or roce, whichever the system has)")
    p.add_argument("--out", type=Path, default=None, help="directory for plan.json and pareto.png (--serving: also "
                   "steps.jsonl, each step and serving check as it finishes, and deployment.yaml)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


DEFAULT_TOKENS = 1024  # decode context (--kv), prefill prompt (--seq)


def _batches(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--batches {text!r}: expected comma-separated positive integers, e.g. 1,8,32") from None
    if not values or min(values) < 1:
        raise ConfigError(f"--batches {text!r}: expected comma-separated positive integers, e.g. 1,8,32")
    return values


def run(args) -> int:
    from npusim.cli.progress import plan_progress
    from npusim.scenarios.options import PLAN_PRECISION
    from npusim.pool import connect, default_workers
    from npusim.system.load import load_system
    from npusim.system.moe import check_routing
    from npusim.system.search import search_plans

    if args.serving:
        return run_serving_plan(args)
    for flag in ("input_len", "output_len"):
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag.replace('_', '-')}: taken with --serving (a serving deployment search); a step "
                              "search takes --kv or --seq")
    if args.phase == "decode" and args.slo_ttft_ms is not None:
        raise ConfigError("--slo-ttft-ms is the prefill objective; decode takes --slo-tpot-ms")
    if args.phase == "prefill" and args.slo_tpot_ms is not None:
        raise ConfigError("--slo-tpot-ms is the decode objective; prefill takes --slo-ttft-ms")
    if args.phase == "decode" and args.seq is not None:
        raise ConfigError(f"--seq {args.seq}: a prefill step's prompt; a decode step's context is --kv")
    if args.phase == "prefill" and args.kv is not None:
        raise ConfigError(f"--kv {args.kv}: a decode step's context; a prefill step's prompts are --seq (they start "
                          "from an empty cache)")
    seq, kv = args.seq or DEFAULT_TOKENS, args.kv or DEFAULT_TOKENS
    check_routing(args.routing)
    loaded = load_system(args.system, nodes=args.nodes)
    npus = args.npus or loaded.system.npus_per_node
    if npus > loaded.system.num_npus:
        raise ConfigError(f"--npus {npus}: {loaded.system.name} has {loaded.system.num_npus} NPUs")
    client = connect(args.scheduler) if args.scheduler else None
    workers = args.workers if args.workers is not None else default_workers()
    try:
        with plan_progress(0, enabled=not args.no_progress) as progress:
            result = search_plans(args.system, args.nodes, args.model, npus, args.phase, seq, kv,
                                  args.slo_tpot_ms if args.phase == "decode" else args.slo_ttft_ms,
                                  PLAN_PRECISION[args.precision], args.kv_dtype, _batches(args.batches), args.max_pp or 8,
                                  args.routing, args.seed, workers, client,
                                  progress=lambda done, total: progress(0, done, total), runtime=args.runtime)
    finally:
        if client is not None:
            client.close()
    return _finish(args, result, _plot, _print)


def _finish(args, result: dict, plot, show, extra: dict | None = None, write_extra=None) -> int:
    """``--out DIR``: plan.json, pareto.png (``plot``; dropped without matplotlib) and the ``extra``
    files (``write_extra(staged)`` writes them); then the result as JSON or by ``show``."""
    if args.out:
        from npusim.files import result_files

        files = {"summary": args.out / "plan.json", "pareto": args.out / "pareto.png", **(extra or {})}
        with result_files(files) as staged:
            if write_extra is not None:
                write_extra(staged)
            if not plot(staged["pareto"], result):
                del files["pareto"]
            result["files"] = {k: str(v) for k, v in files.items()}
            write_json(staged["summary"], result)
    if args.json:
        print(json_text(result))
        return 0
    show(result)
    return 0


def run_serving_plan(args) -> int:
    """``npusim plan --serving``: :func:`npusim.system.serving_search.search_serving`, printed or as JSON;
    ``--out DIR``: plan.json, deployment.yaml (the best candidate) and the Pareto plot."""
    from npusim.cli.progress import plan_progress
    from npusim.scenarios.options import PLAN_PRECISION
    from npusim.pool import connect, default_workers
    from npusim.system.load import load_system
    from npusim.system.moe import check_routing
    from npusim.system.serving_search import search_serving

    for flag in ("kv", "seq", "batches"):
        if getattr(args, flag) is not None:
            raise ConfigError(f"--{flag}: a step search's; --serving takes --input-len and --output-len")
    check_routing(args.routing)
    loaded = load_system(args.system, nodes=args.nodes)
    npus = args.npus or loaded.system.npus_per_node
    client = connect(args.scheduler) if args.scheduler else None
    workers = args.workers if args.workers is not None else default_workers()
    step_log = None
    resume = None
    if args.resume_steps is not None:  # read before --out's steps.jsonl is emptied: it may be the same file
        from npusim.system.serving_search import read_step_records

        resume = read_step_records(args.resume_steps)
    if args.out:  # the step records as they finish: a long search's steps survive an interruption
        import json

        args.out.mkdir(parents=True, exist_ok=True)
        steps_path = args.out / "steps.jsonl"
        steps_path.write_text("")

        def step_log(recs) -> None:
            with steps_path.open("a") as f:
                for rec in recs:
                    f.write(json.dumps(rec, default=str) + "\n")
    try:
        with plan_progress(0, enabled=not args.no_progress) as progress:
            result = search_serving(args.system, args.nodes, args.model, npus, args.input_len or 2048,
                                    args.output_len or 256, args.slo_ttft_ms, args.slo_tpot_ms,
                                    PLAN_PRECISION[args.precision], args.kv_dtype, args.max_pp or 1,
                                    args.routing, args.seed, args.serve_top, args.max_concurrency, workers, client,
                                    args.kv_fabric, progress=lambda done, total: progress(0, done, total),
                                    runtime=args.runtime, plans_per_size=args.plans_per_size, step_log=step_log,
                                    resume=resume)
    finally:
        if client is not None:
            client.close()
    best = result["best"]

    def write_deployment(staged) -> None:
        from npusim.system.deploy import ServingDeployment, write_serving_deployment

        est = {**best["estimate"], "served_ttft_ms": best["ttft_ms"], "served_tpot_ms": best["tpot_ms"],
               "served_output_throughput_per_npu": best["output_throughput_per_npu"]}
        write_serving_deployment(staged["deployment"], ServingDeployment(**{**best["deployment"], "estimate": est}))

    if best is None or not args.out:
        return _finish(args, result, _plot_serving, _print_serving)
    return _finish(args, result, _plot_serving, _print_serving, {"deployment": args.out / "deployment.yaml"},
                   write_deployment)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.0f}%"


def _print_serving(r: dict) -> None:
    o = r["objective"]
    print(f"{r['model']} on {r['system']}, {r['npus']} NPUs, prompts {r['input_len']} -> {r['output_len']} tokens, "
          f"TTFT <= {o['slo_ttft_ms']} ms, TPOT <= {o['slo_tpot_ms']} ms: {r['plans']} plans, {r['step_points']} steps "
          f"simulated, {r['deployments_estimated']} deployments estimated, {r['evaluated']} served; runtime "
          f"{r.get('runtime') or 'the system default per phase'}")
    if r.get("skipped_plans"):
        print(f"  {r['skipped_plans']} plans skipped before simulating (--plans-per-size {r['plans_per_size']}): "
              + ", ".join(f"{n} x {why}" for why, n in r["skipped"].items()))
    if r.get("prefill_sizes_skipped"):
        print(f"  no prompt step simulated for instances of {', '.join(map(str, r['prefill_sizes_skipped']))} NPUs "
              f"(more than a quarter of the budget): no aggregated candidate of that size, no prefill pool of it")
    print(f"  {'mode':<13} {'tok/s/NPU':>10} {'tok/s/user':>10} {'TTFT ms':>9} {'TPOT ms':>8}  "
          f"{'estimate error (TTFT, TPOT, tok/s/NPU)':<40} deployment")
    for c in (c for c in r["candidates"] if c.get("served")):
        e = c["estimate_error"]
        mark = " *" if r["best"] is not None and c["label"] == r["best"]["label"] else ("" if c["feasible"] else " x")
        print(f"  {c['mode']:<13} {c['output_throughput_per_npu']:>10,.1f} {c['tokens_per_s_per_user']:>10,.1f} "
              f"{c['ttft_ms']:>9,.1f} {c['tpot_ms']:>8,.2f}  {_pct(e['ttft_ms']):>8} {_pct(e['tpot_ms']):>8} "
              f"{_pct(e['output_throughput_per_npu']):>8}{'':16} {c['label']}{mark}")
    for c in (c for c in r["candidates"] if c.get("served") is False and c.get("mode") and "reason" in c
              and c["reason"] and not c["reason"].startswith(("not served", "estimate"))):
        print(f"  not served   {c['label']}: {c['reason']}")
    print("  (* best by tokens/s per NPU; x misses an objective when served; estimate error = (step estimate - "
          "served) / served)")
    if r["best"] is None:
        print("  no served candidate meets both objectives")
    print("  Pareto front (tokens/s per NPU against tokens/s per user): "
          + "; ".join(f"{c['mode']} {c['output_throughput_per_npu']:,.1f} at {c['tokens_per_s_per_user']:,.1f}"
                      for c in r["pareto"]) if r["pareto"] else "  Pareto front: none")
    for key, path in r.get("files", {}).items():
        print(f"  wrote {key:<10} {path}")


def _plot_serving(path: Path, r: dict) -> bool:
    """Served candidates and the Pareto front, tokens/s per NPU against tokens/s per user; False
    without matplotlib."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from npusim.files import atomic_path

    fig, ax = plt.subplots(figsize=(6, 4))
    for mode, mk in (("aggregated", "o"), ("disaggregated", "s")):
        pts = [c for c in r["candidates"] if c.get("served") and c["mode"] == mode]
        ax.scatter([c["tokens_per_s_per_user"] for c in pts], [c["output_throughput_per_npu"] for c in pts],
                   marker=mk, s=24, alpha=0.6, label=f"{mode} (served)")
    ax.plot([c["tokens_per_s_per_user"] for c in r["pareto"]], [c["output_throughput_per_npu"] for c in r["pareto"]],
            "r.-", label="Pareto front (feasible)")
    ax.set_xlabel("tokens/s per user")
    ax.set_ylabel("output tokens/s per NPU")
    ax.set_title(f"{r['model']} on {r['system']} ({r['npus']} NPUs)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return True


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _print(r: dict) -> None:
    from collections import Counter

    from npusim.system.search import latency_key, plan_label

    lat = latency_key(r["phase"])
    name = lat[:-3].upper()
    impossible = f" ({r['rejected_plans']} more impossible: see below)" if r["rejected_plans"] else ""
    print(f"{r['model']} {r['phase']} on {r['system']}, {r['npus']} NPUs: {_n(r['plans'], 'plan')} searched"
          f"{impossible}, {_n(r['evaluated'], 'point')} simulated")
    ranked = sorted((c for c in r["candidates"] if c["feasible"]), key=lambda c: -c["tokens_per_s_per_npu"])
    print(f"  {'plan':<26} {'batch':>6} {name + ' ms':>10} {'tok/s/NPU':>11}")
    for c in ranked[:10]:
        mark = " *" if c is r["best"] or c == r["best"] else ""
        print(f"  {plan_label(c['plan']):<26} {c['batch']:>6} {c[lat]:>10.2f} {c['tokens_per_s_per_npu']:>11.1f}{mark}")
    if not ranked:
        print("  no feasible point")
    print(f"  Pareto front ({name} against tokens/s per NPU):" + ("" if r["pareto"] else " none"))
    for c in r["pareto"]:
        print(f"    {plan_label(c['plan']):<26} {c['batch']:>6} {c[lat]:>10.2f} {c['tokens_per_s_per_npu']:>11.1f}")
    rejected = [c for c in r["candidates"] if not c["feasible"]]
    # a point: a plan at one batch, over the objective (slo), beyond HBM (memory) ...; a plan with no
    # batch: one the model or system cannot take (checked before any point of it)
    points = Counter((c["reason"] or "?").split(":")[0] for c in rejected if c["batch"] is not None)
    parts = []
    if points:
        parts.append(f"{_n(sum(points.values()), 'point')}: " + ", ".join(f"{n} x {k}" for k, n in points.most_common()))
    if r["rejected_plans"]:
        parts.append(f"{_n(r['rejected_plans'], 'plan')} impossible at any batch")
    if parts:
        print("  rejected      " + "; ".join(parts))
    for c in rejected[:5]:
        batch = "any batch" if c["batch"] is None else f"batch {c['batch']}"
        print(f"    {plan_label(c['plan'])} {batch}: {c['reason']}")
    for key, path in r.get("files", {}).items():
        print(f"  wrote {key:<8} {path}")


def _plot(path: Path, r: dict) -> bool:
    """The feasible points and the Pareto front, tokens/s per NPU against latency; False without matplotlib."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from npusim.files import atomic_path
    from npusim.system.search import latency_key

    lat = latency_key(r["phase"])
    ok = [c for c in r["candidates"] if c["feasible"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter([c[lat] for c in ok], [c["tokens_per_s_per_npu"] for c in ok], s=12, alpha=0.5, label="feasible")
    ax.plot([c[lat] for c in r["pareto"]], [c["tokens_per_s_per_npu"] for c in r["pareto"]], "r.-", label="Pareto front")
    ax.set_xlabel(f"{lat[:-3].upper()} (ms)")
    ax.set_ylabel("tokens/s per NPU")
    ax.set_title(f"{r['model']} {r['phase']} on {r['system']} ({r['npus']} NPUs)")
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
    return True
