"""Silicon area of a multi-core NPU at 7 nm, for throughput-per-mm² comparisons.

Every figure comes from LLMCompass's cost model (Zhang et al., ISCA 2024; code
``PrincetonUniversity/LLMCompass``, ``cost_model/cost_model.py``), which counts transistors per
unit and divides by the 7 nm logic density, 96.3 million transistors per mm²:

- systolic-array PE (one FP16 MAC): a 64-bit FPU's 685,300 transistors × (10/52)² mantissa
  scaling = 25,343 Tr -> 263.2 µm² per PE;
- vector lane (one FP32 FPU): 685,300 × (23/52)² = 134,072 Tr -> 1,392 µm² per lane;
- core control: 996,200 Tr per vector lane -> 10,345 µm² per lane;
- SRAM: 0.170 µm² bit cells at 60.2% array efficiency (512 KiB macros) -> 2.369 mm² per MiB;
- NoC router: the per-core interconnect interface, 44.3 M Tr -> 0.460 mm² per core;
- HBM2e PHY: 10.45 mm² per 1024-bit stack interface (PHYs do not scale with the process);
- HBM2e controller: 552.7 M Tr per stack -> 5.740 mm² per stack.

So a 128×128 array is 4.31 mm² and 32 MiB of SRAM 75.8 mm² (LLMCompass's 7 nm figures, rounded:
≈2.37 mm²/MB, ≈263 µm²/PE, 10.45 mm²/stack).

Assumptions: a PE is one FP16 multiply-accumulate unit (INT8 support adds nothing); a vector lane
is one FP32 FPU plus LLMCompass's per-lane control overhead (derived from GPU SMs, so it is an
*estimate* for an NPU's simpler vector unit; pass ``control_um2_per_lane=0`` to leave it out);
the router area reuses LLMCompass's per-core interconnect interface as an *estimate* of a 2D-mesh
router with its links; I/O other than HBM (PCIe, die-to-die, scale-up links), clocking and
whitespace are not counted. Arch fields are plain arguments so this module does not depend on
the arch schema.
"""

from __future__ import annotations

from npusim.errors import ConfigError

LOGIC_MTR_PER_MM2 = 96.3
"""7 nm logic density, million transistors per mm² (LLMCompass)."""

FPU64_TRANSISTORS = 685_300
PE_FP16_UM2 = FPU64_TRANSISTORS * (10 / 52) ** 2 / LOGIC_MTR_PER_MM2  # ≈ 263.2 µm²
VECTOR_LANE_FP32_UM2 = FPU64_TRANSISTORS * (23 / 52) ** 2 / LOGIC_MTR_PER_MM2  # ≈ 1,392 µm²
CONTROL_UM2_PER_LANE = 996_200 / LOGIC_MTR_PER_MM2  # ≈ 10,345 µm²
SRAM_MM2_PER_MB = 8 * 2**20 * 1.70e-7 / 0.602  # ≈ 2.369 mm² per MiB
ROUTER_MM2 = 44.3 / LOGIC_MTR_PER_MM2  # ≈ 0.460 mm² per core
HBM2E_PHY_MM2_PER_STACK = 10.45
HBM2E_CTRL_MM2_PER_STACK = 552.743 / LOGIC_MTR_PER_MM2  # ≈ 5.740 mm²


