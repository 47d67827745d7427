"""Which tiling a GEMM kernel gives a shape: the vendor kernels' own base-block rules.

A chip-cost GEMM on a die with ``kernel.base_blocks`` runs one of these kernels (``ChipCost.gemm``'s
``kernel``; the arch's ``kernel.gemm_default`` when not named):

* ``catlass_basic`` -- CATLASS's basic matmul: the arch's base block for the dtype, always
  (``examples/00_basic_matmul``: ``L1TileShape``), K never split.
* ``aclnn`` -- the framework path (torch_npu / vLLM-Ascend call aclnnMatmul, MatMulV2/V3 on
  910B/910C): ops-nn MatMulV3's base-block rule (``matmul/mat_mul_v3/op_host/op_tiling/
  matmul_v3_base_tiling.cpp``): ``SetBaseBlockTiling`` starts from 128 x 256 (L0C of 128 KB);
  ``DoBasicTiling`` calls ``DoSmallShapeTiling`` when the blocks of that size number fewer than
  the cube cores or M or N is below 256 (``SMALL_SHAPE_THRES``); that runs
  ``FormulaicBaseBlockTiling``, which for B transposed (a linear layer's ``[n, k]`` weight: the
  framework's case, assumed) takes ``CalcBase<MN_BY_BASE_K>`` over ``CALC_MN_BASIC``
  ({64, 64}, {128, 128}, {128, 256}): each candidate shrinks its base along the side with fewer
  blocks so the blocks spread over all cores (``CalBaseMBaseN``, 16-aligned, never above the
  candidate), and the candidate with the least per-core load ``(baseM + baseN) x rounds`` wins
  (the first on ties); then the L0C caps of ``DoSmallShapeTiling`` (a side between 128 and 256
  holds the other at 128; baseM x baseN <= 32768). ``CalBaseSize`` is the same spreading rule on
  the non-transposed paths. Not modelled: the full-load, L2-split and split-K tilings
  ``DoSelectTiling`` may pick after it, the ND-to-NZ pre-pass, the knowledge-base tilings, and
  INT8's QuantBatchMatmulV3 (its own tiling: the rule above is applied to it too, an assumption).
  What its source says (ops-nn ``matmul/quant_batch_matmul_v3/op_host/op_tiling``): with a bf16
  output (or a per-token scale) it is a MIX kernel that dequantises in the AIVs' UB
  (``isUbQuant_``; its start is charged, :func:`npusim.mapping.gemm_kernel.is_mix_kernel`), and such a
  MIX GEMM of M <= 256 does not take the basic-block tiling (``CheckIfUseBasicInMix``) but the
  TBE cache tiling (``GetTbeTiling`` -> ``GenTiling``, its ``n_dim`` / ``m_dim`` core split), plus
  ``ProcessMSmall``'s decode template (``isBf16Opt_``: M <= baseM with a whitelisted (K, N) or a
  per-token scale); neither is reproduced here.
* ``catlass_splitk`` -- CATLASS's multi-core split K (``examples/52_quant_multi_core_splitk_
  matmul_tla``; ``include/catlass/gemm/kernel/quant_multi_core_splitk_matmul_tla.hpp``
  ``GetSplitkFactor``): the base blocks of ``catlass_basic``, each cut along K into
  ``factor = cores // blocks`` slices (2 when the blocks outnumber the cores), at most one slice
  per L1 K tile; tasks numbered slice-major (``SplitkGemmIdentityBlockSwizzle``: task ``t`` is slice
  ``t // blocks``, block ``t % blocks`` in swizzle order), slices of whole L1 K tiles
  (``GetKIdxBySplitkSliceIdx``: the first ``tiles % factor`` slices one tile longer); every task
  writes its fp32 partial C, and after all cube cores finish the vector cores add the ``factor``
  partials and write C (``SplitkReduceAdd``): the AIVs of every launched core, each an even share
  (the example launches all the share's cube cores, :func:`launched_cores`); INT8's dequant then
  walks C's base blocks, block ``t`` on launched core ``t % launched``
  (``quant_multi_core_splitk_matmul_tla.hpp`` ``operator()<AIV>``).

* ``catlass_single_splitk`` -- CATLASS's single-core split K (``examples/34_single_core_splitk_matmul``;
  ``include/catlass/gemm/kernel/single_core_slicek_matmul.hpp``): blocks of ``L1TileShape<128, 256,
  512>`` (2-byte inputs; other dtypes the arch's base blocks), each core a contiguous range of the
  ``(m, n)`` blocks (``SingleCoreSplitkGemmIdentityBlockSwizzle<20, 0>``: ``GetMNLoopRange``, the
  S-shaped order of :func:`single_splitk_coord`) walked once per L1 K tile, K outermost: a task
  reloads A only when its block row or K tile changes and B only when its column or K tile does,
  and writes its fp32 partial C into a workspace with atomic adds; the vector cores first copy A
  and B from ND into the NZ layout (``PaddingBuilder<PADDING_NZ>`` for row-major inputs) and, after
  the cube, cast the workspace into C (``RemovePaddingNDAndCast``), each behind an all-core barrier.

Units: elements (block sizes, K), counts (cores, blocks).
"""

