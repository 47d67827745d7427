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
                                    S_UPDATES, S_VERSION, S_LISTS_STALE, LIST_MIN_ROOM)

EV_FLOW_BEGIN, EV_FLOW_UPDATE = 40, 41

DONE_BYTES = 0.5  # a transfer with less than half a byte left has finished (rates are floats)
NOT_FROZEN = 1 << 62  # freezing order of a link that has not been a bottleneck (and of the sentinel)


@njit(cache=True, _nrt=False)
def flow_start(fs, tt, heap, hs, task, now):
    """A transfer task starts: after its setup it joins the active set."""
    heap_push(heap, hs, now + tt.param[task, FP_SETUP_PS], EV_FLOW_BEGIN, task)


@njit(cache=True, _nrt=False)
def _advance(fs, now):
    """Drain every active transfer's bytes from the last update to ``now``."""
    dt = now - fs.sc[S_TLAST]
    if dt > 0:
        for i in range(fs.sc[S_NACT]):
            fs.s_rem[i] -= fs.s_rate[i] * dt
    fs.sc[S_TLAST] = now


@njit(cache=True, _nrt=False)
def _request_update(fs, heap, hs, now):
    if fs.sc[S_PENDING] == 0:
        fs.sc[S_VERSION] += 1
        fs.sc[S_PENDING] = 1
        heap_push(heap, hs, now, EV_FLOW_UPDATE, fs.sc[S_VERSION])


@njit(cache=True, _nrt=False)
def _layout_lists(fs):
    """Lay out every link's list again from the active slots, each with room for twice its count
    plus ``LIST_MIN_ROOM`` (fits: see :func:`npusim.hw.fabric.state.grow_tasks`). O(active x W^2)."""
    width = fs.s_links.shape[1]
    sentinel = fs.link_cap.shape[0]
    pos = 0
    for link in range(sentinel + 1):
        fs.lstart[link] = pos
        fs.lcap[link] = 2 * fs.lcnt[link] + LIST_MIN_ROOM
        pos += fs.lcap[link]
        fs.cnt[link] = 0
    for i in range(fs.sc[S_NACT]):
        row = fs.s_links[i]
        for k in range(width):
            link = row[k]
            if link == sentinel:
                break
            e = fs.lstart[link] + fs.cnt[link]
            fs.cnt[link] += 1
            _put_entry(fs, e, i, row)
            fs.s_pos[i, k] = e
    fs.sc[S_LISTS_STALE] = 0


@njit(cache=True, _nrt=False, inline="always")
def _put_entry(fs, e, slot, row):
    base = e * row.shape[0]
    for q in range(row.shape[0]):
        fs.lf_route[base + q] = row[q]
    fs.lf_slot[e] = slot


@njit(cache=True, _nrt=False)
def flow_begin(fs, tt, heap, hs, task, now):
    """EV_FLOW_BEGIN: the transfer's first byte may move; rates are recomputed at this instant."""
    _advance(fs, now)
    n = fs.sc[S_NACT]
    fs.act[n] = task
    fs.f_pos[task] = n
    fs.s_rem[n] = float(tt.param[task, FP_WIRE_BYTES])
    fs.s_rate[n] = 0.0
    r = tt.param[task, FP_ROUTE]
    row = fs.s_links[n]
    width = row.shape[0]
    sentinel = fs.link_cap.shape[0]
    w = 0
    full = fs.sc[S_LISTS_STALE] != 0
    for k in range(fs.route_ptr[r], fs.route_ptr[r + 1]):
        link = fs.route_link[k]
        row[w] = link
        fs.lcnt[link] += 1
        if fs.lcnt[link] > fs.lcap[link]:
            full = True
        w += 1
    for q in range(w, width):
        row[q] = sentinel
    fs.sc[S_NACT] = n + 1
    if full:
        _layout_lists(fs)
    else:
        for k in range(w):  # append to each of its links' lists
            link = row[k]
            e = fs.lstart[link] + fs.lcnt[link] - 1
            _put_entry(fs, e, n, row)
            fs.s_pos[n, k] = e
    _request_update(fs, heap, hs, now)


@njit(cache=True, _nrt=False)
def _remove_slot(fs, i):
    """Take active slot ``i`` out of its links' lists; the last slot moves into ``i``."""
    width = fs.s_links.shape[1]
    sentinel = fs.link_cap.shape[0]
    row = fs.s_links[i]
    for k in range(width):
        link = row[k]
        if link == sentinel:
            break
        p = fs.s_pos[i, k]
        q = fs.lstart[link] + fs.lcnt[link] - 1
        fs.lcnt[link] -= 1
        if p != q:  # the list's last entry fills the hole
            moved = fs.lf_slot[q]
            base_p, base_q = p * width, q * width
            for c in range(width):
                fs.lf_route[base_p + c] = fs.lf_route[base_q + c]
            fs.lf_slot[p] = moved
            mrow = fs.s_links[moved]
            for c in range(width):
                if mrow[c] == link:
                    fs.s_pos[moved, c] = p
                    break
    last = fs.sc[S_NACT] - 1
    if last != i:
        f = fs.act[last]
        fs.act[i] = f
        fs.f_pos[f] = i
        fs.s_rem[i] = fs.s_rem[last]
        fs.s_rate[i] = fs.s_rate[last]
        last_row = fs.s_links[last]
        for k in range(width):
            row[k] = last_row[k]
            if last_row[k] != sentinel:
                e = fs.s_pos[last, k]
                fs.s_pos[i, k] = e
                fs.lf_slot[e] = i
    fs.sc[S_NACT] = last


