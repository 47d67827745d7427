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
symmetric collective whose transfers end together costs one update. The active transfers live in
contiguous slots with their routes inline, and each link keeps its list of the routes crossing it
from one update to the next (see :mod:`.state`): a transfer joining appends to its links' lists
and one leaving marks its entries dead, O(route length) each; the lists are built again from the
slots when the dead outnumber half the live entries or most transfers leave at once. An update
costs O(active transfers x route length^2) (the filling reads the bottlenecks' lists
sequentially, then each transfer takes the share of its first bottleneck) plus O(links still
carrying unfrozen transfers) per filling round. Two knobs trade exactness for speed (both off =
exact max-min; their error is measured by ``validation/fabric_fidelity.py``):

* ``quantum_ps``: completions are batched: at an update, transfers that would end within the
  next quantum at their current rates end at those exact times but give back their bandwidth
  at once (up to a quantum early), so finishing transfers cause at most one update per quantum
  (a transfer that begins still gets its rate at once);
* ``tolerance``: links whose fair share is within ``1 + tolerance`` of the smallest are filled
  in the same round (rates may fall short of max-min by that fraction, never above capacity).
"""

from __future__ import annotations

import math

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.heap import heap_push
from npusim.engine.tasks import EV_TASK_END
from npusim.hw.fabric.state import (F_PEAK_LOAD, F_TOLERANCE, FP_RETURN_PS, FP_ROUTE, FP_SETUP_PS,
                                    FP_WIRE_BYTES, LIST_BLOCK, S_BLK_FREE, S_DEAD, S_LISTS_STALE, S_LIVE,
                                    S_NACT, S_NUSED, S_PENDING, S_QUANTUM_PS, S_ROUNDS, S_TLAST,
                                    S_UPDATES, S_VERSION)

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


# -- per-link lists (see npusim.hw.fabric.state) ------------------------------------------------

@njit(cache=True, _nrt=False, inline="always")
def _list_add(fs, slot, k):
    """Append active slot ``slot`` to the list of its ``k``-th link (a new block when the tail is full)."""
    row = fs.s_links[slot]
    link = row[k]
    c = fs.llen[link]
    off = c % LIST_BLOCK
    if off == 0:
        b = fs.sc[S_BLK_FREE]
        fs.sc[S_BLK_FREE] = fs.blk_next[b]
        tail = fs.ltail[link]
        if tail < 0:
            fs.lhead[link] = b
            fs.lused[fs.sc[S_NUSED]] = link
            fs.sc[S_NUSED] += 1
        else:
            fs.blk_next[tail] = b
        fs.blk_next[b] = -1
        fs.ltail[link] = b
    e = fs.ltail[link] * LIST_BLOCK + off
    base = e * row.shape[0]
    for q in range(row.shape[0]):
        fs.lf_route[base + q] = row[q]
    fs.s_pos[slot, k] = e
    fs.llen[link] = c + 1
    fs.lcnt[link] += 1


@njit(cache=True, _nrt=False)
def _build_lists(fs):
    """Build every link's list again from the active slots: no dead entries. O(active x W^2 + lists
    in use)."""
    sentinel = fs.link_cap.shape[0]
    if fs.sc[S_LISTS_STALE] != 0:  # new arrays: every block is free, every list empty
        nb = fs.blk_next.shape[0]
        for b in range(nb):
            fs.blk_next[b] = b + 1
        fs.blk_next[nb - 1] = -1
        fs.sc[S_BLK_FREE] = 0
        for link in range(fs.lcnt.shape[0]):
            fs.lcnt[link] = 0
            fs.llen[link] = 0
            fs.lhead[link] = -1
            fs.ltail[link] = -1
    else:  # the lists in use give their blocks back
        for j in range(fs.sc[S_NUSED]):
            link = fs.lused[j]
            b = fs.lhead[link]
            while b >= 0:
                nxt = fs.blk_next[b]
                fs.blk_next[b] = fs.sc[S_BLK_FREE]
                fs.sc[S_BLK_FREE] = b
                b = nxt
            fs.lcnt[link] = 0
            fs.llen[link] = 0
            fs.lhead[link] = -1
            fs.ltail[link] = -1
    fs.sc[S_NUSED] = 0
    live = 0
    for i in range(fs.sc[S_NACT]):
        for k in range(fs.s_links.shape[1]):
            if fs.s_links[i, k] == sentinel:
                break
            _list_add(fs, i, k)
            live += 1
    fs.sc[S_LIVE] = live
    fs.sc[S_DEAD] = 0
    fs.sc[S_LISTS_STALE] = 0


@njit(cache=True, _nrt=False, inline="always")
def _lists_crowded(fs):
    """Dead entries outnumber half the live ones (plus a block): time to build the lists again."""
    return 2 * fs.sc[S_DEAD] > fs.sc[S_LIVE] + 2 * LIST_BLOCK


@njit(cache=True, _nrt=False, inline="always")  # once per transfer: inlined into the loop, no call
def flow_begin(fs, tt, heap, hs, task, now):
    """EV_FLOW_BEGIN: the transfer's first byte may move; rates are recomputed at this instant."""
    _advance(fs, now)
    n = fs.sc[S_NACT]
    fs.act[n] = task
    fs.s_rem[n] = float(tt.param[task, FP_WIRE_BYTES])
    fs.s_rate[n] = 0.0
    r = tt.param[task, FP_ROUTE]
    first = fs.route_ptr[r]
    w = fs.route_ptr[r + 1] - first
    row = fs.s_links[n]
    for k in range(row.shape[0]):
        row[k] = fs.route_link[first + k] if k < w else fs.link_cap.shape[0]  # padded with the sentinel
    fs.sc[S_NACT] = n + 1
    if fs.sc[S_LISTS_STALE] != 0 or _lists_crowded(fs):
        _build_lists(fs)
    else:
        for k in range(w):
            _list_add(fs, n, k)
        fs.sc[S_LIVE] += w
    _request_update(fs, heap, hs, now)


