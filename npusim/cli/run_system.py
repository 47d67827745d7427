"""``npusim run --system S``: a MoE model deployed over many NPUs — one step, or serving a request stream.

One step: the mapping spec's ``system:`` section (``mappers/cm384-deepseek-decode.yaml`` ...) says how
the model is laid over the instance's NPUs; the flags override its choices. Each die's compute is
timed by the chip simulator (memoised chip costs), dispatch and combine by the fabric model.

Serving (``--trace``, ``--rate`` or ``--requests``): the mapping's ``system_serving:`` section
(default ``mappers/<system>-deepseek-serving.yaml``) names prefill and decode deployments; see
:mod:`npusim.system.serving`.
"""

from __future__ import annotations

from npusim.errors import ConfigError
from npusim.files import json_text, write_json
from npusim.scenarios.options import is_serving
from npusim.scenarios.run import PLAN_FLAGS


def run_system(args) -> int:
    """``npusim run --system``: serving when a request stream is given, else one step."""
    return run_system_serving(args) if is_serving(args) else run_system_step(args)


def run_system_step(args) -> int:
    """One step of ``npusim run --system`` (:func:`npusim.scenarios.run.system_step`): a DeepSeek
    deployment file's step, or any model's by a parallel plan; printed or written."""
    from npusim.scenarios.run import system_step

    kind, r = system_step(args)
    if kind == "plan":
        return _finish_plan_step(args, *r)
    out = r.to_dict()
    if args.save_workload:
        out["workload"] = str(r.workload.save(args.save_workload))
    if args.out:
        write_json(args.out / "summary.json", out)
    if args.json:
        print(json_text(out))
        return 0
    print(f"{r.model} {r.phase} on {r.system}: {r.npus} NPUs = {r.dies} dies, {r.batch_per_npu:g} per NPU "
          f"({r.batch_per_die:g} per die), {r.microbatches} microbatch(es), {mtp_words(r.mtp, r.mtp_acceptance)}")
    print(f"  step          {r.step_ms:,.2f} ms ({r.tokens_per_step:g} tokens per sequence)")
    if r.phase == "decode":
        print(f"  TPOT          {r.tpot_ms:,.2f} ms")
    print(f"  throughput    {r.tokens_per_s_per_npu:,.0f} tokens/s per NPU")
    print(f"  MoE layer     {r.layer_us:,.1f} us: " + ", ".join(f"{k} {v:,.1f}" for k, v in r.layer_breakdown_us.items()))
    print("  critical path " + ", ".join(f"{k} {v / 1e3:,.2f} ms" for k, v in
                                         sorted(r.breakdown_us.items(), key=lambda kv: -kv[1]) if v))
    print("  step parts    " + ", ".join(f"{k} {v:,.2f} ms" for k, v in r.step_breakdown_ms.items()))
    print(f"  fixed         {100 * r.fixed_share:.0f}% of the step is not simulated hardware work ({r.runtime['mode']} "
          f"runtime): host {r.host_ms:,.2f} ms, kernel launches {r.kernel_launch_ms:,.2f} ms, calibrated constants "
          f"{r.calibrated_ms:,.2f} ms (dispatch/combine per-call overheads)")
    print(f"  memory        {r.kv_gb_per_die:.1f} GB KV + {r.weights_gb_per_die:.1f} GB weights per die; "
          f"expert load imbalance {r.imbalance:.2f}, attention {r.attention_imbalance:.2f}")
    print(f"  note          {r.note}")
    return 0


def mtp_words(mtp: int, acceptance: float) -> str:
    """Speculative decoding in a header: "MTP off", or "MTP 1 at 0.7 acceptance" (an acceptance rate
    means nothing without speculative tokens)."""
    return f"MTP {mtp} at {acceptance:g} acceptance" if mtp else "MTP off"


def _finish_plan_step(args, out: dict, wl, timing) -> int:
    """A plan step's summary printed or as JSON; ``--save-workload`` and ``--out`` write its files."""
    if args.save_workload:
        out["workload"] = str(wl.save(args.save_workload))
    if args.out:
        write_plan_outputs(args.out, out, wl, timing)
    if args.json:
        print(json_text(out))
        return 0
    print_plan_step(out)
    return 0


def write_plan_outputs(directory, out: dict, wl, timing) -> None:
    """summary.json, timeline.json (Perfetto: each rank's streams and its communication) and
    links.json (every fabric link's bytes and utilisation over the step)."""
    from npusim.files import result_files
    from npusim.report.perfetto import write_workload_timeline

    files = {"summary": directory / "summary.json", "timeline": directory / "timeline.json",
             "links": directory / "links.json"}
    with result_files(files) as staged:
        write_workload_timeline(staged["timeline"], wl.nodes, timing.node_start_us, timing.node_end_us)
        write_json(staged["links"], timing.links)
        out["files"] = {k: str(v) for k, v in files.items()}
        write_json(staged["summary"], out)


