"""MoE on one chip: per-token routing, the all-to-all collective, and token / FLOP conservation
through a mapped MoE layer (every expert op counted once, every token dispatched and combined
exactly once per core holding one of its experts)."""

import json
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.cli import main
from npusim.comm import alltoall, alltoallv
from npusim.comm.run import run_collective
from npusim.errors import ConfigError
from npusim.mapping import map_model, spec_from_flags
from npusim.model.builder import build_graph
from npusim.model.ir import Graph, Op
from npusim.model.routing import popularity, route_tokens, routing_from_counts
from npusim.scenarios.forward import simulate_forward
from npusim.sim import Simulator
from npusim.sim.program import COST_GEMM, COST_VECTOR, Program

H, N = 64, 32  # hidden size, expert intermediate size of the test layer


# -- routing ----------------------------------------------------------------------------------
@settings(max_examples=examples(40), deadline=None)
@given(tokens=st.integers(0, 40), experts=st.integers(1, 24), data=st.data(),
       skew=st.sampled_from([0.0, 0.7, 2.0]), seed=st.integers(0, 50))
def test_routing_is_top_k_distinct_and_deterministic(tokens, experts, data, skew, seed):
    k = data.draw(st.integers(1, experts))
    picks = route_tokens(tokens, experts, k, skew, seed)
    assert picks.shape == (tokens, k) and picks.dtype == np.int64
    assert all(len(set(row)) == k for row in picks.tolist())
    assert ((picks >= 0) & (picks < experts)).all()
    assert np.array_equal(picks, route_tokens(tokens, experts, k, skew, seed))
    counts = np.bincount(picks.ravel(), minlength=experts)
    assert counts.sum() == tokens * k and counts.max(initial=0) <= tokens


def test_routing_follows_the_popularity_profile():
    """Marginal inclusion rates agree with an independent Gumbel top-k draw of the same weights
    (Plackett-Luce), and a decode batch touches the number of experts random routing predicts."""
    e, k, t = 16, 4, 100_000
    ours = np.bincount(route_tokens(t, e, k, 1.2, 3).ravel(), minlength=e) / t
    keys = np.log(popularity(e, 1.2, 3)) + np.random.default_rng(99).gumbel(size=(t, e))
    ref = np.bincount(np.argsort(-keys, axis=1)[:, :k].ravel(), minlength=e) / t
    assert np.abs(ours - ref).max() < 0.01
    assert np.argmax(ours) == np.argmax(popularity(e, 1.2, 3))
    # 8 tokens x top-8 of 128 uniform experts: E[distinct] = 128 (1 - (120/128)^8) = 51.6
    active = [np.unique(route_tokens(8, 128, 8, 0.0, s)).size for s in range(200)]
    assert abs(np.mean(active) - 128 * (1 - (120 / 128) ** 8)) < 0.5
    assert route_tokens(8, 128, 8, 0.0, 1).tolist() != route_tokens(8, 128, 8, 0.0, 2).tolist()


@settings(max_examples=examples(40), deadline=None)
@given(tokens=st.integers(1, 30), experts=st.integers(1, 12), data=st.data())
def test_routing_from_counts_meets_the_counts(tokens, experts, data):
    k = data.draw(st.integers(1, experts))
    counts = np.bincount(route_tokens(tokens, experts, k, 1.0, data.draw(st.integers(0, 9))).ravel(),
                         minlength=experts)
    picks = routing_from_counts(counts, k)
    assert picks.shape == (tokens, k)
    assert all(len(set(row)) == k for row in picks.tolist())
    assert np.array_equal(np.bincount(picks.ravel(), minlength=experts), counts)


def test_routing_errors():
    with pytest.raises(ConfigError, match="top_k"):
        route_tokens(4, 4, 5)
    with pytest.raises(ConfigError, match="moe_skew"):
        route_tokens(4, 4, 2, skew=-1)
    with pytest.raises(ConfigError, match="multiple of top_k"):
        routing_from_counts([3, 2], 2)
    with pytest.raises(ConfigError, match="at most once"):
        routing_from_counts([4, 0], 2)
    with pytest.raises(ValueError, match="expert_routing"):
        Op("x", "moe", m=2, k=4, n=4, experts=4, top_k=2, expert_routing=(0, 1, 2))


