"""The transaction-level L2 (npusim.hw.memory.hbm, "L2"): hits, misses, conservation, bandwidth."""

import numpy as np
import pytest

from npusim.arch import load_arch
from npusim.arch.schema import Arch, merge_arch_data
from npusim.config import validate
from npusim.errors import ConfigError
from npusim.sim import Simulator

KIB, MIB = 1024, 2**20


def _arch(**l2) -> Arch:
    """ascend-910b with its L2 changed (a 1 MiB L2 keeps the runs small)."""
    base = load_arch("ascend-910b")
    data = merge_arch_data(base.model_dump(mode="json"), {"l2": {"capacity_mb": 1, **l2}})
    return validate(Arch, data, "test arch")


def _pass(sim: Simulator, nbytes: int, base: int = 0, write: bool = False, cores=None, prev=None) -> list[int]:
    """One linear pass over ``[base, base + nbytes)`` split evenly over the engines of ``cores``."""
    cores = list(range(sim.arch.num_cores)) if cores is None else cores
    inits = [(c, e) for c in cores for e in range(sim.dma_engines)]
    share = nbytes // len(inits)
    assert share * len(inits) == nbytes and share % 128 == 0, "whole lines per engine"
    out = []
    for i, (c, e) in enumerate(inits):
        deps = [] if prev is None else [prev[i]]
        out.append(sim.add_dma(c, share, address=base + i * share, write=write, dma_engine=e, deps=deps))
    return out


def _two_passes(arch: Arch, nbytes: int, **kw):
    """Run a pass, then the same pass again; the L2's statistics after each."""
    sim = Simulator(arch, memory_mode="tlm", memory_over_noc=False)
    first = _pass(sim, nbytes, **kw)
    sim.run()
    one, t1 = sim.l2_stats(), sim.makespan()
    _pass(sim, nbytes, prev=first, **kw)
    sim.run()
    return sim, one, sim.l2_stats(), t1


def test_a_second_pass_over_a_region_within_the_capacity_hits():
    sim, one, two, _ = _two_passes(_arch(), 768 * KIB)
    assert one["hit_bytes"] == 0 and one["miss_bytes"] == 768 * KIB
    assert two["hit_bytes"] - one["hit_bytes"] == 768 * KIB  # every byte of the second pass
    assert sim.memory_checks() == {"exclusion_rule_violations": 0, "phase_order_violations": 0}


def test_streaming_a_region_much_larger_than_the_capacity_does_not_hit():
    """LRU under a cyclic stream of 6x the capacity evicts every line before its re-use."""
    _, _, two, _ = _two_passes(_arch(), 6 * MIB)
    assert two["hit_rate"] < 0.01


def test_bytes_are_conserved():
    """Hits + misses = bytes read; HBM moves exactly the misses and the writes."""
    arch = _arch()
    sim = Simulator(arch, memory_mode="tlm", memory_over_noc=False)
    w = _pass(sim, 384 * KIB, base=8 * MIB, write=True)
    r1 = _pass(sim, 768 * KIB, prev=w)
    _pass(sim, 768 * KIB, base=0, prev=r1)
    sim.run()
    s = sim.l2_stats()
    reads = 2 * 768 * KIB
    assert s["hit_bytes"] + s["miss_bytes"] == s["read_bytes"] == reads
    assert s["write_bytes"] == 384 * KIB
    assert int(sim.mem.ch_bytes.sum()) == s["miss_bytes"] + s["write_bytes"]
    assert s["hits"] * 64 == s["hit_bytes"] and s["misses"] * 64 == s["miss_bytes"]
    assert sum(s["slice_bytes"]) == s["hit_bytes"] + s["miss_bytes"] + s["write_bytes"]  # hits, fills, writes


def test_hits_never_exceed_the_slice_bandwidth():
    """With a slow L2 (200 GB/s over 4 slices) the hits of a second pass, and all the bytes the
    slices move (the first pass's fills, then the hits), take at least bytes / bandwidth; the L2,
    not the HBM, is what paces the run."""
    arch = _arch(bandwidth_gbps=200, slices=4, core_bytes_per_cycle=None)
    sim, one, two, t1 = _two_passes(arch, 768 * KIB)
    hit = two["hit_bytes"] - one["hit_bytes"]
    assert hit == 768 * KIB
    ns = 1 / arch.clock_ghz
    assert hit / ((sim.makespan() - t1) * ns) <= 200 * 1.001
    moved = sum(two["slice_bytes"])
    assert moved == 2 * 768 * KIB
    assert 200 * 0.9 < moved / (sim.makespan() * ns) <= 200 * 1.001
    assert min(two["slice_bytes"]) > 0  # lines interleave over every slice


