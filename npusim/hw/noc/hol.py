"""Head-of-line blocking at a router's input port, for flows: a link's effective capacity.

Issue 42 item 2 (session 49). Max-min flows (:mod:`npusim.hw.noc.memflow`) give a link its full
width whatever its flits do at the next router. The flit routers (:mod:`npusim.hw.noc.flit`) do
not: a link ``X -> D`` feeds input port ``p`` of router ``D``, and that port's flits leave ``D``
through different outputs ``o`` (a link, the core's ejection port, the memory port). Session 48
measured that this, not the link itself, is where the flit model loses throughput
(``validation/noc_link_saturation.py`` part E: with the flit routers' round-robin VC allocation
of session 56, 0.80 / 0.62 / 0.49 of the width when ``m`` = 1 / 2 / 3 other inputs of ``D`` contend
for the output half the link's traffic takes, each source mixing both outputs; 1.0 / 0.67 / 0.50
when one source takes each output; figures from the routers' earlier allocation orders in
docs/FIDELITY.md).

The mechanism, read off the flit router (:mod:`npusim.hw.noc.flit_kernel`): its separable switch
allocator lets input port ``p`` make **one request a cycle**, for the flit at the front of one of
its VCs (round-robin over the VCs, the pointer moving on only when a flit leaves); each output
grants one requesting input a cycle (``k`` for a memory port of ``k`` lanes), round-robin, the
pointer moving past the input it granted. A flit whose output grants another input holds the port
for that cycle: nothing else leaves ``p``. So the port, not the link, is the server, and a flit of
``p`` bound for ``o`` occupies it ``t_po = 1 + W_po`` cycles (``W_po``: cycles it waits for the
grant). The port moves at most one flit a cycle of port time, so its link can carry at most

    eta_p = lambda_p / sum_o lambda_po t_po      (flits per cycle; 1 = the link's width)

of its width, ``lambda_po`` the flits a cycle the flows send from ``p`` to ``o``
(``lambda_p = sum_o lambda_po``): at the current mix of outputs, the link's effective capacity.

The wait, derived from the two arbiters (no constant fitted to a workload):

* **Others at the output.** Input ``q`` requests ``o`` a fraction ``u_qo = min(c_q, lambda_qo t_qo)``
  of the time (each of its flits requests for ``t_qo`` cycles; ``c_q`` = 1, or the lanes of a memory
  injection, which request in parallel). A flit of ``p`` reaching the front finds, on average,
  ``N_po = max(0, sum_{q != p} u_qo - (k_o - 1)) / k_o`` others ahead of it in the round-robin
  (an output of ``k_o`` lanes grants ``k_o`` a cycle). This is the mean-field reading of
  Karol, Hluchyj and Morgan's head-of-line analysis (1987): each contender at the head is served
  once before ``p``'s flit. The others' own times solve ``t_qo = 1 + N_qo`` (a monotone fixed
  point from ``t = 1``, on the inputs of ``o`` alone).
* **What the port's VCs hide.** The round-robin pointer of ``o`` moves past ``p`` when it grants
  ``p``; when ``p``'s next flit for ``o`` comes ``g`` flits later (the port served its other VCs'
  flits for other outputs in between), the others that requested meanwhile were granted in those
  cycles and are now behind ``p``: it waits ``max(0, N_po - g)``. With two or more VCs the port
  alternates between VCs, so the next flit is the front of another VC, bound for ``o`` with
  probability ``h_po`` = the share of the port's time its fronts spend on ``o`` (``lambda_po t_po /
  sum_o' lambda_po' t_po'``); ``g`` is geometric, ``P(g) = h (1 - h)^g``, and
  ``W_po = sum_g h (1 - h)^g max(0, N_po - g)``, solved with ``t_po = 1 + W_po`` (a fixed point on
  the port's few outputs).

Assumptions and what is left out: at least 2 VCs a port (every preset has 2); a port's flits
leave in the mix the flows give them (no per-packet or per-VC state: packet length, buffer depth
and the router pipeline do not enter, and neither does waiting for a downstream VC or for credits,
so a saturated downstream link slows the port only through the others' waits at it); messages of
the path model are not among the inputs; the injection ports (NI, memory lanes) get no ``eta``.
On the micro-benchmarks of ``validation/noc_link_saturation.py`` (the flit model's own routers,
2 VCs x 8 flits; nothing here was tuned to them; the model was derived against the routers' earlier,
unfair VC-allocation orders): against the round-robin allocation of session 56 it is pessimistic
nearly everywhere. Part E, link ``X -> D`` at 0.76 / 0.55 / 0.42 of its width for ``m`` = 1 / 2 / 3
(max-min 1.0 / 0.67 / 0.5 in the mixed case) where flit gives 0.78-0.80 / 0.61-0.62 / 0.48-0.49
(mixed) and 1.0 / 0.667 / 0.500 (split: D's output shares its VCs evenly among its input *ports*, and
X -> D carries the held source's flits and as many of the other's, which the model does not have);
part B, a 2x2 switch under uniform traffic at 0.764 an output (flit 0.75-0.80, Karol 0.75), a 3x3
one whose third input is an NI at 0.80 (flit 0.66-0.72: the NI's own blocking is left out); part G
(one input carrying the link, 60-90% of it on to an output a second input wants part of: the regime
``validation/memory_flows_vs_flit.py --hol-regime`` finds the 64c GEMMs' loss in) -0.7...-7.8% at
1-flit packets. docs/FIDELITY.md ("VC allocation fair among three or more requesters") has the
tables and the two mechanisms a coupling calibrated to those routers would model (port-fair outputs,
FIFO coupling through a port).

Units: flits per cycle of the NoC clock; times in cycles. Deterministic (fixed iteration order,
fixed sweep limits).
"""

