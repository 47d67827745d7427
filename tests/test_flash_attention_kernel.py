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


def _mla_prog(batch: int, kv: int, table: int, cores: int = 24):
    arch = load_arch("ascend-910c-die")
    op = Op("attention", "attention", dtype="bf16", q_len=1, kv_len=kv, heads=16, kv_heads=1, head_dim=576,
            v_head_dim=512, batch=batch, variant="mla", kv_bytes_per_token_override=576 * 2, kv_table_keys=table)
    spec = validate(MappingSpec, {"name": "t", "tensor_parallel": {"degree": cores}, "data_parallel": 1,
                                  "memory": {"weights": "hbm", "kv_cache": "hbm"}}, "test")
    return arch, map_model(Graph("a", [op], phase="decode", batch=batch), arch, spec, cores=list(range(cores)),
                           l2_addressed=False)


def _mla_time(batch: int, kv: int, table: int) -> float:
    from npusim.system.chipcost import ChipCost

    op = Op("attention", "attention", dtype="bf16", q_len=1, kv_len=kv, heads=16, kv_heads=1, head_dim=576,
            v_head_dim=512, batch=batch, variant="mla", kv_bytes_per_token_override=576 * 2, kv_table_keys=table)
    return ChipCost("ascend-910c-die").op(op).time_us


def test_mla_decode_reads_its_kv_on_both_dma_engines():
    """The cached KV of MLA decode is read on each of the core's DMA engines (it went on one: half the
    core's rate, ~49 GB/s of the 910C die's 118)."""
    arch, mapped = _mla_prog(5, 4864, 0)
    prog = mapped.program
    reads = [i for i, n in enumerate(prog.names) if n and n.endswith("read KV")]
    assert arch.cores.dma.engines == 2 and {prog.unit[i] for i in reads} == {"dma0", "dma1"}


@pytest.mark.parametrize("bn, group, kv, table, parts, piece, pieces", [
    (5, 16, 4864, 65536, 4, 16384, 1),   # the msModeling FIA #48 row: a 5 x 512-block table, one piece holds it all
    (5, 16, 4864, 0, 4, 1280, 4),        # no table stated: the table is the sequence, four full pieces
    (16, 4, 4864, 65536, 1, 65536, 1),   # 16 > 0.5 x 24: no split, one core a sequence
    (5, 16, 2047, 65536, 1, 65536, 1),   # several heads a KV head: no split below 2048 keys
    (1, 1, 1024, 0, 2, 512, 2),          # one head a KV head: pieces of at least 512 of the longest sequence
])
def test_paged_split_follows_ifa_split_bns(bn, group, kv, table, parts, piece, pieces):
    sp = fa.paged_split(bn, group, kv, table, 24)
    assert (sp.parts, sp.piece_keys, sp.pieces) == (parts, piece, pieces)
    assert sum(sp.unit_keys(kv, u) for u in range(sp.pieces)) == kv


def test_a_paged_mla_decode_idles_the_cores_its_empty_pieces_hold():
    """FIA #48's shape: 5 sequences of 4864 keys in a 65,536-key table split into 4 pieces each:
    only the first piece of each sequence holds keys, so 5 cores read KV, each a whole sequence,
    and the op takes at least one core's whole-sequence read at the core's DMA rate."""
    arch, mapped = _mla_prog(5, 4864, 65536)
    prog = mapped.program
    readers = {prog.core[i] for i, n in enumerate(prog.names) if n and n.endswith("read KV")}
    assert len(readers) == 5
    paged, spread_out = _mla_time(5, 4864, 65536), _mla_time(5, 4864, 0)
    arch = load_arch("ascend-910c-die")
    one_core_us = 4864 * 1152 / (118e9) * 1e6  # a sequence's KV at the core's two engines (~118 GB/s)
    assert paged > spread_out and paged > one_core_us


@pytest.mark.parametrize("batch", [1, 5, 12, 13])
def test_paged_mla_decode_never_faster_with_more_keys_while_a_sequence_fits_a_piece(batch):
    """Across the split's thresholds (2048 keys for a split, the piece boundary) with the table of the
    FIA rows (65,536 keys): more keys never take less time while each sequence fits the first pieces
    of the widest split. (Past that the vendor's split itself can get faster: its pieces shrink as
    the longest sequence grows, ``SplitBNS``'s 512-key loop; only an op that states its table
    reaches it, never a step.)"""
    times = [_mla_time(batch, kv, 65536) for kv in (1024, 2047, 2048, 2560, 2816, 2817, 4096)]
    assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:])), times


def test_paged_mla_decode_never_faster_with_more_sequences():
    """Across the split's 0.5 x cores threshold (12 -> 13 sequences on 24 cores) and the piece counts
    it changes (24 // batch), more sequences never take less time."""
    times = [_mla_time(b, 4864, 65536) for b in (1, 2, 4, 5, 6, 8, 12, 13, 16, 24, 25)]
    assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:])), times
