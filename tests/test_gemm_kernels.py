"""The GEMM kernels' tilings (npusim.mapping.gemm_kernels) and ChipCost.gemm's ``kernel``."""

from __future__ import annotations

import pytest

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
