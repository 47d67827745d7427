"""Flow-level fabric model: concurrent transfers share links by max-min fair rates.

The congestion-aware analytical style of ASTRA-sim 2 / SimAI's flow models:

* a transfer (``KIND_FLOW`` task, parameters in :mod:`.state`) waits ``setup_ps``, then joins the
  active set; its ``wire_bytes`` drain at a rate that the fabric recomputes whenever the active
  set changes (a transfer starts or its last byte leaves);
* rates are **max-min fair** over the directed links of the routes (progressive filling: raise
  all rates together, freeze the transfers crossing a link that fills, repeat), each transfer
  also bounded by its own cap (an initiator's issue rate);
* store-and-forward-free: the last byte arrives ``route_lat`` (links + switches) after it left,
  and the task completes ``return_ps`` later (a write's acknowledgement);
* no packets, no buffers, no head-of-line blocking; bandwidth never exceeds a link's capacity
  (``fsc[F_PEAK_LOAD]`` keeps the highest load ratio any link saw; tests assert it is <= 1).

Rate updates at the same picosecond are batched (one progressive filling per instant), so a
symmetric collective whose transfers end together costs one update. An update costs
O(active transfers x route length x filling rounds). Two knobs trade exactness for speed (both
off = exact max-min; their error is measured by ``validation/fabric_fidelity.py``):

* ``quantum_ps``: completions are batched: at an update, transfers that would end within the
  next quantum at their current rates end at those exact times but give back their bandwidth
  at once (up to a quantum early), so finishing transfers cause at most one update per quantum
  (a transfer that begins still gets its rate at once);
* ``tolerance``: links whose fair share is within ``1 + tolerance`` of the smallest are filled
  in the same round (rates may fall short of max-min by that fraction, never above capacity).
"""

from __future__ import annotations

import math

from numba import njit

from npusim.engine.heap import heap_push
from npusim.engine.tasks import EV_TASK_END
from npusim.hw.fabric.state import (F_PEAK_LOAD, F_TOLERANCE, FP_RETURN_PS, FP_ROUTE, FP_SETUP_PS,
                                    FP_WIRE_BYTES, S_NACT, S_PENDING, S_QUANTUM_PS, S_ROUNDS, S_TLAST,
                                    S_UPDATES, S_VERSION)

EV_FLOW_BEGIN, EV_FLOW_UPDATE = 40, 41

DONE_BYTES = 0.5  # a transfer with less than half a byte left has finished (rates are floats)


@njit(cache=True, _nrt=False)
def flow_start(fs, tt, heap, hs, task, now):
    """A transfer task starts: after its setup it joins the active set."""
    prm = tt.param[task]
    fs.f_rem[task] = float(prm[FP_WIRE_BYTES])
    fs.f_rate[task] = 0.0
    heap_push(heap, hs, now + prm[FP_SETUP_PS], EV_FLOW_BEGIN, task)


@njit(cache=True, _nrt=False)
def _advance(fs, now):
    """Drain every active transfer's bytes from the last update to ``now``."""
    dt = now - fs.sc[S_TLAST]
    if dt > 0:
        for i in range(fs.sc[S_NACT]):
            f = fs.act[i]
            fs.f_rem[f] -= fs.f_rate[f] * dt
    fs.sc[S_TLAST] = now


@njit(cache=True, _nrt=False)
def _request_update(fs, heap, hs, now):
    if fs.sc[S_PENDING] == 0:
        fs.sc[S_VERSION] += 1
        fs.sc[S_PENDING] = 1
        heap_push(heap, hs, now, EV_FLOW_UPDATE, fs.sc[S_VERSION])


@njit(cache=True, _nrt=False)
def flow_begin(fs, tt, heap, hs, task, now):
    """EV_FLOW_BEGIN: the transfer's first byte may move; rates are recomputed at this instant."""
    _advance(fs, now)
    n = fs.sc[S_NACT]
    fs.act[n] = task
    fs.f_pos[task] = n
    fs.sc[S_NACT] = n + 1
    _request_update(fs, heap, hs, now)


