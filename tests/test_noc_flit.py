"""Flit-level NoC: topology and routing helpers, exact zero-load latency, conservation,
deadlock freedom, throughput bounds, determinism and the ``npusim noc`` command."""

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npusim.cli import main
from npusim.errors import ConfigError
from npusim.hw.noc import (
    PORT_E,
    PORT_N,
    PORT_S,
    NocParams,
    SyntheticTraffic,
    build_routing,
    hops,
    make_pattern,
    mesh,
    ring,
    route,
    to_arrays,
    torus,
)
from npusim.sim.noc_synthetic import simulate
from npusim.hw.noc import flit
from npusim.hw.noc.flit import (
    conservation,
    make_state,
    memory_injection_flits,
    memory_port_flits,
    network_idle,
    pop_completed,
    run_cycles,
    send,
    send_packet_from_mem,
    send_packet_mem,
    simulate_flit,
    zero_load_latency_cycles,
)


def _net(w, h, kind="mesh", routing="xy", latency=1):
    build = {"mesh": mesh, "torus": torus}
    graph = ring(w, latency_cycles=latency) if kind == "ring" else build[kind](w, h, latency_cycles=latency)
    topo = to_arrays(graph)
    return topo, build_routing(topo, routing)


def _quick(**kw) -> SyntheticTraffic:
    base = dict(warmup_cycles=100, measure_cycles=600, drain_cycles_max=3000)
    base.update(kw)
    return SyntheticTraffic(**base)


# ---- topology and routing -----------------------------------------------------------

def test_mesh_links_and_ids():
    topo, _ = _net(4, 3)
    assert topo.num_routers == 12 and topo.num_links == 2 * (2 * 4 * 3 - 4 - 3)
    r = 1 * 4 + 2  # (x=2, y=1)
    assert (topo.x[r], topo.y[r]) == (2, 1)
    assert topo.nbr_router[r, PORT_E] == r + 1 and topo.nbr_router[r, PORT_N] == r - 4
    assert not topo.has_dateline


def test_torus_and_ring_have_dateline_links():
    topo, _ = _net(4, 4, "torus")
    assert topo.num_links == 4 * 16 and topo.link_dateline.sum() == 16  # one wrap link per row/column and direction
    topo, rt = _net(6, 1, "ring")
    assert topo.num_links == 12 and topo.link_dateline.sum() == 2
    assert hops(0, 5, rt) == 1 and hops(0, 3, rt) == 3  # shorter way round


@settings(max_examples=40, deadline=None)
@given(kind=st.sampled_from(["mesh", "torus", "ring"]), w=st.integers(1, 7), h=st.integers(1, 7),
       width_bytes=st.sampled_from([16, 64]), latency=st.integers(1, 3))
def test_grid_built_as_arrays_is_the_graph_converted(kind, w, h, width_bytes, latency):
    """``grid_topology`` (the chip's mesh without networkx) gives the arrays ``to_arrays`` gives for
    the same grid's graph, field by field, and builds that graph when asked."""
    from dataclasses import fields

    from npusim.hw.noc.topology import grid_topology

    builders = {"mesh": (mesh, (False, False)), "torus": (torus, (True, True)), "ring": (None, (True, False))}
    build, wrap = builders[kind]
    h = 1 if kind == "ring" else h
    graph = ring(w, width_bytes, latency) if kind == "ring" else build(w, h, width_bytes, latency)
    want, got = to_arrays(graph), grid_topology(kind, w, h, wrap, width_bytes, latency)
    for f in fields(want):
        if f.name != "source_graph":
            a, b = getattr(want, f.name), getattr(got, f.name)
            assert np.array_equal(a, b) and getattr(a, "dtype", None) == getattr(b, "dtype", None), f.name
    assert sorted(got.graph.edges(data=True)) == sorted(graph.edges(data=True))
    assert got.graph.graph == graph.graph and dict(got.graph.nodes(data=True)) == dict(graph.nodes(data=True))


