"""Two streams on one die share its HBM (npusim.system.execute): kernels that together ask for more
than the die's bandwidth slow down while they overlap; a lone stream, or streams within the
bandwidth, keep their times."""

import pytest

from npusim.arch import summarize
from npusim.system.chipcost import ChipCost
from npusim.system.execute import cost_kernels, time_workload
from npusim.system.load import load_system
from npusim.system.workload import Workload

# a decode-like GEMM: 16384 x 3072 INT8 weights (48 MiB), 8 tokens: 12 base blocks, one per core of
# the 12 (one wave), each core streaming its weights at its own rate: together most of the die's HBM
HBM_BOUND = {"type": "gemm", "m": 8, "k": 16384, "n": 3072, "dtype": "int8", "cores": 12}
WEIGHT_BYTES = 16384 * 3072


@pytest.fixture(scope="module")
def cm():
    return load_system("cloudmatrix384", nodes=1)


def _two_streams(second: dict | None) -> Workload:
    wl = Workload(1, meta={"model": "deepseek-r1"})
    wl.compute(0, HBM_BOUND, name="a", stream="compute")
    if second is not None:
        wl.compute(0, second, name="b", stream="moe")
    return wl


def test_overlapping_hbm_bound_kernels_share_the_bandwidth(cm):
    alone = time_workload(_two_streams(None), cm)
    both = time_workload(_two_streams(HBM_BOUND), cm)
    t_alone = alone.kernel_us[0]
    assert alone.node_us == [t_alone]  # one stream: nothing shared
    assert both.kernel_us[0] == t_alone and both.node_us[0] == both.node_us[1]
    # equal demands, fully overlapped: each runs as it would alone with half the die's HBM; that
    # halving slows it by more than its HBM-bound part's share allows it to hide (a kernel's fixed
    # start, e.g. a MIX kernel's AIV launch, takes no bandwidth, so not a full 2x)
    half = cost_kernels(_two_streams(None), ChipCost(cm.chip), hbm_fraction=0.5)[0][0]
    assert both.node_us[0] == pytest.approx(half) and half > 1.2 * t_alone
    # bytes / time of the two overlapping kernels stays within the die's HBM (shares rounded to 1/20)
    peak_bytes_per_us = summarize(cm.chip).hbm_bandwidth_gbps * 1e3
    demand_alone = WEIGHT_BYTES / t_alone
    assert demand_alone > 0.6 * peak_bytes_per_us  # the premise: each alone takes most of the HBM
    assert sum(WEIGHT_BYTES / us for us in both.node_us) <= peak_bytes_per_us * 1.05
    assert both.step_us > alone.step_us


def test_streams_within_the_bandwidth_keep_their_times(cm):
    light = {"type": "fixed", "us": 50.0, "source": "test"}  # no HBM traffic
    both = time_workload(_two_streams(light), cm)
    assert both.node_us == both.kernel_us
