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
  e.g. rsqrt of 8 floats a row), some once per row over one repeat (``rowtiny``: a row's scale
  broadcast or divided) and one cross-lane reduction per row (``xlane``: WholeReduceSum /
  WholeReduceMax over one repeat, a log2(elements per repeat)-deep tree at one cycle per level --
  the tree depth is the lane model's assumption, :mod:`npusim.hw.compute.vector`); ``rowsync``: a
  wait between the vector and the scalar pipe, once per row, charged one instruction start (an
  assumption). An instruction may cover a share of the row (``Instr.fraction``: a halving reduction's
  Adds).
* **Kernel choice by SoC.** Some vendor tilings branch on the SoC version (the arch's
  ``kernel.soc_version``): ops-nn's RmsNorm takes its multi-row MERGE_N kernel only on ASCEND910B with
  at most 2000 columns, else MODE_NORMAL, one row at a time (:func:`rmsnorm_mode`,
  :func:`rmsnorm_normal_instructions`).
* **Rows over AIVs, loops through the UB** (:func:`split_rows`, :func:`ub_tiling`). The vendor
  tilings give every AIV of the die ``ceil(rows / AIVs)`` whole rows; an AIV walks them in loops of
  as many rows as its kernel's buffers fit in the UB, with the kernel's queue depths (RmsNorm: one
  buffer each, so a loop's copy in waits the previous loop's compute and its compute the previous
  copy out; DynamicQuant: a double-buffered input and a single output); classes whose tiling was not
  read keep two buffers of input and output (an assumption).
* **The AIVs a kernel launches, and their prologue** (:func:`launched_aivs`, :func:`setup_share`).
  A vendor tiling sets the kernel's block dim: ops-nn DynamicQuant's general branch
  (``dynamic_quant_tiling.cpp``, ``RunFusionKernelTiling``: ``coreNum = min(vectorCoreNum, rows)``,
  ``SetBlockDim(coreNum)``) and RmsNorm (``rms_norm_tiling.cpp``: ``useCoreNum``) launch one AIV per
  row up to the die's; ops-nn AscendQuantV2 (``ascend_quant_v2_tiling.cpp``,
  ``AscendQuantV2::WriteTilingData``: ``SetBlockDim(coreNum_)``, the platform's AIV count, whatever
  ``actCoreNum_`` its rows need; the idle blocks return) launches every AIV of the die, one row or
  many. Each launched AIV's prologue grows with the number of cores the kernel starts: the Ascend C
  best-practice guide ("Setting a Proper Number of Cores and Operator Kernel Type", CANN 8.5: core
  start-up, TLB misses on the cores' first accesses, same-address conflicts when many cores read
  one address at once, variable initialisation -- "the header overhead increases with the number of
  used cores"). Its shape is taken from the one cited formula for a start that grows with the cores
  launched, CATLASS's AIV start of a MIX kernel (``examples/102_dynamic_optimized_matmul/include/
  select_kernel_b16.h``, ``GetPaddingTag``: ``headCost = 1 + 7 x blockDim / coreNum`` us; the arch's
  ``kernel.mix_start_us`` / ``mix_start_core_us``): a kernel launching ``n`` of the die's ``N`` AIVs
  pays ``(1 + 7 n / N) / 8`` of the prologue a kernel launching all of them pays
  (``kernel.vector_setup_us``, derived from AscendQuantV2, which launches all of them). The
  proportional shape at the vector kernels' level is an assumption. Beyond ``N`` rows a vendor
  tiling may launch fewer AIVs (ops-nn RmsNorm: ``ceil(rows / ceil(rows / N))``, 25 at 49 rows);
  the prologue is charged at ``N`` there (DynamicQuant's rule), so a kernel's time never falls as
  its rows grow.
* **No vector work.** ``copy`` (TensorMove: GM -> UB -> GM by MTE2 and MTE3) issues no vector
  instruction: its time is its transfers alone (charged by the caller).

Instruction lists (:data:`RECIPES`), bf16 in, per element of the op's rows (``elements`` as the
caller gives them; SwiGLU: the outputs), read from the reference kernels:

