"""The plan search's step memo: a step point gives the same result with the fabric's routes memoised
on the topology (what a search's later points see) as with a cold topology (its first point), and
``SystemSim.transfers`` builds the same tasks as the per-transfer loop it replaced; ``plan --serving``'s
grid holds every EP of an instance's dies (with the redundant slots it needs) and decode batches above
64 per NPU."""

import json
import math
import re

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


# ------------------------------------------------------------------- plan --serving's grid openings

TINY_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 1024,
            "intermediate_size": 3072, "moe_intermediate_size": 256, "num_hidden_layers": 4,
            "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64, "num_experts": 16,
            "num_experts_per_tok": 4, "vocab_size": 151936, "max_position_embeddings": 40960}


def test_the_serving_grid_takes_every_ep_of_the_dies_with_the_redundant_slots_it_needs():
    """DeepSeek-R1 on 160 CloudMatrix384 NPUs (320 dies): EP 320 (256 experts + 64 copies, one a die),
    160 and 80 are in the serving search's grid; ``npusim plan``'s grid (the three largest EPs that
    divide the experts) is unchanged."""
    from npusim.system.search import candidate_plans

    cfg = get_config("deepseek-r1")
    plans, _ = candidate_plans(cfg, 160, 2, 192, "w8a8", max_pp=1, all_ep=True, microbatches=(1,), mtp=(0,))
    slots = {p.ep: (p.redundant_experts, p.eplb) for p in plans if p.tp == 1}
    assert slots[320] == (64, "greedy") and slots[160] == (64, "greedy") and slots[80] == (64, "greedy")
    assert slots[64] == (0, "none")
    for p in plans:
        assert (cfg.num_experts + p.redundant_experts) % p.ep == 0 and p.redundant_experts < p.ep
    plain, _ = candidate_plans(cfg, 160, 2, 192, "w8a8", max_pp=1)
    assert {p.ep for p in plain} == {16, 32, 64} and not any(p.redundant_experts for p in plain)


@pytest.mark.slow
def test_plan_serving_candidates_hold_the_opened_eps_and_batches_above_64_per_npu():
    """A 16-expert model on 3 NPUs (6 dies): EP 3 and 6 need 2 redundant slots; the decode ladder goes
    past 64 sequences per NPU. Both show in ``candidates``."""
    from npusim.system.search import plan_label
    from npusim.system.serving_search import search_serving

    r = search_serving("cloudmatrix384", 1, TINY_MOE, 3, input_len=256, output_len=16, slo_ttft_ms=5000,
                       slo_tpot_ms=200, serve_top=1, max_concurrency=None, workers=1)
    labels = [c["label"] for c in r["candidates"] if c.get("label")]
    assert any(f"ep{ep} " in lab for lab in labels for ep in (3, 6)), labels[:5]
    decode = [p for c in r["candidates"] if c.get("deployment") for p in c["deployment"]["pools"]
              if p["role"] != "prefill"]
    served_eps = {plan_label(p["plan"]): p["plan"]["redundant_experts"] for p in decode}
    assert all(red == 0 or red == 2 for red in served_eps.values())
    per_npu = []  # decode pools' batch per NPU: "[tpT dpD ... bB]" on T x D dies, 2 a NPU
    for lab in labels:
        for m in re.finditer(r"\[tp(\d+) dp(\d+) [^]]* b(\d+)\]", lab):
            tp, dp, b = (int(x) for x in m.groups())
            per_npu.append(b / (tp * dp / 2))
    assert max(per_npu) > 64
