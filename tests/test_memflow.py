"""HBM traffic as max-min fair flows over the mesh (npusim.hw.maxmin, npusim.hw.noc.memflow): the
solver's properties on hand-made and random cases, bytes conserved, no resource beyond its width,
the closed loop's round trip, and no progress reported as a deadlock."""

from __future__ import annotations

import numpy as np
import pytest

from npusim.arch import load_arch
from npusim.errors import DeadlockError
from npusim.hw.maxmin import maxmin_rates, new_scratch
from npusim.hw.noc.memflow import F_PEAK_LOAD, RTT_OVERHEAD, S_NACT
from npusim.hw.memory.hbm import PATTERN_RANDOM
from npusim.sim import Simulator


def _solve(entries, rcap, fcap=None):
    """``entries[f]``: {resource: coefficient}; returns the rates."""
    n = len(entries)
    width = max(1, max(len(e) for e in entries))
    e_n = np.array([len(e) for e in entries], np.int64)
    e_res = np.zeros((n, width), np.int64)
    e_coef = np.zeros((n, width), np.float64)
    for f, e in enumerate(entries):
        for k, (r, c) in enumerate(sorted(e.items())):
            e_res[f, k], e_coef[f, k] = r, c
    fcap = np.full(n, np.inf) if fcap is None else np.asarray(fcap, np.float64)
    rate = np.zeros(n)
    rcap = np.asarray(rcap, np.float64)
    maxmin_rates(n, np.arange(n, dtype=np.int64), e_n, e_res, e_coef, fcap, rcap, rate,
                 new_scratch(len(rcap), n, n * width), 1e-12)
    return rate


def _check_maxmin(entries, rcap, fcap, rate):
    """No resource beyond its capacity, no flow above its cap, and every flow has a bottleneck: its
    cap, or a full resource on which no other flow has a higher rate (the max-min property)."""
    load = np.zeros(len(rcap))
    for f, e in enumerate(entries):
        for r, c in e.items():
            load[r] += c * rate[f]
    assert np.all(load <= np.asarray(rcap) * (1 + 1e-9) + 1e-12)
    for f, e in enumerate(entries):
        assert rate[f] <= fcap[f] * (1 + 1e-9)
        # a flow's share on any one resource never exceeds that resource
        for r, c in e.items():
            assert c * rate[f] <= rcap[r] * (1 + 1e-9) + 1e-12
        if rate[f] >= fcap[f] * (1 - 1e-9):
            continue
        ok = False
        for r in e:
            full = load[r] >= rcap[r] * (1 - 1e-9)
            top = all(rate[g] <= rate[f] * (1 + 1e-9) for g, eg in enumerate(entries) if r in eg)
            ok |= full and top
        assert ok, f"flow {f} at {rate[f]} has no bottleneck"


def test_hand_made_max_min_case():
    # flow 0 crosses A and B, flow 1 only A, flow 2 only B: each gets half of a unit link
    assert np.allclose(_solve([{0: 1, 1: 1}, {0: 1}, {1: 1}], [1.0, 1.0]), [0.5, 0.5, 0.5])
    # weighted: flow 0 puts 2 flits per byte on A (1/cycle), flow 1 one on A and one on B (0.3):
    # B fills first (flow 1 at 0.3), then A's remaining 0.7 goes to flow 0 at 2 flits a byte: 0.35
    assert np.allclose(_solve([{0: 2.0}, {0: 1.0, 1: 1.0}], [1.0, 0.3]), [0.35, 0.3])
    # a cap freezes its flow early and the others share what it leaves
    assert np.allclose(_solve([{0: 1}, {0: 1}, {0: 1}], [1.0], fcap=[0.1, np.inf, np.inf]), [0.1, 0.45, 0.45])


@pytest.mark.parametrize("seed", range(20))
def test_random_cases_are_max_min_fair_within_every_capacity(seed):
    rng = np.random.default_rng(seed)
    nres, nflow = int(rng.integers(2, 9)), int(rng.integers(1, 12))
    rcap = rng.uniform(0.5, 4.0, nres)
    entries = []
    for _ in range(nflow):
        k = int(rng.integers(1, nres + 1))
        res = rng.choice(nres, k, replace=False)
        entries.append({int(r): float(rng.uniform(0.1, 3.0)) for r in res})
    fcap = np.where(rng.random(nflow) < 0.3, rng.uniform(0.05, 1.0, nflow), np.inf)
    rate = _solve(entries, rcap, fcap)
    _check_maxmin(entries, rcap, fcap, rate)


def _all_cores_stream(arch, per_core=64 << 10, pieces=2, write=False, random=False):
    sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
    size = per_core // sim.dma_engines // pieces
    addr = 0
    for c in range(arch.num_cores):
        for e in range(sim.dma_engines):
            prev = ()
            for _ in range(pieces):
                t = sim.add_dma(c, size, address=addr, write=write, dma_engine=e, deps=prev,
                                pattern=PATTERN_RANDOM if random else 0)
                prev = (t,)
                addr += size
    return sim, addr


