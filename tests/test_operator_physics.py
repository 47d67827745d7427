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
  core reads HBM faster than its DMA engines or the L2 faster than its per-core L2 rate, and the die's L2 serves no more
  than its bandwidth; the cube never takes operands faster than L1 feeds L0B (128 B/cycle, CANN's
  GEMM tiling cycle model); a vector operator never beats its busiest vector core's instructions
  at the vector width after the kernel's start and the cores' prologue.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.arch import load_arch
from npusim.arch.schema import DTYPE_BYTES, Arch
from npusim.config import validate
from npusim.model.ir import Op
from npusim.mapping.gemm_kernel import PLAN_WINDOW, Planner
from npusim.system.chipcost import ChipCost

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


@pytest.mark.parametrize("die", DIES)
@pytest.mark.parametrize("m, k, n", [(5, 7168, 8192), (16, 5120, 3200)])
def test_a_decode_gemm_never_streams_hbm_above_its_bus_after_refresh(costs, die, m, k, n):
    """A weight-streaming GEMM moves its HBM bytes no faster than the channels' data bus after
    all-bank refresh (the analytical HBM's rate since session 46, ``bounds.py``'s stream bound):
    at the die's peak instead, a 5 x 7168 x 8192 decode GEMM on the 910C die streamed 1.50 TB/s
    where the vendor's read-only DataCopy benchmark reaches 1.49."""
    from npusim.hw.memory.bounds import bandwidth_bound
    from npusim.hw.memory.params import P_BURST_PS, P_PCS, P_TCCD, memory_params

    p, _ = memory_params(costs[die].arch, "analytical")
    units = int(costs[die].arch.hbm.channels * p[P_PCS])
    bound = bandwidth_bound(p, np.full(units, p[P_BURST_PS]), np.full(units, p[P_TCCD]), "stream")["bound_gbps"]
    assert bound < costs[die].gemm(1, 128, 128).hbm_peak_bandwidth_gbps * 0.95  # the long-run bound: refresh counted
    res = costs[die].gemm(m, k, n, "bf16")
    assert res.hbm_bandwidth_gbps <= bound * 1.001, (res.hbm_bandwidth_gbps, bound)


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
    port = Planner(arch, [0], dtype, "bf16", 1.0).core_bpc  # bytes per cycle, all of a core's DMA engines
    l2_port = max(port, arch.l2.core_bytes_per_cycle)  # an L2 hit at the core's L2 rate (the vendor's cost model)
    cycles = res.time_us * 1e3 * arch.clock_ghz
    # every global-memory read, HBM bytes at the DMA engines' rate and L2 hits at the per-core L2 rate
    assert res.hbm_read_bytes / port + res.l2_read_bytes / l2_port <= cycles * res.cores_used * (1 + 1e-9)
    assert res.l2_read_bytes <= res.time_us * 1e3 * arch.l2.bandwidth_gbps * (1 + 1e-9)  # the die's L2


@PROBE
@given(die=st.sampled_from(DIES), dtype=st.sampled_from(DTYPES), m=st.sampled_from([1, 16, 48, 128, 256]),
       k=st.sampled_from([256, 1024, 7168]), n=st.sampled_from([16, 256, 320]))
def test_the_cube_never_takes_operands_faster_than_l1_feeds_l0(die, dtype, m, k, n):
    arch = load_arch(die)
    planner = Planner(arch, [0], dtype, "bf16", 1.0)
    assert planner.cycles(m, k, n) >= k * n * DTYPE_BYTES[dtype] / L0B_BYTES_PER_CYCLE


@PROBE
@given(die=st.sampled_from(DIES), op_class=st.sampled_from(["rmsnorm", "quantize", "elementwise", "softmax", "rope"]),
       rows=st.sampled_from([1, 9, 256, 2048]), row_len=st.sampled_from([64, 1536, 7168]))
