"""HBM/DRAM as a transaction-level model (TLM) with the four phases, plus an analytical mode.

Model (all internal times in integer picoseconds, see :mod:`npusim.hw.memory.params`):

* **Initiators** are DMA engines. A DMA task of ``bytes`` becomes a stream of
  transactions of ``transaction_bytes`` (never crossing a channel-interleave
  boundary). Each initiator has ``max_outstanding`` tags: at most that many
  transactions in flight. It follows the TLM **exclusion rule**: no new BEGIN_REQ on
  its socket before the previous request's END_REQ. A per-core DMA port limit
  (``dma.bytes_per_cycle``) spaces BEGIN_REQs; without it, one per core cycle.
* **BEGIN_REQ** reaches the channel's controller at once; if its request queue
  (``request_queue_depth``) has room it is accepted and **END_REQ** returns one tCK
  later, otherwise the initiator waits (back-pressure) until a queue entry frees.
  The request becomes visible to the scheduler ``frontend_latency_ns`` after
  BEGIN_REQ (controller/PHY path).
* **Scheduler**: FR-FCFS per channel, bank-aware: the arrived request whose column
  command can issue first (row hits, then idle banks), oldest on ties, with a
  starvation limit of 2 us; open-page policy. Per bank it tracks the open row and when ACT / column / PRE
  commands are next allowed (tRCD, tRP, tRAS, tWR); per channel the data bus
  (bursts of ``burst_length`` beats, back-to-back column commands ``tCCD`` apart)
  and read/write turnaround (tRTW read→write, tWTR write→read). All-bank refresh
  every tREFI closes all rows and blocks the channel for tRFC. The scheduler commits
  a request when the data bus is within ``tRP + tRCD + tCL`` of being free, so
  preparing a row on one bank overlaps data transfers of another.
* **BEGIN_RESP** is sent when the last burst's data has left the DRAM plus the
  frontend latency; the initiator accepts at once (**END_RESP** at the same time),
  frees the tag and may issue again. Writes are acknowledged the same way.
* Address map: channel = (addr / interleave) mod channels; within a channel,
  consecutive interleave chunks fill a row, then move to the next bank.

Analytical mode (:func:`analytical_finish`): latency + bytes / bandwidth. One event
per transfer; the initiator's rate is its port and its tags over a streaming
transaction's latency, and each spanned channel's data bus is reserved for the
transfer's share of bytes at peak rate, first come first served, so concurrent
transfers share bandwidth but see no DRAM timing, request queueing or row effects.

Not modelled: bank groups (one tCCD), tFAW/tRRD, per-bank refresh, ECC, write
buffering, NoC traversal to the channel's router (added by the NoC models).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
from numba import njit

from npusim.engine.heap import heap_push
from npusim.hw.memory.params import (
    LAT_BINS, MODE_ANALYTICAL, P_ACCEPT, P_BANKS, P_BURST_BYTES, P_BURST_PS, P_CAPACITY_BYTES,
    P_CHANNELS, P_DMA_ENGINES, P_FRONTEND, P_INTERLEAVE, P_ISSUE_GAP, P_LAT_BIN_PS, P_LOOKAHEAD, P_MAX_OUT, P_MODE,
    P_PRIVATE_CHANNELS,
    P_QDEPTH, P_ROW_BYTES, P_TCCD, P_TCK, P_TCL, P_TRAS, P_TRCD, P_TREFI, P_TRFC, P_TRP, P_TRTW,
    P_TWL, P_TWR, P_TWTR, P_TXN_BYTES,
)

# engine event types owned by this model (the kernel routes them here)
EV_MEM_END_REQ, EV_MEM_SCHED, EV_MEM_RESP, EV_MEM_ISSUE = 10, 11, 12, 13

# access patterns of a DMA task (param[4]); param[5] = stride bytes for PATTERN_STRIDED
PATTERN_LINEAR, PATTERN_RANDOM, PATTERN_STRIDED = 0, 1, 2

NEVER = np.int64(2**62)
STARVATION_PS = 2_000_000  # a request older than 2 us is served before any other
TXLOG_COLS = 6  # begin_req, end_req, begin_resp, end_resp, channel, initiator

HbmState = namedtuple(
    "HbmState",
    [
        "p",
        # channel
        "ch_q", "ch_qn", "ch_cmd_ps", "ch_data_free", "ch_last_write", "ch_refresh_next", "ch_wake",
        "ch_wait_head", "ch_wait_tail",
        "ch_bytes", "ch_busy_ps", "ch_nreq", "ch_lat_sum", "ch_lat_hist", "ch_rowstat", "ch_burst_ps", "ch_tccd_ps",
        # bank
        "bk_row", "bk_act_ok", "bk_col_ok", "bk_pre_ok",
        # initiator
        "in_task", "in_next_off", "in_end_off", "in_base", "in_write", "in_pattern", "in_stride",
        "in_outstanding", "in_left", "in_socket_busy", "in_next_issue", "in_last_end_req",
        "in_free", "in_free_top", "in_txn_count",
        # slot (transaction)
        "sl_addr", "sl_bytes", "sl_ch", "sl_bank", "sl_row", "sl_begin_req", "sl_end_req",
        "sl_arrive", "sl_wait_next", "sl_seq",
        # checks and optional log
        "counters", "txlog",
    ],
)
# counters
C_EXCLUSION_VIOLATIONS, C_PHASE_VIOLATIONS, C_TXNS, C_TXLOG_N, C_SEQ = range(5)


def new_hbm_state(p: np.ndarray, num_initiators: int, txlog_rows: int = 0) -> HbmState:
    """Fresh model state for ``num_initiators`` DMA engines (all banks closed)."""
    c, b, qd, mo = int(p[P_CHANNELS]), int(p[P_BANKS]), int(p[P_QDEPTH]), int(p[P_MAX_OUT])
    ni = num_initiators
    ns = ni * mo
    z = lambda *shape: np.zeros(shape, np.int64)  # noqa: E731
    full = lambda v, *shape: np.full(shape, v, np.int64)  # noqa: E731
    free = np.tile(np.arange(mo, dtype=np.int64), (ni, 1)) + (np.arange(ni, dtype=np.int64) * mo)[:, None]
    refresh0 = int(p[P_TREFI]) if p[P_TREFI] > 0 else int(NEVER)
    return HbmState(
        p=p.copy(),
        ch_q=full(-1, c, qd), ch_qn=z(c), ch_cmd_ps=z(c), ch_data_free=z(c), ch_last_write=full(-1, c),
        ch_refresh_next=full(refresh0, c), ch_wake=full(int(NEVER), c),
        ch_wait_head=full(-1, c), ch_wait_tail=full(-1, c),
        ch_bytes=z(c), ch_busy_ps=z(c), ch_nreq=z(c), ch_lat_sum=z(c), ch_lat_hist=z(c, LAT_BINS + 1),
        ch_rowstat=z(c, 3), ch_burst_ps=full(int(p[P_BURST_PS]), c),
        ch_tccd_ps=full(int(p[P_TCCD]), c),
        bk_row=full(-1, c, b), bk_act_ok=z(c, b), bk_col_ok=z(c, b), bk_pre_ok=z(c, b),
        in_task=full(-1, ni), in_next_off=z(ni), in_end_off=z(ni), in_base=z(ni), in_write=z(ni),
        in_pattern=z(ni), in_stride=z(ni), in_outstanding=z(ni), in_left=z(ni), in_socket_busy=z(ni),
        in_next_issue=z(ni), in_last_end_req=full(-1, ni), in_free=free, in_free_top=full(mo, ni),
        in_txn_count=z(ni),
        sl_addr=z(ns), sl_bytes=z(ns), sl_ch=z(ns), sl_bank=z(ns), sl_row=z(ns), sl_begin_req=z(ns),
        sl_end_req=z(ns), sl_arrive=z(ns), sl_wait_next=full(-1, ns), sl_seq=z(ns),
        counters=z(8), txlog=z(max(txlog_rows, 1), TXLOG_COLS),
    )


# --- time conversion -----------------------------------------------------------------

@njit(cache=True, _nrt=False, inline="always")
def to_cycle(ps, period_ps):
    """Engine cycle at which an event at ``ps`` is seen (rounded up)."""
    return np.int64(np.ceil(ps / period_ps - 1e-9))


@njit(cache=True, _nrt=False, inline="always")
def to_ps(cycle, period_ps):
    return np.int64(np.round(cycle * period_ps))


# --- address mapping -----------------------------------------------------------------

@njit(cache=True, _nrt=False, inline="always")
def _hash64(x):
    x = (x ^ (x >> 30)) * np.int64(-4658895280553007687)
    x = (x ^ (x >> 27)) * np.int64(-7723592293110705685)
    return x ^ (x >> 31)


@njit(cache=True, _nrt=False)
def map_address(p, addr):
    """(channel, bank, row) of a byte address (channels interleaved every ``interleave_bytes``)."""
    il = p[P_INTERLEAVE]
    chunk = addr // il
    ch = chunk % p[P_CHANNELS]
    local = (chunk // p[P_CHANNELS]) * il + addr % il
    row_global = local // p[P_ROW_BYTES]
    bank = row_global % p[P_BANKS]
    row = row_global // p[P_BANKS]
    return ch, bank, row


@njit(cache=True, _nrt=False, inline="always")
def _route(p, init, addr):
    """Channel, bank and row of a transaction: interleaved over all channels, or — with
    private channels (``attach: per_core``) — the initiating core's own channel, the
    address being local to it."""
    if p[P_PRIVATE_CHANNELS] == 0:
        return map_address(p, addr)
    row_global = addr // p[P_ROW_BYTES]
    return init // p[P_DMA_ENGINES], row_global % p[P_BANKS], row_global // p[P_BANKS]


# --- DMA start ---------------------------------------------------------------------------

@njit(cache=True, _nrt=False)
def hbm_start_dma(st, heap, hs, init, task, nbytes, addr, is_write, pattern, stride, now_cycle, period_ps):
    """Begin a DMA task on initiator ``init``. Returns the finish cycle if it is known now
    (analytical mode or zero bytes), else -1 (completion comes through events)."""
    p = st.p
    if nbytes <= 0:
        return now_cycle
    if p[P_MODE] == MODE_ANALYTICAL:
        return analytical_finish(st, init, addr, nbytes, pattern, stride, now_cycle, period_ps)
    st.in_task[init] = task
    st.in_base[init] = addr
    st.in_next_off[init] = 0
    st.in_end_off[init] = nbytes
    st.in_left[init] = nbytes
    st.in_write[init] = is_write
    st.in_pattern[init] = pattern
    st.in_stride[init] = stride
    st.in_txn_count[init] = 0
    _issue(st, heap, hs, init, to_ps(now_cycle, period_ps), period_ps)
    return -1


@njit(cache=True, _nrt=False)
def stream_latency_ps(p):
    """Latency of one transaction of a stream: a row hit plus the row opening
    (tRP + tRCD) amortised over the transactions that share a row, both frontends
    and the transaction's bursts."""
    txn = p[P_TXN_BYTES]
    bursts = (txn + p[P_BURST_BYTES] - 1) // p[P_BURST_BYTES]
    return p[P_TCL] + 2 * p[P_FRONTEND] + bursts * p[P_BURST_PS] + (p[P_TRP] + p[P_TRCD]) * txn // p[P_ROW_BYTES]


