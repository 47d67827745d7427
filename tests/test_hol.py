"""Head-of-line coupling of the memory flows (npusim.hw.noc.hol, npusim.hw.noc.memflow): the port
model's bounds and limits, the micro-benchmarks' direction against max-min and Karol's 2x2 switch,
and the flows with and without it on all-core traffic."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.arch import load_arch
from npusim.errors import ConfigError
from npusim.hw.noc import memflow
from npusim.hw.noc.hol import NSLOT, mesh_flow_rates, others_ahead, port_eta
from npusim.sim import Simulator


def _eta(lam, N):
    n = len(lam)
    lam_a, N_a = np.zeros(NSLOT + 2), np.zeros(NSLOT + 2)
    lam_a[:n], N_a[:n] = lam, N
    return port_eta(lam_a, N_a, n, np.zeros(NSLOT + 2))


def test_port_alone_at_its_outputs_loses_nothing():
    assert _eta([0.7], [0.0]) == 1.0
    assert _eta([0.3, 0.5, 0.1], [0.0, 0.0, 0.0]) == 1.0
    assert _eta([0.0, 0.0], [2.0, 1.0]) == 1.0  # a port carrying nothing


def test_one_output_held_by_others_costs_a_cycle_each():
    """All of the port's flits for one output with N others always ahead: each holds the port
    1 + N cycles (no other output to alternate with)."""
    for n in (1.0, 2.0, 3.0):
        assert _eta([0.5], [n]) == pytest.approx(1.0 / (1.0 + n))


def test_others_ahead_counts_the_other_inputs_requests():
    ucap = np.ones(NSLOT)
    lam = np.zeros(NSLOT)
    lam[3] = 0.9
    assert others_ahead(lam, ucap, 3, 1.0) == 0.0  # only the port itself
    lam[1] = 1.0  # a backlogged other input: always requesting
    assert others_ahead(lam, ucap, 3, 1.0) == pytest.approx(1.0)
    assert others_ahead(lam, ucap, 3, 2.0) == 0.0  # a 2-lane output serves both at once
    lam[:] = 0.0
    lam[3], lam[2] = 0.5, 0.2  # a light other requests u2 = 0.2 t2 of the time, t2 = 1 + u3, t3 = 1 + u2
    assert others_ahead(lam, ucap, 3, 1.0) == pytest.approx(1.0 / 3.0)  # t3 = 1.2 + 0.1 t3


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 5.0)), min_size=1, max_size=6))
def test_eta_is_a_share_no_lower_than_the_worst_waits(outs):
    lam = [a for a, _ in outs]
    N = [b for _, b in outs]
    e = _eta(lam, N)
    assert 1.0 / (1.0 + max(N)) - 1e-9 <= e <= 1.0 + 1e-12


def _part_e(m, mode="split", law="waits"):
    W = 7
    x, y = 3, 3
    rid = lambda a, b: b * W + a  # noqa: E731
    D, D2 = rid(x, y + 1), rid(x, y + 2)
    if mode == "split":
        fl = [(1.0, [(rid(x - 1, y), D, 1.0)]), (1.0, [(rid(x, y - 1), D2, 1.0)])]
    else:
        fl = [(1.0, [(s, D, 0.5), (s, D2, 0.5)]) for s in (rid(x - 1, y), rid(x, y - 1))]
    fl += [(1.0, [(o, D2, 1.0)]) for o in [rid(x + 1, y + 1), rid(x - 1, y + 1), D][:m]]
    with_hol, eta = mesh_flow_rates(W, W, fl, law=law)
    plain, _ = mesh_flow_rates(W, W, fl, hol=False)
    return with_hol[0] + with_hol[1], plain[0] + plain[1], eta[(rid(x, y), D)]


def test_downstream_contention_holds_the_upstream_link_back():
    """noc_link_saturation.py part E: max-min gives link X -> D its width whatever contends at D's
    south output; with the coupling it loses more as more inputs contend there, and with none it
    loses nothing (the flit routers since session 56: 1.0 / 1.0 / 0.67 / 0.50 for m = 0..3; the
    coupling, derived against their earlier allocation orders, is pessimistic there)."""
    xd = []
    for m in range(4):
        hol, plain, eta = _part_e(m)
        assert plain == pytest.approx(1.0)
        assert hol == pytest.approx(eta, rel=1e-6)  # the link is the bottleneck at its eta
        xd.append(hol)
    assert xd[0] == pytest.approx(1.0)
    assert xd[0] > xd[1] > xd[2] > xd[3]
    assert xd[3] == pytest.approx(0.42, abs=0.01)  # m = 3: the coupling's own figure (session 49)
    hol, plain, _ = _part_e(3, "mixed")
    assert plain == pytest.approx(0.5) and hol < plain


def test_fifo_fluid_law_gives_the_link_twice_the_held_sources_share():
    """``law="fifo-fluid"`` on part E's split case: D's south output shared by its input ports
    (1/(m+1) each), X's output letting the two sources in by turns, so X -> D carries twice the
    continuing source's share (the round-robin flit routers: 1.0 / 0.667 / 0.500 for m = 1..3);
    nothing lost with no contender; in the mixed case it is the fluid bound (1/(m+1) of D's output
    for the half of X -> D's flits that want it), which the flit routers stay below (0.80 / 0.62 /
    0.49: the stochastic blocking this law leaves out)."""
    for m, want in ((0, 1.0), (1, 1.0), (2, 2 / 3), (3, 0.5)):
        hol, plain, eta = _part_e(m, law="fifo-fluid")
        assert plain == pytest.approx(1.0)
        assert hol == pytest.approx(want, rel=1e-6) and eta == pytest.approx(want, rel=1e-6)
    for m in (1, 2, 3):
        hol, _, _ = _part_e(m, "mixed", law="fifo-fluid")
        assert hol == pytest.approx(min(1.0, 2 / (m + 1)), rel=1e-6)


def test_two_by_two_switch_near_karol():
    """Router (3, 3) of a 7x7 mesh as a 2x2 switch under uniform traffic (part B): Karol, Hluchyj
    and Morgan's FIFO input queue saturates at 0.75 an output, the flit model at 0.75-0.80."""
    W, x, y = 7, 3, 3
    rid = lambda a, b: b * W + a  # noqa: E731
    north, south = rid(x, y - 1), rid(x, y + 1)
    fl = [(1.0, [(s, north, 0.5), (s, south, 0.5)]) for s in (rid(x - 1, y), rid(x - 2, y), rid(x + 1, y), rid(x + 2, y))]
    rate, _ = mesh_flow_rates(W, W, fl)
    assert rate.sum() / 2 == pytest.approx(0.75, abs=0.03)


