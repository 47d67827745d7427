"""Compute model of one NPU core: the systolic array (GEMM) and the vector unit.

* :mod:`npusim.hw.compute.systolic` -- shape-aware GEMM cycles, utilisation and
  SRAM traffic for weight- and output-stationary dataflows (``gemm_cost``), plus
  numba kernels for costing many GEMMs (``gemm_cycles_nb``, ``gemm_cycles_array``).
* :mod:`npusim.hw.compute.vector` -- SIMD vector-unit cycles per op class
  (``vector_cost``, ``vector_cycles_array``).

All times are in cycles of the core clock; traffic in bytes.
"""

from npusim.hw.compute.systolic import (
    DATAFLOWS,
    GemmCost,
    dataflow_code,
    gemm_cost,
    gemm_cycles_array,
    gemm_cycles_nb,
)
from npusim.hw.compute.vector import (
    ACTIVATION_FUNCTIONS,
    DEFAULT_OPS_PER_CYCLE_PER_LANE,
    DEFAULT_STARTUP_CYCLES,
    OP_CLASSES,
    THROUGHPUT_CLASSES,
    VectorCost,
    vector_cost,
    vector_cycles_array,
)

__all__ = [
    "ACTIVATION_FUNCTIONS",
    "DATAFLOWS",
    "DEFAULT_OPS_PER_CYCLE_PER_LANE",
    "DEFAULT_STARTUP_CYCLES",
    "GemmCost",
    "OP_CLASSES",
    "THROUGHPUT_CLASSES",
    "VectorCost",
    "dataflow_code",
    "gemm_cost",
    "gemm_cycles_array",
    "gemm_cycles_nb",
    "vector_cost",
    "vector_cycles_array",
]
