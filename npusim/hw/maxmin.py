"""Weighted max-min fair rates by progressive filling (a solver any flow model can call).

Flows ``f`` (rates ``x_f``, in any unit of throughput, e.g. bytes per cycle) load *resources*
``l`` (links, ports; capacity ``cap_l`` in the resource's own unit, e.g. flits per cycle) by a
fixed coefficient: resource ``l`` carries ``sum_f a_fl x_f``, ``a_fl`` >= 0 (e.g. the flits a byte
of flow ``f`` puts on link ``l``: one flow may load a link by several routes, or a link by less
than one unit per unit of rate). Each flow may also have its own cap ``c_f`` (an initiator's
closed-loop rate). The result is the max-min fair allocation: all unfrozen flows' rates rise
together from 0; when a resource fills, the flows crossing it freeze at that level; a flow also
freezes at its cap; repeat until every flow is frozen. Hence no resource is loaded beyond its
capacity and no flow's rate exceeds the level at which its first bottleneck filled.

Assumptions and units: coefficients and capacities are non-negative floats in consistent units
(rates x coefficients = capacity units); a flow with no resource and no cap (``inf``) gets rate
``inf``; a resource of zero capacity freezes its flows at rate 0 (the caller reports no
progress). ``tol``: resources whose fill level is within ``1 + tol`` of the lowest fill in the
same round (rates may fall short of exact max-min by that fraction, never above capacity).

Cost: O(entries) to build per-resource lists, plus O(live resources) per filling round and
O(entries of the flows frozen) in total for the freezing: O(entries + rounds x resources).

The fabric's flow model (:mod:`npusim.hw.fabric.flow`) solves the unit-coefficient case with
incremental per-link lists kept between updates (its transfers' routes change nothing between
updates, so it keeps the lists); this solver builds its lists per call, which the chip's mesh
flows need (a DMA's coefficients are per-byte shares of several routes).
"""

from __future__ import annotations

import math

import numpy as np
import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit


def new_scratch(n_resources: int, n_flows: int, max_entries: int):
    """Scratch arrays for :func:`maxmin_rates` (``n_resources`` resources, flow ids below
    ``n_flows``, up to ``max_entries`` (flow, resource) entries at once)."""
    return (np.zeros(n_resources, np.float64),  # A: coefficient sum of the unfrozen flows
            np.zeros(n_resources, np.float64),  # R: remaining capacity
            np.zeros(n_resources, np.int64),  # cnt: unfrozen flows per resource
            np.full(n_resources, -1, np.int64),  # row: start of the resource's list (-1: untouched)
            np.zeros(n_resources, np.int64),  # rlen: length of its list
            np.zeros(max(1, max_entries), np.int64),  # the lists: flow ids
            np.zeros(n_resources, np.int64),  # live resources (compacted as they drop out)
            np.zeros(n_flows, np.int64),  # frozen flag per flow id
            np.zeros(max(1, n_flows), np.int64))  # the flows frozen in a round


@njit(cache=True, _nrt=False, inline="always")
def _freeze(f, level, rate, frozen, fz, nfz):
    """Freeze flow ``f`` at ``level``; its load leaves its resources' sums after the round
    (:func:`fill`); returns the round's frozen count."""
    frozen[f] = 1
    rate[f] = level
    fz[nfz] = f
    return nfz + 1


