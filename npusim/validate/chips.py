"""The chips of the NpuSim study's serving experiments, built from the npusim-64c preset.

The study's simulator (NPU-SIM) gives every core its own DRAM channel (distributed memory; the
study sweeps 60/120/240/480 GB/s per core); A8 starts from 60 GB/s per core and gives the
decode cores of a 42:21 split 64x64 arrays and 240 GB/s. ``study_chip`` is that homogeneous
chip (npusim-64c, S32A128, per-core DRAM); ``hetero_chip`` adds the decode-core class on the
cores where ``--schedule disagg --pd-ratio 42:21`` puts decode (``examples/hetero-pd.yaml`` is the
same chip as a file; a test keeps the two equal). DMA engines are sized so the DRAM channel, not
the DMA, is the limit at 480 GB/s.
"""

from __future__ import annotations

from npusim.arch import load_arch
from npusim.arch.schema import Arch
from npusim.config import deep_merge, validate

PER_CORE_GBPS = 60.0  # the study's base per-core DRAM bandwidth (A8's starting point)
DMA = {"max_outstanding": 128, "transaction_bytes": 256, "bytes_per_cycle": 512}


def study_chip(per_core_gbps: float = PER_CORE_GBPS) -> Arch:
    """npusim-64c with one DRAM channel per core at ``per_core_gbps`` (same 64 GB in all)."""
    base = load_arch("npusim-64c")
    data = deep_merge(base.model_dump(), {
        "name": "npusim-64c-percore", "cores": {"dma": DMA},
        "description": f"npusim-64c with per-core {per_core_gbps:g} GB/s DRAM (NpuSim study)",
        "hbm": {"channels": base.num_cores, "attach": "per_core", "capacity_gb": 64,
                "channel_bandwidth_gbps": per_core_gbps}})
    return validate(Arch, data, "the NpuSim study's chip (npusim-64c, per-core DRAM)")


def decode_cores(arch: Arch, pd: tuple[int, int] = (42, 21)) -> list[int]:
    """The cores PD disaggregation at ``pd`` gives the decode instance (the middle columns)."""
    from npusim.serving.simulate import pd_regions

    return sorted(pd_regions(arch, *pd)[1])


def hetero_chip(decode_gbps: float = 240.0, decode_array: int = 64, base: Arch | None = None) -> Arch:
    """``study_chip`` whose 42:21 decode cores have ``decode_array`` square arrays and
    ``decode_gbps`` DRAM channels (a core class named ``decode``)."""
    base = base or study_chip()
    data = deep_merge(base.model_dump(), {
        "name": "hetero-pd", "core_classes": {"decode": {
            "cores": decode_cores(base), "channel_bandwidth_gbps": decode_gbps,
            "systolic_array": {"rows": decode_array, "cols": decode_array,
                               "weight_injection_cycles": decode_array}}}})
    return validate(Arch, data, f"decode cores {decode_array}x{decode_array} at {decode_gbps:g} GB/s")


def homogeneous(arch: Arch) -> Arch:
    """``arch`` with its core classes removed: every core the default core."""
    return validate(Arch, {**arch.model_dump(), "core_classes": {}, "name": f"{arch.name}-homogeneous"},
                    f"{arch.name} without core classes")