from __future__ import annotations

import math

import numpy as np
import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

#: a router's input slots: 0 the core's NI, 1..4 the link from the neighbour that port leads to
#: (:mod:`npusim.hw.noc.topology`'s PORT_N..PORT_W), 5 the memory lanes; its output slots: 0 the
#: core's ejection port, 1..4 the link of that port, 5 the memory port
NSLOT = 6
SLOT_NI, SLOT_LANES = 0, 5
SLOT_EJ, SLOT_MEM = 0, 5
#: sweeps of the fixed points (each on at most NSLOT values); they stop earlier at TOL
SWEEPS = 60
TOL = 1e-9


@njit(cache=True, _nrt=False, inline="always")
def _requests_at(lam_in, ucap, k, U, u):
    """Each input slot's requests ``u[s]`` when the output's requests total ``U`` (the fixed point of
    its own ``t_s`` at that total, see :func:`settled_requests`); returns their sum."""
    tot = 0.0
    for s in range(NSLOT):
        lam = lam_in[s]
        x = min(ucap[s], lam * max(1.0, (U + 1.0) / (k + lam))) if lam > 0.0 else 0.0
        u[s] = x
        tot += x
    return tot


@njit(cache=True, _nrt=False)
def settled_requests(lam_in, ucap, k, u):
    """The requests an output of ``k`` lanes sees from its inputs, which send it ``lam_in[s]`` flits
    a cycle (slot ``s``, ``ucap[s]``: how many requests it makes at once at most), once the inputs'
    times ``t_s = 1 + N_s`` settle: the least fixed point of ``t_s = 1 + max(0, U - u_s - (k - 1)) /
    k``, ``u_s = min(ucap_s, lam_s t_s)``, ``U = sum u_s`` (the one the sweeps from ``t = 1`` reach).
    Writes each slot's ``u[s]`` and returns their sum ``U``. The same for every input slot:
    :func:`others_from` then gives any slot's ``N`` (so a caller reuses them for each input feeding
    the output).

    Solved exactly (session 51; before, sweeps from ``t = 1`` to a tolerance, 14 on average in
    serving): at a given total ``U`` each slot's own equation has one solution, ``u_s(U) =
    min(ucap_s, lam_s max(1, (U + 1) / (k + lam_s)))`` (``t_s = 1`` until ``U + 1`` reaches ``k +
    lam_s``, then ``(U + 1) / (k + lam_s)``, until the cap), so the fixed points are the roots of
    ``h(U) = sum_s u_s(U) = U``, ``h`` piecewise linear and nondecreasing; the least is found by
    walking ``h``'s breakpoints up from ``U_0 = sum_s min(ucap_s, lam_s)`` (``h(U) >= U`` until it)."""
    x0 = 0.0
    for s in range(NSLOT):
        x0 += min(ucap[s], lam_in[s])
    g0 = _requests_at(lam_in, ucap, k, x0, u) - x0
    while g0 > 0.0:
        x1 = math.inf  # the next breakpoint of h above x0
        for s in range(NSLOT):
            lam = lam_in[s]
            if lam > 0.0:
                b = k + lam - 1.0  # where the slot's requests start to grow
                if b > x0 and b < x1:
                    x1 = b
                b = ucap[s] * (k + lam) / lam - 1.0  # where they reach the slot's cap
                if b > x0 and b < x1:
                    x1 = b
        if x1 == math.inf:  # h is constant beyond x0: the root is one step of slope -1 away
            x0 += g0
            break
        g1 = _requests_at(lam_in, ucap, k, x1, u) - x1
        if g1 <= 0.0:  # h is linear on [x0, x1]: the root is where g crosses 0
            x0 += g0 * (x1 - x0) / (g0 - g1)
            break
        x0, g0 = x1, g1
    return _requests_at(lam_in, ucap, k, x0, u)


