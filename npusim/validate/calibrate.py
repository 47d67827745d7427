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
* every preset's ``runtime`` (eager host dispatch per operator and per HCCL collective, graph replay
  per step and parameter update per attention operator, launch per kernel): the runtime
  micro-benchmarks of ``published.yaml`` ``operators`` (family ``runtime``, calibration half), each
  constant one row or a range's mean, the HCCL dispatch a collective row less its simulated device
  time (:func:`runtime_constants`); until issue 39 the A2 preset's launch floor and step overhead
  were solved from two end-to-end decode steps.
* every preset's ``hccl`` (HCCL's op-base copies and CCL buffer, :func:`hccl_constants`): the local
  copy efficiency from the ascend-dmi D2D row (calibration half), the buffer size cited.
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
from npusim.arch.load import load_arch
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


def _calibration_rows(family: str = "runtime") -> tuple[dict, dict]:
    """The ``operators`` rows of ``family`` from sources of the calibration half, by source id, and
    the sources by id."""
    ops = published()["operators"]
    sources = {s["id"]: s for s in ops["sources"]}
    rows: dict[str, list[dict]] = {}
    for r in ops["rows"]:
        if r.get("family") == family and sources[r["source"]].get("half") == "calibration":
            rows.setdefault(r["source"], []).append(r)
    return rows, sources


def _row(rows: list[dict], text: str) -> dict:
    found = [r for r in rows if text in r["op"]]
    if len(found) != 1:
        raise ValueError(f"published.yaml operators: {len(found)} rows whose op contains {text!r}, expected 1")
    return found[0]