def _non_negative(value, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ConfigError(f"area model: {name} must be a number >= 0, got {value!r}")
    return float(value)


def core_area_mm2(array_rows: int, array_cols: int, sram_mb: float, vector_lanes: int = 128, *,
                  macs_per_pe: int = 1, pe_um2: float = PE_FP16_UM2, vector_lane_um2: float = VECTOR_LANE_FP32_UM2,
                  control_um2_per_lane: float = CONTROL_UM2_PER_LANE, sram_mm2_per_mb: float = SRAM_MM2_PER_MB,
                  router_mm2: float = ROUTER_MM2) -> dict[str, float]:
    """Area of one core in mm², per component and ``total_mm2``.

    Args:
        array_rows, array_cols: systolic array size in PEs (``cores.systolic_array``).
        macs_per_pe: FP16 MAC units per PE (``macs_per_pe_per_cycle["fp16"]``; 16 for a
            16×16×16 cube), each costing ``pe_um2``.
        sram_mb: core-local SRAM in MiB (``cores.sram.capacity_mb``).
        vector_lanes: vector-unit lanes (``cores.vector_unit.lanes``; default 128, an estimate
            when the arch does not say).
        pe_um2, vector_lane_um2, control_um2_per_lane: µm² per PE, per lane, per lane of control.
        sram_mm2_per_mb, router_mm2: mm² per MiB of SRAM, mm² per core for its NoC router.
    """
    macs = (_non_negative(array_rows, "array_rows") * _non_negative(array_cols, "array_cols")
            * _non_negative(macs_per_pe, "macs_per_pe"))
    lanes = _non_negative(vector_lanes, "vector_lanes")
    parts = {
        "systolic_array_mm2": macs * _non_negative(pe_um2, "pe_um2") * 1e-6,
        "vector_unit_mm2": lanes * _non_negative(vector_lane_um2, "vector_lane_um2") * 1e-6,
        "control_mm2": lanes * _non_negative(control_um2_per_lane, "control_um2_per_lane") * 1e-6,
        "sram_mm2": _non_negative(sram_mb, "sram_mb") * _non_negative(sram_mm2_per_mb, "sram_mm2_per_mb"),
        "router_mm2": _non_negative(router_mm2, "router_mm2"),
    }
    parts["total_mm2"] = sum(parts.values())
    return parts


def hbm_area_mm2(hbm_stacks: float, *, phy_mm2_per_stack: float = HBM2E_PHY_MM2_PER_STACK,
                 ctrl_mm2_per_stack: float = HBM2E_CTRL_MM2_PER_STACK) -> dict[str, float]:
    """On-die HBM interface area in mm²: PHYs (which do not shrink with the process) and
    controllers, per 1024-bit stack interface. The DRAM stacks themselves are off the die."""
    stacks = _non_negative(hbm_stacks, "hbm_stacks")
    parts = {"hbm_phy_mm2": stacks * _non_negative(phy_mm2_per_stack, "phy_mm2_per_stack"),
             "hbm_controller_mm2": stacks * _non_negative(ctrl_mm2_per_stack, "ctrl_mm2_per_stack")}
    parts["total_mm2"] = sum(parts.values())
    return parts


def chip_area_mm2(cores: int, array_rows: int, array_cols: int, sram_mb_per_core: float, hbm_stacks: float,
                  vector_lanes: int = 128, **core_overrides) -> dict[str, float]:
    """Area of a chip of ``cores`` identical cores plus ``hbm_stacks`` HBM2e interfaces, in mm².

    Returns every component summed over the chip (``systolic_array_mm2``, ``vector_unit_mm2``,
    ``control_mm2``, ``sram_mm2``, ``router_mm2``, ``hbm_phy_mm2``, ``hbm_controller_mm2``),
    ``core_mm2`` (one core) and ``total_mm2``. ``core_overrides`` are the keyword figures of
    :func:`core_area_mm2`. For heterogeneous chips (e.g. decode cores with smaller arrays) add
    :func:`core_area_mm2` of each group to :func:`hbm_area_mm2`.
    """
    n = _non_negative(cores, "cores")
    core = core_area_mm2(array_rows, array_cols, sram_mb_per_core, vector_lanes, **core_overrides)
    chip = {name: value * n for name, value in core.items() if name != "total_mm2"}
    hbm = hbm_area_mm2(hbm_stacks)
    chip.update({name: value for name, value in hbm.items() if name != "total_mm2"})
    chip["core_mm2"] = core["total_mm2"]
    chip["total_mm2"] = core["total_mm2"] * n + hbm["total_mm2"]
    return chip


def arch_area_mm2(arch, hbm_stacks: float | None = None, **core_overrides) -> dict[str, float]:
    """:func:`chip_area_mm2` of a loaded :class:`~npusim.arch.schema.Arch` (cores, array size,
    FP16 MACs per PE, SRAM, vector lanes read from it).

    The number of HBM stacks is not in the arch schema: ``hbm_stacks=None`` assumes the arch's
    ``hbm.channels`` are HBM2/2e pseudo-channels, 16 per 1024-bit stack (as in the shipped
    presets: 64 channels = 4 stacks), rounded up; pass the number for other layouts (e.g.
    NpuSim-style per-core DRAM channels).
    """
    c = arch.cores
    stacks = -(-arch.hbm.channels // 16) if hbm_stacks is None else hbm_stacks
    overrides = {"macs_per_pe": c.systolic_array.macs_per_pe_per_cycle.get("fp16", 1), **core_overrides}
    return chip_area_mm2(arch.num_cores, c.systolic_array.rows, c.systolic_array.cols, c.sram.capacity_mb,
                         stacks, c.vector_unit.lanes, **overrides)


def per_mm2(throughput: float, area: float | dict) -> float:
    """``throughput`` per mm² of ``area`` (a number in mm², or a dict with ``total_mm2``)."""
    total = area["total_mm2"] if isinstance(area, dict) else area
    if isinstance(total, bool) or not isinstance(total, (int, float)) or not total > 0:
        raise ConfigError(f"area must be a positive number of mm², got {total!r}")
    return throughput / total