def test_one_core_reads_hits_at_most_at_its_l2_rate():
    arch = _arch(core_bytes_per_cycle=16)
    sim, one, two, t1 = _two_passes(arch, 128 * KIB, cores=[5])
    assert two["hit_bytes"] - one["hit_bytes"] == 128 * KIB
    assert 128 * KIB / (sim.makespan() - t1) <= 16 * 1.001


def test_written_data_hits_when_read_back_only_with_write_allocate():
    for allocate, expect in ((True, 1.0), (False, 0.0)):
        sim = Simulator(_arch(write_allocate=allocate), memory_mode="tlm", memory_over_noc=False)
        w = _pass(sim, 384 * KIB, write=True)
        _pass(sim, 384 * KIB, prev=w)
        sim.run()
        assert sim.l2_stats()["hit_rate"] == expect


def test_readers_of_one_line_at_once_cost_hbm_one_read():
    """Every core reads the same 64 KiB at the same time: HBM serves it about once; the hits that
    arrive while its fill is in flight wait for it (merged)."""
    sim = Simulator(_arch(), memory_mode="tlm", memory_over_noc=False)
    for c in range(sim.arch.num_cores):
        sim.add_dma(c, 64 * KIB, address=0)
    sim.run()
    s = sim.l2_stats()
    assert s["miss_bytes"] <= 2 * 64 * KIB and s["merged"] > 0
    assert s["read_bytes"] == sim.arch.num_cores * 64 * KIB


def test_the_heap_keeps_room_for_every_hit_a_fill_releases():
    """A fill's response pushes one event per hit waiting for it, up to every transaction in
    flight: the simulator keeps that much heap room before any handler runs (an overflow would be
    an out-of-bounds write in the kernel, which does not check bounds)."""
    arch = _arch()
    sim = Simulator(arch, memory_mode="tlm", memory_over_noc=False)
    plain = Simulator(arch.model_copy(update={"l2": None}), memory_mode="tlm", memory_over_noc=False)
    slots = arch.num_cores * arch.cores.dma.engines * arch.cores.dma.max_outstanding
    assert sim._headroom == plain._headroom + slots


def test_the_l2_is_deterministic():
    runs = [_two_passes(_arch(slices=3), 1536 * KIB) for _ in range(2)]
    assert runs[0][0].makespan() == runs[1][0].makespan()
    assert runs[0][2] == runs[1][2]
    assert np.array_equal(runs[0][0].task_times()[1], runs[1][0].task_times()[1])


@pytest.mark.parametrize("memory", ["tlm", "analytical"])
def test_no_l2_or_the_analytical_fidelity_leaves_the_memory_model_as_it_was(memory):
    """Without an ``l2`` section (or at the analytical fidelity, which has no cache) a program runs
    exactly as on the same chip before the TLM L2 existed: the model's L2 stays off."""
    arch = _arch()
    plain = arch.model_copy(update={"l2": None})
    ends = []
    for a in ((plain, arch) if memory == "analytical" else (plain,)):
        sim = Simulator(a, memory_mode=memory, memory_over_noc=False)
        r = _pass(sim, 768 * KIB)
        _pass(sim, 768 * KIB, prev=r)
        sim.run()
        assert sim.l2_stats() is None
        ends.append(sim.task_times()[1].tolist())
    assert all(e == ends[0] for e in ends)


def test_bad_l2_geometry_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match="l2.line_bytes"):
        _arch(line_bytes=96)
    with pytest.raises(ConfigError, match="l2"):
        _arch(capacity_mb=0.001, ways=64, line_bytes=1024)
    with pytest.raises(ConfigError, match="l2.line_bytes"):
        Simulator(_arch(capacity_mb=2**20, line_bytes=32), memory_mode="tlm")


def test_a_chip_gemm_at_tlm_loads_the_same_bytes_and_hits_as_the_reuse_model_finds():
    """The chip-cost GEMM at the TLM fidelity reads its operands at their real addresses: the
    loads are the reuse model's (bytes conserved: HBM reads + L2 hits = the same total), and on a
    shape whose operands fit the L2 the simulated cache finds the reuse model's hit rate (within
    0.01: its set conflicts, C's allocation and line sharing are what may differ)."""
    from npusim.system.chipcost import ChipCost

    arch = load_arch("ascend-910c-die")
    tlm = ChipCost(arch, memory="tlm", persist=False).gemm(512, 1024, 768, "int8")
    reuse = ChipCost(arch, memory="tlm", persist=False, l2_cache=False).gemm(512, 1024, 768, "int8")
    assert tlm.plan == reuse.plan
    assert tlm.hbm_read_bytes + tlm.l2_read_bytes == pytest.approx(reuse.hbm_read_bytes + reuse.l2_read_bytes,
                                                                   abs=64)
    assert tlm.hbm_write_bytes == reuse.hbm_write_bytes
    assert tlm.l2_read_bytes > 0
    assert tlm.l2_hit_rate == pytest.approx(reuse.l2_hit_rate, abs=0.01)
    assert tlm.hbm_bytes == tlm.hbm_read_bytes + tlm.hbm_write_bytes  # the channels moved exactly the misses


