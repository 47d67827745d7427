"""PD disaggregation core ratios and PD fusion vs disaggregation (PUBLISHED.md A7, A10).

Source: the NpuSim study, arXiv 2510.05632 ("From Principles to Practice: A Systematic Study
of LLM Serving on Multi-core NPUs"), Qwen3-4B on 64 cores.

A7 published: P:D 49:14 cuts TTFT 40% vs 21:42; 21:42 cuts mean E2E latency 68% vs 49:14 at a
100:100 in:out workload; 42:21 vs 49:14: TTFT +13%, TBT -30% or more; 42:21 vs 28:28: TTFT
-22%, TBT +10%.
A10 published: at P:D tokens 1:5 (decode-heavy) fusion has 2.3x the throughput of
disaggregation; at 10:1 (prefill-heavy) disaggregation has 1.34x; disaggregation's TBT varies
< 5% across workloads, fusion's up to 2.57x. The published disaggregation uses heterogeneous
decode cores; its fusion the homogeneous chip.

Here: Qwen3-4B bf16, analytical memory, path NoC, Poisson arrivals; lengths fixed per
workload. A7 runs on ``--arch`` (default npusim-64c). Each disaggregated instance spreads TP
over its region: by default in the fewest stages with at most 32 cores each, or in
``--pd-stages P:D`` stages (the public NPU-SIM configurations of this figure use 7:7, TP =
cores / 7; ``--balance layers`` splits the layers evenly instead of by estimated cost, which
puts the LM head on top of a full last stage; NPU-SIM's split for this figure is not
documented). A10 compares fusion on the homogeneous chip of ``--hetero`` (its core classes
removed; ``--fusion-stages`` stages of TP = cores / stages; NPU-SIM's fusion uses 7) with
disaggregation 42:21 on ``--hetero`` itself (default examples/hetero-pd.yaml: per-core 60 GB/s
DRAM, decode cores with 64x64 arrays at 240 GB/s) and, for reference, on the homogeneous chip.
Prints the simulated figures beside the published ones and whether each trend holds.

    python validation/serving_pd_study.py [--requests 40] [--rate 20] [--only a7|a10]
        [--pd-stages 7:7] [--fusion-stages 7] [--balance cost|layers]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.arch.schema import Arch  # noqa: E402
from npusim.config import validate  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.serving.requests import synthetic_requests  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402

SOURCE = "arXiv 2510.05632 (NpuSim)"


ROOT = Path(__file__).resolve().parents[1]


def serve(arch, reqs, pd=None, policy="fusion", pd_stages=None, fusion_stages=2, balance="cost"):
    # fusion: the whole chip as one instance in `fusion_stages` stages of TP 64 / stages (default TP
    # 32 x 2, like the default disaggregated instances: at most 32 cores a stage); disaggregated
    # instances choose their own TP and stages
    spec = spec_from_flags(tp=arch.num_cores // fusion_stages, stages=fusion_stages,
                           layout="linear_seq").model_copy(update={"data_parallel": 1})
    spec = spec.model_copy(update={"pipeline": spec.pipeline.model_copy(update={"balance": balance})})
    if pd_stages:
        spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"pd_stages": pd_stages})})
    cfg = ServingConfig(model="qwen3-4b", scheduler=SchedulerConfig(
        policy="continuous" if pd else policy, budget=512, chunk_tokens=256, max_batch=64))
    return simulate_serving(arch, spec, reqs, cfg, pd=pd).summary


def homogeneous(arch: Arch) -> Arch:
    """``arch`` with its core classes removed: every core the default core."""
    return validate(Arch, {**arch.model_dump(), "core_classes": {}, "name": f"{arch.name}-homogeneous"},
                    f"{arch.name} without core classes")


def change(a, b):
    return f"{100 * (a - b) / b:+.0f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--only", choices=["a7", "a10"], default=None, help="run one of the two studies")
    ap.add_argument("--arch", default="npusim-64c", help="A7's chip")
    ap.add_argument("--hetero", default=str(ROOT / "examples" / "hetero-pd.yaml"),
                    help="A10's heterogeneous chip (decode cores as a core class)")
    ap.add_argument("--pd-stages", default=None, help="pipeline stages of the prefill and decode instances, P:D")
    ap.add_argument("--balance", choices=["cost", "layers"], default="cost",
                    help="layers per pipeline stage: even estimated cost (npusim's default) or even counts")
    ap.add_argument("--fusion-stages", type=int, default=2,
                    help="A10: pipeline stages of the fusion instance (TP = cores / stages; NPU-SIM's: 7)")
    args = ap.parse_args()
    args.pd_stages = tuple(int(x) for x in args.pd_stages.split(":")) if args.pd_stages else None
    t0 = time.perf_counter()
    if args.only != "a10":
        a7(load_arch(args.arch), args)
    if args.only != "a7":
        a10(load_arch(args.hetero), args)
    print(f"\nwall time {time.perf_counter() - t0:.0f} s; {machine_line()}")


def a7(arch, args) -> None:
    reqs = synthetic_requests(args.requests, args.rate, input_len=100, output_len=100, seed=1)
    stages = "auto" if args.pd_stages is None else "{}:{}".format(*args.pd_stages)
    print(f"A7: P:D core ratios on {arch.name}, {args.requests} requests of 100 in / 100 out tokens at "
          f"{args.rate}/s; instance stages {stages}, layers per stage balanced by {args.balance}")
    print(f"{'P:D':>6} | {'TTFT ms':>8} {'TBT ms':>8} {'E2E ms':>9} {'tok/s':>8}")
    res = {}
    for p, d in ((49, 14), (42, 21), (28, 28), (21, 42)):
        s = serve(arch, reqs, pd=(p, d), pd_stages=args.pd_stages, balance=args.balance)
        res[(p, d)] = s
        print(f"{p:>3}:{d:<2} | {s['ttft_ms']['mean']:8.1f} {s['tbt_ms']['mean']:8.1f} {s['e2e_ms']['mean']:9.1f} "
              f"{s['throughput_tokens_per_s']:8.1f}")
    checks = [
        ("49:14 vs 21:42 TTFT", res[(49, 14)]["ttft_ms"]["mean"], res[(21, 42)]["ttft_ms"]["mean"], "-40%", lambda x: x < 0),
        ("21:42 vs 49:14 E2E", res[(21, 42)]["e2e_ms"]["mean"], res[(49, 14)]["e2e_ms"]["mean"], "-68%", lambda x: x < 0),
        ("42:21 vs 49:14 TTFT", res[(42, 21)]["ttft_ms"]["mean"], res[(49, 14)]["ttft_ms"]["mean"], "+13%", lambda x: x > 0),
        ("42:21 vs 49:14 TBT", res[(42, 21)]["tbt_ms"]["mean"], res[(49, 14)]["tbt_ms"]["mean"], "-30%+", lambda x: x < 0),
        ("42:21 vs 28:28 TTFT", res[(42, 21)]["ttft_ms"]["mean"], res[(28, 28)]["ttft_ms"]["mean"], "-22%", lambda x: x < 0),
        ("42:21 vs 28:28 TBT", res[(42, 21)]["tbt_ms"]["mean"], res[(28, 28)]["tbt_ms"]["mean"], "+10%", lambda x: x > 0),
    ]
    print(f"{'comparison':>22} | {'simulated':>9} {'published':>9} | trend")
    for name, a, b, pub, ok in checks:
        print(f"{name:>22} | {change(a, b):>9} {pub:>9} | {'holds' if ok(a - b) else 'does not hold'}")



def a10(hetero, args) -> None:
    homo = homogeneous(hetero)
    print(f"\nA10: PD fusion on {homo.name} ({args.fusion_stages} stages) vs disaggregation 42:21 on {hetero.name} (heterogeneous decode "
          f"cores) and on {homo.name}, P:D token ratios; {args.requests} requests at {args.rate}/s")
    print(f"{'in:out':>9} | {'fusion tok/s':>12} {'hetero tok/s':>12} {'homo tok/s':>10} {'fus/het':>7} | "
          f"{'fusion TBT':>10} {'hetero TBT':>10} {'homo TBT':>8}")
    tbt = {"fusion": [], "hetero": []}
    ratios = {}
    for label, inp, out in (("1:5", 64, 320), ("1:1", 192, 192), ("10:1", 640, 64)):
        reqs = synthetic_requests(args.requests, args.rate, input_len=inp, output_len=out, seed=2)
        f = serve(homo, reqs, policy="fusion", fusion_stages=args.fusion_stages, balance=args.balance)
        d = serve(hetero, reqs, pd=(42, 21), pd_stages=args.pd_stages, balance=args.balance)
        h = serve(homo, reqs, pd=(42, 21), pd_stages=args.pd_stages, balance=args.balance)
        ratios[label] = f["throughput_tokens_per_s"] / d["throughput_tokens_per_s"]
        tbt["fusion"].append(f["tbt_ms"]["mean"])
        tbt["hetero"].append(d["tbt_ms"]["mean"])
        print(f"{label:>9} | {f['throughput_tokens_per_s']:12.1f} {d['throughput_tokens_per_s']:12.1f} "
              f"{h['throughput_tokens_per_s']:10.1f} {ratios[label]:7.2f} | {f['tbt_ms']['mean']:10.1f} "
              f"{d['tbt_ms']['mean']:10.1f} {h['tbt_ms']['mean']:8.1f}", flush=True)
    spread = {k: max(v) / min(v) for k, v in tbt.items()}
    print(f"published ({SOURCE}): fusion/disagg 2.3 at 1:5 and 1/1.34 = 0.75 at 10:1; TBT spread "
          f"disagg < 1.05x, fusion up to 2.57x")
    print(f"simulated: fusion/disagg {ratios['1:5']:.2f} at 1:5 ({'holds' if ratios['1:5'] > 1 else 'does not hold'}), "
          f"{ratios['10:1']:.2f} at 10:1 ({'holds' if ratios['10:1'] < 1 else 'does not hold'}); TBT spread "
          f"disagg {spread['hetero']:.2f}x, fusion {spread['fusion']:.2f}x "
          f"({'holds' if spread['hetero'] < spread['fusion'] else 'does not hold'})")


if __name__ == "__main__":
    main()
