"""The GEMM kernels' tilings (npusim.mapping.gemm_kernels) and ChipCost.gemm's ``kernel``."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.arch import load_arch
from npusim.errors import ConfigError
from npusim.system.chipcost import ChipCost
from npusim.mapping.gemm_kernels import aclnn_base, k_slices, splitk_factor
from npusim.validate.operators import _kernel, _steered


@pytest.fixture(scope="module")
def die():
    return ChipCost("ascend-910c-die", persist=False)


@pytest.mark.parametrize("m, n, cores, base", [
    (4096, 4096, 24, (128, 256)),  # enough blocks, no small side: SetBaseBlockTiling's 128 x 256
    (1, 256, 24, (16, 16)),  # one row, 256 columns: spread over 16 cores in 16-column blocks
    (20, 6144, 24, (32, 256)),  # {128, 256}'s 24 blocks of 32 x 256: the least per-core load
    (256, 256, 24, (48, 64)),  # M side shrunk to spread over the cores (CalBaseMBaseN)
    (160, 6144, 24, (128, 128)),  # 128 < M < 256 caps N at 128 (DoSmallShapeTiling)
])
def test_aclnn_base_blocks_follow_matmul_v3s_rule(m, n, cores, base):
    assert aclnn_base(m, n, cores) == base


def test_split_k_slices_whole_l1_tiles():
    assert splitk_factor(1, 16384, 512, 20) == 20  # cores // blocks
    assert splitk_factor(30, 16384, 512, 20) == 2  # more blocks than cores: 2
    assert splitk_factor(1, 1000, 512, 20) == 2  # at most one slice per L1 K tile
    assert k_slices(16384, 512, 12) == [1536] * 8 + [1024] * 4
    assert sum(k_slices(1000, 512, 2)) == 1000


def test_aclnn_spreads_a_few_block_gemm_over_the_die(die):
    basic = die.gemm(1, 7168, 256, "bf16", kernel="catlass_basic")
    aclnn = die.gemm(1, 7168, 256, "bf16", kernel="aclnn")
    assert basic.cores_used == 1 and aclnn.cores_used == 16
    assert aclnn.time_us < basic.time_us
    assert die.gemm(1, 7168, 256, "bf16").time_us == aclnn.time_us  # the preset's default: aclnn
    assert load_arch("ascend-910c-die").kernel.gemm_default == "aclnn"


def test_split_k_puts_a_one_block_gemm_on_every_core_and_reduces(die):
    basic = die.gemm(128, 16384, 256, "int8", 20, kernel="catlass_basic")
    split = die.gemm(128, 16384, 256, "int8", 20, kernel="catlass_splitk")
    assert basic.cores_used == 1 and split.cores_used == 20
    assert "K split 20 ways" in split.mapping
    assert split.time_us < basic.time_us
    # the reduction is paid: more than the slices' cube work alone
    assert split.time_us > die.gemm(128, 16384 // 20, 256, "int8", 1, kernel="catlass_basic").time_us


def test_an_unknown_kernel_is_one_clear_error(die):
    with pytest.raises(ConfigError, match="GEMM kernel 'cublas'"):
        die.gemm(64, 64, 64, kernel="cublas")


def test_operator_rows_run_the_kernel_they_state_and_steered_rows_are_named():
    assert _kernel("catlass 52_quant_multi_core_splitk_matmul_tla") == "catlass_splitk"
    assert _kernel("catlass BasicMatmul (00, baseline)") == "catlass_basic"
    assert _kernel("PTO GEMMPerformance") == "catlass_basic"
    assert _kernel("MatMulV2 (aclnnMatmul)") is None
    entries = [{"source": "a", "reason": "x"}, {"source": "b", "shape": {"m": 1, "n": 2}, "reason": "y"}]
    assert _steered({"source": "a", "shape": {"m": 5}}, entries)
    assert _steered({"source": "b", "shape": {"n": 2, "m": 1}}, entries)
    assert not _steered({"source": "b", "shape": {"m": 2, "n": 2}}, entries)


def _program(die, m, k, n, dtype, kernel, cores=None, tile=None, swizzle=None):
    """The kernel's program as ChipCost.gemm emits it (its single plan)."""
    from npusim.mapping.gemm_kernel import Planner

    share = die._share(cores)
    planner = Planner(die.arch, share, dtype, "bf16" if dtype == "int8" else dtype, 1.0, None, kernel, tile, swizzle)
    plan = planner.candidates(m, k, n, 1, len(share))[0]
    return plan, die._gemm_program(planner, plan, m, k, n, 1, share)[0]