def test_xy_and_yx_routes():
    topo, xy = _net(4, 4)
    _, yx = _net(4, 4, routing="yx")
    src, dst = 0, 2 * 4 + 3  # (0,0) -> (3,2)
    path = route(src, dst, xy)
    assert [int(topo.link_src_port[k]) for k in path] == [PORT_E] * 3 + [PORT_S] * 2
    assert [int(topo.link_src_port[k]) for k in route(src, dst, yx)] == [PORT_S] * 2 + [PORT_E] * 3
    here = src
    for k in path:  # the links chain from src to dst
        assert topo.link_src[k] == here
        here = topo.link_dst[k]
    assert here == dst and route(5, 5, xy) == []
    manhattan = np.abs(topo.x[:, None] - topo.x[None, :]) + np.abs(topo.y[:, None] - topo.y[None, :])
    assert np.array_equal(xy.hop_matrix(), manhattan)


def test_destination_patterns():
    topo, _ = _net(4, 4)
    for name in ("uniform", "transpose", "bitcomp", "hotspot", "neighbor"):
        prob = make_pattern(name, topo).destination_probabilities()
        assert np.allclose(prob.sum(axis=1), 1.0)
    assert make_pattern("transpose", topo).cand_idx[1] == 4  # (1,0) -> (0,1)
    assert make_pattern("bitcomp", topo).cand_idx[0] == 15
    with pytest.raises(ConfigError, match="square"):
        make_pattern("transpose", to_arrays(mesh(4, 2)))


# ---- exact zero-load latency --------------------------------------------------------

ZERO_LOAD_CASES = [
    # w, h, src, dst, flits, stages, link latency, buffer
    (4, 4, 0, 15, 1, 4, 1, 8),
    (4, 4, 0, 15, 4, 4, 1, 8),
    (8, 8, 3, 60, 16, 2, 3, 8),   # F > B but B >= S + 2L: no stall
    (8, 8, 9, 9, 3, 1, 1, 4),     # to itself: through the router only
    (8, 1, 0, 7, 5, 3, 2, 8),
    (3, 5, 14, 0, 2, 1, 1, 2),
    (6, 6, 35, 0, 8, 6, 4, 8),
]


@pytest.mark.parametrize("w,h,src,dst,F,S,L,B", ZERO_LOAD_CASES)
def test_zero_load_latency_is_exact(w, h, src, dst, F, S, L, B):
    topo, rt = _net(w, h, latency=L)
    state = make_state(topo, rt, 2, B, S, done_capacity=4)
    send(state, src, dst, F, 7, tag=42)
    run_cycles(state, 7, 10_000, True)
    tags, times = pop_completed(state)
    H = rt.hops(src, dst)
    assert tags.tolist() == [42]
    assert times[0] - 7 == zero_load_latency_cycles(H, F, S, L) == (H + 1) * S + H * L + F - 1
    assert conservation(state)["ok"] and network_idle(state)


def _memory_port_run(lanes, core_bound_src=None, F=16, S=2, L=1):
    """A 3x1 mesh; routers 0 and 2 each send one ``F``-flit packet to router 1's memory port (as
    HBM read requests do; ``lanes``: its lanes, None: no memory port), and router
    ``core_bound_src`` an ordinary packet to router 1's core. Returns {tag: tail-ejection cycle}
    and the state."""
    topo, rt = _net(3, 1, latency=L)
    state = make_state(topo, rt, 2, 8, S, done_capacity=8, memory_ports=None if lanes is None else [0, lanes, 0])
    for tag, src in ((0, 0), (2, 2)):
        assert send_packet_mem(state, src, 1, F, 0, tag) >= 0
    if core_bound_src is not None:
        send(state, core_bound_src, 1, F, 0, tag=9)
    run_cycles(state, 0, 1000, True)
    tags, times = pop_completed(state)
    assert conservation(state)["ok"] and network_idle(state)
    return dict(zip(tags.tolist(), times.tolist())), state


def test_memory_port_lanes_take_a_flit_each_a_cycle():
    """Two packets into a router's memory port from its two neighbours: with two lanes both arrive
    at the zero-load latency, and a packet the router's own core sends itself meanwhile (through its
    local ejection port) is not delayed by them; with one lane they share it (the later tail is ``F``
    cycles late); without memory ports (the ablation) all three share the local port, one flit a cycle."""
    F, S, L = 16, 2, 1
    zero = int(zero_load_latency_cycles(1, F, S, L))
    two, st2 = _memory_port_run(2, core_bound_src=1)
    assert two[0] == two[2] == zero
    assert two[9] == int(zero_load_latency_cycles(0, F, S, L))  # the core's port is its own
    assert memory_port_flits(st2).tolist() == [0, 2 * F, 0]
    assert st2.ctr[flit.fk.K_MEM_EJ] == 2 * F
    one, st1 = _memory_port_run(1)
    assert max(one[0], one[2]) == zero + F  # 2F flits through one lane, interleaved
    assert memory_port_flits(st1).sum() == 2 * F
    none, st0 = _memory_port_run(None, core_bound_src=1)
    assert memory_port_flits(st0).sum() == 0
    assert max(none.values()) >= S + 3 * F - 1  # three packets through one ejection port
    # the ablation is the model before: memory-bound packets are ordinary packets
    plain, _ = _memory_port_run(0, core_bound_src=1)
    assert plain == none


