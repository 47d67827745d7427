"""PD disaggregation core ratios and PD fusion vs disaggregation (PUBLISHED.md A7, A10).

Source: the NpuSim study, arXiv 2510.05632 ("From Principles to Practice: A Systematic Study
of LLM Serving on Multi-core NPUs"), Qwen3-4B on 64 cores.

A7 published: P:D 49:14 cuts TTFT 40% vs 21:42; 21:42 cuts mean E2E latency 68% vs 49:14 at a
100:100 in:out workload; 42:21 vs 49:14: TTFT +13%, TBT -30% or more; 42:21 vs 28:28: TTFT
-22%, TBT +10%.
A10 published: at P:D tokens 1:5 (decode-heavy) fusion has 2.3x the throughput of
disaggregation; at 10:1 (prefill-heavy) disaggregation has 1.34x; disaggregation's TBT varies
< 5% across workloads, fusion's up to 2.57x. (Published A10 uses heterogeneous decode cores,
which npusim cannot describe yet: here both use the same cores.)

Here: npusim-64c, Qwen3-4B bf16, analytical memory, path NoC, Poisson arrivals; lengths fixed
per workload. Each disaggregated instance spreads TP over its region (at most 32 cores a stage);
fusion uses the whole chip the same way (TP 32 x 2 stages). Prints the simulated figures beside the published ones and whether each
trend holds.

    python validation/serving_pd_study.py [--requests 40] [--rate 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.serving.requests import synthetic_requests  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402

SOURCE = "arXiv 2510.05632 (NpuSim)"


def serve(arch, reqs, pd=None, policy="fusion"):
    # fusion: the whole chip as one instance laid out like the disaggregated ones (TP over at most
    # 32 cores a stage: TP 32 x 2 stages); disaggregated instances choose their own TP and stages
    spec = spec_from_flags(tp=32, stages=2, layout="linear_seq").model_copy(update={"data_parallel": 1})
    cfg = ServingConfig(model="qwen3-4b", scheduler=SchedulerConfig(
        policy="continuous" if pd else policy, budget=512, chunk_tokens=256, max_batch=64))
    return simulate_serving(arch, spec, reqs, cfg, pd=pd).summary


def change(a, b):
    return f"{100 * (a - b) / b:+.0f}%"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--rate", type=float, default=20.0)
    ap.add_argument("--only", choices=["a7", "a10"], default=None, help="run one of the two studies")
    args = ap.parse_args()
    arch = load_arch("npusim-64c")
    t0 = time.perf_counter()
    if args.only != "a10":
        a7(arch, args)
    if args.only != "a7":
        a10(arch, args)
    print(f"\nwall time {time.perf_counter() - t0:.0f} s; {machine_line()}")


def a7(arch, args) -> None:
    reqs = synthetic_requests(args.requests, args.rate, input_len=100, output_len=100, seed=1)
    print(f"A7: P:D core ratios, {args.requests} requests of 100 in / 100 out tokens at {args.rate}/s")
    print(f"{'P:D':>6} | {'TTFT ms':>8} {'TBT ms':>8} {'E2E ms':>9} {'tok/s':>8}")
    res = {}
    for p, d in ((49, 14), (42, 21), (28, 28), (21, 42)):
        s = serve(arch, reqs, pd=(p, d))
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



def a10(arch, args) -> None:
    print("\nA10: PD fusion vs disaggregation (42:21), P:D token ratios")
    print(f"{'in:out':>9} | {'fusion tok/s':>12} {'disagg tok/s':>12} {'fus/dis':>7} | {'fusion TBT':>10} {'disagg TBT':>10}")
    tbt = {"fusion": [], "disagg": []}
    ratios = {}
    for label, inp, out in (("1:5", 64, 320), ("1:1", 192, 192), ("10:1", 640, 64)):
        reqs = synthetic_requests(args.requests, args.rate, input_len=inp, output_len=out, seed=2)
        f = serve(arch, reqs, policy="fusion")
        d = serve(arch, reqs, pd=(42, 21))
        ratios[label] = f["throughput_tokens_per_s"] / d["throughput_tokens_per_s"]
        tbt["fusion"].append(f["tbt_ms"]["mean"])
        tbt["disagg"].append(d["tbt_ms"]["mean"])
        print(f"{label:>9} | {f['throughput_tokens_per_s']:12.1f} {d['throughput_tokens_per_s']:12.1f} "
              f"{ratios[label]:7.2f} | {f['tbt_ms']['mean']:10.1f} {d['tbt_ms']['mean']:10.1f}")
    spread = {k: max(v) / min(v) for k, v in tbt.items()}
    print(f"published ({SOURCE}): fusion/disagg 2.3 at 1:5 and 1/1.34 = 0.75 at 10:1; TBT spread "
          f"disagg < 1.05x, fusion up to 2.57x")
    print(f"simulated: fusion/disagg {ratios['1:5']:.2f} at 1:5 ({'holds' if ratios['1:5'] > 1 else 'does not hold'}), "
          f"{ratios['10:1']:.2f} at 10:1 ({'holds' if ratios['10:1'] < 1 else 'does not hold'}); TBT spread "
          f"disagg {spread['disagg']:.2f}x, fusion {spread['fusion']:.2f}x "
          f"({'holds' if spread['disagg'] < spread['fusion'] else 'does not hold'})")


if __name__ == "__main__":
    main()
