"""Tests of the compute model (npusim.hw.compute): systolic GEMM and vector unit.

Expected numbers are worked by hand from the conventions in the module docstrings;
the comment next to each gives the arithmetic.  Several of them were also run
through SCALE-Sim 3.0.0, whose "Total Cycles" is the 0-based index of the last
cycle, i.e. npusim - 1 (see validation/README_scalesim.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.hw.compute import (
    DATAFLOWS,
    gemm_cost,
    gemm_cycles_array,
    gemm_cycles_nb,
    vector_cost,
    vector_cycles_array,
)
from npusim.hw.compute.vector import FUSED_QUANT, quantizes

# ------------------------------------------------------------------------------------
# Systolic array: hand-worked cases
# ------------------------------------------------------------------------------------


def test_4x4_convention_os_is_10_cycles():
    # K + H + W - 2 = 4 + 4 + 4 - 2: last MAC in 0-based cycle 9, duration 10.
    c = gemm_cost(4, 4, 4, rows=4, cols=4, dataflow="os")
    assert c.cycles == 10
    assert c.folds == 1 and c.t_stream == 4 and c.fill_drain == 6
    assert c.utilization == pytest.approx(64 / (10 * 16))


def test_4x4_ws_single_tile_with_and_without_weight_load():
    # WS: T_inj + M + R + C - 2 = 4 + 4 + 6 = 14 (SCALE-Sim reports 13); 10 without load.
    assert gemm_cost(4, 4, 4, 4, 4, "ws", weight_injection_cycles=4).cycles == 14
    assert gemm_cost(4, 4, 4, 4, 4, "ws").cycles == 10


def test_single_tile_128_ws():
    # 128x128 array, M=256, K=N=128, T_inj=128: 1 fold * (128 + 256 + 254) = 638
    c = gemm_cost(256, 128, 128, 128, 128, "ws", weight_injection_cycles=128)
    assert (c.cycles, c.folds, c.t_tile) == (638, 1, 638)
    assert c.macs == 256 * 128 * 128


def test_multi_tile_ws_with_padding():
    # M=5, K=9, N=7 on 4x4: ceil(9/4)=3 K-folds * ceil(7/4)=2 col folds = 6 folds,
    # each 4 (load) + 5 + 6 = 15 -> 90 (SCALE-Sim 3.0.0: 89).
    c = gemm_cost(5, 9, 7, 4, 4, "ws", weight_injection_cycles=4)
    assert (c.cycles, c.folds, c.t_tile) == (90, 6, 15)


def test_multi_tile_os_with_padding():
    # M=5, K=9, N=7 on 4x4 OS: ceil(5/4)=2 * ceil(7/4)=2 = 4 folds of 9 + 6 = 15 -> 60
    # (SCALE-Sim 3.0.0: 59).  T_inj is ignored for OS.
    c = gemm_cost(5, 9, 7, 4, 4, "os", weight_injection_cycles=4)
    assert (c.cycles, c.folds, c.t_tile, c.t_inj) == (60, 4, 15, 0)


def test_padding_costs_a_whole_fold():
    # OS 128x128, K=N=128: M=128 -> 1 fold of 128+254 = 382; M=129 and M=256 -> 2 folds.
    assert gemm_cost(128, 128, 128, 128, 128, "os").cycles == 382
    assert gemm_cost(129, 128, 128, 128, 128, "os").cycles == 764
    assert gemm_cost(256, 128, 128, 128, 128, "os").cycles == 764


def test_non_square_array():
    # WS on 8 rows x 4 cols, M=10, K=20, N=9: ceil(20/8)=3 * ceil(9/4)=3 = 9 folds,
    # each 8 + 10 + (8+4-2) = 28 -> 252.  OS: ceil(10/8)=2 * 3 = 6 folds of 20+10 -> 180.
    assert gemm_cost(10, 20, 9, 8, 4, "ws", weight_injection_cycles=8).cycles == 252
    assert gemm_cost(10, 20, 9, 8, 4, "os").cycles == 180


def test_int8_doubles_throughput_ws():
    # K=256 on 128 rows: fp16 needs 2 K-folds of 64 + 254 = 318 -> 636; int8
    # (k_per_pe=2) holds all 256 K in one fold -> 318: exactly half.
    fp16 = gemm_cost(64, 256, 128, 128, 128, "ws", k_per_pe=1)
    int8 = gemm_cost(64, 256, 128, 128, 128, "ws", k_per_pe=2)
    assert (fp16.cycles, int8.cycles) == (636, 318)
    assert int8.utilization == pytest.approx(fp16.utilization)  # peak doubled too


def test_int8_doubles_throughput_os_large_k():
    # OS streams ceil(K/k_per_pe): K=65536 -> 65536+254 vs 32768+254 cycles.
    fp16 = gemm_cost(128, 65536, 128, 128, 128, "os", k_per_pe=1)
    int8 = gemm_cost(128, 65536, 128, 128, 128, "os", k_per_pe=2)
    assert (fp16.cycles, int8.cycles) == (65790, 33022)
    assert fp16.cycles / int8.cycles == pytest.approx(2, rel=0.01)


def test_ascend_style_cube():
    # 16x16 cube, 16 MACs per PE (fp16): a 16x16x16 GEMM streams ceil(16/16)=1 cycle + 30.
    assert gemm_cost(16, 16, 16, 16, 16, "os", k_per_pe=16).cycles == 31
    # M=K=N=64: 4*4 folds of ceil(64/16)=4 + 30 = 34 -> 544
    assert gemm_cost(64, 64, 64, 16, 16, "os", k_per_pe=16).cycles == 544


def test_double_buffered_ws():
    # 400 folds (20 K-folds x 20 col folds), T_inj=128 hidden except the first:
    # S=64 < 128: 128 + 399*128 + 64 + 254 = 51518
    c = gemm_cost(64, 2560, 2560, 128, 128, "ws", weight_injection_cycles=128, double_buffer=True)
    assert (c.cycles, c.t_tile) == (51518, 128)
    # S=256 >= 128: 128 + 399*256 + 256 + 254 = 102782 ; serial: 400*(128+256+254)=255200
    c = gemm_cost(256, 2560, 2560, 128, 128, "ws", weight_injection_cycles=128, double_buffer=True)
    assert c.cycles == 102782
    assert gemm_cost(256, 2560, 2560, 128, 128, "ws", weight_injection_cycles=128).cycles == 255200


def test_double_buffered_os():
    # 2 folds, S=64, drain X=rows=128: 0 + 1*128 + 64 + 254 = 446 ; serial 2*(64+254) = 636
    assert gemm_cost(256, 64, 128, 128, 128, "os", double_buffer=True).cycles == 446
    assert gemm_cost(256, 64, 128, 128, 128, "os").cycles == 636


def test_double_buffer_never_slower():
    for m, k, n in [(1, 2560, 9728), (64, 2560, 1024), (2048, 2560, 2560), (3, 5, 7)]:
        for df in ("ws", "os"):
            a = gemm_cost(m, k, n, 32, 32, df, weight_injection_cycles=32)
            b = gemm_cost(m, k, n, 32, 32, df, weight_injection_cycles=32, double_buffer=True)
            assert b.cycles <= a.cycles


def test_batch():
    # serial: 3 independent 4x4x4 OS GEMMs back to back, no overlap: 3 * 10 = 30
    c = gemm_cost(4, 4, 4, 4, 4, "os", batch=3)
    assert (c.cycles, c.folds, c.macs) == (30, 3, 192)
    # double-buffered: one stream, I = max(4, 4): 2*4 + 4 + 6 = 18
    assert gemm_cost(4, 4, 4, 4, 4, "os", batch=3, double_buffer=True).cycles == 18
    # WS serial with load: 3 * 14 = 42
    assert gemm_cost(4, 4, 4, 4, 4, "ws", weight_injection_cycles=4, batch=3).cycles == 42


def test_sram_traffic_ws():
    # M=5,K=9,N=7 on 4x4: A read per col fold 5*9*2=90, B once 63 -> 153 el * 2 B = 306;
    # 3 K-folds -> 2 partial-sum round trips of 35 el * 4 B = 280 read + 280 written;
    # final C 35 * 2 B = 70 written.
    c = gemm_cost(5, 9, 7, 4, 4, "ws")
    assert (c.sram_read_bytes, c.sram_write_bytes) == (306 + 280, 280 + 70)


def test_sram_traffic_os_and_bytes():
    # A 5*9*2 = 90 el, B 9*7*2 (row folds) = 126 el -> 216 * 2 B = 432; C 35 * 4 B = 140.
    c = gemm_cost(5, 9, 7, 4, 4, "os", out_bytes_per_elem=4)
    assert (c.sram_read_bytes, c.sram_write_bytes) == (432, 140)
    # batch multiplies traffic
    c2 = gemm_cost(5, 9, 7, 4, 4, "os", out_bytes_per_elem=4, batch=2)
    assert (c2.sram_read_bytes, c2.sram_write_bytes) == (864, 280)


def test_formula_string_and_frozen():
    c = gemm_cost(5, 9, 7, 4, 4, "ws", weight_injection_cycles=4)
    assert c.formula.endswith("= 90")
    with pytest.raises(AttributeError):
        c.cycles = 1  # type: ignore[misc]


def _brute_force_last_cycle(m, k, n, rows, cols, df, k_per_pe=1):
    """Independent reference: enumerate the skewed MAC schedule of every fold.

    PE(i, j) performs its t-th MAC of a fold in cycle t + i + j; folds run one
    after another; a fold lasts until its last MAC cycle (inclusive)."""
    if df == "ws":
        folds = math.ceil(k / (rows * k_per_pe)) * math.ceil(n / cols)
        stream = m
    else:
        folds = math.ceil(m / rows) * math.ceil(n / cols)
        stream = math.ceil(k / k_per_pe)
    fold_len = 1 + max(t + i + j for t in range(stream) for i in range(rows) for j in range(cols))
    return folds * fold_len


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 2), (4, 4, 4), (7, 3, 9), (2, 11, 5)])
@pytest.mark.parametrize("array", [(1, 1), (2, 3), (4, 4), (3, 2)])
@pytest.mark.parametrize("df", ["ws", "os"])
def test_matches_brute_force_schedule(shape, array, df):
    m, k, n = shape
    rows, cols = array
    assert gemm_cost(m, k, n, rows, cols, df).cycles == _brute_force_last_cycle(
        m, k, n, rows, cols, df)


# ------------------------------------------------------------------------------------
# Systolic array: properties
# ------------------------------------------------------------------------------------

dims = st.integers(min_value=1, max_value=5000)
arr = st.sampled_from([1, 2, 3, 4, 8, 16, 32, 64, 128, 256])
gemm_args = st.fixed_dictionaries({
    "m": dims, "k": dims, "n": dims, "rows": arr, "cols": arr,
    "dataflow": st.sampled_from(["ws", "os"]),
    "k_per_pe": st.sampled_from([1, 2, 4, 16, 32]),
    "weight_injection_cycles": st.integers(min_value=0, max_value=300),
    "batch": st.integers(min_value=1, max_value=8),
    "double_buffer": st.booleans(),
})


@settings(max_examples=examples(300), deadline=None)
@given(gemm_args)
def test_utilization_at_most_one(a):
    c = gemm_cost(**a)
    assert 0 < c.utilization <= 1
    assert c.cycles >= math.ceil(c.macs / (a["rows"] * a["cols"] * a["k_per_pe"]))


@settings(max_examples=examples(300), deadline=None)
@given(gemm_args)
def test_numba_matches_python(a):
    py = gemm_cost(**a).cycles
    nb = gemm_cycles_nb(a["m"], a["k"], a["n"], a["rows"], a["cols"], DATAFLOWS[a["dataflow"]],
                        a["k_per_pe"], a["weight_injection_cycles"], a["batch"],
                        a["double_buffer"])
    assert nb == py
    if a["batch"] == 1 and not a["double_buffer"]:  # the 8-argument form
        assert gemm_cycles_nb(a["m"], a["k"], a["n"], a["rows"], a["cols"],
                              DATAFLOWS[a["dataflow"]], a["k_per_pe"],
                              a["weight_injection_cycles"]) == py


@settings(max_examples=examples(200), deadline=None)
@given(gemm_args, st.sampled_from(["m", "k", "n"]), st.integers(min_value=1, max_value=3000))
def test_monotonic_in_m_k_n(a, dim, extra):
    bigger = dict(a)
    bigger[dim] = a[dim] + extra
    assert gemm_cost(**bigger).cycles >= gemm_cost(**a).cycles


def test_cycles_array_matches_scalar():
    rng = np.random.default_rng(0)
    m, k, n = (rng.integers(1, 3000, size=200) for _ in range(3))
    for df in ("ws", "os"):
        for db in (False, True):
            got = gemm_cycles_array(m, k, n, 64, 32, df, 2, 64, double_buffer=db)
            want = [gemm_cost(int(a), int(b), int(c), 64, 32, df, 2, 64,
                              double_buffer=db).cycles for a, b, c in zip(m, k, n)]
            assert got.dtype == np.int64
            assert got.tolist() == want


def test_cycles_array_broadcasts():
    got = gemm_cycles_array(np.array([[1], [64]]), 2560, np.array([1024, 2560, 9728]), 128, 128,
                            "ws", 1, 128, batch=2)
    assert got.shape == (2, 3)
    assert got[1, 2] == gemm_cost(64, 2560, 9728, 128, 128, "ws", 1, 128, batch=2).cycles


@pytest.mark.parametrize("kwargs, match", [
    (dict(m=0), "m must be a positive integer"),
    (dict(k=-3), "k must be a positive integer"),
    (dict(n=2.5), "n must be a positive integer"),
    (dict(rows=0), "rows"),
    (dict(cols=-1), "cols"),
    (dict(k_per_pe=0), "k_per_pe"),
    (dict(batch=0), "batch"),
    (dict(weight_injection_cycles=-1), "weight_injection_cycles"),
    (dict(dataflow="is"), "unknown dataflow 'is'"),
    (dict(dataflow="rs"), "valid: \\['cube', 'os', 'ws'\\]"),
])
def test_bad_gemm_arguments(kwargs, match):
    args = dict(m=4, k=4, n=4, rows=4, cols=4)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        gemm_cost(**args)


def test_bad_arguments_numba_and_array():
    with pytest.raises(ValueError):
        gemm_cycles_nb(0, 4, 4, 4, 4, 0, 1, 0)
    with pytest.raises(ValueError):
        gemm_cycles_nb(4, 4, 4, 4, 4, 3, 1, 0)
    with pytest.raises(ValueError, match="all m must be positive"):
        gemm_cycles_array([1, 0], [4, 4], [4, 4], 4, 4)
    with pytest.raises(ValueError, match="unknown dataflow"):
        gemm_cycles_array([1], [4], [4], 4, 4, "xs")


# ------------------------------------------------------------------------------------
# Vector unit
# ------------------------------------------------------------------------------------


def test_vector_elementwise_and_exp():
    # 4096 / 128 lanes = 32 cycles at 1 op/cycle + 8 startup = 40
    v = vector_cost("elementwise", 4096, 128)
    assert (v.cycles, v.elements) == (40, 4096)
    assert v.utilization == pytest.approx(32 / 40)
    # exp at 0.25 op/cycle: 32 * 4 + 8 = 136 ; at 0.5: 64 + 8 = 72
    assert vector_cost("exp", 4096, 128).cycles == 136
    assert vector_cost("exp", 4096, 128, {"exp": 0.5}).cycles == 72
    # no startup, 100 elements on 16 lanes: ceil(100/16) = 7
    assert vector_cost("elementwise", 100, 16, startup_cycles=0).cycles == 7
    # fused ops: 3 ops/element -> 21 (+0)
    assert vector_cost("elementwise", 100, 16, startup_cycles=0, ops_per_element=3).cycles == 21


def test_vector_activation():
    # gelu: 1 activation (0.5/cycle -> 2) + 6 elementwise = 8 lane-cycles: 32*8 + 8 = 264
    assert vector_cost("activation", 4096, 128, fn="gelu").cycles == 264
    # silu on 16 lanes: 7 * (2 + 1) + 8 = 29 ; relu: 7 * 1 + 8 = 15
    assert vector_cost("activation", 100, 16, fn="silu").cycles == 29
    assert vector_cost("activation", 100, 16, fn="relu").cycles == 15


def test_vector_reduction():
    # 4 rows of 1024 on 128 lanes: 4 * 8 per-lane + log2(128)=7 tree + 8 = 47
    assert vector_cost("reduction", 4096, 128, row_len=1024).cycles == 47
    # one row of 100 (< lanes): 1 + ceil(log2 100)=7 + 8 = 16
    assert vector_cost("reduction", 100, 128).cycles == 16


def test_vector_softmax():
    # 4 rows x 1024, 128 lanes: max 47; sub+exp 32*(1+4)+8 = 168; sum 47;
    # reciprocal of 4 row sums ceil(4/128)*4 + 8 = 12; scale 32 + 8 = 40 -> 314
    v = vector_cost("softmax", 4096, 128, row_len=1024)
    assert v.cycles == 314
    assert [p for _, p in v.passes] == [47, 168, 47, 12, 40]


def test_vector_norms_and_rope():
    # rmsnorm 4 x 2560 on 128 lanes: sumsq 4*20 + 7 + 8 = 95; per-row (2 + 4) + 8 = 14;
    # scale 80 * 2 + 8 = 168 -> 277
    assert vector_cost("rmsnorm", 4 * 2560, 128, row_len=2560).cycles == 277
    # layernorm: 95 + mean 9 + var 4*40+7+8 = 175 + rsqrt 14 + normalize 80*3+8 = 248 -> 541
    assert vector_cost("layernorm", 4 * 2560, 128, row_len=2560).cycles == 541
    # rope: 2 ops/element: 32 * 2 + 8 = 72
    assert vector_cost("rope", 4096, 128).cycles == 72


@pytest.mark.parametrize("fused", sorted(FUSED_QUANT))
def test_a_fused_quantisation_costs_its_two_ops_work(fused):
    """A norm or SwiGLU with the quantisation of its output (CANN's AddRmsNormQuant, SwiGluQuant):
    the first op's passes, then ``quantize``'s, over the same rows."""
    base, fn = FUSED_QUANT[fused]
    for rows, row, lanes in ((4, 2560, 128), (7, 896, 256), (1, 64, 64)):
        f = vector_cost(fused, rows * row, lanes, row_len=row)
        a = vector_cost(base, rows * row, lanes, row_len=row, fn=fn)
        q = vector_cost("quantize", rows * row, lanes, row_len=row)
        assert f.cycles == a.cycles + q.cycles and f.passes == a.passes + q.passes
        assert quantizes(fused) and not quantizes(base)


@settings(max_examples=examples(200), deadline=None)
@given(st.sampled_from(["elementwise", "exp", "divide", "reduction", "softmax", "rmsnorm",
                        "layernorm", "rope", *FUSED_QUANT]),
       st.integers(1, 64), st.integers(1, 5000), st.sampled_from([1, 8, 16, 32, 128, 256]),
       st.integers(0, 16))
def test_vector_utilization_and_array_agree(op, rows, row_len, lanes, startup):
    elements = rows * row_len
    v = vector_cost(op, elements, lanes, startup_cycles=startup, row_len=row_len)
    assert 0 < v.utilization <= 1
    assert sum(c for _, c in v.passes) == v.cycles
    arr_cycles = vector_cycles_array(op, np.array([elements]), lanes, startup_cycles=startup,
                                     row_len=np.array([row_len]))
    assert arr_cycles.tolist() == [v.cycles]


@pytest.mark.parametrize("call, match", [
    (lambda: vector_cost("matmul", 10, 4), "unknown vector op class 'matmul'; valid: "),
    (lambda: vector_cost("activation", 10, 4, fn="mish"), "activation needs fn"),
    (lambda: vector_cost("activation", 10, 4), "activation needs fn"),
    (lambda: vector_cost("exp", 0, 4), "elements must be a positive integer"),
    (lambda: vector_cost("exp", 10, 0), "lanes must be a positive integer"),
    (lambda: vector_cost("softmax", 10, 4, row_len=3), "does not divide"),
    (lambda: vector_cost("exp", 10, 4, {"sfu": 1.0}), "unknown throughput class"),
    (lambda: vector_cost("exp", 10, 4, {"exp": 0}), "must be > 0"),
    (lambda: vector_cost("exp", 10, 4, startup_cycles=-1), "startup_cycles"),
    (lambda: vector_cycles_array("softmax", [10, 12], 4, row_len=4), "must divide"),
])
def test_bad_vector_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# -- the cube dataflow (Ascend's 3-D MAC unit: one fractal a cycle, CANN's GetMadCycle) ----------

@pytest.mark.parametrize("m,k,n,batch", [(128, 128, 512, 1), (1, 7168, 256, 1), (17, 33, 15, 3), (128, 256, 256, 2)])
def test_cube_dataflow_costs_one_fractal_a_cycle(m, k, n, batch):
    cost = gemm_cost(m, k, n, 16, 16, "cube", 16, batch=batch)
    fractals = batch * -(-m // 16) * -(-k // 16) * -(-n // 16)
    assert cost.cycles == fractals
    assert cost.fill_drain == 0 and cost.t_tile == -(-k // 16)
    assert int(gemm_cycles_array(np.array([m]), np.array([k]), np.array([n]), 16, 16, "cube", 16,
                                 batch=np.array([batch]))[0]) == fractals


def test_cube_dataflow_is_the_os_arrays_time_without_its_drain():
    """At K >= 256 (fp16) an os fold streams 16 cycles, its drain hides under it, so the cube differs
    only by the one exposed fill/drain; at head dim 128 (K = 128) the os array's 16-cycle drain per
    8-cycle fold doubles the time, which the cube does not pay."""
    os_ = gemm_cost(128, 256, 512, 16, 16, "os", 16, 16, double_buffer=True).cycles
    cube = gemm_cost(128, 256, 512, 16, 16, "cube", 16).cycles
    assert os_ - cube == 30
    assert gemm_cost(128, 128, 512, 16, 16, "os", 16, 16, double_buffer=True).cycles > 1.9 * \
        gemm_cost(128, 128, 512, 16, 16, "cube", 16).cycles


def test_cube_never_faster_with_more_work():
    rng = np.random.default_rng(7)
    for _ in range(200):
        m, k, n = (int(x) for x in rng.integers(1, 600, 3))
        base = gemm_cost(m, k, n, 16, 16, "cube", 16).cycles
        for dm, dk, dn in ((1, 0, 0), (0, 1, 0), (0, 0, 1)):
            assert gemm_cost(m + dm, k + dk, n + dn, 16, 16, "cube", 16).cycles >= base


def test_an_sram_fed_cube_is_rejected():
    from npusim.arch.load import load_arch

    arch = load_arch("ascend-910b")
    data = arch.model_dump(mode="json")
    data["cores"]["sram"]["feeds_compute"] = True
    with pytest.raises(ValueError, match="feeds_compute"):
        type(arch).model_validate(data)
