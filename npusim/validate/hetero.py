"""NpuSim A8: heterogeneous decode cores under PD disaggregation 42:21 (P:D cores 2:1), Qwen3-4B
bf16, a decode-heavy load (64 in / 256 out tokens); the decode cores' DRAM bandwidth and array
varied on ``chips.hetero_chip``. Area: ``npusim.serving.area.core_area_mm2`` per core (LLMCompass
7 nm figures) plus DRAM PHY area in proportion to bandwidth (an HBM2e stack's 10.45 mm^2 per
409.6 GB/s; an estimate).

The decode cores' DRAM is reached off the mesh (``ServingConfig(memory_over_noc=False)``), as in
the study's simulator: NPU-SIM's behavioural per-core DRAM (its default, ``--beha_dram true``) is a
wait of ``bytes / (0.7 x 15 x dram_bw / 8)`` ns inside the core's own load path
(``llm/src/utils/memory_utils.cpp``, NPU-SIM 290debf), with no NoC hop. With the channel at the
core's router over the mesh (npusim's default), every DRAM response enters the core through its
ejection port, one 64 B flit a cycle on npusim-64c (64 GB/s at 1 GHz), so a core could not stream
more than ~64 GB/s whatever its channel: before this setting (issue 42 item 5, session 47) decode
at 240 GB/s gave x1.07 over 60 GB/s (64/60), not the study's x2.28; a one-core M = 8 GEMV of 50 MB
read 52.9 GB/s at 60 and 60.2 GB/s at 240. A8's rows were judged before and after this change, so
they are labelled fitted. ``validation/npu_sim_a8.py`` lays the rows beside NPU-SIM's own results.

What the published x2.28 and x1.9 are (found in the study's artefact, NPU-SIM 290debf's
``plot/pdhete``: the authors' results of ``llm/test/gpt2_small/pd_split/pd_split_42_21_100_100.json``
on the chips ``llm/test/gpt2_small/pd_split_hete/*.json``): the figure's baseline file stores all
tokens over the makespan (907 tok/s), every variant's file all tokens over the mean request latency
(2080 tok/s at 240 GB/s); their ratio is the published x2.28. Like for like, NPU-SIM's own runs give
x1.34 for 60 -> 240 GB/s and x0.75 for 64x64 -> 32x32 at 240 GB/s; npusim with the artefact's load
(200 requests of 100 in / 100 out at once, this runner otherwise) gives x1.26 and x0.31 (its decode
batches grow to ~200 requests, where a 32x32 array is compute-bound; NPU-SIM batches at most 5 a
decode pipeline). The rows keep the published figures; the artefact's workload, model (28 GPT-2-style
blocks of hidden 1280, TP 1) and decode batch differ from this runner's (Qwen3-4B, TP 3 / 6).

Known from the study: per-core DRAM from 60 GB/s, decode cores at 60/120/240/480 GB/s with 64x64
or 32x32 arrays, P:D 2:1, 7 nm area. Not published: the workload, request count and rate, the
instances' stage split (the 7:7 of the public NPU-SIM configurations is used, as in A7).

Why the 32x32 rows miss (found, not fixed: it is the array's physics as npusim models it, checked
cycle for cycle against SCALE-Sim): a weight-stationary array shifts in one row of a weight tile
per cycle (T_inj = rows), so with double-buffered tiles a 64x64 bf16 array takes in at most
64 x 64 x 2 B / 64 cycles = 128 B/cycle (128 GB/s at 1 GHz) of weights and a 32x32 one 64 GB/s.
Decode reads every weight once per iteration, so at 240 GB/s the 64x64 decode cores are bound by
that ingest rate, not by DRAM (which is also why 480 GB/s adds nothing, as published), and
halving the array's edge halves decode throughput. The study's artefact shows the same halving:
the authors' own NPU-SIM results (``plot/pdhete/{2,3}_analysis_results.json``: decode cores
``exu`` 64x64 vs 32x32, both ``dram_bw`` 128 = 240 GB/s, 200 requests of 100/100 at once) have
the fastest token gap 26.8 -> 51.9 ms (x1.93) and throughput 2080 -> 1567 tok/s (x0.75, not
within 5%): the published < 5% and x1.9 per area are not that pairing in the artefact's results
(x1.9 per area is its 32x32 at 120 GB/s against the 64x64-at-60 base, 1.90 with
``draw_single.py``'s areas), and the throughput loss is smaller than the token gap's because the
artefact's makespan includes the 200 prompts' prefill.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.arch.derived import channel_bandwidths_gbps
from npusim.mapping.spec import spec_from_flags
from npusim.serving.area import core_area_mm2
from npusim.serving.requests import synthetic_requests
from npusim.serving.scheduler import SchedulerConfig
from npusim.serving.simulate import ServingConfig, simulate_serving
from npusim.validate.chips import hetero_chip
from npusim.validate.published import study_figure
from npusim.validate.rows import Row

PHY_MM2_PER_GBPS = 10.45 / 409.6
VARIANTS = ((60, 64), (240, 64), (480, 64), (240, 32))


@dataclass(frozen=True)
class HeteroSetup:
    requests: int = 24
    rate: float = 40.0
    input_len: int = 64
    output_len: int = 256
    pd_stages: tuple[int, int] | None = (7, 7)
    #: the per-core DRAM off the mesh, as NPU-SIM's behavioural DRAM (module docstring)
    memory_over_noc: bool = False

    def describe(self) -> str:
        st = "auto" if self.pd_stages is None else "{}:{}".format(*self.pd_stages)
        mem = "DRAM over the mesh" if self.memory_over_noc else "DRAM off the mesh"
        return (f"{self.requests} requests of {self.input_len} in/{self.output_len} out at {self.rate:g}/s, "
                f"PD stages {st}, {mem}")


def area_mm2(arch) -> float:
    cores = sum(core_area_mm2(arch.systolic_for(c).rows, arch.systolic_for(c).cols, arch.sram_for(c).capacity_mb,
                              arch.cores.vector_unit.lanes)["total_mm2"] for c in range(arch.num_cores))
    return cores + PHY_MM2_PER_GBPS * float(channel_bandwidths_gbps(arch).sum())


def run(setup: HeteroSetup = HeteroSetup(), variants=VARIANTS) -> dict[tuple[int, int], dict]:
    """Per (decode GB/s, decode array): the serving summary with the chip's area."""
    reqs = synthetic_requests(setup.requests, setup.rate, input_len=setup.input_len, output_len=setup.output_len,
                              seed=3)
    spec = spec_from_flags(tp=4, stages=1).model_copy(update={"data_parallel": 1})
    if setup.pd_stages:
        spec = spec.model_copy(update={"serving": spec.serving.model_copy(update={"pd_stages": setup.pd_stages})})
    cfg = ServingConfig(model="qwen3-4b", scheduler=SchedulerConfig(policy="continuous", chunk_tokens=256),
                        memory_over_noc=setup.memory_over_noc)
    out = {}
    for bw, array in variants:
        arch = hetero_chip(bw, array)
        s = simulate_serving(arch, spec, reqs, cfg, pd=(42, 21)).summary
        out[(bw, array)] = {**s, "area_mm2": area_mm2(arch)}
    return out