* ``rmsnorm`` -- ops-nn ``norm/add_rms_norm/op_kernel/add_rms_norm_multi_n.h`` (ComputeRstd /
  ComputeY of the multi-row AddRmsNorm kernel, without the residual Add): Cast x to fp32, Mul
  x*x, Muls by 1/cols (tile); per row ReduceSumCustom
  (an Add over the row's repeats, then WholeReduceSum); Adds eps, Sqrt, Duplicate, Div, Gather
  (tiny); per row Mul by rstd; Cast to bf16 (tile); per row Mul by gamma (bf16 width).
* ``rmsnorm`` with ``fn="add"`` (AddRmsNorm, CANN's residual Add + RmsNorm in one kernel) -- ops-nn
  ``add_rms_norm_multi_n.h`` (``KernelAddRmsNormMultiN``): ``Add(x, x1, x2)`` at the input's width over
  the loop's rows (tile; x is written out), then ``rmsnorm``'s list. Its two inputs and two outputs
  (x1, x2 in; x, y out) are the caller's bytes. The bias of AddRmsNormBias (one more Add by row) is
  not counted.
* ``quantize`` (dynamic per-token INT8) -- ops-nn's DynamicQuant (``dynamic_quant_db.h``,
  ``DynamicQuantDbOpt::ProcessSymmetric``, bf16 without smooth scales), which issues every
  instruction per row: Cast to fp32, Abs, the row's Max over its repeats and WholeReduceMax
  (ReduceMaxInplace), Brcb and Div of the scale (one repeat each), Mul by 1/scale, Cast fp32 ->
  int16 and int16 -> fp16, the scale's Mul (one repeat), Cast fp16 -> int8 (the last two casts at
  fp16 width). (Until session 42: the tile-wide casts of CANN's MoE dispatch quantisation,
  ``MoeDispatchNormalZeroBuffer::QuantProcess``.)
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
* ``softmax`` over a row the UB cannot hold (:func:`softmax_chunks`: more elements than the generic
  tiling's half UB holds at the op's bytes in and out) -- the last axis cut into UB chunks: a first
  pass takes each chunk's max and sum and updates the running ones (Ascend C ``SoftmaxFlashV2`` with
  ``update``, "last轴切轴的情况，每次计算的reduce结果并非是全轴的，需要根据上一次Softmax计算的sum和max
  来更新", the API doc; FlashAttention-2's rescale), a second reads each chunk again and writes
  ``exp(x - max) / sum`` (:data:`RECIPES` ``softmax_split``, every instruction per chunk; the row is
  read twice). The two-pass scheme is the least a kernel can do when the row does not fit; the
  aclnn SoftmaxV2 kernel itself was not read.
