"""The Ascend die's operator-level constants, recomputed from the calibration half of the measured
operator rows (``published.yaml`` ``operators``; issue 39 item 2).

Every constant of an Ascend preset's ``kernel`` section (:class:`npusim.arch.schema.KernelCosts`)
and the L2's per-core read rate is derived here from rows of sources in the ``calibration`` half
only, the same way ``npusim calibrate --check`` recomputes it (:func:`die_constants`):

* ``kernel.start_us`` -- the device-side start of a kernel: the median, over the isolated-replay
  rows of the msModeling micro-benchmark gap report that give both the kernel's duration and its
  cores' busy time (``aicore_time`` / ``aiv_time`` in the row's conditions), of duration - core
  time (msprof's task duration runs from the task's start on the device to its end; the core
  time is the cores' own execution). Cross-check: CATLASS's CommonMatmul notes put a MIX kernel's
  extra AIV start at 1-5 us;
* ``kernel.cube_setup_us`` -- the same report's MatMulV2 row (6 x 512 x 4096 BF16, a core time of
  5.406 us for a GEMM whose data take ~2.6 us at HBM rate): its core time - the simulated time of
  the GEMM with no start and no setup;
* ``kernel.vector_instruction_cycles`` and ``kernel.vector_cycles_per_repeat``: the vendor's Add
  sample on an Atlas A2 (asc-devkit ``add_high_performance``, half 8192 x 8192 over 48 AIVs): the
  vector pipe's time (msprof ``aiv_vec_time``) of the two cases that differ only in the elements
  per Add instruction (4096 / 16384) gives each instruction's start and the cycles per 256-byte
  repeat (:func:`vector_pipe_constants`; the model is :mod:`npusim.hw.compute.vector_kernel`);
* ``kernel.vector_setup_us``: the micro-benchmark report's AscendQuantV2 row (9 x 2048: almost no
  work, so mostly setup): its core time - its simulated time with no start and no setup, every op
  timed from its reference kernel's instructions at the two constants above, over the share of the
  full-die prologue its launch pays (:func:`npusim.hw.compute.vector_kernel.setup_share`: 1, since
  AscendQuantV2's tiling launches every AIV of the die, ``vector_kernel.FULL_DIE_LAUNCH``): so
  ``vector_setup_us`` is the prologue of a kernel that launches every AIV (session 46; until then it
  was charged to every vector kernel, one row or many). The report's DynamicQuant (1030 x 2304) and
  RmsNorm (515 x 1536) rows, 47-48 AIVs launched, are left as checks;
* ``l2.core_bytes_per_cycle`` -- one core's read rate from global memory (the L2; HBM reads already
  go at the DMA engines' 64 B/cycle): the two published candidates, 110 (the vendor's platform file
  Ascend910B2C.ini, ``l2_read_rate``) and 64 (CANN's GEMM tiling cycle model,
  ``cache_tiling_cycle_model.cc``, ``l0c2out::kHbmBandwidth``), each with its own cube setup, are
  run on every GEMM row of the calibration half; the one with the smaller median |error| is kept.

Constants that are cited, not derived (the L1 -> L0A / L0B rates 256 / 128 B/cycle, the MTE1
start of 26 cycles: CANN's cycle model; the UB of 192 KB per AIV: CATLASS ``arch.hpp``) are in the
preset with their source. Nothing here reads a row of the validation half.
"""

from __future__ import annotations

import re
import statistics

from npusim.arch import load_arch
from npusim.arch.schema import Arch
from npusim.config import validate
from npusim.validate.published import published

MICROBENCH = "msmodeling-fork-microbench-gap"
DIE = "ascend-910c-die"  # the micro-benchmark report's hardware (an Atlas 800 A3 die)
LOAD_RATES = {110.0: "Ascend910B2C.ini [AICoreMemoryRates] l2_read_rate",
              64.0: "CANN cache_tiling_cycle_model.cc l0c2out::kHbmBandwidth"}
_CORE_TIME = re.compile(r"(aicore|aiv)_time (?:only )?([\d.]+)")


def _section() -> tuple[dict, list[dict]]:
    sec = published()["operators"]
    return {s["id"]: s for s in sec["sources"]}, sec["rows"]


def core_time_rows() -> list[dict]:
    """Calibration-half micro-benchmark rows with a duration and a core time: dicts with the row,
    ``duration_us`` and ``core_us``."""
    return [{"row": r, "duration_us": float(r["measured_us"]), "core_us": float(m.group(2))}
            for r, m in _calibration_matches(MICROBENCH, _CORE_TIME) if "measured_us" in r]


