"""NpuSim A2 as npusim sees itself: the same serving run at npusim's cheap fidelity (memory and NoC
analytical) and its detailed one (TLM memory, path NoC), memory-bound (Qwen3-4B, weights streamed,
decode-heavy) and compute-bound (Qwen3-0.6B, weights resident, long prompts), on npusim-64c with
128 MB SRAM per core; the first ``layers`` decoder layers only (see
``validation/serving_fidelity_study.py`` for the whole setup and its printed tables).

This compares the project with itself (kind ``self``): the published figures are the NpuSim
study's for *its* two levels (analytical 4.93-11.27x faster than TLM; up to 38.56% error
memory-bound, < 3% compute-bound), a yardstick for npusim's, not an outside measurement.
Wall-time speed-ups depend on the machine and its load.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from npusim.arch import load_arch
from npusim.arch.schema import Arch
from npusim.config import deep_merge, validate
from npusim.mapping.mapper import map_model
from npusim.mapping.spec import spec_from_flags
from npusim.model.builder import build_graph
from npusim.serving.requests import synthetic_requests
from npusim.sim.program import clear_recorded
from npusim.serving.scheduler import SchedulerConfig
from npusim.serving.simulate import ServingConfig, simulate_serving
from npusim.validate.published import study_figure
from npusim.validate.rows import Row

FIDELITIES = {"cheap": ("analytical", "analytical"), "detailed": ("tlm", "path")}
PUB_SPEEDUP = (4.93, 11.27)
PUB_MEM_ERR = 0.3856
PUB_CMP_ERR = 0.03
METRICS = (("TTFT", "ttft_ms"), ("TBT", "tbt_ms"), ("E2E", "e2e_ms"))



def study_arch(sram_mb: float) -> Arch:
    base = load_arch("npusim-64c")
    if sram_mb == base.cores.sram.capacity_mb:
        return base
    data = deep_merge(base.model_dump(), {"name": f"npusim-64c-S{sram_mb:g}",
                                          "cores": {"sram": {"capacity_mb": sram_mb}}})
    return validate(Arch, data, f"npusim-64c with {sram_mb:g} MB SRAM per core")


def run(arch, spec, reqs, model, layers, fidelity, min_wall):
    """One serving run at ``fidelity``; returns (summary, wall seconds, stats of the last run).
    Every attempt starts with no recorded program blocks (:func:`~npusim.sim.program.clear_recorded`):
    a repeated or later run would otherwise replay the lowering an earlier one recorded, so the
    fidelity timed second, or a short run repeated up to ``min_wall``, skipped the mapper's work
    (session 49 measured 47,883x and 0.89x so; session 50, each run lowering afresh, 19,074x and 12x)."""
    memory, noc = FIDELITIES[fidelity]
    cfg = ServingConfig(model=model, layers=layers, memory_mode=memory, noc_mode=noc,
                        scheduler=SchedulerConfig(policy="continuous", chunk_tokens=0))
    best, spent = math.inf, 0.0
    while True:
        clear_recorded()
        t0 = time.perf_counter()
        out = simulate_serving(arch, spec, reqs, cfg)
        wall = time.perf_counter() - t0
        best, spent = min(best, wall), spent + wall
        if spent >= min_wall:
            break
    sim, s = out.sim, out.summary
    busy = sim.busy_cycles()
    used = busy.sum(axis=1) > 0
    span = max(1, sim.now)
    frac = {u: float(busy[used, i].mean() / span) for i, u in enumerate(sim.units)}
    frac["dma"] = max(v for k, v in frac.items() if k.startswith("dma"))
    mem = sim.mem
    nreq = int(mem.ch_nreq.sum())
    stats = {"busy": frac, "hbm_bytes": float(mem.ch_bytes.sum()),
             "lat_ns": float(mem.ch_lat_sum.sum() / nreq / 1000.0) if memory == "tlm" and nreq else None,
             "checks": sim.memory_checks() if memory == "tlm" else None}
    return s, best, stats


def sram_per_core_mb(arch, spec, model, layers, reqs, kv_bytes_per_token):
    """(resident weights, peak KV cache) per core of the TP group, MB: every request's whole
    context held at once (all arrive together), split over the group. The serving KV manager
    budgets the SRAM of every core of the chip even when the mapping uses only one TP group,
    so an over-full SRAM would go unnoticed without this check."""
    probe = build_graph(model, phase="decode", batch=1, seq_len=1, kv_len=2, precision="bf16", layers=layers)
    mapped = map_model(probe, arch, spec)
    weights = mapped.weight_bytes_per_core if mapped.weights_resident else 0
    kv = kv_bytes_per_token * sum(r.input_len + r.output_len for r in reqs) / spec.tensor_parallel.degree
    return weights / 2**20, kv / 2**20


def err(cheap, detailed):
    if cheap is None or detailed is None or detailed == 0:
        return None
    return abs(cheap - detailed) / detailed



@dataclass(frozen=True)
class FidelitySetup:
    layers: int = 2
    tp: int = 4
    sram_mb: float = 128.0
    rate: float = math.inf
    mem_model: str = "qwen3-4b"
    mem_requests: int = 8
    mem_input: int = 32
    mem_output: int = 24
    cmp_model: str = "qwen3-0.6b"
    cmp_requests: int = 12
    cmp_input: int = 1024
    cmp_output: int = 2
    min_wall: float = 2.0

    def cases(self):
        """(name, model, requests, weights must be resident)."""
        return (("memory-bound", self.mem_model, synthetic_requests(
                    self.mem_requests, self.rate, input_len=self.mem_input, output_len=self.mem_output, seed=1), False),
                ("compute-bound", self.cmp_model, synthetic_requests(
                    self.cmp_requests, self.rate, input_len=self.cmp_input, output_len=self.cmp_output, seed=2), True))


def warm_up(arch) -> None:
    """Compile (or load) the Numba kernels at both fidelities on a tiny model (not timed)."""
    tiny = synthetic_requests(1, math.inf, input_len=16, output_len=2, seed=0)
    tiny_spec = spec_from_flags(tp=4, stages=1).model_copy(update={"data_parallel": 1})
    for fidelity in FIDELITIES:
        run(arch, tiny_spec, tiny, "gpt2", 1, fidelity, 0.0)


def fidelity_rows(quick: bool = False) -> list[Row]:
    s = FidelitySetup()
    arch = study_arch(s.sram_mb)
    spec = spec_from_flags(tp=s.tp, stages=1).model_copy(update={"data_parallel": 1})
    warm_up(arch)
    rows = []
    speed = {}
    for name, model, reqs, _ in s.cases():
        res = {f: run(arch, spec, reqs, model, s.layers, f, s.min_wall) for f in FIDELITIES}
        (sc, wc, _), (sd, wd, _) = res["cheap"], res["detailed"]
        speed[name] = wd / wc
        errs = [e for e in (err(sc[k]["mean"], sd[k]["mean"]) for _, k in METRICS) if e is not None]
        key = "A2_error_memory_bound" if name == "memory-bound" else "A2_error_compute_bound"
        f = study_figure(key)
        rows.append(Row(name=f"A2 {name}: worst TTFT/TBT/E2E error", source="npusim analytical vs npusim TLM+path; "
                        f"yardstick {f['source']}", published=f["published"], simulated=max(errs) if errs else None,
                        tolerance=f["tolerance"], relation=f["relation"], kind="self",
                        note=f"the project compared with itself: {model}, first {s.layers} layers, npusim-64c with "
                             f"{s.sram_mb:g} MB SRAM/core, TP {s.tp}"))
    f = study_figure("A2_speedup")
    for name, v in speed.items():
        lo, hi = f["published"]
        rows.append(Row(name=f"A2 {name}: cheap/detailed wall-time speed-up", source="npusim analytical vs npusim "
                        f"TLM+path; yardstick {f['source']}", published=float(lo), simulated=v,
                        tolerance=f["tolerance"], relation="ge", unit="x", kind="timing",
                        note=f"the project compared with itself: at least the yardstick's low end (its range "
                             f"{lo:g}-{hi:g}x is for NpuSim's own levels; a cheaper level is no miss); both runs "
                             f"lower their programs from scratch; wall times depend on the machine and its load"))
    return rows