@njit(cache=True, _nrt=False, inline="always")
def others_from(u, U, sp, k):
    """``N_po`` for input slot ``sp`` from an output's settled requests (:func:`settled_requests`)."""
    return max(0.0, U - u[sp] - (k - 1.0)) / k


@njit(cache=True)
def others_ahead(lam_in, ucap, sp, k):
    """``N_po`` (module docstring) for input slot ``sp`` at an output of ``k`` lanes whose inputs
    send it ``lam_in[s]`` flits a cycle (slot ``s``, ``ucap[s]``: how many requests it makes at
    once at most): the others' requests found ahead, after the inputs' times ``t = 1 + N`` settle
    (monotone from ``t = 1``)."""
    u = np.empty(NSLOT, np.float64)
    U = settled_requests(lam_in, ucap, k, u)
    return others_from(u, U, sp, k)


@njit(cache=True, _nrt=False, inline="always")
def _wait(n, h):
    """``sum_g h (1 - h)^g max(0, n - g)``: the wait of a flit with ``n`` others ahead when ``g``
    flits of other outputs (geometric, ``P(0) = h``) came between it and the port's last flit there."""
    w = 0.0
    pg = h
    g = 0.0
    while n - g > 0.0 and pg > 1e-12:
        w += pg * (n - g)
        g += 1.0
        pg *= 1.0 - h
    return w


@njit(cache=True, _nrt=False)
def port_eta(lam, N, n, t):
    """Effective capacity (share of the link's width) of an input port sending ``lam[j]`` flits a
    cycle to its output ``j < n``, where ``N[j]`` others are ahead (:func:`others_ahead`); writes
    each output's time a flit ``t[j]``. 1.0 if the port carries nothing. (Worked in shares
    ``lam[j] / sum(lam)``: loads as small as denormals then give the same share as any others.)"""
    tot = 0.0
    for j in range(n):
        t[j] = 1.0
        tot += lam[j]
    if tot <= 0.0:
        return 1.0
    for _ in range(SWEEPS):
        den = 0.0
        for j in range(n):
            den += lam[j] / tot * t[j]
        d = 0.0
        for j in range(n):
            h = lam[j] / tot * t[j] / den
            nt = 1.0 + _wait(N[j], h) if N[j] > 0.0 else 1.0
            d = max(d, abs(nt - t[j]))
            t[j] = nt
        if d < TOL:
            break
    den = 0.0
    for j in range(n):
        den += lam[j] / tot * t[j]
    return 1.0 / den




