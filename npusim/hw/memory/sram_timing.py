"""SRAM in the timing path: how much the core SRAM's ports stall the cube and the vector unit.

The compute models (:mod:`npusim.hw.compute.systolic`, :mod:`npusim.hw.compute.vector`) time
an op as if its operands always arrive: that stall-free closed form is the *analytical*
(cheap) memory fidelity, unchanged. At the *detailed* (TLM) memory fidelity an op's SRAM
traffic is served by the SRAM's ports, and the op stalls when it needs more bytes in a
phase than the ports supply in that phase's cycles (what SCALE-Sim's double-buffered
scratchpad does line by line: a demand line that the buffer cannot serve in its cycle
stalls the whole array, ``stall_cycles`` in its reports). Here the same supply/demand test
is a closed form evaluated once per op, per fold or per pass, not per cycle.

Supply (``sram_supply_bits``)
    ``banks * bytes_per_cycle_per_bank`` bytes per cycle (one port per bank, its width the
    arch's ``bytes_per_cycle_per_bank``, see :class:`npusim.arch.schema.Sram`), divided by
    the bank-conflict factor of the array's operand line in a packed tile
    (:func:`npusim.hw.memory.sram.sram_access_cost`: lines of ``rows * k_per_pe`` elements
    stored one after another; 1.0 whenever the lines spread evenly over the banks).
    Internally in bits per cycle, so int4 operands (half a byte) stay exact.

Demand of a GEMM (the traffic of :func:`npusim.hw.compute.systolic.gemm_cost`, split by fold)
    Folds run in order N-fold outer, K-fold inner (ws) or M-fold outer, N-fold inner (os);
    the last fold of each dimension is partial (fewer bytes, same cycles).

    * ws fold ``(n_i, k_i)`` with extents ``ke x ne``: weights ``ke*ne`` elements, loaded in
      the T_inj window; the stream ``M*ke`` A elements in, ``M*ne`` outputs out (partial sums
      at ``psum`` bytes unless it is the last K-fold, then C at ``out`` bytes), plus ``M*ne``
      partial sums read back unless it is the first K-fold; in the ``S + F`` window.
    * os fold ``(m_i, n_i)``: ``me*K`` A and ``K*ne`` B elements and ``me*ne`` C outputs.

    Serial folds (``double_buffer=False``): each phase lasts
    ``max(stall-free cycles, ceil(bytes / supply))``, i.e. ws fold =
    ``max(T_inj, ceil(W/sup)) + max(S+F, ceil(St/sup))``, os fold = ``max(S+F, ceil(D/sup))``.
    Double-buffered: the interval ``I = max(S, X)`` of fold f must also carry what overlaps it
    (ws: the next fold's weights; os: the previous fold's outputs draining), so interval f =
    ``max(I, ceil((St_f + W_{f+1}) / sup))`` (ws) or ``max(I, ceil((D_f + O_{f-1}) / sup))``
    (os); the exposed first weight load is ``max(T_inj, ceil(W_0/sup))``; the last fold's
    ``S + F`` carries its own stream (and, os, the last two output tiles). ``batch`` GEMMs
    continue the same sequence. With unlimited supply every ``max`` takes its first term and
    the result is exactly the closed form (a test checks).

Demand of a vector op (the passes of :mod:`npusim.hw.compute.vector`)
    A stream pass reads its inputs (1 per element; 2 for swiglu: gate and up; 3 for rope: x
    and the cos/sin tables) and writes one output per element; a reduction pass reads the
    elements and writes one scalar per row; a per-row pass reads and writes one scalar per
    row. Each pass takes ``startup + max(cycles, ceil(bytes / sup))``.

Assumptions and what is left out
    Fluid within a phase (the skew registers and FIFOs at the array edge absorb per-cycle
    burstiness; SCALE-Sim stalls per demand line, so where per-line demand is uneven it can
    stall a little more); the SRAM access latency is hidden by prefetching, as in the
    stall-free form (so zero stalls when the ports keep up); operands are in SRAM (DMA
    ordering is the engine's job); tiles are packed (a strided layout's bank conflicts are
    :func:`~npusim.hw.memory.sram.sram_access_cost`'s, not applied here). DMA traffic into and
    out of the SRAM competes for the same ports while the op runs: that part depends on what
    is in flight, so the simulation kernel adds it when the op starts
    (:mod:`npusim.sim.sramport`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
import numba
import numpy as np

from npusim.arch.schema import DTYPE_BYTES, Sram
from npusim.hw.compute.systolic import DATAFLOWS, dataflow_code, gemm_cost
from npusim.hw.compute.vector import DEFAULT_STARTUP_CYCLES, _pass_cycles, _passes, _throughputs
from npusim.hw.memory.sram import sram_access_cost

__all__ = ["GemmSramTiming", "VectorSramTiming", "gemm_sram_timing", "gemm_sram_array", "out_bits",
           "sram_supply_bits", "vector_sram_timing", "PSUM_BITS", "UNLIMITED"]

#: partial sums spilled between K-folds (fp32 / int32 accumulators), as gemm_cost's default
PSUM_BITS = 32
#: a supply no op can exceed (bits per cycle): the stall-free closed form
UNLIMITED = 2**62
_WS = 0


def out_bits(dtype: str) -> int:
    """Bits of a GEMM output element: bf16 for int8/int4/fp8 inputs (as the chip cost model),
    else the input dtype."""
    return 16 if dtype in ("int8", "int4", "fp8") else int(DTYPE_BYTES[dtype] * 8)


def elem_bits(dtype: str) -> int:
    return int(DTYPE_BYTES[dtype] * 8)


@lru_cache(maxsize=256)
def _conflict(banks: int, bpc: int, unit: int, latency: int, line_bytes: int) -> float:
    sram = Sram(capacity_mb=1, banks=banks, bytes_per_cycle_per_bank=bpc, bank_interleave_bytes=unit,
                access_latency_cycles=latency)
    count = max(1, banks * unit)  # covers every period of the bank sequence
    return max(1.0, sram_access_cost(sram, count, line_bytes, line_bytes).conflict_factor)


def sram_supply_bits(sram: Sram, line_bytes: int | None = None) -> int:
    """Bits per cycle the SRAM's ports deliver to a requester streaming ``line_bytes``-byte
    lines from a packed tile (None: conflict-free), at least 1."""
    raw = 8 * sram.banks * sram.bytes_per_cycle_per_bank
    if line_bytes is None or line_bytes <= 0:
        return raw
    f = _conflict(sram.banks, sram.bytes_per_cycle_per_bank, sram.bank_interleave_bytes,
                  sram.access_latency_cycles, int(line_bytes))
    return max(1, int(raw / f))


# --------------------------------------------------------------------------------------
# GEMM (numba: many shapes per program)
# --------------------------------------------------------------------------------------


@numba.njit(cache=True)
def _ph(window, bits, sup):
    """Cycles of a phase of ``window`` stall-free cycles that moves ``bits`` at ``sup`` bits/cycle
    (``UNLIMITED``: the window, even an empty one: T_inj = 0 means weights appear for free)."""
    if sup >= UNLIMITED:
        return window
    need = -(-bits // sup)
    return window if window >= need else need


@numba.njit(cache=True)
def _ws_fold(i, m, k, n, kr, kf, nf, cols, eb, ob, pb):
    """(weight bits, stream bits) of ws fold ``i`` (N-fold outer, K-fold inner)."""
    ni = i // kf
    ki = i - ni * kf
    ke = kr if ki < kf - 1 else k - (kf - 1) * kr
    ne = cols if ni < nf - 1 else n - (nf - 1) * cols
    st = m * ke * eb + m * ne * (ob if ki == kf - 1 else pb)
    if ki > 0:
        st += m * ne * pb
    return ke * ne * eb, st


@numba.njit(cache=True)
def _os_fold(i, m, k, n, rows, cols, mf, nf, eb, ob):
    """(operand bits, output bits) of os fold ``i`` (M-fold outer, N-fold inner)."""
    mi = i // nf
    ni = i - mi * nf
    me = rows if mi < mf - 1 else m - (mf - 1) * rows
    ne = cols if ni < nf - 1 else n - (nf - 1) * cols
    return (me * k + k * ne) * eb, me * ne * ob


@numba.njit(cache=True)
def _gemm_sram_core(m, k, n, rows, cols, df, kpe, t_inj, batch, double_buffer, eb, ob, pb, sup):
    """(cycles with SRAM stalls, SRAM bits moved) of ``batch`` GEMMs; see module docstring."""
    fd = rows + cols - 2
    if df == _WS:
        kr = rows * kpe
        kf = (k + kr - 1) // kr
        nf = (n + cols - 1) // cols
        folds = kf * nf
        s = m
        tl = t_inj
        x = t_inj
        mf = 0
    else:
        kr = 0
        kf = 0
        mf = (m + rows - 1) // rows
        nf = (n + cols - 1) // cols
        folds = mf * nf
        s = (k + kpe - 1) // kpe
        tl = 0
        x = rows
    bits = 0
    for i in range(folds):
        if df == _WS:
            a, b = _ws_fold(i, m, k, n, kr, kf, nf, cols, eb, ob, pb)
        else:
            a, b = _os_fold(i, m, k, n, rows, cols, mf, nf, eb, ob)
        bits += a + b
    bits *= batch
    if not double_buffer:
        per_copy = 0
        for i in range(folds):
            if df == _WS:
                w, st = _ws_fold(i, m, k, n, kr, kf, nf, cols, eb, ob, pb)
                per_copy += _ph(tl, w, sup) + _ph(s + fd, st, sup)
            else:
                d, o = _os_fold(i, m, k, n, rows, cols, mf, nf, eb, ob)
                per_copy += _ph(s + fd, d + o, sup)
        return per_copy * batch, bits
    iv = max(s, x)
    if df == _WS:
        w0, st0 = _ws_fold(0, m, k, n, kr, kf, nf, cols, eb, ob, pb)
        first = _ph(tl, w0, sup)
        inner = 0
        st = st0
        for i in range(folds - 1):
            wn, stn = _ws_fold(i + 1, m, k, n, kr, kf, nf, cols, eb, ob, pb)
            inner += _ph(iv, st + wn, sup)
            st = stn
        boundary = _ph(iv, st + w0, sup)  # last fold of a copy, the next copy's first weights
        final = _ph(s + fd, st, sup)
        return first + batch * inner + (batch - 1) * boundary + final, bits
    d0, o0 = _os_fold(0, m, k, n, rows, cols, mf, nf, eb, ob)
    if folds == 1:
        if batch == 1:
            return _ph(s + fd, d0 + o0, sup), bits
        return (_ph(iv, d0, sup) + (batch - 2) * _ph(iv, d0 + o0, sup)
                + _ph(s + fd, d0 + 2 * o0, sup)), bits
    dl, ol = _os_fold(folds - 1, m, k, n, rows, cols, mf, nf, eb, ob)
    mid = 0
    o_prev = o0
    for i in range(1, folds - 1):
        d, o = _os_fold(i, m, k, n, rows, cols, mf, nf, eb, ob)
        mid += _ph(iv, d + o_prev, sup)
        o_prev = o
    last = _ph(iv, dl + o_prev, sup)  # the last fold of a copy that is not the final one
    fin = _ph(s + fd, dl + o_prev + ol, sup)
    total = (_ph(iv, d0, sup) + (batch - 1) * _ph(iv, d0 + ol, sup) + batch * mid
             + (batch - 1) * last + fin)
    return total, bits


@numba.njit(cache=True)
def _gemm_sram_array(m, k, n, batch, rows, cols, df, kpe, t_inj, double_buffer, eb, ob, pb, sup):
    cyc = np.empty(m.shape[0], dtype=np.int64)
    bits = np.empty(m.shape[0], dtype=np.int64)
    for i in range(m.shape[0]):
        cyc[i], bits[i] = _gemm_sram_core(m[i], k[i], n[i], rows, cols, df, kpe, t_inj, batch[i],
                                          double_buffer, eb, ob, pb, sup)
    return cyc, bits


def gemm_sram_array(m, k, n, batch, rows: int, cols: int, dataflow: int, k_per_pe: int, t_inj: int,
                    double_buffer: bool, in_bits: int, out_bits_: int, supply_bits: int,
                    psum_bits: int = PSUM_BITS) -> tuple[np.ndarray, np.ndarray]:
    """(cycles with SRAM stalls, SRAM bits) of many GEMMs (int64 arrays; shapes already checked
    by :func:`npusim.hw.compute.systolic.gemm_cycles_array`)."""
    if int(dataflow) == DATAFLOWS["cube"]:
        raise ValueError("a cube (dataflow 'cube') reads its operands from L0A / L0B, not from an SRAM it "
                         "streams: set the core's sram.feeds_compute to false")
    arrs = [np.ascontiguousarray(x, dtype=np.int64).ravel() for x in np.broadcast_arrays(m, k, n, batch)]
    return _gemm_sram_array(arrs[0], arrs[1], arrs[2], arrs[3], np.int64(rows), np.int64(cols),
                            np.int64(dataflow), np.int64(k_per_pe), np.int64(t_inj), bool(double_buffer),
                            np.int64(in_bits), np.int64(out_bits_), np.int64(psum_bits),
                            np.int64(max(1, supply_bits)))


@dataclass(frozen=True)
class GemmSramTiming:
    """A GEMM at the detailed fidelity. ``cycles`` = ``stall_free_cycles`` + ``stall_cycles``;
    ``sram_bytes`` = every byte the array moved through the SRAM ports (gemm_cost's reads +
    writes); ``supply_bytes_per_cycle`` the ports' rate; ``port_utilization`` =
    ``sram_bytes / (cycles * supply)``, in [0, 1]."""

    cycles: int
    stall_free_cycles: int
    stall_cycles: int
    sram_bytes: float
    supply_bytes_per_cycle: float
    port_utilization: float


def gemm_sram_timing(m: int, k: int, n: int, rows: int, cols: int, dataflow: str | int, k_per_pe: int,
                     t_inj: int, sram: Sram | None, dtype: str = "fp16", batch: int = 1,
                     double_buffer: bool = False, out_dtype: str | None = None) -> GemmSramTiming:
    """One GEMM's timing with SRAM stalls (``sram=None``: unlimited supply, the closed form)."""
    df = dataflow_code(dataflow)
    eb = elem_bits(dtype)
    ob = out_bits(dtype) if out_dtype is None else elem_bits(out_dtype)
    base = gemm_cost(m, k, n, rows, cols, df, k_per_pe, t_inj, batch=batch,
                     double_buffer=double_buffer).cycles
    if df == DATAFLOWS["cube"]:  # a cube reads L0A / L0B, never an SRAM it streams itself: no stalls
        return GemmSramTiming(cycles=base, stall_free_cycles=base, stall_cycles=0, sram_bytes=0.0,
                              supply_bytes_per_cycle=0.0, port_utilization=0.0)
    if sram is None or not sram.feeds_compute:
        sup = UNLIMITED
    else:
        sup = sram_supply_bits(sram, max(1, rows * k_per_pe * eb // 8))
    cyc, bits = _gemm_sram_core(np.int64(m), np.int64(k), np.int64(n), np.int64(rows), np.int64(cols), np.int64(df),
                                np.int64(k_per_pe), np.int64(t_inj), np.int64(batch), bool(double_buffer),
                                np.int64(eb), np.int64(ob), np.int64(PSUM_BITS), np.int64(sup))
    cyc, bits = int(cyc), int(bits)
    supply = sup / 8
    util = bits / 8 / (cyc * supply) if cyc and sup < UNLIMITED else 0.0
    return GemmSramTiming(cycles=cyc, stall_free_cycles=base, stall_cycles=cyc - base, sram_bytes=bits / 8,
                          supply_bytes_per_cycle=supply if sup < UNLIMITED else math.inf, port_utilization=util)


# --------------------------------------------------------------------------------------
# vector unit
# --------------------------------------------------------------------------------------

#: input streams per element of a stream pass (default 1; a fused ``swiglu_quant`` charges its
#: quantisation's stream pass two inputs too, an over-count of one stream)
_STREAM_INPUTS = {"swiglu": 2, "swiglu_quant": 2, "rope": 3}


@dataclass(frozen=True)
class VectorSramTiming:
    """A vector op at the detailed fidelity (fields as :class:`GemmSramTiming`)."""

    cycles: int
    stall_free_cycles: int
    stall_cycles: int
    sram_bytes: float


def vector_sram_timing(op_class: str, elements: int, lanes: int, ops_per_cycle_per_lane=None,
                       supply_bits: int = UNLIMITED, *, elem_bits_: int = 16, row_len: int | None = None,
                       fn: str | None = None, ops_per_element: int = 1,
                       startup_cycles: int = DEFAULT_STARTUP_CYCLES) -> VectorSramTiming:
    """Cycles of a vector op whose passes are served by ``supply_bits`` per cycle (module
    docstring); ``stall_free_cycles`` equals :func:`npusim.hw.compute.vector.vector_cost`'s."""
    tp = _throughputs(ops_per_cycle_per_lane)
    recipe = _passes(op_class, fn, ops_per_element)
    row_len = row_len or elements
    rows = elements // row_len
    inputs = _STREAM_INPUTS.get(fn or op_class, 1)
    base = total = bits = 0
    sup = max(1, int(supply_bits))
    for _label, kind, ops in recipe:
        cyc, _ = _pass_cycles(kind, ops, tp, elements, rows, row_len, lanes)
        cyc = int(cyc)
        if kind == "stream":
            b = (inputs + 1) * elements * elem_bits_
        elif kind == "reduce":
            b = (elements + rows) * elem_bits_
        else:
            b = 2 * rows * elem_bits_
        bits += b
        base += startup_cycles + cyc
        total += startup_cycles + (cyc if sup >= UNLIMITED else max(cyc, -(-b // sup)))
    return VectorSramTiming(cycles=total, stall_free_cycles=base, stall_cycles=total - base, sram_bytes=bits / 8)
