"""The chip fidelity under a system step: the analytical NoC/memory default against the path NoC, on
the DeepSeek deployments (B1 A2 decode, B2 A2 prefill, B3 CM384 decode, and B1/B3 at a small batch)
and dense Llama-3-70B TP8 steps on Atlas 800I A2.

Each row is one step simulated twice, the dies' kernels costed at ``--fidelity analytical`` (the
default) and at ``--fidelity path`` (NpuSim's message-level NoC on every die); the table prints
both step times and the analytical one's error against the path one. ``--detailed memory`` compares
against ``--memory tlm`` instead (the transaction-level HBM and, on the Ascend dies, the L2 cache;
every kernel costed at TLM the first time: minutes per row).

    python validation/system_fidelity.py [--detailed noc|memory]
"""

from __future__ import annotations

import argparse
import time

from npusim.mapping.spec import MAPPER_DIR, load_deployment
from npusim.system.chipcost import ChipCost
from npusim.system.load import load_system
from npusim.system.mapper import StepShape
from npusim.system.moe_step import simulate_step
from npusim.system.plan import ParallelPlan
from npusim.system.step import simulate_plan_step

DEEPSEEK = [  # (label, system, mapping, step arguments)
    ("B1 A2 decode, batch 72", "atlas-800i-a2", "a2-deepseek-decode.yaml",
     dict(batch=72, kv=3072, kv_min=2048, mtp=1, mtp_acceptance=0.7)),
    ("B1 A2 decode, batch 8", "atlas-800i-a2", "a2-deepseek-decode.yaml", dict(batch=8, kv=3072, mtp=1)),
    ("B2 A2 prefill, 1,024 tokens/NPU", "atlas-800i-a2", "a2-deepseek-prefill.yaml", dict(batch_tokens=1024, seq=2048)),
    ("B3 CM384 decode, batch 96", "cloudmatrix384", "cm384-deepseek-decode.yaml",
     dict(batch=96, kv=4096, mtp=1, mtp_acceptance=0.7)),
    ("B3 CM384 decode, batch 8", "cloudmatrix384", "cm384-deepseek-decode.yaml", dict(batch=8, kv=4096, mtp=1)),
]
DENSE = [("Llama-3-70B TP8 decode, batch 1", "decode", 1), ("Llama-3-70B TP8 decode, batch 32", "decode", 32),
         ("Llama-3-70B TP8 prefill, 4 x 1,024", "prefill", 4)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--detailed", choices=("noc", "memory"), default="noc",
                    help="the detailed fidelity to compare with: the path NoC (default) or TLM memory")
    args = ap.parse_args()
    detailed = {"noc": dict(noc="path"), "memory": dict(memory="tlm")}[args.detailed]
    name = "path ms" if args.detailed == "noc" else "TLM ms"

    def costs(chip):
        return ChipCost(chip), ChipCost(chip, **detailed)

    print(f"{'step':36s} {'analytical ms':>14s} {name:>9s} {'analytical err':>15s} {'wall s':>7s}")
    systems = {}
    for label, system, mapping, kw in DEEPSEEK:
        loaded = systems.setdefault(system, load_system(system))
        dep = load_deployment(MAPPER_DIR / mapping)
        t0 = time.perf_counter()
        ms = [simulate_step(loaded, dep, chip_cost=cc, **kw).step_ms for cc in costs(loaded.chip)]
        print(f"{label:36s} {ms[0]:14.2f} {ms[1]:9.2f} {ms[0] / ms[1] - 1:+15.1%} {time.perf_counter() - t0:7.1f}")
    a2 = load_system("atlas-800i-a2", nodes=1)
    for label, phase, batch in DENSE:
        shape = StepShape("decode", batch, 1, 1536) if phase == "decode" else StepShape("prefill", batch, 1024, 1024)
        t0 = time.perf_counter()
        ms = [simulate_plan_step(a2, "llama-3-70b", ParallelPlan(npus=8, tp=8, precision="fp16"), shape,
                                 chip_cost=cc)[0]["step_ms"] for cc in costs(a2.chip)]
        print(f"{label:36s} {ms[0]:14.2f} {ms[1]:9.2f} {ms[0] / ms[1] - 1:+15.1%} {time.perf_counter() - t0:7.1f}")


if __name__ == "__main__":
    main()
