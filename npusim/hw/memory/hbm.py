"""HBM/DRAM as a transaction-level model (TLM) with the four phases, plus an analytical mode.

Model (all internal times in integer picoseconds, see :mod:`npusim.hw.memory.params`):

* **Initiators** are DMA engines. A DMA task of ``bytes`` becomes a stream of
  transactions of ``transaction_bytes`` (never crossing a channel-interleave
  boundary). Each initiator has ``max_outstanding`` tags: at most that many
  transactions in flight. It follows the TLM **exclusion rule**: no new BEGIN_REQ on
  its socket before the previous request's END_REQ. A per-core DMA port limit
  (``dma.bytes_per_cycle``) spaces BEGIN_REQs; without it, one per core cycle.
  A random-pattern DMA reads transactions at random transaction-aligned addresses, or
  random blocks of a given size (its ``stride``), each block's transactions in order.
* **BEGIN_REQ** reaches the channel's controller at once; if its queue has room it is
  accepted and **END_REQ** returns one tCK later, otherwise the initiator waits
  (back-pressure) until an entry of its kind frees. Reads and writes share the
  ``request_queue_depth`` queue, or — with ``write_queue_depth`` > 0 — writes have
  their own write queue. With ``partitioned_queues`` (default) the entries are split
  evenly between the channel's pseudo-channels, each with its own read/write drain mode,
  as gem5's HBM controller does (``src/mem/HBMCtrl.py`` ``partitioned_q = True``;
  ``hbm_ctrl.cc``: a PC's read or write request is refused when that PC already holds
  half of the read or write buffer; write thresholds are per PC, and gem5's bus state is
  per interface, i.e. per PC): requests blocked on a refreshing PC cannot fill the
  entries of the other, which keeps working. Unpartitioned, one queue serves both PCs
  (Ramulator2's generic controller: one read and one write buffer per channel). The
  request becomes visible to the scheduler ``frontend_latency_ns`` after BEGIN_REQ
  (controller/PHY path).
* **Organisation**: a channel = one controller (queue + scheduler) over
  ``pseudo_channels`` pseudo-channels (PC); each PC has its own data bus, ``banks``
  banks in ``bank_groups`` groups, activation window and refresh. Address map:
  channel = (addr / interleave) mod channels; within a channel, interleave chunks go to
  the PCs in turn, transaction-sized blocks of a PC to its bank groups in turn, and the
  blocks of a bank group fill a row, then the next bank of the group (:func:`_split_local`).
* **Scheduler**: FR-FCFS per channel, bank-aware, one column command (one burst) at a
  time: among requests arrived by now whose PC's data bus is within the look-ahead
  horizon, the one whose next burst can issue first (row hits, then idle banks), oldest
  on ties, a transaction in progress before a new one; but a transaction's next burst
  yields to a new transaction that opens a row in another bank group and whose first
  burst it would delay (the new one can go less than one burst time after it), so under row misses (activation-bound
  traffic) bursts of different bank groups interleave and tCCD_L between one
  transaction's bursts is hidden, as a bank-group-aware controller does; a request waiting longer than 2 us is served first; open-page
  policy; a bank with a transaction in progress is not precharged for another.
  Constraints: per bank open row, tRCD (tRCDWR for writes), tRAS, tRC (ACT to ACT),
  tRP, tWR, tRTP; per bank group tCCD_L (column to column) and tRRD_L (ACT to ACT); per
  PC tCCD_S, tRRD_S, tFAW (at most four ACTs in any tFAW window; ACTs of a PC issue in
  commit order), the data bus (bursts of ``burst_length`` beats) and read/write
  turnaround (tRTW read→write, tWTR write→read). Refresh per PC (the PCs of a channel
  staggered by tREFI / pseudo_channels): all-bank (every tREFI all banks close for tRP +
  tRFC) or per-bank (every tREFI/banks the next bank, round
  robin, is closed for tRP + tRFCsb while the others keep working). A refresh that
  falls due while a transaction is in progress on its bank(s) waits for it (no new
  transaction starts there meanwhile). Refreshes that fell due while idle happened on
  time and cost nothing now. Write queue: reads are served while fewer than
  ``write_high_watermark`` writes wait (writes only when no read is waiting); from the
  high watermark, writes are drained down to ``write_low_watermark`` (per queue
  partition, its share of the watermarks); writes are
  acknowledged when their data is in the DRAM, not when buffered.
* Commands are planned ahead: the scheduler commits bursts while their PC's data bus is
  within ``tRP + tRCD + tCL`` of being free (several per decision if needed: decisions
  happen on core-clock edges, which may be slower than tCK), placing each PRE/ACT/column
  command at the earliest times the constraints allow, so preparing a row on one bank
  overlaps data transfers of another.
* **BEGIN_RESP** is sent when the last burst's data has left the DRAM plus the
  frontend latency; the initiator accepts at once (**END_RESP** at the same time),
  frees the tag and may issue again.
* **Command trace** (tests, debugging): with ``cmdlog`` rows, every command is
  recorded as ``(time_ps, command, channel, pseudo-channel, bank, row, write-queue
  occupancy of the command's queue partition, burst)`` (``burst``: index of a RD/WR within its transaction), commands ``CMD_ACT, CMD_PRE, CMD_RD, CMD_WR, CMD_REF, CMD_REFSB``
  (``bank`` -1 for an all-bank REF), in commit order (sort by time); ``CMD_WMODE`` records
  a write-queue mode switch (``row`` = 1 to writes, 0 to reads) with the occupancy then.

**L2** (the arch's ``l2`` section, at this TLM fidelity only): a shared cache between the
initiators and the channels, looked up at each transaction's BEGIN_REQ. Organisation:
``capacity_mb`` MiB of ``line_bytes`` lines in ``ways``-way sets (set = line address mod
sets), LRU per set (a global access counter stamps the ways), each line's sectors valid
separately (a sector per DMA transaction, a power of two of them, at most 32; a transaction
smaller than a sector validates the whole sector); lines interleaved over ``slices`` slices
(slice = line address mod slices), each slice a FCFS server of ``bandwidth_gbps / slices``:
a hit waits for its slice; a fill's or a write's bytes are charged to the slice's clock (they
delay later hits) but do not themselves wait for it (the HBM request goes at once: at the
presets' 7 TB/s the slice never binds); each core's read port a FCFS server of
``core_bytes_per_cycle`` (hits only). Policies:

* a read that *hits* (its line present, every sector it touches valid) is served by its slice:
  END_REQ at BEGIN_REQ (the slice queues without back-pressure; the initiator's tags bound what
  is in flight), BEGIN_RESP when its slice and its core's port have moved its bytes plus
  ``hit_latency_ns``; no HBM request. Its initiator may ask again one *hit gap* later
  (``transaction_bytes / core_bytes_per_cycle`` cycles: one engine can use its core's whole L2
  rate; without a per-core rate the DMA port's gap), not the HBM port's gap;
* a read that *misses* allocates its line (the set's LRU way, ways whose fill is in flight
  last) and marks its sectors valid at once, then goes to HBM as any request. A hit on sectors
  that the line's fill in flight brings waits for it (an MSHR merge: it responds at the later of
  its own service and the fill's BEGIN_RESP), so concurrent readers of one line cost HBM one
  read (a line tracks its latest fill only: a hit on sectors an earlier, still pending fill of the
  same line brings responds at its own service);
* *writes* are write-through (every write still goes to HBM and is acknowledged from there, as
  without an L2) and, with ``write_allocate`` (default), update or allocate their line, so data
  written by one core (the cube/vector hand-off, a KV write) hits when read back. No dirty lines:
  evictions cost nothing. Ascend's L2 is write-back (the CANN guide "Setting a Proper L2
  CacheMode": replaced data is written back to GM); write-through charges HBM when data is
  written instead of when it is evicted: the same bytes for data that leaves the L2 within the
  run, more for data that is overwritten or stays.

Not modelled: tag/lookup latency of misses, L2 bank conflicts inside a slice, replacement
policies other than LRU, prefetching, the CANN cache-mode hints (every access may allocate).
The L2 sits beside the memory controllers: at the path/flit NoC fidelities a DMA's streams
cross the mesh to the channels' attach routers whether its transactions hit or miss
(:mod:`npusim.sim.mempath`). Statistics: ``l2[:L2_NSTATS]`` (``L2_HIT_BYTES``, ...) and the
bytes each slice moved; ``ch_bytes`` counts HBM traffic only.

Analytical mode (:func:`analytical_finish`): latency + bytes / bandwidth. One event
per transfer; the initiator's rate is its port and its tags over a streaming
transaction's latency, and each spanned channel's data bus is reserved for the
transfer's share of bytes at its rate after all-bank refresh (:func:`refresh_keep`: the
fraction ``1 - (tRP + tRFC) / tREFI`` of the time a pseudo-channel is not refreshing, as the
TLM's refresh takes it and :mod:`npusim.hw.memory.bounds`' stream bound counts it; per-bank
refresh keeps the bus), first come first served, so concurrent transfers share bandwidth but
see no other DRAM timing, request queueing or row effects. The refresh term (session 46,
issue 39): the vendor's read-only DataCopy benchmark (asc-devkit ``data_copy`` sample, GM -> UB
over 48 AIVs of an Atlas A2/A3, 2 KB runs) streams 302 MB in 202.7 us of MTE2 time, 1.49 TB/s,
the preset's refresh-bound data bus (1.49 TB/s on the 910C die, 1.52 on the 910B), where the
analytical fidelity streamed at the full 1.6 TB/s; the long-run average is used for every
transfer (the pseudo-channels' refreshes are staggered, so a transfer spanning many of them
sees about that fraction however short).

Not modelled: command-bus occupancy (HBM's separate row and column command buses are
assumed never to be the bottleneck), ECC, power-down, refresh management (RFM), NoC traversal to the channel's router
(added by the NoC models).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.eventlist import event_push
from npusim.hw.memory.params import (
    LAT_BINS, MODE_ANALYTICAL, P_ACCEPT, P_BANK_GROUPS, P_BANKS, P_BURST_BYTES, P_BURST_PS, P_CAPACITY_BYTES,
    P_CHANNELS, P_DMA_ENGINES, P_FRONTEND, P_INTERLEAVE, P_ISSUE_GAP, P_LAT_BIN_PS, P_LOOKAHEAD, P_MAX_OUT, P_MODE,
    P_PCS, P_PRIVATE_CHANNELS, P_QDEPTH, P_QPARTS, P_REFRESH_PER_BANK, P_ROW_BYTES, P_TCCD, P_TCCD_L, P_TCK, P_TCL, P_TFAW,
    P_TRAS, P_TRC, P_TRCD, P_TRCDWR, P_TREFI, P_TRFC, P_TRFCSB, P_TRP, P_TRRD_L, P_TRRD_S, P_TRTP, P_TRTW,
    P_TWL, P_TWR, P_TWTR, P_TXN_BYTES, P_WQ_DEPTH, P_WQ_HIGH, P_WQ_LOW,
    L2_FIX, P_L2_CORE_PSF, P_L2_HIT_GAP, P_L2_HIT_PS, P_L2_LINE, P_L2_ON, P_L2_SECTOR, P_L2_SETS, P_L2_SLICE_PSF,
    P_L2_SLICES, P_L2_WALLOC, P_L2_WAYS,
)

# engine event types owned by this model (the kernel routes them here)
EV_MEM_END_REQ, EV_MEM_SCHED, EV_MEM_RESP, EV_MEM_ISSUE = 10, 11, 12, 13

# access patterns of a DMA task (param[4]); param[5] = stride bytes for PATTERN_STRIDED, for
# PATTERN_RANDOM the random block size (0 or <= transaction_bytes: every transaction at its own
# random transaction-aligned address; larger: random block-aligned blocks of that many bytes,
# each read as consecutive transactions)
PATTERN_LINEAR, PATTERN_RANDOM, PATTERN_STRIDED = 0, 1, 2

# commands in the command trace
CMD_ACT, CMD_PRE, CMD_RD, CMD_WR, CMD_REF, CMD_REFSB, CMD_WMODE = range(7)
CMD_NAMES = ("ACT", "PRE", "RD", "WR", "REF", "REFsb", "WMODE")
CMDLOG_COLS = 8  # time_ps, command, channel, pseudo-channel, bank, row, write-queue occupancy, burst index

NEVER = np.int64(2**62)
LONG_AGO = np.int64(-(2**60))
STARVATION_PS = 2_000_000  # a request older than 2 us is served before any other
TXLOG_COLS = 6  # begin_req, end_req, begin_resp, end_resp, channel, initiator

HbmState = namedtuple(
    "HbmState",
    [
        "p",
        # channel (controller)
        "ch_q", "ch_qn", "ch_cmd_ps", "ch_wake", "ch_data_free",
        "ch_wait_head", "ch_wait_tail",
        "ch_bytes", "ch_busy_ps", "ch_nreq", "ch_lat_sum", "ch_lat_hist", "ch_rowstat",
        # queue partition ("group": the channel, or with partitioned queues its pseudo-channel's
        # unit): entries, writes among them, read/write drain mode
        "g_qn", "g_nw", "g_wmode",
        # pseudo-channel ("unit" = channel * pseudo_channels + pc)
        "u_data_free", "u_last_write", "u_refresh_next", "u_ref_pending", "u_refsb_next", "u_refsb_bank",
        "u_last_act", "u_faw", "u_faw_i", "u_last_col", "u_bg_last_act", "u_bg_last_col",
        "u_burst_ps", "u_tccd_ps", "u_tccdl_ps",
        # bank
        "bk_row", "bk_act_ok", "bk_col_ok", "bk_pre_ok", "bk_inflight",
        # initiator
        "in_task", "in_next_off", "in_end_off", "in_base", "in_write", "in_pattern", "in_stride",
        "in_outstanding", "in_left", "in_socket_busy", "in_next_issue", "in_last_end_req",
        "in_free", "in_free_top", "in_txn_count",
        # slot (transaction)
        "sl_addr", "sl_bytes", "sl_ch", "sl_unit", "sl_bank", "sl_row", "sl_begin_req", "sl_end_req",
        "sl_arrive", "sl_wait_next", "sl_seq", "sl_bursts_left", "sl_started", "sl_write", "sl_bg",
        # checks and optional logs
        "counters", "txlog", "cmdlog",
        # the L2 (TLM, see "L2" in the module docstring), one array (each array of the state costs
        # every call that takes the whole state): statistics; per slice its clock and bytes moved;
        # per core its read port's clock; per line (tag, LRU stamp, valid sectors, the slot whose
        # fill is in flight or -1); per slot (hit, line, head of the hits waiting for its fill,
        # next waiter)
        "l2",
    ],
)
# counters
C_EXCLUSION_VIOLATIONS, C_PHASE_VIOLATIONS, C_TXNS, C_TXLOG_N, C_SEQ, C_CMDLOG_N = range(6)
# L2 statistics (``l2[:L2_NSTATS]``): bytes read that hit / missed, bytes written, read
# transactions that hit / missed, hits that waited for a fill in flight, lines evicted, the LRU clock
(L2_HIT_BYTES, L2_MISS_BYTES, L2_WRITE_BYTES, L2_HITS, L2_MISSES, L2_MERGED, L2_EVICTIONS,
 L2_CLOCK, L2_LINES_AT, L2_SLOTS_AT) = range(10)  # the last two: where the line and slot records start
L2_NSTATS = 16
L2_TAG, L2_LRU, L2_VALID, L2_FILL = range(4)  # fields of a line's record (4 int64)
SL_MASK, SL_WAY, SL_WAITERS, SL_NEXT = range(4)  # fields of a slot's record (4 int64); SL_MASK: a fill's sectors


def new_hbm_state(p: np.ndarray, num_initiators: int, txlog_rows: int = 0, cmdlog_rows: int = 0) -> HbmState:
    """Fresh model state for ``num_initiators`` DMA engines (all banks closed).

    ``txlog_rows`` / ``cmdlog_rows``: capacity of the transaction log and the command trace
    (0 = off; a full log stops recording)."""
    c, b, qd, mo = int(p[P_CHANNELS]), int(p[P_BANKS]), int(p[P_QDEPTH]), int(p[P_MAX_OUT])
    npc, nbg = int(p[P_PCS]), int(p[P_BANK_GROUPS])
    u = c * npc
    qcap = qd + int(p[P_WQ_DEPTH])
    ni = num_initiators
    ns = ni * mo
    z = lambda *shape: np.zeros(shape, np.int64)  # noqa: E731
    full = lambda v, *shape: np.full(shape, v, np.int64)  # noqa: E731
    free = np.tile(np.arange(mo, dtype=np.int64), (ni, 1)) + (np.arange(ni, dtype=np.int64) * mo)[:, None]
    # the pseudo-channels of a channel refresh staggered by tREFI / pseudo_channels
    stagger = np.tile(np.arange(npc, dtype=np.int64), c)
    refi, interval = int(p[P_TREFI]), int(p[P_TREFI]) // b
    refresh0 = refi + stagger * refi // npc if refi > 0 and not p[P_REFRESH_PER_BANK] else full(int(NEVER), u)
    refsb0 = interval + stagger * interval // npc if refi > 0 and p[P_REFRESH_PER_BANK] else full(int(NEVER), u)
    return HbmState(
        p=p.copy(),
        ch_q=full(-1, c, qcap), ch_qn=z(c), ch_cmd_ps=z(c), ch_wake=full(int(NEVER), c),
        ch_data_free=z(c),
        ch_wait_head=full(-1, c), ch_wait_tail=full(-1, c),
        ch_bytes=z(c), ch_busy_ps=z(c), ch_nreq=z(c), ch_lat_sum=z(c), ch_lat_hist=z(c, LAT_BINS + 1),
        ch_rowstat=z(c, 3),
        g_qn=z(u), g_nw=z(u), g_wmode=z(u),
        u_data_free=z(u), u_last_write=full(-1, u), u_refresh_next=refresh0, u_ref_pending=full(-1, u),
        u_refsb_next=refsb0, u_refsb_bank=z(u),
        u_last_act=full(int(LONG_AGO), u), u_faw=full(int(LONG_AGO), u, 4), u_faw_i=z(u),
        u_last_col=full(int(LONG_AGO), u), u_bg_last_act=full(int(LONG_AGO), u, nbg),
        u_bg_last_col=full(int(LONG_AGO), u, nbg),
        u_burst_ps=full(int(p[P_BURST_PS]), u), u_tccd_ps=full(int(p[P_TCCD]), u),
        u_tccdl_ps=full(int(p[P_TCCD_L]), u),
        bk_row=full(-1, u, b), bk_act_ok=z(u, b), bk_col_ok=z(u, b), bk_pre_ok=z(u, b), bk_inflight=z(u, b),
        in_task=full(-1, ni), in_next_off=z(ni), in_end_off=z(ni), in_base=z(ni), in_write=z(ni),
        in_pattern=z(ni), in_stride=z(ni), in_outstanding=z(ni), in_left=z(ni), in_socket_busy=z(ni),
        in_next_issue=z(ni), in_last_end_req=full(-1, ni), in_free=free, in_free_top=full(mo, ni),
        in_txn_count=z(ni),
        sl_addr=z(ns), sl_bytes=z(ns), sl_ch=z(ns), sl_unit=z(ns), sl_bank=z(ns), sl_row=z(ns),
        sl_begin_req=z(ns), sl_end_req=z(ns), sl_arrive=z(ns), sl_wait_next=full(-1, ns), sl_seq=z(ns),
        sl_bursts_left=z(ns), sl_started=z(ns), sl_write=z(ns), sl_bg=z(ns),
        counters=z(8), txlog=z(max(txlog_rows, 1), TXLOG_COLS), cmdlog=z(max(cmdlog_rows, 1), CMDLOG_COLS),
        **_new_l2(p, ni, ns),
    )


def _new_l2(p: np.ndarray, num_initiators: int, slots: int) -> dict:
    """The L2's array (all lines empty, see ``HbmState``), or a stand-in when the arch has none."""
    if not p[P_L2_ON]:
        return {"l2": np.zeros(L2_NSTATS + 3, np.int64)}
    cores = max(1, num_initiators // int(p[P_DMA_ENGINES]))
    lines_at = L2_NSTATS + 2 * int(p[P_L2_SLICES]) + cores
    n_lines = int(p[P_L2_SETS] * p[P_L2_WAYS])
    slots_at = lines_at + 4 * n_lines
    l2 = np.zeros(slots_at + 4 * slots, np.int64)
    lines = l2[lines_at:slots_at].reshape(n_lines, 4)
    lines[:, L2_TAG] = -1
    lines[:, L2_LRU] = -1
    lines[:, L2_FILL] = -1
    recs = l2[slots_at:].reshape(slots, 4)
    recs[:, SL_WAY:] = -1
    l2[L2_LINES_AT], l2[L2_SLOTS_AT] = lines_at, slots_at
    return {"l2": l2}


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


@njit(cache=True, _nrt=False, inline="always")
def _split_local(p, local):
    """(pseudo-channel * banks + bank, row) of a channel-local byte address.

    ``interleave_bytes`` chunks go to the channel's pseudo-channels in turn; within a PC,
    transaction-sized blocks go to its bank groups in turn (so a stream's consecutive
    transactions alternate bank groups and tCCD_L is hidden, as HBM controllers map bank
    group bits low); the blocks of one (PC, bank group) fill a row, then move to the next
    bank of the group. With one PC and one bank group: consecutive rows, consecutive banks."""
    il = p[P_INTERLEAVE]
    npc = p[P_PCS]
    nbg = p[P_BANK_GROUPS]
    chunk = local // il
    pc = chunk % npc
    in_pc = (chunk // npc) * il + local % il
    g = p[P_TXN_BYTES]
    blk = in_pc // g
    bg = blk % nbg
    in_bg = (blk // nbg) * g + in_pc % g
    row_in_bg = in_bg // p[P_ROW_BYTES]
    per_group = p[P_BANKS] // nbg
    return pc * p[P_BANKS] + (row_in_bg % per_group) * nbg + bg, row_in_bg // per_group


@njit(cache=True, _nrt=False)
def map_address(p, addr):
    """(channel, bank, row) of a byte address (channels interleaved every ``interleave_bytes``);
    ``bank`` counts the banks of all the channel's pseudo-channels (``pc * banks + bank``)."""
    il = p[P_INTERLEAVE]
    chunk = addr // il
    ch = chunk % p[P_CHANNELS]
    local = (chunk // p[P_CHANNELS]) * il + addr % il
    bank, row = _split_local(p, local)
    return ch, bank, row


@njit(cache=True, _nrt=False, inline="always")
def _route(p, init, addr):
    """Channel, bank and row of a transaction: interleaved over all channels, or — with
    private channels (``attach: per_core``) — the initiating core's own channel, the
    address being local to it."""
    if p[P_PRIVATE_CHANNELS] == 0:
        return map_address(p, addr)
    bank, row = _split_local(p, addr)
    return init // p[P_DMA_ENGINES], bank, row


# --- DMA start ---------------------------------------------------------------------------

@njit(cache=True, _nrt=False, inline="always")
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
def refresh_keep(p):
    """Fraction of a pseudo-channel's time its data bus is not lost to all-bank refresh: ``1 - (tRP +
    tRFC) / tREFI`` (1 without refresh, and with per-bank refresh, which closes one bank and keeps
    the bus); the analytical fidelity's channel rate is its peak times this."""
    refi = p[P_TREFI]
    if refi <= 0 or p[P_REFRESH_PER_BANK] != 0:
        return 1.0
    return max(1e-6, 1.0 - (p[P_TRP] + p[P_TRFC]) / refi)


@njit(cache=True, _nrt=False)
def _reserve_run(ch_data_free, ch_busy_ps, ch_bytes, u_burst_ps, lo, count, share, pcs, per_burst, ready):
    """Channels ``lo .. lo+count-1`` each carry ``share`` bytes of a transfer whose data is ready at
    ``ready`` ps: each channel's data bus is reserved first-come first-served for the share's bursts
    (as in :func:`analytical_finish`'s loop); returns the latest end. Written over slices indexed
    from 0 so that LLVM vectorises it (a signed index into a Numba array carries a wrap-around
    check for negative values that defeats vectorisation): a linear transfer spans all 64 channels,
    and this loop was a fifth of a decode iteration's kernel time. Not inlined (it takes four
    arrays, not the model's state, so a call costs little): inlined, it made the kernel's path-NoC
    variant ~20% slower (``validation/perf/bench_engine.py --pipeline``)."""
    free = ch_data_free[lo:lo + count]
    busy_ps = ch_busy_ps[lo:lo + count]
    moved = ch_bytes[lo:lo + count]
    burst = u_burst_ps[lo * pcs:(lo + count) * pcs:pcs]
    done = ready
    for j in range(count):
        busy = np.int64(np.ceil(share * burst[j] / per_burst))
        start = max(ready, free[j])
        free[j] = start + busy
        busy_ps[j] += busy
        moved[j] += share
        done = max(done, start + busy)
    return done


@njit(cache=True, _nrt=False, inline="always")
def analytical_finish(st, init, addr, nbytes, pattern, stride, now_cycle, period_ps):
    """Finish cycle of a transfer in the analytical model.

    ``latency + bytes / bandwidth``: the first access's closed-row latency, then the
    bytes at the lower of the initiator's rate (port, and tags x txn / stream
    latency) and the channels' rate, where each channel's data bus is reserved
    first-come first-served for this transfer's share of bytes at the channel's
    peak bandwidth times :func:`refresh_keep`. No other DRAM timing, no request queues,
    no row-buffer effects."""
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
    pcs, frontend = p[P_PCS], p[P_FRONTEND]
    ready = t0 + first_ps - frontend
    per_burst = p[P_BURST_BYTES] * pcs * refresh_keep(p)  # bytes per burst time, after refresh
    if step == 1:  # consecutive channels: in runs of equal shares that do not wrap around
        i = 0
        while i < used:
            ch = first_ch + i
            if ch >= n_ch:
                ch -= n_ch
            end = min(extra if i < extra else used, i + n_ch - ch)
            done = _reserve_run(st.ch_data_free, st.ch_busy_ps, st.ch_bytes, st.u_burst_ps, ch, end - i,
                                base + (1 if i < extra else 0), pcs, per_burst, ready)
            channels_done = max(channels_done, done + frontend)
            i = end
        return to_cycle(max(initiator_done, channels_done), period_ps)
    ch = first_ch
    for i in range(used):
        share = base + (1 if i < extra else 0)
        start = max(ready, st.ch_data_free[ch])
        # the channel's pseudo-channels together: burst time of one PC / their number
        busy = np.int64(np.ceil(share * st.u_burst_ps[ch * pcs] / per_burst))
        st.ch_data_free[ch] = start + busy
        st.ch_busy_ps[ch] += busy
        st.ch_bytes[ch] += share
        channels_done = max(channels_done, start + busy + frontend)
        ch += step  # the next channel: (ch + step) mod n_ch without a division (step < n_ch)
        if ch >= n_ch:
            ch -= n_ch
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
        # random blocks of ``stride`` bytes (one transaction when stride <= transaction_bytes),
        # block-aligned; a block's transactions go in address order
        g = p[P_TXN_BYTES]
        per = st.in_stride[init] // g if st.in_stride[init] > g else np.int64(1)
        n_blocks = p[P_CAPACITY_BYTES] // (per * g)
        k = st.in_txn_count[init]
        h = _hash64(st.in_task[init] * np.int64(1000003) + k // per)
        addr = (h & np.int64(0x7FFFFFFFFFFFFFFF)) % n_blocks * (per * g) + (k % per) * g
    else:
        addr = st.in_base[init] + st.in_txn_count[init] * st.in_stride[init]
    size = min(p[P_TXN_BYTES], left)
    to_boundary = p[P_INTERLEAVE] - addr % p[P_INTERLEAVE]
    size = min(size, to_boundary)
    return addr, size


@njit(cache=True, _nrt=False, inline="always")
def _is_write(st, slot):
    return st.sl_write[slot]


@njit(cache=True, _nrt=False, inline="always")
def _qgroup(st, slot):
    """Queue partition of ``slot``: its pseudo-channel with partitioned queues, else its channel."""
    if st.p[P_QPARTS] > 1:
        return st.sl_unit[slot]
    return st.sl_ch[slot]


@njit(cache=True, _nrt=False)
def _room(st, g, is_write):
    """Whether queue partition ``g`` has a free entry for this kind of request (each of the
    P_QPARTS partitions of a channel holds 1/P_QPARTS of its entries)."""
    p = st.p
    parts = p[P_QPARTS]
    if p[P_WQ_DEPTH] == 0:
        return st.g_qn[g] < p[P_QDEPTH] // parts
    if is_write:
        return st.g_nw[g] < p[P_WQ_DEPTH] // parts
    return st.g_qn[g] - st.g_nw[g] < p[P_QDEPTH] // parts


# --- the L2 (TLM) -------------------------------------------------------------------------

@njit(cache=True, _nrt=False)
def _l2_lookup(p, l2, addr, size, write):
    """Look up (and on a miss or a write, allocate) the line of a transaction at ``addr``.

    Returns ``(position of its line's record in l2, hit, the sectors it touches)`` (-1: a write that
    allocates nothing).
    A read hits when its line is present with every sector it touches valid; otherwise its
    sectors are marked valid now (the fill is in flight: ``L2_FILL`` names its slot). A write
    marks its sectors valid (write-through: the data also goes to HBM). The victim of an
    allocation is the set's least recently used way, preferring ways whose fill is not in flight."""
    line_b = p[P_L2_LINE]
    sec = p[P_L2_SECTOR]
    line = addr // line_b
    off = addr - line * line_b
    last = min(off + size, line_b) - 1
    mask = ((np.int64(1) << (last // sec + 1)) - 1) ^ ((np.int64(1) << (off // sec)) - 1)
    ways = p[P_L2_WAYS]
    base = l2[L2_LINES_AT] + 4 * (line % p[P_L2_SETS]) * ways
    l2[L2_CLOCK] += 1
    now = l2[L2_CLOCK]
    victim = base
    oldest = NEVER
    for w in range(ways):
        i = base + 4 * w
        if l2[i + L2_TAG] == line:
            l2[i + L2_LRU] = now
            if not write and (l2[i + L2_VALID] & mask) == mask:
                return i, True, mask
            l2[i + L2_VALID] |= mask
            return i, False, mask
        key = l2[i + L2_LRU] + (NEVER // 2 if l2[i + L2_FILL] >= 0 else 0)  # empty ways: -1
        if key < oldest:
            oldest, victim = key, i
    if write and p[P_L2_WALLOC] == 0:
        return -1, False, mask
    if l2[victim + L2_TAG] >= 0:
        l2[L2_EVICTIONS] += 1
    l2[victim + L2_TAG] = line
    l2[victim + L2_VALID] = mask
    l2[victim + L2_LRU] = now
    l2[victim + L2_FILL] = -1
    return victim, False, mask


@njit(cache=True, _nrt=False)
def _l2_slice_time(p, l2, addr, size, t_ps):
    """Charge ``size`` bytes to the slice of ``addr`` (FCFS at its bandwidth) from ``t_ps``; returns
    when it has moved them, in ps << L2_FIX."""
    slices = p[P_L2_SLICES]
    sl = (addr // p[P_L2_LINE]) % slices
    k = L2_NSTATS + sl
    start = max(t_ps << L2_FIX, l2[k])
    l2[k] = start + size * p[P_L2_SLICE_PSF]
    l2[L2_NSTATS + slices + sl] += size
    return l2[k]


@njit(cache=True, _nrt=False)
def _l2_hit_time(p, l2, core, addr, size, t_ps):
    """BEGIN_RESP (ps) of a hit requested at ``t_ps``: its slice's and its core's read port's
    service (each FCFS at its rate, overlapped), plus the hit latency."""
    ready = _l2_slice_time(p, l2, addr, size, t_ps)
    if p[P_L2_CORE_PSF] > 0:
        k = L2_NSTATS + 2 * p[P_L2_SLICES] + core
        start = max(t_ps << L2_FIX, l2[k])
        l2[k] = start + size * p[P_L2_CORE_PSF]
        ready = max(ready, l2[k])
    return ((ready + (np.int64(1) << L2_FIX) - 1) >> L2_FIX) + p[P_L2_HIT_PS]


@njit(cache=True, _nrt=False)
def _l2_filled(l2, sl_arrive, heap, hs, slot, t_ps, period_ps):
    """``slot``'s HBM read has its data (at ``t_ps``): its line's fill is done, and the hits that
    waited for it respond (at the later of their own service and the data)."""
    r = l2[L2_SLOTS_AT] + 4 * slot
    i = l2[r + SL_WAY]
    if i >= 0 and l2[i + L2_FILL] == slot:
        l2[i + L2_FILL] = -1
    w = l2[r + SL_WAITERS]
    while w >= 0:
        nxt = l2[l2[L2_SLOTS_AT] + 4 * w + SL_NEXT]
        sl_arrive[w] = max(sl_arrive[w], t_ps)
        event_push(heap, hs, to_cycle(sl_arrive[w], period_ps), EV_MEM_RESP, w)
        w = nxt
    l2[r + SL_WAITERS] = -1


@njit(cache=True, _nrt=False)
def _l2_access(st, heap, hs, init, slot, addr, size, t_ps, period_ps):
    """The L2 sees the transaction in ``slot`` at BEGIN_REQ (``t_ps``). A write (write-through)
    updates or allocates its line, takes its slice's bandwidth and goes on to HBM; a read miss
    takes its line, charges the fill to its slice and goes on to HBM. A read hit is served here:
    END_REQ at once, BEGIN_RESP from :func:`_l2_hit_time` (or when the fill it waits for lands),
    the initiator's next request one hit gap later. Returns True for a hit."""
    p = st.p
    l2 = st.l2
    write = st.in_write[init] != 0
    i, hit, mask = _l2_lookup(p, l2, addr, size, write)
    r = l2[L2_SLOTS_AT] + 4 * slot
    l2[r + SL_WAY] = i
    l2[r + SL_WAITERS] = -1
    l2[r + SL_MASK] = 0
    if write:
        l2[L2_WRITE_BYTES] += size
        _l2_slice_time(p, l2, addr, size, t_ps)
        return False
    if not hit:
        l2[L2_MISS_BYTES] += size
        l2[L2_MISSES] += 1
        l2[i + L2_FILL] = slot
        l2[r + SL_MASK] = mask
        _l2_slice_time(p, l2, addr, size, t_ps)
        return False
    l2[L2_HIT_BYTES] += size
    l2[L2_HITS] += 1
    st.sl_ch[slot] = -1
    st.sl_end_req[slot] = t_ps
    st.sl_arrive[slot] = _l2_hit_time(p, l2, init // p[P_DMA_ENGINES], addr, size, t_ps)
    owner = l2[i + L2_FILL]
    o = l2[L2_SLOTS_AT] + 4 * owner
    if owner >= 0 and l2[o + SL_MASK] & mask:  # its data is still on the way from HBM: respond when it lands
        l2[L2_MERGED] += 1
        l2[r + SL_NEXT] = l2[o + SL_WAITERS]
        l2[o + SL_WAITERS] = slot
    else:
        event_push(heap, hs, to_cycle(st.sl_arrive[slot], period_ps), EV_MEM_RESP, slot)
    # the slice accepted at once: the socket is free; the next request one hit gap later
    st.in_last_end_req[init] = t_ps
    st.in_next_issue[init] = t_ps + p[P_L2_HIT_GAP]
    st.in_socket_busy[init] = 2
    event_push(heap, hs, to_cycle(st.in_next_issue[init], period_ps), EV_MEM_ISSUE, init)
    return True


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
        event_push(heap, hs, to_cycle(st.in_next_issue[init], period_ps), EV_MEM_ISSUE, init)
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
    ch, flat_bank, row = _route(p, init, addr)
    st.sl_addr[slot] = addr
    st.sl_bytes[slot] = size
    st.sl_ch[slot] = ch
    st.sl_unit[slot] = ch * p[P_PCS] + flat_bank // p[P_BANKS]
    st.sl_bank[slot] = flat_bank % p[P_BANKS]
    st.sl_bg[slot] = st.sl_bank[slot] % p[P_BANK_GROUPS]
    st.sl_write[slot] = st.in_write[init]
    st.sl_row[slot] = row
    st.sl_begin_req[slot] = t_ps
    st.sl_end_req[slot] = -1
    st.sl_seq[slot] = st.counters[C_SEQ]
    st.sl_bursts_left[slot] = (size + p[P_BURST_BYTES] - 1) // p[P_BURST_BYTES]
    st.sl_started[slot] = 0
    st.counters[C_SEQ] += 1
    if st.in_last_end_req[init] > t_ps:
        st.counters[C_EXCLUSION_VIOLATIONS] += 1
    if p[P_L2_ON] != 0 and _l2_access(st, heap, hs, init, slot, addr, size, t_ps, period_ps):
        return  # an L2 hit: no HBM request
    # BEGIN_REQ reaches the target now
    if _room(st, _qgroup(st, slot), st.in_write[init]):
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
    g = _qgroup(st, slot)
    st.g_qn[g] += 1
    if _is_write(st, slot):
        st.g_nw[g] += 1
    end_req = t_ps + p[P_ACCEPT]
    st.sl_end_req[slot] = end_req
    st.sl_arrive[slot] = max(st.sl_begin_req[slot] + p[P_FRONTEND], t_ps)
    event_push(heap, hs, to_cycle(end_req, period_ps), EV_MEM_END_REQ, slot)
    _wake(st, heap, hs, ch, st.sl_arrive[slot], period_ps)


@njit(cache=True, _nrt=False)
def _admit_waiting(st, heap, hs, ch, t_ps, period_ps):
    """Queue entries freed: admit the oldest waiting requests that now fit."""
    prev = -1
    w = st.ch_wait_head[ch]
    while w >= 0:
        nxt = st.sl_wait_next[w]
        if _room(st, _qgroup(st, w), _is_write(st, w)):
            if prev >= 0:
                st.sl_wait_next[prev] = nxt
            else:
                st.ch_wait_head[ch] = nxt
            if st.ch_wait_tail[ch] == w:
                st.ch_wait_tail[ch] = prev
            _accept(st, heap, hs, w, t_ps, period_ps)
        else:
            prev = w
        w = nxt


@njit(cache=True, _nrt=False)
def _wake(st, heap, hs, ch, t_ps, period_ps):
    """Make sure the channel scheduler runs at or before ``t_ps``."""
    t = max(t_ps, st.ch_cmd_ps[ch])
    if t < st.ch_wake[ch]:
        st.ch_wake[ch] = t
        event_push(heap, hs, to_cycle(t, period_ps), EV_MEM_SCHED, ch)


@njit(cache=True, _nrt=False)
def _log_cmd(st, t, cmd, ch, unit, bank, row, burst=0):
    n = st.counters[C_CMDLOG_N]
    if st.cmdlog.shape[0] > 1 and n < st.cmdlog.shape[0]:
        st.cmdlog[n, 0] = t
        st.cmdlog[n, 1] = cmd
        st.cmdlog[n, 2] = ch
        st.cmdlog[n, 3] = unit % st.p[P_PCS]
        st.cmdlog[n, 4] = bank
        st.cmdlog[n, 5] = row
        st.cmdlog[n, 6] = st.g_nw[unit if st.p[P_QPARTS] > 1 else ch]  # its queue partition's writes
        st.cmdlog[n, 7] = burst
        st.counters[C_CMDLOG_N] = n + 1


# --- controller side ---------------------------------------------------------------------

@njit(cache=True, _nrt=False, inline="always")
def _act_time(st, u, bank, bg, t):
    """Earliest ACT at or after ``t`` on ``bank`` of pseudo-channel ``u``: tRC (and refresh)
    on the bank, tRRD_L in its bank group, tRRD_S and the four-ACT tFAW window on the PC,
    and no earlier than the PC's last ACT (ACTs issue in commit order)."""
    p = st.p
    a = max(t, st.bk_act_ok[u, bank])
    a = max(a, st.u_last_act[u] + p[P_TRRD_S])
    a = max(a, st.u_bg_last_act[u, bg] + p[P_TRRD_L])
    if p[P_TFAW] > 0:
        a = max(a, st.u_faw[u, st.u_faw_i[u]] + p[P_TFAW])  # the oldest of the last four
    return max(a, st.u_last_act[u])


@njit(cache=True, _nrt=False, inline="always")
def _next_burst(st, slot, t):
    """(column, act, pre) times for ``slot``'s next burst decided at ``t`` (act/pre -1 when
    not needed); column NEVER when it may not start now (its bank is being kept open for
    another transaction, or a refresh waits for the bank)."""
    p = st.p
    u = st.sl_unit[slot]
    bank = st.sl_bank[slot]
    bg = st.sl_bg[slot]
    w = st.sl_write[slot]
    lat = p[P_TWL] if w else p[P_TCL]
    act = np.int64(-1)
    pre = np.int64(-1)
    if st.sl_started[slot]:
        col = max(t, st.bk_col_ok[u, bank])
    else:
        pend = st.u_ref_pending[u]
        if pend >= 0 and (pend == bank or pend >= p[P_BANKS]):
            return NEVER, act, pre
        open_row = st.bk_row[u, bank]
        trcd = p[P_TRCDWR] if w else p[P_TRCD]
        if open_row == st.sl_row[slot]:
            col = max(t, st.bk_col_ok[u, bank])
        elif open_row < 0:
            act = _act_time(st, u, bank, bg, t)
            col = act + trcd
        else:
            if st.bk_inflight[u, bank] > 0:
                return NEVER, act, pre
            pre = max(t, st.bk_pre_ok[u, bank])
            act = _act_time(st, u, bank, bg, pre + p[P_TRP])
            col = act + trcd
    col = max(col, st.u_bg_last_col[u, bg] + st.u_tccdl_ps[u])
    col = max(col, st.u_last_col[u] + st.u_tccd_ps[u])
    col = max(col, st.u_data_free[u] - lat)
    last = st.u_last_write[u]
    if last >= 0 and last != w:
        # bus turnaround: read->write needs tRTW after the last read data, write->read tWTR
        col = max(col, st.u_data_free[u] + (p[P_TRTW] if w else p[P_TWTR]) - lat)
    return col, act, pre


@njit(cache=True, _nrt=False)
def _pick(st, ch, t_ps):
    """FR-FCFS with bank awareness, one burst at a time (see module docstring). -1 if no
    request may issue now."""
    p = st.p
    wq = p[P_WQ_DEPTH] > 0
    best_c, best_c_col, best_c_seq = -1, NEVER, NEVER  # transactions in progress
    best_f, best_f_col, best_f_seq = -1, NEVER, NEVER  # new transactions
    oldest, oldest_seq = -1, NEVER
    horizon = t_ps + p[P_LOOKAHEAD]
    for i in range(st.ch_qn[ch]):
        slot = st.ch_q[ch, i]
        if st.sl_arrive[slot] > t_ps:
            continue
        if st.u_data_free[st.sl_unit[slot]] > horizon:
            continue  # its data bus is busy beyond the look-ahead horizon
        started = st.sl_started[slot]
        if wq and not started and st.sl_write[slot] != st.g_wmode[_qgroup(st, slot)]:
            continue  # a write drain is not interrupted, even by a starving read (it is bounded)
        seq = st.sl_seq[slot]
        # a lower bound of its column time (bus, tCCD_S) skips the full computation when it
        # cannot win its category (speed only: the choice is the same)
        u = st.sl_unit[slot]
        lb = max(t_ps, st.u_data_free[u] - (p[P_TWL] if st.sl_write[slot] else p[P_TCL]),
                 st.u_last_col[u] + st.u_tccd_ps[u])
        if started:
            loses = lb > best_c_col or (lb == best_c_col and seq > best_c_seq)
        else:
            loses = lb > best_f_col or (lb == best_f_col and seq > best_f_seq)
        if loses and seq >= oldest_seq:
            continue
        col, _, _ = _next_burst(st, slot, t_ps)
        if col >= NEVER:
            continue
        if seq < oldest_seq:
            oldest, oldest_seq = i, seq
        if started:
            if col < best_c_col or (col == best_c_col and seq < best_c_seq):
                best_c, best_c_col, best_c_seq = i, col, seq
        elif col < best_f_col or (col == best_f_col and seq < best_f_seq):
            best_f, best_f_col, best_f_seq = i, col, seq
    if oldest >= 0 and t_ps - st.sl_arrive[st.ch_q[ch, oldest]] > STARVATION_PS:
        return oldest
    if best_c < 0:
        return best_f
    if best_f < 0:
        return best_c
    if best_f_col < best_c_col:
        return best_f
    # a new transaction in another bank group (or PC) that can go within one burst time of the
    # transaction in progress goes first: its bursts fill the tCCD_L gaps between the other's
    sc, sf = st.ch_q[ch, best_c], st.ch_q[ch, best_f]
    other = st.sl_unit[sc] != st.sl_unit[sf] or st.sl_bg[sc] != st.sl_bg[sf]
    opens = st.bk_row[st.sl_unit[sf], st.sl_bank[sf]] != st.sl_row[sf]  # it needs an ACT
    if other and opens and best_f_col < best_c_col + st.u_burst_ps[st.sl_unit[sc]]:
        return best_f  # (at one burst time or later the other's burst does not delay it)
    return best_c


@njit(cache=True, _nrt=False)
def _update_write_mode(st, ch, t_ps):
    """Write-queue drain policy, per queue partition (the channel, or each pseudo-channel with
    partitioned queues): to writes at the high watermark (or when no read waits), back to
    reads at the low watermark if a read waits (or when no write is left). A partition's
    watermarks are the channel's / P_QPARTS (compared as occupancy x P_QPARTS, unrounded)."""
    p = st.p
    parts = p[P_QPARTS]
    for k in range(parts):
        g = ch * parts + k if parts > 1 else ch
        unit = g if parts > 1 else ch * p[P_PCS]
        nw = st.g_nw[g] * parts
        reads_waiting = False
        for i in range(st.ch_qn[ch]):
            slot = st.ch_q[ch, i]
            if st.sl_arrive[slot] <= t_ps and not _is_write(st, slot) and _qgroup(st, slot) == g:
                reads_waiting = True
                break
        if st.g_wmode[g] == 0:
            if nw >= p[P_WQ_HIGH] or (nw > 0 and not reads_waiting):
                st.g_wmode[g] = 1
                _log_cmd(st, t_ps, CMD_WMODE, ch, unit, -1, 1)
        elif nw == 0 or (nw <= p[P_WQ_LOW] and reads_waiting):
            st.g_wmode[g] = 0
            _log_cmd(st, t_ps, CMD_WMODE, ch, unit, -1, 0)


@njit(cache=True, _nrt=False)
def _refresh_all(st, ch, u, t_ps):
    """All-bank refresh of pseudo-channel ``u`` due by ``t_ps``: precharge all, the banks
    closed for tRP + tRFC. Refreshes that fell due while idle happened on time and cost
    nothing now; only the latest due one is placed."""
    p = st.p
    missed = (t_ps - st.u_refresh_next[u]) // p[P_TREFI]
    due = st.u_refresh_next[u] + missed * p[P_TREFI]
    start = max(due, st.u_data_free[u])
    for b in range(p[P_BANKS]):
        start = max(start, st.bk_pre_ok[u, b])
    done = start + p[P_TRP] + p[P_TRFC]
    for b in range(p[P_BANKS]):
        st.bk_row[u, b] = -1
        st.bk_act_ok[u, b] = max(st.bk_act_ok[u, b], done)
    st.u_refresh_next[u] = due + p[P_TREFI]
    _log_cmd(st, start + p[P_TRP], CMD_REF, ch, u, -1, -1)  # after the precharge-all at ``start``


@njit(cache=True, _nrt=False)
def _refresh_bank(st, ch, u, t_ps):
    """Per-bank refresh due by ``t_ps`` on the next bank (round robin) of ``u``: that bank
    is closed for tRP (if open) + tRFCsb; the others are untouched."""
    p = st.p
    interval = p[P_TREFI] // p[P_BANKS]
    missed = (t_ps - st.u_refsb_next[u]) // interval
    due = st.u_refsb_next[u] + missed * interval
    b = (st.u_refsb_bank[u] + missed) % p[P_BANKS]
    start = max(due, st.bk_pre_ok[u, b])
    if st.bk_row[u, b] >= 0:
        _log_cmd(st, start, CMD_PRE, ch, u, b, st.bk_row[u, b])
        start += p[P_TRP]
    done = start + p[P_TRFCSB]
    st.bk_row[u, b] = -1
    st.bk_act_ok[u, b] = max(st.bk_act_ok[u, b], done)
    st.u_refsb_bank[u] = (b + 1) % p[P_BANKS]
    st.u_refsb_next[u] = due + interval
    _log_cmd(st, start, CMD_REFSB, ch, u, b, -1)


@njit(cache=True, _nrt=False)
def _refreshes(st, ch, t_ps):
    """Place the refreshes due on the channel's pseudo-channels (a refresh whose bank has a
    transaction in progress is marked pending: no new transaction starts there)."""
    p = st.p
    npc = p[P_PCS]
    for k in range(npc):
        u = ch * npc + k
        if p[P_REFRESH_PER_BANK]:
            if t_ps >= st.u_refsb_next[u]:
                interval = p[P_TREFI] // p[P_BANKS]
                missed = (t_ps - st.u_refsb_next[u]) // interval
                b = (st.u_refsb_bank[u] + missed) % p[P_BANKS]
                if st.bk_inflight[u, b] == 0:
                    _refresh_bank(st, ch, u, t_ps)
                    st.u_ref_pending[u] = -1
                else:
                    st.u_ref_pending[u] = b
        elif t_ps >= st.u_refresh_next[u]:
            busy = False
            for b in range(p[P_BANKS]):
                if st.bk_inflight[u, b] > 0:
                    busy = True
                    break
            if busy:
                st.u_ref_pending[u] = p[P_BANKS]
            else:
                _refresh_all(st, ch, u, t_ps)
                st.u_ref_pending[u] = -1


@njit(cache=True, _nrt=False)
def _serve(st, heap, hs, ch, idx, t_ps, period_ps):
    """Commit the next burst of the queued request at ``idx``: its PRE/ACT (first burst),
    its column command and data; after its last burst free its queue entry (admitting
    waiting requests) and schedule its response."""
    p = st.p
    slot = st.ch_q[ch, idx]
    u = st.sl_unit[slot]
    bank, row = st.sl_bank[slot], st.sl_row[slot]
    bg = st.sl_bg[slot]
    w = st.sl_write[slot]
    col, act, pre = _next_burst(st, slot, t_ps)
    if not st.sl_started[slot]:
        open_row = st.bk_row[u, bank]
        if open_row == row:
            st.ch_rowstat[ch, 0] += 1
        else:
            if open_row < 0:
                st.ch_rowstat[ch, 1] += 1
            else:
                st.ch_rowstat[ch, 2] += 1
                _log_cmd(st, pre, CMD_PRE, ch, u, bank, open_row)
            _log_cmd(st, act, CMD_ACT, ch, u, bank, row)
            st.bk_row[u, bank] = row
            st.bk_pre_ok[u, bank] = act + p[P_TRAS]
            st.bk_act_ok[u, bank] = act + p[P_TRC]
            st.bk_col_ok[u, bank] = act + (p[P_TRCDWR] if w else p[P_TRCD])
            st.u_last_act[u] = act
            st.u_bg_last_act[u, bg] = act
            st.u_faw[u, st.u_faw_i[u]] = act
            st.u_faw_i[u] = (st.u_faw_i[u] + 1) % 4
        st.sl_started[slot] = 1
        st.bk_inflight[u, bank] += 1
    lat = p[P_TWL] if w else p[P_TCL]
    burst = st.u_burst_ps[u]
    data_end = col + lat + burst
    st.u_data_free[u] = data_end
    st.ch_busy_ps[ch] += burst
    st.u_last_col[u] = col
    st.u_bg_last_col[u, bg] = col
    st.u_last_write[u] = w
    if w:
        st.bk_pre_ok[u, bank] = max(st.bk_pre_ok[u, bank], data_end + p[P_TWR])
    else:
        st.bk_pre_ok[u, bank] = max(st.bk_pre_ok[u, bank], col + p[P_TRTP])
    nbursts = (st.sl_bytes[slot] + p[P_BURST_BYTES] - 1) // p[P_BURST_BYTES]
    _log_cmd(st, col, CMD_WR if w else CMD_RD, ch, u, bank, row, nbursts - st.sl_bursts_left[slot])
    st.sl_bursts_left[slot] -= 1
    if st.sl_bursts_left[slot] > 0:
        return
    # last burst: the transaction leaves the queue
    for i in range(idx, st.ch_qn[ch] - 1):
        st.ch_q[ch, i] = st.ch_q[ch, i + 1]
    st.ch_qn[ch] -= 1
    st.ch_q[ch, st.ch_qn[ch]] = -1
    g = _qgroup(st, slot)
    st.g_qn[g] -= 1
    if w:
        st.g_nw[g] -= 1
    st.bk_inflight[u, bank] -= 1
    resp = data_end + p[P_FRONTEND]
    event_push(heap, hs, to_cycle(resp, period_ps), EV_MEM_RESP, slot)
    st.sl_arrive[slot] = resp  # reused: BEGIN_RESP time
    _admit_waiting(st, heap, hs, ch, t_ps, period_ps)


@njit(cache=True, _nrt=False)
def _next_wake(st, ch, t_ps):
    """When a request of the channel may next be eligible: its arrival and its PC's
    look-ahead horizon; at least one tCK on."""
    p = st.p
    first = NEVER
    for i in range(st.ch_qn[ch]):
        slot = st.ch_q[ch, i]
        first = min(first, max(st.sl_arrive[slot], st.u_data_free[st.sl_unit[slot]] - p[P_LOOKAHEAD]))
    return max(first, t_ps + p[P_TCK])


@njit(cache=True, _nrt=False)
def _schedule(st, heap, hs, ch, now_cycle, period_ps):
    """Run the channel scheduler at the current time; re-arm its wake-up."""
    p = st.p
    t = to_ps(now_cycle, period_ps)
    if st.ch_wake[ch] <= t:
        st.ch_wake[ch] = NEVER
    while st.ch_qn[ch] > 0:
        t_dec = max(t, st.ch_cmd_ps[ch])
        if t_dec > t:
            _wake(st, heap, hs, ch, t_dec, period_ps)
            return
        _refreshes(st, ch, t)
        # every data bus of the channel beyond the look-ahead horizon: nothing may issue yet
        npc = p[P_PCS]
        free = NEVER
        for k in range(npc):
            free = min(free, st.u_data_free[ch * npc + k])
        if free - p[P_LOOKAHEAD] > t:
            _wake(st, heap, hs, ch, free - p[P_LOOKAHEAD], period_ps)
            return
        if p[P_WQ_DEPTH] > 0:
            _update_write_mode(st, ch, t)
        idx = _pick(st, ch, t)
        if idx < 0:
            _wake(st, heap, hs, ch, _next_wake(st, ch, t), period_ps)
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
        st.txlog[n, 4] = ch  # -1: an L2 hit
        st.txlog[n, 5] = init
        st.counters[C_TXLOG_N] = n + 1
    st.counters[C_TXNS] += 1
    if ch >= 0:  # served by HBM (an L2 hit's bytes never reach a channel)
        st.ch_bytes[ch] += st.sl_bytes[slot]
        st.ch_nreq[ch] += 1
        st.ch_lat_sum[ch] += latency
        b = latency // p[P_LAT_BIN_PS]
        st.ch_lat_hist[ch, min(b, LAT_BINS)] += 1
        if p[P_L2_ON] != 0:  # a fill (or a write) is done: the hits waiting for it respond
            _l2_filled(st.l2, st.sl_arrive, heap, hs, slot, end_resp, period_ps)
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
