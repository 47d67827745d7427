"""HBM model parameters: the arch's DRAM section flattened into an int64 array (ps).

The memory models run in picoseconds internally (integer), so DRAM timings in tCK
and data-bus transfer times stay exact whatever the core clock; only the boundary
with the engine (core cycles) rounds: requests start at ``cycle * period_ps`` and
completions are reported at ``ceil(ps / period_ps)``.
"""

from __future__ import annotations

import math

import numpy as np

from npusim.arch.schema import Arch

(
    P_CHANNELS, P_BANKS, P_QDEPTH, P_INTERLEAVE, P_ROW_BYTES, P_BURST_BYTES, P_BURST_PS,
    P_TRCD, P_TCL, P_TRP, P_TRAS, P_TCCD, P_TWL, P_TWR, P_TWTR, P_TRTW, P_TREFI, P_TRFC,
    P_FRONTEND, P_ACCEPT, P_TCK, P_TXN_BYTES, P_MAX_OUT, P_ISSUE_GAP, P_MODE, P_LOOKAHEAD,
    P_CAPACITY_BYTES, P_LAT_BIN_PS, P_PRIVATE_CHANNELS, P_DMA_ENGINES,
    # bank groups, activation limits, pseudo-channels, per-bank refresh, write queue
    P_PCS, P_BANK_GROUPS, P_TCCD_L, P_TRRD_S, P_TRRD_L, P_TFAW, P_TRC, P_TRCDWR, P_TRTP,
    P_REFRESH_PER_BANK, P_TRFCSB, P_WQ_DEPTH, P_WQ_HIGH, P_WQ_LOW,
    # queue partitions per channel: pseudo_channels with partitioned queues, else 1
    P_QPARTS,
    # the shared L2 at the TLM fidelity (npusim.hw.memory.hbm, "L2"): on/off, line and sector
    # bytes, sets, ways, slices, a slice's and a core port's time per byte (ps << L2_FIX),
    # hit latency (ps), time between one engine's hit requests (ps), allocate on write
    P_L2_ON, P_L2_LINE, P_L2_SECTOR, P_L2_SETS, P_L2_WAYS, P_L2_SLICES, P_L2_SLICE_PSF, P_L2_CORE_PSF,
    P_L2_HIT_PS, P_L2_HIT_GAP, P_L2_WALLOC,
) = range(56)
N_PARAMS = 56
#: fixed-point bits of the L2's per-byte service times and of its slices' and ports' clocks (a
#: slice of 7 TB/s serves a byte in 0.14 ps: kept in 1/4096 ps, exact to 0.1% per transaction)
L2_FIX = 12
#: lines the TLM L2 holds at most (each line's record is four int64: 32 bytes a line, 256 MiB at most)
L2_MAX_LINES = 1 << 23

MODE_TLM, MODE_ANALYTICAL = 0, 1
MODES = {"tlm": MODE_TLM, "analytical": MODE_ANALYTICAL}
LAT_BINS = 4096