def test_shared_kv_re_reads_at_tlm_are_real_reads_the_cache_serves():
    """Head-parallel GQA: the cores that share a KV head read it whole from one place at the TLM
    fidelity; the simulated L2 serves all but the first (the reuse model's hit rate, within 0.01),
    and the bytes loaded are the same."""
    from npusim.model.ir import Op
    from npusim.system.chipcost import ChipCost

    op = Op(name="L0.attn.attention", kind="attention", layer=0, dtype="bf16", batch=4, q_len=1, kv_len=1024,
            heads=32, kv_heads=4, head_dim=128)
    arch = load_arch("ascend-910b")
    tlm = ChipCost(arch, memory="tlm", persist=False).op(op)
    reuse = ChipCost(arch, memory="tlm", persist=False, l2_cache=False).op(op)
    assert tlm.l2_read_bytes > 0
    assert tlm.l2_hit_rate == pytest.approx(reuse.l2_hit_rate, abs=0.01)
    assert tlm.l2_read_bytes + tlm.hbm_read_bytes == pytest.approx(reuse.l2_read_bytes + reuse.hbm_read_bytes,
                                                                   rel=1e-3)


def test_a_hit_waits_only_for_a_fill_that_brings_its_sectors():
    """Core 1 re-reads the first halves of lines already in the L2 while core 0 fills their second
    halves: its hits have their data, so none waits for (merges with) core 0's fills in flight, and
    they take as long as beside fills of other lines (review finding: 3 of 1,024 merged, 735
    against 602 cycles, before a fill's sectors were checked)."""
    lines, line = 256, 512

    def run(base):
        sim = Simulator(_arch(), memory_mode="tlm", memory_over_noc=False)
        warm = [sim.add_dma(0, line // 2, address=i * line) for i in range(lines)]  # first halves into the L2
        gate = sim.add_compute(0, "cube", 10, deps=warm)
        for i in range(lines):  # core 0: the second halves of the same lines (base 0) or of other lines
            sim.add_dma(0, line // 2, address=base + i * line + line // 2, deps=[gate])
        hits = [sim.add_dma(1, line // 2, address=i * line, deps=[gate]) for i in range(lines)]
        sim.run()
        start, end = sim.task_times()
        return max(end[h] for h in hits) - min(start[h] for h in hits), sim.l2_stats()

    same, s_same = run(0)
    other, s_other = run(MIB // 2)
    assert s_same["hit_bytes"] == s_other["hit_bytes"] == lines * line // 2
    assert s_same["merged"] == s_other["merged"] == 0
    assert same == other


def test_an_l2_needs_global_addresses_and_lines_that_hold_whole_transactions():
    base = load_arch("npusim-64c")
    for extra, key in (({"hbm": {"attach": "per_core"}}, "per_core"),
                       ({"l2": {"line_bytes": 128}}, "l2.line_bytes")):
        data = merge_arch_data(base.model_dump(mode="json"),
                               {"l2": {"capacity_mb": 8, "bandwidth_gbps": 4000}, **extra} if "l2" not in extra else
                               {"l2": {"capacity_mb": 8, "bandwidth_gbps": 4000, **extra["l2"]}})
        with pytest.raises(ConfigError, match=key):
            validate(Arch, data, "test arch")


def test_memory_probe_efficiency_is_hbms_and_never_above_one_with_l2_hits():
    """`npusim mem --repeat`: the passes after the first hit in the L2, so the bandwidth delivered
    can pass the HBM peak; the efficiency is HBM traffic over the peak and stays at most 1 (the
    review found it printed 171%)."""
    from npusim.sim.memory_probe import measure_memory

    r = measure_memory(_arch(), "stream", 256 * KIB, "tlm", None, False, 0, repeat=3)
    assert r.l2_hit_bytes == 2 * 256 * KIB  # the second and third passes
    assert 0 < r.efficiency <= 1
    hbm_bytes = sum(c["bytes"] for c in r.per_channel)
    assert hbm_bytes == 256 * KIB
    assert r.efficiency * r.peak_bandwidth_gbps == pytest.approx(hbm_bytes / r.time_ns)
    assert r.bandwidth_gbps > r.efficiency * r.peak_bandwidth_gbps