def test_a_stated_tiling_is_the_kernels_and_a_bad_one_is_an_error():
    die = ChipCost("ascend-910b4", persist=False)
    # CATLASS's tuning guide: 1024 x 576 x 6144 on 20 AIC, L1TileShape<256, 128, 256> -> 20 blocks, one per AIC
    plan, _ = _program(die, 1024, 6144, 576, "fp16", "catlass_basic", tile=(256, 128, 256))
    assert plan.tile == (256, 128) and plan.used == 20 and plan.waves == 1
    default, _ = _program(die, 1024, 6144, 576, "fp16", "catlass_basic")
    assert default.tile == (128, 256) and default.waves == 2  # 24 blocks on 20 AIC
    tuned = die.gemm(1024, 6144, 576, "fp16", kernel="catlass_basic", tile=(256, 128, 256))
    assert tuned.time_us < die.gemm(1024, 6144, 576, "fp16", kernel="catlass_basic").time_us
    # the swizzle the row states orders the blocks (direction 1: strips of block columns, row by row)
    from npusim.mapping.gemm_kernel import Planner

    order = {sw: Planner(die.arch, list(range(20)), "fp16", "fp16", 1.0, None, "catlass_basic", None, sw)
             .base_order(160, 2048, 6144, 1, 20)[3][:3] for sw in ((3, 0), (4, 1))}
    assert order[(3, 0)] == [(0, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0)]
    assert order[(4, 1)] == [(0, 0, 0, 0), (0, 0, 1, 0), (0, 0, 2, 0)]
    with pytest.raises(ConfigError, match="exceed the L0C"):
        die.gemm(256, 512, 256, "fp16", kernel="catlass_basic", tile=(256, 256, 256))
    with pytest.raises(ConfigError, match="L1"):
        die.gemm(256, 512, 256, "fp16", kernel="catlass_basic", tile=(128, 128, 2048))
    with pytest.raises(ConfigError, match="swizzle"):
        die.gemm(256, 512, 256, "fp16", kernel="catlass_basic", swizzle=(0, 2))
    with pytest.raises(ConfigError, match="no base-block GEMM kernel"):
        ChipCost("npusim-64c", persist=False).gemm(256, 512, 256, "fp16", tile=(128, 256, 256))


def test_operator_rows_pass_the_tiling_they_state():
    from npusim.validate.published import published

    rows = [r for r in published()["operators"]["rows"] if r.get("source") == "catlass-matmul-tuning-doc"]
    stated = {(r["shape"]["m"], r["measured_us"]): (r.get("tile"), r.get("swizzle")) for r in rows}
    assert stated[(1024, 48.6)] == ([256, 128, 256], None)
    assert stated[(1, 15.5)] == ([16, 32, 1024], None)
    assert stated[(160, 35.3)] == ([128, 256, 256], [4, 1])


def test_an_int8_catlass_kernel_dequantises_on_its_vector_side(die):
    """CATLASS's quant kernels: the cube writes int32 C to an L2 workspace, the AIVs dequantise it
    into bf16 D (kernel/quant_matmul.hpp); aclnn's INT8 GEMM keeps the fixpipe's bf16 write."""
    _, prog = _program(die, 512, 2048, 1024, "int8", "catlass_basic")
    dequant = [i for i, nm in enumerate(prog.names) if nm.endswith("dequant")]
    assert dequant and all(prog.unit[i] == "vector" for i in dequant)
    assert any(nm.endswith("AIV start") for nm in prog.names)
    _, fp16 = _program(die, 512, 2048, 1024, "fp16", "catlass_basic")
    assert not any("dequant" in nm for nm in fp16.names)
    _, aclnn = _program(die, 512, 2048, 1024, "int8", "aclnn")
    assert not any("dequant" in nm for nm in aclnn.names)
    r = die.gemm(512, 2048, 1024, "int8", kernel="catlass_basic")
    assert r.hbm_write_bytes == 512 * 1024 * 2  # only bf16 D reaches HBM: the int32 workspace stays in the L2
    # split K (example 52): the partials reduced, then an all-core barrier, then the dequant
    _, split = _program(die, 16, 7168, 2048, "int8", "catlass_splitk")
    names = split.names
    barrier = names.index(next(nm for nm in names if nm.endswith("split-K reduce barrier")))
    assert any(nm.endswith("split-K reduce add") for nm in names[:barrier])
    assert any(nm.endswith("dequant") for nm in names[barrier:])


