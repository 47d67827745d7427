"""Calibration by script: every calibrated constant of the system presets, recomputed from the figure
it cites by running the simulator (``npusim calibrate``).

A calibrated constant stands for something a figure measured that the model does not simulate
(a protocol's fixed cost, an operator's launch and bookkeeping): its value is *the figure minus
what the simulator already accounts for*. So it must be recomputed whenever the model changes,
or it silently double-counts (or drops) time. Each recomputation here runs the simulator with the
constant set to its neutral value and takes the difference to the published figure, exactly as the
preset's header describes it:

* CloudMatrix384 UB protocol (paper Table 1, intra-node columns): efficiency per target = published
  bandwidth / the simulated bandwidth at efficiency 1 (256 MiB); fixed overhead per target =
  published 512 B latency - the simulated latency with no overhead; the switch latency = the mean
  over NPU read and write of (published inter - intra latency - the simulated difference with
  switches of zero latency) / 4 switches;
* MoE dispatch/combine operator overheads (CloudMatrix384 and Atlas 800I A2, the DeepEP-Ascend EP8
  rows marked ``role: calibration``): published operator time - the simulated fabric time of the
  same traffic with no overhead;
* Atlas 800I A2 HCCS efficiencies (HIXL single-pair bandwidths, 2 MiB blocks): published bandwidth /
  the simulated 2 MiB bandwidth at efficiency 1;
* Atlas 800I A2 ``runtime`` (operator launch floor and per-step host overhead): two graph-mode decode
  steps of the torchair model tables (``role: calibration``), solved for the two unknowns;
* the Ascend die's operator-level constants (``die``: the ``ascend-910b`` preset's ``kernel`` section,
  inherited by ``ascend-910b4`` and ``ascend-910c-die``, and its L2's per-core read rate) from the
  calibration half of the measured operator rows (``published.yaml`` ``operators``), as
  :mod:`npusim.validate.die_calibration` derives them.

``drift`` = stored / recomputed - 1; ``npusim calibrate --check`` fails above 2%.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from npusim.choices import CALIBRATION_GROUPS
from npusim.config import deep_merge
from npusim.system.load import LoadedSystem, load_system
from npusim.system.measure import point_to_point, run_moe
from npusim.system.schema import System
from npusim.system.topology import build_topology
from npusim.validate.published import published

DRIFT_LIMIT = 0.02


@dataclass
class Constant:
    name: str  # key path under the preset's system:
    preset: str
    value: float  # stored in the preset
    recomputed: float
    source: str
    method: str

    @property
    def drift(self) -> float:
        return self.value / self.recomputed - 1 if self.recomputed else float("inf")

    def to_dict(self) -> dict:
        return {**asdict(self), "drift": self.drift}


def _variant(loaded: LoadedSystem, changes: dict) -> LoadedSystem:
    """``loaded`` with ``changes`` merged into its system section (topology rebuilt)."""
    system = System.model_validate(deep_merge(loaded.system.model_dump(), changes))
    return replace(loaded, system=system, topology=build_topology(system))


def _get(system: System, path: str) -> float:
    obj = system.model_dump()
    for key in path.split("."):
        obj = obj[key]
    return float(obj)


def table1_constants() -> list[Constant]:
    pub = published()["cloudmatrix384_table1"]
    base = load_system("cloudmatrix384", nodes=2)
    src = f"{pub['source']} (intra-node columns)"
    proto = "fabrics.ub.protocol"
    kinds = {"npu-npu": ("die", "npu1.die0", "npu8.die0"), "npu-cpu": ("cpu", "cpu0", "cpu4")}
    unit_eff = _variant(base, {"fabrics": {"ub": {"protocol": {f"{op}_efficiency": {"die": 1.0, "cpu": 1.0}
                                                                for op in ("read", "write")}}}})
    no_ovh = _variant(base, {"fabrics": {"ub": {"protocol": {f"{op}_overhead_ns": {"die": 0.0, "cpu": 0.0}
                                                              for op in ("read", "write")}}}})
    no_switch = _variant(base, {"fabrics": {"ub": {"switches": [
        {**s.model_dump(), "latency_ns": 0.0} for s in base.system.fabrics["ub"].switches]}}})
    out, switch = [], []
    for r in pub["rows"]:
        kind, intra, inter = kinds[r["pair"]]
        op = r["op"]
        bw = point_to_point(unit_eff, "npu0.die0", intra, op, 256 << 20).bandwidth_gbps
        out.append(Constant(f"{proto}.{op}_efficiency.{kind}", "cloudmatrix384",
                            _get(base.system, f"{proto}.{op}_efficiency.{kind}"), r["intra_gbps"] / bw, src,
                            "published bandwidth / simulated bandwidth at efficiency 1 (256 MiB)"))
        lat = point_to_point(no_ovh, "npu0.die0", intra, op, 512).latency_us
        out.append(Constant(f"{proto}.{op}_overhead_ns.{kind}", "cloudmatrix384",
                            _get(base.system, f"{proto}.{op}_overhead_ns.{kind}"), (r["intra_us"] - lat) * 1e3, src,
                            "published 512 B latency - simulated latency with no overhead"))
        if kind == "die":
            sim = (point_to_point(no_switch, "npu0.die0", inter, op, 512).latency_us
                   - point_to_point(no_switch, "npu0.die0", intra, op, 512).latency_us)
            switch.append(((r["inter_us"] - r["intra_us"]) - sim) * 1e3 / 4)
    for s in base.system.fabrics["ub"].switches:
        out.append(Constant(f"fabrics.ub.switches[{s.name}].latency_ns", "cloudmatrix384", s.latency_ns,
                            sum(switch) / len(switch), f"{pub['source']} (NPU-NPU rows)",
                            "mean over read and write of (inter - intra latency - simulated difference with "
                            "zero-latency switches) / 4 switches"))
    return out


def operator_constants() -> list[Constant]:
    out = []
    for entry in published()["moe_operators"]:
        rows = [r for r in entry["rows"] if r.get("role") == "calibration"]
        if not rows:
            continue
        base = load_system(entry["system"])
        bare = _variant(base, {"moe_operators": {"dispatch_overhead_us": 0.0, "combine_overhead_us": 0.0}})
        tokens = entry.get("tokens_per_rank", 128)
        for r in rows:
            fabric_us = run_moe(bare, r["op"], r["ep"], tokens, 8, 7168, 256, "uniform", "int8", "flow", "aiv").time_us
            key = f"moe_operators.{r['op']}_overhead_us"
            out.append(Constant(key, entry["system"], _get(base.system, key), r["latency_us"] - fabric_us,
                                f"{entry['source']}: {r['op']} EP{r['ep']} {r['latency_us']} us",
                                f"published operator time - simulated fabric time ({tokens} tokens per rank, "
                                f"hidden 7168, top-8 of 256, INT8, the system's decode copies)"))
    return out


def hccs_constants() -> list[Constant]:
    fig = published()["calibration"]["hixl_a2_hccs"]
    base = load_system("atlas-800i-a2", nodes=1)
    unit = _variant(base, {"fabrics": {"hccs": {"protocol": {"read_efficiency": {"die": 1.0},
                                                             "write_efficiency": {"die": 1.0}}}}})
    out = []
    for op, gbps in (("write", fig["write_gbps"]), ("read", fig["read_gbps"])):
        bw = point_to_point(unit, "npu0.die0", "npu1.die0", op, fig["block_bytes"]).bandwidth_gbps
        key = f"fabrics.hccs.protocol.{op}_efficiency.die"
        out.append(Constant(key, "atlas-800i-a2", _get(base.system, key), gbps / bw, fig["source"],
                            f"published {op} bandwidth / simulated bandwidth at efficiency 1 "
                            f"({fig['block_bytes'] >> 20} MiB)"))
    return out


def runtime_constants() -> list[Constant]:
    """The Atlas 800I A2 operator runtime (``runtime.launch_us``, ``runtime.step_overhead_us``) from
    the two ``ascend_plan_steps`` rows marked ``role: calibration`` (two decode steps of models with
    different operator counts): with launch floor ``L`` and no step overhead the simulated steps are
    ``T_a(L)``, ``T_b(L)``; ``L`` solves ``T_a(L) - T_b(L) = P_a - P_b`` (bisection: the model with more
    operators gains more per microsecond of floor), then the step overhead is ``P_b - T_b(L)``."""
    from npusim.validate.plans import simulated_step_ms

    pub = published()["ascend_plan_steps"]
    rows = sorted((r for r in pub["rows"] if r.get("role") == "calibration"), key=lambda r: r["ms"])
    if len(rows) != 2:
        raise ValueError(f"published.yaml ascend_plan_steps: {len(rows)} rows with role: calibration, expected 2")
    b, a = rows  # a: the slower step (more operators)
    base = load_system("atlas-800i-a2", nodes=1)

    def step_ms(row: dict, launch: float) -> float:
        bare = _variant(base, {"runtime": {"launch_us": launch, "step_overhead_us": 0.0}})
        return simulated_step_ms(bare, row)

    def gap(launch: float) -> float:  # T_a(L) - T_b(L)
        return step_ms(a, launch) - step_ms(b, launch)

    target = a["ms"] - b["ms"]
    lo, hi = 0.0, 1000.0
    if gap(lo) < target:
        for _ in range(30):  # to ~1e-6 us
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if gap(mid) < target else (lo, mid)
    launch = (lo + hi) / 2 if lo > 0 else 0.0
    tb = step_ms(b, launch)
    src = f"{pub['source']}: {a['model']} and {b['model']} decode, batch {a['batch']} ({a['ms']} / {b['ms']} ms)"
    rt = base.system.runtime
    return [Constant("runtime.launch_us", "atlas-800i-a2", rt.launch_us, launch, src,
                     "the floor L with T_a(L) - T_b(L) = P_a - P_b (no step overhead)"),
            Constant("runtime.step_overhead_us", "atlas-800i-a2", rt.step_overhead_us, (b["ms"] - tb) * 1e3, src,
                     "P_b - T_b(L)")]


def die_constants() -> list[Constant]:
    """The Ascend die's ``kernel`` constants and L2 per-core rate (:mod:`npusim.validate.die_calibration`)."""
    from npusim.arch import load_arch
    from npusim.validate import die_calibration as dc

    preset = "ascend-910b"
    arch = load_arch(preset)
    k = arch.kernel
    src = "published.yaml operators, calibration half: msModeling fork micro-benchmark gap report"
    costs = dc.vector_costs()
    rate, scores = dc.load_rate_choice()
    out = [
        Constant("kernel.start_us", preset, k.start_us, dc.kernel_start_us(), src,
                 "median of duration - core time (aicore_time / aiv_time) over the report's rows"),
        Constant("kernel.cube_setup_us", preset, k.cube_setup_us, dc.cube_setup_us(), f"{src}: MatMulV2 6x512x4096",
                 "core time - simulated GEMM with no start and no setup (ascend-910c-die)"),
        Constant("kernel.vector_setup_us", preset, k.vector_setup_us, costs["vector_setup_us"],
                 f"{src}: AscendQuantV2 9x2048, DynamicQuant 1030x2304",
                 "small row's core time - its simulated time at the quantize cost fitting both rows"),
    ]
    for cls, value in costs["vector_cycles_per_element"].items():
        out.append(Constant(f"kernel.vector_cycles_per_element.{cls}", preset,
                            float(k.vector_cycles_per_element.get(cls, 0.0)), value, src,
                            "bisection: simulated core time (no start) + setup = the row's core time"))
    out.append(Constant("kernel.vector_cycles_per_element_pass", preset, k.vector_cycles_per_element_pass or 0.0,
                        costs["vector_cycles_per_element_pass"], src,
                        "mean over quantize and rmsnorm of cycles per element / element passes"))
    out.append(Constant("l2.core_bytes_per_cycle", preset, arch.l2.core_bytes_per_cycle, rate,
                        "; ".join(f"{r:g}: {dc.LOAD_RATES[r]}" for r in dc.LOAD_RATES),
                        "the candidate with the smaller median |error| over the calibration half's GEMM rows ("
                        + ", ".join(f"{r:g} -> {100 * e:.1f}%" for r, e in scores.items()) + ")"))
    return out


GROUPS: dict[str, Callable[[], list[Constant]]] = {
    "operators": operator_constants, "hccs": hccs_constants, "table1": table1_constants,
    "runtime": runtime_constants, "die": die_constants,
}


assert tuple(GROUPS) == CALIBRATION_GROUPS, "npusim.choices.CALIBRATION_GROUPS lists the groups for the CLI"


def calibrate(groups: list[str] | None = None) -> list[Constant]:
    return [c for g in (groups or list(GROUPS)) for c in GROUPS[g]()]