def runtime_constants() -> list[Constant]:
    """Every system preset's ``runtime`` constants (and the schema's defaults, what a user's system
    file gets) from the runtime micro-benchmarks of ``published.yaml`` ``operators`` (family
    ``runtime``, sources of the calibration half only; no end-to-end step):

    * ``host_dispatch_us`` = the eager ``torch.add`` host enqueue per op (triton-ascend #1675, 910B2);
    * ``attention_dispatch_us`` = the eager fused-attention op's cadence called back to back on an
      aarch64 host (pto-isa demos/torch_jit/flash_atten, 910B2, 128 x 1024): the host's, since the
      simulated kernel on ``ascend-910b`` is far shorter (checked: below half of it);
    * ``graph_launch_us`` = the ACL graph replay enqueue's host wall time (vllm-ascend PR #15471);
    * ``graph_update_us`` = the same source's per-step FIA task-update cost over its attention
      operators, per operator;
    * ``hccl_dispatch_us`` = hccl_test's back-to-back 8 KiB all-reduce of two A3 dies (FlagPerf A3
      toolkit, the algbw range's minimum read as its smallest size): the host's cadence of op-base
      HCCL calls, since the eager model lets the host run ahead and the simulated device time of
      that all-reduce (:func:`hccl_device_us`) is far shorter (checked: below half of it);
    * ``kernel_launch_us`` = the mean of ascend-dmi's H2D latency range (FlagPerf A3 toolkit): a
      task's crossing from the host's submission to the device. The rest of an isolated launch +
      synchronize round trip (ascend-rs appendix F, 910B3 rows: median printed in the method) is the
      host's launch call and the kernel's device-side start, which is the operator's time on the die.
    * ``sync_us`` = the same 910B3 launch + synchronize round trip (median) less the direct launch
      call, ``kernel_launch_us`` and the negligible kernel's time on the die (``ascend-910b4``'s stored
      ``kernel.start_us + vector_setup_us``): the synchronize's return to the host;
    * ``scheduler_us``: where the preset's ``sources`` entry cites xDeepServe (CloudMatrix384), its
      "scheduling bubble between iterations adds around 2 ms" (arXiv 2508.02520 sec. 7.1,
      :data:`XDEEPSERVE_BUBBLE_US`) is the device's whole idle gap between two decode iterations, so
      ``scheduler_us`` is that gap less the part the runtime model charges at any graph boundary
      (:meth:`~npusim.system.schema.Runtime.graph_boundary_us` of the recomputed constants, the first
      layer's one attention operator: synchronize, replay enqueue, that op's update, the first task's
      crossing); until session 46 the whole 2 ms, on top of that boundary. 0 elsewhere (not modelled).
    """
    from npusim.system.schema import Runtime

    rows, _ = _calibration_rows()
    triton = rows["triton-ascend-issue-1675"]
    graph = rows["vllm-ascend-pr-15471-graph-timing"]
    eager = _row(triton, "eager torch.add")["measured_us"]
    trip, direct, h2d = _round_trip_parts(rows)
    launch = (h2d["measured_us_min"] + h2d["measured_us_max"]) / 2
    median = trip[len(trip) // 2]
    sync, on_die = sync_us()
    replay = _row(graph, "replay enqueue")
    update = _row(graph, "FIA task update")
    n_attn = update["shape"]["attention_ops"]
    small = hccl_small_allreduce_row()
    device_us = hccl_device_us(small)
    if device_us > small["measured_us"] / 2:
        raise ValueError(f"the 8 KiB hccl_test all-reduce ({small['measured_us']} us) is not host-bound in the model: "
                         f"its simulated device time is {device_us:.2f} us")
    fia = _row(rows["pto-isa-torch-jit-fa-910b2"], "fused-attention host dispatch")
    fia_device = attention_device_us(fia)
    if fia_device > fia["measured_us"] / 2:
        raise ValueError(f"the back-to-back FIA row ({fia['measured_us']} us) is not host-bound in the model: its "
                         f"simulated kernel is {fia_device:.2f} us")
    recomputed = {
        "host_dispatch_us": (eager, "triton-ascend #1675 (910B2)", "eager torch.add host enqueue per op"),
        "attention_dispatch_us": (fia["measured_us"], "pto-isa demos/torch_jit/flash_atten (910B2, aarch64)",
                                  f"{fia['measured_us']:g} us per back-to-back torch_npu FIA call at 128 x 1024: the "
                                  f"host's cadence (the simulated kernel, {fia_device:.2f} us, is hidden under it)"),
        "graph_launch_us": (replay["measured_us"], "vllm-ascend PR #15471",
                            "ACL graph replay enqueue, host wall time per replay"),
        "graph_update_us": (update["measured_us"] / n_attn, "vllm-ascend PR #15471",
                            f"per-step FIA task update {update['measured_us']:g} us over {n_attn} attention ops"),
        "hccl_dispatch_us": (small["measured_us"], "FlagPerf A3 toolkit, hccl_test all_reduce_test",
                             f"{small['measured_us']:g} us per back-to-back 8 KiB all-reduce of 2 A3 dies: the host's "
                             f"cadence (the simulated device time, {device_us:.2f} us, is hidden under it)"),
        "kernel_launch_us": (launch, "FlagPerf A3 toolkit, ascend-dmi H2D latency",
                             f"mean of the H2D latency range {h2d['measured_us_min']:.3f}-{h2d['measured_us_max']:.3f} "
                             f"us; the 910B3 launch+sync round trip (median {median:g} us of {trip}) less it and the "
                             f"host's direct launch call ({direct} us) leaves {median - direct - launch:.1f} us of "
                             "device-side kernel start (an operator's time on the die) and synchronize (sync_us)"),
        "sync_us": (sync, "ascend-rs appendix F (910B3)",
                    f"launch + aclrtSynchronizeStream round trip, median {median:g} us of {trip}, less the direct "
                    f"launch call ({direct} us), kernel_launch_us ({launch:.4f} us) and the kernel on the die "
                    f"(ascend-910b4 start + vector setup, {on_die:.3f} us)"),
    }
    out = []
    presets = [(name, load_system(name, nodes=1).system.runtime) for name in ("atlas-800i-a2", "cloudmatrix384")]
    for preset, rt in [*presets, ("(schema default)", Runtime())]:
        for key, (value, src, method) in recomputed.items():
            out.append(Constant(f"runtime.{key}", preset, getattr(rt, key), value, src, method))
        cited = rt.sources.get("scheduler_us", "")
        boundary = Runtime(**{k: v for k, (v, _, _) in recomputed.items()}).graph_boundary_us(1)
        out.append(Constant("runtime.scheduler_us", preset, rt.scheduler_us,
                            XDEEPSERVE_BUBBLE_US - boundary if "xDeepServe" in cited else 0.0,
                            cited or "none (not modelled)",
                            f"xDeepServe's ~{XDEEPSERVE_BUBBLE_US:g} us bubble between iterations (the device's whole "
                            f"gap) less the graph boundary the model charges in it ({boundary:.4f} us: sync_us + "
                            "graph_launch_us + graph_update_us x 1 + kernel_launch_us), else 0"))
    return out


#: xDeepServe on CloudMatrix384 (arXiv 2508.02520, sec. 7.1, DeepSeek-R1 decode at DP288/EP288): "The
#: scheduling bubble between iterations adds around 2 ms" -- the device's idle gap between two decode
#: iterations (93 ms each), microseconds
XDEEPSERVE_BUBBLE_US = 2000.0


def attention_device_us(row: dict) -> float:
    """The simulated kernel time (us) of a published single-head attention row (``q_len``, ``kv_len``,
    ``head_dim``, fp16, non-causal) on ``ascend-910b``, through the chip's FlashAttention lowering."""
    from npusim.model.ir import Op
    from npusim.system.chipcost import ChipCost

    s = row["shape"]
    op = Op("attention", "attention", dtype="fp16", q_len=s["q_len"], kv_len=s["kv_len"], heads=s.get("heads", 1),
            kv_heads=s.get("heads", 1), head_dim=s["head_dim"], v_head_dim=s["head_dim"], batch=s.get("batch", 1))
    return ChipCost("ascend-910b").op(op).time_us


def sync_us() -> tuple[float, float]:
    """``(runtime.sync_us, the negligible kernel's time on the die)``: the median of the 910B3 launch +
    ``aclrtSynchronizeStream`` round trips of kernels of negligible work (ascend-rs appendix F, calibration
    half) less the host's direct launch call (triton-ascend #1675's optimized C launcher), the task's H2D
    crossing (the mean of ascend-dmi's H2D latency range: ``kernel_launch_us``) and the kernel's time on
    the die (``ascend-910b4``'s stored ``kernel.start_us + kernel.vector_setup_us``: a vector kernel's
    device-side start and its AIV prologue; its few elements' work is negligible). Units: us."""
    trip, direct, h2d = _round_trip_parts(_calibration_rows()[0])
    launch = (h2d["measured_us_min"] + h2d["measured_us_max"]) / 2
    kernel = load_arch("ascend-910b4").kernel
    on_die = (kernel.start_us + kernel.vector_setup_us) if kernel is not None else 0.0
    return trip[len(trip) // 2] - direct - launch - on_die, on_die


def _round_trip_parts(rows: dict) -> tuple[list[float], float, dict]:
    """The launch measurements ``kernel_launch_us`` and ``sync_us`` are taken from (calibration half):
    the 910B3 launch + synchronize round trips (us, sorted; ascend-rs appendix F), the host's direct
    launch call (us; triton-ascend #1675) and ascend-dmi's H2D latency row (FlagPerf A3 toolkit)."""
    trip = sorted(r["measured_us"] for r in rows["ascend-rs-appendix-f"] if "910B3" in r.get("conditions", ""))
    if not trip:
        raise ValueError("published.yaml operators: no ascend-rs-appendix-f 910B3 launch+sync row")
    direct = _row(rows["triton-ascend-issue-1675"], "optimized launcher")["measured_us"]
    return trip, direct, _row(rows["flagrt-flagperf-a3-toolkit"], "H2D latency")


def hccl_small_allreduce_row() -> dict:
    """The calibration half's smallest hccl_test all-reduce (FlagPerf A3 toolkit: 8 KiB, 2 dies)."""
    ops = published()["operators"]
    rows = [r for r in ops["rows"] if r["source"] == "flagrt-flagperf-a3-toolkit" and r["family"] == "collective"
            and "allReduce" in r["op"] and "measured_us" in r]
    if not rows:
        raise ValueError("published.yaml operators: no hccl_test allReduce row with measured_us "
                         "(source flagrt-flagperf-a3-toolkit)")
    return min(rows, key=lambda r: r["measured_us"])


def hccl_device_us(row: dict) -> float:
    """The simulated device time (no runtime costs) of a published HCCL collective row on its
    source's target (its first ``ranks`` dies)."""
    from npusim.system.measure import run_collective
    from npusim.validate.operators import HCCL_OPS, _bytes

    ops = published()["operators"]
    target = {s["id"]: s for s in ops["sources"]}[row["source"]]["target"]
    op = next(v for k, v in HCCL_OPS.items() if k in row["op"])
    ranks = int(row["shape"]["ranks"])
    return run_collective(load_system(target), op, list(range(ranks)), _bytes(row["shape"]["msg_bytes_total"])).time_us


def hccl_constants() -> list[Constant]:
    """Every preset's ``hccl`` section (and the schema's defaults): ``copy_efficiency`` = the mean of
    ascend-dmi's D2D copy bandwidth range per die (FlagPerf A3 toolkit, calibration half), read as
    HBM traffic (a copied byte read and written; the reading that stays under the die's HBM peak),
    over the A3 die's HBM peak; ``buffer_mb`` = HCCL_BUFFSIZE's documented default, checked as
    stored. The Atlas 800I A2 (910B) has no D2D row: it takes the A3 die's efficiency (assumption:
    the same HBM and SDMA generation)."""
    from npusim.arch.derived import summarize
    from npusim.system.schema import Hccl

    rows, _ = _calibration_rows(family="vector")
    d2d = _row(rows["flagrt-flagperf-a3-toolkit"], "D2D")
    a3 = load_system("cloudmatrix384", nodes=1)
    peak = summarize(a3.chip).hbm_bandwidth_gbps
    mean = (d2d["measured_gbps_min"] + d2d["measured_gbps_max"]) / 2
    src = "FlagPerf A3 toolkit summary, ascend-dmi D2D"
    out = []
    for preset, hc in [*((n, load_system(n, nodes=1).system.hccl) for n in ("atlas-800i-a2", "cloudmatrix384")),
                       ("(schema default)", Hccl())]:
        out.append(Constant("hccl.copy_efficiency", preset, hc.copy_efficiency, mean / peak, src,
                            f"mean D2D {mean:.2f} GB/s of HBM traffic / the A3 die's HBM peak {peak:g} GB/s"))
        out.append(Constant("hccl.buffer_mb", preset, hc.buffer_mb, 200.0, "CANN environment variable reference",
                            "HCCL_BUFFSIZE's default, 200 MB"))
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
    "runtime": runtime_constants, "die": die_constants, "hccl": hccl_constants,
}


assert tuple(GROUPS) == CALIBRATION_GROUPS, "npusim.choices.CALIBRATION_GROUPS lists the groups for the CLI"


def calibrate(groups: list[str] | None = None) -> list[Constant]:
    return [c for g in (groups or list(GROUPS)) for c in GROUPS[g]()]
