"""Multi-NPU speed: a DeepSeek-R1 decode step of the 160-NPU CloudMatrix384 instance, a prefill step of
a 16-NPU instance (each with a cold and a warm chip-cost cache), and serving Mooncake requests on
the whole system (prefill/decode disaggregation, caching pool on) — wall time, simulated time and
what was simulated, printed as a table.

    python validation/perf/bench_system.py [--requests 200,1000] [--skip-steps]

The serving rows replay the first N requests of the Mooncake conversation trace (``../shared``
when it is beside the checkout, else the repository's 200-request sample) at its own arrival
times; the chip-cost cache is a fresh directory per run, so each row pays its own misses.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _fresh_cache() -> str:
    d = tempfile.mkdtemp(prefix="npusim-bench-")
    os.environ["NPUSIM_CACHE_DIR"] = d
    return d


def _steps() -> list[tuple]:
    from npusim.mapping.spec import load_deployment
    from npusim.system.chipcost import ChipCost
    from npusim.system.load import load_system
    from npusim.system.moe_step import simulate_step

    cm = load_system("cloudmatrix384")
    rows = []
    for name, mapping, kw in (("decode step, 160 NPUs, batch 96, KV 4096", "cm384-deepseek-decode",
                               dict(batch=96, kv=4096)),
                              ("prefill step, 16 NPUs, 16K tokens/NPU, seq 4096", "cm384-deepseek-prefill",
                               dict(batch_tokens=16384, seq=4096))):
        dep = load_deployment(ROOT / "mappers" / f"{mapping}.yaml")
        _fresh_cache()
        for cache in ("cold", "warm"):
            cc = ChipCost(cm.chip)  # warm: a new process would read the same disk cache
            t = time.perf_counter()
            r = simulate_step(cm, dep, **kw, chip_cost=cc)
            wall = time.perf_counter() - t
            rows.append((f"{name} ({cache} chip costs)", wall, r.step_ms / 1e3, f"{cc.stats.misses} chip misses"))
    return rows


def _serving(n: int) -> tuple:
    from npusim.mapping.spec import load_system_serving
    from npusim.serving.traces import load_trace
    from npusim.system.load import load_system
    from npusim.system.serving import simulate_system_serving

    shared = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
    trace = shared if shared.is_file() else ROOT / "traces" / "mooncake_sample.jsonl"
    reqs = load_trace(trace, first=n)
    cm = load_system("cloudmatrix384")
    plan, pdep, ddep = load_system_serving(ROOT / "mappers" / "cm384-deepseek-serving.yaml")
    _fresh_cache()
    t = time.perf_counter()
    run = simulate_system_serving(cm, plan, pdep, ddep, reqs)
    wall = time.perf_counter() - t
    s = run.summary
    what = (f"{s['prefill_batches']} prefill batches, {s['decode_steps']} decode steps, "
            f"{s['step_table']['prefill_points'] + s['step_table']['decode_points']} step shapes")
    return (f"serving {len(reqs)} Mooncake requests ({trace.name})", wall, s["duration_s"], what)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", default="200,1000", help="serving rows: comma-separated request counts")
    ap.add_argument("--skip-steps", action="store_true", help="only the serving rows")
    args = ap.parse_args()
    print(machine_line())
    rows = [] if args.skip_steps else _steps()
    for n in (int(x) for x in args.requests.split(",") if x):
        rows.append(_serving(n))
    print(f"| {'what':<62} | {'wall s':>8} | {'simulated s':>11} | simulated |")
    print(f"| {'-' * 62} | {'-' * 8} | {'-' * 11} | --- |")
    for name, wall, sim_s, what in rows:
        print(f"| {name:<62} | {wall:8.1f} | {sim_s:11.3f} | {what} |")


if __name__ == "__main__":
    main()