@settings(max_examples=60, deadline=None)
@given(loops_m=st.integers(1, 70), loops_n=st.integers(1, 40), offset=st.integers(1, 24), cores=st.integers(1, 24))
def test_single_core_split_k_visits_every_block_once(loops_m, loops_n, offset, cores):
    from npusim.mapping.gemm_kernels import single_splitk_coord, single_splitk_ranges

    coords = [single_splitk_coord(t, loops_m, loops_n, offset) for t in range(loops_m * loops_n)]
    assert sorted(coords) == [(i, j) for i in range(loops_m) for j in range(loops_n)]
    ranges = single_splitk_ranges(loops_m * loops_n, cores)
    assert sum(c for _, c in ranges) == loops_m * loops_n
    assert all(a + c == b for (a, c), (b, _) in zip(ranges, ranges[1:]))
    assert max(c for _, c in ranges) - min(c for _, c in ranges) <= 1


def test_single_core_split_k_is_example_34s_kernel():
    """CATLASS example 34 on the 910B: 128 x 256 x 512 blocks, a range of blocks per core walked once
    per K tile (A reloaded per block, B per column), fp32 partials into an L2 workspace, the ND->NZ
    copies and the cast on the vector cores: less operand traffic than the basic kernel's, so faster
    on a long-K GEMM, and never faster than the cube's peak."""
    die = ChipCost("ascend-910b", persist=False)
    plan, prog = _program(die, 2048, 4000, 4096, "fp16", "catlass_single_splitk")
    assert plan.tile == (128, 256) and plan.k_chunk == 512 and plan.splitk == 8 and plan.used == 24
    names = prog.names
    assert any(nm.endswith("ND->NZ barrier") for nm in names) and any(nm.endswith("cast C Cast") for nm in names)
    single = die.gemm(2048, 4000, 4096, "fp16", kernel="catlass_single_splitk")
    basic = die.gemm(2048, 4000, 4096, "fp16", kernel="catlass_basic")
    assert single.time_us < basic.time_us and single.compute_utilization < 1.0
    with pytest.raises(ConfigError, match="batch 1"):
        die.gemm(256, 512, 256, "fp16", batch=2, kernel="catlass_single_splitk")
    assert _kernel("catlass SingleCoreSplitkMatmul (34)") == "catlass_single_splitk"


def test_a_mix_kernel_pays_its_extra_start():
    """CATLASS select_kernel_b16.h's MIX start (1 + 7 x launched / available cube cores, us) on the
    kernels that launch AIVs; an INT8 GEMM with a bf16 output is QuantBatchMatmulV3's UB-dequant MIX
    kernel, with an INT8 output its fix-pipe quantises (pure cube)."""
    from npusim.mapping.gemm_kernel import is_mix_kernel, mix_start_us

    arch = load_arch("ascend-910c-die")
    assert mix_start_us(arch, 24, 24) == pytest.approx(8.0) and mix_start_us(arch, 6, 24) == pytest.approx(2.75)
    assert mix_start_us(arch, 6, 6) == pytest.approx(8.0)  # the share a core limit leaves is what the tiling sees
    assert mix_start_us(arch, 48, 24) == pytest.approx(8.0)  # launched cores beyond the tiled-for count: clipped
    assert is_mix_kernel("aclnn", "int8", "bf16") and not is_mix_kernel("aclnn", "int8", "int8")
    assert not is_mix_kernel("aclnn", "bf16", "bf16") and not is_mix_kernel("catlass_basic", "bf16", "bf16")
    assert is_mix_kernel("catlass_splitk", "bf16", "bf16") and is_mix_kernel("catlass_basic", "int8", "bf16")
    cc = ChipCost(arch, persist=False)
    mix, pure = cc.gemm(16, 2048, 4096, "int8"), cc.gemm(16, 2048, 4096, "int8", out_dtype="int8")
    assert mix.cores_used == pure.cores_used
    assert mix.kernel_fixed_us - pure.kernel_fixed_us == pytest.approx(mix_start_us(arch, mix.cores_used, 24), abs=1e-3)
    assert mix.time_us - pure.time_us >= mix_start_us(arch, mix.cores_used, 24) - 1e-3