def mesh_flow_rates(width: int, height: int, flows, hol: bool = True, iters: int = 30, law: str = "waits"):
    """Max-min rates of ``flows`` on a ``width`` x ``height`` mesh with XY routing, every link 1
    flit a cycle, each router's NI injecting and its core's ejection port taking 1 flit a cycle
    (no memory ports), with (``hol``) or without the head-of-line coupling: each link's capacity
    its port's ``eta`` at the previous rates, ``iters`` times (what :mod:`npusim.hw.noc.memflow`
    does at each update, here from ``eta = 1``; the micro-benchmarks of
    ``validation/noc_link_saturation.py`` part E and the tests). ``flows``: ``[(cap, [(src, dst,
    share), ...]), ...]``, a flow's rate in flits a cycle, ``share`` of them on route ``src -> dst``
    (routers ``y * width + x``). Returns the rates and ``{(a, b): eta}`` of the links carrying
    flits.

    ``law="fifo-fluid"``: instead of the waits above, a candidate (session 56; here only, not in the
    simulator's flows) for the two mechanisms of the round-robin flit routers the waits lack (see
    docs/FIDELITY.md): ``eta`` of link ``X -> D`` is ``min(1, min_o G_o / a_o)``, where ``G_o`` is
    the share of ``D``'s output ``o`` the link's port gets when ``o`` is shared among ``D``'s input
    slots max-min by slot (port-fair; the other slots' demands the flows' caps there, the port's
    unbounded) and ``a_o`` the share of the link's flits bound to ``o`` when ``X``'s output shares
    the link among ``X``'s input slots the same way (each slot's flits split as its flows' caps
    split them): a port whose buffers back up passes flits only as fast as the output holding
    them drains, in the mix the upstream arbiter lets in. Fluid: no stochastic head-of-line loss
    (Karol's 0.75 of a 2x2 switch is not in it); from the caps alone, so one filling."""

    from npusim.errors import ConfigError
    from npusim.hw.maxmin import maxmin_rates, new_scratch
    if width < 1 or height < 1 or iters < 1:
        raise ConfigError(f"mesh_flow_rates: width, height, iters >= 1 (got {width}, {height}, {iters})")
    nr = width * height
    links = {}

    def res(key):
        return links.setdefault(key, len(links))

    # direction codes of a hop (slot 1..4, as a port's), the XY route
    def hop(a, b):
        dx, dy = b % width - a % width, b // width - a // width
        return {(0, -1): 1, (1, 0): 2, (0, 1): 3, (-1, 0): 4}[(dx, dy)]

    def route(a, b):
        x, y, bx, by = a % width, a // width, b % width, b // width
        p = [a]
        while x != bx:
            x += 1 if bx > x else -1
            p.append(y * width + x)
        while y != by:
            y += 1 if by > y else -1
            p.append(y * width + x)
        return p

    if law not in ("waits", "fifo-fluid"):
        raise ConfigError(f"mesh_flow_rates: law is 'waits' or 'fifo-fluid' (got {law!r})")
    # per flow: {res: coef}; {(link res, out slot): flits}; {(out res, in slot): flits};
    # {(link res, in slot at its source router, out slot at its head): flits}
    ent, tout, tin, tjoint = [], [], [], []
    for cap, routes in flows:
        e, to, ti, tj = {}, {}, {}, {}
        for src, dst, share in routes:
            if not (0 <= src < nr and 0 <= dst < nr) or share < 0:
                raise ConfigError(f"mesh_flow_rates: bad route ({src}, {dst}, {share}) on {nr} routers")
            p = route(src, dst)
            ni, ej = res(("ni", src)), res(("ej", dst))
            e[ni] = e.get(ni, 0.0) + share
            slot = SLOT_NI
            for i in range(len(p) - 1):
                lk = res(("L", p[i], p[i + 1]))
                e[lk] = e.get(lk, 0.0) + share
                ti[(lk, slot)] = ti.get((lk, slot), 0.0) + share
                ti_slot = slot
                slot = hop(p[i], p[i + 1])
                nxt = hop(p[i + 1], p[i + 2]) if i + 2 < len(p) else SLOT_EJ
                to[(lk, nxt)] = to.get((lk, nxt), 0.0) + share
                tj[(lk, ti_slot, nxt)] = tj.get((lk, ti_slot, nxt), 0.0) + share
            e[ej] = e.get(ej, 0.0) + share
            ti[(ej, slot)] = ti.get((ej, slot), 0.0) + share
        ent.append(e)
        tout.append(to)
        tin.append(ti)
        tjoint.append(tj)
    nf, nres = len(flows), len(links)
    width_e = max(1, max(len(e) for e in ent))
    e_n = np.array([len(e) for e in ent], np.int64)
    e_res = np.zeros((nf, width_e), np.int64)
    e_coef = np.zeros((nf, width_e))
    for f, e in enumerate(ent):
        for k, (r, c) in enumerate(sorted(e.items())):
            e_res[f, k], e_coef[f, k] = r, c
    fcap = np.array([float(c) for c, _ in flows])
    key = {v: k for k, v in links.items()}
    out_res = {}  # (router, out slot) -> resource
    for r in range(nres):
        k = key[r]
        if k[0] == "L":
            out_res[(k[1], hop(k[1], k[2]))] = r
        elif k[0] == "ej":
            out_res[(k[1], SLOT_EJ)] = r
    eta = np.ones(nres)
    rate = np.zeros(nf)
    ucap = np.ones(NSLOT)
    if hol and law == "fifo-fluid":
        eta = _fifo_fluid_eta(flows, tin, tjoint, key, out_res, hop, nres)
        hol = False  # one filling on it
    for _ in range(iters if hol else 1):
        rate[:] = 0.0
        maxmin_rates(nf, np.arange(nf, dtype=np.int64), e_n, e_res, e_coef, fcap, eta.copy(), rate,
                     new_scratch(nres, nf, int(e_n.sum())), 1e-12)
        if not hol:
            break
        lam_out = np.zeros((nres, NSLOT))
        lam_in = np.zeros((nres, NSLOT))
        for f in range(nf):
            for (lk, s), c in tout[f].items():
                lam_out[lk, s] += rate[f] * c
            for (o, s), c in tin[f].items():
                lam_in[o, s] += rate[f] * c
        new = np.ones(nres)
        for r in range(nres):
            k = key[r]
            if k[0] != "L" or lam_out[r].sum() <= 0.0:
                continue
            D, sp = k[2], hop(k[1], k[2])
            lam = np.zeros(NSLOT + 2)
            N = np.zeros(NSLOT + 2)
            n = 0
            for s in range(NSLOT):
                if lam_out[r, s] > 0.0:
                    lam[n] = lam_out[r, s]
                    N[n] = others_ahead(lam_in[out_res[(D, s)]], ucap, sp, 1.0)
                    n += 1
            new[r] = port_eta(lam, N, n, np.zeros(NSLOT + 2))
        eta = new
    return rate, {(k[1], k[2]): float(eta[r]) for k, r in links.items() if k[0] == "L"}