def _memory_injection_run(lanes, dsts=(3, 5), core_dst=1, F=16, S=2, L=1, V=2):
    """A 3x3 mesh; router 4's memory sends one ``F``-flit packet to each of ``dsts`` (as read data
    goes back to the cores; ``lanes``: router 4's memory lanes, None: no memory ports), and its core
    an ordinary packet to ``core_dst`` (None: none). Returns {tag: tail-ejection cycle}, the state."""
    topo, rt = _net(3, 3, latency=L)
    ports = None if lanes is None else [lanes if r == 4 else 0 for r in range(9)]
    state = make_state(topo, rt, V, 8, S, done_capacity=8, memory_ports=ports)
    for tag, dst in enumerate(dsts):
        assert send_packet_from_mem(state, 4, dst, F, 0, tag) >= 0
    if core_dst is not None:
        send(state, 4, core_dst, F, 0, tag=9)
    run_cycles(state, 0, 1000, True)
    tags, times = pop_completed(state)
    assert conservation(state)["ok"] and network_idle(state)
    assert state.ctr[flit.fk.K_ERRORS] == 0
    return dict(zip(tags.tolist(), times.tolist())), state


def test_memory_injection_lanes_send_a_flit_each_a_cycle():
    """Two packets from a router's memory to two neighbours, while its core sends one to a third:
    with two memory injection lanes all three arrive at the zero-load latency (the memory injects 2
    flits a cycle, the core's NI is its own); with one lane the memory's two share it (the later
    tail ``F`` cycles late) and the core's is not delayed; without memory ports (and with 0 lanes,
    the ablation: the same cycles) all three share the router's one NI, a flit a cycle."""
    F, S, L = 16, 2, 1
    zero = int(zero_load_latency_cycles(1, F, S, L))
    two, st2 = _memory_injection_run(2)
    assert two == {0: zero, 1: zero, 9: zero}
    assert memory_injection_flits(st2).tolist() == [0, 0, 0, 0, 2 * F, 0, 0, 0, 0]
    assert st2.ctr[flit.fk.K_MEM_INJ] == 2 * F and memory_port_flits(st2).sum() == 0
    one, st1 = _memory_injection_run(1)
    assert one[9] == zero and sorted((one[0], one[1])) == [zero, zero + F]
    assert memory_injection_flits(st1).sum() == 2 * F
    none, st0 = _memory_injection_run(None)
    assert memory_injection_flits(st0).sum() == 0
    assert max(none.values()) == zero + 2 * F  # 3F flits through one NI
    plain, _ = _memory_injection_run(0)
    assert plain == none


@pytest.mark.parametrize("V", [1, 2])
def test_memory_injection_lanes_share_an_output_link(V):
    """Lanes compete for output links like any input: two memory packets to the same neighbour
    take the one link a flit a cycle (the later tail ``F`` cycles late), and with one VC the second
    waits for the first's tail (VC allocation and credits); the link never carries more than a flit
    a cycle."""
    F, S, L = 16, 2, 1
    zero = int(zero_load_latency_cycles(1, F, S, L))
    t, st = _memory_injection_run(2, dsts=(5, 5), core_dst=None, V=V)
    assert max(t.values()) == zero + F
    if V == 1:
        assert min(t.values()) == zero
    topo, _ = _net(3, 3, latency=L)
    assert flit.link_flits(st, topo).sum() == 2 * F


def test_credit_stall_only_adds_latency():
    """With F > B and B < S + 2L the credit loop throttles the packet: slower, never faster."""
    topo, rt = _net(8, 1, latency=2)
    state = make_state(topo, rt, 1, 4, 3, done_capacity=4)
    send(state, 0, 7, 5, 0, tag=1)
    run_cycles(state, 0, 1000, True)
    assert pop_completed(state)[1][0] > zero_load_latency_cycles(7, 5, 3, 2)


