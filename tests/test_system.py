"""The system level: system files and their errors, the fabric graph, the flow and packet models
(conservation, capacity, agreement), collectives, MoE dispatch/combine, and the CLI contracts."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.cli import main
from npusim.errors import ConfigError
from npusim.system.load import is_system_file, load_system
from npusim.system.measure import parse_ranks, point_to_point, run_collective, run_moe
from npusim.system.moe import moe_traffic
from npusim.system.simulator import SystemSim
from npusim.system.summary import summarize_system
from npusim.system.work import WorkBuilder


@pytest.fixture(scope="module")
def cm1():
    """One CloudMatrix384 node: 8 NPUs = 16 dies, 4 CPUs."""
    return load_system("cloudmatrix384", nodes=1)


@pytest.fixture(scope="module")
def cm4():
    return load_system("cloudmatrix384", nodes=4)


@pytest.fixture(scope="module")
def a2():
    return load_system("atlas-800i-a2", nodes=2)


# -- system files -----------------------------------------------------------------------------------

def test_presets_load_with_the_published_structure():
    cm = load_system("cloudmatrix384")
    s = summarize_system(cm)
    assert (s.nodes, s.npus, s.dies, s.cpus) == (48, 384, 768, 192)
    assert s.fabrics["ub"]["per_npu_gbps"] == pytest.approx(2 * 7 * 28)  # 7 x 224 Gb/s per die
    assert s.fabrics["rdma"]["per_die_gbps"] == pytest.approx(25)  # 200 Gb/s
    assert s.die_link_gbps == 270
    # the Clos is non-blocking: half the dies send at full rate to the other half
    assert s.fabrics["ub"]["bisection_gbps"] == pytest.approx(384 * 196)
    a2 = summarize_system(load_system("atlas-800i-a2"))
    assert (a2.nodes, a2.npus, a2.dies_per_npu) == (4, 32, 1)
    assert a2.fabrics["hccs"]["per_npu_gbps"] == pytest.approx(7 * 28)  # per direction: 392 GB/s both ways
    assert a2.fabrics["roce"]["bisection_gbps"] == pytest.approx(16 * 25)


def test_endpoint_names_and_node_numbering(cm4):
    topo = cm4.topology
    assert topo.endpoint("npu3") == topo.endpoint("npu3.die0")
    assert topo.node_of(topo.endpoint("npu7.die1")) == 0 and topo.node_of(topo.endpoint("npu8.die0")) == 1
    assert topo.node_of(topo.endpoint("cpu3")) == 0 and topo.node_of(topo.endpoint("cpu4")) == 1
    for bad in ("npu32", "npu0.die2", "cpu16", "gpu0", "npu-1"):
        with pytest.raises(ConfigError):
            topo.endpoint(bad)
    # intra-node: one switch; inter-node: L1, L2, L1; the two dies of an NPU: their package link
    assert len(topo.route(topo.endpoint("npu0"), topo.endpoint("npu1"))[2]) == 2
    assert len(topo.route(topo.endpoint("npu0"), topo.endpoint("npu8"))[2]) == 4
    assert len(topo.route(topo.endpoint("npu0.die0"), topo.endpoint("npu0.die1"))[2]) == 1


def _write_system(tmp_path, body: str):
    path = tmp_path / "sys.yaml"
    path.write_text(body)
    return path


BASE = """
system:
  name: tiny
  nodes: 2
  npus_per_node: 2
  npu: {chip: %s}
  fabrics:
    net:
      switches: [{name: sw, per: system, latency_ns: 100}]
      links: [%s]