@njit(cache=True, _nrt=False)
def _waterfill(fs, tt):
    """Max-min fair rates of the active transfers (progressive filling over per-link lists).

    Cost: O(active x route length) to build the lists, plus O(touched links) per round; a round
    freezes every transfer crossing a link whose fair share is the smallest (within tolerance)."""
    n = fs.sc[S_NACT]
    ntouch = 0
    for i in range(n):
        f = fs.act[i]
        fs.f_rate[f] = -1.0  # not yet frozen
        r = tt.param[f, FP_ROUTE]
        for k in range(fs.route_ptr[r], fs.route_ptr[r + 1]):
            link = fs.route_link[k]
            if fs.cnt[link] == 0:
                fs.touched[ntouch] = link
                ntouch += 1
                fs.remcap[link] = fs.link_cap[link]
            fs.cnt[link] += 1
    pos = 0
    for j in range(ntouch):  # CSR of the transfers crossing each touched link
        link = fs.touched[j]
        fs.lf_start[link] = pos
        fs.lf_fill[link] = pos
        pos += fs.cnt[link]
    for i in range(n):
        f = fs.act[i]
        r = tt.param[f, FP_ROUTE]
        for k in range(fs.route_ptr[r], fs.route_ptr[r + 1]):
            link = fs.route_link[k]
            fs.lf_flow[fs.lf_fill[link]] = f
            fs.lf_fill[link] += 1
    nun = n
    rounds = 0
    tol = 1.0 + fs.fsc[F_TOLERANCE]
    while nun > 0:
        rounds += 1
        share = math.inf
        for j in range(ntouch):
            link = fs.touched[j]
            if fs.cnt[link] > 0:
                s = fs.remcap[link] / fs.cnt[link]
                if s < share:
                    share = s
        thr = share * tol
        nb = 0
        for j in range(ntouch):
            link = fs.touched[j]
            if fs.cnt[link] > 0 and fs.remcap[link] / fs.cnt[link] <= thr:
                fs.blist[nb] = link
                nb += 1
        for b in range(nb):
            link = fs.blist[b]
            for k in range(fs.lf_start[link], fs.lf_fill[link]):
                f = fs.lf_flow[k]
                if fs.f_rate[f] >= 0.0:
                    continue
                fs.f_rate[f] = share
                nun -= 1
                r = tt.param[f, FP_ROUTE]
                for q in range(fs.route_ptr[r], fs.route_ptr[r + 1]):
                    other = fs.route_link[q]
                    fs.remcap[other] -= share
                    fs.cnt[other] -= 1
    peak = fs.fsc[F_PEAK_LOAD]
    for j in range(ntouch):
        link = fs.touched[j]
        load = 1.0 - fs.remcap[link] / fs.link_cap[link]
        if load > peak:
            peak = load
        fs.cnt[link] = 0
    fs.fsc[F_PEAK_LOAD] = peak
    fs.sc[S_ROUNDS] += rounds


@njit(cache=True, _nrt=False)
def flow_update(fs, tt, heap, hs, version, now):
    """EV_FLOW_UPDATE: finish drained transfers, recompute rates, schedule the next finish."""
    if version != fs.sc[S_VERSION]:
        return  # superseded by a later update
    fs.sc[S_PENDING] = 0
    fs.sc[S_UPDATES] += 1
    _advance(fs, now)
    quantum = fs.sc[S_QUANTUM_PS]
    i = 0
    while i < fs.sc[S_NACT]:
        f = fs.act[i]
        rem = fs.f_rem[f]
        left_ps = 0.0
        if rem >= DONE_BYTES:
            left_ps = rem / fs.f_rate[f] if fs.f_rate[f] > 0.0 else math.inf
        if left_ps <= quantum:  # done, or ends within the quantum at its current rate
            r = tt.param[f, FP_ROUTE]
            wire = float(tt.param[f, FP_WIRE_BYTES])
            for k in range(fs.route_ptr[r], fs.route_ptr[r + 1]):
                fs.link_bytes[fs.route_link[k]] += wire
            fs.f_done_bytes[f] = tt.param[f, FP_WIRE_BYTES]
            end = now + int(math.ceil(left_ps)) + fs.route_lat[r] + tt.param[f, FP_RETURN_PS]
            heap_push(heap, hs, end, EV_TASK_END, f)
            last = fs.act[fs.sc[S_NACT] - 1]
            fs.act[i] = last
            fs.f_pos[last] = i
            fs.f_pos[f] = -1
            fs.sc[S_NACT] -= 1
        else:
            i += 1
    if fs.sc[S_NACT] == 0:
        return
    _waterfill(fs, tt)
    nxt = math.inf
    for i in range(fs.sc[S_NACT]):
        f = fs.act[i]
        t = fs.f_rem[f] / fs.f_rate[f]
        if t < nxt:
            nxt = t
    fs.sc[S_VERSION] += 1
    heap_push(heap, hs, now + max(1, int(math.ceil(nxt))), EV_FLOW_UPDATE, fs.sc[S_VERSION])
