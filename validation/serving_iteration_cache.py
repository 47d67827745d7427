"""The iteration-cost cache's error against simulating every iteration (``npusim run
--iteration-cache on`` vs ``off``): TTFT, TBT and throughput (mean, p50, p99) and wall time on

* the default scenario (``npusim run``: 32 synthetic requests of Qwen3-4B at 8/s on npusim-64c,
  PD fusion, TP 4 x 16 stages);
* a Mooncake replay (the repository's traces/mooncake_sample.jsonl, first N requests, prompts
  clipped to 2048 tokens and outputs to 128, PD fusion budget 512, chunks of 256);
* PD disaggregation (``--schedule disagg``, 2:1 prefill:decode cores, the default requests);
* the README's trace replay (``npusim run --trace traces/mooncake_sample.jsonl`` at its defaults:
  prompts up to 120k tokens clipped to Qwen3-4B's context, the default scheduler), first
  ``--readme N`` requests (default 15; not in the default ``--only``: its uncached run takes minutes).

Each cached run (stage replay by default; ``--replay stages,skeleton`` adds the skeleton
replay) is shown at exact buckets (the compiled shapes) and at coarser ones (KV
interpolated, batch and chunk rounded up). The goal (issue 14): error on throughput and mean TTFT/TBT under 5%.

    python validation/serving_iteration_cache.py [--mooncake N] [--buckets "exact;kv=1024"]
        [--only default,mooncake,pd,readme] [--readme N] [--replay stages,skeleton] [--spill-waits]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.serving.itercache import EXACT, parse_buckets  # noqa: E402
from npusim.model.zoo import get_config  # noqa: E402
from npusim.serving.requests import cap_lengths, fit_context, synthetic_requests  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402
from npusim.serving.traces import load_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METRICS = [("throughput", None), ("ttft", "mean"), ("ttft", "p50"), ("ttft", "p99"), ("tbt", "mean"),
           ("tbt", "p50"), ("tbt", "p99")]


def scenarios(n_mooncake: int, n_readme: int = 15):
    spec = spec_from_flags(tp=4, stages=16, layout="ring").model_copy(update={"data_parallel": 1})
    default_reqs = synthetic_requests(32, 8.0, input_len=(128, 512), output_len=(32, 128), seed=0)
    moon, _ = cap_lengths(load_trace(ROOT / "traces" / "mooncake_sample.jsonl", first=n_mooncake), 2048, 128)
    fusion = SchedulerConfig(policy="fusion", budget=512, chunk_tokens=256)
    pd_spec = spec_from_flags(tp=4, stages=16, layout="ring").model_copy(update={"data_parallel": 1})
    readme, _ = fit_context(load_trace(ROOT / "traces" / "mooncake_sample.jsonl", first=n_readme),
                            get_config("qwen3-4b").max_position_embeddings)
    return {
        "default": (spec, default_reqs, ServingConfig(), None),
        "readme": (spec, readme, ServingConfig(), None),
        "mooncake": (spec, moon, ServingConfig(scheduler=fusion), None),
        "pd": (pd_spec, default_reqs, ServingConfig(scheduler=SchedulerConfig(policy="continuous")), (42, 21)),
    }


def metrics(s: dict) -> dict:
    out = {("throughput", None): s["throughput_tokens_per_s"]}
    for key in ("ttft", "tbt"):
        for stat in ("mean", "p50", "p99"):
            out[(key, stat)] = s[f"{key}_ms"][stat]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mooncake", type=int, default=50, help="Mooncake requests (first N of the sample)")
    ap.add_argument("--readme", type=int, default=15, help="requests of the README's trace replay (with --only readme)")
    ap.add_argument("--buckets", default="exact;kv=1024",
                    help="';'-separated bucket settings of the cached runs (see npusim run --iteration-cache-buckets)")
    ap.add_argument("--only", default="default,mooncake,pd")
    ap.add_argument("--replay", default="stages",
                    help="','-separated replays of the cached runs: stages (the default), skeleton")
    ap.add_argument("--spill-waits", action="store_true",
                    help="diagnostic: KV reads from HBM wait for every pending KV spill (both runs; "
                         "ServingConfig.spill_waits, a pessimistic bound)")
    args = ap.parse_args()
    arch = load_arch("npusim-64c")
    print("iteration cache vs every iteration simulated (Qwen3-4B, npusim-64c, memory analytical, NoC path); "
          "error = cached / uncached - 1" + ("; KV reads wait for every pending KV spill" if args.spill_waits else ""))
    labels = [k if s is None else f"{k} {s}" for k, s in METRICS]
    head = " ".join(f"{lab:>10}" for lab in labels)
    print(f"{'scenario':>9} {'cache':>14} | {'wall s':>7} {'cpu s':>7} {'shapes':>6} | {head}")
    all_scen = scenarios(args.mooncake, args.readme)
    for name in args.only.split(","):
        spec, reqs, cfg, pd = all_scen[name]
        cfg = replace(cfg, spill_waits=args.spill_waits)
        t0, c0 = time.perf_counter(), time.process_time()
        base = simulate_serving(arch, spec, reqs, cfg, pd=pd).summary
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        ref = metrics(base)
        vals = " ".join(f"{ref[m]:>10.1f}" for m in ref)
        print(f"{name:>9} {'off':>14} | {wall:7.1f} {cpu:7.1f} {base['compiled_iteration_shapes']:>6} | {vals}", flush=True)
        worst = 0.0
        for text, replay in ((t, r) for r in args.replay.split(",") for t in args.buckets.split(";")):
            b = parse_buckets(text)
            t0, c0 = time.perf_counter(), time.process_time()
            s = simulate_serving(arch, spec, reqs, ServingConfig(**{**cfg.__dict__, "iteration_cache": b,
                                                                    "iteration_replay": replay}), pd=pd).summary
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            got = metrics(s)
            errs = {m: got[m] / ref[m] - 1 for m in ref}
            worst = max([worst] + [abs(errs[m]) for m in (("throughput", None), ("ttft", "mean"), ("tbt", "mean"))])
            cells = " ".join(f"{100 * errs[m]:>+9.1f}%" for m in ref)
            label = "exact" if b.exact else ",".join(f"{k}={getattr(b, k)}" for k in ("kv", "batch", "chunk")
                                                     if getattr(b, k) != getattr(EXACT, k))
            label = f"{replay[:5]} {label}"
            print(f"{name:>9} {label:>14} | {wall:7.1f} {cpu:7.1f} {s['iteration_cache']['shapes_simulated']:>6} | "
                  f"{cells}", flush=True)
        print(f"{'':>9} worst error on throughput / mean TTFT / mean TBT: {100 * worst:.1f}% "
              f"({'within' if worst < 0.05 else 'OVER'} the 5% goal)")
    print(machine_line())


if __name__ == "__main__":
    main()
