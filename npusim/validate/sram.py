"""NpuSim A9: PD fusion with per-core SRAM 16/32/48 MB and 12/18/36 pipeline stages (mean E2E
latency), as in ``validation/serving_sram_study.py`` (its docstring explains the setup).

Setup from the public NPU-SIM configurations of this figure (``pd_fuse_{12*3,18*2,36*1}``): one
core per stage, 36 layers of hidden 1280 (GPT-2-large's shape) at A8W8, short prompts (128-512)
and short outputs; weights that do not fit SRAM stream from DRAM (``memory.weights: partial``).
Not published: request count, arrival rate and output length.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.arch import load_arch
from npusim.arch.schema import Arch
from npusim.config import deep_merge, validate
from npusim.errors import NpusimError
from npusim.mapping.mapper import map_model
from npusim.mapping.spec import spec_from_flags
from npusim.model.builder import build_graph
from npusim.serving.requests import synthetic_requests
from npusim.serving.scheduler import SchedulerConfig
from npusim.serving.simulate import ServingConfig, simulate_serving
from npusim.validate.published import study_figure
from npusim.validate.rows import Row


@dataclass(frozen=True)
class SramSetup:
    requests: int = 32
    rate: float = 16.0
    input_len: int | tuple[int, int] = (128, 512)
    output_len: int | tuple[int, int] = 16
    model: str = "gpt2-large"
    precision: str = "a8w8"
    tp: int = 1
    weights: str = "partial"
    srams: tuple[int, ...] = (16, 32, 48)
    stages: tuple[int, ...] = (12, 18, 36)

    def describe(self) -> str:
        return (f"{self.model} {self.precision}, TP {self.tp} per stage, weights {self.weights}; {self.requests} "
                f"requests of {self.input_len} in/{self.output_len} out at {self.rate:g}/s")

    def config(self) -> ServingConfig:
        return ServingConfig(model=self.model, precision=self.precision,
                             scheduler=SchedulerConfig(policy="fusion", budget=512, chunk_tokens=256))


def variant(base: Arch, sram_mb: float) -> Arch:
    data = deep_merge(base.model_dump(), {"cores": {"sram": {"capacity_mb": sram_mb}}})
    return validate(Arch, data, f"{base.name} with {sram_mb:g} MB SRAM per core")


def mapping(stages: int, tp: int, weights: str):
    spec = spec_from_flags(tp=tp, stages=stages, layout="linear_seq").model_copy(update={"data_parallel": 1})
    return spec.model_copy(update={"memory": spec.memory.model_copy(update={"weights": weights})})


def shard_mb(arch: Arch, spec, cfg: ServingConfig) -> tuple[float, float]:
    """Weight MB each core of the fullest stage must hold, and how many stay resident."""
    probe = build_graph(cfg.model, phase="decode", batch=1, seq_len=1, kv_len=2, precision=cfg.precision,
                        layers=cfg.layers)
    mapped = map_model(probe, arch, spec)
    return mapped.weight_bytes_per_core / 2**20, mapped.resident_weight_bytes_per_core / 2**20


def run_cell(arch: Arch, stages: int, setup: SramSetup, reqs) -> dict:
    """One cell: the serving summary with the weight MB per core (or ``error`` if it cannot map)."""
    cfg = setup.config()
    try:
        spec = mapping(stages, setup.tp, setup.weights)
        shard, kept = shard_mb(arch, spec, cfg)
        return {**simulate_serving(arch, spec, reqs, cfg).summary, "shard_mb": shard, "kept_mb": kept}
    except NpusimError as exc:
        return {"error": str(exc)}


def requests(setup: SramSetup):
    return synthetic_requests(setup.requests, setup.rate, input_len=setup.input_len, output_len=setup.output_len,
                              seed=4)


def run(setup: SramSetup = SramSetup()) -> dict[tuple[int, int], dict]:
    base = load_arch("npusim-64c")
    reqs = requests(setup)
    return {(mb, st): run_cell(variant(base, mb), st, setup, reqs) for mb in setup.srams for st in setup.stages}


def rows_from(cells: dict, setup: SramSetup) -> list[Row]:
    e2e = {k: v["e2e_ms"]["mean"] for k, v in cells.items() if "error" not in v and v["e2e_ms"]["mean"] is not None}

    def speedup(slow, fast):
        return e2e[slow] / e2e[fast] if slow in e2e and fast in e2e else None

    note = "PD fusion on npusim-64c, one core per stage; " + setup.describe() + \
        "; request count, rate and output length not published"
    rows = []
    for other in (12, 18):
        f = study_figure(f"A9_16mb_36_vs_{other}")
        rows.append(Row(name=f"A9 16 MB: E2E {other} / 36 stages", source=f["source"], published=tuple(f["published"]),
                        simulated=speedup((16, other), (16, 36)), tolerance=f["tolerance"], relation="range",
                        unit="x", note=note))
    f = study_figure("A9_16_to_32mb")
    for st in setup.stages:
        rows.append(Row(name=f"A9 {st} stages: E2E 16 MB / 32 MB", source=f["source"],
                        published=tuple(f["published"]), simulated=speedup((16, st), (32, st)),
                        tolerance=f["tolerance"], relation="range", unit="x", note=note))
    at48 = {st: v for (mb, st), v in e2e.items() if mb == 48}
    f = study_figure("A9_48mb_best")
    rows.append(Row(name="A9 48 MB: best stage count", source=f["source"], published=f["published"],
                    simulated=f"{min(at48, key=at48.get)} stages" if at48 else None, tolerance=0.0,
                    relation="match", note=note))
    return rows


def sram_rows(quick: bool = False) -> list[Row]:
    setup = SramSetup(requests=12) if quick else SramSetup()
    return rows_from(run(setup), setup)
