"""Moved: the area model is :mod:`npusim.arch.area` (a property of the chip, not of serving).
This module re-exports it for code written against the old path (other branches, studies)."""

from npusim.arch.area import (  # noqa: F401
    CONTROL_UM2_PER_LANE, FPU64_TRANSISTORS, HBM2E_CTRL_MM2_PER_STACK, HBM2E_PHY_MM2_PER_STACK, LOGIC_MTR_PER_MM2,
    PE_FP16_UM2, ROUTER_MM2, SRAM_MM2_PER_MB, VECTOR_LANE_FP32_UM2, arch_area_mm2, chip_area_mm2, core_area_mm2,
    hbm_area_mm2, per_mm2,
)
