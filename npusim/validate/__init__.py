"""``npusim validate``: every comparison npusim makes with published figures and peer simulators,
as rows computed by running the simulator (see :mod:`.rows` for how a row is judged).

A *check* is a named function ``fn(quick) -> list[Row]`` in one of this package's modules; the
registry below lists them in the order they print. ``quick`` marks the checks in ``--quick``
(a representative subset that fits in ~10 minutes on a 2-core machine); a check given
``quick=True`` may also run a reduced version of itself (it says so in its rows' notes).
The published figures live in ``published.yaml`` next to this file.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

from npusim.errors import ConfigError, NpusimError
from npusim.validate.rows import Row


@dataclass(frozen=True)
class Check:
    name: str
    title: str
    target: str          # "module:function" under npusim.validate
    quick: bool          # part of --quick
    reduced: str = ""    # what --quick leaves out of this check, if anything

    def run(self, quick: bool) -> list[Row]:
        module, fn = self.target.split(":")
        return getattr(importlib.import_module(f"npusim.validate.{module}"), fn)(quick)


CHECKS = (
    Check("scalesim", "systolic-array GEMM cycles vs SCALE-Sim 3.0.0", "scalesim:scalesim_rows", True),
    Check("fabric-table1", "CloudMatrix384 Table 1: point-to-point bandwidth and latency", "systems:table1_rows", True),
    Check("moe-dispatch-combine", "MoE dispatch/combine operator latency on CloudMatrix384", "systems:moe_rows", True),
    Check("moe-normal-kernels", "prefill's MoE dispatch/combine vs DeepEP-Ascend's normal kernels (fitted)",
          "systems:normal_kernel_rows", False),
    Check("chip-gemm", "large GEMMs on one Ascend die vs measured kernel times", "chip_gemm:chip_gemm_rows", True),
    Check("operators", "measured Ascend operators (GEMM, attention, vector, HCCL) vs the die and fabric models",
          "operators:operator_rows", False),
    Check("deepseek", "DeepSeek-V3/R1 deployments on Atlas 800I A2 and CloudMatrix384", "systems:deepseek_rows", True),
    Check("plans", "any model by a parallel plan: dense 7B-72B and Qwen3-235B-A22B steps on Atlas 800I A2",
          "plans:plan_rows", True, "one decode and one prefill row per dense model"),
    Check("partition", "NpuSim A3/A4: TP-K vs TP-MN vs TP-MNK", "partition:partition_rows", True,
          "lengths 256-4096 (no 128)"),
    Check("pd-ratios", "NpuSim A7: PD disaggregation core ratios", "serving_pd:pd_ratio_rows", True),
    Check("hetero-decode", "NpuSim A8: heterogeneous decode cores", "hetero:hetero_rows", True,
          "8 requests of 64 in/128 out instead of 24 of 64/256"),
    Check("sram-stages", "NpuSim A9: PD fusion, SRAM per core and pipeline stages", "sram:sram_rows", False),
    Check("fusion-vs-disagg", "NpuSim A10: PD fusion vs heterogeneous disaggregation", "serving_pd:fusion_rows", False),
    Check("fidelity", "NpuSim A2 (self): npusim's analytical vs TLM fidelity", "fidelity:fidelity_rows", False),
    Check("serving", "published vllm bench serve results on Atlas A2 vs the system serving loop and its client",
          "serving_bench:serving_rows", False),
)
CHECK_NAMES = tuple(c.name for c in CHECKS)


def select(only: str | None = None, quick: bool = False) -> list[Check]:
    """The checks to run: ``only`` (one name, or a comma list) or all (``quick``: the quick subset)."""
    if only:
        names = [n.strip() for n in only.split(",") if n.strip()]
        unknown = [n for n in names if n not in CHECK_NAMES]
        if unknown:
            raise ConfigError(f"--only {','.join(unknown)}: no such check; expected one of {', '.join(CHECK_NAMES)}")
        return [c for c in CHECKS if c.name in names]
    return [c for c in CHECKS if c.quick or not quick]


#: the note of the row standing for a check that could not run (an install fault, not a model's miss)
COULD_NOT_RUN = "could not run: "


def could_not_run(row: Row) -> bool:
    """Whether ``row`` stands for a check that raised instead of producing its rows."""
    return row.simulated is None and row.note.startswith(COULD_NOT_RUN)


def run_checks(checks: list[Check], quick: bool = False, progress=None) -> list[tuple[Check, list[Row], float]]:
    """Run each check; a check that cannot run (the project's own error) becomes one failing row
    saying why, so the table is always complete."""
    out = []
    for check in checks:
        if progress:
            progress(check)
        t0 = time.perf_counter()
        try:
            rows = check.run(quick)
        except NpusimError as exc:
            rows = [Row(name=check.name, source=check.title, published=None, simulated=None, tolerance=0.0,
                        note=f"{COULD_NOT_RUN}{exc}")]
        out.append((check, rows, time.perf_counter() - t0))
    return out