@pytest.mark.parametrize("write,random", [(False, False), (True, False), (False, True)])
def test_flows_conserve_bytes_and_never_load_a_link_beyond_its_width(write, random):
    arch = load_arch("npusim-64c")
    sim, total = _all_cores_stream(arch, write=write, random=random)
    sim.run()
    fl = sim.mempath.fl
    assert sim.hbm_bytes_over_noc == total  # every byte of every DMA crossed the mesh once
    assert int(fl.sc[S_NACT]) == 0
    # every core received (reads) or sent (writes) its data: a core's ejection port carried its
    # data flits (reads) or one flit a burst (writes)
    w = arch.noc.link_bytes_per_cycle
    n_links = sim.topology.num_links
    eject = sim.noc.link_flits[n_links:n_links + arch.num_cores]
    per_core = total // arch.num_cores
    if not write:
        assert np.all(eject >= per_core // w)
        assert eject.sum() >= total // w
    # the busiest resource is full (the mesh is the bottleneck here) and never beyond its width
    peak = float(fl.fsc[F_PEAK_LOAD])
    assert 0.9 < peak <= 1.0 + 1e-9


def test_flow_takes_the_closed_loop_round_trip_when_its_tags_bind():
    """One DMA engine reading from one router (every channel attached there) is window-limited: its
    ``bursts / lim`` round trips of ``2 ((h + 1) S + h L) + f - 1 + RTT_OVERHEAD`` cycles."""
    base = load_arch("npusim-64c")
    arch = base.model_copy(update={"hbm": base.hbm.model_copy(update={"attach": [0] * 64})})
    core = 63  # 14 hops from router 0
    sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
    sim.add_dma(core, 64 << 10)
    sim.run()
    S, L, h, f = arch.noc.router_pipeline_cycles, arch.noc.link_latency_cycles, 14, 256 // 64
    rtt = 2 * ((h + 1) * S + h * L) + f - 1 + RTT_OVERHEAD
    bursts, lim = (64 << 10) // 256, (arch.cores.dma.max_outstanding * 64) // 256
    assert abs(sim.makespan() - bursts / lim * rtt) <= 2


def test_a_flow_that_cannot_move_is_reported_as_no_progress():
    """A memory port of zero width leaves its flows at rate 0: the engine idles with the DMA
    unfinished and says so (DeadlockError), rather than looping or finishing it."""
    arch = load_arch("npusim-64c")
    sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
    sim.mempath.fl.rcap[:] = 0.0
    sim.add_dma(5, 4096)
    with pytest.raises(DeadlockError):
        sim.run()


def test_flows_cost_fewer_events_than_streams():
    arch = load_arch("npusim-64c")
    flows, _ = _all_cores_stream(arch)
    flows.run()
    streams = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="reserve")
    size = (64 << 10) // 2 // 2
    addr = 0
    for c in range(arch.num_cores):
        for e in range(2):
            prev = ()
            for _ in range(2):
                prev = (streams.add_dma(c, size, address=addr, dma_engine=e, deps=prev),)
                addr += size
    streams.run()
    assert flows.events < streams.events / 2


def _check_sums_are_the_active_flows(fl):
    """The per-resource flow lists and sums (``rl``, ``rv``, ``A0``, ``B0``, the touched resources
    ``tl``) are the active flows' (the drained flows' entries listed, parked: rate 0, frozen, in no
    sum); returns the active flows."""
    from npusim.hw.noc.memflow import S_NTOUCH
    act = fl.act[:int(fl.sc[S_NACT])].copy()
    res = {}
    for f in act:
        for k in range(int(fl.e_n[f])):
            res.setdefault(int(fl.e_res[f, k]), []).append((int(f), float(fl.e_coef[f, k])))
    touched = set(int(x) for x in fl.tl[:int(fl.sc[S_NTOUCH])])
    assert touched == set(res)
    for l, fs in res.items():  # the live entries: the active flows'; the rest parked (drained flows')
        listed = [int(x) for x in fl.rl[fl.row[l]:fl.row[l] + fl.rn[l]]]
        live = [f for f in listed if not fl.parked[f]]
        assert int(fl.rv[l]) == len(fs) == len(live)
        assert sorted(live) == sorted(f for f, _ in fs)
        assert all(fl.rate[f] == 0.0 and fl.frozen[f] == 1 for f in listed if fl.parked[f])
        assert fl.A0[l] == pytest.approx(sum(c for _, c in fs), rel=1e-12)
        assert fl.B0[l] == pytest.approx(sum(c * fl.fcap[f] for f, c in fs), rel=1e-12)
    return act