def test_low_load_average_matches_zero_load():
    res = simulate_flit(NocParams(6, 6), _quick(rate=0.01, packet_flits=2, measure_cycles=10000))
    assert not res.saturated
    floor = zero_load_latency_cycles(res.avg_hops, 2, 4, 1)  # linear in H: the mean of the formula
    assert floor - 1e-9 <= res.avg_packet_latency_cycles < 1.03 * floor
    assert res.zero_load_latency_cycles == pytest.approx(floor, rel=0.05)


def test_engine_api_many_packets():
    topo, rt = _net(3, 3)
    state = make_state(topo, rt, 2, 4, 2, done_capacity=64)
    for tag in range(20):
        send(state, tag % 9, (tag * 5) % 9, 1 + tag % 3, 0, tag)
    cycle = run_cycles(state, 0, 5000, True)
    tags, times = pop_completed(state)
    assert sorted(tags.tolist()) == list(range(20)) and times.max() < cycle
    assert pop_completed(state)[0].size == 0
    with pytest.raises(ConfigError):
        send(state, 0, 99, 1, cycle, 0)


# ---- conservation, deadlock freedom, throughput bounds --------------------------------

@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    w=st.integers(1, 4), h=st.integers(1, 4), rate=st.floats(0.05, 1.0), flits=st.integers(1, 4),
    vcs=st.integers(1, 3), buf=st.integers(1, 4), stages=st.integers(1, 3), seed=st.integers(0, 10_000),
)
def test_flits_are_conserved(w, h, rate, flits, vcs, buf, stages, seed):
    params = NocParams(w, h, vcs=vcs, buffer_flits=buf, router_stages=stages)
    traffic = SyntheticTraffic(rate=rate, packet_flits=flits, warmup_cycles=20, measure_cycles=150,
                               drain_cycles_max=300, seed=seed, source_queue_packets=16)
    topo = to_arrays(params.build_graph())
    state = make_state(topo, build_routing(topo), vcs, buf, stages, traffic.source_queue_packets)
    flit.run_traffic(state, make_pattern("uniform", topo), traffic)
    assert conservation(state)["ok"]
    run_cycles(state, int(state.ctr[flit.fk.K_LAST_CYCLE]) + 1, 100_000, True)  # stop injecting, drain
    report = conservation(state)
    assert network_idle(state) and report["ok"]
    assert report["flits_created"] == report["flits_injected"] == report["flits_ejected"]


@pytest.mark.parametrize("kind,routing,vcs", [("mesh", "xy", 1), ("mesh", "yx", 2), ("torus", "xy", 2),
                                              ("ring", "xy", 2)])
def test_no_deadlock_when_flooded(kind, routing, vcs):
    """Every node floods the network far beyond saturation; once injection stops all drains."""
    topo, rt = _net(6, 5, kind, routing)
    state = make_state(topo, rt, vcs, 2, 2, source_queue_packets=64)
    rng = np.random.default_rng(3)
    n = topo.num_routers
    for src in range(n):
        for dst in rng.integers(0, n, 40):
            send(state, src, int(dst), int(rng.integers(1, 6)), 0, 0)
    run_cycles(state, 0, 200_000, True)
    assert network_idle(state) and conservation(state)["ok"]


def test_accepted_throughput_bounded_by_offered_load_and_links():
    for rate in (0.1, 0.3, 0.6, 1.0):
        res = simulate_flit(NocParams(4, 4), _quick(rate=rate, packet_flits=2, seed=5))
        window_flits = res.generated_flits_per_node_cycle * 16 * 600
        assert res.accepted_flits_per_node_cycle <= res.generated_flits_per_node_cycle + 3 * np.sqrt(window_flits) / (16 * 600) + 0.01
        assert res.link_utilization.max() <= 1.0
        if not res.saturated:
            assert res.accepted_flits_per_node_cycle == pytest.approx(rate, rel=0.1)


def test_saturation_is_flagged():
    assert not simulate_flit(NocParams(4, 4), _quick(rate=0.1)).saturated
    hot = simulate_flit(NocParams(4, 4), _quick(pattern="hotspot", rate=0.8, hotspot_fraction=1.0))
    assert hot.saturated and hot.accepted_flits_per_node_cycle <= 1.0 / 16 + 0.01  # one ejection port