def _calibration_matches(source: str, pattern) -> list[tuple[dict, re.Match]]:
    """``source``'s rows whose conditions match ``pattern``, with the match; the source must be in
    the calibration half."""
    sources, rows = _section()
    if sources[source]["half"] != "calibration":
        raise ValueError(f"published.yaml operators: source {source} is no longer in the calibration half")
    out = []
    for r in rows:
        m = pattern.search(str(r.get("conditions", "")))
        if r["source"] == source and m:
            out.append((r, m))
    return out


def _row(op: str) -> dict:
    for x in core_time_rows():
        if str(x["row"]["op"]) == op:
            return x
    raise ValueError(f"published.yaml operators: no {MICROBENCH} row for {op}")


def kernel_start_us() -> float:
    """Median of duration - core time over :func:`core_time_rows`."""
    return statistics.median(x["duration_us"] - x["core_us"] for x in core_time_rows())


def _variant(arch: Arch, kernel: dict | None = None, l2_rate: float | None = None) -> Arch:
    data = arch.model_dump(mode="json")
    if kernel is not None:
        data["kernel"] = {**(data.get("kernel") or {}), **kernel}
    if l2_rate is not None:
        data["l2"]["core_bytes_per_cycle"] = l2_rate
    return validate(Arch, data, f"{arch.name} (calibration variant)")


def _cost(arch: Arch):
    from npusim.system.chipcost import ChipCost

    return ChipCost(arch, persist=False)


def _bare(arch: Arch) -> dict:
    """The kernel section with no start and no setup (what the simulator does without them)."""
    return {"start_us": 0.0, "cube_setup_us": 0.0, "vector_setup_us": 0.0}


def cube_setup_us(arch: Arch | None = None, l2_rate: float | None = None) -> float:
    """MatMulV2's core time - its simulated time with no start and no setup."""
    arch = arch or load_arch(DIE)
    x = _row("MatMulV2")
    s = x["row"]["shape"]
    from npusim.validate.operators import _dtype

    sim = _cost(_variant(arch, _bare(arch), l2_rate)).gemm(s["m"], s["k"], s["n"], _dtype(x["row"]["dtype"])).time_us
    return x["core_us"] - sim


def _vector_us(arch: Arch, op: str, kernel: dict) -> float:
    """The micro-benchmark row ``op``'s simulated time with no start and no setup, at the vector
    kernel constants ``kernel`` (``vector_cycles_per_repeat``, ``vector_instruction_cycles``)."""
    from npusim.model.ir import Op
    from npusim.validate.operators import VECTOR_OPS

    x = _row(op)
    tensor = x["row"]["shape"]["tensor"]
    op_class, fn = next(v for k, v in VECTOR_OPS.items() if op.startswith(k))
    var = _variant(arch, {**_bare(arch), **kernel})
    o = Op(op, "vector", dtype="bf16", elements=int(tensor[0]) * int(tensor[1]), op_class=op_class, fn=fn,
           row_len=int(tensor[1]))
    return _cost(var).vector(o, absorb_writes=True).time_us  # run alone, as the operator runner runs the row


ADD_SAMPLE = "asc-devkit-add-high-performance-a2"
_VEC_TIME = re.compile(r"dataCopyLen (\d+) elements per instruction; no double buffer.*aiv_vec_time\s+([\d.]+)", re.S)


def add_sample_rows() -> list[dict]:
    """The vendor Add sample's cases that differ only in the elements per instruction (no double
    buffer, default UB layout, L2 on): dicts with ``elements`` (per instruction), ``vec_us``
    (aiv_vec_time) and ``tensor``."""
    out = [{"elements": int(m.group(1)), "vec_us": float(m.group(2)), "tensor": r["shape"]["tensor"]}
           for r, m in _calibration_matches(ADD_SAMPLE, _VEC_TIME)]
    if len({x["elements"] for x in out}) < 2:
        raise ValueError(f"published.yaml operators: {ADD_SAMPLE} needs two cases at different dataCopyLen")
    return out