def test_kept_lists_and_sums_match_the_active_flows_and_a_fresh_solve():
    """The per-resource flow lists and coefficient sums kept between updates (memflow: ``rl``,
    ``rn``, ``A0``, the touched resources ``tl``) describe exactly the flows active mid-run, their
    rates are those a solve from scratch gives (drained flows' entries stay listed, parked: rate 0,
    frozen, in no sum), and everything is empty again at the end but the parked entries."""
    from npusim.hw.noc.memflow import S_NTOUCH, S_PENDING
    arch = load_arch("npusim-64c")
    sim, _ = _all_cores_stream(arch, pieces=4)
    fl = sim.mempath.fl
    checked = 0
    for until in (300, 900, 2500):
        sim.run(until=until)
        if int(fl.sc[S_PENDING]) != 0 or int(fl.sc[S_NACT]) == 0:
            continue
        act = _check_sums_are_the_active_flows(fl)
        rate = np.zeros_like(fl.rate)
        ceff = fl.rcap - np.pad(sim.noc.link_holds, (0, len(fl.rcap) - len(sim.noc.link_holds)))
        # what the flows may use: the width less the messages, times the head-of-line share eta
        maxmin_rates(len(act), act, fl.e_n, fl.e_res, fl.e_coef, fl.fcap, np.maximum(ceff, 0.0) * fl.eta, rate,
                     new_scratch(len(fl.rcap), len(fl.rate), len(fl.rate) * fl.e_res.shape[1]), 1e-9)
        assert np.allclose(rate[act], fl.rate[act], rtol=1e-9, atol=0.0)
        checked += 1
    assert checked >= 2
    sim.run()
    assert int(fl.sc[S_NTOUCH]) == 0 and not fl.rv.any() and not fl.A0.any() and not fl.B0.any()
    # what stays listed is the drained flows' entries, parked for their engines' next DMAs
    for l in range(len(fl.rcap)):
        listed = [int(f) for f in fl.rl[fl.row[l]:fl.row[l] + fl.rn[l]]]
        assert all(fl.parked[f] for f in listed) and len(listed) == len(set(listed))
    for f in np.flatnonzero(fl.parked):  # each parked flow is listed where its entries say, once
        for k in range(int(fl.e_n[f])):
            l = int(fl.e_res[f, k])
            assert int(fl.rl[fl.row[l] + fl.eslot[f, k]]) == f and int(fl.rk[fl.row[l] + fl.eslot[f, k]]) == k


def test_messages_on_links_no_flow_crosses_cost_the_flows_no_update():
    """A message claiming and releasing links that no flow crosses cannot move a rate: the flows
    are not re-shared for it (the same updates and the same end as the DMA alone); one crossing
    the flow's links is (more updates)."""
    from npusim.hw.noc.memflow import S_UPDATES
    arch = load_arch("npusim-64c")

    def run(send=None):
        sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
        d = sim.add_dma(0, 256 << 10)  # core 0, a corner: its flow crosses only some of the mesh
        if send is not None:
            sim.add_send(*send, 64 << 10)
        sim.run(until_task=d)
        return sim, int(sim.mempath.fl.sc[S_UPDATES]), sim.now

    probe, alone, end = run()
    # the resources the DMA's flow crossed: the path model counted its flits there
    used = probe.noc.link_flits > 0
    n_links = probe.topology.num_links
    hops = probe.routing.hop_matrix()
    mesh_links = [(a, b) for a in range(arch.num_cores) for b in range(arch.num_cores) if hops[a, b] == 1]
    free = [(a, b) for a, b in mesh_links
            if not used[probe.noc.link_id[a, probe.noc.next_port[a, b]]] and not used[n_links + b]]
    busy = [(a, b) for a, b in mesh_links if used[probe.noc.link_id[a, probe.noc.next_port[a, b]]]]
    assert free and busy
    _, quiet, quiet_end = run(free[0])
    _, loud, _ = run(busy[0])
    assert (quiet, quiet_end) == (alone, end)
    assert loud > alone


@pytest.mark.parametrize("write", [False, True])
def test_resources_that_cannot_fill_stay_out_of_the_filling(write):
    """A resource its flows cannot fill even all at their caps takes no part in the filling: on
    all-core traffic fewer than half of the resources the flows cross are filled, with the rates a
    solve over all of them gives (checked mid-run by the kept-lists test above) and no link beyond
    its width."""
    from npusim.hw.noc.memflow import S_CROSSED, S_SOLVED_RES
    arch = load_arch("npusim-64c")
    sim, total = _all_cores_stream(arch, write=write, pieces=4)
    sim.run()
    fl = sim.mempath.fl
    assert sim.hbm_bytes_over_noc == total
    assert 0 < int(fl.sc[S_SOLVED_RES]) < int(fl.sc[S_CROSSED]) / 2
    assert float(fl.fsc[F_PEAK_LOAD]) <= 1.0 + 1e-9


def _check_kept_set(sim):
    """The kept set of resources that may fill (memflow ``mfl``) is what its definition gives on
    the kept sums and the capacities messages leave now, the touched resources' capacities
    (``ceff``) follow the messages holding them (but for claimed links whose flows all stood,
    read again at the next update), and each flow's kept entries on the set's resources (``ln``,
    ``lres``, ``lcoef``) are its entries there."""
    from npusim.hw.noc.memflow import ROOM, S_NMF, S_NSTALE, S_NTOUCH, _purge
    fl = sim.mempath.fl
    holds = np.pad(sim.noc.link_holds, (0, len(fl.rcap) - len(sim.noc.link_holds))).astype(np.float64)
    now = np.maximum(fl.rcap - holds, 0.0) * fl.eta  # eta: the links' head-of-line share (memflow)
    touched = [int(x) for x in fl.tl[:int(fl.sc[S_NTOUCH])]]
    stale = set(int(x) for x in fl.stl[:int(fl.sc[S_NSTALE])])
    for l in touched:
        if l not in stale:
            assert fl.ceff[l] == now[l]
    may_fill = {l for l in touched if fl.B0[l] > fl.ceff[l] * ROOM}
    kept = [int(x) for x in fl.mfl[:int(fl.sc[S_NMF])]]
    assert len(kept) == len(set(kept)) and set(kept) >= may_fill  # the others leave at the next filling
    _purge(fl)  # what the next filling's setup does first: then the set is exactly those that may fill
    kept = [int(x) for x in fl.mfl[:int(fl.sc[S_NMF])]]
    assert set(kept) == may_fill
    assert all(int(fl.mpos[l]) == i for i, l in enumerate(kept))
    # each active flow's entries on the kept resources (what the filling reads) are exactly those
    for f in fl.act[:int(fl.sc[S_NACT])]:
        mine = {int(fl.e_res[f, k]): float(fl.e_coef[f, k]) for k in range(int(fl.e_n[f]))
                if int(fl.e_res[f, k]) in set(kept)}
        listed = {int(fl.lres[f, m]): float(fl.lcoef[f, m]) for m in range(int(fl.ln[f]))}
        assert listed == mine and int(fl.ln[f]) == len(mine)
        for m in range(int(fl.ln[f])):
            assert int(fl.lslot[f, int(fl.lk[f, m])]) == m and int(fl.e_res[f, int(fl.lk[f, m])]) == int(fl.lres[f, m])
    return len(kept), len(touched)


