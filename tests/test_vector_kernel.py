"""The Ascend vector core as mechanisms (issue 39 item 2, :mod:`npusim.hw.compute.vector_kernel`
and :meth:`npusim.system.chipcost.ChipCost.vector`): a copy issues no vector instruction; a
vector op is never faster than its GM <-> UB bytes at the core's load bandwidth (MTE2 / MTE3 on
the core's DMA engines) nor than its instructions at the vector width; never faster as its
elements grow; a class with no calibration row is costed by its instructions; the derived
constants are what ``npusim calibrate --only die`` recomputes."""

from __future__ import annotations

import math

import pytest

from npusim.hw.compute.vector_kernel import setup_share

from npusim.arch import load_arch
from npusim.model.ir import Op
from npusim.system.chipcost import ChipCost

DIE = "ascend-910b"
HBM_SLACK = 0.02  # see test_a_vector_op_never_gets_faster_as_its_elements_grow


@pytest.fixture(scope="module")
def cost():
    return ChipCost(DIE, persist=False)


def _op(op_class, rows, row_len, fn=None):
    return Op("v", "vector", dtype="bf16", elements=rows * row_len, op_class=op_class, fn=fn, row_len=row_len)


def test_a_copy_charges_no_vector_instruction(cost):
    from npusim.hw.compute.vector_kernel import aiv_tile_cycles, instructions

    assert instructions("copy") == []
    assert aiv_tile_cycles("copy", None, 64, 4096, cycles_per_repeat=2.0, instruction_cycles=8) == 0
    res = cost.vector(_op("copy", 4096, 4096))
    assert "copy: MTE2 and MTE3 only" in res.mapping
    # ten times slower vector instructions: a copy's time does not move, an Add's does
    from npusim.validate.die_calibration import _variant

    arch = load_arch(DIE)
    slow = ChipCost(_variant(arch, {"vector_cycles_per_repeat": 10 * arch.kernel.vector_cycles_per_repeat,
                                    "vector_instruction_cycles": 10 * arch.kernel.vector_instruction_cycles}),
                    persist=False)
    assert slow.vector(_op("copy", 4096, 4096)).time_us == pytest.approx(res.time_us, rel=1e-9)
    assert slow.vector(_op("elementwise", 4096, 4096)).time_us > cost.vector(_op("elementwise", 4096, 4096)).time_us


@pytest.mark.parametrize("op_class,fn", [("copy", None), ("elementwise", None), ("rmsnorm", None),
                                         ("activation", "swiglu"), ("quantize", None), ("softmax", None)])
@pytest.mark.parametrize("rows,row_len", [(8, 7168), (512, 4096), (4096, 4096)])
def test_a_vector_op_never_beats_its_gm_ub_bytes_at_the_cores_load_bandwidth(cost, op_class, fn, rows, row_len):
    """The busiest core moves its rows in (every input: a SwiGLU's gate and up) and out through its
    DMA engines at ``dma.engines x dma.bytes_per_cycle``, after the kernel's start."""
    arch = load_arch(DIE)
    kc = arch.kernel
    res = cost.vector(_op(op_class, rows, row_len, fn))
    core_rows = math.ceil(rows / min(rows, arch.num_cores))
    inputs = 2 if fn == "swiglu" else 1
    out_bytes = 1 if op_class == "quantize" else 2
    nbytes = core_rows * row_len * (2 * inputs + out_bytes)
    port = arch.cores.dma.engines * arch.cores.dma.bytes_per_cycle  # bytes per core cycle
    aivs = arch.num_cores * kc.vector_cores_per_core  # the AIVs' prologue at the AIVs launched (one a row)
    setup_us = kc.vector_setup_us * setup_share(min(rows, aivs), aivs, kc.mix_start_us, kc.mix_start_core_us)
    floor_us = kc.start_us + setup_us + nbytes / port / (arch.clock_ghz * 1e3)
    assert res.time_us >= floor_us * (1 - 1e-9)
    total = rows * row_len * (2 * inputs + out_bytes)
    assert res.time_us >= total / (res.hbm_peak_bandwidth_gbps * 1e3) * (1 - 1e-9)


