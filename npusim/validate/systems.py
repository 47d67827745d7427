"""Rows of the multi-NPU system model: CloudMatrix384 Table 1 (calibration), MoE dispatch/combine
operators (one calibration row per op, the rest held out), the normal (prefill) kernels' published
times beside npusim's prefill operator (fitted) and the DeepSeek-V3/R1 deployments.

Each row is simulated here (``npusim.system``); ``published.yaml`` holds the figures.
"""

from __future__ import annotations

from npusim.mapping.spec import MAPPER_DIR, load_deployment
from npusim.system.load import load_system
from npusim.system.measure import point_to_point, run_moe
from npusim.system.moe_step import simulate_step
from npusim.validate.published import published
from npusim.validate.rows import Row

TABLE1_TOLERANCE = 0.10   # Table 1 prints 2-3 significant digits (e.g. 1.2 us, 137 GB/s)
MOE_TOLERANCE = 0.25      # the CloudMatrix384 operator rows are read through secondary sources
DEEPSEEK_TOLERANCE = 0.10  # the reports print 3-4 significant digits; the model is partial (cap 10%)


def table1_rows(quick: bool = False) -> list[Row]:
    """Every cell of CloudMatrix384 Table 1 (flow fabric model): bandwidth with a 256 MiB transfer,
    latency with a 512 B one; intra-node npu0.die0 -> npu1.die0 / cpu0, inter-node -> npu8.die0 /
    cpu4. The preset was calibrated on these cells except the inter-node NPU-CPU ones (held out)."""
    pub = published()["cloudmatrix384_table1"]
    loaded = load_system("cloudmatrix384", nodes=2)
    rows = []
    for r in pub["rows"]:
        target = {"npu-npu": ("npu1.die0", "npu8.die0"), "npu-cpu": ("cpu0", "cpu4")}[r["pair"]]
        for where, dst in zip(("intra", "inter"), target):
            held_out = r["pair"] == "npu-cpu" and where == "inter"
            bw = point_to_point(loaded, "npu0.die0", dst, r["op"], 256 << 20).bandwidth_gbps
            lat = point_to_point(loaded, "npu0.die0", dst, r["op"], 512).latency_us
            for qty, value, sim, unit in (("bandwidth", r[f"{where}_gbps"], bw, " GB/s"),
                                          ("latency 512 B", r[f"{where}_us"], lat, " us")):
                rows.append(Row(
                    name=f"CM384 {r['pair']} {r['op']} {where}-node {qty}", source=pub["source"],
                    published=float(value), simulated=float(sim), tolerance=TABLE1_TOLERANCE, unit=unit,
                    kind="outside" if held_out else "calibration",
                    note="held out" if held_out else "the preset's fabric parameters were derived from this cell"))
    return rows


def moe_rows(quick: bool = False) -> list[Row]:
    """Dispatch/combine on each entry's system, its tokens per rank (default 128), hidden 7168,
    top-8 of 256 experts, INT8 dispatch, uniform routing, AIV-direct writes, the system's decode
    kernels' copies: the preset's per-op overhead + the fabric."""
    rows, cache, systems = [], {}, {}
    for entry in published()["moe_operators"]:
        loaded = systems.setdefault(entry["system"], load_system(entry["system"]))
        tokens = entry.get("tokens_per_rank", 128)
        for r in entry["rows"]:
            key = (entry["system"], r["op"], r["ep"], tokens)
            if key not in cache:
                cache[key] = run_moe(loaded, r["op"], r["ep"], tokens, 8, 7168, 256, "uniform", "int8", "flow",
                                     "aiv").time_us
            calib = r.get("role") == "calibration"
            rows.append(Row(
                name=f"MoE {r['op']} EP{r['ep']} {tokens} tok/rank {entry['system']}",
                source=f"{entry['source']} [{entry['confidence']}]",
                published=float(r["latency_us"]), simulated=float(cache[key]), tolerance=MOE_TOLERANCE, unit=" us",
                kind="calibration" if calib else "outside",
                note="the operator overhead was calibrated on this row" if calib else ""))
    return rows


#: the EP of the CloudMatrix384 prefill deployment (mappers/cm384-deepseek-prefill.yaml): --quick's row
NORMAL_QUICK_EP = 32


def normal_kernel_time_us(entry: dict, row: dict) -> float:
    """The per-call time of one row of a published normal-kernel table (``moe_normal_kernels`` in
    published.yaml), which gives a bandwidth: the printing script's bytes over the call's time, with
    DeepEP-Ascend's test_intranode.py convention -- the rows a rank received, one per (token,
    selected expert) it holds, its own tokens included (``tokens_per_rank x top_k`` on average under
    uniform routing, at any EP), times ``hidden`` in BF16 bytes for dispatch and combine alike."""
    gbps = row.get("gbps")
    if isinstance(gbps, bool) or not isinstance(gbps, (int, float)) or gbps <= 0:
        raise ValueError(f"published.yaml moe_normal_kernels {entry.get('system')} {row.get('op')} EP{row.get('ep')}: "
                         f"gbps must be a positive number, got {gbps!r}")
    nbytes = entry["tokens_per_rank"] * entry["top_k"] * entry["hidden"] * 2
    return nbytes / (gbps * 1e3)  # B / (GB/s) = ns; / 1e3 = us