* ``transpose`` -- one reorder pass in UB at bf16 width (TransDataTo5HD / Gather); an assumption.
* ``rope`` with ``fn="interleave"`` (CANN's InterleaveRope, x ``[B, N, S, 64]``, cos / sin
  ``[B, 1, 1, 64]``) -- ops-transformer ``posembedding/interleave_rope``: its B11D kernel
  (``op_kernel/interleave_rope_b11d.h``, ``KernelInterleaveRopeB11D::Rope``) walks its batches one at a
  time, every queue single-buffered (``TQue<..., 1>``): per batch it copies cos in and Casts it, sin
  likewise (one repeat each: ``rowtiny``), then per loop of its heads copies x in, GatherMasks the
  real and imaginary halves (bf16 width), Casts both to fp32, two masked Muls by cos (32 of a repeat's
  64 lanes: twice the repeats of the heads' elements), Muls the imaginary half by -1, two masked Muls
  by sin, Adds, Casts out and copies y back (:data:`RECIPES` ``interleave_rope``). Its tiling
  (:func:`interleave_rope_split`) sets the AIVs and each one's loops. Its row is one batch's
  ``N x S x 64`` elements (the caller's ``row_len``).
* fused quantisation classes (``rmsnorm_quant``, ``swiglu_quant``, ...): the two lists in a row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["FULL_DIE_LAUNCH", "INTERLEAVE_HEAD", "Instr", "InterleaveSplit", "RECIPES", "REPEAT_BYTES", "SOC_VERSIONS", "UB_TILING", "UbTiling",
           "aiv_tile_cycles", "instructions", "interleave_rope_split", "is_copy", "launched_aivs", "rmsnorm_mode", "rmsnorm_normal_instructions",
           "setup_share", "softmax_chunks", "split_rows", "ub_tiling"]

#: bytes one vector instruction repeat covers (Ascend C: 8 data blocks x 32 bytes)
REPEAT_BYTES = 256


@dataclass(frozen=True)
class Instr:
    """One vector instruction of a reference kernel: its name, scope (``tile``, ``row``, ``tiny``,
    ``rowtiny``, ``xlane``, ``rowsync``; see the module docstring), the bytes per element of its widest
    operand and the share of the row it covers."""

    name: str
    scope: str = "tile"
    width: int = 4
    #: the share of the row (or tile) the instruction covers (1: all of it; a halving reduction's
    #: Adds cover half, a quarter, ... of the row)
    fraction: float = 1.0


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
    # ops-nn norm/add_rms_norm/op_kernel/add_rms_norm_multi_n.h (KernelAddRmsNormMultiN::ComputeX): the
    # residual Add x1 + x2 at the input's width (``Add(xLocal, x1Local, x2Local)`` on T), written out as
    # x, then the RmsNorm above on it (ComputeRstd / ComputeY)
    "add_rmsnorm": [Instr("Add x1+x2", "tile", 2)],
    "layernorm": _t("Cast x") + _ROW_SUM + [Instr("Adds -mean", "row")] + _t("Mul sq") + _ROW_SUM
    + [Instr(n, "tiny") for n in ("Adds eps", "Sqrt", "Div")] + [Instr("Mul rstd", "row")]
    + _t("Mul gamma", "Add beta", "Cast out"),
    "softmax": _t("Cast x") + _ROW_MAX + [Instr("Sub max", "row")] + _t("Exp") + _ROW_SUM
    + [Instr("Div (reciprocal)", "tiny"), Instr("Mul 1/sum", "row")] + _t("Cast out"),
    # softmax over a row cut into UB chunks (module docstring), per chunk: pass 1 (SoftmaxFlashV2 with
    # update: the chunk's max and sum, the running max and sum rescaled), pass 2 (x read again)
    "softmax_split": [Instr("Cast x", "row")] + [Instr("Max (row accumulate)", "row"), Instr("WholeReduceMax", "xlane")]
    + [Instr(n, "rowtiny") for n in ("Max (running)", "Sub (running - new max)", "Exp (rescale)")]
    + [Instr("Sub max", "row"), Instr("Exp", "row")] + _ROW_SUM
    + [Instr(n, "rowtiny") for n in ("Mul (rescaled running sum)", "Add (running sum)")]
    + [Instr("Cast x (pass 2)", "row"), Instr("Sub max (pass 2)", "row"), Instr("Exp (pass 2)", "row"),
       Instr("Div (reciprocal)", "rowtiny"), Instr("Mul 1/sum", "row"), Instr("Cast out", "row")],
    "rope": _t("Cast x", "Cast cos", "Cast sin", "Mul cos", "Muls -1 (rotate half)", "Mul sin", "Add", "Cast out"),
    # ops-transformer posembedding/interleave_rope/op_kernel/interleave_rope_b11d.h (KernelInterleaveRopeB11D::
    # Rope), per loop of one batch's heads (the row): cos and sin Cast once per batch (64 elements, one
    # repeat); GatherMask x's even / odd elements (on bf16); the halves Cast to fp32; Mul by cos and Mul by
    # sin with mask 0xffffffff (32 lanes) and repeat factor x 2: twice the repeats of the row at fp32;
    # Muls -1 on the imaginary half; Add; Cast out (fp32 -> bf16)
    "interleave_rope": [Instr("Cast cos", "rowtiny"), Instr("Cast sin", "rowtiny"),
                        Instr("GatherMask real", "tile", 2), Instr("GatherMask imag", "tile", 2),
                        Instr("Cast real", "tile", 4, 0.5), Instr("Cast imag", "tile", 4, 0.5),
                        Instr("Mul real x cos", "tile", 4, 2.0), Instr("Mul imag x cos", "tile", 4, 2.0),
                        Instr("Muls imag -1", "tile", 4, 0.5),
                        Instr("Mul imag x sin", "tile", 4, 2.0), Instr("Mul real x sin", "tile", 4, 2.0),
                        Instr("Add", "tile", 4), Instr("Cast out", "tile", 4)],
    # ops-nn DynamicQuantDbOpt::ProcessSymmetric (bf16, no smooth scales): every instruction per row
    "quantize": [Instr("Cast", "row"), Instr("Abs", "row")] + _ROW_MAX
    + [Instr(n, "rowtiny") for n in ("Brcb", "Div (scale)")]
    + [Instr("Mul 1/scale", "row"), Instr("Cast fp32->int16", "row"), Instr("Cast int16->fp16", "row", 2),
       Instr("Mul (scale out)", "rowtiny"), Instr("Cast fp16->int8", "row", 2)],
}

#: fused quantisation classes -> the first op's recipe key (the quantisation's instructions follow it)
_FUSED = {"rmsnorm_quant": "rmsnorm", "layernorm_quant": "layernorm", "swiglu_quant": "swiglu"}

#: bytes per element of the dtypes the vector unit computes natively (bf16 goes through fp32)
_NATIVE = {"fp16": 2, "fp32": 4}


def instructions(op_class: str, fn: str | None = None, dtype: str = "bf16", *, row_len: int | None = None,
                 soc: str = "ascend910b") -> list[Instr]:
    """The instructions of ``op_class``'s reference kernel (``activation`` by its ``fn``; ``rmsnorm``
    with ``fn="add"``: AddRmsNorm, the residual Add fused before the norm) on ``dtype`` inputs (only
    ``elementwise`` depends on it: native fp16 / fp32, else through fp32). A plain ``rmsnorm`` on rows
    of ``row_len`` runs the kernel its tiling picks on ``soc`` (:func:`rmsnorm_mode`): MODE_NORMAL's
    row-by-row list (:func:`rmsnorm_normal_instructions`) unless MERGE_N's (``row_len`` None: MERGE_N)."""
    if row_len is not None and _rmsnorm_row_by_row(op_class, fn, row_len, soc):
        return rmsnorm_normal_instructions(row_len)
    if op_class == "elementwise" and dtype in _NATIVE:
        return [Instr("op", "tile", _NATIVE[dtype])]
    key = fn if op_class == "activation" else op_class
    if op_class == "rmsnorm" and fn == "add":  # AddRmsNorm: the residual Add, then the norm
        return RECIPES["add_rmsnorm"] + RECIPES["rmsnorm"]
    if op_class in _FUSED:
        return RECIPES[_FUSED[op_class]] + RECIPES["quantize"]
    if op_class == "rope" and fn == "interleave":
        return RECIPES["interleave_rope"]
    if key not in RECIPES:
        raise ValueError(f"no vector kernel recipe for op class {op_class!r} (fn {fn!r}); known: {sorted(RECIPES)}")
    return RECIPES[key]


#: SoC versions whose tiling rules are modelled (CANN's platform_ascendc::SocVersion): Atlas A2
#: (910B) and Atlas A3 (910_93, the 910C's dies)
SOC_VERSIONS = ("ascend910b", "ascend910_93")
#: ops-nn rms_norm_tiling.cpp: MERGE_N only while numColAlign <= SMALL_REDUCE_NUM, and only on 910B
_SMALL_REDUCE_NUM = 2000
#: ops-nn rms_norm_tiling.cpp: UB_FACTOR_B16, the columns one UB pass holds (more: MODE_SPLIT_D)
_UB_FACTOR_B16 = 12288
#: elements of fp32 one repeat covers (ELEM_PER_REP_FP32)
_FP32_PER_REPEAT = 64


def rmsnorm_mode(row_len: int, soc: str = "ascend910b") -> str:
    """The kernel ops-nn's RmsNorm tiling (``norm/rms_norm/op_host/rms_norm_tiling.cpp``,
    ``Tiling4RmsNorm``, bf16/fp16 x and gamma of one dtype) picks for rows of ``row_len`` on ``soc``:
    ``merge_n`` (rms_norm_merge_n.h, many rows per loop) only when ``numColAlign <= 2000`` *and* the
    SoC is ``ASCEND910B`` (the test is ``curSocVersion == SocVersion::ASCEND910B``: an A3 die,
    ``ASCEND910_93``, never takes it); else ``normal`` (rms_norm.h, ``KernelRmsNorm``: one row per
    CopyIn / Compute / CopyOutY) while the row fits ``UB_FACTOR_B16`` (12288) columns, else
    ``split_d`` (the row cut into UB passes; costed here as ``normal``, an approximation)."""
    if soc not in SOC_VERSIONS:
        raise ValueError(f"soc {soc!r}: expected one of {SOC_VERSIONS}")
    align = -(-row_len // 16) * 16  # numColAlign: 32-byte blocks of 2-byte elements
    if soc == "ascend910b" and align <= _SMALL_REDUCE_NUM:
        return "merge_n"
    return "normal" if align <= _UB_FACTOR_B16 else "split_d"


def _rmsnorm_row_by_row(op_class: str, fn: str | None, row_len: int, soc: str) -> bool:
    """Whether the op is a plain RmsNorm (not AddRmsNorm, ``fn="add"``, whose tiling differs) whose
    tiling picks a one-row-at-a-time kernel on ``soc`` (:func:`rmsnorm_mode`: not MERGE_N)."""
    return op_class == "rmsnorm" and fn is None and rmsnorm_mode(row_len, soc) != "merge_n"


def rmsnorm_normal_instructions(row_len: int) -> list[Instr]:
    """RmsNorm's MODE_NORMAL kernel (ops-nn ``norm/rms_norm/op_kernel/rms_norm.h``,
    ``KernelRmsNorm::Compute`` and ``ComputeMulGammaCast``, bf16 x and gamma), every instruction once
    per row (the kernel computes one row at a time): Cast x to fp32, Mul x*x; ``ReduceSumHalfInterval``
    (``rms_norm_base.h``): an Add of the tail beyond the largest power of two, then Adds of halves
    down to 64 floats, then one WholeReduceSum (vcadd, cross-lane); the row's sum is read by the scalar
    unit (``SetFlag/WaitFlag<V_S>``), which computes ``1 / sqrt`` and hands it back
    (``SetFlag/WaitFlag<S_V>``): two waits, each charged one instruction start (an assumption: the
    pipe's start cost, as a PipeBarrier is); Muls by rstd, Cast gamma to fp32 (again every row), Mul by
    gamma, Cast to bf16."""
    out = [Instr("Cast x", "row"), Instr("Mul x*x", "row")]
    n = max(1, int(row_len))
    if n > _FP32_PER_REPEAT:
        body = 1 << (n.bit_length() - 1)  # findPowerTwo: the largest power of two <= n
        if n > body:
            out.append(Instr("Add (tail)", "row", 4, (n - body) / n))
        while body > _FP32_PER_REPEAT:
            body //= 2
            out.append(Instr("Add (half interval)", "row", 4, body / n))
    out += [Instr("WholeReduceSum", "xlane"), Instr("V_S wait (rstd to scalar)", "rowsync"),
            Instr("S_V wait (rstd back)", "rowsync"), Instr("Muls rstd", "row"), Instr("Cast gamma", "row"),
            Instr("Mul gamma", "row"), Instr("Cast out", "row")]
    return out


def is_copy(op_class: str) -> bool:
    """True when the op issues no vector instruction (its time is MTE2 and MTE3 traffic alone)."""
    return op_class == "copy"


def aiv_tile_cycles(op_class: str, fn: str | None, rows: int, row_len: int, *, cycles_per_repeat: float,
                    instruction_cycles: float, dtype: str = "bf16", repeat_bytes: int = REPEAT_BYTES,
                    soc: str = "ascend910b") -> int:
    """Cycles one AIV's vector pipe is busy on a tile of ``rows`` rows of ``row_len`` elements
    (module docstring): the sum over the kernel's instructions of their start and their repeats.
    ``soc``: the die's SoC version, which picks RmsNorm's kernel (:func:`rmsnorm_mode`)."""
    if rows <= 0 or row_len <= 0:
        return 0
    total = 0.0
    for ins in instructions(op_class, fn, dtype, row_len=row_len, soc=soc):
        per_repeat = max(1, repeat_bytes // ins.width)  # elements one repeat covers
        n = max(1, round(row_len * ins.fraction))  # the instruction's elements of one row
        if ins.scope == "tile":
            total += instruction_cycles + math.ceil(rows * n / per_repeat) * cycles_per_repeat
        elif ins.scope == "row":
            total += rows * (instruction_cycles + math.ceil(n / per_repeat) * cycles_per_repeat)
        elif ins.scope == "rowsync":
            total += rows * instruction_cycles
        elif ins.scope == "tiny":
            total += instruction_cycles + cycles_per_repeat
        elif ins.scope == "rowtiny":
            total += rows * (instruction_cycles + cycles_per_repeat)
        else:  # xlane: one repeat and the cross-lane tree, per row
            total += rows * (instruction_cycles + cycles_per_repeat + math.ceil(math.log2(per_repeat)))
    return math.ceil(total)


@dataclass(frozen=True)
class UbTiling:
    """How one AIV walks its rows through its unified buffer: ``rows`` per loop (at least 1) and the
    buffers of its input and output queues (2: the next loop's copy overlaps this loop; 1: it waits)."""

    rows: int
    in_buffers: int
    out_buffers: int


#: op class -> (UB bytes per column of a loop's rows, UB bytes per row, UB bytes reserved, input
#: buffers, output buffers) of its reference kernel's tiling; classes not listed: the generic rule of
#: :func:`ub_tiling` (an assumption)
UB_TILING: dict[str, tuple[int, int, int, int, int]] = {
    # ops-nn norm/rms_norm/op_host/rms_norm_tiling.cpp (Atlas A2/A3, bf16/fp16 x and gamma): rowFactor =
    # (ubSize - UB_USED 1024) / (numColAlign * 16 + 260) rows per loop (MODE_MERGE_N; x, y at 2 bytes
    # and gamma, x in fp32, x^2 at 4 bytes a column); BUFFER_NUM = 1 for every queue
    # (rms_norm_merge_n.h: CopyIn, Compute, CopyOutY in turn)
    "rmsnorm": (16, 260, 1024, 1, 1),
    # ops-nn quant/dynamic_quant/op_kernel/dynamic_quant_db.h (DynamicQuantDbOpt): the input queue has
    # DOUBLE_BUFFER_NUM (the next loop's CopyIn is issued before this loop's rows), the output a single
    # TBuf (a loop's first row waits the previous loop's copy out, MTE3_V); its rows per loop
    # (multiRowNum) are not read: the generic rule's
    "quantize": (0, 0, 0, 2, 1),
}


def ub_tiling(op_class: str, row_len: int, in_bytes: float, out_bytes: float, ub_bytes: float,
              soc: str = "ascend910b", fn: str | None = None) -> UbTiling:
    """Rows per loop and queue depths of one AIV for ``op_class`` (:data:`UB_TILING`) on rows of
    ``row_len`` elements, ``in_bytes`` / ``out_bytes`` per element streamed in and out, ``ub_bytes``
    of unified buffer. Generic rule (classes without a read tiling): two buffers of input and output,
    ``ub / 2 // (row_len * (in + out))`` rows. A plain RmsNorm whose tiling picks MODE_NORMAL on
    ``soc`` (:func:`rmsnorm_mode`) walks one row per loop, one buffer per queue (rms_norm.h:
    ``SubProcess`` calls CopyIn, Compute, CopyOutY for each row; BUFFER_NUM = 1)."""
    if _rmsnorm_row_by_row(op_class, fn, row_len, soc):
        return UbTiling(1, 1, 1)
    per_col, per_row, reserved, nin, nout = UB_TILING.get(op_class, (0, 0, 0, 2, 2))
    if per_col:
        align = -(-row_len // 16) * 16  # numColAlign: 32-byte blocks of 2-byte elements
        rows = int((ub_bytes - reserved) // (align * per_col + per_row))
    else:
        rows = int(ub_bytes / 2 // max(1.0, row_len * (in_bytes + out_bytes)))
    return UbTiling(max(1, rows), nin, nout)


def softmax_chunks(op_class: str, row_len: int, in_bytes: float, out_bytes: float, ub_bytes: float) -> tuple[int, int] | None:
    """``(chunk elements, chunks per row)`` when a ``softmax`` row of ``row_len`` elements does not fit
    one AIV's UB at the generic tiling's rule (:func:`ub_tiling`: half the UB, ``in_bytes + out_bytes``
    per element): as few chunks as hold it, of even size in whole fp32 repeats (64 elements); None when
    the row fits or the op is not a softmax (module docstring: the two-pass ``softmax_split``)."""
    if op_class != "softmax":
        return None
    per_elem = max(1.0, in_bytes + out_bytes)
    fits = int(ub_bytes / 2 // per_elem)
    if row_len <= fits:
        return None
    cap = max(_FP32_PER_REPEAT, fits // _FP32_PER_REPEAT * _FP32_PER_REPEAT)
    chunks = -(-row_len // cap)
    even = -(-row_len // chunks)
    return -(-even // _FP32_PER_REPEAT) * _FP32_PER_REPEAT, chunks


def split_rows(rows: int, aivs: int) -> list[int]:
    """Rows of each working AIV as the vendor kernels' tilings split them (ops-nn RmsNorm:
    ``blockFactor = ceil(rows / GetCoreNumAiv())``, ``useCoreNum = ceil(rows / blockFactor)``, the last
    core the remainder; DynamicQuant's head/tail cores alike): whole rows, ``blockFactor`` each."""
    if rows <= 0 or aivs <= 0:
        raise ValueError(f"split_rows needs rows and AIVs > 0, got {rows} and {aivs}")
    block = -(-rows // aivs)
    used = -(-rows // block)
    return [block] * (used - 1) + [rows - block * (used - 1)]


#: (op class, fn) of the vector kernels whose tiling launches every AIV of the die whatever their rows:
#: ops-nn AscendQuantV2 (``ascend_quant_v2_tiling.cpp``, ``WriteTilingData``: ``SetBlockDim(coreNum_)``,
#: the platform's AIV count; ``numCore`` in its tiling data tells the idle blocks to return)
FULL_DIE_LAUNCH = frozenset({("quantize", "ascend_quant_v2")})


def launched_aivs(op_class: str, fn: str | None, rows: int, aivs: int) -> int:
    """The AIVs (the block dim) a vector kernel of ``rows`` rows launches on ``aivs`` AIVs (module
    docstring): all of them for :data:`FULL_DIE_LAUNCH`, else one per row up to ``aivs``."""
    if rows <= 0 or aivs <= 0:
        raise ValueError(f"launched_aivs needs rows and AIVs > 0, got {rows} and {aivs}")
    if (op_class, fn) in FULL_DIE_LAUNCH:
        return aivs
    return min(rows, aivs)


def setup_share(launched: int, die_aivs: int, fixed_us: float, per_core_us: float) -> float:
    """The share of the full-die AIV prologue (``kernel.vector_setup_us``) a kernel launching
    ``launched`` of the die's ``die_aivs`` AIVs pays: ``(fixed + per_core x launched / die_aivs) /
    (fixed + per_core)``, the shape of CATLASS's ``headCost`` (``fixed_us``, ``per_core_us``: the arch's
    ``kernel.mix_start_us``, ``mix_start_core_us``); 1 when both are 0 (no shape cited: the full
    prologue always). Never above 1: ``launched`` is capped at the die's AIVs."""
    if launched <= 0 or die_aivs <= 0 or fixed_us < 0 or per_core_us < 0:
        raise ValueError(f"setup_share: launched {launched}, die AIVs {die_aivs}, fixed {fixed_us}, "
                         f"per core {per_core_us}: expected positive counts and non-negative costs")
    if fixed_us + per_core_us == 0:
        return 1.0
    return (fixed_us + per_core_us * min(launched, die_aivs) / die_aivs) / (fixed_us + per_core_us)


#: ops-transformer interleave_rope_tiling.cpp: hiddenDim, the only head size its tiling accepts
INTERLEAVE_HEAD = 64


@dataclass(frozen=True)
class InterleaveSplit:
    """How CANN's InterleaveRope (B11D kernel) spreads ``[B, N, S, 64]`` over the AIVs
    (:func:`interleave_rope_split`): each launched AIV's loops (``loops``: one batch, or one loop of a
    batch's heads, each; its length is the block dim), ``heads`` rows of 64 per loop, ``axis`` the
    split (``"batch"`` or ``"ns"``) and ``switch``, the batches from which the tiling splits by batch
    (``min(AIVs, N x S)``)."""

    loops: tuple[int, ...]
    heads: int
    axis: str
    switch: int

    @property
    def blocks(self) -> int:
        return len(self.loops)


def interleave_rope_split(batch: int, heads: int, aivs: int, ub_bytes: float) -> InterleaveSplit:
    """ops-transformer ``posembedding/interleave_rope/op_host/interleave_rope_tiling.cpp``
    (``DoOpTiling``, the B11D branch: cos / sin ``[B, 1, 1, 64]``) for ``batch`` batches of ``heads``
    (``N x S``) rows of 64 on ``aivs`` AIVs with ``ub_bytes`` of UB each:

    * ``B >= aivs`` or ``B >= N x S`` -- SPLIT_BATCH (``SplitBlockForBatch``): ``ceil(B / aivs)``
      batches a block, ``ceil(B / that)`` blocks (the last one the remainder), every head of a batch in
      its loops;
    * else SPLIT_NS (``SplitBlockForNS``): ``ceil(NS / aivs)`` heads a block, ``ceil(NS / that)``
      blocks, each walking every batch;
    * a block's heads per batch go in loops of ``(ub - 64 x 4 x 4) / (64 x 4 x 6) / 2`` heads
      (``SplitHiddenDimInblock``; 63 on a 192 KB UB), so a batch is ``ceil(heads / that)`` loops.

    Not modelled: the FIXED_BNSD kernel its tiling takes at B = N = 32, S = 1 (``SplitBlockForFixBNS``,
    its own kernel file, not read: costed as SPLIT_BATCH) and the BN1D kernel of cos / sin with a
    sequence axis (S >= 512; the caller's rows state cos [B, 1, 1, 64])."""
    if batch <= 0 or heads <= 0 or aivs <= 0 or ub_bytes <= 0:
        raise ValueError(f"interleave_rope_split needs batch, heads, AIVs and UB > 0, got {batch}, {heads}, "
                         f"{aivs}, {ub_bytes}")
    per_loop = max(1, int((ub_bytes - INTERLEAVE_HEAD * 4 * 4) // (INTERLEAVE_HEAD * 4 * 6) // 2))
    switch = min(aivs, heads)
    if batch >= switch:  # SPLIT_BATCH
        block_heads = heads
        batches = split_rows(batch, aivs)
        axis = "batch"
    else:  # SPLIT_NS: every block all the batches
        block_heads = -(-heads // aivs)
        batches = [batch] * -(-heads // block_heads)
        axis = "ns"
    loops_per_batch = -(-block_heads // per_loop)
    return InterleaveSplit(tuple(b * loops_per_batch for b in batches), min(block_heads, per_loop), axis, switch)