@njit(cache=True, _nrt=False)
def analytical_finish(st, init, addr, nbytes, pattern, stride, now_cycle, period_ps):
    """Finish cycle of a transfer in the analytical model.

    ``latency + bytes / bandwidth``: the first access's closed-row latency, then the
    bytes at the lower of the initiator's rate (port, and tags x txn / stream
    latency) and the channels' rate, where each channel's data bus is reserved
    first-come first-served for this transfer's share of bytes at the channel's
    peak bandwidth. No DRAM timing, no request queues, no row-buffer effects."""
    p = st.p
    t0 = to_ps(now_cycle, period_ps)
    first_ps = p[P_TRCD] + p[P_TCL] + 2 * p[P_FRONTEND] + p[P_BURST_PS]
    txn = p[P_TXN_BYTES]
    port_bw = min(txn / max(p[P_ISSUE_GAP], 1), p[P_MAX_OUT] * txn / stream_latency_ps(p))  # bytes/ps
    initiator_done = t0 + first_ps + nbytes / port_bw
    # share of bytes per channel
    n_ch = p[P_CHANNELS]
    il = p[P_INTERLEAVE]
    if p[P_PRIVATE_CHANNELS] != 0:
        first_ch, step, used = init // p[P_DMA_ENGINES], 0, 1
    elif pattern == PATTERN_RANDOM:
        first_ch, step, used = 0, 1, n_ch
    else:
        first_ch = (addr // il) % n_ch
        step_chunks = 1 if pattern == PATTERN_LINEAR else max(1, stride // il)
        step = step_chunks % n_ch
        g = n_ch
        a = step
        while a:
            g, a = a, g % a
        used = n_ch // g if step else 1
        if pattern == PATTERN_LINEAR:
            used = min(n_ch, (nbytes + il - 1) // il)
    base, extra = nbytes // used, nbytes % used
    channels_done = t0
    ch = first_ch
    for i in range(used):
        share = base + (1 if i < extra else 0)
        start = max(t0 + first_ps - p[P_FRONTEND], st.ch_data_free[ch])
        busy = np.int64(np.ceil(share * st.ch_burst_ps[ch] / p[P_BURST_BYTES]))
        st.ch_data_free[ch] = start + busy
        st.ch_busy_ps[ch] += busy
        st.ch_bytes[ch] += share
        channels_done = max(channels_done, start + busy + p[P_FRONTEND])
        ch = (ch + step) % n_ch
    return to_cycle(max(initiator_done, channels_done), period_ps)


# --- initiator side ----------------------------------------------------------------------

@njit(cache=True, _nrt=False)
def _txn_address(st, init):
    """Address and size of the initiator's next transaction."""
    p = st.p
    off = st.in_next_off[init]
    left = st.in_end_off[init] - off
    pat = st.in_pattern[init]
    if pat == PATTERN_LINEAR:
        addr = st.in_base[init] + off
    elif pat == PATTERN_RANDOM:
        n_txn_slots = p[P_CAPACITY_BYTES] // p[P_TXN_BYTES]
        h = _hash64(st.in_task[init] * np.int64(1000003) + st.in_txn_count[init])
        addr = (h & np.int64(0x7FFFFFFFFFFFFFFF)) % n_txn_slots * p[P_TXN_BYTES]
    else:
        addr = st.in_base[init] + st.in_txn_count[init] * st.in_stride[init]
    size = min(p[P_TXN_BYTES], left)
    to_boundary = p[P_INTERLEAVE] - addr % p[P_INTERLEAVE]
    size = min(size, to_boundary)
    return addr, size


@njit(cache=True, _nrt=False)
def _issue(st, heap, hs, init, t_ps, period_ps):
    """Issue the initiator's next transaction at ``t_ps`` if a tag, the socket and the
    port allow; otherwise arrange to be woken when the port allows."""
    p = st.p
    if st.in_task[init] < 0 or st.in_next_off[init] >= st.in_end_off[init]:
        return
    if st.in_socket_busy[init] != 0 or st.in_free_top[init] == 0:
        return
    if st.in_next_issue[init] > t_ps:
        heap_push(heap, hs, to_cycle(st.in_next_issue[init], period_ps), EV_MEM_ISSUE, init)
        st.in_socket_busy[init] = 2  # waiting for the port, counts as busy
        return
    addr, size = _txn_address(st, init)
    st.in_next_off[init] += size
    st.in_txn_count[init] += 1
    top = st.in_free_top[init] - 1
    st.in_free_top[init] = top
    slot = st.in_free[init, top]
    st.in_outstanding[init] += 1
    st.in_socket_busy[init] = 1
    st.in_next_issue[init] = t_ps + p[P_ISSUE_GAP]
    ch, bank, row = _route(p, init, addr)
    st.sl_addr[slot] = addr
    st.sl_bytes[slot] = size
    st.sl_ch[slot] = ch
    st.sl_bank[slot] = bank
    st.sl_row[slot] = row
    st.sl_begin_req[slot] = t_ps
    st.sl_end_req[slot] = -1
    st.sl_seq[slot] = st.counters[C_SEQ]
    st.counters[C_SEQ] += 1
    if st.in_last_end_req[init] > t_ps:
        st.counters[C_EXCLUSION_VIOLATIONS] += 1
    # BEGIN_REQ reaches the target now
    if st.ch_qn[ch] < p[P_QDEPTH]:
        _accept(st, heap, hs, slot, t_ps, period_ps)
    else:
        st.sl_wait_next[slot] = -1
        if st.ch_wait_tail[ch] >= 0:
            st.sl_wait_next[st.ch_wait_tail[ch]] = slot
        else:
            st.ch_wait_head[ch] = slot
        st.ch_wait_tail[ch] = slot


@njit(cache=True, _nrt=False)
def _accept(st, heap, hs, slot, t_ps, period_ps):
    """The controller takes ``slot`` into its queue at ``t_ps``; END_REQ one tCK later."""
    p = st.p
    ch = st.sl_ch[slot]
    st.ch_q[ch, st.ch_qn[ch]] = slot
    st.ch_qn[ch] += 1
    end_req = t_ps + p[P_ACCEPT]
    st.sl_end_req[slot] = end_req
    st.sl_arrive[slot] = max(st.sl_begin_req[slot] + p[P_FRONTEND], t_ps)
    heap_push(heap, hs, to_cycle(end_req, period_ps), EV_MEM_END_REQ, slot)
    _wake(st, heap, hs, ch, st.sl_arrive[slot], period_ps)


@njit(cache=True, _nrt=False)
def _wake(st, heap, hs, ch, t_ps, period_ps):
    """Make sure the channel scheduler runs at or before ``t_ps``."""
    t = max(t_ps, st.ch_cmd_ps[ch])
    if t < st.ch_wake[ch]:
        st.ch_wake[ch] = t
        heap_push(heap, hs, to_cycle(t, period_ps), EV_MEM_SCHED, ch)


# --- controller side ---------------------------------------------------------------------

@njit(cache=True, _nrt=False)
def _earliest_column(st, ch, slot):
    """When ``slot``'s first column command could issue, from its bank's state."""
    p = st.p
    bank = st.sl_bank[slot]
    open_row = st.bk_row[ch, bank]
    if open_row == st.sl_row[slot]:
        return st.bk_col_ok[ch, bank]
    if open_row < 0:
        return st.bk_act_ok[ch, bank] + p[P_TRCD]
    return max(st.bk_pre_ok[ch, bank] + p[P_TRP], st.bk_act_ok[ch, bank]) + p[P_TRCD]


@njit(cache=True, _nrt=False)
def _pick(st, ch, t_ps):
    """FR-FCFS with bank awareness: among requests arrived by ``t_ps``, the one whose
    column command can issue first (row hits and idle banks win), oldest on ties; a
    request waiting longer than ``STARVATION_PS`` is served first. -1 if none arrived."""
    best, best_col, best_seq = -1, NEVER, NEVER
    oldest, oldest_seq = -1, NEVER
    for i in range(st.ch_qn[ch]):
        slot = st.ch_q[ch, i]
        if st.sl_arrive[slot] > t_ps:
            continue
        seq = st.sl_seq[slot]
        if seq < oldest_seq:
            oldest, oldest_seq = i, seq
        col = max(t_ps, _earliest_column(st, ch, slot))
        if col < best_col or (col == best_col and seq < best_seq):
            best, best_col, best_seq = i, col, seq
    if oldest >= 0 and t_ps - st.sl_arrive[st.ch_q[ch, oldest]] > STARVATION_PS:
        return oldest
    return best


@njit(cache=True, _nrt=False)
def _refresh(st, ch, t_ps):
    """All-bank refresh due by ``t_ps``: precharge all, block the channel for tRFC.

    Refreshes that fell due while the channel was idle happened on time and cost
    nothing now; only the latest due one is placed (it may still be in progress)."""
    p = st.p
    nb = p[P_BANKS]
    missed = (t_ps - st.ch_refresh_next[ch]) // p[P_TREFI]
    due = st.ch_refresh_next[ch] + missed * p[P_TREFI]
    start = max(due, st.ch_data_free[ch])
    for b in range(nb):
        start = max(start, st.bk_pre_ok[ch, b])
    done = start + p[P_TRP] + p[P_TRFC]
    for b in range(nb):
        st.bk_row[ch, b] = -1
        st.bk_act_ok[ch, b] = max(st.bk_act_ok[ch, b], done)
    st.ch_cmd_ps[ch] = max(st.ch_cmd_ps[ch], done)
    st.ch_refresh_next[ch] = due + p[P_TREFI]


@njit(cache=True, _nrt=False)
def _serve(st, heap, hs, ch, idx, t_ps, period_ps):
    """Commit the queued request at ``idx``: issue its commands, reserve the data bus,
    schedule its response; free its queue entry (admitting a waiting request)."""
    p = st.p
    slot = st.ch_q[ch, idx]
    for i in range(idx, st.ch_qn[ch] - 1):
        st.ch_q[ch, i] = st.ch_q[ch, i + 1]
    st.ch_qn[ch] -= 1
    st.ch_q[ch, st.ch_qn[ch]] = -1

    bank, row = st.sl_bank[slot], st.sl_row[slot]
    is_write = st.in_write[slot // p[P_MAX_OUT]]
    open_row = st.bk_row[ch, bank]
    if open_row == row:
        col = max(t_ps, st.bk_col_ok[ch, bank])
        st.ch_rowstat[ch, 0] += 1
    else:
        if open_row < 0:
            act = max(t_ps, st.bk_act_ok[ch, bank])
            st.ch_rowstat[ch, 1] += 1
        else:
            pre = max(t_ps, st.bk_pre_ok[ch, bank])
            act = max(pre + p[P_TRP], st.bk_act_ok[ch, bank])
            st.ch_rowstat[ch, 2] += 1
        st.bk_row[ch, bank] = row
        st.bk_pre_ok[ch, bank] = act + p[P_TRAS]
        col = act + p[P_TRCD]
    lat = p[P_TWL] if is_write else p[P_TCL]
    last = st.ch_last_write[ch]
    if last >= 0 and last != is_write:
        # bus turnaround: read->write needs tRTW after the last read data, write->read tWTR
        col = max(col, st.ch_data_free[ch] + (p[P_TRTW] if is_write else p[P_TWTR]) - lat)
    nbursts = (st.sl_bytes[slot] + p[P_BURST_BYTES] - 1) // p[P_BURST_BYTES]
    data_end = 0
    burst_ps = st.ch_burst_ps[ch]
    for _ in range(nbursts):
        col = max(col, st.ch_data_free[ch] - lat)
        data_start = col + lat
        data_end = data_start + burst_ps
        st.ch_data_free[ch] = data_end
        st.ch_busy_ps[ch] += burst_ps
        col += st.ch_tccd_ps[ch]
    st.bk_col_ok[ch, bank] = col
    if is_write:
        st.bk_pre_ok[ch, bank] = max(st.bk_pre_ok[ch, bank], data_end + p[P_TWR])
    st.ch_last_write[ch] = is_write
    st.ch_cmd_ps[ch] = max(t_ps + p[P_TCK], st.ch_data_free[ch] - p[P_LOOKAHEAD])
    resp = data_end + p[P_FRONTEND]
    heap_push(heap, hs, to_cycle(resp, period_ps), EV_MEM_RESP, slot)
    st.sl_arrive[slot] = resp  # reused: BEGIN_RESP time
    # a queue entry is free: admit the oldest request waiting for END_REQ
    w = st.ch_wait_head[ch]
    if w >= 0:
        st.ch_wait_head[ch] = st.sl_wait_next[w]
        if st.ch_wait_head[ch] < 0:
            st.ch_wait_tail[ch] = -1
        _accept(st, heap, hs, w, t_ps, period_ps)


@njit(cache=True, _nrt=False)
def _schedule(st, heap, hs, ch, now_cycle, period_ps):
    """Run the channel scheduler at the current time; re-arm its wake-up."""
    t = to_ps(now_cycle, period_ps)
    if st.ch_wake[ch] <= t:
        st.ch_wake[ch] = NEVER
    while st.ch_qn[ch] > 0:
        t_dec = max(t, st.ch_cmd_ps[ch])
        if t_dec > t:
            _wake(st, heap, hs, ch, t_dec, period_ps)
            return
        if t >= st.ch_refresh_next[ch]:
            _refresh(st, ch, t)
            continue
        idx = _pick(st, ch, t)
        if idx < 0:
            first = NEVER
            for i in range(st.ch_qn[ch]):
                first = min(first, st.sl_arrive[st.ch_q[ch, i]])
            _wake(st, heap, hs, ch, first, period_ps)
            return
        _serve(st, heap, hs, ch, idx, t, period_ps)


@njit(cache=True, _nrt=False)
def _respond(st, heap, hs, slot, now_cycle, period_ps):
    """BEGIN_RESP and END_RESP of ``slot``; returns the DMA task finished, or -1."""
    p = st.p
    init = slot // p[P_MAX_OUT]
    ch = st.sl_ch[slot]
    begin_resp = st.sl_arrive[slot]
    end_resp = begin_resp
    latency = end_resp - st.sl_begin_req[slot]
    if not (st.sl_begin_req[slot] <= st.sl_end_req[slot] <= begin_resp <= end_resp):
        st.counters[C_PHASE_VIOLATIONS] += 1
    n = st.counters[C_TXLOG_N]
    if n < st.txlog.shape[0] and st.txlog.shape[0] > 1:
        st.txlog[n, 0] = st.sl_begin_req[slot]
        st.txlog[n, 1] = st.sl_end_req[slot]
        st.txlog[n, 2] = begin_resp
        st.txlog[n, 3] = end_resp
        st.txlog[n, 4] = ch
        st.txlog[n, 5] = init
        st.counters[C_TXLOG_N] = n + 1
    st.counters[C_TXNS] += 1
    st.ch_bytes[ch] += st.sl_bytes[slot]
    st.ch_nreq[ch] += 1
    st.ch_lat_sum[ch] += latency
    b = latency // p[P_LAT_BIN_PS]
    st.ch_lat_hist[ch, min(b, LAT_BINS)] += 1
    st.in_outstanding[init] -= 1
    st.in_left[init] -= st.sl_bytes[slot]
    st.in_free[init, st.in_free_top[init]] = slot
    st.in_free_top[init] += 1
    if st.in_left[init] == 0 and st.in_outstanding[init] == 0:
        task = st.in_task[init]
        st.in_task[init] = -1
        return task
    _issue(st, heap, hs, init, end_resp, period_ps)
    return -1


@njit(cache=True, _nrt=False)
def hbm_handle(st, heap, hs, etype, eid, now_cycle, period_ps):
    """Handle one memory event; returns the DMA task that completed, or -1."""
    if etype == EV_MEM_SCHED:
        _schedule(st, heap, hs, eid, now_cycle, period_ps)
    elif etype == EV_MEM_RESP:
        return _respond(st, heap, hs, eid, now_cycle, period_ps)
    elif etype == EV_MEM_END_REQ:
        init = eid // st.p[P_MAX_OUT]
        st.in_socket_busy[init] = 0
        st.in_last_end_req[init] = st.sl_end_req[eid]
        _issue(st, heap, hs, init, st.sl_end_req[eid], period_ps)
    elif etype == EV_MEM_ISSUE:
        st.in_socket_busy[eid] = 0
        _issue(st, heap, hs, eid, st.in_next_issue[eid], period_ps)
    return -1