@pytest.mark.parametrize("op_class,fn", [("copy", None), ("transpose", None), ("rmsnorm", None),
                                         ("activation", "swiglu"), ("rope", None), ("layernorm", None)])
def test_a_vector_op_never_gets_faster_as_its_elements_grow(cost, op_class, fn):
    """Within :data:`HBM_SLACK`: an op bound by its HBM streams (a copy, a transpose) can gain up
    to ~1.3% from a few more rows (2040 -> 2050 rows of 2048: 16.29 -> 16.09 us), the simulated
    HBM serving the new transfers' addresses (channel and bank interleave) a little better."""
    times = [cost.vector(_op(op_class, rows, row_len, fn)).time_us
             for rows, row_len in [(1, 1024), (9, 1024), (48, 1024), (49, 1024), (512, 1024), (512, 2048),
                                   (2048, 2048), (2049, 2048), (8192, 2048)]]
    assert all(b >= a * (1 - HBM_SLACK) for a, b in zip(times, times[1:])), times


def test_a_class_without_a_row_is_costed_by_its_instructions():
    """Softmax (no calibration row) costs its own instruction list at the derived constants: more
    instructions, more cycles; the same tile with one more instruction costs one more start and
    one more pass of repeats."""
    from npusim.hw.compute.vector_kernel import RECIPES, Instr, aiv_tile_cycles, instructions

    kc = load_arch(DIE).kernel
    args = dict(cycles_per_repeat=kc.vector_cycles_per_repeat, instruction_cycles=kc.vector_instruction_cycles)
    soft = aiv_tile_cycles("softmax", None, 16, 4096, **args)
    add = aiv_tile_cycles("elementwise", None, 16, 4096, **args)
    assert len(instructions("softmax")) > len(instructions("elementwise")) and soft > add
    base = aiv_tile_cycles("exp", None, 16, 4096, **args)
    RECIPES["exp"].append(Instr("extra"))
    try:
        more = aiv_tile_cycles("exp", None, 16, 4096, **args)
    finally:
        RECIPES["exp"].pop()
    one_more = kc.vector_instruction_cycles + 16 * 4096 / 64 * kc.vector_cycles_per_repeat
    assert more - base == pytest.approx(one_more, abs=1)


def test_the_vector_constants_are_what_the_calibration_half_gives():
    """``npusim calibrate --only die --check``'s vector constants, recomputed: 0 drifted."""
    from npusim.validate.die_calibration import vector_costs

    kc = load_arch(DIE).kernel
    got = vector_costs()
    assert kc.vector_cycles_per_repeat == pytest.approx(got["vector_cycles_per_repeat"], rel=1e-3)
    assert kc.vector_instruction_cycles == pytest.approx(got["vector_instruction_cycles"], rel=1e-3)
    assert kc.vector_setup_us == pytest.approx(got["vector_setup_us"], rel=1e-3)


# -- session 42: the vendor kernels' tiling over AIVs and through the UB ----------------------------

def test_rows_are_split_over_every_aiv_as_the_vendor_tiling_splits_them():
    """ops-nn RmsNorm: blockFactor = ceil(rows / AIVs) rows each, ceil(rows / blockFactor) AIVs used."""
    from npusim.hw.compute.vector_kernel import split_rows

    assert split_rows(515, 48) == [11] * 46 + [9]
    assert split_rows(9, 48) == [1] * 9
    assert split_rows(96, 48) == [2] * 48
    assert sum(split_rows(12345, 40)) == 12345
    with pytest.raises(ValueError):
        split_rows(0, 48)