def test_a_catlass_mix_kernel_pays_the_start_of_every_core_it_launches():
    """CATLASS's examples launch every cube core (``matmulOp(stream, aicCoreNum, ...)``), so a split-K
    GEMM of a few tasks pays headCost for the whole share and all their AIVs share the reduce
    (SplitkReduceAdd); aclnn launches only the cores its tiling uses (its blockDim)."""
    from npusim.mapping.gemm_kernel import mix_start_us
    from npusim.mapping.gemm_kernels import launched_cores

    assert launched_cores("catlass_splitk", 2, 20) == 20 and launched_cores("catlass_single_splitk", 5, 24) == 24
    assert launched_cores("aclnn", 6, 24) == 6 and launched_cores("aclnn", 30, 24) == 24
    arch = load_arch("ascend-910b4")
    cc = ChipCost(arch, persist=False)
    few = cc.gemm(128, 1024, 256, "int8", kernel="catlass_splitk")  # 1 block x 2 K slices: 2 of 20 AICs work
    assert few.plan[8] == 2 and few.cores_used == 20  # ... and every launched core's AIVs reduce
    setup = arch.kernel.start_us + arch.kernel.cube_setup_us
    assert few.kernel_fixed_us == pytest.approx(setup + mix_start_us(arch, 20, 20), abs=1e-3)


@pytest.mark.parametrize("axis, sizes", [
    ("k", (512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 10240, 16384)),  # 1 -> 20 K slices
    ("m", (16, 64, 128, 192, 256, 384, 512, 768, 1024, 1280)),  # blocks 1 -> 10: fewer slices each
    ("n", (64, 128, 256, 384, 512, 1024, 1536, 2048, 3072)),
])
def test_catlass_splitk_never_gets_faster_as_a_dimension_grows(axis, sizes):
    """The split-K kernel across its branch points (K slices per block = cores // blocks, at most the
    K tiles; the blocks and the cores with tasks change with M, N and K): never faster for a larger
    M, N or K on the 910B4's 20 cube cores (CATLASS example 52's shapes, from 128 x 4096 x 256)."""
    cc = ChipCost("ascend-910b4", persist=False)
    shape = {"m": 128, "k": 4096, "n": 256}
    times = [cc.gemm(*(size if d == axis else shape[d] for d in "mkn"), "int8", kernel="catlass_splitk").time_us
             for size in sizes]
    assert all(b >= a * (1 - 1e-9) for a, b in zip(times, times[1:])), times


@pytest.mark.parametrize("share", [24, 12, 6])
def test_gemm_and_attention_mix_starts_share_one_denominator(share):
    """CATLASS select_kernel_b16.h GetPaddingTag takes both the launched AICs (blockDimAic = min(tasks,
    coreNum)) and headCost's denominator from one ``platformInfo.coreNum`` (platform_info.h:
    GetCoreNumAic(), the count the kernel is tiled for). A MIX GEMM tiled for a share of the die's
    cores and an attention kernel on a group of as many cores pay the same extra start for the same
    cores launched; it grows with the cores launched and never falls as the share shrinks."""
    from npusim.mapping.gemm_kernel import Planner
    from npusim.mapping.mapper import attention_mix_start_us

    arch = load_arch("ascend-910c-die")
    # aclnn (the preset's default kernel) launches the cores with tasks; CATLASS's examples launch the
    # whole share (gemm_kernels.launched_cores, test above), so their start does not follow ``used``
    planner = Planner(arch, list(range(share)), "int8", "bf16", 1.0, gemm_kernel="aclnn")
    assert planner.mix()
    starts = []
    for used in range(1, share + 1):
        gemm = planner.mix_start_us(used)
        assert gemm == pytest.approx(attention_mix_start_us(arch, used, share))
        assert gemm == pytest.approx(1.0 + 7.0 * used / share)
        assert gemm >= attention_mix_start_us(arch, used, arch.num_cores) - 1e-12  # fewer cores: never a smaller start
        starts.append(gemm)
    assert starts == sorted(starts) and starts[-1] == pytest.approx(8.0)