@pytest.mark.parametrize("with_messages", [False, True])
def test_kept_may_fill_set_follows_flows_and_messages(with_messages):
    """The set of resources that may fill is kept as flows start and end and messages claim and
    release links (an update then reads only it, not every resource the flows cross): mid-run it
    holds every resource the definition gives on the current sums and capacities and, once purged
    (as a filling's setup does), only those; the rates are a fresh solve's, and it is empty at the
    end."""
    from npusim.hw.noc.memflow import S_NMF, S_PENDING, _purge
    arch = load_arch("npusim-64c")
    sim, _ = _all_cores_stream(arch, pieces=4)
    if with_messages:  # core-to-core messages across the middle of the mesh, where the flows run
        for c in range(0, arch.num_cores, 5):
            sim.add_send(c, arch.num_cores - 1 - c, 8 << 10)
    fl = sim.mempath.fl
    checked = 0
    for until in (200, 500, 900, 1500, 2500):
        sim.run(until=until)
        if int(fl.sc[S_NACT]) == 0:
            continue
        kept, touched = _check_kept_set(sim)
        assert 0 < kept < touched
        if int(fl.sc[S_PENDING]) == 0:
            act = fl.act[:int(fl.sc[S_NACT])].copy()
            rate = np.zeros_like(fl.rate)
            holds = np.pad(sim.noc.link_holds, (0, len(fl.rcap) - len(sim.noc.link_holds)))
            ceff = np.maximum(fl.rcap - holds, 0.0) * fl.eta  # what messages leave of each resource now, times eta
            maxmin_rates(len(act), act, fl.e_n, fl.e_res, fl.e_coef, fl.fcap, ceff, rate,
                         new_scratch(len(fl.rcap), len(fl.rate), len(fl.rate) * fl.e_res.shape[1]), 1e-9)
            assert np.allclose(rate[act], fl.rate[act], rtol=1e-9, atol=0.0)
        checked += 1
    assert checked >= 3
    sim.run()
    _purge(fl)
    assert int(fl.sc[S_NMF]) == 0 and (fl.mpos == -1).all()


def test_an_update_visits_only_the_resources_that_may_fill():
    """With the kept set, an update's setup visits the resources that may fill (and every touched
    one only while no resource has filled yet: for the peak load), far fewer than those crossed."""
    from npusim.hw.noc.memflow import S_CROSSED, S_VISITED
    arch = load_arch("npusim-64c")
    sim, total = _all_cores_stream(arch, pieces=4)
    sim.run()
    fl = sim.mempath.fl
    assert sim.hbm_bytes_over_noc == total
    assert 0 < int(fl.sc[S_VISITED]) < int(fl.sc[S_CROSSED]) / 2


def test_back_to_back_dmas_share_one_sharing_at_the_cycle_one_drains():
    """An engine's next DMA that starts the cycle its previous one's flow drained (at its cap: no
    round trip left) is shared in the same update as that drain (the drain's update defers its
    sharing to later in the cycle): one sharing fewer per such start, every byte across, and each
    DMA as long as alone (the other core's flow, window-limited too, never binds)."""
    from npusim.hw.noc.memflow import S_DEFERRED, S_FLOWS, S_GAP0, S_UPDATES
    base = load_arch("npusim-64c")
    arch = base.model_copy(update={"hbm": base.hbm.model_copy(update={"attach": [0] * 64})})
    sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
    prev, chain = (), []
    for _ in range(4):  # one engine, window-limited (its tags bind): each flow at its cap
        prev = (sim.add_dma(63, 16 << 10, deps=prev),)
        chain.append(prev[0])
    sim.add_dma(7, 256 << 10)  # another core's flow, active throughout
    sim.run()
    fl = sim.mempath.fl
    assert sim.hbm_bytes_over_noc == 4 * (16 << 10) + (256 << 10)
    assert int(fl.sc[S_FLOWS]) == 5 and int(fl.sc[S_GAP0]) == 3
    # sharings: the first start, four drains of core 63 (the last one's alone) and core 7's drain;
    # without the deferral the three next starts would be shared on their own as well
    assert int(fl.sc[S_DEFERRED]) == 4
    assert int(fl.sc[S_UPDATES]) - int(fl.sc[S_DEFERRED]) == 6
    one = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
    one.add_dma(63, 16 << 10)
    one.run()
    start, end = sim.task_times()
    assert [int(end[t] - start[t]) for t in chain] == [one.makespan()] * 4