"""


def test_bad_system_files_get_clear_errors(tmp_path):
    ok = _write_system(tmp_path, BASE % ("ascend-910b", "{between: [die, sw], bandwidth_gbps: 10}"))
    assert load_system(ok).system.num_dies == 4 and is_system_file(ok)
    with pytest.raises(ConfigError, match=r"system.npu.chip.*no-such-chip"):
        load_system(_write_system(tmp_path, BASE % ("no-such-chip", "{between: [die, sw], bandwidth_gbps: 10}")))
    with pytest.raises(ConfigError, match="link to nowhere"):
        load_system(_write_system(tmp_path, BASE % ("ascend-910b", "{between: [die, spine], bandwidth_gbps: 10}")))
    with pytest.raises(ConfigError, match="disconnected"):  # a full mesh inside each node only
        load_system(_write_system(tmp_path, BASE % ("ascend-910b", "{between: [die, die], bandwidth_gbps: 10}")))
    with pytest.raises(ConfigError, match="bandwidth_gbp"):
        load_system(_write_system(tmp_path, BASE % ("ascend-910b", "{between: [die, sw], bandwith_gbps: 10}")))
    with pytest.raises(ConfigError, match="did you mean 'latency_ns'"):  # under a dict of fabrics
        load_system(_write_system(tmp_path, (BASE % ("ascend-910b", "{between: [die, sw], bandwidth_gbps: 10}"))
                                  .replace("latency_ns: 100", "latncy_ns: 100")))
    with pytest.raises(ConfigError, match="ports"):
        load_system(_write_system(tmp_path, (BASE % ("ascend-910b", "{between: [die, sw], bandwidth_gbps: 10}"))
                                  .replace("per: system,", "per: system, ports_per_chip: 3,")))
    cpus = BASE.replace("npus_per_node: 2", "npus_per_node: 2\n  cpus_per_node: 1") % (
        "ascend-910b", "{between: [die, sw], bandwidth_gbps: 10}, {between: [cpu, sw], bandwidth_gbps: 10}")
    cpus = cpus.replace("      links:", "      protocol: {read_efficiency: {die: 1.0}}\n      links:")
    with pytest.raises(ConfigError, match="no figure for 'cpu'"):
        load_system(_write_system(tmp_path, cpus))
    with pytest.raises(ConfigError, match="not a system file"):
        load_system("npusim-64c")
    with pytest.raises(ConfigError, match="system of many NPUs"):
        from npusim.arch import load_arch
        load_arch("cloudmatrix384")


def test_cli_errors_are_one_line(capsys):
    assert main(["fabric", "--system", "cloudmatrix384", "--src", "npu0", "--dst", "npu999"]) == 2
    err = capsys.readouterr().err
    assert "npu999" in err and "Traceback" not in err
    assert main(["collective", "--system", "cloudmatrix384", "--op", "dispatch", "--ep", "1000", "--json"]) == 2
    assert main(["collective", "--op", "dispatch", "--cores", "0,1"]) == 2  # needs --system (a chip has alltoall)
    assert main(["collective", "--system", "cloudmatrix384", "--op", "allreduce", "--fidelity", "flit"]) == 2
    assert main(["collective", "--system", "cloudmatrix384", "--op", "allreduce", "--ranks", "npu0,cpu0"]) == 2
    assert "not a die" in capsys.readouterr().err


# -- the fabric models ------------------------------------------------------------------------------

def test_point_to_point_round_trips_and_efficiency(cm4):
    small = point_to_point(cm4, "npu0.die0", "npu1.die0", "write", 512)
    far = point_to_point(cm4, "npu0.die0", "npu8.die0", "write", 512)
    sw = cm4.system.fabrics["ub"].switches[0].latency_ns
    # an inter-node write passes two more switches each way (data out, acknowledgement back)
    assert far.latency_us - small.latency_us == pytest.approx(4 * sw / 1000, abs=1e-3)
    big = point_to_point(cm4, "npu0.die0", "npu8.die0", "read", 256 << 20)
    eff = cm4.system.fabrics["ub"].protocol.read_efficiency["die"]
    assert big.bandwidth_gbps <= 196 * eff + 1e-6
    assert big.bandwidth_gbps == pytest.approx(196 * eff, rel=0.01)
    assert big.hops == 4 and big.path[0] == "npu8.die0"  # a read's data comes back from the target


def _flows_run(loaded, pairs, sizes, fidelity, via="sdma"):
    sim = SystemSim(loaded, fidelity)
    w = WorkBuilder(sim)
    for (a, b), n in zip(pairs, sizes):
        w.transfer(a, b, int(n), "write", via)
    w.submit()
    sim.run()
    return sim, w


@settings(max_examples=15, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 15), st.integers(0, 15), st.integers(1, 3 << 20)), min_size=1, max_size=25),
       st.sampled_from(["flow", "packet"]))
def test_bytes_conserved_and_links_never_over_capacity(pairs_sizes, fidelity):
    loaded = load_system("cloudmatrix384", nodes=1)
    dies = [loaded.topology.index[d] for d in loaded.topology.die_names]
    pairs = [(dies[a], dies[b]) for a, b, _ in pairs_sizes if a != b]
    if not pairs:
        return
    sizes = [n for a, b, n in pairs_sizes if a != b]
    sim, w = _flows_run(loaded, pairs, sizes, fidelity)
    ids, src, dst = w.flows()
    tt = sim.engine.tt
    wire = tt.param[ids, 1]
    # every transfer delivered exactly its wire bytes, and each link carried the sum over its transfers
    assert np.array_equal(sim.fs.f_done_bytes[ids], wire)
    expected = np.zeros(loaded.topology.num_links)
    for tid, w_bytes in zip(ids, wire):
        rid = tt.param[tid, 0]
        expected[sim.fs.route_link[sim.fs.route_ptr[rid]:sim.fs.route_ptr[rid + 1]]] += w_bytes
    assert np.allclose(sim.link_bytes(), expected)
    # no transfer beat physics: its bytes at its route's narrowest link, plus its latencies
    start, end = sim.task_times_ps(ids)
    for tid, s0, e0 in zip(ids, start, end):
        rid = tt.param[tid, 0]
        links = sim.fs.route_link[sim.fs.route_ptr[rid]:sim.fs.route_ptr[rid + 1]]
        floor = tt.param[tid, 1] / loaded.topology.link_cap[links].min() + sim.fs.route_lat[rid] + tt.param[tid, 2] \
            + tt.param[tid, 3]
        assert e0 - s0 >= floor - 2
    # no link ever carried more than its capacity: max-min rates (flow) or serialised packets
    assert sim.peak_link_load <= 1 + 1e-9
    busy = sim.fs.link_busy_ps
    if fidelity == "packet":
        assert np.all(busy <= sim.now_ps)
    span = sim.now_ps
    assert np.all(sim.link_bytes() <= loaded.topology.link_cap * span + 1)


def test_max_min_fair_shares():
    """Three transfers out of one die share its 196 GB/s uplink equally; a fourth elsewhere is unaffected."""
    loaded = load_system("cloudmatrix384", nodes=1)
    topo = loaded.topology
    d = [topo.endpoint(f"npu{i}.die0") for i in range(5)]
    size = 64 << 20
    sim, w = _flows_run(loaded, [(d[0], d[1]), (d[0], d[2]), (d[0], d[3]), (d[4], d[1])], [size] * 4, "flow")
    ids, _, _ = w.flows()
    _, end = sim.task_times_ps(ids)
    start, _ = sim.task_times_ps(ids)
    wire = sim.engine.tt.param[ids, 1]
    times = (end - start) / 1e3  # ns
    # d1's downlink is shared by 2 transfers (98 GB/s each) while d0's uplink gives 65.3 each:
    # d0's three get 196/3, the d4 -> d1 transfer gets the rest of d1's downlink: 196 - 65.3
    assert wire[0] / times[0] == pytest.approx(196 / 3, rel=0.02)
    assert wire[3] / times[3] == pytest.approx(196 - 196 / 3, rel=0.05)


@pytest.mark.parametrize("op,alg", [("alltoall", "direct"), ("allreduce", "ring")])
def test_flow_and_packet_agree_on_small_cases(cm1, op, alg):
    ranks = parse_ranks(cm1, "8")
    flow = run_collective(cm1, op, ranks, 4 << 20, alg, "flow")
    pkt = run_collective(cm1, op, ranks, 4 << 20, alg, "packet")
    assert flow.time_us == pytest.approx(pkt.time_us, rel=0.1)


def test_quantum_and_tolerance_stay_close_to_exact(cm4):
    fast = run_moe(cm4, "dispatch", 32, 128)
    exact = run_moe(cm4, "dispatch", 32, 128, rate_quantum_ns=0.0, fair_tolerance=1e-12)
    assert exact.rate_updates > fast.rate_updates
    assert fast.time_us == pytest.approx(exact.time_us, rel=0.01)


# -- collectives and MoE --------------------------------------------------------------------------

def test_collective_algorithms_and_bus_bandwidth(cm4):
    ranks = parse_ranks(cm4, "16")
    ring = run_collective(cm4, "allreduce", ranks, 64 << 20, "ring")
    hd = run_collective(cm4, "allreduce", ranks, 64 << 20, "halving_doubling")
    hier = run_collective(cm4, "allreduce", parse_ranks(cm4, "32"), 64 << 20, "hierarchical")
    for r in (ring, hd, hier):
        assert 0 < r.bus_bandwidth_gbps <= 196 * 1.001  # never above a die's link bundle
        assert r.peak_link_load <= 1 + 1e-9
    a2a = run_collective(cm4, "alltoall", ranks, 16 << 20, "direct")
    a2a_h = run_collective(cm4, "alltoall", parse_ranks(cm4, "32"), 16 << 20, "hierarchical")
    assert a2a.time_us > 0 and a2a_h.time_us > 0
    with pytest.raises(ConfigError, match="power-of-two"):
        run_collective(cm4, "allreduce", parse_ranks(cm4, "12"), 1 << 20, "halving_doubling")
    with pytest.raises(ConfigError, match="same number of ranks"):
        run_collective(cm4, "allreduce", parse_ranks(cm4, "20"), 1 << 20, "hierarchical")


def test_moe_token_conservation_and_dedup():
    t = moe_traffic(16, 64, 8, 256, "uniform", seed=3)
    # every token reaches between 1 and top-k ranks (deduplicated), every expert pick computed once
    per_token_ranks = t.tokens.sum(axis=1)
    assert np.all(per_token_ranks >= 64) and np.all(per_token_ranks <= 64 * 8)
    assert t.expert_tokens.sum() == 16 * 64 * 8
    # low-latency kernels: one copy per pick, so each rank receives exactly its experts' tokens
    e = moe_traffic(16, 64, 8, 256, "uniform", seed=3, copies="per_expert")
    assert np.all(e.tokens.sum(axis=1) == 64 * 8)
    assert np.array_equal(e.tokens.sum(axis=0), e.expert_tokens.reshape(16, 16).sum(axis=0))
    assert np.all(e.tokens >= t.tokens)
    with pytest.raises(ConfigError, match="per_expert, per_rank"):
        moe_traffic(16, 64, 8, 256, copies="per_token")
    # determinism: same seed, same routing
    assert np.array_equal(t.tokens, moe_traffic(16, 64, 8, 256, "uniform", seed=3).tokens)


def test_skewed_routing_makes_hot_ranks_and_takes_longer(cm4):
    uni = run_moe(cm4, "dispatch", 32, 128, routing="uniform").to_dict()
    hot = run_moe(cm4, "dispatch", 32, 128, routing="zipf:1.2").to_dict()
    assert hot["imbalance"] > uni["imbalance"] > 1.0
    assert hot["time_us"] > uni["time_us"]
    assert uni["bytes_per_token"] == 7168 + 512  # INT8 activations + the scale slot (7.5 KB)
    comb = run_moe(cm4, "combine", 32, 128).to_dict()
    assert comb["bytes_per_token"] == 2 * 7168
    # combine sends back what dispatch delivered, at 14 KB instead of 7.5 KB per token
    assert comb["max_rank_bytes"] / uni["max_rank_bytes"] == pytest.approx(14336 / 7680, rel=1e-9)


def test_load_profile_file(tmp_path, cm1):
    profile = tmp_path / "load.yaml"
    profile.write_text("expert_load: [" + ", ".join(["10"] * 8 + ["1"] * 248) + "]\n")
    r = run_moe(cm1, "dispatch", 16, 64, routing=str(profile)).to_dict()
    assert r["imbalance"] > 1.2
    profile.write_text("expert_load: [1, 2]\n")
    with pytest.raises(ConfigError, match="2 weights for 256 experts"):
        run_moe(cm1, "dispatch", 16, 64, routing=str(profile))


def test_determinism(cm4):
    a = run_moe(cm4, "combine", 32, 96, routing="zipf:1.0", seed=7).to_dict()
    b = run_moe(cm4, "combine", 32, 96, routing="zipf:1.0", seed=7).to_dict()
    assert a == b


def test_a2_uses_hccs_inside_a_node_and_roce_between(a2):
    inside = point_to_point(a2, "npu0", "npu1", "write", 64 << 20)
    across = point_to_point(a2, "npu0", "npu8", "write", 64 << 20)
    assert inside.fabric == "hccs" and inside.hops == 1
    assert across.fabric == "roce" and across.bandwidth_gbps < 25
    cpu = point_to_point(a2, "npu0", "cpu0", "write", 1 << 20)
    assert cpu.fabric == "pcie"
    assert point_to_point(a2, "npu0", "cpu4", "write", 1 << 20).fabric == "roce"  # another node's host


# -- CLI contracts ----------------------------------------------------------------------------------

def test_cli_json_contracts(capsys):
    assert main(["fabric", "--system", "cloudmatrix384", "--src", "npu0.die0", "--dst", "npu8.die0", "--op", "read",
                 "--bytes", "512", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"bandwidth_gbps", "latency_us", "hops", "path"} <= set(out)
    assert main(["collective", "--system", "cloudmatrix384", "--op", "alltoall", "--ranks", "16", "--bytes", "1MiB",
                 "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"time_us", "algorithm", "bus_bandwidth_gbps", "bytes_per_rank"} <= set(out)
    assert main(["collective", "--system", "cloudmatrix384", "--op", "dispatch", "--ep", "16", "--tokens-per-rank",
                 "32", "--top-k", "8", "--hidden", "7168", "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"time_us", "max_rank_bytes", "mean_rank_bytes", "imbalance"} <= set(out)
    assert main(["info", "cloudmatrix384", "--nodes", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["npus"] == 16 and out["dies"] == 32
