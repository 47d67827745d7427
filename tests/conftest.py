import os
import tempfile

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "npusim-test-numba-cache"))

import pytest  # noqa: E402

from npusim.arch import load_arch  # noqa: E402


@pytest.fixture(scope="session")
def arch64():
    return load_arch("npusim-64c")


@pytest.fixture(scope="session")
def small_arch(tmp_path_factory):
    """A 2x2 chip with one HBM channel per core and short, round DRAM timings (1 GHz, tCK 1 ns)."""
    path = tmp_path_factory.mktemp("arch") / "small.yaml"
    path.write_text(SMALL_ARCH_YAML)
    return load_arch(path)


SMALL_ARCH_YAML = """
name: small
clock_ghz: 1.0
cores:
  grid: {width: 2, height: 2}
  systolic_array: {rows: 8, cols: 8, weight_injection_cycles: 8}
  vector_unit: {lanes: 16}
  sram: {capacity_mb: 1}
  dma: {engines: 2, max_outstanding: 8, transaction_bytes: 64}
hbm:
  channels: 4
  capacity_gb: 1
  attach: per_core
  tck_ns: 1.0
  bus_width_bits: 64
  burst_length: 4
  banks: 8
  row_bytes: 1024
  interleave_bytes: 256
  frontend_latency_ns: 5
  timing: {tRCD: 14, tCL: 14, tRP: 14, tRAS: 33, tCCD: 2, tWL: 4, tWR: 16, tWTR: 8, tRTW: 4}
"""