def print_plan_step(r: dict) -> None:
    p = r["plan"]
    extra = "".join(f" {k} {p[k]}" for k in ("cp", "expert_tp") if p.get(k, 1) > 1)
    print(f"{r['model']} {r['phase']} on {r['system']}: {r['npus']} NPUs = {r['dies']} dies; plan tp {p['tp']} dp "
          f"{p['dp']} ep {p['ep']} pp {p['pp']}{extra}, {p['microbatches']} microbatch(es), {p['precision']}, KV "
          f"{p['kv_dtype']}; batch {r['batch']:g}" + (f" at context {r['kv']}" if r["phase"] == "decode" else
                                                     f" prompts of {r['seq']}"))
    if r["phase"] == "decode" and r["tpot_ms"] != r["step_ms"]:
        print(f"  step          {r['step_ms']:,.3f} ms; TPOT {r['tpot_ms']:,.3f} ms "
              f"({mtp_words(p['mtp'], p['mtp_acceptance'])})")
    else:
        print(f"  step          {r['step_ms']:,.3f} ms" + (" (TPOT)" if r["phase"] == "decode" else " (TTFT)"))
    print(f"  throughput    {r['tokens_per_s_per_npu']:,.1f} tokens/s per NPU")
    if "fixed_share" in r:
        print(f"  fixed         {100 * r['fixed_share']:.0f}% of the step is host, launch and calibrated time "
              f"({r['runtime']['mode']} runtime)")
    total = sum(r["breakdown_us"].values()) or 1.0
    print("  critical path " + ", ".join(f"{k} {v / 1e3:,.3f} ms ({100 * v / total:.0f}%)"
                                         for k, v in sorted(r["breakdown_us"].items(), key=lambda kv: -kv[1])))
    if "weights_gb_per_die" in r:  # not known to a replayed workload
        print(f"  memory        {r['weights_gb_per_die']:.1f} GB weights + {r['kv_gb_per_die']:.1f} GB KV per die of "
              f"{r['hbm_gb_per_die']:.1f} GB of HBM ({r['hbm_gib_per_die']:g} GiB)")
    if r["busiest_links"]:
        b = r["busiest_links"][0]
        print(f"  busiest link  {b['link']} ({b['fabric']}): {b['gbps']:,.1f} GB/s mean, {100 * b['utilization']:.0f}%")
    layers = f"{r['simulated_layers']} layers (the rest at the measured period); " if r["simulated_layers"] else ""
    print(f"  simulated     {layers}{r['fabric']['tasks']:,} fabric tasks")
    for name, path in r.get("files", {}).items():
        print(f"  wrote {name:<9} {path}")
    if r.get("workload"):
        print(f"  wrote workload {r['workload']}")
    print(f"  note          {r['note']}")


#: flags a deployment file answers itself: given beside --deployment they are refused, not ignored
DEPLOYMENT_FIXED = (*PLAN_FLAGS, "tp", "mapping", "nodes", "precision", "mtp", "mtp_acceptance", "microbatches",
                    "prefill_instances", "caching_pool")


def run_deployment(args) -> int:
    """``npusim run --deployment FILE``: serve a deployment file (:mod:`npusim.system.deploy`) with the
    benchmark client's requests; the file names the system and model (``--system``/``--model``, if
    given, must agree) and its runtime (``--runtime`` overrides it)."""
    from npusim.scenarios.options import refuse_unread_flags
    from npusim.scenarios.run import deployment_scenario
    from npusim.system.deploy import load_serving_deployment

    dep = load_serving_deployment(args.deployment)
    given = [f"--{k.replace('_', '-')}" for k in DEPLOYMENT_FIXED if getattr(args, k, None) is not None]
    if given:
        raise ConfigError(f"{', '.join(given)}: --deployment {args.deployment} gives its plans, nodes and pools; "
                          "edit the file instead")
    for key in ("system", "model"):
        mine = getattr(args, key, None)
        if mine is not None and mine != getattr(dep, key):
            raise ConfigError(f"--{key} {mine}: --deployment {args.deployment} serves {getattr(dep, key)} "
                              f"({key}: in the file)")
    args.system, args.model = dep.system, dep.model
    if not is_serving(args):
        raise ConfigError(f"--deployment {args.deployment}: give the requests to serve (--dataset random --input-len "
                          "I --output-len O --num-prompts N [--max-concurrency C], --trace or --rate)")
    refuse_unread_flags(args)
    return serve_system(args, deployment_scenario(args, dep, str(args.deployment)))


def run_system_serving(args) -> int:
    """``npusim run --system S`` with a request stream (:func:`npusim.scenarios.run.system_serving_scenario`)."""
    from npusim.scenarios.run import system_serving_scenario

    return serve_system(args, system_serving_scenario(args))