def test_mesh_flow_rates_rejects_bad_input():
    with pytest.raises(ConfigError):
        mesh_flow_rates(0, 3, [])
    with pytest.raises(ConfigError):
        mesh_flow_rates(3, 3, [(1.0, [(0, 9, 1.0)])])
    with pytest.raises(ConfigError):
        mesh_flow_rates(3, 3, [(1.0, [(0, 8, 1.0)])], law="fluid")


def _stream(hol):
    old = memflow.HOL_COUPLING
    memflow.HOL_COUPLING = hol
    try:
        arch = load_arch("npusim-64c")
        sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
    finally:
        memflow.HOL_COUPLING = old
    size = (64 << 10) // sim.dma_engines // 2
    a = 0
    for c in range(arch.num_cores):
        for e in range(sim.dma_engines):
            prev = ()
            for _ in range(2):
                prev = (sim.add_dma(c, size, address=a, dma_engine=e, deps=prev),)
                a += size
    return sim, a


def test_all_core_stream_slower_with_the_coupling_and_links_within_their_share():
    """All cores streaming on npusim-64c: the column-0/7 links' ports lose capacity to the
    flits continuing into contended outputs, so the stream takes longer than plain max-min; every
    byte crosses; mid-run every link's load stays within its eta of its width, and eta is 1 off
    the mesh links."""
    plain, total = _stream(False)
    plain.run()
    sim, _ = _stream(True)
    fl = sim.mempath.fl
    nl = sim.topology.num_links
    seen_low = False
    for until in (500, 1500, 3000):
        sim.run(until=until)
        act = fl.act[:int(fl.sc[memflow.S_NACT])]
        if int(fl.sc[memflow.S_PENDING]) != 0 or len(act) == 0:
            continue
        load = np.zeros(len(fl.rcap))
        for f in act:
            for k in range(int(fl.e_n[f])):
                load[fl.e_res[f, k]] += fl.rate[f] * fl.e_coef[f, k]
        assert np.all(load[:nl] <= fl.eta[:nl] * fl.rcap[:nl] * (1 + 1e-6) + 1e-9)
        assert np.all((fl.eta > 0.0) & (fl.eta <= 1.0)) and np.all(fl.eta[nl:] == 1.0)
        seen_low |= bool(fl.eta[:nl].min() < 0.95)
    sim.run()
    assert seen_low
    assert sim.hbm_bytes_over_noc == total == plain.hbm_bytes_over_noc
    assert sim.makespan() > plain.makespan() * 1.05
    assert int(fl.sc[memflow.S_HOL_FILLS]) > 0
    again, _ = _stream(True)
    again.run()
    assert again.makespan() == sim.makespan()  # deterministic


def _sweeps(lam, ucap, k, sweeps=100000, tol=1e-15):
    """The fixed point of the settled requests by plain sweeps from ``t = 1`` (the definition)."""
    t = np.ones(NSLOT)
    for _ in range(sweeps):
        u = np.minimum(ucap, lam * t)
        nt = 1.0 + np.maximum(0.0, u.sum() - u - (k - 1.0)) / k
        if np.max(np.abs(nt - t)) < tol:
            t = nt
            break
        t = nt
    return np.minimum(ucap, lam * t)


@pytest.mark.parametrize("seed", range(40))
def test_settled_requests_solve_is_the_least_fixed_point_the_sweeps_reach(seed):
    """The exact solve (breakpoints of the total's piecewise-linear map) gives what sweeping the
    inputs' times from ``t = 1`` converges to, at one lane or several, with capped memory lanes."""
    from npusim.hw.noc.hol import settled_requests
    rng = np.random.default_rng(seed)
    k = float(rng.choice([1, 1, 2, 4]))
    lam = rng.uniform(0.0, 0.45, NSLOT) * (rng.random(NSLOT) < 0.7)
    ucap = np.ones(NSLOT)
    ucap[5] = float(rng.choice([1, 2, 8]))
    u = np.zeros(NSLOT)
    U = settled_requests(lam, ucap, k, u)
    ref = _sweeps(lam, ucap, k)
    assert u == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert U == pytest.approx(ref.sum(), rel=1e-9, abs=1e-12)