@njit(cache=True, _nrt=False, inline="always")
def _remove_slot(fs, i, mark):
    """Active slot ``i`` leaves (its list entries marked dead if ``mark``); the last slot moves into ``i``."""
    width = fs.s_links.shape[1]
    sentinel = fs.link_cap.shape[0]
    row = fs.s_links[i]
    if mark:
        for k in range(width):
            link = row[k]
            if link == sentinel:
                break
            fs.lf_route[fs.s_pos[i, k] * width] = sentinel + 1  # the dead mark
            fs.lcnt[link] -= 1
            fs.sc[S_LIVE] -= 1
            fs.sc[S_DEAD] += 1
    last = fs.sc[S_NACT] - 1
    if last != i:
        f = fs.act[last]
        fs.act[i] = f
        fs.s_rem[i] = fs.s_rem[last]
        fs.s_rate[i] = fs.s_rate[last]
        for k in range(width):
            row[k] = fs.s_links[last, k]
            fs.s_pos[i, k] = fs.s_pos[last, k]
    fs.sc[S_NACT] = last


# -- rates ----------------------------------------------------------------------------------------

@njit(cache=True, _nrt=False)
def _waterfill(fs):
    """Max-min fair rates of the active transfers (progressive filling over the per-link lists);
    returns the picoseconds until the first of them drains at its rate.

    A round takes the smallest fair share ``remaining capacity / unfrozen transfers`` over the
    links still carrying unfrozen transfers, and freezes every transfer crossing a link whose share
    is within tolerance of it at that share: such links get the next numbers in a freezing order,
    and a transfer in a bottleneck's list is new unless one of its links came earlier in that order
    (the dead mark counts as earliest), so the rounds read the lists (route rows) sequentially and
    never touch per-transfer state; a transfer's rate is then the share of its earliest
    bottleneck. Links left with no unfrozen transfer leave the scan. Cost: O(list entries x W) to
    freeze and O(active x W) to set the rates, plus O(links still carrying unfrozen transfers) per
    round."""
    n = fs.sc[S_NACT]
    width = fs.s_links.shape[1]
    sentinel = fs.link_cap.shape[0]
    ntouch = 0
    for j in range(fs.sc[S_NUSED]):
        link = fs.lused[j]
        c = fs.lcnt[link]
        if c > 0:
            fs.touched[ntouch] = link
            ntouch += 1
            fs.cnt[link] = c
            fs.remcap[link] = fs.link_cap[link]
            fs.lkey[link] = NOT_FROZEN
    fs.lkey[sentinel] = NOT_FROZEN
    fs.lkey[sentinel + 1] = -1  # dead entries are never new
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
            blk = fs.lhead[link]
            left = fs.llen[link]
            while left > 0:  # its list, block by block
                first = blk * LIST_BLOCK * width
                stop = first + min(left, LIST_BLOCK) * width
                for p in range(first, stop, width):
                    new = True
                    for q in range(width):
                        if fs.lkey[lf[p + q]] < key:  # frozen at an earlier bottleneck, or dead
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
                left -= LIST_BLOCK
                blk = fs.blk_next[blk]
            key += 1
    for j in range(nlive):
        link = live[j]
        load = 1.0 - fs.remcap[link] / fs.link_cap[link]
        if load > peak:
            peak = load
    fs.fsc[F_PEAK_LOAD] = peak
    fs.sc[S_ROUNDS] += rounds
    fs.lshare[sentinel] = math.inf  # a transfer with no link is not limited
    nxt = math.inf
    for i in range(n):  # each transfer's rate: the share of its earliest bottleneck
        row = fs.s_links[i]
        first = sentinel
        for k in range(width):
            link = row[k]
            if fs.lkey[link] < fs.lkey[first]:
                first = link
        rate = fs.lshare[first]
        fs.s_rate[i] = rate
        t = fs.s_rem[i] / rate
        if t < nxt:
            nxt = t
    return nxt