def serve_system(args, sc) -> int:
    """Serve a :class:`npusim.scenarios.run.SystemServing`: a concurrency sweep's table, or one run printed
    or written (``--out``: summary.json, serving.h5 and timeline.json)."""
    from npusim.cli.serve import print_sweep, serve_with_progress
    from npusim.serving.client import bench_row, parse_concurrencies

    def serve_once(c):
        return serve_with_progress(args, sc, c, kernels=("chip", "system"))

    if args.sweep_concurrency is not None:
        rows = [bench_row(serve_once(c).summary, c) for c in parse_concurrencies(args.sweep_concurrency)]
        model = sc.deployment.model if sc.deployment is not None else sc.cfg.name
        return print_sweep(args, {"model": model, "system": sc.loaded.system.name, **sc.label,
                                  "requests": len(sc.workload.requests), **sc.source.client_fields(None),
                                  "rows": rows})
    run = serve_once(args.max_concurrency)
    out = run.summary
    out.update({**sc.label, "requests_clipped": sc.workload.clipped, "context_clipped": sc.workload.over_context})
    if sc.deployment is not None and sc.deployment.estimate:
        out["estimate"] = estimate_error(sc.deployment.estimate, out)
    if args.out:
        if sc.deployment is not None:
            write_json(args.out / "summary.json", out)
        else:
            _write_serving(args.out, run, out)
    if args.json:
        print(json_text(out))
        return 0
    _print_serving(out)
    if "estimate" in out:
        e = out["estimate"]
        print(f"  plan estimate  TTFT {e['ttft_ms']:,.1f} ms, TPOT {e['tpot_ms']:,.2f} ms (npusim plan --serving's step "
              f"estimate at the deployment's full load): {_pct(e['ttft_error'])} and {_pct(e['tpot_error'])} off this "
              "run's means")
    return 0


def _write_serving(directory, run, out: dict) -> None:
    from npusim.files import result_files
    from npusim.report.perfetto import write_serving_timeline
    from npusim.serving.metrics import write_serving_hdf5

    files = {"summary": directory / "summary.json", "results": directory / "serving.h5",
             "timeline": directory / "timeline.json"}
    with result_files(files) as staged:
        write_serving_hdf5(staged["results"], run.records, run.steps, attrs={"system": out["system"]})
        write_serving_timeline(staged["timeline"], run.records, run.steps)
        out["files"] = {k: str(v) for k, v in files.items()}
        write_json(staged["summary"], out)


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def estimate_error(estimate: dict, served: dict) -> dict:
    """The plan search's step estimate beside the served means: ``(estimate - served) / served``."""
    out = dict(estimate)
    for key in ("ttft_ms", "tpot_ms"):
        got = (served.get(key) or {}).get("mean")
        est = estimate.get(key)
        out[f"served_{key}"] = got
        out[f"{key[:4]}_error"] = (est - got) / got if est is not None and got else None
    return out


def _print_serving(s: dict) -> None:
    from npusim.cli.serve import client_line, fmt, latency_line

    pools = ", ".join(f"{p['role']} {p['instances']} x {p['npus_per_instance']} NPUs" for p in s["pools"])
    print(f"{s['model']} serving on {s['system']}: {s['requests_total']} requests; {s['mode']}: {pools} "
          f"({mtp_words(s['mtp'], s['mtp_acceptance'])})")
    print("  instances      " + "; ".join(f"{p['role']}: {p['label']}" for p in s["pools"]))
    print("  runtime        " + ", ".join(f"{mode} {phase}" for phase, mode in s["runtime"].items()) + " steps")
    print(f"  completed      {s['requests_completed']} completed, {s['requests_rejected']} rejected over "
          f"{s['duration_s'] or 0:.2f} s; {s['prefill_batches']} prefill batches, {s['decode_steps']} decode steps "
          f"(mean {s['mean_decode_batch_per_npu']:.1f} sequences per decode NPU)")
    tput = s["tokens_per_s_per_npu"]
    print(f"  throughput     {s['throughput_tokens_per_s'] or 0:,.0f} output tokens/s; "
          f"{tput or 0:,.1f} per NPU of the system, {s['decode_tokens_per_s_per_npu'] or 0:,.1f} per decode NPU")
    for key, label in (("ttft_ms", "TTFT ms"), ("tpot_ms", "TPOT ms"), ("tbt_ms", "TBT/ITL ms"), ("e2e_ms", "E2E ms")):
        print(f"  {label:<14} {latency_line(s.get(key))}")
    print(client_line(s))
    if s.get("slo_attainment") is not None:
        print(f"  SLO            {100 * s['slo_attainment']:.1f}% of requests met it; goodput "
              f"{fmt(s['goodput_tokens_per_s'], ',.0f')} tokens/s")
    kv = s["kv_transfer"]
    print(f"  KV transfer    {kv['bytes'] / 2**30:,.2f} GiB over {kv['fabric']}, mean {kv['mean_ms'] or 0:.2f} ms, "
          f"p99 {kv['p99_ms'] or 0:.2f} ms per request")
    pool = s.get("caching_pool")
    if pool:
        print(f"  caching pool   hit rate {100 * pool['hit_rate']:.1f}% of prompt blocks, "
              f"{pool['prefill_tokens_saved']:,} prefill tokens saved, {pool['blocks_held']:,} blocks held "
              f"of {pool['capacity_blocks']:,}")
    st = s["step_table"]
    print(f"  step table     {st['decode_points']} decode and {st['prefill_points']} prefill step shapes simulated "
          f"for {st['lookups']:,} steps")
    for name, path in s.get("files", {}).items():
        print(f"  wrote {name:<9} {path}")
    print(f"  note           {s['note']}")
