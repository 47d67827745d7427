"""One Ascend vector core's (AIV's) compute time for a tile of a vector operator, from the
instructions its reference kernel issues (issue 39 item 2: the vector core as mechanisms).

Units: cycles of the core clock; bytes; elements of the operator's rows.

Machine model (each an assumption or a cited figure, no fitted factor per operator):

* **Width.** One vector instruction processes ``repeat_bytes`` per repeat (Ascend C: a repeat is
  8 data blocks of 32 bytes = 256 bytes; the arch's vector width, ``cores.vector_unit.lanes`` fp16
  lanes per modelled core shared by its ``kernel.vector_cores_per_core`` AIVs: 256 lanes x 2 bytes /
  2 AIVs = 256 bytes) and issues one repeat every ``cycles_per_repeat`` cycles. An instruction's
  elements per repeat are ``repeat_bytes`` over the width of its widest operand: the norms,
  activations and quantisation compute in fp32 (bf16 inputs are Cast to fp32 first), so 64.
* **Instruction start.** Every instruction costs ``instruction_cycles`` before its first repeat (its
  issue and the ``PipeBarrier<PIPE_V>`` the reference kernels put between dependent instructions).
  On the Ascend presets both constants come from the vendor's Add sample on an Atlas A2 (its vector
  pipe's time at two instruction sizes: ~22 cycles a start, ~2.0 cycles a repeat at its default UB
  layout; 1.0 without UB bank conflicts), :func:`npusim.validate.die_calibration.vector_pipe_constants`.
* **Scopes.** A reference kernel issues some instructions once per tile over all its rows
  (``tile``), some once per row over that row (``row``: a reduction's accumulation, a row's
  broadcast multiply), some once per tile over one repeat (``tiny``: per-row statistics batched,
  e.g. rsqrt of 8 floats a row) and one cross-lane reduction per row (``xlane``: WholeReduceSum /
  WholeReduceMax over one repeat, a log2(elements per repeat)-deep tree at one cycle per level --
  the tree depth is the lane model's assumption, :mod:`npusim.hw.compute.vector`).
* **No vector work.** ``copy`` (TensorMove: GM -> UB -> GM by MTE2 and MTE3) issues no vector
  instruction: its time is its transfers alone (charged by the caller).

Instruction lists (:data:`RECIPES`), bf16 in, per element of the op's rows (``elements`` as the
caller gives them; SwiGLU: the outputs), read from the reference kernels:

* ``rmsnorm`` -- ops-nn ``norm/add_rms_norm/op_kernel/add_rms_norm_multi_n.h`` (ComputeRstd /
  ComputeY of the multi-row AddRmsNorm kernel, without the residual Add): Cast x to fp32, Mul
  x*x, Muls by 1/cols (tile); per row ReduceSumCustom
  (an Add over the row's repeats, then WholeReduceSum); Adds eps, Sqrt, Duplicate, Div, Gather
  (tiny); per row Mul by rstd; Cast to bf16 (tile); per row Mul by gamma (bf16 width).
* ``quantize`` (dynamic per-token INT8) -- the per-token quantisation in CANN's MoE dispatch
  kernel (``MoeDispatchNormalZeroBuffer::QuantProcess``): Cast to fp32, Abs (tile); per row Max over the repeats and
  WholeReduceMax; Div for the row scales (tiny); per row Muls by the scale; Cast fp32 -> fp16 and
  fp16 -> int8 (tile; the last at fp16 width).
* ``activation`` swiglu -- silu(a) * b as CANN's SwiGlu computes it: Cast a, Cast b, Muls -1, Exp,
  Adds 1, Div, Mul b, Cast out (tile); silu: the same without b's Cast and Mul; sigmoid: Cast, Muls,
  Exp, Adds, Div, Cast; relu / tanh / gelu: assumptions of the same form (listed below).
* ``elementwise`` (an Add or Mul) -- fp16 / fp32: the one instruction at its own width (the
  asc-devkit Add sample: ``AscendC::Add(zLocal, xLocal, yLocal, curLen)`` on half); bf16: Cast both
  inputs, the op, Cast out (the 910B's vector unit computes bf16 only through fp32; an assumption
  from the kernels above, which all Cast bf16).
* ``softmax``, ``layernorm``, ``rope``, ``exp``, ``divide``, ``reduction``: the same instructions
  a kernel of the op's formula issues in the style above (max / sum reductions per row, Exp, a
  reciprocal, scales); no reference kernel read for them: an assumption, stated in :data:`RECIPES`.
* ``transpose`` -- one reorder pass in UB at bf16 width (TransDataTo5HD / Gather); an assumption.
* fused quantisation classes (``rmsnorm_quant``, ``swiglu_quant``, ...): the two lists in a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["Instr", "RECIPES", "REPEAT_BYTES", "aiv_tile_cycles", "instructions", "is_copy"]

#: bytes one vector instruction repeat covers (Ascend C: 8 data blocks x 32 bytes)
REPEAT_BYTES = 256


@dataclass(frozen=True)
class Instr:
    """One vector instruction of a reference kernel: its name, scope (``tile``, ``row``, ``tiny``,
    ``xlane``; see the module docstring) and the bytes per element of its widest operand."""

    name: str
    scope: str = "tile"
    width: int = 4


def _t(*names: str, width: int = 4) -> list[Instr]:
    return [Instr(n, "tile", width) for n in names]


_ROW_SUM = [Instr("Add (row accumulate)", "row"), Instr("WholeReduceSum", "xlane")]
_ROW_MAX = [Instr("Max (row accumulate)", "row"), Instr("WholeReduceMax", "xlane")]

#: op class (or activation fn) -> the instructions of its reference kernel (module docstring)
RECIPES: dict[str, list[Instr]] = {
    "copy": [],
    "transpose": _t("reorder (TransDataTo5HD / Gather)", width=2),
    "elementwise": _t("Cast x", "Cast y", "op", "Cast out"),
    "exp": _t("Cast", "Exp", "Cast out"),
    "divide": _t("Cast x", "Cast y", "Div", "Cast out"),
    "reduction": _t("Cast") + _ROW_SUM,
    "swiglu": _t("Cast a", "Cast b", "Muls -1", "Exp", "Adds 1", "Div", "Mul b", "Cast out"),
    "silu": _t("Cast", "Muls -1", "Exp", "Adds 1", "Div", "Cast out"),
    "sigmoid": _t("Cast", "Muls -1", "Exp", "Adds 1", "Div", "Cast out"),
    "relu": _t("Cast", "Relu", "Cast out"),
    "tanh": _t("Cast", "Muls -2", "Exp", "Adds 1", "Div", "Muls 2", "Adds -1", "Cast out"),
    "gelu": _t("Cast", "Mul", "Mul", "Muls", "Add", "Muls", "Exp", "Adds 1", "Div", "Mul", "Cast out"),
    "rmsnorm": _t("Cast x", "Mul x*x", "Muls 1/cols") + _ROW_SUM
    + [Instr(n, "tiny") for n in ("Adds eps", "Sqrt", "Duplicate", "Div", "Gather")]
    + [Instr("Mul rstd", "row")] + _t("Cast out") + [Instr("Mul gamma", "row", 2)],
    "layernorm": _t("Cast x") + _ROW_SUM + [Instr("Adds -mean", "row")] + _t("Mul sq") + _ROW_SUM
    + [Instr(n, "tiny") for n in ("Adds eps", "Sqrt", "Div")] + [Instr("Mul rstd", "row")]
    + _t("Mul gamma", "Add beta", "Cast out"),
    "softmax": _t("Cast x") + _ROW_MAX + [Instr("Sub max", "row")] + _t("Exp") + _ROW_SUM
    + [Instr("Div (reciprocal)", "tiny"), Instr("Mul 1/sum", "row")] + _t("Cast out"),
    "rope": _t("Cast x", "Cast cos", "Cast sin", "Mul cos", "Muls -1 (rotate half)", "Mul sin", "Add", "Cast out"),
    "quantize": _t("Cast", "Abs") + _ROW_MAX + [Instr("Div (scales)", "tiny"), Instr("Muls scale", "row")]
    + _t("Cast fp32->fp16") + _t("Cast fp16->int8", width=2),
}

#: fused quantisation classes -> the first op's recipe key (the quantisation's instructions follow it)
_FUSED = {"rmsnorm_quant": "rmsnorm", "layernorm_quant": "layernorm", "swiglu_quant": "swiglu"}

#: bytes per element of the dtypes the vector unit computes natively (bf16 goes through fp32)
_NATIVE = {"fp16": 2, "fp32": 4}


def instructions(op_class: str, fn: str | None = None, dtype: str = "bf16") -> list[Instr]:
    """The instructions of ``op_class``'s reference kernel (``activation`` by its ``fn``) on
    ``dtype`` inputs (only ``elementwise`` depends on it: native fp16 / fp32, else through fp32)."""
    if op_class == "elementwise" and dtype in _NATIVE:
        return [Instr("op", "tile", _NATIVE[dtype])]
    key = fn if op_class == "activation" else op_class
    if op_class in _FUSED:
        return RECIPES[_FUSED[op_class]] + RECIPES["quantize"]
    if key not in RECIPES:
        raise ValueError(f"no vector kernel recipe for op class {op_class!r} (fn {fn!r}); known: {sorted(RECIPES)}")
    return RECIPES[key]


def is_copy(op_class: str) -> bool:
    """True when the op issues no vector instruction (its time is MTE2 and MTE3 traffic alone)."""
    return op_class == "copy"


def aiv_tile_cycles(op_class: str, fn: str | None, rows: int, row_len: int, *, cycles_per_repeat: float,
                    instruction_cycles: float, dtype: str = "bf16", repeat_bytes: int = REPEAT_BYTES) -> int:
    """Cycles one AIV's vector pipe is busy on a tile of ``rows`` rows of ``row_len`` elements
    (module docstring): the sum over the kernel's instructions of their start and their repeats."""
    if rows <= 0 or row_len <= 0:
        return 0
    total = 0.0
    for ins in instructions(op_class, fn, dtype):
        per_repeat = max(1, repeat_bytes // ins.width)  # elements one repeat covers
        if ins.scope == "tile":
            total += instruction_cycles + math.ceil(rows * row_len / per_repeat) * cycles_per_repeat
        elif ins.scope == "row":
            total += rows * (instruction_cycles + math.ceil(row_len / per_repeat) * cycles_per_repeat)
        elif ins.scope == "tiny":
            total += instruction_cycles + cycles_per_repeat
        else:  # xlane: one repeat and the cross-lane tree, per row
            total += rows * (instruction_cycles + cycles_per_repeat + math.ceil(math.log2(per_repeat)))
    return math.ceil(total)