def test_rmsnorm_walks_its_rows_through_one_ub_buffer_as_its_tiling_says():
    """rms_norm_tiling.cpp MODE_MERGE_N: (192 KiB - 1 KiB) / (numColAlign * 16 + 260) rows per loop,
    BUFFER_NUM 1; DynamicQuant: a double-buffered input and a single output."""
    from npusim.hw.compute.vector_kernel import ub_tiling

    t = ub_tiling("rmsnorm", 1536, 2, 2, 192 * 1024)
    assert (t.rows, t.in_buffers, t.out_buffers) == ((192 * 1024 - 1024) // (1536 * 16 + 260), 1, 1) == (7, 1, 1)
    assert ub_tiling("rmsnorm", 1530, 2, 2, 192 * 1024).rows == 7  # 1530 aligned to 1536
    assert ub_tiling("rmsnorm", 60000, 2, 2, 192 * 1024).rows == 1  # at least one row
    q = ub_tiling("quantize", 2304, 2, 1, 192 * 1024)
    assert (q.in_buffers, q.out_buffers) == (2, 1)


def test_dynamic_quant_issues_its_instructions_once_per_row():
    """DynamicQuantDbOpt::ProcessSymmetric issues every instruction per row: doubling the rows at a
    fixed row length adds at least ten instruction starts per added row."""
    from npusim.hw.compute.vector_kernel import aiv_tile_cycles

    args = dict(cycles_per_repeat=0.0, instruction_cycles=1.0)  # count instruction starts only
    starts = aiv_tile_cycles("quantize", None, 20, 2304, **args) - aiv_tile_cycles("quantize", None, 10, 2304, **args)
    assert starts >= 10 * 10



def test_rmsnorm_picks_its_kernel_by_soc_and_row_length_as_its_tiling_does():
    """rms_norm_tiling.cpp: MERGE_N only on ASCEND910B with numColAlign <= 2000; an A3 die
    (ASCEND910_93) and longer rows run MODE_NORMAL (rms_norm.h), one row per loop, one buffer each."""
    from npusim.hw.compute.vector_kernel import rmsnorm_mode, ub_tiling

    assert rmsnorm_mode(1536, "ascend910b") == "merge_n"
    assert rmsnorm_mode(2000, "ascend910b") == "merge_n" and rmsnorm_mode(2001, "ascend910b") == "normal"
    assert rmsnorm_mode(128, "ascend910_93") == rmsnorm_mode(7168, "ascend910_93") == "normal"
    assert rmsnorm_mode(12289, "ascend910_93") == "split_d"
    with pytest.raises(ValueError):
        rmsnorm_mode(1536, "ascend310p")
    t = ub_tiling("rmsnorm", 1536, 2, 2, 192 * 1024, soc="ascend910_93")
    assert (t.rows, t.in_buffers, t.out_buffers) == (1, 1, 1)
    assert ub_tiling("rmsnorm", 1536, 2, 2, 192 * 1024, soc="ascend910b").rows == 7
    # AddRmsNorm has its own tiling: not switched by RmsNorm's rule
    assert ub_tiling("rmsnorm", 1536, 4, 4, 192 * 1024, soc="ascend910_93", fn="add").rows > 1
    assert load_arch("ascend-910c-die").kernel.soc_version == "ascend910_93"
    assert load_arch("ascend-910b").kernel.soc_version == "ascend910b"


def test_rmsnorm_normal_reduces_by_halves_and_pays_its_instructions_per_row():
    """rms_norm.h / rms_norm_base.h ReduceSumHalfInterval: a tail Add beyond the largest power of two,
    then Adds of halves down to 64 floats (1536: 512 tail, 1024 -> 64 in 4 halvings), then one
    WholeReduceSum; every instruction is issued once per row, so row-by-row costs at least as much
    as MERGE_N's tile-wide instructions and grows by the same starts for every added row."""
    from npusim.hw.compute.vector_kernel import aiv_tile_cycles, instructions

    ins = instructions("rmsnorm", row_len=1536, soc="ascend910_93")
    adds = [i for i in ins if i.name.startswith("Add")]
    assert [round(i.fraction * 1536) for i in adds] == [512, 512, 256, 128, 64]
    assert sum(i.scope == "rowsync" for i in ins) == 2 and all(i.scope != "tile" for i in ins)
    assert instructions("rmsnorm", row_len=1536, soc="ascend910b") == instructions("rmsnorm")
    args = dict(cycles_per_repeat=2.0, instruction_cycles=22.0)
    normal = [aiv_tile_cycles("rmsnorm", None, r, 1536, soc="ascend910_93", **args) for r in (1, 2, 3)]
    merge = [aiv_tile_cycles("rmsnorm", None, r, 1536, soc="ascend910b", **args) for r in (1, 2, 3)]
    assert normal[0] >= merge[0] and normal[2] - normal[1] == normal[1] - normal[0] > merge[2] - merge[1]
    starts = aiv_tile_cycles("rmsnorm", None, 1, 1536, soc="ascend910_93", cycles_per_repeat=0.0,
                             instruction_cycles=1.0)
    assert starts == len(ins) + math.ceil(math.log2(64))  # one start per instruction, + the cross-lane tree


def test_an_a3_rmsnorm_is_slower_than_the_same_rows_merged():
    """The same die with the 910B's SoC version (MERGE_N, up to 7 rows of 1536 per loop) runs a
    256 x 1536 RmsNorm faster than with the A3's (MODE_NORMAL, one row per loop)."""
    from npusim.validate.die_calibration import _variant

    op = _op("rmsnorm", 256, 1536)
    a3 = ChipCost("ascend-910c-die", persist=False).vector(op).time_us
    as_910b = ChipCost(_variant(load_arch("ascend-910c-die"), {"soc_version": "ascend910b"}), persist=False)
    assert a3 > as_910b.vector(op).time_us


# -- session 46: the AIVs a kernel launches and their prologue ----------------------------------------

def test_the_vendor_tilings_launch_one_aiv_a_row_and_ascend_quant_v2_every_aiv():
    """ops-nn DynamicQuant / RmsNorm: one AIV per row up to the die's; AscendQuantV2's tiling sets the
    block dim to the platform's AIV count (ascend_quant_v2_tiling.cpp WriteTilingData)."""
    from npusim.hw.compute.vector_kernel import launched_aivs

    assert [launched_aivs("quantize", None, r, 48) for r in (1, 9, 48, 49, 4096)] == [1, 9, 48, 48, 48]
    assert [launched_aivs("quantize", "ascend_quant_v2", r, 48) for r in (1, 9, 4096)] == [48, 48, 48]
    with pytest.raises(ValueError):
        launched_aivs("rmsnorm", None, 0, 48)


def test_the_prologue_share_follows_catlass_headcost_shape():
    """(1 + 7 n / N) / 8 of the full-die prologue; 1 at N; never above 1; no shape cited: 1."""
    assert setup_share(48, 48, 1.0, 7.0) == pytest.approx(1.0)
    assert setup_share(1, 48, 1.0, 7.0) == pytest.approx((1 + 7 / 48) / 8)
    assert setup_share(96, 48, 1.0, 7.0) == pytest.approx(1.0)
    assert setup_share(1, 48, 0.0, 0.0) == 1.0
    shares = [setup_share(n, 48, 1.0, 7.0) for n in range(1, 49)]
    assert all(b > a for a, b in zip(shares, shares[1:]))
    with pytest.raises(ValueError):
        setup_share(0, 48, 1.0, 7.0)


def test_a_one_row_kernel_pays_a_smaller_prologue_than_ascend_quant_v2_on_the_same_row():
    """The same instructions and bytes (both the ``quantize`` list): the kernel that launches one AIV
    is faster than AscendQuantV2, which launches all 48 of an A3 die, by the prologue's difference."""
    arch = load_arch("ascend-910c-die")
    kc = arch.kernel
    cc = ChipCost(arch, persist=False)
    one = cc.vector(_op("quantize", 1, 7168))
    full = cc.vector(_op("quantize", 1, 7168, "ascend_quant_v2"))
    aivs = arch.num_cores * kc.vector_cores_per_core
    gap = kc.vector_setup_us * (1 - setup_share(1, aivs, kc.mix_start_us, kc.mix_start_core_us))
    assert "1 AIVs launched" in one.mapping and f"{aivs} AIVs launched" in full.mapping
    assert full.time_us - one.time_us == pytest.approx(gap, abs=2e-3)


@pytest.mark.parametrize("op_class,fn", [("quantize", None), ("quantize", "ascend_quant_v2"), ("rmsnorm", None),
                                         ("elementwise", None), ("activation", "swiglu")])
@pytest.mark.parametrize("die", ["ascend-910b", "ascend-910c-die"])
def test_a_vector_op_never_gets_faster_across_the_launched_aivs_threshold(op_class, fn, die):
    """Rows 1..96 of 1536 and 7168 across the die's 48 AIVs: the prologue grows with the AIVs launched
    up to 48 rows and stays there beyond (RmsNorm's tiling launches 25 AIVs at 49 rows; the prologue
    is charged at 48 there, so one more row never makes the kernel faster). Not a copy: a TensorMove of
    48 -> 49 rows of 1536 on the A3 die falls 2.0% (5.842 -> 5.724 us) with or without this prologue
    (24 cores streaming at once against 13; the HBM model's, see HBM_SLACK)."""
    cc = ChipCost(die, persist=False)
    for row_len in (1536, 7168):
        times = [cc.vector(_op(op_class, rows, row_len, fn)).time_us
                 for rows in (1, 2, 8, 16, 24, 32, 40, 47, 48, 49, 50, 64, 95, 96, 97)]
        assert all(b >= a * (1 - HBM_SLACK) for a, b in zip(times, times[1:])), (row_len, times)


# -- session 46: a softmax row the UB cannot hold ------------------------------------------------------

def test_a_softmax_row_beyond_the_ub_is_cut_into_even_chunks():
    """The generic tiling's half UB at 2 + 2 bytes an element holds 24576 elements of 192 KiB: beyond,
    as few chunks as hold the row, of even size in whole 64-element repeats; not for other classes."""
    from npusim.hw.compute.vector_kernel import softmax_chunks

    ub = 192 * 1024
    assert softmax_chunks("softmax", 24576, 2, 2, ub) is None
    assert softmax_chunks("softmax", 24640, 2, 2, ub) == (12352, 2)
    assert softmax_chunks("softmax", 151936, 2, 2, ub) == (21760, 7)
    assert softmax_chunks("rmsnorm", 151936, 2, 2, ub) is None
    chunk, n = softmax_chunks("softmax", 100_001, 2, 2, ub)
    assert chunk * n >= 100_001 and chunk % 64 == 0 and chunk <= 24576


def test_a_split_softmax_reads_its_row_twice_and_never_gets_faster_as_the_row_grows():
    """Two passes (SoftmaxFlashV2's running max and sum, then the outputs): the input crosses from
    global memory twice; across the UB threshold (24576 elements) the time only grows."""
    cc = ChipCost("ascend-910c-die", persist=False)
    lens = [8192, 24512, 24576, 24640, 32768, 49152, 49216, 100_000, 151936]
    res = [cc.vector(_op("softmax", 16, n)) for n in lens]
    times = [r.time_us for r in res]
    assert all(b >= a for a, b in zip(times, times[1:])), times
    big = res[-1]
    assert "read twice" in big.mapping and "read twice" not in res[2].mapping
    assert big.hbm_read_bytes + big.l2_read_bytes >= 2 * 16 * 151936 * 2


def test_interleave_rope_splits_as_its_tiling_does():
    """ops-transformer interleave_rope_tiling.cpp (B11D): by batch when B >= min(AIVs, N x S), else by
    heads with every block walking every batch; a batch's heads in loops of 63 on a 192 KiB UB."""
    from npusim.hw.compute.vector_kernel import interleave_rope_split

    ub = 192 * 1024
    s = interleave_rope_split(2048, 16, 48, ub)  # DSV3 prefill q_pe: ceil(2048 / 48) = 43 batches a block
    assert (s.axis, s.blocks, max(s.loops), s.heads, sum(s.loops)) == ("batch", 48, 43, 16, 2048)
    s = interleave_rope_split(5, 16, 48, ub)  # decode, B < N x S: 16 blocks of one head, each all 5 batches
    assert (s.axis, s.blocks, s.loops, s.heads) == ("ns", 16, (5,) * 16, 1)
    assert interleave_rope_split(16, 16, 48, ub).axis == "batch"  # B >= N x S
    s = interleave_rope_split(49, 16, 48, ub)  # B >= AIVs: two a block, 25 blocks
    assert (s.axis, s.blocks, max(s.loops)) == ("batch", 25, 2)
    s = interleave_rope_split(2, 128, 48, ub)  # ceil(128 / 48) = 3 heads a block, 43 blocks
    assert (s.axis, s.blocks, s.heads) == ("ns", 43, 3)
    s = interleave_rope_split(64, 128, 48, ub)  # 128 heads a batch in loops of 63: 3 loops a batch
    assert (s.heads, max(s.loops)) == (63, 2 * 3)
    with pytest.raises(ValueError):
        interleave_rope_split(0, 16, 48, ub)


def test_an_interleave_rope_walks_its_batches_one_loop_at_a_time():
    """On the heads split every block walks every batch in turn: 14 more batches cost at least 14 of
    its loops' instructions (interleave_rope_b11d.h Rope, single-buffered), on the blocks its tiling
    launches."""
    from npusim.hw.compute.vector_kernel import aiv_tile_cycles

    die = "ascend-910c-die"
    kc, clock = load_arch(die).kernel, load_arch(die).clock_ghz
    cc = ChipCost(die, persist=False)
    one, many = (cc.vector(_op("rope", b, 16 * 64, "interleave")) for b in (1, 15))
    assert "split by ns: 16 AIVs" in many.mapping and "15 single-buffered loops of 1 heads" in many.mapping
    loop_us = aiv_tile_cycles("rope", "interleave", 1, 64, cycles_per_repeat=kc.vector_cycles_per_repeat,
                              instruction_cycles=kc.vector_instruction_cycles) / (clock * 1e3)
    assert many.time_us - one.time_us >= 14 * loop_us
    with pytest.raises(Exception, match="row_len"):
        cc.vector(_op("rope", 4, 100, "interleave"))  # a row is whole heads of 64


def test_an_interleave_rope_never_gets_faster_as_its_batches_grow():
    """Across its tiling's switch from the heads split to the batch split (B = N x S = 16) and from
    one batch a block to two (B = 49 on 48 AIVs) the time never falls, and never beats the HBM."""
    cc = ChipCost("ascend-910c-die", persist=False)
    prev = 0.0
    for b in (1, 2, 8, 14, 15, 16, 17, 47, 48, 49, 50, 96, 97, 256, 2048):
        op = _op("rope", b, 16 * 64, "interleave")
        res = cc.vector(op)
        assert res.time_us >= prev - 1e-9, b
        assert res.time_us >= 2 * 2 * op.elements / (res.hbm_peak_bandwidth_gbps * 1e3)
        prev = res.time_us
    assert "held at its 15-batch heads-split time" in cc.vector(_op("rope", 16, 16 * 64, "interleave")).mapping
