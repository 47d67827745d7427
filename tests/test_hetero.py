"""Heterogeneous cores: core classes with their own arrays, SRAM and DRAM channel bandwidth."""

import pytest

from npusim.arch import summarize
from npusim.arch.schema import Arch
from npusim.config import deep_merge
from npusim.errors import ConfigError
from npusim.config import validate
from npusim.sim import Simulator
from npusim.sim.program import Program


def _hetero(small_arch, **cls):
    data = deep_merge(small_arch.model_dump(), {"core_classes": {"decode": {"cores": [2, 3], **cls}},
                                                "cores": {"dma": {"max_outstanding": 64}}})  # bandwidth-bound
    return validate(Arch, data, "test")


def test_core_class_arrays_time_their_cores(small_arch):
    arch = _hetero(small_arch, systolic_array={"rows": 4, "cols": 4, "weight_injection_cycles": 4})
    prog = Program(4)
    fast = prog.add_gemm(0, 64, 64, 64)
    slow = prog.add_gemm(2, 64, 64, 64)
    dur = prog.durations(arch)
    assert dur[slow] > 3 * dur[fast]  # a 4x4 array on core 2 vs 8x8 on core 0
    s = summarize(arch)
    assert s.peak_tflops["bf16"] == pytest.approx((2 * 64 + 2 * 16) * 2 * 1.0 / 1e3)


def test_core_class_dram_bandwidth(small_arch):
    arch = _hetero(small_arch, channel_bandwidth_gbps=64)  # 4x the default 16 GB/s
    for mode in ("tlm", "analytical"):
        sim = Simulator(arch, memory_mode=mode)
        slow = sim.add_dma(0, 256 * 1024)
        fast = sim.add_dma(2, 256 * 1024)
        sim.run()
        start, end = sim.task_times()
        assert end[fast] - start[fast] < 0.5 * (end[slow] - start[slow]), mode
    assert summarize(arch).hbm_bandwidth_gbps == pytest.approx(2 * 16 + 2 * 64)


def test_core_class_errors(small_arch):
    with pytest.raises(ConfigError, match="outside"):
        _hetero(small_arch, cores=[9])
    data = deep_merge(small_arch.model_dump(), {"hbm": {"attach": "edge", "channels": 2},
                                                "core_classes": {"d": {"cores": [1], "channel_bandwidth_gbps": 9}}})
    with pytest.raises(ConfigError, match="per_core"):
        validate(Arch, data, "test")
    data = deep_merge(small_arch.model_dump(), {"core_classes": {"a": {"cores": [1]}, "b": {"cores": [1]}}})
    with pytest.raises(ConfigError, match="core 1"):
        validate(Arch, data, "test")


def test_example_heterogeneous_chip_matches_the_pd_layout():
    from npusim.arch import load_arch
    from npusim.serving.simulate import pd_regions

    arch = load_arch("examples/hetero-pd.yaml")
    _, decode = pd_regions(arch, 42, 21)
    assert sorted(decode) == sorted(arch.core_classes["decode"].cores)


def test_mapper_budgets_sram_by_the_cores_it_maps_onto(small_arch):
    from graphs import tiny_transformer
    from npusim.mapping import map_model, spec_from_flags

    sram = small_arch.cores.sram.capacity_mb
    arch = _hetero(small_arch, sram={"capacity_mb": sram / 64})  # decode cores 2, 3: a 64th of the SRAM
    graph = tiny_transformer(layers=1)
    spec = spec_from_flags(tp=2)
    spec = spec.model_copy(update={"memory": spec.memory.model_copy(update={"sram_reserve_mb": 0})})
    assert map_model(graph, arch, spec, cores=[0, 1]).weights_resident
    small = map_model(graph, arch, spec, cores=[2, 3])
    assert not small.weights_resident and "stream" in small.notes[0]