def test_deterministic():
    params, traffic = NocParams(4, 4), _quick(rate=0.3, packet_flits=3, seed=11)

    def run(t):
        d = simulate("flit", params, t).to_dict()
        d.pop("wall_seconds")
        d.pop("router_cycles_per_second")
        return d

    first = run(traffic)
    assert run(traffic) == first
    assert run(_quick(rate=0.3, packet_flits=3, seed=12)) != first


def test_bad_parameters():
    with pytest.raises(ConfigError, match="rate"):
        SyntheticTraffic(rate=0.0)
    with pytest.raises(ConfigError, match="2 virtual channels"):
        simulate_flit(NocParams(4, 4, topology="torus", vcs=1), _quick())
    with pytest.raises(ConfigError):
        NocParams(4, 4, vcs=65)
    with pytest.raises(ConfigError, match="unknown NoC fidelity"):
        simulate("wormhole", NocParams(), _quick())


# ---- the npusim noc command -----------------------------------------------------------

def test_cli_json_contract(capsys):
    code = main(["noc", "--mesh", "4x4", "--traffic", "uniform", "--rate", "0.2", "--packet-flits", "4",
                 "--cycles", "800", "--warmup", "100", "--seed", "3", "--vcs", "2", "--buffer-flits", "4",
                 "--router-stages", "2", "--link-latency-cycles", "1", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0
    for key in ("avg_packet_latency_cycles", "avg_network_latency_cycles", "offered_flits_per_node_cycle",
                "accepted_flits_per_node_cycle", "avg_hops", "saturated"):
        assert key in d
    assert d["offered_flits_per_node_cycle"] == 0.2 and d["saturated"] is False
    assert d["params"]["router_stages"] == 2 and len(d["link_utilization"]) == 48


def test_cli_text_sweep_and_arch(capsys):
    assert main(["noc", "--mesh", "3x3", "--rate", "0.1", "--cycles", "300"]) == 0
    out = capsys.readouterr().out
    assert "accepted throughput" in out and "hottest links" in out
    assert main(["noc", "--arch", "npusim-64c", "--mesh", "3x3", "--cycles", "300", "--sweep",
                 "--sweep-step", "0.25"]) == 0
    out = capsys.readouterr().out
    assert "max accepted throughput" in out and "yes" in out  # reached saturation


@pytest.mark.parametrize("argv,message", [
    (["--mesh", "8y8"], "--mesh"),
    (["--rate", "0"], "--rate"),
    (["--rate", "1.5"], "--rate"),
    (["--rate", "fast"], "--rate"),
    (["--traffic", "zigzag"], "--traffic"),
    (["--fidelity", "wormhole"], "unknown NoC fidelity"),
    (["--vcs", "0"], "--vcs"),
    (["--packet-flits", "x"], "--packet-flits"),
])
def test_cli_bad_arguments(capsys, argv, message):
    assert main(["noc", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


# ---- BookSim2-compatible mode ----------------------------------------------------------

@pytest.mark.parametrize("w,h,src,dst,F,S,L,B", ZERO_LOAD_CASES)
def test_booksim_zero_load_latency_is_exact(w, h, src, dst, F, S, L, B):
    """Injection channel (+1) and ejection channel with the NI's read (+2) on top of the
    pipeline; body flits follow the head one per cycle while the buffers cover the credit
    round trip (``B >= 2L + min(S, 2) + 1``: BookSim's credit takes a cycle more)."""
    if F > B and B < 2 * L + min(S, 2) + 1:
        pytest.skip("the credit loop throttles this packet in BookSim mode")
    topo, rt = _net(w, h, latency=L)
    state = make_state(topo, rt, 2, B, S, done_capacity=4, booksim=True)
    send(state, src, dst, F, 7, tag=42)
    run_cycles(state, 7, 10_000, True)
    tags, times = pop_completed(state)
    H = rt.hops(src, dst)
    assert tags.tolist() == [42]
    assert times[0] - 7 == zero_load_latency_cycles(H, F, S, L, booksim=True) == (H + 1) * S + H * L + F - 1 + 3
    assert conservation(state)["ok"] and network_idle(state)


def test_booksim_mode_matches_booksim2_run():
    """BookSim2's defaults on a 4x4 mesh, uniform 1-flit packets: BookSim2 gives 19.7 cycles at
    0.05 and 20.1 at 0.25 flits/node/cycle (issue 13; validation/noc_booksim_reference.yaml).
    The default mode is ~3 cycles (15 %) below; BookSim mode within 3 %."""
    p = NocParams(4, 4, vcs=16, buffer_flits=8, router_stages=4, booksim_compatible=True)
    for rate, ref in ((0.05, 19.7), (0.25, 20.1)):
        res = simulate_flit(p, SyntheticTraffic(rate=rate, measure_cycles=20000, seed=2))
        assert res.avg_packet_latency_cycles == pytest.approx(ref, rel=0.03)
        default = simulate_flit(NocParams(4, 4, vcs=16, buffer_flits=8),
                                SyntheticTraffic(rate=rate, measure_cycles=20000, seed=2))
        assert default.avg_packet_latency_cycles < 0.9 * ref
    # contention grows latency with load, and the zero-load floor holds
    assert res.avg_packet_latency_cycles > res.zero_load_latency_cycles == pytest.approx(19.5)


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["mesh", "torus", "ring"]), rate=st.floats(0.05, 1.0), flits=st.integers(1, 4),
    vcs=st.integers(2, 4), buf=st.integers(1, 4), stages=st.integers(1, 5), seed=st.integers(0, 10_000),
)
def test_booksim_mode_conserves_and_drains(kind, rate, flits, vcs, buf, stages, seed):
    params = NocParams(4, 3, topology=kind, vcs=vcs, buffer_flits=buf, router_stages=stages, booksim_compatible=True)
    traffic = SyntheticTraffic(rate=rate, packet_flits=flits, warmup_cycles=20, measure_cycles=200,
                               drain_cycles_max=300, seed=seed, source_queue_packets=16)
    topo = to_arrays(params.build_graph())
    state = make_state(topo, build_routing(topo), vcs, buf, stages, traffic.source_queue_packets, booksim=True)
    flit.run_traffic(state, make_pattern("uniform", topo), traffic)
    assert conservation(state)["ok"]
    run_cycles(state, int(state.ctr[flit.fk.K_LAST_CYCLE]) + 1, 200_000, True)
    report = conservation(state)
    assert network_idle(state) and report["ok"]
    assert report["flits_created"] == report["flits_injected"] == report["flits_ejected"]


def test_cli_booksim_flag(capsys):
    code = main(["noc", "--mesh", "4x4", "--vcs", "16", "--buffer-flits", "8", "--rate", "0.05", "--cycles", "800",
                 "--booksim-compatible", "--json"])
    d = json.loads(capsys.readouterr().out)
    assert code == 0 and d["params"]["booksim_compatible"] is True
    assert d["zero_load_latency_cycles"] == pytest.approx(19.5)
    assert d["avg_packet_latency_cycles"] >= 19.5
    assert main(["noc", "--fidelity", "path", "--booksim-compatible"]) == 2
    assert "only the flit fidelity" in capsys.readouterr().err


# ---- large networks: routing computed from coordinates -----------------------------------

@pytest.mark.parametrize("kind,order", [("mesh", "xy"), ("mesh", "yx"), ("torus", "xy"), ("ring", "yx")])
def test_computed_routing_equals_the_table(kind, order):
    from npusim.hw.noc.routing import Routing, dimension_order_hops

    topo, table = _net(5, 4, kind, order)
    computed = Routing(order, topo, None)
    n = topo.num_routers
    src, dst = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    assert all(computed.port(r, d) == table.next_port[r, d] for r in range(n) for d in range(n))
    assert np.array_equal(dimension_order_hops(topo, src, dst), table.hop_matrix())
    assert computed.route(0, n - 1) == table.route(0, n - 1)
    # the flit kernel's computed routes deliver every packet at the zero-load latency
    state = make_state(topo, computed, 2, 8, 3, done_capacity=n * n)
    for s in range(n):
        for d in range(n):
            state_one = make_state(topo, computed, 2, 8, 3, done_capacity=4)
            send(state_one, s, d, 2, 0, tag=1)
            run_cycles(state_one, 0, 1000, True)
            assert pop_completed(state_one)[1][0] == zero_load_latency_cycles(table.hops(s, d), 2, 3, 1)
    assert conservation(state)["ok"]


def test_large_mesh_runs_without_a_dense_table_or_says_why(capsys):
    from npusim.hw.noc.routing import DENSE_ROUTING_MAX_ROUTERS

    params = NocParams(65, 64)  # 4,160 routers: computed routing
    topo = to_arrays(params.build_graph())
    assert topo.num_routers > DENSE_ROUTING_MAX_ROUTERS and not build_routing(topo).dense
    assert main(["noc", "--mesh", "300x300"]) == 2
    assert "at most 16384" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="dense routing table"):
        build_routing(topo).hop_matrix()


def test_every_fidelity_gets_the_same_packets():
    """One generator (traffic.packet_stream): same seed, same packets at every fidelity,
    independent of how a consumer splits the stream into blocks."""
    from npusim.hw.noc.traffic import packet_stream

    params, traffic = NocParams(4, 4), _quick(rate=0.2, packet_flits=2, seed=9)
    counts = {fid: simulate(fid, params, traffic).packets_measured for fid in ("flit", "path", "analytical")}
    assert len(set(counts.values())) == 1 and counts["flit"] > 0
    pattern = make_pattern("transpose", to_arrays(params.build_graph()))
    whole = packet_stream(traffic, pattern, 0, 5000)
    parts = [packet_stream(traffic, pattern, a, b) for a, b in ((0, 1000), (1000, 3333), (3333, 5000))]
    for i in range(3):
        assert np.array_equal(whole[i], np.concatenate([p[i] for p in parts]))


@pytest.mark.parametrize("noc", ["path", "flit"])
def test_forward_summary_reports_the_link_use_of_its_own_noc_model(small_arch, noc):
    """A forward pass's link utilisation comes from the NoC model that ran it: at the flit
    fidelity the cycle-accurate routers' link counters (it reported the idle path model's zeros,
    0.0 on the README's forward pass with every HBM byte crossing the mesh)."""
    from graphs import tiny_transformer
    from npusim.mapping.spec import spec_from_flags
    from npusim.scenarios.forward import simulate_forward

    run = simulate_forward(tiny_transformer(phase="decode", batch=2, seq=64, layers=1), small_arch,
                           spec_from_flags(tp=4), memory_mode="analytical", noc_mode=noc)
    s, sim = run.summary, run.sim
    assert s["hbm_bytes_over_noc"] > 0
    assert 0 < s["noc_link_utilization_mean"] <= s["noc_link_utilization_max"] <= 1
    flits = sim.link_flits()
    assert flits.shape == (sim.topology.num_links,) and flits.sum() > 0
    assert s["noc_link_utilization_max"] == pytest.approx(flits.max() / s["cycles"])
    if noc == "flit":
        assert (flits == flit.link_flits(sim.flit.fs, sim.topology)).all()


@pytest.mark.parametrize("booksim,lanes", [(True, 0), (False, 0), (False, 2)])
def test_request_reply_traffic_answers_every_request(booksim, lanes):
    """Request-reply synthetic traffic (BookSim2's use_read_write): each request that arrives
    sends a reply back, so the measured packets are the requests and their replies, the
    network keeps every flit, and only the sources named create requests."""
    params = NocParams(3, 3, vcs=2, buffer_flits=4, router_stages=2, booksim_compatible=booksim)
    traffic = SyntheticTraffic(pattern="hotspot", hotspot_nodes=(0, 8), hotspot_fraction=1.0, rate=0.02,
                               packet_flits=1, reply_flits=3, memory_lanes=lanes, sources=(4, 5, 7),
                               warmup_cycles=200, measure_cycles=2000)
    res = flit.simulate_flit(params, traffic)
    assert not res.saturated
    assert res.packets_delivered == res.packets_measured and res.packets_measured % 2 == 0
    requests = res.packets_measured // 2
    # 3 sources at 0.02 requests a cycle over 2000 cycles; replies carry 3 flits for each 1 of a request
    assert 0.5 * 120 < requests < 1.5 * 120
    assert res.accepted_flits_per_node_cycle == pytest.approx(4 * 0.02 * 3 / 9, rel=0.2)
    # every source is 1 to 3 hops from a hotspot corner, its reply as far back
    assert 1 <= res.avg_hops <= 3
