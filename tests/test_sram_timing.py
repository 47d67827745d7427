"""SRAM ports in the timing path (hw/memory/sram_timing.py, sim/sramport.py): the detailed memory
fidelity stalls compute when the ports cannot keep up; the analytical one is the old closed form."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.arch import load_arch
from npusim.cli import main
from npusim.hw.compute.systolic import gemm_cost, gemm_cycles_array
from npusim.hw.compute.vector import OP_CLASSES, vector_cost
from npusim.hw.memory.sram_timing import (PSUM_BITS, UNLIMITED, _gemm_sram_core, gemm_sram_timing,
                                          sram_supply_bits, vector_sram_timing)
from npusim.sim import Simulator
from npusim.sim.program import Program

ARCH = load_arch("npusim-64c")


def with_port(bytes_per_bank: int, feeds: bool = True):
    sram = ARCH.cores.sram.model_copy(update={"bytes_per_cycle_per_bank": bytes_per_bank, "feeds_compute": feeds})
    return ARCH.model_copy(update={"cores": ARCH.cores.model_copy(update={"sram": sram})})


def core(m, k, n, rows, cols, df, kpe, t_inj, batch, db, sup, eb=16, ob=16):
    cyc, bits = _gemm_sram_core(m, k, n, rows, cols, df, kpe, t_inj, batch, db, eb, ob, PSUM_BITS, sup)
    return int(cyc), int(bits)


def peak_demand_bits(rows, cols, df, kpe, t_inj, eb=16, ob=16):
    """The array's largest per-cycle demand on the ports, from its geometry alone: ws streams
    ``rows*kpe`` inputs in, ``cols`` partial sums out and back, and loads a weight tile per
    T_inj; os streams ``(rows + cols) * kpe`` operands and drains up to two output rows."""
    if df == 0:
        return rows * kpe * eb + cols * (max(ob, PSUM_BITS) + PSUM_BITS) + -(-rows * kpe * cols * eb // t_inj)
    return (rows + cols) * kpe * eb + 2 * cols * ob


shapes = st.tuples(st.integers(1, 700), st.integers(1, 700), st.integers(1, 700), st.integers(1, 3))
arrays = st.tuples(st.integers(1, 24), st.integers(1, 24), st.sampled_from([0, 1]), st.sampled_from([1, 2, 4]),
                   st.integers(1, 40), st.booleans())


@settings(max_examples=examples(200), deadline=None)
@given(shapes, arrays)
def test_unlimited_supply_is_the_closed_form(shape, array):
    m, k, n, b = shape
    rows, cols, df, kpe, t_inj, db = array
    cyc, bits = core(m, k, n, rows, cols, df, kpe, t_inj, b, db, UNLIMITED)
    assert cyc == gemm_cost(m, k, n, rows, cols, "ws" if df == 0 else "os", kpe, t_inj, batch=b,
                            double_buffer=db).cycles


@settings(max_examples=examples(200), deadline=None)
@given(shapes, arrays)
def test_bytes_conserved(shape, array):
    """The per-fold demand adds up to gemm_cost's SRAM traffic (A, B, partial sums, C)."""
    m, k, n, b = shape
    rows, cols, df, kpe, t_inj, db = array
    _, bits = core(m, k, n, rows, cols, df, kpe, t_inj, b, db, 1000)
    c = gemm_cost(m, k, n, rows, cols, "ws" if df == 0 else "os", kpe, t_inj, bytes_per_elem=2, batch=b,
                  double_buffer=db)
    assert bits == 8 * (c.sram_read_bytes + c.sram_write_bytes)


@settings(max_examples=examples(200), deadline=None)
@given(shapes, arrays)
def test_no_stall_when_ports_cover_the_peak_demand(shape, array):
    m, k, n, b = shape
    rows, cols, df, kpe, t_inj, db = array
    sup = peak_demand_bits(rows, cols, df, kpe, t_inj)
    base, _ = core(m, k, n, rows, cols, df, kpe, t_inj, b, db, UNLIMITED)
    assert core(m, k, n, rows, cols, df, kpe, t_inj, b, db, sup)[0] == base


@settings(max_examples=examples(200), deadline=None)
@given(shapes, arrays, st.integers(1, 4000), st.integers(1, 4000))
def test_stalls_grow_as_ports_narrow_and_ports_never_exceed_100_percent(shape, array, s1, s2):
    m, k, n, b = shape
    rows, cols, df, kpe, t_inj, db = array
    narrow, wide = sorted((s1, s2))
    c_narrow, bits = core(m, k, n, rows, cols, df, kpe, t_inj, b, db, narrow)
    c_wide, _ = core(m, k, n, rows, cols, df, kpe, t_inj, b, db, wide)
    base, _ = core(m, k, n, rows, cols, df, kpe, t_inj, b, db, UNLIMITED)
    assert c_narrow >= c_wide >= base
    for cyc, sup in ((c_narrow, narrow), (c_wide, wide)):
        assert bits <= cyc * sup  # utilisation <= 100 %
    if bits > base * narrow:  # the ports cannot carry the traffic in the stall-free time
        assert c_narrow > base


