"""The system runtime (issue 39 item 3): one model on every path, eager and graph, host and launch on
the critical path, ``fixed_share``, the runtime section's errors, ``--runtime``."""

import json
from dataclasses import replace

import pytest

from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment
from npusim.model.zoo import get_config
from npusim.system.load import load_system
from npusim.system.mapper import StepShape
from npusim.system.moe_step import simulate_step
from npusim.system.plan import ParallelPlan
from npusim.system.step import simulate_plan_step


@pytest.fixture(scope="module")
def a2():
    return load_system("atlas-800i-a2", nodes=1)


@pytest.fixture(scope="module")
def cm1():
    return load_system("cloudmatrix384", nodes=1)


def _plan_step(a2, batch, runtime, kv=512):
    cfg = replace(get_config("qwen3-4b"), num_layers=4)
    return simulate_plan_step(a2, cfg, ParallelPlan(npus=2, tp=2), StepShape("decode", batch, 1, kv),
                              runtime=runtime)


def _dep_step(cm1, batch, runtime=None):
    dep = Deployment.model_validate(dict(phase="decode", npus=8, tp=1, ep=16, precision="w8a8", microbatches=1))
    return simulate_step(cm1, dep, model="qwen3-30b-a3b", batch=batch, kv=1024, runtime=runtime)


@pytest.mark.parametrize("runtime", ["eager", "graph"])
def test_plan_breakdown_sums_to_the_step_with_host_and_launch(a2, runtime):
    out, _, timing = _plan_step(a2, 1, runtime)
    b = out["breakdown_us"]
    assert sum(b.values()) == pytest.approx(timing.step_us, abs=0.01)  # parts rounded to 1 ns
    assert {"host", "launch", "calibrated"} <= set(b) and b["launch"] > 0 and b["host"] > 0
    assert 0 <= out["fixed_share"] <= 1
    assert out["fixed_share"] == pytest.approx((b["host"] + b["launch"] + b["calibrated"]) / timing.step_us, abs=1e-6)
    assert out["runtime"]["mode"] == runtime


@pytest.mark.parametrize("runtime", ["eager", "graph"])
def test_deployment_breakdown_is_the_critical_path_with_the_same_runtime(cm1, runtime):
    r = _dep_step(cm1, 4, runtime)
    assert sum(r.breakdown_us.values()) == pytest.approx(r.step_ms * 1e3, abs=0.02)
    assert r.breakdown_us["launch"] > 0 and r.breakdown_us["host"] >= cm1.system.runtime.scheduler_us
    assert "calibrated" in r.breakdown_us and 0 <= r.fixed_share <= 1
    assert r.runtime["mode"] == runtime and r.runtime["kernel_launch_us"] == cm1.system.runtime.kernel_launch_us


def test_graph_is_not_slower_than_eager_when_the_host_binds(a2, cm1):
    """At batch 1 the device's kernels are shorter than the host's dispatch: eager waits on the host
    (its ``host`` share is large), a graph replay does not."""
    eager, _, _ = _plan_step(a2, 1, "eager")
    graph, _, _ = _plan_step(a2, 1, "graph")
    assert graph["step_ms"] < eager["step_ms"]
    # graph mode's host work on the path is the replay and the attention updates the device catches up
    # with, eager's every operator's dispatch
    assert eager["breakdown_us"]["host"] > 3 * graph["breakdown_us"]["host"]
    assert _dep_step(cm1, 2, "graph").step_ms < _dep_step(cm1, 2, "eager").step_ms  # one sequence a die


@pytest.mark.parametrize("runtime", ["eager", "graph"])
def test_a_step_never_gets_faster_with_more_batch(a2, runtime):
    times = [_plan_step(a2, b, runtime)[0]["step_ms"] for b in (1, 4, 16, 64)]
    assert times == sorted(times)


def test_cloudmatrix_plans_pay_the_runtime_too(cm1):
    """A plan on CloudMatrix384 had no fixed cost at all: it now pays the system's scheduler time,
    graph launch and kernel launches, as the deployments do."""
    cfg = replace(get_config("qwen3-4b"), num_layers=4)
    out, _, _ = simulate_plan_step(cm1, cfg, ParallelPlan(npus=1, tp=2), StepShape("decode", 2, 1, 256))
    rt = cm1.system.runtime
    fixed = rt.scheduler_us + rt.graph_launch_us  # and whatever of the 4 layers' attention updates the device waits for
    assert fixed <= out["breakdown_us"]["host"] <= fixed + 4 * rt.graph_update_us + 1e-6
    assert out["breakdown_us"]["launch"] > 0