def test_a_dma_repeating_its_engines_last_starts_on_its_entries_as_built():
    """An engine's DMA with its last DMA's parts and bytes starts on the entries that DMA left (no
    routes built, ``S_REUSED``); one that differs builds them anew. Either way each DMA takes as
    long as alone and the path model's link counters get its flits, as a DMA simulated alone."""
    from npusim.hw.noc.memflow import S_REUSED
    arch = load_arch("npusim-64c")

    def run(sizes):
        sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
        prev, chain = (), []
        for size in sizes:
            prev = (sim.add_dma(63, size, deps=prev),)
            chain.append(prev[0])
        sim.run()
        start, end = sim.task_times()
        return sim, [int(end[t] - start[t]) for t in chain]

    big, small = 32 << 10, 8 << 10
    sim, took = run([big, big, big, small, big])
    assert int(sim.mempath.fl.sc[S_REUSED]) == 2  # the 2nd and 3rd; the 5th follows the small one
    one_big, (t_big,) = run([big])
    one_small, (t_small,) = run([small])
    assert took == [t_big] * 3 + [t_small, t_big]
    assert np.array_equal(sim.noc.link_flits, 4 * one_big.noc.link_flits + one_small.noc.link_flits)
    fl, ref = sim.mempath.fl, one_big.mempath.fl
    init = 63 * sim.dma_engines
    n = int(ref.b_n[init])
    assert n > 0 and int(fl.b_n[init]) == n
    for name in ("e_res", "e_coef", "e_flits", "e_tout", "e_tin"):
        assert np.array_equal(getattr(fl, name)[init, :n], getattr(ref, name)[init, :n]), name


def _mice_sim(arch, mice: bool):
    """A simulator whose memflows run one-window DMAs as mice (``memflow.MICE``) or as flows."""
    from npusim.hw.noc import memflow
    old = memflow.MICE
    memflow.MICE = mice
    try:
        return Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
    finally:
        memflow.MICE = old


def test_a_one_burst_dma_takes_a_round_trip_as_a_mouse_and_as_a_flow():
    """A DMA of one burst has one burst in flight, not a window's worth: it lasts its round trip
    ``2 ((h + 1) S + h L) + f - 1 + RTT_OVERHEAD`` (its cap is its bytes a round trip), whether it
    runs as a mouse (no update at all) or as a flow of the filling."""
    from npusim.hw.noc.memflow import S_ALONE, S_MICE, S_UPDATES
    base = load_arch("npusim-64c")
    arch = base.model_copy(update={"hbm": base.hbm.model_copy(update={"attach": [0] * 64})})
    S, L, h, f = arch.noc.router_pipeline_cycles, arch.noc.link_latency_cycles, 14, 256 // 64
    rtt = 2 * ((h + 1) * S + h * L) + f - 1 + RTT_OVERHEAD
    for mice in (True, False):
        sim = _mice_sim(arch, mice)
        sim.add_dma(63, 256)
        sim.run()
        fl = sim.mempath.fl
        assert abs(sim.makespan() - rtt) <= 2
        assert int(fl.sc[S_MICE]) == (1 if mice else 0)
        # as a flow it starts alone (no sharing: :func:`memflow._alone`) and its drain is the one update
        assert int(fl.sc[S_UPDATES]) == (0 if mice else 1)
        assert int(fl.sc[S_ALONE]) == (0 if mice else 1)


def _per_core_streams(alone: bool, streams: str = "flow"):
    """Every core of the NpuSim study's chip (its own DRAM channel at its router) reading and writing
    its own memory on two engines, DMAs of several sizes, with ``memflow.ALONE`` as given."""
    from npusim.hw.noc import memflow
    from npusim.validate.chips import study_chip
    old = memflow.ALONE
    memflow.ALONE = alone
    try:
        sim = Simulator(study_chip(), memory_mode="analytical", noc_mode="path", memory_streams=streams)
    finally:
        memflow.ALONE = old
    total = 0
    for c in range(sim.arch.num_cores):
        prev = ()
        for i in range(3):  # one engine's chain, and another engine's DMA beside its second
            size = (8 << 10) << ((c + i) % 3)
            prev = (sim.add_dma(c, size, write=i == 1, dma_engine=0, deps=prev),)
            total += size
        if c % 2 == 0:
            sim.add_dma(c, 12 << 10, dma_engine=1, deps=prev)
            total += 12 << 10
    return sim, total