@njit(cache=True, _nrt=False, inline="always")
def _left_ps(fs, i):
    """Picoseconds until active slot ``i`` has drained at its current rate (0 if it has)."""
    rem = fs.s_rem[i]
    if not rem >= DONE_BYTES:
        return 0.0
    rate = fs.s_rate[i]
    return rem / rate if rate > 0.0 else math.inf


@njit(cache=True, _nrt=False)
def flow_update(fs, tt, heap, hs, version, now):
    """EV_FLOW_UPDATE: finish drained transfers, recompute rates, schedule the next finish.

    When most active transfers finish at once their list entries are not marked: the lists are
    built again from the slots that stay."""
    if version != fs.sc[S_VERSION]:
        return  # superseded by a later update
    fs.sc[S_PENDING] = 0
    fs.sc[S_UPDATES] += 1
    quantum = fs.sc[S_QUANTUM_PS]
    dt = now - fs.sc[S_TLAST]
    fs.sc[S_TLAST] = now
    ndone = 0
    for i in range(fs.sc[S_NACT]):  # drain (as _advance) and count the transfers that finish
        if dt > 0:
            fs.s_rem[i] -= fs.s_rate[i] * dt
        if _left_ps(fs, i) <= quantum:
            ndone += 1
    rebuild = fs.sc[S_LISTS_STALE] != 0 or 2 * ndone > fs.sc[S_NACT]
    sentinel = fs.link_cap.shape[0]
    width = fs.s_links.shape[1]
    i = 0
    while ndone > 0 and i < fs.sc[S_NACT]:
        left_ps = _left_ps(fs, i)
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
            _remove_slot(fs, i, not rebuild)
            ndone -= 1
        else:
            i += 1
    if rebuild or _lists_crowded(fs):
        _build_lists(fs)
    if fs.sc[S_NACT] == 0:
        return
    nxt = _waterfill(fs)
    fs.sc[S_VERSION] += 1
    heap_push(heap, hs, now + max(1, int(math.ceil(nxt))), EV_FLOW_UPDATE, fs.sc[S_VERSION])
