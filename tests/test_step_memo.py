"""The plan search's step memo: a step point gives the same result with the fabric's routes memoised
on the topology (what a search's later points see) as with a cold topology (its first point), and
``SystemSim.transfers`` builds the same tasks as the per-transfer loop it replaced."""

import json
import math

import numpy as np
import pytest

from npusim.hw.fabric.state import FP_RETURN_PS, FP_ROUTE, FP_SETUP_PS, FP_WIRE_BYTES
from npusim.model.zoo import get_config
from npusim.system.kernel import KIND_FLOW
from npusim.engine.tasks import KIND_FIXED
from npusim.system.load import load_system
from npusim.system.mapper import StepShape
from npusim.system.plan import ParallelPlan
from npusim.system.simulator import SystemSim
from npusim.system.step import simulate_plan_step


@pytest.fixture(scope="module")
def cm2():
    return load_system("cloudmatrix384", nodes=2)  # 16 NPUs = 32 dies, 8 CPUs


def _step_json(loaded, plan, shape):
    out, _, _ = simulate_plan_step(loaded, get_config("qwen3-30b-a3b"), plan, shape, fit=False)
    out.pop("chip_cost")  # the chip-cost cache's hit counters differ between a first and a later run
    return json.dumps(out, sort_keys=True, default=str)


def test_a_step_is_the_same_with_the_routes_memoised_as_with_a_cold_topology(cm2):
    plan = ParallelPlan(npus=8, tp=1, dp=16, ep=16, microbatches=2)
    shape = StepShape("decode", 64, 1, 512)
    cm2.topology.sim_routes.clear()
    cold = _step_json(cm2, plan, shape)
    memo = dict(cm2.topology.sim_routes)
    assert memo, "the step's routes were not memoised on the topology"
    warm = _step_json(cm2, plan, shape)  # every route from the memo
    assert cm2.topology.sim_routes.keys() == memo.keys()
    assert warm == cold
    # a different plan first (other routes memoised, in another order): the step is unchanged
    cm2.topology.sim_routes.clear()
    _step_json(cm2, ParallelPlan(npus=8, tp=2, dp=8, ep=8), StepShape("decode", 32, 1, 512))
    assert _step_json(cm2, plan, shape) == cold


def _reference_transfers(sim, initiators, targets, nbytes, op, via, fabric=None):
    """The per-transfer loop ``SystemSim.transfers`` had before (083febb), kept as the reference."""
    init = sim.system.initiator
    inits = np.atleast_1d(np.asarray(initiators, np.int64))
    tgts = np.atleast_1d(np.asarray(targets, np.int64))
    sizes = np.broadcast_to(np.asarray(nbytes, np.int64), inits.shape)
    n = inits.shape[0]
    kinds, queues, params = np.full(n, KIND_FLOW, np.int64), np.full(n, -1, np.int64), np.zeros((n, 4), np.int64)
    topo, write = sim.topology, op == "write"
    for i in range(n):
        a, b = int(inits[i]), int(tgts[i])
        die = topo.vertex_kind[a] == "die"
        launch_ns = 0.0
        if not die:
            queues[i] = sim.queue_of[(a, "dma")]
        elif via == "sdma":
            k = sim._sdma_next.get(a, 0)
            sim._sdma_next[a] = (k + 1) % init.sdma_engines
            queues[i] = sim.queue_of[(a, f"sdma{k}")]
            launch_ns = init.sdma_launch_ns
        else:
            launch_ns = init.aiv_launch_ns
        if a == b:
            kinds[i] = KIND_FIXED
            continue
        src, dst = (a, b) if write else (b, a)
        rid, fab = sim.route(src, dst, fabric, die and via == "aiv" and write)
        eff, ovh_ns = sim._protocol(fab, topo.vertex_kind[b], op)
        back = sim._route_lat[rid]
        params[i, FP_ROUTE] = rid
        params[i, FP_WIRE_BYTES] = int(math.ceil(int(sizes[i]) / eff))
        params[i, FP_SETUP_PS] = int(round((ovh_ns + launch_ns) * 1000)) + (0 if write else back)
        params[i, FP_RETURN_PS] = back if write else 0
    return kinds, queues, params


@pytest.mark.parametrize("op, via", [("write", "sdma"), ("read", "sdma"), ("write", "aiv"), ("read", "aiv")])
def test_transfers_build_the_tasks_of_the_per_transfer_loop(cm2, op, via):
    topo = cm2.topology
    dies = [v for v, k in enumerate(topo.vertex_kind) if k == "die"]
    cpus = [v for v, k in enumerate(topo.vertex_kind) if k == "cpu"]
    rng = np.random.default_rng(7)
    ends = np.array(dies + cpus)
    a, b = SystemSim(cm2), SystemSim(cm2)
    topo.sim_routes.clear()
    for _ in range(4):  # batches in turn: the SDMA engines' turns carry over between them
        n = int(rng.integers(1, 60))
        inits = rng.choice(ends, n)
        tgts = np.where(rng.random(n) < 0.1, inits, rng.choice(ends, n))  # some to themselves
        sizes = rng.integers(1, 10**9, n)
        got = a.transfers(inits, tgts, sizes, op, via)
        want = _reference_transfers(b, inits, tgts, sizes, op, via)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g, w)
    assert a._sdma_next == b._sdma_next and a._route_lat == b._route_lat
    assert topo.sim_routes  # the routes were memoised for the next simulator
