"""Operator physics on the Ascend dies (issue 39 item 5), over shapes drawn at random: no operator
beats the limits of the hardware it runs on, and a GEMM never gets faster as M, N or K grows.

* a GEMM takes at least its FLOPs at the peak of the cores it uses (a share's peak: never more than
  the whole die's cube peak) and its compulsory HBM bytes at the die's HBM bandwidth;
* a vector operator takes at least the bytes it streams (read once, written once) at HBM bandwidth;
* a GEMM with more rows, columns or depth is never faster, within the chip GEMM planner's
  :data:`~npusim.system.chipcost.PLAN_WINDOW`: the kernel is the fastest simulated of the plans
  *estimated* within that window of the best, so a larger shape can land on a plan the estimate
  ranked differently (see ``tests/test_physics_probes.py``'s slack).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.model.ir import Op
from npusim.system.chipcost import PLAN_WINDOW, ChipCost

DIES = ("ascend-910b", "ascend-910c-die")
DTYPES = ("bf16", "int8")
PROBE = settings(max_examples=examples(12), deadline=None, suppress_health_check=[HealthCheck.too_slow])
dims = st.sampled_from([1, 5, 16, 64, 128, 200, 512, 1024, 2048, 4096])
wide = st.sampled_from([128, 512, 1536, 2048, 4096, 7168])


@pytest.fixture(scope="module")
def costs():
    return {d: ChipCost(d) for d in DIES}


@PROBE
@given(die=st.sampled_from(DIES), dtype=st.sampled_from(DTYPES), m=dims, k=wide, n=wide,
       cores=st.sampled_from([None, 1, 4, 12]))
def test_a_gemm_never_beats_its_cores_peak_or_the_hbm(costs, die, dtype, m, k, n, cores):
    res = costs[die].gemm(m, k, n, dtype, cores)
    flops = 2.0 * m * k * n
    assert res.peak_tflops_share <= res.peak_tflops_chip * (1 + 1e-9)
    assert res.time_us >= flops / (res.peak_tflops_share * 1e6) * (1 - 1e-9)  # the share's cube peak
    assert res.time_us >= res.min_hbm_bytes / (res.hbm_peak_bandwidth_gbps * 1e3) * (1 - 1e-9)  # HBM


@PROBE
@given(die=st.sampled_from(DIES), dtype=st.sampled_from(DTYPES), m=dims, k=wide, n=wide,
       axis=st.sampled_from("mkn"), grow=st.sampled_from([2, 3, 8]))
def test_a_gemm_never_gets_faster_as_m_n_or_k_grows(costs, die, dtype, m, k, n, axis, grow):
    shape = {"m": m, "k": k, "n": n}
    small = costs[die].gemm(shape["m"], shape["k"], shape["n"], dtype).time_us
    shape[axis] *= grow
    large = costs[die].gemm(shape["m"], shape["k"], shape["n"], dtype).time_us
    assert large >= small * (1 - PLAN_WINDOW), (axis, grow, small, large)


@PROBE
@given(die=st.sampled_from(DIES), op_class=st.sampled_from(["rmsnorm", "quantize", "elementwise", "softmax", "rope"]),
       rows=st.sampled_from([1, 16, 256, 2048, 8192]), row_len=st.sampled_from([64, 1536, 7168]))
def test_a_vector_operator_never_beats_the_hbm(costs, die, op_class, rows, row_len):
    op = Op("v", "vector", dtype="bf16", elements=rows * row_len, op_class=op_class, row_len=row_len)
    res = costs[die].vector(op)
    out_bytes = rows * row_len * (1 if op_class == "quantize" else 2)
    streamed = 2 * rows * row_len + out_bytes  # read once, written once
    assert res.time_us >= streamed / (res.hbm_peak_bandwidth_gbps * 1e3) * (1 - 1e-9)