def test_flows_alone_on_their_resources_start_at_their_rate_and_match_every_start_shared():
    """With per-core DRAM a core's DMAs cross only its own ports: a flow no other live flow shares a
    resource with takes its max-min rate at its start and ends with no sharing (``memflow.ALONE``).
    The task times are those of sharing every start and end (within a cycle: the filling reaches the
    same rate by summed increments), every byte crosses, no resource beyond its width, and most starts
    and ends of this run cost no sharing."""
    from npusim.hw.noc.memflow import S_ALONE, S_ALONE_END, S_FLOWS, S_MICE, S_UPDATES
    runs = {}
    for alone in (True, False):
        sim, total = _per_core_streams(alone)
        sim.run()
        assert sim.hbm_bytes_over_noc == total
        fl = sim.mempath.fl
        assert int(fl.sc[S_NACT]) == 0 and float(fl.fsc[F_PEAK_LOAD]) <= 1.0 + 1e-9
        runs[alone] = (sim, fl)
    (fast, fl), (ref, fl_ref) = runs[True], runs[False]
    assert int(fl_ref.sc[S_ALONE]) == 0 and int(fl_ref.sc[S_ALONE_END]) == 0
    flows = int(fl.sc[S_FLOWS])
    assert flows == int(fl_ref.sc[S_FLOWS]) > 0 and int(fl.sc[S_MICE]) == int(fl_ref.sc[S_MICE])
    assert int(fl.sc[S_ALONE]) > flows // 2 and int(fl.sc[S_ALONE_END]) > 0
    assert int(fl.sc[S_UPDATES]) < int(fl_ref.sc[S_UPDATES])
    s1, e1 = fast.task_times()
    s0, e0 = ref.task_times()
    assert np.abs(np.asarray(s1) - np.asarray(s0)).max() <= 1 and np.abs(np.asarray(e1) - np.asarray(e0)).max() <= 1
    assert abs(float(fl.fsc[F_PEAK_LOAD]) - float(fl_ref.fsc[F_PEAK_LOAD])) < 1e-9


def test_a_flow_alone_does_not_wait_for_a_kept_sharing():
    """With a sharing kept for a period (``flow~256``) a flow starting alone on its resources takes its
    rate at once instead of standing at rate 0 until the period's sharing: the per-core run ends when the
    exact flows' does (every start shared), where without ``ALONE`` its starts wait (160 of them here)."""
    from npusim.hw.noc.memflow import S_ALONE, S_WAITED
    exact, _ = _per_core_streams(False, "flow")
    exact.run()
    kept, total = _per_core_streams(True, "flow~256")
    kept.run()
    waiting, _ = _per_core_streams(False, "flow~256")
    waiting.run()
    assert kept.hbm_bytes_over_noc == waiting.hbm_bytes_over_noc == total
    assert int(kept.mempath.fl.sc[S_ALONE]) > 0 and int(kept.mempath.fl.sc[S_WAITED]) == 0
    assert int(waiting.mempath.fl.sc[S_WAITED]) > 0
    assert abs(kept.makespan() - exact.makespan()) <= 1 < waiting.makespan() - exact.makespan()


@pytest.mark.parametrize("random", [False, True])
def test_mice_never_load_a_resource_beyond_its_width_and_match_the_flows(random):
    """Small DMAs on every engine of every core, with large ones beside them: the mice run where the
    flows and the other mice leave them room at their caps (their load, kept apart, never takes a
    resource beyond its width), the rest as flows; every byte crosses, and the run ends within 1%
    of running every DMA as a flow. (Random DMAs spread over every channel: each crosses a memory
    port the large ones fill, so they all run as flows.)"""
    from npusim.hw.noc.memflow import S_MICE
    arch = load_arch("npusim-64c")
    ends = {}
    for mice in (True, False):
        sim = _mice_sim(arch, mice)
        rng = np.random.default_rng(3)
        addr, total, peak = 0, 0, [0.0]
        for c in range(arch.num_cores):
            for e in range(sim.dma_engines):
                prev = ()
                for _ in range(6):
                    size = int(rng.choice([128, 512, 2048, 64 << 10]))
                    prev = (sim.add_dma(c, size, address=addr, dma_engine=e, deps=prev,
                                        pattern=PATTERN_RANDOM if random else 0),)
                    addr += size
                    total += size
        fl = sim.mempath.fl
        while True:  # stop every few hundred cycles: the mice's load against each resource's width
            out = sim.run(until=sim.now + 200)
            width = np.asarray(fl.rcap) * np.asarray(fl.eta)
            peak[0] = max(peak[0], float(np.max(np.asarray(fl.mload) / width)))
            assert np.all(np.asarray(fl.mload) <= width * (1 + 1e-9))
            if sim.engine.num_done == sim.engine.num_tasks:
                break
            assert out.reason == "time_limit"
        assert sim.hbm_bytes_over_noc == total
        assert float(fl.fsc[F_PEAK_LOAD]) <= 1.0 + 1e-9
        if not random:  # a random DMA crosses every memory port, some full of the large ones: a flow
            assert (int(fl.sc[S_MICE]) > 0) == mice and (peak[0] > 0.0) == mice
        ends[mice] = sim.makespan()
    assert abs(ends[True] / ends[False] - 1) < 0.01


def _every_engine_streams(option: str, value: int, sizes, delay=None):
    """Every DMA engine of every core reads a chain of DMAs (``sizes(core, engine)``: their bytes) at
    the path flows with ``memflow.<option>`` set to ``value`` when the simulator is made, a core's
    chains starting after ``delay(core)`` cycles (if given); checks that every byte crosses and no
    resource carried beyond its width, and returns the flows' state and the makespan."""
    from npusim.hw.noc import memflow
    arch = load_arch("npusim-64c")
    old = getattr(memflow, option)
    setattr(memflow, option, value)
    try:
        sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
    finally:
        setattr(memflow, option, old)
    addr = total = 0
    for c in range(arch.num_cores):
        d = delay(c) if delay is not None else 0
        start = (sim.add_compute(c, "vector", d),) if d > 0 else ()
        for e in range(sim.dma_engines):
            prev = start
            for size in sizes(c, e):
                prev = (sim.add_dma(c, size, address=addr, dma_engine=e, deps=prev),)
                addr += size
                total += size
    sim.run()
    fl = sim.mempath.fl
    assert sim.hbm_bytes_over_noc == total
    assert float(fl.fsc[F_PEAK_LOAD]) <= 1.0 + 1e-9
    return fl, sim.makespan()