def rows_from(res: dict, setup: HeteroSetup) -> list[Row]:
    def tput(v, per_area=False):
        return res[v]["throughput_tokens_per_s"] / (res[v]["area_mm2"] if per_area else 1.0)

    note = ("Qwen3-4B, PD 42:21 on npusim-64c with per-core 60 GB/s DRAM, decode cores varied; "
            + setup.describe() + "; the study's workload and rate are not published")
    ingest = ("; cause: a WS array ingests one weight row per cycle, <= 128 GB/s (64x64) or 64 GB/s (32x32) "
              "of bf16 weights, so decode at 240 GB/s is array-ingest-bound (see npusim/validate/hetero.py)")
    def naive(a, b, per_area=False):
        """Decode as a bandwidth roofline (weights and KV streamed at the decode cores' DRAM
        bandwidth): throughput in proportion to it, the array size irrelevant."""
        return a[0] / b[0] * ((res[b]["area_mm2"] / res[a]["area_mm2"]) if per_area else 1.0)

    rows = []
    for key, label, a, b, per_area in (
            ("A8_bw_60_240", "decode DRAM 60->240 GB/s tok/s", (240, 64), (60, 64), False),
            ("A8_bw_60_240_area", "decode DRAM 60->240 GB/s tok/s/mm2", (240, 64), (60, 64), True),
            ("A8_bw_240_480", "decode DRAM 240->480 GB/s tok/s", (480, 64), (240, 64), False),
            ("A8_array_64_32", "decode array 64->32 tok/s", (240, 32), (240, 64), False),
            ("A8_array_64_32_area", "decode array 64->32 tok/s/mm2", (240, 32), (240, 64), True)):
        f = study_figure(key)
        rows.append(Row(name=f"A8 {label}", source=f["source"], published=f["published"],
                        simulated=tput(a, per_area) / tput(b, per_area), tolerance=f["tolerance"],
                        relation=f["relation"], unit="x", kind="fitted" if f.get("fitted") else "outside",
                        baseline=naive(a, b, per_area),
                        note=note + (ingest if "array" in key or "480" in key else "")
                             + "; naive: throughput in proportion to the decode cores' DRAM bandwidth (per area: "
                               "over the chip's area)"))
    return rows


def hetero_rows(quick: bool = False) -> list[Row]:
    setup = HeteroSetup(requests=8, output_len=128) if quick else HeteroSetup()
    return rows_from(run(setup), setup)