def test_builder_moe_op_is_the_whole_routed_block():
    g = build_graph("Qwen3-30B-A3B", "decode", batch=8, seq_len=1, kv_len=64, layers=1)
    names = [op.name for op in g.ops]
    assert "L0.moe.experts" in names and not any(n.endswith(("experts_act", "dispatch", "combine")) for n in names)
    moe = next(op for op in g.ops if op.kind == "moe")
    picks = np.asarray(moe.expert_routing).reshape(8, 8)
    assert tuple(np.bincount(picks.ravel(), minlength=128).tolist()) == moe.expert_tokens
    r = 8 * 8
    assert moe.flops == 2 * r * 2048 * 768 * 3 + r * 768 + r * 2048 and moe.gemm_flops == 2 * r * 2048 * 768 * 3
    ds = build_graph("DeepSeek-V3", "decode", batch=2, seq_len=1, kv_len=64, layers=4)
    comb = next(op for op in ds.ops if op.name == "L3.moe.combine")  # adds the shared expert's output
    assert comb.elements == 2 * 7168 and set(comb.inputs) == {"L3.moe.experts", "L3.moe.shared.down_proj"}


# -- all-to-all -------------------------------------------------------------------------------
def _sent(prog, coll):
    return [(prog.param[t][0], prog.param[t][1], prog.param[t][2]) for t in coll.tasks if prog.unit[t] == "noc"]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_alltoall_volume_and_completion(arch64, n):
    cores = list(range(n))
    prog = Program(arch64.num_cores)
    coll = alltoall(prog, cores, 96 << 10)
    sent = _sent(prog, coll)
    assert len(sent) == n * (n - 1) and len({(s, d) for s, d, _ in sent}) == n * (n - 1)
    assert sum(b for _, _, b in sent) == pytest.approx((n - 1) * (96 << 10), abs=n * n)
    sim = Simulator(arch64)
    prog.submit(sim)
    sim.run()
    assert all(sim.engine.is_done(t) for t in coll.done.values())