@njit(cache=True, _nrt=False)
def _waterfill(fs):
    """Max-min fair rates of the active transfers (progressive filling over the per-link lists).

    A round takes the smallest fair share ``remaining capacity / unfrozen transfers`` over the
    links still carrying unfrozen transfers, and freezes every transfer crossing a link whose share
    is within tolerance of it at that share: such links get the next numbers in a freezing order,
    and a transfer in a bottleneck's list is new unless one of its links came earlier in that order,
    so the rounds read the lists (route rows) sequentially and never touch per-transfer state; a
    transfer's rate is then the share of its earliest bottleneck. Links left with no unfrozen
    transfer leave the scan. Cost: O(active x W^2) to freeze and O(active x W) to set the rates,
    plus O(links still carrying unfrozen transfers) per round."""
    n = fs.sc[S_NACT]
    width = fs.s_links.shape[1]
    sentinel = fs.link_cap.shape[0]
    ntouch = 0
    for link in range(sentinel):
        c = fs.lcnt[link]
        if c > 0:
            fs.touched[ntouch] = link
            ntouch += 1
            fs.cnt[link] = c
            fs.remcap[link] = fs.link_cap[link]
            fs.lkey[link] = NOT_FROZEN
    fs.lkey[sentinel] = NOT_FROZEN
    lf = fs.lf_route
    nun = n
    rounds = 0
    key = 0
    nlive = ntouch
    live = fs.touched  # compacted as links drop out
    peak = fs.fsc[F_PEAK_LOAD]
    tol = 1.0 + fs.fsc[F_TOLERANCE]
    while nun > 0 and nlive > 0:
        rounds += 1
        share = math.inf
        j = 0
        while j < nlive:
            link = live[j]
            c = fs.cnt[link]
            if c == 0:  # all its transfers are frozen: its load is final
                load = 1.0 - fs.remcap[link] / fs.link_cap[link]
                if load > peak:
                    peak = load
                nlive -= 1
                live[j] = live[nlive]
                continue
            s = fs.remcap[link] / c
            fs.lsh[j] = s
            if s < share:
                share = s
            j += 1
        thr = share * tol
        nb = 0
        for j in range(nlive):
            if fs.lsh[j] <= thr:
                fs.blist[nb] = live[j]
                nb += 1
        for b in range(nb):
            link = fs.blist[b]
            fs.lkey[link] = key
            fs.lshare[link] = share
            first = fs.lstart[link]
            for p in range(first * width, (first + fs.lcnt[link]) * width, width):
                new = True
                for q in range(width):
                    if fs.lkey[lf[p + q]] < key:  # frozen at an earlier bottleneck
                        new = False
                        break
                if not new:
                    continue
                nun -= 1
                for q in range(width):
                    other = lf[p + q]
                    if other == sentinel:
                        break
                    fs.remcap[other] -= share
                    fs.cnt[other] -= 1
            key += 1
    for j in range(nlive):
        link = live[j]
        load = 1.0 - fs.remcap[link] / fs.link_cap[link]
        if load > peak:
            peak = load
    fs.fsc[F_PEAK_LOAD] = peak
    fs.sc[S_ROUNDS] += rounds
    fs.lshare[sentinel] = math.inf  # a transfer with no link is not limited
    for i in range(n):  # each transfer's rate: the share of its earliest bottleneck
        row = fs.s_links[i]
        first = sentinel
        for k in range(width):
            link = row[k]
            if fs.lkey[link] < fs.lkey[first]:
                first = link
        fs.s_rate[i] = fs.lshare[first]


@njit(cache=True, _nrt=False)
def flow_update(fs, tt, heap, hs, version, now):
    """EV_FLOW_UPDATE: finish drained transfers, recompute rates, schedule the next finish."""
    if version != fs.sc[S_VERSION]:
        return  # superseded by a later update
    fs.sc[S_PENDING] = 0
    fs.sc[S_UPDATES] += 1
    _advance(fs, now)
    if fs.sc[S_LISTS_STALE] != 0:
        _layout_lists(fs)
    quantum = fs.sc[S_QUANTUM_PS]
    sentinel = fs.link_cap.shape[0]
    width = fs.s_links.shape[1]
    i = 0
    while i < fs.sc[S_NACT]:
        rem = fs.s_rem[i]
        rate = fs.s_rate[i]
        left_ps = 0.0
        if rem >= DONE_BYTES:
            left_ps = rem / rate if rate > 0.0 else math.inf
        if left_ps <= quantum:  # done, or ends within the quantum at its current rate
            f = fs.act[i]
            wire = float(tt.param[f, FP_WIRE_BYTES])
            row = fs.s_links[i]
            for k in range(width):
                link = row[k]
                if link == sentinel:
                    break
                fs.link_bytes[link] += wire
            fs.f_done_bytes[f] = tt.param[f, FP_WIRE_BYTES]
            r = tt.param[f, FP_ROUTE]
            end = now + int(math.ceil(left_ps)) + fs.route_lat[r] + tt.param[f, FP_RETURN_PS]
            heap_push(heap, hs, end, EV_TASK_END, f)
            fs.f_pos[f] = -1
            _remove_slot(fs, i)
        else:
            i += 1
    if fs.sc[S_NACT] == 0:
        return
    _waterfill(fs)
    nxt = math.inf
    for i in range(fs.sc[S_NACT]):
        t = fs.s_rem[i] / fs.s_rate[i]
        if t < nxt:
            nxt = t
    fs.sc[S_VERSION] += 1
    heap_push(heap, hs, now + max(1, int(math.ceil(nxt))), EV_FLOW_UPDATE, fs.sc[S_VERSION])