def test_a_vector_operator_never_beats_its_vector_cores(costs, die, op_class, rows, row_len):
    """Never faster than the kernel's start and prologue plus its busiest AIV's instructions at the
    vector width (one 256-byte repeat per ``vector_cycles_per_repeat``; row-scoped ones too)."""
    from npusim.hw.compute.vector_kernel import REPEAT_BYTES, instructions, launched_aivs, setup_share

    arch = load_arch(die)
    kc = arch.kernel
    op = Op("v", "vector", dtype="bf16", elements=rows * row_len, op_class=op_class, row_len=row_len)
    res = costs[die].vector(op)
    core_rows = -(-rows // min(rows, arch.num_cores))  # the busiest core's rows
    aiv_rows = -(-core_rows // kc.vector_cores_per_core)  # ... and its busiest vector core's
    repeats = sum(aiv_rows * row_len * i.fraction * i.width / REPEAT_BYTES
                  for i in instructions(op_class, row_len=row_len, soc=kc.soc_version) if i.scope in ("tile", "row"))
    aivs = arch.num_cores * kc.vector_cores_per_core  # the AIVs' prologue at the AIVs launched (one a row)
    setup_us = kc.vector_setup_us * setup_share(launched_aivs(op_class, None, rows, aivs), aivs, kc.mix_start_us,
                                                kc.mix_start_core_us)
    floor_us = kc.start_us + setup_us + repeats * kc.vector_cycles_per_repeat / (arch.clock_ghz * 1e3)
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


# -- attention (the FlashAttention split, npusim.mapping.flash_attention) -----------------------------

def _attention(q_len, kv_len, heads=8, kv_heads=8, batch=1, causal=False):
    return Op("attention", "attention", dtype="bf16", q_len=q_len, kv_len=kv_len, heads=heads, kv_heads=kv_heads,
              head_dim=128, v_head_dim=128, batch=batch, causal=causal)


ATT = settings(max_examples=examples(8), deadline=None, suppress_health_check=[HealthCheck.too_slow])
att_shape = st.tuples(st.sampled_from([1, 128, 512, 2048]), st.sampled_from([512, 2048, 8192]),
                      st.sampled_from([(1, 1), (8, 8), (32, 8)]), st.sampled_from([1, 2, 4]))


@ATT
@given(shape=att_shape, die=st.sampled_from(DIES))
def test_attention_never_beats_the_cube_peak_or_the_hbm(costs, shape, die):
    q, kv, (heads, kvh), batch = shape
    op = _attention(q, max(q, kv), heads, kvh, batch)
    res = costs[die].op(op)
    assert res.time_us >= op.flops / (res.peak_tflops_chip * 1e6) * (1 - 1e-9)
    cached = batch * (op.kv_len - op.q_len) * op.kv_bytes_per_token  # read at least once
    assert res.time_us >= cached / (res.hbm_peak_bandwidth_gbps * 1e3) * (1 - 1e-9)


@ATT
@given(shape=att_shape, axis=st.sampled_from(["kv", "batch", "heads"]))
def test_attention_never_gets_faster_with_more_kv_batch_or_heads(costs, shape, axis):
    q, kv, (heads, kvh), batch = shape
    kv = max(q, kv)
    small = costs["ascend-910c-die"].op(_attention(q, kv, heads, kvh, batch)).time_us
    if axis == "kv":
        kv *= 2
    elif axis == "batch":
        batch *= 2
    else:
        heads, kvh = heads * 2, kvh * 2
    large = costs["ascend-910c-die"].op(_attention(q, kv, heads, kvh, batch)).time_us
    assert large >= small * (1 - 1e-9), (axis, small, large)


@ATT
@given(shape=att_shape, cores=st.sampled_from([1, 2, 4, 8, 12]))
def test_more_cores_never_slow_a_split_attention_kernel(costs, shape, cores):
    """The rule: doubling the cores never makes the op slower by more than 2% (more cores share
    the L2's aggregate bandwidth and the split's units may divide less evenly)."""
    q, kv, (heads, kvh), batch = shape
    op = _attention(q, max(q, kv), heads, kvh, batch)
    few, more = costs["ascend-910c-die"].op(op, cores).time_us, costs["ascend-910c-die"].op(op, 2 * cores).time_us
    assert more <= few * 1.02, (cores, few, more)


def test_one_head_of_prefill_is_split_over_the_cores_by_query_blocks(costs):
    """The FlashAttention kernel spreads (sequence, head, 128-row query block) units over the
    cores: one head of 4K queries uses every core and runs several times faster than on one."""
    op = _attention(4096, 4096, heads=1, kv_heads=1)
    one, die = costs["ascend-910b"].op(op, 1), costs["ascend-910b"].op(op)
    assert die.cores_used == 24
    assert die.time_us < one.time_us / 8


def test_decode_with_few_kv_heads_splits_the_kv_over_idle_cores(costs):
    """Grouped-query decode of one sequence with 8 KV heads: the 8 (sequence, KV head) units'
    KV is split over the die's other cores (split-KV, then a combine), not left on 8 cores."""
    op = _attention(1, 32768, heads=32, kv_heads=8)
    res = costs["ascend-910c-die"].op(op)
    assert res.cores_used == 24
    eight = costs["ascend-910c-die"].op(op, 8)
    assert res.time_us < eight.time_us * 0.7  # 24 cores reach the HBM bound (~0.99 of it); 8 do not


# -- collectives (HCCL on the system fabric, npusim.system.collectives) ---------------------------------

@pytest.fixture(scope="module")
def cm384():
    from npusim.system.load import load_system
    return load_system("cloudmatrix384")


COLL = settings(max_examples=examples(6), deadline=None, suppress_health_check=[HealthCheck.too_slow])


@COLL
@given(op=st.sampled_from(["allgather", "reducescatter", "allreduce"]), ranks=st.sampled_from([2, 8, 16]),
       nbytes=st.sampled_from([1024, 65536, 1 << 20, 8 << 20]), grow=st.sampled_from([2, 4]))
def test_a_collective_never_gets_faster_with_more_bytes(cm384, op, ranks, nbytes, grow):
    from npusim.system.measure import run_collective
    small = run_collective(cm384, op, list(range(ranks)), nbytes).time_us
    large = run_collective(cm384, op, list(range(ranks)), nbytes * grow).time_us
    assert large >= small * (1 - 1e-9), (op, ranks, nbytes, small, large)


def _bare_and_synced(loaded, op, n, nbytes, algorithm=None):
    from npusim.system.collectives import build_collective
    from npusim.system.simulator import PS_PER_US, SystemSim
    from npusim.system.work import WorkBuilder
    out = []
    for sync in (False, True):
        sim = SystemSim(loaded, "flow")
        w = WorkBuilder(sim)
        ranks = [loaded.topology.index[d] for d in loaded.topology.die_names[:n]]
        built = build_collective(w, op, ranks, nbytes, algorithm, "sdma", lambda b: 0, loaded.topology.node_of, sync=sync)
        w.submit()
        sim.run()
        out.append((sim.now_ps / PS_PER_US, built.algorithm))
    return out


def test_every_hccl_step_pays_its_notify_handshake(cm384):
    """A ring step is three fabric transfers in a row (buffer-free notify, copy, done notify): a
    tiny ring all-gather on 8 dies (7 steps) takes at least 7 x 3 small writes, and about three
    times what the bare copies take (``sync=False``)."""
    from npusim.system.measure import point_to_point, run_collective
    notify = point_to_point(cm384, "npu0.die0", "npu0.die1", "write", 4).latency_us
    ring = run_collective(cm384, "allgather", list(range(8)), 1024, "ring").time_us
    assert ring >= 7 * 3 * notify * 0.99
    (bare, _), (synced, alg) = _bare_and_synced(cm384, "allgather", 8, 1024, "ring")
    assert alg == "ring" and synced == pytest.approx(ring, rel=1e-6)
    assert synced >= bare + 2 * 7 * notify * 0.99


def test_hccl_runs_mesh_inside_a_node_by_default(cm384):
    """HCCL picks its server-internal algorithm from the topology: the dies of one node reach each
    other directly, so all-gather, reduce-scatter and all-reduce run one-shot (direct); across
    nodes the ring stays the default."""
    from npusim.system.measure import run_collective
    assert run_collective(cm384, "allgather", list(range(16)), 1 << 20).algorithm == "direct"
    assert run_collective(cm384, "reducescatter", list(range(8)), 1 << 20).algorithm == "direct"
    assert run_collective(cm384, "allgather", list(range(32)), 1 << 20).algorithm == "ring"


@pytest.fixture(scope="module")
def cm_node():
    from npusim.system.load import load_system
    return load_system("cloudmatrix384", nodes=1)


def test_hccl_copies_the_user_buffers_in_and_out(cm_node):
    """HCCL's op-base all-reduce copies each rank's input into its CCL buffer and the result back out
    (two local copies of the message, each byte read and written at ``hccl.copy_efficiency`` of the
    die's HBM peak): a 2-die 64 MiB all-reduce takes two such copies longer than without them."""
    from npusim.arch.derived import summarize
    from npusim.system.measure import run_collective
    from npusim.validate.calibrate import _variant
    nbytes = 64 << 20
    hc = cm_node.system.hccl
    copy_us = 2 * nbytes / (hc.copy_efficiency * summarize(cm_node.chip).hbm_bandwidth_gbps * 1e3)
    with_copies = run_collective(cm_node, "allreduce", [0, 1], nbytes).time_us
    bare = run_collective(_variant(cm_node, {"hccl": {"user_buffer_copies": False}}), "allreduce", [0, 1],
                          nbytes).time_us
    assert with_copies - bare == pytest.approx(2 * copy_us, rel=0.02)


def test_a_collective_beyond_the_ccl_buffer_runs_in_rounds(cm_node):
    """A collective whose per-peer share does not fit HCCL's CCL buffer runs in rounds, each with its
    own copies and handshakes: a message just over the buffer pays about one more round's fixed
    cost; with the default 200 MB buffer the same step is invisible."""
    from npusim.system.measure import run_collective
    from npusim.validate.calibrate import _variant
    small = _variant(cm_node, {"hccl": {"buffer_mb": 1}})
    at, over = 2 << 20, (2 << 20) + (64 << 10)  # 2 dies: the per-peer share 1 MiB fits, 1 MiB + 32 KiB does not

    def step(loaded):
        t = [run_collective(loaded, "allreduce", [0, 1], b).time_us for b in (8192, at, over)]
        return t[0], t[2] - t[1]
    fixed, jump = step(small)
    assert jump >= 0.8 * fixed
    fixed, jump = step(cm_node)
    assert jump < 0.5 * fixed