def test_port_width_study_on_npusim_64c():
    """64/128/256-bit ports (the NpuSim study) stall a 1024x4096x4096 GEMM less and less; the
    shipped 512-bit ports not at all."""
    stalls = []
    for bpb in (8, 16, 32, 64):
        sram = with_port(bpb).cores.sram
        t = gemm_sram_timing(1024, 4096, 4096, 128, 128, "ws", 1, 128, sram, "fp16", double_buffer=True)
        assert t.stall_free_cycles == gemm_cost(1024, 4096, 4096, 128, 128, "ws", 1, 128, double_buffer=True).cycles
        assert 0 < t.port_utilization <= 1.0
        stalls.append(t.stall_cycles)
    assert stalls[0] > stalls[1] > stalls[2] > stalls[3] == 0
    # 64-bit ports: 256 B/cycle for ~1.35 GB of traffic
    assert stalls[0] + 1048958 >= 1_350_565_888 / 256


def test_supply_is_banks_times_port_and_conflict_free_for_packed_lines():
    sram = ARCH.cores.sram
    assert sram.port_width_bits == 512
    assert sram_supply_bits(sram) == 8 * 32 * 64
    assert sram_supply_bits(sram, 256) == 8 * 32 * 64  # 128 fp16 per line: 4 banks, all banks in turn


@pytest.mark.parametrize("op_class", [c for c in OP_CLASSES if c != "copy"])  # a copy: no vector pass
def test_vector_ops(op_class):
    fn = "silu" if op_class == "activation" else None
    elements, row_len, lanes = 64 * 1024, 1024, 128
    free = vector_sram_timing(op_class, elements, lanes, fn=fn, row_len=row_len)
    assert free.cycles == free.stall_free_cycles == vector_cost(op_class, elements, lanes, fn=fn,
                                                                  row_len=row_len).cycles
    prev = free.cycles
    for sup in (8 * 2048, 8 * 512, 8 * 256, 8 * 64):
        t = vector_sram_timing(op_class, elements, lanes, supply_bits=sup, fn=fn, row_len=row_len)
        assert t.stall_free_cycles == free.cycles and t.sram_bytes == free.sram_bytes
        assert t.cycles >= prev
        assert t.sram_bytes * 8 <= t.cycles * sup
        prev = t.cycles
    assert prev > free.cycles  # 64 B/cycle cannot feed 128 lanes


def test_a_copy_is_no_vector_pass():
    t = vector_sram_timing("copy", 64 * 1024, 128, supply_bits=8 * 64, row_len=1024)
    assert t.cycles == 0 and t.sram_bytes == 0


def _one_gemm(arch, memory, dma_bytes=0):
    prog = Program(arch.num_cores)
    if dma_bytes:
        prog.add_dma(0, dma_bytes)  # in flight when the GEMM starts
    g = prog.add_gemm(0, 512, 2048, 2048, "bf16")
    sim = Simulator(arch, memory_mode=memory, noc_mode="analytical")
    ids = prog.submit(sim)
    sim.run()
    start, end = sim.task_times()
    return int(end[ids[g]] - start[ids[g]]), sim


def test_engine_times_compute_with_stalls_at_tlm_only():
    sa = ARCH.cores.systolic_array
    closed = int(gemm_cycles_array(512, 2048, 2048, 128, 128, "ws", 1, sa.t_inj, double_buffer=True))
    narrow = with_port(8)
    detailed = gemm_sram_timing(512, 2048, 2048, 128, 128, "ws", 1, sa.t_inj, narrow.cores.sram, "bf16",
                                double_buffer=True)
    assert detailed.stall_cycles > 0
    dur, sim = _one_gemm(narrow, "analytical")
    assert dur == closed and sim.sram_stall_cycles == 0
    dur, sim = _one_gemm(narrow, "tlm")
    assert dur == detailed.cycles and sim.sram_stall_cycles == detailed.stall_cycles
    dur, sim = _one_gemm(with_port(8, feeds=False), "tlm")  # private operand buffers: no stalls
    assert dur == closed and sim.sram_stall_cycles == 0
    dur, sim = _one_gemm(ARCH, "tlm")  # the shipped 512-bit ports keep up
    assert dur == closed and sim.sram_stall_cycles == 0