def vector_pipe_constants(arch: Arch | None = None) -> tuple[float, float]:
    """``(vector_instruction_cycles, vector_cycles_per_repeat)`` from the Add sample's vector-pipe
    time (aiv_vec_time) at two instruction sizes: each AIV runs ``elements / dataCopyLen`` fp16 Add
    instructions (:func:`npusim.hw.compute.vector_kernel.aiv_tile_cycles`, linear in both constants),
    so two cases give both (least squares over the cases, exact for two)."""
    import numpy as np

    from npusim.hw.compute.vector_kernel import aiv_tile_cycles

    arch = arch or load_arch("ascend-910b")
    aivs = arch.num_cores * (arch.kernel.vector_cores_per_core if arch.kernel else 1)
    a, y = [], []
    for x in add_sample_rows():
        per_aiv = x["tensor"][0] * x["tensor"][1] / aivs
        tiles = per_aiv / x["elements"]
        one = dict(rows=1, row_len=x["elements"], dtype="fp16")
        starts = aiv_tile_cycles("elementwise", None, cycles_per_repeat=0.0, instruction_cycles=1.0, **one)
        repeats = aiv_tile_cycles("elementwise", None, cycles_per_repeat=1.0, instruction_cycles=0.0, **one)
        a.append([tiles * starts, tiles * repeats])
        y.append(x["vec_us"] * 1e3 * arch.clock_ghz)
    (instr, per_repeat), *_ = np.linalg.lstsq(np.array(a), np.array(y), rcond=None)
    return float(instr), float(per_repeat)


def vector_costs(arch: Arch | None = None) -> dict:
    """``vector_instruction_cycles`` and ``vector_cycles_per_repeat`` (:func:`vector_pipe_constants`,
    the vendor Add sample on an Atlas A2), then ``vector_setup_us``: the micro-benchmark report's
    AscendQuantV2 (9 x 2048, almost no work) core time - its simulated time with no start and no
    setup, timed from its reference kernel's instructions at those constants. The report's
    DynamicQuant and RmsNorm rows are not used: they check the model."""
    from npusim.hw.compute.vector_kernel import launched_aivs, setup_share
    from npusim.validate.operators import VECTOR_OPS

    instr, per_repeat = vector_pipe_constants()
    arch = arch or load_arch(DIE)
    k = {"vector_cycles_per_repeat": per_repeat, "vector_instruction_cycles": instr}
    x = _row("AscendQuantV2")
    op_class, fn = VECTOR_OPS["AscendQuantV2"]
    aivs = arch.num_cores * arch.kernel.vector_cores_per_core
    share = setup_share(launched_aivs(op_class, fn, int(x["row"]["shape"]["tensor"][0]), aivs), aivs,
                        arch.kernel.mix_start_us, arch.kernel.mix_start_core_us)
    setup = (x["core_us"] - _vector_us(arch, "AscendQuantV2", k)) / share
    return {"vector_setup_us": setup, "vector_cycles_per_repeat": per_repeat, "vector_instruction_cycles": instr}


def calibration_gemm_errors(l2_rate: float, start: float | None = None,
                            families: tuple[str, ...] = ("gemm",)) -> list[float]:
    """Errors of every row of ``families`` (``gemm``, ``attention``) of the calibration half on the
    presets with the L2 per-core rate ``l2_rate`` and the cube setup derived at that rate (start:
    ``kernel_start_us()``)."""
    from npusim.validate.operators import _fastest, _Runner, _target

    start = kernel_start_us() if start is None else start
    setup = cube_setup_us(load_arch(DIE), l2_rate)
    sources, rows = _section()
    archs: dict = {}

    class Runner(_Runner):
        def cost(self, name: str):
            if name not in archs:
                archs[name] = _cost(_variant(load_arch(name), {"start_us": start, "cube_setup_us": setup}, l2_rate))
            return archs[name]

    runner, errors = Runner(), []
    for _, r, _ in _fastest(rows):
        src = sources[r["source"]]
        if src["half"] != "calibration" or r["family"] not in families:
            continue
        target = _target(src, r)
        got = getattr(runner, r["family"])(r, target) if target else None
        if got is not None:
            errors.append(got[0] / float(r["measured_us"]) - 1)
    return errors


#: the operator families whose kernels move data at a core's L2 rate: a GEMM's operand loads, and
#: FlashAttention's K/V reads and its cube <-> vector hand-offs through the L2
RATE_FAMILIES = ("gemm", "attention")


def load_rate_choice() -> tuple[float, dict[float, float]]:
    """The per-core L2 read rate of :data:`LOAD_RATES` with the smaller median |error| over the
    calibration half's rows of every family that moves data at that rate (:data:`RATE_FAMILIES`):
    one physical constant, so every calibration row that depends on it votes; each candidate's
    median |error|."""
    scores = {rate: statistics.median(abs(e) for e in calibration_gemm_errors(rate, families=RATE_FAMILIES))
              for rate in LOAD_RATES}
    return min(scores, key=lambda r: (scores[r], r)), scores


__all__ = ["LOAD_RATES", "add_sample_rows", "calibration_gemm_errors", "core_time_rows", "cube_setup_us",
           "kernel_start_us", "load_rate_choice", "vector_costs", "vector_pipe_constants"]
