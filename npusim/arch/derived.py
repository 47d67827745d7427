"""Figures derived from an arch description: peak compute, memory sizes, bandwidths."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from npusim.arch.schema import Arch


@dataclass(frozen=True)
class ArchSummary:
    """What a user checks first about a chip. TFLOPS count a MAC as 2 FLOPs."""

    name: str
    cores: int
    mesh: str
    clock_ghz: float
    peak_tflops: dict[str, float]
    sram_mb_per_core: float
    sram_mb_total: float
    hbm_channels: int
    hbm_gb: float
    hbm_bandwidth_gbps: float
    hbm_attach_routers: list[int]
    noc_link_gbps: float
    noc_bisection_gbps: float

    def to_dict(self) -> dict:
        return asdict(self)


def kv_cache_base_address(arch: Arch, core: int) -> int:
    """HBM byte address of core ``core``'s KV-cache region: weights occupy the lower half of
    HBM, KV caches the upper half, one equal slice per core (the one home of this layout;
    the mapper's KV reads/writes use it; a serving instance's KV spills start at the region's
    start and follow the KV manager's extents)."""
    half = int(arch.hbm.capacity_gb * 2**30) // 2
    return half + core * (half // arch.num_cores)


def channel_bandwidths_gbps(arch: Arch) -> np.ndarray:
    """Data-bus bandwidth of every HBM/DRAM channel (core classes may set their own channel's)."""
    bw = np.full(arch.hbm.channels, arch.hbm.bandwidth_per_channel_gbps)
    if arch.hbm.attach == "per_core":
        for cls in arch.core_classes.values():
            if cls.channel_bandwidth_gbps is not None:
                bw[cls.cores] = cls.channel_bandwidth_gbps
    return bw


def hbm_attach_routers(arch: Arch) -> np.ndarray:
    """Router (core) id where each HBM channel meets the mesh.

    ``edge``: channels alternate between the west (x=0) and east (x=W-1) edges,
    spread evenly over the rows; ``per_core``: channel i at router i.
    """
    w, h = arch.cores.grid.width, arch.cores.grid.height
    attach = arch.hbm.attach
    n = arch.hbm.channels
    if attach == "per_core":
        return np.arange(n, dtype=np.int64)
    if isinstance(attach, list):
        return np.asarray(attach, dtype=np.int64)
    routers = np.empty(n, dtype=np.int64)
    per_side = (n + 1) // 2
    for ch in range(n):
        side, idx = ch % 2, ch // 2
        y = min(h - 1, (idx * h) // per_side) if per_side else 0
        x = 0 if side == 0 else w - 1
        routers[ch] = y * w + x
    return routers


def summarize(arch: Arch) -> ArchSummary:
    n = arch.num_cores
    peak: dict[str, float] = {}
    for core in range(n):  # core classes may differ
        sa = arch.systolic_for(core)
        for dtype, k in sa.macs_per_pe_per_cycle.items():
            peak[dtype] = peak.get(dtype, 0.0) + sa.rows * sa.cols * k * 2 * arch.clock_ghz / 1e3
    peak = dict(sorted(peak.items()))
    sram_total = sum(arch.sram_for(c).capacity_mb for c in range(n))
    w, h = arch.cores.grid.width, arch.cores.grid.height
    link_gbps = arch.noc.link_bytes_per_cycle * arch.clock_ghz
    # The narrowest cut through the middle of a W x H mesh crosses min(W, H) links,
    # each carrying traffic in both directions.
    bisection_links = min(w, h) if max(w, h) > 1 else 0
    return ArchSummary(
        name=arch.name,
        cores=n,
        mesh=f"{w}x{h}",
        clock_ghz=arch.clock_ghz,
        peak_tflops=peak,
        sram_mb_per_core=arch.cores.sram.capacity_mb,
        sram_mb_total=sram_total,
        hbm_channels=arch.hbm.channels,
        hbm_gb=arch.hbm.capacity_gb,
        hbm_bandwidth_gbps=float(channel_bandwidths_gbps(arch).sum()),
        hbm_attach_routers=hbm_attach_routers(arch).tolist(),
        noc_link_gbps=link_gbps,
        noc_bisection_gbps=2 * bisection_links * link_gbps,
    )
