"""The operator runtime of plan runs (npusim.system.schema.Runtime, npusim.system.execute): every
operator holds its stream at least the launch floor, a step pays the host overhead once, the
calibration solves both from its two published rows, and DeepSeek deployments keep their own
calibrated constants instead."""

import pytest

from npusim.system.execute import time_workload
from npusim.system.load import load_system
from npusim.system.mapper import StepShape
from npusim.system.plan import ParallelPlan
from npusim.system.step import simulate_plan_step
from npusim.system.workload import Workload
from npusim.validate.calibrate import _variant, runtime_constants
from npusim.validate.plans import simulated_step_ms
from npusim.validate.published import published


@pytest.fixture(scope="module")
def a2():
    return load_system("atlas-800i-a2", nodes=1)


def test_an_operator_is_never_shorter_than_the_floor(a2):
    wl = Workload(1, meta={"model": "qwen2-7b"})
    wl.compute(0, {"type": "gemm", "m": 1, "k": 64, "n": 64, "dtype": "bf16"}, name="tiny")
    bare = time_workload(wl, a2, launch_us=0.0)
    assert bare.kernel_us[0] < 5  # the premise: a tiny GEMM takes a few microseconds
    assert time_workload(wl, a2, launch_us=40.0).kernel_us[0] == 40.0
    below = bare.kernel_us[0] / 2
    assert time_workload(wl, a2, launch_us=below).kernel_us[0] == bare.kernel_us[0]


def test_the_floor_and_the_step_overhead_only_slow_a_step(a2):
    plan, shape = ParallelPlan(npus=1), StepShape("decode", 8, 1, 1024)
    steps = []
    for launch, overhead in ((0.0, 0.0), (10.0, 0.0), (30.0, 0.0), (30.0, 5000.0)):
        sys_ = _variant(a2, {"runtime": {"launch_us": launch, "step_overhead_us": overhead}})
        out, wl, _ = simulate_plan_step(sys_, "qwen2-7b", plan, shape)
        steps.append(out["step_ms"])
        assert wl.meta["launch_us"] == launch
    assert steps[0] < steps[1] < steps[2]
    assert steps[3] == pytest.approx(steps[2] + 5.0, rel=1e-9)  # the host overhead, once per step


def test_the_runtime_calibration_reproduces_its_two_rows(a2):
    launch, overhead = runtime_constants()
    assert launch.name == "runtime.launch_us" and 0 < launch.recomputed < 1000
    solved = _variant(a2, {"runtime": {"launch_us": launch.recomputed, "step_overhead_us": overhead.recomputed}})
    for r in published()["ascend_plan_steps"]["rows"]:
        if r.get("role") == "calibration":
            assert simulated_step_ms(solved, r) == pytest.approx(r["ms"], rel=1e-4)


def test_a_deployment_keeps_its_own_constants():
    from npusim.mapping.spec import MAPPER_DIR, load_deployment
    from npusim.system.moe_step import simulate_step

    a2_32 = load_system("atlas-800i-a2", nodes=4)
    r = simulate_step(a2_32, load_deployment(MAPPER_DIR / "a2-deepseek-decode.yaml"), batch=8, kv=1024)
    assert r.workload.meta["launch_us"] == 0.0 and a2_32.system.runtime.launch_us > 0