def test_a_held_head_of_line_pass_saves_passes_moves_every_byte_and_stays_near_a_pass_every_update():
    """``memflow.HOL_PERIOD``: an update within that many cycles of the last head-of-line pass shares
    the links once on the ``eta`` that pass left. Every engine of every core streams (the mesh's
    links fill, so the coupling works): fewer passes than with a pass every update, every byte
    crosses, no resource beyond its width, and the run ends within 5% of a pass every update (the
    flows' own sensitivity to when ``eta`` is read: 2-3% on the short rows of
    ``validation/memory_flows_vs_flit.py``; serving runs move by less than 0.05%)."""
    from npusim.hw.noc.memflow import S_HOL_HELD, S_HOL_STAMP
    runs = {}
    for period in (0, 256):
        fl, end = _every_engine_streams("HOL_PERIOD", period, lambda c, e: [8 << 10] * 3)
        runs[period] = (end, int(fl.sc[S_HOL_STAMP]), int(fl.sc[S_HOL_HELD]))
    assert runs[0][2] == 0 and runs[256][2] > 0
    assert 0 < runs[256][1] < runs[0][1]
    assert abs(runs[256][0] / runs[0][0] - 1) < 0.05


def test_a_sharing_on_a_held_pass_is_remembered_only_for_that_pass():
    """With ``memflow.HOL_PERIOD``, a sharing on a held pass's ``eta`` (read in another state) is
    remembered under its state and that pass: a later sharing of the same state after another pass
    does not take it. Cores starting 0-16 cycles apart (the first pass sees few flows; session 59):
    remembered under the state alone, the held sharings spread their stale ``eta`` (this stream read
    took 15.5% less time than with a pass every update); now it stays within 8% of it (the hold's own
    error: 3.3%)."""
    rng = np.random.default_rng(1)
    delays = [int(x) for x in rng.integers(0, 17, 64)]
    ends = {}
    for period in (0, 1024):
        _, ends[period] = _every_engine_streams("HOL_PERIOD", period, lambda c, e: [16 << 10] * 4,
                                                delay=lambda c: delays[c])
    assert abs(ends[1024] / ends[0] - 1) < 0.08


def test_a_sharing_kept_for_a_period_saves_fillings_moves_every_byte_and_stays_near_a_sharing_every_change():
    """``memflow.SHARE_PERIOD``: a flow starting, or flows draining, within that many cycles of the
    last sharing wait for the next one (the new flow at rate 0, what the drained ones leave unused).
    DMAs of three sizes on every engine of every core, so starts and drains are spread: fewer
    sharings than with one at every change, starts that waited, every byte crosses, no resource
    beyond its width at any update, and the run ends no earlier (here waits and held bandwidth only slow it)
    and later by less than a period per DMA of an engine's chain (here +6%: these DMAs last a few
    hundred cycles; on serving runs the periods of ``bench_serving.py --streams flow~Q`` move the
    simulated time far less, see docs/FIDELITY.md)."""
    from npusim.hw.noc.memflow import S_UNSHARED, S_UPDATES, S_WAITED
    runs = {}
    for period in (0, 128):
        fl, end = _every_engine_streams("SHARE_PERIOD", period,
                                        lambda c, e: [(4 << 10) * (1 + (c + e + i) % 3) for i in range(4)])
        runs[period] = (end, int(fl.sc[S_UPDATES]) - int(fl.sc[S_UNSHARED]), int(fl.sc[S_WAITED]))
    assert runs[0][2] == 0 and runs[128][2] > 0
    assert 0 < runs[128][1] < runs[0][1]
    assert runs[0][0] <= runs[128][0] <= runs[0][0] + 4 * 128  # at most about a period per DMA of a chain