@pytest.mark.parametrize("fidelity", ["path", "analytical", "flit"])
def test_alltoall_time_is_physical(arch64, fidelity):
    """No faster than the links allow: each core injects 3 B/4 through its one local port; and
    with contention modelled (path, flit), cores 0-3 in a row, the 1->2 link carries 4 messages
    of B/4 (the analytical fidelity has no contention by definition)."""
    nbytes = 256 << 10
    r = run_collective(arch64, "alltoall", [0, 1, 2, 3], nbytes, fidelity)
    per_cycle = arch64.noc.link_bytes_per_cycle
    assert r.cycles >= 3 * (nbytes // 4) / per_cycle
    if fidelity != "analytical":
        assert r.cycles >= 4 * (nbytes // 4) / per_cycle
    assert r.cycles < 3 * 4 * (nbytes // 4) / per_cycle  # and overlapped, not one message at a time
    assert r.messages == 12 and r.busbw_gbps <= per_cycle * arch64.clock_ghz * 2


def test_alltoall_fidelities_agree_without_contention(arch64):
    path = run_collective(arch64, "alltoall", [0, 1], 128 << 10, "path")
    ana = run_collective(arch64, "alltoall", [0, 1], 128 << 10, "analytical")
    flit = run_collective(arch64, "alltoall", [0, 1], 128 << 10, "flit")
    assert path.cycles == ana.cycles and abs(flit.cycles - path.cycles) <= 4


def test_alltoallv_errors():
    prog = Program(16)
    with pytest.raises(ConfigError, match="2 x 2"):
        alltoallv(prog, [0, 1], [[0, 1]])
    with pytest.raises(ConfigError, match=">= 0"):
        alltoallv(prog, [0, 1], [[0, -1], [0, 0]])
    with pytest.raises(ConfigError, match="distinct"):
        alltoallv(prog, [1, 1], [[0, 0], [0, 0]])


@pytest.mark.parametrize("fidelity", ["path", "analytical", "flit"])
def test_cli_alltoall_contract(capsys, fidelity):
    assert main(["collective", "--op", "alltoall", "--cores", "0,1,2,3", "--bytes", "64KiB", "--json",
                 "--fidelity", fidelity]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["op"] == "alltoall" and out["time_us"] > 0 and out["messages"] == 12


# -- a mapped MoE layer -----------------------------------------------------------------------
def moe_layer(tokens, experts, top_k, seed=0, skew=0.0, counts_only=False) -> Graph:
    """norm -> router -> softmax -> routed experts -> residual, hidden H, expert width N."""
    picks = route_tokens(tokens, experts, top_k, skew, seed)
    counts = tuple(np.bincount(picks.ravel(), minlength=experts).tolist())
    ops = [Op("L0.mlp_norm", "vector", 0, elements=tokens * H, op_class="rmsnorm", row_len=H),
           Op("L0.moe.router", "gemm", 0, inputs=("L0.mlp_norm",), m=tokens, k=H, n=experts, weight=True),
           Op("L0.moe.route", "vector", 0, inputs=("L0.moe.router",), elements=tokens * experts,
              op_class="softmax", row_len=experts),
           Op("L0.moe.experts", "moe", 0, inputs=("L0.mlp_norm", "L0.moe.route"), m=tokens, k=H, n=N,
              experts=experts, top_k=top_k, expert_tokens=counts,
              expert_routing=() if counts_only else tuple(picks.ravel().tolist())),
           Op("L0.mlp_residual", "vector", 0, inputs=("L0.moe.experts",), elements=tokens * H,
              op_class="elementwise")]
    return Graph("moe", ops, phase="decode", batch=tokens, seq_len=1, kv_len=1)


def _tasks(prog, pattern):
    rx = re.compile(pattern)
    return [i for i, n in enumerate(prog.names) if rx.search(n)]


def _flops(prog, ids):
    out = 0
    for i in ids:
        a = prog.cost_args[i]
        out += 2 * a[0] * a[1] * a[2] * a[3] if prog.cost_kind[i] == COST_GEMM else \
            a[1] if prog.cost_kind[i] == COST_VECTOR else 0
    return out


def _expected_traffic(picks, t):
    """Tokens owned by core s (contiguous even slices) with an expert on core d != s, by loops."""
    m = len(picks)
    bounds = np.cumsum([0] + [m // t + (1 if i < m % t else 0) for i in range(t)])
    out = np.zeros((t, t), dtype=int)
    for s in range(t):
        for tok in range(bounds[s], bounds[s + 1]):
            for d in {int(e) % t for e in picks[tok]}:
                if d != s:
                    out[s, d] += 1
    return out


@settings(max_examples=examples(30), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(tokens=st.integers(1, 24), experts=st.integers(1, 12), data=st.data(), t=st.sampled_from([1, 2, 4]),
       part=st.sampled_from(["tp_k", "tp_mn"]), seed=st.integers(0, 20), counts_only=st.booleans())
def test_moe_layer_conserves_tokens_and_flops(arch64, tokens, experts, data, t, part, seed, counts_only):
    top_k = data.draw(st.integers(1, experts))
    g = moe_layer(tokens, experts, top_k, seed, counts_only=counts_only)
    moe = next(op for op in g.ops if op.kind == "moe")
    spec = spec_from_flags(tp=t, partition=part, stages=1).model_copy(update={"data_parallel": 1})
    mapped = map_model(g, arch64, spec)
    prog, group = mapped.program, list(mapped.groups[0].cores)
    picks = np.asarray(moe.expert_routing).reshape(tokens, top_k) if not counts_only else \
        routing_from_counts(moe.expert_tokens, top_k)
    # every expert op once: each expert's GEMMs see exactly its routed tokens, on one core
    ups = _tasks(prog, r"moe\.experts e\d+ gate_up")
    per_expert = np.zeros(experts, dtype=int)
    for i in ups:
        e = int(re.search(r" e(\d+) ", prog.names[i]).group(1))
        per_expert[e] += prog.cost_args[i][0] if prog.names[i].endswith(("tile0", "gate_up")) else 0
        assert prog.core[i] == group[e % t]  # expert e on rank e mod t
    assert tuple(per_expert.tolist()) == moe.expert_tokens
    assert _flops(prog, _tasks(prog, r"moe\.experts e\d+ (gate_up|down)")) == moe.gemm_flops
    assert _flops(prog, _tasks(prog, r"moe\.experts e\d+ act")) == tokens * top_k * N
    assert _flops(prog, _tasks(prog, r"moe\.experts weighted sum")) == tokens * top_k * H
    compute = _tasks(prog, r"moe\.experts( e\d+ (gate_up|down|act)| weighted sum)")
    assert _flops(prog, compute) == moe.flops
    # tokens: dispatched (when split by tokens) and combined once per (token, other core with its expert)
    want = _expected_traffic(picks, t)
    sends = [i for i in range(len(prog)) if prog.unit[i] == "noc"]
    disp = [i for i in sends if " dispatch " in prog.names[i]]
    comb = [i for i in sends if " combine " in prog.names[i]]
    h_in, h_out = H * moe.elem_bytes, H * 2
    if t == 1:
        assert not disp and not comb
        return
    got_comb = np.zeros((t, t), dtype=int)
    for i in comb:
        src, dst, nbytes = prog.param[i][:3]
        got_comb[group.index(dst), group.index(src)] += nbytes // h_out  # owner <- expert core
    assert np.array_equal(got_comb, want)
    if part == "tp_mn":  # activation split by tokens: an all-to-all carries each token out once
        got = np.zeros((t, t), dtype=int)
        for i in disp:
            src, dst, nbytes = prog.param[i][:3]
            got[group.index(src), group.index(dst)] += nbytes // h_in
        assert np.array_equal(got, want)
    else:  # replicated by the tp_k router: every core has every token already
        assert not disp
    merged = _flops(prog, _tasks(prog, r"moe\.experts combine sum"))
    assert merged == want.sum() * H  # one add per received partial


@pytest.mark.parametrize("replicas,micro", [(2, 1), (1, 3), (2, 2)])
def test_moe_replicas_and_microbatches_split_the_tokens_exactly(arch64, replicas, micro):
    """Data-parallel replicas and micro-batches each route their own slice of the tokens:
    together every expert computes exactly the graph's tokens."""
    g = moe_layer(10, 8, 2, seed=3)
    moe = next(op for op in g.ops if op.kind == "moe")
    spec = spec_from_flags(tp=2, partition="tp_mn", stages=1)
    spec = spec.model_copy(update={"data_parallel": replicas,
                                   "pipeline": spec.pipeline.model_copy(update={"microbatches": micro})})
    mapped = map_model(g, arch64, spec)
    assert (mapped.replicas, mapped.microbatches) == (replicas, micro)
    prog = mapped.program
    per_expert = np.zeros(8, dtype=int)
    for i in _tasks(prog, r"moe\.experts e\d+ gate_up"):
        if prog.names[i].endswith(("tile0", "gate_up")):
            per_expert[int(re.search(r" e(\d+) ", prog.names[i]).group(1))] += prog.cost_args[i][0]
    assert tuple(per_expert.tolist()) == moe.expert_tokens


@pytest.mark.parametrize("part", ["tp_k", "tp_mn"])
def test_moe_layer_simulates_and_all_to_all_costs_time(arch64, part):
    g = moe_layer(16, 8, 2, seed=1)
    run = simulate_forward(g, arch64, spec_from_flags(tp=4, partition=part, stages=1), memory_mode="analytical")
    s = run.summary
    assert s["cycles"] > 0 and s["breakdown_ms"]["communication"] >= 0
    prog = run.mapped.program
    sends = [i for i, n in enumerate(prog.names) if prog.unit[i] == "noc" and " combine " in n]
    start, end = run.sim.task_times()
    assert sends and all(end[i] > start[i] >= 0 for i in sends)  # every combine message took time
    last_send = max(end[i] for i in sends)
    merges = [i for i, n in enumerate(prog.names) if n.endswith("combine sum")]
    assert max(end[i] for i in merges) >= last_send  # owners add up after their partials arrive