def test_the_runtime_section_s_bad_keys_are_one_clear_error(tmp_path):
    base = "system:\n  extends: atlas-800i-a2\n"
    cases = {"launch_us: 17.27": "runtime.launch_us",
             "host_dispatch_us: -1": "runtime.host_dispatch_us",
             "decode_mode: lazy": "runtime.decode_mode",
             "sources: {launch_us: x}": "unknown constant"}
    for i, (line, key) in enumerate(cases.items()):
        f = tmp_path / f"s{i}.yaml"
        f.write_text(f"extends: atlas-800i-a2\nsystem:\n  runtime:\n    {line}\n")
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")) as e:
            load_system(str(f))
        assert str(f.name) in str(e.value)
    assert base


def test_the_runtime_flag_changes_the_step(cli):
    args = ["run", "--system", "atlas-800i-a2", "--nodes", "1", "--npus", "2", "--model", "qwen3-0.6b", "--tp", "2",
            "--phase", "decode", "--batch", "1", "--kv", "256", "--json", "--no-progress"]
    out = {}
    for mode in ("eager", "graph"):
        code, text, err = cli(*args, "--runtime", mode)
        assert code == 0, err
        out[mode] = json.loads(text)
        assert out[mode]["runtime"]["mode"] == mode
    assert out["graph"]["step_ms"] < out["eager"]["step_ms"]
    assert out["eager"]["breakdown_us"]["host"] > out["graph"]["breakdown_us"]["host"]
    code, text, _ = cli(*args)  # the system's default for decode: graph
    assert code == 0 and json.loads(text)["runtime"]["mode"] == "graph"
    code, _, err = cli(*args, "--runtime", "lazy")
    assert code == 2 and "--runtime" in err


def test_runtime_constants_are_recomputed_from_the_calibration_half():
    from npusim.validate.calibrate import runtime_constants

    consts = runtime_constants()
    assert {c.name for c in consts} == {f"runtime.{k}" for k in ("host_dispatch_us", "attention_dispatch_us",
                                                                  "graph_launch_us",
                                                                  "graph_update_us", "hccl_dispatch_us",
                                                                  "kernel_launch_us", "scheduler_us", "sync_us")}
    assert all(abs(c.drift) < 1e-4 for c in consts)  # stored to 4 digits
    assert not any("ascend_plan_steps" in c.source for c in consts)  # no end-to-end step


def _small_step(a2, layers, runtime, system=None):
    cfg = replace(get_config("qwen3-4b"), num_layers=layers)
    return simulate_plan_step(system or a2, cfg, ParallelPlan(npus=2, tp=2), StepShape("decode", 1, 1, 512),
                              runtime=runtime)


def test_a_graph_replay_updates_every_attention_op_on_the_host(a2):
    """Graph mode: one replay enqueue per die and step, then one host update per captured attention
    operator (vLLM-Ascend's FIA task updates), so the host's work grows with the attention ops; an
    attention node waits for its update."""
    rt = a2.system.runtime
    busy = {}
    for layers in (1, 2):
        out, wl, timing = _small_step(a2, layers, "graph")
        assert not wl.meta.get("repeat")  # every layer simulated
        busy[layers] = timing.host_busy_us
        assert busy[layers] == pytest.approx(2 * (rt.graph_launch_us + layers * rt.graph_update_us + rt.sync_us
                                                  + rt.scheduler_us), rel=1e-6)
    assert busy[2] - busy[1] == pytest.approx(2 * rt.graph_update_us, rel=1e-6)  # 2 dies, one attention op each
    out, _, _ = _small_step(a2, 2, "graph")
    assert out["breakdown_us"]["host"] >= rt.graph_launch_us + rt.graph_update_us  # the first layer waits for both


def test_an_eager_hccl_collective_costs_the_host_its_op_base_dispatch(a2):
    """Eager mode: an HCCL collective costs the host ``hccl_dispatch_us`` (hccl_test's back-to-back
    cadence), not an ordinary operator's ``host_dispatch_us``."""
    from npusim.validate.calibrate import _variant

    rt = a2.system.runtime
    assert rt.hccl_dispatch_us > 5 * rt.host_dispatch_us
    _, wl, timing = _small_step(a2, 2, "eager")
    as_op = _variant(a2, {"runtime": {"hccl_dispatch_us": rt.host_dispatch_us}})
    _, _, plain = _small_step(a2, 2, "eager", as_op)
    dispatched = sum(len(n["ranks"]) for n in wl.nodes if n["kind"] == "collective")
    assert dispatched > 0
    assert timing.host_busy_us - plain.host_busy_us == pytest.approx(
        dispatched * (rt.hccl_dispatch_us - rt.host_dispatch_us), rel=1e-6)