def test_an_engine_resuming_within_the_period_takes_its_drained_flows_rate_and_the_sums_stay_true():
    """``memflow.SHARE_PERIOD``: a flow drained within a sharing period keeps its entries in the sums
    until the next sharing (its park deferred), and its engine's next DMA on the same entries before
    then resumes the rate it drained at, with no sharing. Chains of equal DMAs on every engine: most
    starts resume, and fewer sharings than with the starts waiting; mid-run, once the deferred parks
    are done (a sharing's first step, ``_flush``) the sums are the active flows' alone; every byte
    crosses, no resource beyond its width; at the end, flushed, nothing is left in any sum."""
    from npusim.hw.noc.memflow import S_FLOWS, S_RESUMED, S_UNSHARED, S_UPDATES, _flush
    arch = load_arch("npusim-64c")

    def repeated_reads(streams):
        """Every engine of every core reads the same 8 KiB six times (its DMAs take the same routes)."""
        sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams=streams)
        addr = 0
        for c in range(arch.num_cores):
            for e in range(sim.dma_engines):
                prev = ()
                for _ in range(6):
                    prev = (sim.add_dma(c, 8 << 10, address=addr, dma_engine=e, deps=prev),)
                addr += 8 << 10
        return sim, 6 * addr

    sim, total = repeated_reads("flow~256")
    fl = sim.mempath.fl
    for until in (1500, 4000):
        sim.run(until=until)
        _flush(fl)
        _check_sums_are_the_active_flows(fl)
    sim.run()
    assert sim.hbm_bytes_over_noc == total
    assert float(fl.fsc[F_PEAK_LOAD]) <= 1.0 + 1e-9
    resumed, flows = int(fl.sc[S_RESUMED]), int(fl.sc[S_FLOWS])
    assert 0.5 * flows < resumed < flows  # (an engine's first DMA cannot resume)
    _flush(fl)
    assert not fl.rv.any() and not fl.A0.any() and not fl.B0.any()
    exact, _ = repeated_reads("flow")
    exact.run()
    sharings = int(fl.sc[S_UPDATES]) - int(fl.sc[S_UNSHARED])
    assert sharings < int(exact.mempath.fl.sc[S_UPDATES]) / 10
    # within 6% of a sharing at every change (session 62: +3.8%; the starts waiting for the sharing, +11%)
    assert abs(sim.makespan() / exact.makespan() - 1) < 0.06


def test_remembered_sharings_hit_move_every_byte_and_stay_near_solving_every_sharing():
    """``memflow.MEMO_SLOTS``: a sharing of a state seen before (the same flows, routes, caps and the
    same messages and mice on the resources they cross) takes the rates remembered for it. Every
    engine of every core reads the same DMAs twice, the second time after all of the first have
    ended, so the second phase's states are the first's: about half the sharings hit, every byte
    crosses, no resource carries beyond its width, and the run ends within 0.5% of solving every
    sharing (what may differ: a remembered sharing's head-of-line passes started from the ``eta``
    its first occurrence found)."""
    from npusim.hw.noc import memflow
    from npusim.hw.noc.memflow import S_MEMO_HITS, S_UPDATES
    arch = load_arch("npusim-64c")
    runs = {}
    for slots in (0, 1 << 12):
        old, memflow.MEMO_SLOTS = memflow.MEMO_SLOTS, slots
        try:
            sim = Simulator(arch, memory_mode="analytical", noc_mode="path", memory_streams="flow")
        finally:
            memflow.MEMO_SLOTS = old
        barrier, total = (), 0
        for _ in range(2):
            tasks, addr = [], 0
            for c in range(arch.num_cores):
                for e in range(sim.dma_engines):
                    size = (16 + 8 * ((c + e) % 3)) << 10
                    tasks.append(sim.add_dma(c, size, address=addr, dma_engine=e, deps=barrier))
                    addr += size
                    total += size
            barrier = (sim.add_compute(0, sim.units[0], 0, deps=tasks),)
        sim.run()
        fl = sim.mempath.fl
        assert sim.hbm_bytes_over_noc == total
        assert float(fl.fsc[F_PEAK_LOAD]) <= 1.0 + 1e-9
        runs[slots] = (sim.makespan(), int(fl.sc[S_MEMO_HITS]), int(fl.sc[S_UPDATES]))
    assert runs[0][1] == 0
    assert 0.3 * runs[1 << 12][2] < runs[1 << 12][1] < runs[1 << 12][2]
    assert abs(runs[1 << 12][0] / runs[0][0] - 1) < 0.005


def test_memo_key_follows_the_flows_and_the_messages_on_their_resources():
    """The memo key is kept as flows start and end and messages claim and release links: mid-run its
    flow part is the active flows' signatures summed and its load part the touched resources' mixes
    summed, a resource's mix non-zero exactly when messages or mice load it, and both parts are 0
    once every flow has ended."""
    from npusim.hw.noc.memflow import S_NTOUCH, S_PENDING
    arch = load_arch("npusim-64c")
    sim, _ = _all_cores_stream(arch, pieces=4)
    for c in range(0, arch.num_cores, 9):  # messages across the flows' links
        sim.add_send(c, (c + 27) % arch.num_cores, 16 << 10)
    fl = sim.mempath.fl
    mask = (1 << 64) - 1
    checked = 0
    for until in (200, 600, 1500, 3000):
        sim.run(until=until)
        if int(fl.sc[S_PENDING]) != 0 or int(fl.sc[S_NACT]) == 0:
            continue
        act = fl.act[:int(fl.sc[S_NACT])]
        assert int(fl.mk[0]) == sum(int(x) for x in fl.fsig[act]) & mask
        touched = fl.tl[:int(fl.sc[S_NTOUCH])]
        assert int(fl.mk[1]) == sum(int(x) for x in fl.hc[touched]) & mask
        holds = np.pad(sim.noc.link_holds, (0, len(fl.rcap) - len(sim.noc.link_holds)))
        loaded = (holds[touched] > 0) | (fl.mload[touched] > 0)
        assert np.array_equal(fl.hc[touched] != 0, loaded)
        assert not fl.hc[np.setdiff1d(np.arange(len(fl.rcap)), touched)].any()
        checked += 1
    assert checked >= 2
    sim.run()
    assert int(fl.mk[0]) == 0 and int(fl.mk[1]) == 0 and not fl.hc.any()