def _fill_shares(c: float, demands: dict) -> dict:
    """Max-min shares of capacity ``c`` among ``demands`` (``{key: demand}``, ``inf`` allowed)."""
    out, left = {}, c
    keys = sorted(demands, key=lambda k: demands[k])
    for i, k in enumerate(keys):
        out[k] = min(demands[k], left / (len(keys) - i))
        left -= out[k]
    return out


def _fifo_fluid_eta(flows, tin, tjoint, key, out_res, hop, nres, sweeps: int = 50):
    """``eta`` of every link by :func:`mesh_flow_rates`' ``law="fifo-fluid"`` (its docstring)."""
    demand: dict = {}  # output resource -> {input slot: the flows' caps there}
    for f, (cap, _) in enumerate(flows):
        for (o, s), c in tin[f].items():
            demand.setdefault(o, {})
            demand[o][s] = demand[o].get(s, 0.0) + cap * c
    eta = np.ones(nres)
    for r in range(nres):
        if key[r][0] != "L":
            continue
        X, D = key[r][1], key[r][2]
        sp = hop(X, D)
        slot_dem, mix = {}, {}  # X's input slots' demands on the link; their flits by D's output
        for f, (cap, _) in enumerate(flows):
            for (lk, s, o), c in tjoint[f].items():
                if lk == r:
                    slot_dem[s] = slot_dem.get(s, 0.0) + cap * c
                    mix[(s, o)] = mix.get((s, o), 0.0) + cap * c
        if not slot_dem:
            continue
        grant = {}  # the port's share of each output it uses
        for (_, o) in mix:
            others = {q: d for q, d in demand.get(out_res[(D, o)], {}).items() if q != sp}
            grant[o] = min(1.0, _fill_shares(1.0, {**others, "port": math.inf})["port"])
        e = 1.0
        for _ in range(sweeps):  # the link's mix depends on its own capacity (X's shares of it)
            y = _fill_shares(e, slot_dem)
            tot = sum(y.values())
            share = {}
            for (s, o), v in mix.items():
                share[o] = share.get(o, 0.0) + y[s] * v / slot_dem[s] / tot
            ne = min(1.0, min(grant[o] / a for o, a in share.items() if a > 0.0))
            if abs(ne - e) <= TOL:
                break
            e = ne
        eta[r] = e
    return eta


__all__ = ["NSLOT", "SLOT_EJ", "SLOT_LANES", "SLOT_MEM", "SLOT_NI", "mesh_flow_rates", "others_ahead", "others_from",
           "port_eta", "settled_requests"]
