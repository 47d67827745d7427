"""The L2 reuse model (npusim.hw.memory.l2): LRU stack distances and per-core rates."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from npusim.arch import load_arch
from npusim.arch.schema import L2Cache
from npusim.hw.memory.l2 import Reread, capacity_bytes, core_rate, hit_bytes, hit_latency_cycles

L2 = L2Cache(capacity_mb=192, bandwidth_gbps=7000, core_bytes_per_cycle=110)

rereads = st.lists(st.builds(Reread, st.floats(0, 1e9), st.floats(0, 1e10)), max_size=8)


@given(rereads, st.floats(0, 1e10), st.floats(0, 1e10))
def test_a_larger_cache_never_hits_less(rs, a, b):
    small, large = sorted((a, b))
    assert 0 <= hit_bytes(rs, small) <= hit_bytes(rs, large) <= sum(r.nbytes for r in rs)


def test_a_re_read_hits_exactly_within_the_capacity():
    cap = capacity_bytes(L2)
    assert cap == 192 * 2**20
    assert hit_bytes([Reread(100, cap), Reread(7, cap + 1)], cap) == 100


def test_core_rate_is_the_shared_bandwidth_or_the_core_limit():
    # 7 TB/s at 1.85 GHz is 3,784 B/cycle: 24 readers get 158 each, capped at 110; 48 get 79
    assert core_rate(L2, 1.85, 24, 64.0) == 110
    assert core_rate(L2, 1.85, 48, 64.0) == pytest.approx(7000 / 1.85 / 48)
    assert core_rate(L2, 1.85, 24, 64.0, share=0.5) == pytest.approx(7000 / 1.85 / 48)
    no_core_limit = L2.model_copy(update={"core_bytes_per_cycle": None})
    assert core_rate(no_core_limit, 1.85, 24, 64.0) == 64.0  # the DMA ports' rate, as from HBM


def test_hit_latency_is_optional():
    assert hit_latency_cycles(L2, 1.85) == 0
    assert hit_latency_cycles(L2.model_copy(update={"hit_latency_ns": 100}), 2.0) == 200


def test_the_ascend_presets_carry_the_l2_and_the_others_do_not():
    for name in ("ascend-910b", "ascend-910b4", "ascend-910c-die"):
        arch = load_arch(name)
        assert arch.l2 is not None and arch.l2.capacity_mb == 192 and "L2 Cache Tiling" in arch.l2.source
    assert load_arch("npusim-64c").l2 is None


def _chunk_attention():
    """A GQA prefill chunk against a short cached prefix: 4 query blocks x 32 heads = 128
    FlashAttention units over 24 cores, 4 query heads per KV head."""
    from npusim.model.ir import Op
    return Op(name="L0.attn.attention", kind="attention", layer=0, dtype="bf16", batch=1, q_len=512, kv_len=1536,
              heads=32, kv_heads=8, head_dim=128, causal=True)


def _streamed(op, cores=24):
    """(KV bytes the units stream, S + P + PV bytes one side reads from the other) of the
    FlashAttention split (npusim.mapping.flash_attention): S and P per block, PV per logical tile."""
    from npusim.mapping import flash_attention as fa
    p = fa.plan(op.batch, op.heads, op.kv_heads, op.q_len, op.attended_pairs / (op.batch * op.q_len), cores)
    blocks = p.units * p.blocks_per_unit
    kv = blocks * p.kv_block * 2 * op.head_dim * 2  # K and V of a block, bf16
    tiles = fa.tiles_per_block(p.blocks_per_unit)
    handed = blocks * p.rows * (p.kv_block * 4 + p.kv_block * 2 + op.head_dim * 4 * tiles)  # S fp32, P bf16, PV fp32
    return kv, handed


def test_attention_kv_re_reads_hit_in_the_l2_and_bytes_are_conserved():
    """FlashAttention units of one KV head on many cores read its KV once from HBM between them:
    every other load is an L2 hit (the op's KV fits the L2); what the L2 serves is exactly what HBM
    no longer reads."""
    from npusim.system.chipcost import ChipCost

    arch = load_arch("ascend-910b")  # the cube and vector units sharing a buffer: KV reads only
    arch = arch.model_copy(update={"cores": arch.cores.model_copy(update={"cube_vector_exchange": "local"})})
    op = _chunk_attention()
    with_l2 = ChipCost(arch, persist=False).op(op)
    without = ChipCost(arch.model_copy(update={"l2": None}), persist=False).op(op)
    cached = op.batch * (op.kv_len - op.q_len) * op.kv_bytes_per_token
    kv, _ = _streamed(op)
    share = (op.kv_len - op.q_len) / op.kv_len  # the cached part lives in HBM, the chunk's own K/V on chip
    assert without.l2_read_bytes == 0
    assert without.hbm_read_bytes == pytest.approx(kv * share, rel=0.01)  # every streamed cached byte
    assert with_l2.hbm_read_bytes == pytest.approx(cached, rel=0.01)  # the cached KV once
    assert with_l2.hbm_read_bytes + with_l2.l2_read_bytes == pytest.approx(without.hbm_read_bytes, rel=1e-3)
    assert 0 < with_l2.l2_hit_rate < 1
    assert with_l2.time_us <= without.time_us


def test_decoupled_cube_and_vector_hand_attention_data_over_through_the_l2():
    """On a decoupled core (Ascend's AIC and AIV) flash attention's fp32 scores go to the vector
    unit, its probabilities back and the fp32 PV partial to the vector unit, through global memory,
    and the K/V of the chunk itself are read from there too: with an L2 the hand-offs are L2 reads
    (no HBM bytes), without one HBM reads of the same bytes; either way slower than a shared buffer."""
    from npusim.system.chipcost import ChipCost

    arch = load_arch("ascend-910b")
    assert arch.cores.cube_vector_exchange == "global_memory"
    local = arch.model_copy(update={"cores": arch.cores.model_copy(update={"cube_vector_exchange": "local"})})
    op = _chunk_attention()
    decoupled, shared = ChipCost(arch, persist=False).op(op), ChipCost(local, persist=False).op(op)
    no_l2 = ChipCost(arch.model_copy(update={"l2": None}), persist=False).op(op)
    kv, handed = _streamed(op)
    distinct = op.batch * op.kv_len * op.kv_bytes_per_token  # cached and new K/V, all in global memory
    assert decoupled.hbm_read_bytes == pytest.approx(distinct, rel=0.01)
    assert decoupled.l2_read_bytes == pytest.approx(kv - distinct + handed, rel=0.01)
    assert decoupled.hbm_read_bytes + decoupled.l2_read_bytes == pytest.approx(no_l2.hbm_read_bytes, rel=1e-3)
    assert shared.time_us < decoupled.time_us < no_l2.time_us
