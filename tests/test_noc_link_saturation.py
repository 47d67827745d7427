"""The flit routers' saturation behaviour (``validation/noc_link_saturation.py``): one hot output fed
by backlogged inputs runs at its width whatever the number of inputs (no per-link efficiency loss),
uniform traffic through one router matches Karol et al. (1987)'s head-of-line saturation, and a
link whose traffic meets contention at the next router loses throughput that max-min sharing
would give it (head-of-line blocking across routers)."""

import pytest

from npusim.errors import ConfigError
from npusim.hw.noc import PORT_E, PORT_N, PORT_S, PORT_W, NocParams
from npusim.hw.noc.flit import saturated_throughput

W = 5
X = (2, 2)


def rid(x, y):
    return y * W + x


def mesh5(vcs=2, buf=8):
    return NocParams(width=W, height=W, vcs=vcs, buffer_flits=buf, router_stages=4)


@pytest.mark.parametrize("inputs", [("L",), ("W", "N"), ("L", "W", "E", "N")])
@pytest.mark.parametrize("packet_flits", [1, 4])
def test_one_hot_output_runs_at_its_width(inputs, packet_flits):
    x, y = X
    dst = rid(x, y + 1)
    src = {"L": rid(x, y), "W": rid(x - 1, y), "E": rid(x + 1, y), "N": rid(x, y - 1)}
    thr, ejected = saturated_throughput(mesh5(), packet_flits, [(src[d], [dst]) for d in inputs], 3000, 500)
    link = thr[rid(x, y) * 5 + PORT_S]
    assert 0.99 <= link <= 1.0  # never beyond the link's width, and no loss to contention
    assert ejected == pytest.approx(link, abs=0.01)  # every flit on the link leaves at D


def test_uniform_two_by_two_matches_karol():
    """Inputs W and E (two sources each), outputs N and S, one-flit packets, one VC: a FIFO
    input-queued 2x2 switch under uniform traffic saturates at 0.75 an output (Karol et al. 1987)."""
    x, y = X
    flows = [(s, [rid(x, y - 1), rid(x, y + 1)]) for s in (rid(x - 1, y), rid(x - 2, y), rid(x + 1, y), rid(x + 2, y))]
    thr, _ = saturated_throughput(mesh5(vcs=1), 1, flows, 8000, 1000)
    per_output = (thr[rid(x, y) * 5 + PORT_N] + thr[rid(x, y) * 5 + PORT_S]) / 2
    assert per_output == pytest.approx(0.75, abs=0.02)


def test_downstream_contention_blocks_the_upstream_link():
    """W of X sends to D, N of X beyond D, where D's east and west neighbours contend for D's south
    output: max-min gives X -> D its width (0.5 + 0.5), the flit routers much less (the N source's
    packets, held to a third of D's south output, wait in D's input VCs and block the W source's
    behind them: 2/3 since session 56's round-robin VC allocation)."""
    x, y = X
    D, D2 = rid(x, y + 1), rid(x, y + 2)
    flows = [(rid(x - 1, y), [D]), (rid(x, y - 1), [D2]), (rid(x + 1, y + 1), [D2]), (rid(x - 1, y + 1), [D2])]
    thr, _ = saturated_throughput(mesh5(), 4, flows, 4000, 1000)
    assert thr[D * 5 + PORT_S] == pytest.approx(1.0, abs=0.01)  # the downstream link saturates
    assert thr[rid(x, y) * 5 + PORT_S] == pytest.approx(2 / 3, abs=0.05)  # twice the N source's third


def _south_of_d():
    """D (below X), D2 (below D), the backlogged sources feeding D's N, E and W inputs and its own
    NI (``L``), and the output port whose flits a cycle are each link input's share into D."""
    x, y = X
    D, D2 = rid(x, y + 1), rid(x, y + 2)
    src = {"N": rid(x, y - 1), "E": rid(x + 1, y + 1), "W": rid(x - 1, y + 1), "L": D}
    into_d = {"N": rid(x, y) * 5 + PORT_S, "E": rid(x + 1, y + 1) * 5 + PORT_W, "W": rid(x - 1, y + 1) * 5 + PORT_E}
    return D, D2, src, into_d


@pytest.mark.parametrize("packet_flits", [1, 4])
@pytest.mark.parametrize("pair", [("N", "E"), ("N", "W"), ("E", "W")])
def test_two_backlogged_inputs_share_a_saturated_output_evenly(pair, packet_flits):
    """Two inputs of D, each fed by a backlogged source, all bound through D's south output: each
    gets half of it, whatever their port numbers (BookSim2's separable allocators do the same; until
    session 55 the VC allocation's port order rotated by one per visit and split it 0.8 / 0.2 or
    0.4 / 0.6 by port number)."""
    D, D2, src, into_d = _south_of_d()
    thr, _ = saturated_throughput(mesh5(), packet_flits, [(src[a], [D2]) for a in pair], 6000, 1000)
    assert thr[D * 5 + PORT_S] == pytest.approx(1.0, abs=0.01)
    for a in pair:
        assert thr[into_d[a]] == pytest.approx(0.5, abs=0.03)


@pytest.mark.parametrize("packet_flits", [1, 4])
@pytest.mark.parametrize("group", [("N", "E", "W"), ("N", "E", "L"), ("E", "W", "L"), ("N", "E", "W", "L")])
def test_backlogged_inputs_share_a_saturated_output_evenly(group, packet_flits):
    """Three or four inputs of D (its N, E, W links and its own NI, ``L``), each fed by a backlogged
    source, all bound through D's south output: each gets an equal share of it. Until session 56 the
    input ports claimed VCs in a scan order drawn per visit (a random start and direction), fair
    between two ports but not among three or more: E / W got 0.33 / 0.42 against N, and N 0.18
    against E and L at 0.41 each (the ports after the larger gaps in port order claimed first)."""
    D, D2, src, into_d = _south_of_d()
    thr, _ = saturated_throughput(mesh5(), packet_flits, [(src[a], [D2]) for a in group], 6000, 1000)
    out = thr[D * 5 + PORT_S]
    assert out == pytest.approx(1.0, abs=0.01)
    links = [a for a in group if a != "L"]
    for a in links:
        assert thr[into_d[a]] == pytest.approx(1.0 / len(group), abs=0.03)
    if "L" in group:  # the NI's share: what the links leave of the output
        assert out - sum(thr[into_d[a]] for a in links) == pytest.approx(1.0 / len(group), abs=0.03)


def test_booksim_compatible_flag_is_honoured_and_fair():
    """``saturated_throughput`` builds the BookSim2-compatible router when ``NocParams`` asks for it
    (until session 56 it built the default one whatever the flag said): three backlogged inputs of
    D bound south share what D's south link carries evenly there too, and at one-flit packets that
    is well below its width (its VC turnaround), where the default router fills it."""
    import dataclasses
    D, D2, src, into_d = _south_of_d()
    params = dataclasses.replace(mesh5(), booksim_compatible=True)
    thr, _ = saturated_throughput(params, 1, [(src[a], [D2]) for a in into_d], 6000, 1000)
    out = thr[D * 5 + PORT_S]
    assert out < 0.9
    for a in into_d:
        assert thr[into_d[a]] == pytest.approx(out / 3, abs=0.03)


def test_bad_arguments():
    with pytest.raises(ConfigError):
        saturated_throughput(mesh5(), 0, [(0, [1])], 10)
    with pytest.raises(ConfigError):
        saturated_throughput(mesh5(), 1, [(0, [W * W])], 10)
    with pytest.raises(ConfigError):
        saturated_throughput(mesh5(), 1, [(0, [])], 10)