@njit(cache=True, _nrt=False)
def maxmin_rates(nflows, flows, e_n, e_res, e_coef, fcap, rcap, rate, scratch, tol):
    """Max-min fair rates (module docstring) of the flows ``flows[:nflows]`` (flow ids); flow ``f``
    has ``e_n[f]`` entries ``(e_res[f, k], e_coef[f, k])`` (distinct resources) and cap
    ``fcap[f]``; ``rcap[l]``: capacity of resource ``l``. Writes ``rate[f]``; returns the number
    of filling rounds."""
    A, R, cnt, row, rlen, lst, live, frozen, fz = scratch
    nt = 0
    for i in range(nflows):
        f = flows[i]
        frozen[f] = 0
        for k in range(e_n[f]):
            l = e_res[f, k]
            if row[l] < 0:
                row[l] = 0
                live[nt] = l
                nt += 1
                A[l] = 0.0
                R[l] = rcap[l]
                cnt[l] = 0
            A[l] += e_coef[f, k]
            cnt[l] += 1
    start = 0
    for j in range(nt):  # each touched resource's list of the flows crossing it
        l = live[j]
        row[l] = start
        rlen[l] = 0
        start += cnt[l]
    for i in range(nflows):
        f = flows[i]
        for k in range(e_n[f]):
            l = e_res[f, k]
            lst[row[l] + rlen[l]] = f
            rlen[l] += 1
    rounds = fill(nflows, flows, e_n, e_res, e_coef, fcap, rcap, rate, A, R, cnt, row, rlen, lst, live, nt,
                  frozen, fz, tol)
    for j in range(nt):
        row[live[j]] = -1
    return rounds


@njit(cache=True, _nrt=False)
def fill(nflows, flows, e_n, e_res, e_coef, fcap, rcap, rate, A, R, cnt, row, rlen, lst, live, nt, frozen, fz,
         tol):
    """The progressive filling itself, on lists a caller built: ``live[:nt]`` the resources the
    flows cross, each with ``A[l]`` (its flows' coefficient sum), ``R[l] = rcap[l]``, ``cnt[l]``
    (its flows) and its flows ``lst[row[l] : row[l] + rlen[l]]``; ``frozen[f] = 0`` for the flows;
    ``fz``: scratch for ``nflows`` ids; a flow's entries ``e_*`` are read only to take a frozen
    flow's load off the sums, so entries on resources outside ``live[:nt]`` may be left out. Writes
    ``rate[f]``, leaves ``R[l]`` = ``rcap[l]`` less the flows' load; reorders ``live``; returns the
    number of filling rounds (:func:`maxmin_rates` builds the lists per call,
    :mod:`npusim.hw.noc.memflow` keeps them between updates).

    A round's frozen flows leave ``A`` and ``cnt`` after the round's freezing (in freezing order),
    and not at all after the last round (their sums are not read again): most updates of the chip's
    memory flows are one round, so that walk over their entries is skipped."""
    act = nflows
    level = 0.0
    rounds = 0
    nlive = nt
    while act > 0:
        rounds += 1
        best = math.inf
        j = 0
        while j < nlive:
            l = live[j]
            if cnt[l] == 0:  # every flow crossing it is frozen: out of the scan
                nlive -= 1
                live[j] = live[nlive]
                live[nlive] = l
                continue
            v = R[l] / A[l] if A[l] > 0.0 else math.inf
            if v < best:
                best = v
            j += 1
        for i in range(nflows):
            f = flows[i]
            if frozen[f] == 0 and fcap[f] - level < best:
                best = fcap[f] - level
        if best == math.inf:  # flows constrained by nothing
            for i in range(nflows):
                f = flows[i]
                if frozen[f] == 0:
                    frozen[f] = 1
                    rate[f] = math.inf
            break
        if best < 0.0:
            best = 0.0
        level += best
        slack = best * tol
        nfz = 0
        for j in range(nlive):  # fill every resource; those that filled (within tol) freeze their flows
            l = live[j]
            R[l] -= A[l] * best
            if cnt[l] > 0 and R[l] <= slack * A[l] + 1e-12 * rcap[l]:
                for q in range(row[l], row[l] + rlen[l]):
                    f = lst[q]
                    if frozen[f] == 0:
                        nfz = _freeze(f, level, rate, frozen, fz, nfz)
        for i in range(nflows):  # and the flows at their cap
            f = flows[i]
            if frozen[f] == 0 and fcap[f] <= level + slack:
                nfz = _freeze(f, level, rate, frozen, fz, nfz)
        act -= nfz
        if act > 0:  # the frozen flows' load leaves the sums the next round reads
            for i in range(nfz):
                f = fz[i]
                for k in range(e_n[f]):
                    l = e_res[f, k]
                    A[l] -= e_coef[f, k]
                    cnt[l] -= 1
    return rounds


__all__ = ["fill", "maxmin_rates", "new_scratch"]