from __future__ import annotations

from npusim.arch.schema import GEMM_KERNELS as KERNELS  # noqa: F401 (the names, for callers)

#: ops-nn matmul_v3_base_tiling.cpp, L0C of 128 KB (Atlas A2 / A3)
_MN_BASIC = ((64, 64), (128, 128), (128, 256))  # CALC_MN_BASIC's baseM, baseN
_SMALL_SHAPE = 256  # SMALL_SHAPE_THRES
_SMALL_LOWER = 128  # SMALL_SHAPE_LOWER_THRES
_L0C_ELEMS = 32768  # L0C_THRES: baseM x baseN (fp32 accumulators in 128 KB)
_ALIGN = 16  # BASIC_ALIGN_16


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _align(x: int) -> int:
    return _cdiv(x, _ALIGN) * _ALIGN


def aclnn_base(m: int, n: int, cores: int) -> tuple[int, int]:
    """(baseM, baseN) MatMulV3 gives an ``m x n`` output on ``cores`` cube cores (module docstring)."""
    bm, bn = 128, 256  # SetBaseBlockTiling
    few_blocks = _cdiv(m, bm) * _cdiv(n, bn) < cores
    if not (few_blocks or m < _SMALL_SHAPE or n < _SMALL_SHAPE):
        return bm, bn
    best = None
    for max_m, max_n in _MN_BASIC:  # CalcBase<MN_BY_BASE_K>
        bm, bn = max_m, max_n
        m_cnt, n_cnt = _cdiv(m, max_m), _cdiv(n, max_n)
        if m_cnt < n_cnt:  # CalBaseMBaseN
            bn = min(_align(max(n // max(cores // m_cnt, 1), 1)), max_n)
        else:
            bm = min(_align(max(m // max(cores // n_cnt, 1), 1)), max_m)
        bm, bn = _align(min(m, bm)), _align(min(n, bn))
        blocks = _cdiv(m, bm) * _cdiv(n, bn)
        load = (bm + bn) * (blocks // cores) + ((bm + bn) if blocks % cores else 0)
        if best is None or load < best[0]:
            best = (load, bm, bn)
    _, bm, bn = best
    if _SMALL_LOWER < m < _SMALL_SHAPE and bn > _SMALL_LOWER:  # DoSmallShapeTiling, L0C 128 KB
        bn = _SMALL_LOWER
    elif _SMALL_LOWER < n < _SMALL_SHAPE and bm > _SMALL_LOWER:
        bm = _SMALL_LOWER
    elif bm * bn > _L0C_ELEMS:
        bm = _SMALL_LOWER if _SMALL_LOWER < bm < _SMALL_SHAPE else bm
        bn = _SMALL_LOWER if _SMALL_LOWER < bn < _SMALL_SHAPE else bn
    if bm * bn > _L0C_ELEMS:
        bm = _L0C_ELEMS // bn
    return bm, bn


def splitk_factor(blocks: int, k: int, k_tile: int, cores: int) -> int:
    """CATLASS ``GetSplitkFactor``: K slices per base block."""
    factor = cores // blocks if blocks and cores // blocks > 0 else 2
    return max(min(factor, _cdiv(k, k_tile)), 1)


def k_slices(k: int, k_tile: int, factor: int) -> list[int]:
    """The K each slice covers: whole L1 K tiles, the first ``tiles % factor`` slices one tile
    longer (``GetKIdxBySplitkSliceIdx``); the last tile may be short."""
    tiles = _cdiv(k, k_tile)
    sizes, t0 = [], 0
    for s in range(factor):
        count = tiles // factor + (1 if s < tiles % factor else 0)
        sizes.append(min(k, (t0 + count) * k_tile) - t0 * k_tile)
        t0 += count
    return sizes


#: the kernels that launch every cube core of the share whatever their tasks (CATLASS examples
#: 00_basic_matmul/basic_matmul.cpp, 12_quant_matmul/quant_matmul.cpp,
#: 34_single_core_splitk_matmul/single_core_splitk.cpp and
#: 52_quant_multi_core_splitk_matmul_tla/quant_multi_core_splitk_matmul_tla.cpp call
#: ``matmulOp(stream, aicCoreNum, ...)`` with ``aicCoreNum = GetCoreNumAic()``; the cores without a
#: task start and leave). ``aclnn`` launches the cores its tiling uses (``blockDim``), as does
#: CATLASS example 44 (``aicCoreUsed = min(aicCoreNum, taskNum)``, quant_matmul_full_loadA_tla.cpp)
LAUNCH_ALL_CORES = ("catlass_basic", "catlass_splitk", "catlass_single_splitk")


def launched_cores(kernel: str, used: int, cores: int) -> int:
    """The cube cores a GEMM kernel launches (its ``blockDim``) when ``used`` of the share's ``cores``
    get tasks: the whole share for :data:`LAUNCH_ALL_CORES`, else ``used``."""
    return cores if kernel in LAUNCH_ALL_CORES else min(used, cores)


#: CATLASS example 34's tiling and block swizzle offset for 2-byte inputs (single_core_splitk.cpp:
#: ``L1TileShape<128, 256, 512>``, ``SingleCoreSplitkGemmIdentityBlockSwizzle<20, 0>``)
SINGLE_SPLITK_TILE = (128, 256, 512)
SINGLE_SPLITK_SWIZZLE = 20


def single_splitk_ranges(mn_loops: int, cores: int) -> list[tuple[int, int]]:
    """(first block, blocks) of each core: ``GetMNLoopRange`` -- the first ``mn_loops - cores x
    (per - 1)`` cores take ``per = ceil(mn_loops / cores)`` blocks, the rest one fewer."""
    per = _cdiv(mn_loops, cores)
    big = mn_loops - cores * (per - 1)
    return [(c * per, per) if c < big else (big * per + (c - big) * (per - 1), per - 1) for c in range(cores)]


def single_splitk_coord(inner: int, loops_m: int, loops_n: int, offset: int = SINGLE_SPLITK_SWIZZLE
                        ) -> tuple[int, int]:
    """(block row, block column) of block ``inner``: ``SingleCoreSplitkGemmIdentityBlockSwizzle``'s
    ``GetBlockCoord``, direction 0 -- strips of ``offset`` block rows walked column by column,
    every other strip from the last column back, every other column bottom up (an S), a short last
    strip (at most half the offset) merged into the one before."""
    strips = _cdiv(loops_m, offset)
    strip, within = divmod(inner, offset * loops_n)
    tail = loops_m - (strips - 1) * offset
    rows = offset
    if strips >= 2 and strip >= strips - 2 and tail <= offset // 2:
        strips = (loops_m - tail) // offset
        strip = strips - 1
        rows = offset + tail
        within = inner - offset * loops_n * strip
    elif strip == strips - 1:
        rows = loops_m - offset * strip
    col = within // rows
    if strip % 2 == 1:
        col = loops_n - col - 1
    row = strip * offset + within % rows
    if col % 2 == 1:
        row = strip * offset + (rows - within % rows - 1)
    return row, col