def memory_params(arch: Arch, mode: str = "tlm", transaction_bytes: int | None = None,
                  max_outstanding: int | None = None) -> tuple[np.ndarray, float]:
    """Return ``(params int64[N_PARAMS], core_period_ps)`` for the arch's HBM."""
    if mode not in MODES:
        from npusim.errors import ConfigError
        raise ConfigError(f"memory mode '{mode}': expected one of {sorted(MODES)}")
    hbm, dma = arch.hbm, arch.cores.dma
    tck_ps = hbm.tck_ns * 1000.0
    period_ps = 1000.0 / arch.clock_ghz
    txn = transaction_bytes or dma.transaction_bytes
    p = np.zeros(N_PARAMS, dtype=np.int64)

    def cyc(name: str) -> int:
        return int(round(hbm.timing_cycles(name) * tck_ps))

    p[P_CHANNELS] = hbm.channels
    p[P_BANKS] = hbm.banks  # per pseudo-channel
    p[P_PCS] = hbm.pseudo_channels
    p[P_BANK_GROUPS] = hbm.bank_groups
    p[P_QDEPTH] = hbm.request_queue_depth
    p[P_INTERLEAVE] = hbm.interleave_bytes
    p[P_ROW_BYTES] = hbm.row_bytes
    p[P_BURST_BYTES] = hbm.burst_bytes
    # one burst on one pseudo-channel's data bus
    p[P_BURST_PS] = int(round(hbm.burst_bytes * hbm.pseudo_channels / hbm.bandwidth_per_channel_gbps * 1000.0))
    for idx, name in ((P_TRCD, "tRCD"), (P_TCL, "tCL"), (P_TRP, "tRP"), (P_TRAS, "tRAS"), (P_TCCD, "tCCD"),
                      (P_TWL, "tWL"), (P_TWR, "tWR"), (P_TWTR, "tWTR"), (P_TRTW, "tRTW"),
                      (P_TREFI, "tREFI"), (P_TRFC, "tRFC"), (P_TCCD_L, "tCCD_L"), (P_TRRD_S, "tRRD_S"),
                      (P_TRRD_L, "tRRD_L"), (P_TFAW, "tFAW"), (P_TRC, "tRC"), (P_TRCDWR, "tRCDWR"),
                      (P_TRTP, "tRTP"), (P_TRFCSB, "tRFCsb")):
        p[idx] = cyc(name)
    p[P_REFRESH_PER_BANK] = int(hbm.refresh == "per_bank")
    p[P_WQ_DEPTH] = hbm.write_queue_depth
    p[P_WQ_HIGH] = hbm.write_high_watermark if hbm.write_queue_depth else 0
    p[P_WQ_LOW] = hbm.write_low_watermark if hbm.write_queue_depth else 0
    # partitioned queues: each pseudo-channel gets 1/pseudo_channels of the channel's entries
    # (and of its watermarks), as gem5's HBMCtrl (see npusim.hw.memory.hbm)
    p[P_QPARTS] = hbm.pseudo_channels if hbm.partitioned_queues else 1
    p[P_FRONTEND] = int(round(hbm.frontend_latency_ns * 1000.0))
    p[P_TCK] = int(round(tck_ps))
    p[P_ACCEPT] = p[P_TCK]
    p[P_TXN_BYTES] = min(txn, hbm.interleave_bytes)
    p[P_MAX_OUT] = max_outstanding or dma.max_outstanding
    bytes_per_cycle = dma.bytes_per_cycle or float(txn)
    p[P_ISSUE_GAP] = int(round(p[P_TXN_BYTES] / bytes_per_cycle * period_ps))
    p[P_MODE] = MODES[mode]
    # The scheduler commits a request once the data bus is within this horizon, so a
    # row conflict on another bank can be prepared while the bus is busy.
    p[P_LOOKAHEAD] = p[P_TRP] + p[P_TRCD] + p[P_TCL]
    p[P_CAPACITY_BYTES] = int(hbm.capacity_gb * 2**30)
    p[P_LAT_BIN_PS] = max(1, int(math.ceil(tck_ps)))
    # attach: per_core = NpuSim-style distributed memory: each core's DMA reaches only its own
    # channel (addresses are channel-local); otherwise addresses interleave over all channels
    p[P_PRIVATE_CHANNELS] = int(hbm.attach == "per_core")
    p[P_DMA_ENGINES] = dma.engines
    if mode == "tlm" and arch.l2 is not None:
        _l2_params(p, arch, period_ps)
    return p, period_ps


def _l2_params(p: np.ndarray, arch: Arch, period_ps: float) -> None:
    """The L2's TLM parameters (see :mod:`npusim.hw.memory.hbm`, "L2")."""
    from npusim.errors import ConfigError

    l2 = arch.l2
    line = l2.line_bytes
    lines = int(l2.capacity_mb * 2**20) // line
    if lines > L2_MAX_LINES:
        raise ConfigError(f"{arch.name}: l2.capacity_mb {l2.capacity_mb:g} in lines of l2.line_bytes {line} is {lines:,} lines; "
                          f"the TLM cache holds at most {L2_MAX_LINES:,} (raise l2.line_bytes)")
    txn = int(p[P_TXN_BYTES])
    sectors = 1
    while sectors * 2 <= min(32, line // txn):  # a power of two: one valid bit per transaction, at most 32
        sectors *= 2
    p[P_L2_ON] = 1
    p[P_L2_LINE] = line
    p[P_L2_SECTOR] = line // sectors
    p[P_L2_WAYS] = l2.ways
    p[P_L2_SETS] = max(1, lines // l2.ways)
    p[P_L2_SLICES] = l2.slices
    # ps per byte of one slice (bandwidth_gbps / slices bytes per ns), and of one core's read port
    p[P_L2_SLICE_PSF] = max(1, round((1000.0 * l2.slices / l2.bandwidth_gbps) * (1 << L2_FIX)))
    if l2.core_bytes_per_cycle is not None:
        p[P_L2_CORE_PSF] = max(1, round(period_ps / l2.core_bytes_per_cycle * (1 << L2_FIX)))
        # one engine may use its core's whole L2 rate: it asks for a hit every transaction's time at it
        p[P_L2_HIT_GAP] = int(round(p[P_TXN_BYTES] * period_ps / l2.core_bytes_per_cycle))
    else:
        p[P_L2_HIT_GAP] = p[P_ISSUE_GAP]  # no L2 rate of its own: hits at the DMA port's rate
    p[P_L2_HIT_PS] = 0 if l2.hit_latency_ns is None else int(round(l2.hit_latency_ns * 1000.0))
    p[P_L2_WALLOC] = int(l2.write_allocate)


def unloaded_read_latency_ps(p: np.ndarray, row_state: str = "conflict") -> int:
    """Latency of one burst-sized read on an idle channel, by the open-row state of its bank.

    ``conflict`` (another row open): tRP + tRCD + tCL; ``closed``: tRCD + tCL; ``hit``: tCL;
    plus the fixed overheads: accept handshake is not on the path, the frontend latency
    is paid each way, and the burst's data transfer.
    """
    core = {"conflict": p[P_TRP] + p[P_TRCD] + p[P_TCL], "closed": p[P_TRCD] + p[P_TCL], "hit": p[P_TCL]}[row_state]
    return int(core + 2 * p[P_FRONTEND] + p[P_BURST_PS])
