"""Operator physics on the Ascend dies (issue 39 item 5), over shapes drawn at random: no operator
beats the limits of the hardware it runs on, and a GEMM never gets faster as M, N or K grows.

* a GEMM takes at least its FLOPs at the peak of the cores it uses (a share's peak: never more than
  the whole die's cube peak) and its compulsory HBM bytes at the die's HBM bandwidth;
* a vector operator takes at least the bytes it streams (read once, written once) at HBM bandwidth;
* a GEMM with more rows, columns or depth is never faster, within the chip GEMM planner's
  :data:`~npusim.system.chipcost.PLAN_WINDOW`: the kernel is the fastest simulated of the plans
  *estimated* within that window of the best, so a larger shape can land on a plan the estimate
  ranked differently (see ``tests/test_physics_probes.py``'s slack);
* the die's operator-level mechanisms (issue 39 item 2, the presets' ``kernel`` section): a
  kernel's device-side start is paid exactly once per operator (GEMM, vector, a single attention
  op: not per core, tile or chunk); no
  core reads global memory (HBM or L2) faster than its DMA ports, and the die's L2 serves no more
  than its bandwidth; the cube never takes operands faster than L1 feeds L0B (128 B/cycle, CANN's
  GEMM tiling cycle model); a vector operator never beats its vector cores' measured cost per
  element after the kernel's start and the cores' prologue.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.arch import load_arch
from npusim.arch.schema import DTYPE_BYTES, Arch
from npusim.config import validate
from npusim.model.ir import Op
from npusim.system.chipcost import PLAN_WINDOW, ChipCost, _Planner

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


# -- the die's operator-level mechanisms (issue 39 item 2) ----------------------------------------

FEW = settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])
L0B_BYTES_PER_CYCLE = 128  # CANN cache_tiling_cycle_model.cc, l0c2out::kMte1L0bBandWidth


def _variant(die: str, **kernel) -> Arch:
    data = load_arch(die).model_dump(mode="json")
    data["kernel"] = {**data["kernel"], **kernel}
    return validate(Arch, data, f"{die} variant")


@FEW
@given(die=st.sampled_from(DIES), dtype=st.sampled_from(DTYPES), m=dims, k=wide, n=wide,
       cores=st.sampled_from([None, 4]), start=st.sampled_from([0.5, 7.0]))
def test_a_gemm_pays_the_kernel_start_once(die, dtype, m, k, n, cores, start):
    none = ChipCost(_variant(die, start_us=0.0), persist=False).gemm(m, k, n, dtype, cores)
    some = ChipCost(_variant(die, start_us=start), persist=False).gemm(m, k, n, dtype, cores)
    assert some.kernel_start_us == start and none.kernel_start_us == 0
    assert some.time_us - none.time_us == pytest.approx(start, abs=2e-3)  # once, to a cycle's rounding


@FEW
@given(die=st.sampled_from(DIES), op_class=st.sampled_from(["rmsnorm", "quantize", "elementwise", "rope"]),
       rows=st.sampled_from([1, 16, 2048]), row_len=st.sampled_from([64, 7168]), start=st.sampled_from([0.5, 7.0]))
def test_a_vector_operator_pays_the_kernel_start_once(die, op_class, rows, row_len, start):
    op = Op("v", "vector", dtype="bf16", elements=rows * row_len, op_class=op_class, row_len=row_len)
    none = ChipCost(_variant(die, start_us=0.0), persist=False).vector(op)
    some = ChipCost(_variant(die, start_us=start), persist=False).vector(op)
    assert some.time_us - none.time_us == pytest.approx(start, abs=2e-3)


@PROBE
@given(die=st.sampled_from(DIES), dtype=st.sampled_from(DTYPES), m=st.sampled_from([16, 512, 2048, 4096]),
       k=wide, n=st.sampled_from([1536, 4096, 7168]), cores=st.sampled_from([None, 4]))
def test_no_core_reads_global_memory_faster_than_its_ports(costs, die, dtype, m, k, n, cores):
    res = costs[die].gemm(m, k, n, dtype, cores)
    arch = load_arch(die)
    port = _Planner(arch, [0], dtype, "bf16", 1.0).core_bpc  # bytes per cycle, all of a core's DMA engines
    cycles = res.time_us * 1e3 * arch.clock_ghz
    loaded = res.hbm_read_bytes + res.l2_read_bytes  # every global-memory read, from HBM or the L2
    assert loaded <= cycles * res.cores_used * port * (1 + 1e-9)  # per core
    assert res.l2_read_bytes <= res.time_us * 1e3 * arch.l2.bandwidth_gbps * (1 + 1e-9)  # the die's L2


@PROBE
@given(die=st.sampled_from(DIES), dtype=st.sampled_from(DTYPES), m=st.sampled_from([1, 16, 48, 128, 256]),
       k=st.sampled_from([256, 1024, 7168]), n=st.sampled_from([16, 256, 320]))
def test_the_cube_never_takes_operands_faster_than_l1_feeds_l0(die, dtype, m, k, n):
    arch = load_arch(die)
    planner = _Planner(arch, [0], dtype, "bf16", 1.0)
    assert planner.cycles(m, k, n) >= k * n * DTYPE_BYTES[dtype] / L0B_BYTES_PER_CYCLE


@PROBE
@given(die=st.sampled_from(DIES), op_class=st.sampled_from(["rmsnorm", "quantize", "elementwise", "softmax", "rope"]),
       rows=st.sampled_from([1, 9, 256, 2048]), row_len=st.sampled_from([64, 1536, 7168]))
def test_a_vector_operator_never_beats_its_vector_cores(costs, die, op_class, rows, row_len):
    from npusim.hw.compute.vector import kernel_cycles_per_element

    arch = load_arch(die)
    kc = arch.kernel
    op = Op("v", "vector", dtype="bf16", elements=rows * row_len, op_class=op_class, row_len=row_len)
    res = costs[die].vector(op)
    core_rows = -(-rows // min(rows, arch.num_cores))  # the busiest core's rows
    aiv_rows = -(-core_rows // kc.vector_cores_per_core)  # ... and its busiest vector core's
    floor_us = kc.start_us + kc.vector_setup_us + \
        aiv_rows * row_len * kernel_cycles_per_element(kc, op_class) / (arch.clock_ghz * 1e3)
    assert res.time_us >= floor_us * (1 - 1e-9)


@FEW
@given(die=st.sampled_from(DIES), q=st.sampled_from([1, 128]), kv=st.sampled_from([512, 4096]),
       start=st.sampled_from([0.5, 7.0]))
def test_an_attention_operator_pays_the_kernel_start_once(die, q, kv, start):
    op = Op("attn", "attention", dtype="bf16", q_len=q, kv_len=kv, heads=8, kv_heads=1, head_dim=128,
            v_head_dim=128, batch=1)
    none = ChipCost(_variant(die, start_us=0.0), persist=False).op(op)
    some = ChipCost(_variant(die, start_us=start), persist=False).op(op)
    assert some.kernel_start_us == start and none.kernel_start_us == 0
    assert some.time_us - none.time_us == pytest.approx(start, abs=2e-3)
