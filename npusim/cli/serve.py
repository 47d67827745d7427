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

from npusim.files import json_text


def serve_with_progress(args, scenario, max_concurrency: int | None = None, kernels: tuple = ("chip",)):
    """``scenario.serve`` under the request progress bar (unless --no-progress)."""
    from npusim.cli.progress import request_progress

    with request_progress(len(scenario.workload.requests), enabled=not args.no_progress,
                          kernels=kernels) as progress:
        return scenario.serve(max_concurrency, progress=progress)


def run_serving(args, scenario) -> int:
    """``npusim run`` serving on a chip: a :class:`npusim.scenarios.run.ChipServing` served, printed or
    written."""
    from npusim.files import result_files, write_json
    from npusim.report.perfetto import write_serving_timeline
    from npusim.serving.metrics import write_serving_hdf5

    arch = scenario.arch
    if getattr(args, "sweep_concurrency", None) is not None:
        from npusim.serving.client import bench_row, parse_concurrencies

        rows = [bench_row(serve_with_progress(args, scenario, c)[0], c)
                for c in parse_concurrencies(args.sweep_concurrency)]
        return print_sweep(args, {"model": args.model, "arch": arch.name,
                                  "requests": len(scenario.workload.requests),
                                  **scenario.source.client_fields(None), "rows": rows})
    s, run = serve_with_progress(args, scenario)
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