def normal_kernel_rows(quick: bool = False) -> list[Row]:
    """The normal (prefill) kernels' published per-call times (``moe_normal_kernels``: one token
    count per EP, bandwidth-bound) beside npusim's prefill operator at the same setting: the
    standalone dispatch/combine with the system's prefill copies and the per-call overheads a
    prefill step charges (the decode kernels'; none is calibrated on these figures), AIV-direct
    writes. ``fitted``: the figures were seen while modelling prefill's operators. --quick: the
    CloudMatrix384 prefill deployment's EP only."""
    rows, cache, systems = [], {}, {}
    for entry in published()["moe_normal_kernels"]:
        loaded = systems.setdefault(entry["system"], load_system(entry["system"]))
        copies = loaded.system.moe_operators.prefill_copies
        tokens = entry["tokens_per_rank"]
        for r in entry["rows"]:
            if quick and r["ep"] != NORMAL_QUICK_EP:
                continue
            key = (entry["system"], r["op"], r["ep"])
            if key not in cache:
                cache[key] = run_moe(loaded, r["op"], r["ep"], tokens, entry["top_k"], entry["hidden"],
                                     entry["experts"], "uniform", entry["dispatch_dtype"], "flow", "aiv",
                                     copies=copies).time_us
            rows.append(Row(
                name=f"MoE normal {r['op']} EP{r['ep']} {tokens} tok/rank {entry['system']}",
                source=f"{entry['source']} [{entry['confidence']}]",
                published=normal_kernel_time_us(entry, r), simulated=float(cache[key]), tolerance=MOE_TOLERANCE,
                unit=" us", kind="fitted" if entry.get("fitted") else "outside",
                note=f"npusim's prefill operator ({copies} copies, the decode kernels' per-call overhead); the "
                     "figure is bandwidth-bound at one token count, so no fixed cost is calibrated on it"))
    return rows


def deepseek_rows(quick: bool = False) -> list[Row]:
    """DeepSeek-V3/R1 decode and prefill steps on Atlas 800I A2 and CloudMatrix384 (the presets'
    parameters, no per-deployment factor; rows with ``role: calibration`` are the figures a preset
    parameter was calibrated on)."""
    rows, systems = [], {}
    for r in published()["deepseek_deployments"]:
        loaded = systems.setdefault(r["system"], load_system(r["system"]))
        dep = load_deployment(MAPPER_DIR / r["mapping"])
        res = simulate_step(loaded, dep, batch=r.get("batch"), kv=r.get("kv", 4096),
                            batch_tokens=r.get("batch_tokens"), seq=r.get("seq", 4096), mtp=r.get("mtp"),
                            mtp_acceptance=r.get("mtp_acceptance"), eplb=r.get("eplb"), kv_min=r.get("kv_min"))
        metric = {"tpot_ms": "TPOT", "tokens_per_s_per_npu": "tok/s/NPU", "kv_gb_per_die": "KV GB/die",
                  "dispatch_us_per_call": "dispatch per call", "combine_us_per_call": "combine per call",
                  "dispatch_combine_us_per_call": "per layer"
                  }.get(r["metric"], r["metric"])
        unit = " us" if r["metric"].endswith("_us_per_call") else {"tpot_ms": " ms", "kv_gb_per_die": " GB"}.get(
            r["metric"], "")
        kind = "calibration" if r.get("role") == "calibration" else "fitted" if r.get("fitted") else "outside"
        rows.append(Row(name=f"DeepSeek {r['name']} {metric}", source=f"{r['source']} [{r['confidence']}]",
                        published=float(r["published"]), simulated=float(res.metric(r["metric"])),
                        tolerance=DEEPSEEK_TOLERANCE, unit=unit, kind=kind, note=res.note.split(";")[0],
                        baseline=_roofline_metric(loaded, res, r["metric"]) if kind == "outside" else None))
    return rows


def _roofline_metric(loaded, res, metric: str) -> float | None:
    """``metric`` of a DeepSeek step timed by a roofline of the same work (each die's share of the
    model's FLOPs at peak or of its weight and KV bytes at the HBM's bandwidth, whichever is
    longer); None for metrics a roofline does not give."""
    from npusim.system.mapper import StepShape
    from npusim.system.plan import ParallelPlan
    from npusim.validate.plans import roofline_ms

    meta = res.workload.meta
    if metric not in ("tpot_ms", "tokens_per_s_per_npu"):
        return None
    plan = ParallelPlan(**{k: v for k, v in meta["plan"].items() if k in ParallelPlan.__dataclass_fields__})
    step = roofline_ms(loaded, "deepseek-r1", plan, StepShape(meta["phase"], meta["batch"], meta["seq_len"],
                                                              meta["kv_len"]))
    if metric == "tpot_ms":
        return step / meta["tokens_per_sequence"]
    return meta["tokens"] / plan.npus / (step / 1e3)
