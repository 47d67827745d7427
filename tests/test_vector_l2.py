"""The vector kernels' traffic as the vendor kernels and the calibration half say (issue 39, session
44): AddRmsNorm reads x1 and x2 and writes x and y; an input the previous kernel left in the L2 is
read from it, and each AIV writes its own rows back (the core's engines in parallel); a kernel run
alone keeps its writes in the write-back L2 when they fit; an in-model profile's rows of one shape
are separate operators."""

from __future__ import annotations

import pytest

from npusim.errors import ConfigError
from npusim.model.ir import Op
from npusim.system.chipcost import ChipCost

DIE = "ascend-910c-die"
MIB = 2**20


@pytest.fixture(scope="module")
def cost():
    return ChipCost(DIE, persist=False)


def _op(op_class, rows, row_len, fn=None):
    return Op("v", "vector", dtype="bf16", elements=rows * row_len, op_class=op_class, fn=fn, row_len=row_len)


def test_add_rmsnorm_reads_x1_and_x2_and_writes_x_and_y(cost):
    from npusim.hw.compute.vector_kernel import instructions

    assert instructions("rmsnorm", "add")[0].name.startswith("Add")
    assert instructions("rmsnorm", "add")[1:] == instructions("rmsnorm")
    plain, fused = cost.vector(_op("rmsnorm", 512, 5120)), cost.vector(_op("rmsnorm", 512, 5120, fn="add"))
    nbytes = 512 * 5120 * 2
    assert plain.hbm_read_bytes == nbytes and plain.hbm_write_bytes == nbytes
    assert fused.hbm_read_bytes == 2 * nbytes and fused.hbm_write_bytes == 2 * nbytes
    assert fused.time_us > plain.time_us


def test_an_input_the_l2_holds_is_read_from_it(cost):
    op = _op("copy", 41040 * 4, 128)  # 42 MB
    cold, warm = cost.vector(op), cost.vector(op, resident_inputs=1)
    assert cold.hbm_read_bytes == op.elements * 2 and cold.l2_read_bytes == 0
    assert warm.hbm_read_bytes == 0 and warm.l2_read_bytes == op.elements * 2
    assert warm.hbm_write_bytes == op.elements * 2
    # bound by its writes to HBM: within 10% of their time at the HBM's peak, plus the kernel's fixed costs
    # (each AIV writes its own rows back: the core's engines in parallel; one engine per core for the
    # writes held this copy to 45 us against 26 us of writes)
    write_us = op.elements * 2 / (warm.hbm_peak_bandwidth_gbps * 1e3)
    assert warm.time_us <= 1.1 * write_us + warm.kernel_fixed_us
    # an input beyond the L2's capacity is not resident; an op with one input has no second to hold
    assert cost._resident_inputs(_op("copy", 200 * MIB // 256, 128), 1) == 0
    assert cost._resident_inputs(op, 2) == 1
    with pytest.raises(ConfigError):
        cost.vector(op, resident_inputs=-1)


def test_a_kernel_run_alone_keeps_its_writes_in_the_l2_when_they_fit(cost):
    op = _op("elementwise", 4096, 4096)  # 32 MB out, 32 MB in
    hbm, kept = cost.vector(op), cost.vector(op, absorb_writes=True)
    assert hbm.hbm_write_bytes == op.elements * 2 and kept.hbm_write_bytes == 0
    assert kept.time_us <= hbm.time_us
    # the asc-devkit Add sample's shape: 268 MB in, 134 MB out; the L2 (192 MB) keeps the output only
    # when the loads bypass it
    add = Op("add", "vector", dtype="fp16", elements=8192 * 8192, op_class="elementwise", row_len=8192,
             inputs=("x", "y"))
    assert not cost._absorbs_writes(add, bypass=False)
    assert cost._absorbs_writes(add, bypass=True)


def test_an_in_model_profiles_rows_of_one_shape_are_separate_operators():
    from npusim.validate.operators import _fastest

    rows = [{"source": "prof", "family": "vector", "op": "Add", "shape": {"tensor": [1, 7168]}, "dtype": "bf16",
             "measured_us": 2.6},
            {"source": "prof", "family": "vector", "op": "AddRmsNormBias", "shape": {"tensor": [1, 7168]},
             "dtype": "bf16", "measured_us": 3.9},
            {"source": "bench", "family": "vector", "op": "RoPE (a)", "shape": {"tensor": [4, 64]}, "dtype": "bf16",
             "measured_us": 7.0},
            {"source": "bench", "family": "vector", "op": "RoPE (b)", "shape": {"tensor": [4, 64]}, "dtype": "bf16",
             "measured_us": 6.0}]
    assert [(i, n) for i, _, n in _fastest(rows, {"prof"})] == [(0, 1), (1, 1), (3, 2)]
