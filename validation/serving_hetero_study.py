"""Heterogeneous decode cores under PD disaggregation (PUBLISHED.md A8).

Source: the NpuSim study, arXiv 2510.05632. Published (P:D cores 2:1, 7 nm area): raising the
decode cores' DRAM bandwidth 60 -> 240 GB/s gives x2.28 throughput (x2.18 per area); 480 GB/s
gives no further gain (compute-bound); shrinking the decode cores' arrays 64x64 -> 32x32 loses
< 5% throughput and gives x1.9 throughput per area.

Here: `examples/hetero-pd.yaml` (npusim-64c with a 60 GB/s DRAM channel per core) with its 21
decode cores (the middle columns) varied; PD disaggregation 42:21; Qwen3-4B bf16; a
decode-heavy workload. Area: `npusim.serving.area.core_area_mm2` per core (LLMCompass 7 nm
figures) plus DRAM PHY area in proportion to bandwidth (an HBM2e stack's 10.45 mm^2 PHY per
409.6 GB/s; an estimate).

    python validation/serving_hetero_study.py [--requests 24] [--rate 40] [--pd-stages 7:7]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.arch.derived import channel_bandwidths_gbps  # noqa: E402
from npusim.arch.schema import Arch  # noqa: E402
from npusim.config import deep_merge, validate  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.serving.area import core_area_mm2  # noqa: E402
from npusim.serving.requests import synthetic_requests  # noqa: E402
from npusim.serving.scheduler import SchedulerConfig  # noqa: E402
from npusim.serving.simulate import ServingConfig, simulate_serving  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PHY_MM2_PER_GBPS = 10.45 / 409.6


def variant(base: Arch, bw: float, array: int) -> Arch:
    data = deep_merge(base.model_dump(), {"core_classes": {"decode": {
        "channel_bandwidth_gbps": bw, "systolic_array": {"rows": array, "cols": array,
                                                        "weight_injection_cycles": array}}}})
    return validate(Arch, data, f"decode cores {array}x{array} at {bw} GB/s")


def area_mm2(arch: Arch) -> float:
    cores = sum(core_area_mm2(arch.systolic_for(c).rows, arch.systolic_for(c).cols, arch.sram_for(c).capacity_mb,
                              arch.cores.vector_unit.lanes)["total_mm2"] for c in range(arch.num_cores))
    return cores + PHY_MM2_PER_GBPS * float(channel_bandwidths_gbps(arch).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--pd-stages", default=None,
                    help="pipeline stages of the prefill and decode instances, P:D (NPU-SIM's configurations: 7:7)")
    args = ap.parse_args()
    base = load_arch(ROOT / "examples" / "hetero-pd.yaml")
    reqs = synthetic_requests(args.requests, args.rate, input_len=64, output_len=256, seed=3)
    spec = spec_from_flags(tp=4, stages=1).model_copy(update={"data_parallel": 1})
    if args.pd_stages:
        stages = tuple(int(x) for x in args.pd_stages.split(":"))
        spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"pd_stages": stages})})
    cfg = ServingConfig(model="qwen3-4b", scheduler=SchedulerConfig(policy="continuous", chunk_tokens=256))
    t0 = time.perf_counter()
    print(f"{'decode cores':>22} | {'tok/s':>8} {'TBT ms':>7} {'area mm2':>9} {'tok/s/mm2':>9}")
    res = {}
    for bw, array in ((60, 64), (120, 64), (240, 64), (480, 64), (240, 32)):
        arch = variant(base, bw, array)
        s = simulate_serving(arch, spec, reqs, cfg, pd=(42, 21)).summary
        area = area_mm2(arch)
        res[(bw, array)] = (s["throughput_tokens_per_s"], s["throughput_tokens_per_s"] / area)
        print(f"{array:>3}x{array:<3} at {bw:>4} GB/s | {s['throughput_tokens_per_s']:8.1f} "
              f"{s['tbt_ms']['mean']:7.2f} {area:9.1f} {res[(bw, array)][1]:9.4f}", flush=True)

    def ratio(a, b, i):
        return res[a][i] / res[b][i]

    print("published (arXiv 2510.05632, A8): 60->240 GB/s x2.28 (x2.18 per area); 480: no further gain; "
          "64x64->32x32: < 5% loss, x1.9 per area")
    r1, r1a = ratio((240, 64), (60, 64), 0), ratio((240, 64), (60, 64), 1)
    r2 = ratio((480, 64), (240, 64), 0)
    r3, r3a = ratio((240, 32), (240, 64), 0), ratio((240, 32), (240, 64), 1)
    print(f"simulated: 60->240 GB/s x{r1:.2f} (x{r1a:.2f} per area) [{'holds' if r1 > 1.2 else 'does not hold'}]; "
          f"240->480 x{r2:.2f} [{'holds' if r2 < 1.1 else 'does not hold'}]; 64x64->32x32 x{r3:.2f} throughput, "
          f"x{r3a:.2f} per area [{'holds' if r3 > 0.95 and r3a > 1 else 'does not hold'}]")
    print(f"wall time {time.perf_counter() - t0:.0f} s; {machine_line()}")


if __name__ == "__main__":
    main()
