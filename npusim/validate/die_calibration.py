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
* ``kernel.vector_setup_us`` and ``kernel.vector_cycles_per_repeat``: the report's AscendQuantV2
  (9 x 2048: almost no work, so mostly setup) and DynamicQuant (1030 x 2304) rows, each op timed
  from its reference kernel's instructions (:mod:`npusim.hw.compute.vector_kernel`, at the
  preset's assumed ``vector_instruction_cycles``): with no start and no setup, the cycles per
  256-byte repeat is the one at which the two rows' simulated core times differ as measured, the
  setup then the small row's core time - its simulated time (bisection). Every other class is
  costed by its own instructions at these constants; the report's RmsNorm (515 x 1536) row checks
  them;
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
    sources, rows = _section()
    if sources[MICROBENCH]["half"] != "calibration":
        raise ValueError(f"published.yaml operators: source {MICROBENCH} is no longer in the calibration half")
    out = []
    for r in rows:
        m = _CORE_TIME.search(str(r.get("conditions", "")))
        if r["source"] == MICROBENCH and m and "measured_us" in r:
            out.append({"row": r, "duration_us": float(r["measured_us"]), "core_us": float(m.group(2))})
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
    return _cost(var).vector(o).time_us


def _bisect(f, lo: float, hi: float, iters: int = 40) -> float:
    """x in [lo, hi] with f(x) = 0 for an increasing f."""
    for _ in range(iters):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < 0 else (lo, mid)
    return (lo + hi) / 2


def vector_costs(arch: Arch | None = None, iters: int = 30) -> dict:
    """``vector_setup_us`` and ``vector_cycles_per_repeat`` from the two quantisation rows, every op
    timed from its reference kernel's instructions (:mod:`npusim.hw.compute.vector_kernel`) with the
    preset's instruction start (``vector_instruction_cycles``, an assumption): the cycles per repeat
    at which the rows' simulated core times differ as measured (their difference holds no setup;
    bisection), then the setup as the small row's core time - its simulated time. The RmsNorm row
    is not used: it checks the model (``npusim validate --only operators``)."""
    arch = arch or load_arch(DIE)
    small, large = _row("AscendQuantV2"), _row("DynamicQuant")
    instr = arch.kernel.vector_instruction_cycles

    def kernel(c: float) -> dict:
        return {"vector_cycles_per_repeat": c, "vector_instruction_cycles": instr}

    def gap(c: float) -> float:  # simulated (large - small) - measured (large - small)
        return (_vector_us(arch, "DynamicQuant", kernel(c)) - _vector_us(arch, "AscendQuantV2", kernel(c))) - \
            (large["core_us"] - small["core_us"])

    c = _bisect(gap, 1e-3, 64.0, iters)
    setup = small["core_us"] - _vector_us(arch, "AscendQuantV2", kernel(c))
    return {"vector_setup_us": setup, "vector_cycles_per_repeat": c}


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


__all__ = ["LOAD_RATES", "calibration_gemm_errors", "core_time_rows", "cube_setup_us", "kernel_start_us",
           "load_rate_choice", "vector_costs"]
