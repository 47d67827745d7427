"""The FlashAttention kernel's mechanisms the mapper lowers (issue 39, attention family):

* P V is stored by the cube and rescaled by the vector side once per logical tile of
  ``flash_attention.TILE_KEYS`` keys (pto-isa TFA ``TILE_S1``), not once per 128-key cube block;
* each working core pays the MIX kernel's extra start (``kernel.mix_start_us`` + ``mix_start_core_us`` x
  working / the die's cores) and the AIC and AIV prologues (the arch's ``kernel`` section), MLA too;
* the step's new keys/values are written by tokens over every core of the group, not by the
  (sequence, KV head) units (one unit: one core wrote them all).
"""

from __future__ import annotations

import math

import pytest

from npusim.arch import load_arch
from npusim.config import validate
from npusim.mapping import flash_attention as fa
from npusim.mapping.mapper import map_model
from npusim.mapping.spec import MappingSpec
from npusim.model.ir import Graph, Op


def _mapped(arch_name: str, q: int, kv: int, cores: int, arch=None):
    arch = arch or load_arch(arch_name)
    op = Op("attention", "attention", dtype="fp16", q_len=q, kv_len=kv, heads=1, kv_heads=1, head_dim=128,
            v_head_dim=128, batch=1)
    spec = validate(MappingSpec, {"name": "t", "tensor_parallel": {"degree": cores}, "data_parallel": 1,
                                  "memory": {"weights": "hbm", "kv_cache": "hbm"}}, "test")
    return map_model(Graph("a", [op], phase="prefill", batch=1), arch, spec, cores=list(range(cores)))


def _task_bytes(prog, suffix: str) -> list[int]:
    return [prog.param[i][0] for i, n in enumerate(prog.names) if n and n.endswith(suffix)]


@pytest.mark.parametrize("blocks, tiles", [(1, 1), (2, 1), (3, 2), (8, 4), (64, 32)])
def test_tiles_per_block_counts_the_units_logical_tiles(blocks, tiles):
    assert fa.TILE_KEYS == 256 and fa.KV_BLOCK == 128
    assert fa.tiles_per_block(blocks) * blocks == pytest.approx(tiles)


def test_the_l2_hand_offs_carry_p_v_once_per_logical_tile():
    """One core, 128 queries x 1024 keys: 8 blocks, 4 logical tiles. Through the L2 the vector side
    reads S (fp32) and the cube P (fp16) per block, and the vector side P V (fp32) per tile."""
    mapped = _mapped("ascend-910b", 128, 1024, 1)
    rows, blocks, tiles = 128, 8, 4
    s_in, p_in, pv_in = blocks * rows * 128 * 4, blocks * rows * 128 * 2, tiles * rows * 128 * 4
    assert mapped.l2_read_bytes == s_in + p_in + pv_in


def test_every_working_core_pays_the_mix_kernels_prologues():
    """8 working cores of the 24-core die: each core's AIC and AIV wait the MIX kernel's extra start,
    1 + 7 x 8 / 24 us (over the cores the kernel is tiled for, here the die's), before their own prologue."""
    arch = load_arch("ascend-910b")
    prog = _mapped("ascend-910b", 1024, 1024, 24).program  # 8 query blocks: 8 working cores
    aic = [i for i, n in enumerate(prog.names) if n and n.endswith("AIC start")]
    aiv = [i for i, n in enumerate(prog.names) if n and n.endswith("AIV start")]
    assert len(aic) == len(aiv) == 8
    cycles = lambda us: int(round(us * 1e3 * arch.clock_ghz))  # noqa: E731
    mix = arch.kernel.mix_start_us + arch.kernel.mix_start_core_us * 8 / arch.num_cores
    assert mix == pytest.approx(1 + 7 / 3)
    assert {prog.param[i][0] for i in aic} == {cycles(arch.kernel.cube_setup_us + mix)}
    assert {prog.param[i][0] for i in aiv} == {cycles(arch.kernel.vector_setup_us + mix)}
    # on a group of 8 cores the same 8 working cores pay the whole start: coreNum is the count the
    # kernel is tiled for, the group's (as a GEMM on a share; session 46)
    prog8 = _mapped("ascend-910b", 1024, 1024, 8).program
    full = arch.kernel.mix_start_us + arch.kernel.mix_start_core_us
    assert {p[0] for p, n in zip(prog8.param, prog8.names) if n and n.endswith("AIC start")} == \
        {cycles(arch.kernel.cube_setup_us + full)}
    # one working core pays 1 + 7 / 24 us
    prog1 = _mapped("ascend-910b", 128, 1024, 24).program
    one = [prog1.param[i][0] for i, n in enumerate(prog1.names) if n and n.endswith("AIV start")]
    assert one == [cycles(arch.kernel.vector_setup_us + 1 + 7 / 24)]
    bare = arch.model_copy(update={"kernel": None})
    prog = _mapped("ascend-910b", 1024, 1024, 24, arch=bare).program
    assert not [n for n in prog.names if n and n.endswith(("AIC start", "AIV start"))]


def test_the_steps_new_kv_is_written_by_tokens_over_every_core():
    """One sequence, one KV head, 4096 tokens on 24 cores: each core writes its ~171 tokens' K/V
    (before: core 0 wrote all 4096 tokens, 2 MB, behind its own pipeline)."""
    mapped = _mapped("ascend-910b", 4096, 4096, 24)
    writes = _task_bytes(mapped.program, "write KV")
    per_token = 2 * 128 * 2  # K and V of one token, one KV head, fp16
    assert len(writes) == 24 and sum(writes) == 4096 * per_token
    assert max(writes) - min(writes) <= per_token and max(writes) == math.ceil(4096 / 24) * per_token


def test_mla_decode_pays_the_mix_start_and_prologues_on_every_core():
    """Absorbed MLA decode (FIA's MLA tiling keys are MIX_AIC_1_1 kernels) split over 24 cores: every
    core's AIC waits 1 + 7 x 24 / 24 us and its prologue before its first KV read; without the arch's
    kernel section there is none."""
    arch = load_arch("ascend-910c-die")
    op = Op("attention", "attention", dtype="bf16", q_len=1, kv_len=4864, heads=16, kv_heads=1, head_dim=576,
            v_head_dim=512, batch=5, variant="mla", kv_bytes_per_token_override=576 * 2)
    spec = validate(MappingSpec, {"name": "t", "tensor_parallel": {"degree": 24}, "data_parallel": 1,
                                  "memory": {"weights": "hbm", "kv_cache": "hbm"}}, "test")

    def prog_of(a):
        return map_model(Graph("a", [op], phase="decode", batch=5), a, spec, cores=list(range(24))).program

    prog = prog_of(arch)
    cycles = lambda us: int(round(us * 1e3 * arch.clock_ghz))  # noqa: E731
    aic = [i for i, n in enumerate(prog.names) if n and n.endswith("AIC start")]
    aiv = [i for i, n in enumerate(prog.names) if n and n.endswith("AIV start")]
    assert len(aic) == len(aiv) == 24
    assert {prog.param[i][0] for i in aic} == {cycles(arch.kernel.cube_setup_us + 8.0)}
    assert {prog.param[i][0] for i in aiv} == {cycles(arch.kernel.vector_setup_us + 8.0)}
    reads = [i for i, n in enumerate(prog.names) if n and n.endswith("read KV")]
    assert reads and all(set(prog.deps[i]) & set(aic) for i in reads)
    bare = prog_of(arch.model_copy(update={"kernel": None}))
    assert not [n for n in bare.names if n and n.endswith(("AIC start", "AIV start"))]
