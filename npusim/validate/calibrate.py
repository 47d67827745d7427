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
* every preset's ``runtime`` (eager host dispatch per operator, graph replay per step, launch per
  kernel): the runtime micro-benchmarks of ``published.yaml`` ``operators`` (family ``runtime``,
  calibration half), each constant one row or a range's mean (:func:`runtime_constants`); until issue
  39 the A2 preset's launch floor and step overhead were solved from two end-to-end decode steps.
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
        if not self.recomputed:  # a constant whose source says 0 (not modelled)
            return 0.0 if not self.value else float("inf")
        return self.value / self.recomputed - 1

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


def _runtime_rows() -> tuple[dict, dict]:
    """The ``operators`` rows of family ``runtime`` from sources of the calibration half, by source
    id, and the sources by id."""
    ops = published()["operators"]
    sources = {s["id"]: s for s in ops["sources"]}
    rows: dict[str, list[dict]] = {}
    for r in ops["rows"]:
        if r.get("family") == "runtime" and sources[r["source"]].get("half") == "calibration":
            rows.setdefault(r["source"], []).append(r)
    return rows, sources


def _row(rows: list[dict], text: str) -> dict:
    found = [r for r in rows if text in r["op"]]
    if len(found) != 1:
        raise ValueError(f"published.yaml operators: {len(found)} runtime rows whose op contains {text!r}, expected 1")
    return found[0]


def runtime_constants() -> list[Constant]:
    """Every system preset's ``runtime`` constants (and the schema's defaults, what a user's system
    file gets) from the runtime micro-benchmarks of ``published.yaml`` ``operators`` (family
    ``runtime``, sources of the calibration half only; no end-to-end step):

    * ``host_dispatch_us`` = the eager ``torch.add`` host enqueue per op (triton-ascend #1675, 910B2);
    * ``graph_launch_us`` = a direct kernel launch's host enqueue, the optimized C launcher (same
      source): a graph replay is one launch call on the host;
    * ``kernel_launch_us`` = the mean of ascend-dmi's H2D latency range (FlagPerf A3 toolkit): a
      task's crossing from the host's submission to the device. The rest of an isolated launch +
      synchronize round trip (ascend-rs appendix F, 910B3 rows: median printed in the method) is the
      host's launch call and the kernel's device-side start, which is the operator's time on the die.
    * ``scheduler_us``: cited (the preset's ``sources`` entry), not a micro-benchmark: CloudMatrix384
      2000 us (xDeepServe, arXiv 2508.02520 sec. 7.1), 0 elsewhere (not modelled); checked as stored.
    """
    from npusim.system.schema import Runtime

    rows, _ = _runtime_rows()
    triton = rows["triton-ascend-issue-1675"]
    dmi = rows["flagrt-flagperf-a3-toolkit"]
    rs = [r for r in rows["ascend-rs-appendix-f"] if "910B3" in r.get("conditions", "")]
    eager = _row(triton, "eager torch.add")["measured_us"]
    direct = _row(triton, "optimized launcher")["measured_us"]
    h2d = _row(dmi, "H2D latency")
    launch = (h2d["measured_us_min"] + h2d["measured_us_max"]) / 2
    trip = sorted(r["measured_us"] for r in rs)
    median = trip[len(trip) // 2]
    recomputed = {
        "host_dispatch_us": (eager, "triton-ascend #1675 (910B2)", "eager torch.add host enqueue per op"),
        "graph_launch_us": (direct, "triton-ascend #1675 (910B2)",
                            "a direct kernel launch's host enqueue (optimized C launcher): one replay call"),
        "kernel_launch_us": (launch, "FlagPerf A3 toolkit, ascend-dmi H2D latency",
                             f"mean of the H2D latency range {h2d['measured_us_min']:.3f}-{h2d['measured_us_max']:.3f} "
                             f"us; the 910B3 launch+sync round trip (median {median:g} us of {trip}) less it and the "
                             f"host's launch call ({direct} us) leaves {median - direct - launch:.1f} us of device-side "
                             "kernel start, an operator's time on the die"),
    }
    out = []
    presets = [(name, load_system(name, nodes=1).system.runtime) for name in ("atlas-800i-a2", "cloudmatrix384")]
    for preset, rt in [*presets, ("(schema default)", Runtime())]:
        for key, (value, src, method) in recomputed.items():
            out.append(Constant(f"runtime.{key}", preset, getattr(rt, key), value, src, method))
        cited = rt.sources.get("scheduler_us", "")
        out.append(Constant("runtime.scheduler_us", preset, rt.scheduler_us,
                            2000.0 if "xDeepServe" in cited else 0.0, cited or "none (not modelled)",
                            "cited per-step scheduling time (xDeepServe's ~2 ms bubble), else 0"))
    return out


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
                 f"{src}: AscendQuantV2 9x2048",
                 "its core time - its simulated time (reference-kernel instructions, no start, no setup)"),
        Constant("kernel.vector_instruction_cycles", preset, k.vector_instruction_cycles,
                 costs["vector_instruction_cycles"], "asc-devkit add_high_performance cases 2-3 (Atlas A2)",
                 "aiv_vec_time at 4096 and 16384 elements per fp16 Add: the start per instruction"),
        Constant("kernel.vector_cycles_per_repeat", preset, k.vector_cycles_per_repeat or 0.0,
                 costs["vector_cycles_per_repeat"], "asc-devkit add_high_performance cases 2-3 (Atlas A2)",
                 "aiv_vec_time at 4096 and 16384 elements per fp16 Add: cycles per 256-byte repeat"),
    ]
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