def test_an_eager_attention_op_costs_the_host_its_own_dispatch(a2):
    """Eager mode: a fused-attention operator costs the host ``attention_dispatch_us`` (torch_npu FIA's
    back-to-back cadence), every other operator ``host_dispatch_us``; graph mode is unchanged."""
    from npusim.validate.calibrate import _variant

    rt = a2.system.runtime
    assert rt.attention_dispatch_us > 5 * rt.host_dispatch_us
    _, wl, timing = _small_step(a2, 2, "eager")
    as_op = _variant(a2, {"runtime": {"attention_dispatch_us": rt.host_dispatch_us}})
    _, _, plain = _small_step(a2, 2, "eager", as_op)
    attention = sum(1 for n in wl.nodes if n["kind"] == "compute" and "attention" in str(n.get("name", "")))
    extra = timing.host_busy_us - plain.host_busy_us
    assert extra > 0
    # 2 layers x 2 dies, one attention op each
    assert extra == pytest.approx(4 * (rt.attention_dispatch_us - rt.host_dispatch_us), rel=1e-6), attention
    _, _, graph = _small_step(a2, 2, "graph")
    _, _, graph_plain = _small_step(a2, 2, "graph", as_op)
    assert graph.host_busy_us == pytest.approx(graph_plain.host_busy_us)


def test_runtime_rows_run_against_the_runtime_model():
    """The runtime rows that measure a runtime-model quantity are run (issue 39's runtime family):
    the calibration rows reproduce their constants, the aclgraph rebind row of vllm-ascend #13058
    (20 FIA updates) is compared with 20 updates."""
    from npusim.validate.operators import operator_rows

    rows = {r.name.split(" #")[0]: r for r in operator_rows(families=("runtime",))}
    assert all(r.family == "runtime" for r in rows.values())
    replay = next(r for n, r in rows.items() if "replay enqueue" in n)
    assert replay.half == "calibration" and abs(replay.error) < 1e-6
    rebind = next(r for r in rows.values() if r.published == 3680)
    assert rebind.half == "validation" and rebind.simulated == pytest.approx(20 * 2400 / 11, rel=1e-3)
    assert all(r.baseline_error == -1 for r in rows.values())  # the naive baseline: no runtime cost


def test_hccl_constants_are_recomputed_from_the_calibration_half():
    """The HCCL copy efficiency comes from ascend-dmi's D2D row (calibration half) over the A3 die's
    HBM peak, the CCL buffer is HCCL_BUFFSIZE's default; both presets store them."""
    from npusim.validate.calibrate import hccl_constants

    consts = hccl_constants()
    assert {c.name for c in consts} == {"hccl.copy_efficiency", "hccl.buffer_mb"}
    assert {c.preset for c in consts} >= {"atlas-800i-a2", "cloudmatrix384"}
    assert all(abs(c.drift) < 1e-3 for c in consts)
    eff = next(c for c in consts if c.name == "hccl.copy_efficiency")
    assert eff.recomputed == pytest.approx((1513.970581 + 1541.802368) / 2 / 1600, rel=1e-6)


def test_the_paper_s_graph_scheduling_delay_is_compared_with_the_model_s_graph_boundary():
    """The CloudMatrix384 paper's 0.6-0.8 ms per graph schedule (MTP's pipeline breaks inside a step: the
    CPU samples, prepares and launches the next graph) is compared with what the model charges at any
    graph boundary the host steps into (synchronize, replay enqueue, the MTP graph's one attention op's
    update, the first task's crossing), not with the per-step gap that also holds the scheduler
    (session 46); xDeepServe's 2 ms bubble is that whole per-step gap on CloudMatrix384."""
    from npusim.system.load import load_system
    from npusim.validate.calibrate import XDEEPSERVE_BUBBLE_US
    from npusim.validate.operators import operator_rows

    rt = load_system("cloudmatrix384").system.runtime
    row = next(r for r in operator_rows(families=("runtime",)) if "graph launch / schedul" in r.name)
    assert row.half == "validation"
    assert row.simulated == pytest.approx(rt.sync_us + rt.graph_launch_us + rt.graph_update_us + rt.kernel_launch_us)
    assert row.simulated == pytest.approx(rt.graph_boundary_us(1))
    assert rt.graph_launch_us < row.simulated < rt.replay_gap_us(1)
    assert rt.replay_gap_us(1) == pytest.approx(XDEEPSERVE_BUBBLE_US, abs=0.01)  # constants stored to 4 digits


def test_the_gap_between_two_replays_is_the_scheduler_plus_the_graph_boundary(a2):
    """Graph mode: the host's part of a one-layer step's critical path is its synchronize and scheduler
    after the last kernel, the replay enqueue and the attention op's update before it:
    Runtime.replay_gap_us less the first task's crossing (a launch). (With more layers, a later
    update the device's work does not hide adds to it: a host-bound step.)"""
    from npusim.validate.calibrate import _variant

    rt = a2.system.runtime
    for sched in (0.0, 500.0):
        system = _variant(a2, {"runtime": {"scheduler_us": sched}})
        out, _, timing = _small_step(a2, 1, "graph", system=system)
        gap = system.system.runtime.replay_gap_us(1)
        assert out["breakdown_us"]["host"] == pytest.approx(gap - rt.kernel_launch_us, abs=0.01)