def test_dma_into_sram_competes_for_the_ports():
    narrow = with_port(8)
    alone, _ = _one_gemm(narrow, "tlm")
    shared, sim = _one_gemm(narrow, "tlm", dma_bytes=8 << 20)
    assert shared > alone
    assert sim.sram_dma_stall_cycles == shared - alone
    wide_alone, _ = _one_gemm(ARCH, "tlm")
    wide_shared, sim = _one_gemm(ARCH, "tlm", dma_bytes=8 << 20)
    assert wide_shared == wide_alone and sim.sram_dma_stall_cycles == 0


def test_program_timings_analytical_equal_the_closed_forms():
    prog = Program(ARCH.num_cores)
    prog.add_gemm(0, 100, 300, 500, "bf16", batch=2)
    prog.add_gemm(1, 7, 4096, 33, "int8")
    prog.add_vector(0, "softmax", 4096 * 8, row_len=4096)
    dur, bits, stall = prog.timings(with_port(8), sram=False)
    sa = ARCH.cores.systolic_array
    assert dur[0] == gemm_cost(100, 300, 500, 128, 128, "ws", 1, sa.t_inj, batch=2, double_buffer=True).cycles
    assert dur[1] == gemm_cost(7, 4096, 33, 128, 128, "ws", 2, sa.t_inj, double_buffer=True).cycles
    assert dur[2] == vector_cost("softmax", 4096 * 8, 128, row_len=4096).cycles
    assert not bits.any() and not stall.any()
    assert np.array_equal(dur, prog.durations(with_port(8)))
    dur2, bits2, stall2 = prog.timings(with_port(8), sram=True)
    assert np.array_equal(dur2 - stall2, dur) and (bits2 > 0).all()
    assert stall2[0] > 0 and stall2[2] > 0  # the tiny int8 GEMM (7 rows) fits in 64-bit ports


def test_cli_gemm_json(capsys, tmp_path):
    arch = tmp_path / "p64.yaml"
    arch.write_text("extends: npusim-64c\nname: p64\ncores:\n  sram: {bytes_per_cycle_per_bank: 8}\n")
    args = ["gemm", "--arch", str(arch), "--m", "256", "--k", "1024", "--n", "1024", "--json"]
    assert main(args) == 0
    cheap = json.loads(capsys.readouterr().out)
    assert cheap["sram_stall_cycles"] == 0 and cheap["cycles"] == cheap["stall_free_cycles"]
    assert cheap["sram_port_width_bits"] == 64 and "sram_bound_cycles" in cheap
    assert main(args + ["--memory", "tlm"]) == 0
    detailed = json.loads(capsys.readouterr().out)
    assert detailed["sram_stall_cycles"] > 0
    assert detailed["cycles"] == cheap["cycles"] + detailed["sram_stall_cycles"]
    assert 0 < detailed["sram_port_utilization"] <= 1.0


def _serve(arch, memory):
    from npusim.mapping.spec import spec_from_flags
    from npusim.serving.requests import synthetic_requests
    from npusim.serving.scheduler import SchedulerConfig
    from npusim.serving.simulate import ServingConfig, simulate_serving

    spec = spec_from_flags(tp=4, stages=2, layout="ring").model_copy(update={"data_parallel": 1})
    reqs = synthetic_requests(4, 200.0, input_len=(64, 128), output_len=(2, 4), seed=1)
    cfg = ServingConfig(model="gpt2", layers=2, memory_mode=memory, noc_mode="analytical",
                        scheduler=SchedulerConfig(policy="fusion", budget=256, chunk_tokens=64, max_batch=4))
    return simulate_serving(arch, spec, reqs, cfg).summary


def _forward(arch, memory):
    from npusim.mapping.spec import spec_from_flags
    from npusim.model.builder import build_graph
    from npusim.scenarios.forward import simulate_forward

    g = build_graph("gpt2", phase="prefill", batch=1, seq_len=256, layers=1)
    spec = spec_from_flags(tp=4, stages=1).model_copy(update={"data_parallel": 1})
    return simulate_forward(g, arch, spec, memory_mode=memory, noc_mode="analytical").summary


@pytest.mark.parametrize("run", [_forward, _serve])
def test_summaries_total_the_stalls(run):
    narrow = run(with_port(8), "tlm")
    assert narrow["sram_stall_cycles"] > 0
    cheap = run(with_port(8), "analytical")
    assert cheap["sram_stall_cycles"] == 0
    assert run(ARCH, "tlm")["sram_stall_cycles"] < narrow["sram_stall_cycles"]
