"""Shape-aware cycle model of a systolic array running a GEMM.

Units: every time is in cycles of the array clock; every traffic figure in bytes.

Geometry and tiling
-------------------
The array has ``rows x cols`` PEs.  Every PE performs ``k_per_pe`` MACs per cycle
along the reduction (K) dimension (a dot product of length ``k_per_pe``), so a
128x128 fp16 array is ``k_per_pe=1`` and int8 on the same array ``k_per_pe=2``; an
Ascend-style 16x16x16 cube is ``rows=16, cols=16, k_per_pe=16`` (32 for int8).

The GEMM is ``C[M x N] = A[M x K] . B[K x N]`` (``batch`` independent copies).
Work is cut into *folds* (tiles that occupy the whole array once); the last fold
in each dimension is zero-padded (padding costs cycles, not traffic):

* ``ws`` (weight stationary): a fold pins a ``(rows*k_per_pe) x cols`` tile of B in
  the PEs and streams all ``M`` rows of A through it; the partial sums of the
  ``cols`` outputs flow down the columns.
  ``folds = ceil(K / (rows*k_per_pe)) * ceil(N / cols)``, stream length ``S = M``.
* ``os`` (output stationary): a fold pins a ``rows x cols`` tile of C in the PE
  accumulators and streams the whole K extent of A (from the left) and B (from the
  top).  ``folds = ceil(M / rows) * ceil(N / cols)``, ``S = ceil(K / k_per_pe)``.

Cycle convention (fill, drain, weight load, off-by-one)
-------------------------------------------------------
Operands enter skewed: PE(i, j) performs its t-th MAC of a fold in cycle
``t + i + j`` (cycle 0 = first cycle in which an operand of the fold is at the
array edge).  The last MAC is therefore in cycle ``(S-1) + (rows-1) + (cols-1)``,
and the fold's streaming phase lasts

    S + F  cycles,  F = (rows - 1) + (cols - 1)   (pipeline fill + drain skew)

(in WS ``rows - 1`` is the input skew across the rows and ``cols - 1`` the
propagation of the last input across the columns; in OS both are the operand
skew that delays the last PE).  This is exactly what SCALE-Sim v2/v3 simulate:
their per-fold demand matrices have ``T + R + C - 2`` rows for OS and
``2R + C + T - 2`` for WS (R rows of weight load first), with T = S.

**npusim counts durations, i.e. cycles inclusive of both ends** (a cycle index +
1).  For a 4x4x4 GEMM on a 4x4 output-stationary array that is ``4+4+4-2 = 10``
cycles; the "9 cycles" reported by SCALE-Sim and the ``K + H + W - 3`` per-fold
lookup-table formula are the 0-based *index* of the last cycle (SCALE-Sim 3.0.0
reports ``Total Cycles = max(serviced ofmap cycle)``, a 0-based index; see
``validation/README_scalesim.md``).  Counting durations is the only convention
that composes: two back-to-back 4x4x4 GEMMs take 20 cycles, not 18, and indeed
SCALE-Sim's deficit is one cycle per *layer*, never one per fold.

* Drain: results leave on a per-column output path.  In OS every PE of a column
  finishes on a different cycle (``i`` differs), so the column path carries them
  one per cycle without extra cycles; in WS the finished sums exit the bottom row
  as they are produced.  Hence no drain term beyond ``F`` (same as SCALE-Sim).
* Weight load (WS only): before a fold streams, its weight tile is shifted into
  the PEs, taking ``weight_injection_cycles`` = T_inj (the arch file's value,
  normally ``rows``: one PE row per cycle).  OS pins no weights: T_inj is
  ignored for ``os``.

Fold time and total (the NpuSim formula ``T = T_tile * N_tile + T_inj``,
generalised with fill/drain):

* serial (``double_buffer=False``, the default, identical per fold to SCALE-Sim):
      T_tile = T_inj + S + F            (T_inj = 0 for os)
      T      = N_tile * T_tile
* double-buffered (``double_buffer=True``): the next fold's weights are shifted
  into shadow registers while the current fold streams (WS), or the finished
  output tile is shifted out of shadow accumulators while the next fold computes
  (OS), so consecutive folds follow each other at the interval
      I      = max(S, X),   X = T_inj (ws) or rows (os, drain of R results/column)
      T      = T_inj + (N_tile - 1) * I + S + F
  i.e. NpuSim's ``T_tile * N_tile + T_inj`` with ``T_tile = I`` plus one exposed
  fill/drain ``S + F - I``.  Only the first weight tile's injection is exposed.

``N_tile = batch * folds``.  ``batch`` GEMMs run back to back exactly like extra
folds: serially (no overlap of fill/drain between GEMMs) in serial mode, as one
continuous stream (fill/drain overlapped between GEMMs too) when double-buffered.

Comparison with NpuSim's public code (NPU-SIM, ``matmul_forward.cpp``,
``PERFORMANCE_MODE``): it costs an X x Y array at
``(2X + max(M, X)) * ceil(K/X) * ceil(N/Y)`` cycles (weight load X + fill X +
stream M, M padded up to X, no horizontal skew, no separate T_inj); npusim adds
the ``cols - 1`` skew and does not pad M, which is SCALE-Sim's cycle-level
schedule; with ``weight_injection_cycles = rows`` the two differ per fold by
``cols - 2 - max(0, rows - M)`` cycles.

The ``cube`` dataflow (a 3-D MAC unit, the Ascend AI core's cube)
------------------------------------------------------------------
Not a skewed array: each cycle the unit multiplies one ``rows x k_per_pe`` fractal of A by one
``k_per_pe x cols`` fractal of B and adds the ``rows x cols`` product into an accumulator
buffer outside the PEs (Ascend's L0C), so there is no operand skew, no fill or drain and no
per-fold exchange: ``T = batch * ceil(M/rows) * ceil(N/cols) * ceil(K/k_per_pe)``, the
fractal count. Source: CANN's GEMM cycle model (ops-nn / CANN ``cache_tiling_cycle_model.cc``,
``GemmCycleModel::GetMadCycle``: ``m_l0 * k_l0 * n_l0`` 16-element fractals per MAD, times
``mad_expansion_rate_`` = 2 for FP32 over half the K of FP16's fractal -- a quarter of FP16's
rate per K element, as the presets' ``macs_per_pe_per_cycle`` say). Double buffering and the
weight injection do not apply. Its operands come from L0A / L0B, not from an SRAM the array
reads itself: an arch with this dataflow keeps ``sram.feeds_compute`` false. SRAM traffic is
counted as for ``os`` (A per column fold, B per row fold, C written once). Under the ``os``
model an Ascend fold of K < 256 (FP16), e.g. FlashAttention's ``Q K^T`` at head dim 128, was
charged the 16-cycle drain of a skewed array per 8 cycles of MACs: twice the cube's time.

SRAM traffic (bytes; unpadded elements only, zero padding is not read)
---------------------------------------------------------------------
* ws: A is re-read for every column fold: ``M*K*ceil(N/cols)`` elements; B is
  read once: ``K*N``.  With ``kf = ceil(K/(rows*k_per_pe))`` K-folds the output
  is accumulated in SRAM: ``(kf-1)`` partial-sum writes and reads of ``M*N``
  elements at ``psum_bytes_per_elem`` plus one final write of ``M*N`` at
  ``out_bytes_per_elem``.
* os: A is re-read per column fold (``M*K*ceil(N/cols)``), B per row fold
  (``K*N*ceil(M/rows)``); K is reduced in the PE accumulators so C is written
  once (``M*N`` at ``out_bytes_per_elem``), no partial sums.
All counts are multiplied by ``batch``.  These element counts equal SCALE-Sim's
SRAM IFMAP/Filter read counts for the same mapping.
"""

from __future__ import annotations

from dataclasses import dataclass

import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
import numba
import numpy as np

__all__ = [
    "DATAFLOWS",
    "GemmCost",
    "dataflow_code",
    "gemm_cost",
    "gemm_cycles_nb",
    "gemm_cycles_array",
]

#: dataflow name -> integer code used by the numba kernels
DATAFLOWS: dict[str, int] = {"ws": 0, "os": 1, "cube": 2}
_WS, _OS, _CUBE = 0, 1, 2


def dataflow_code(dataflow: str | int) -> int:
    """Return the integer code (0=ws, 1=os, 2=cube) of ``dataflow``; ValueError if unknown."""
    if isinstance(dataflow, (int, np.integer)) and not isinstance(dataflow, bool):
        if int(dataflow) in DATAFLOWS.values():
            return int(dataflow)
    elif isinstance(dataflow, str) and dataflow.lower() in DATAFLOWS:
        return DATAFLOWS[dataflow.lower()]
    raise ValueError(f"unknown dataflow {dataflow!r}; valid: {sorted(DATAFLOWS)} (codes 0, 1, 2)")


# --------------------------------------------------------------------------------------
# Core arithmetic.  Written once as plain Python and compiled by numba below, so the
# Python (gemm_cost) and numba (gemm_cycles_nb / gemm_cycles_array) paths cannot drift.
# --------------------------------------------------------------------------------------


def _fold_shape(m, k, n, rows, cols, df, k_per_pe):
    """(folds per GEMM, stream length S) of one GEMM; see module docstring."""
    col_folds = (n + cols - 1) // cols
    if df == _WS:
        return ((k + rows * k_per_pe - 1) // (rows * k_per_pe)) * col_folds, m
    return ((m + rows - 1) // rows) * col_folds, (k + k_per_pe - 1) // k_per_pe


def _cycles_core(m, k, n, rows, cols, df, k_per_pe, t_inj, batch, double_buffer):
    """Total cycles (see module docstring).  Self-contained so numba can compile it."""
    col_folds = (n + cols - 1) // cols
    if df == _WS:
        folds = ((k + rows * k_per_pe - 1) // (rows * k_per_pe)) * col_folds
        s = m
        t_load = t_inj          # weight tile shifted in before the fold streams
        exchange = t_inj        # shadow weight load hidden under the stream if S >= T_inj
    else:
        folds = ((m + rows - 1) // rows) * col_folds
        s = (k + k_per_pe - 1) // k_per_pe
        t_load = 0              # nothing stationary to load
        exchange = rows         # shadow accumulators drain R results per column
    n_tile = batch * folds
    if df == _CUBE:
        return n_tile * s       # one fractal a cycle, accumulated outside the PEs: no skew, no drain
    fill_drain = rows + cols - 2
    if double_buffer:
        interval = s if s > exchange else exchange
        return t_load + (n_tile - 1) * interval + s + fill_drain
    return n_tile * (t_load + s + fill_drain)


_cycles_core_jit = numba.njit(cache=True)(_cycles_core)


# --------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------


def _check_positive(**values) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
        if v <= 0:
            raise ValueError(f"{name} must be a positive integer, got {v}")


def _check_non_negative(**values) -> None:
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {v!r}")


# --------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GemmCost:
    """Cost of ``batch`` GEMMs (M,K,N) on one systolic array.

    Attributes (cycles are array-clock cycles, traffic in bytes):
        cycles: total cycles (see module docstring for the convention).
        macs: useful MACs, ``batch*m*k*n``.
        utilization: ``macs / (cycles * rows * cols * k_per_pe)``, in [0, 1].
        folds: number of array tiles executed, ``batch * folds_per_gemm``
            (= ``n_tile``).
        t_tile: cycles per fold in steady state (serial: ``t_inj + S + F``;
            double-buffered: ``max(S, exchange)``).
        n_tile: same as ``folds``.
        t_inj: weight-injection cycles per weight tile (0 for os).
        t_stream: stream length S of one fold.
        fill_drain: F = rows + cols - 2.
        sram_read_bytes / sram_write_bytes: operand and partial-sum SRAM traffic.
        a_read_elems, b_read_elems: A and B elements read from SRAM (re-reads
            across folds included).
        psum_elems: partial-sum elements written and read back between K-folds
            (ws; 0 for os).
        c_write_elems: final C elements written.
        formula: the instantiated formula, for logs.
    """

    m: int
    k: int
    n: int
    batch: int
    rows: int
    cols: int
    k_per_pe: int
    dataflow: str
    double_buffer: bool
    cycles: int
    macs: int
    utilization: float
    folds: int
    t_tile: int
    n_tile: int
    t_inj: int
    t_stream: int
    fill_drain: int
    sram_read_bytes: int
    sram_write_bytes: int
    a_read_elems: int
    b_read_elems: int
    psum_elems: int
    c_write_elems: int
    formula: str


def _sram_elems(m, k, n, rows, cols, df, k_per_pe):
    """SRAM element counts of one GEMM: (A reads, B reads, partial-sum round trips, C writes)."""
    col_folds = -(-n // cols)
    a_reads = m * k * col_folds
    if df == _WS:
        k_folds = -(-k // (rows * k_per_pe))
        return a_reads, k * n, m * n * (k_folds - 1), m * n
    return a_reads, k * n * -(-m // rows), 0, m * n


def gemm_cost(
    m: int,
    k: int,
    n: int,
    rows: int,
    cols: int,
    dataflow: str = "ws",
    k_per_pe: int = 1,
    weight_injection_cycles: int = 0,
    bytes_per_elem: int = 2,
    out_bytes_per_elem: int | None = None,
    *,
    batch: int = 1,
    double_buffer: bool = False,
    psum_bytes_per_elem: int = 4,
) -> GemmCost:
    """Cycles, utilisation and SRAM traffic of ``batch`` GEMMs A[m x k] . B[k x n].

    Args:
        m, k, n: GEMM dimensions (> 0).
        rows, cols: PE array shape (> 0).
        dataflow: ``"ws"``, ``"os"`` or ``"cube"`` (see module docstring).
        k_per_pe: MACs per PE per cycle along K for the operand dtype (> 0).
        weight_injection_cycles: T_inj, cycles to shift one weight tile into the
            array (arch file; normally ``rows``).  Ignored for ``os``.
        bytes_per_elem: bytes of an A/B element.
        out_bytes_per_elem: bytes of a C element (default: ``bytes_per_elem``).
        batch: number of independent GEMMs run back to back (> 0).
        double_buffer: overlap the next fold's weight load (ws) / the previous
            fold's output drain (os) with the current fold.
        psum_bytes_per_elem: bytes of a partial sum spilled to SRAM between
            K-folds in ws (default 4: fp32/int32 accumulators).

    Raises:
        ValueError: non-positive dimension, unknown dataflow, negative T_inj.
    """
    _check_positive(m=m, k=k, n=n, rows=rows, cols=cols, k_per_pe=k_per_pe, batch=batch,
                    bytes_per_elem=bytes_per_elem, psum_bytes_per_elem=psum_bytes_per_elem)
    _check_non_negative(weight_injection_cycles=weight_injection_cycles)
    if out_bytes_per_elem is None:
        out_bytes_per_elem = bytes_per_elem
    _check_positive(out_bytes_per_elem=out_bytes_per_elem)
    df = dataflow_code(dataflow)
    m, k, n, rows, cols, k_per_pe, batch = (int(x) for x in (m, k, n, rows, cols, k_per_pe, batch))
    t_inj_param = int(weight_injection_cycles)
    double_buffer = bool(double_buffer)

    cycles = _cycles_core(m, k, n, rows, cols, df, k_per_pe, t_inj_param, batch, double_buffer)
    folds, s = _fold_shape(m, k, n, rows, cols, df, k_per_pe)
    n_tile = batch * folds
    fill_drain = 0 if df == _CUBE else rows + cols - 2
    t_inj = t_inj_param if df == _WS else 0
    exchange = t_inj if df == _WS else rows
    if df == _CUBE:
        t_tile = s
        formula = f"T = N_tile*S = {n_tile}*{s} = {cycles} (cube: one fractal a cycle)"
    elif double_buffer:
        t_tile = max(s, exchange)
        formula = (f"T = T_inj + (N_tile-1)*max(S, X) + S + F = {t_inj} + ({n_tile}-1)*"
                   f"max({s}, {exchange}) + {s} + {fill_drain} = {cycles}")
    else:
        t_tile = t_inj + s + fill_drain
        formula = (f"T = N_tile*(T_inj + S + F) = {n_tile}*({t_inj} + {s} + {fill_drain})"
                   f" = {cycles}")
    macs = batch * m * k * n
    a_el, b_el, psum_el, c_el = (batch * x for x in _sram_elems(m, k, n, rows, cols, df, k_per_pe))
    reads = (a_el + b_el) * int(bytes_per_elem) + psum_el * int(psum_bytes_per_elem)
    writes = psum_el * int(psum_bytes_per_elem) + c_el * int(out_bytes_per_elem)
    return GemmCost(
        m=m, k=k, n=n, batch=batch, rows=rows, cols=cols, k_per_pe=k_per_pe,
        dataflow=next(name for name, code in DATAFLOWS.items() if code == df), double_buffer=double_buffer,
        cycles=cycles, macs=macs, utilization=macs / (cycles * rows * cols * k_per_pe),
        folds=n_tile, t_tile=t_tile, n_tile=n_tile, t_inj=t_inj, t_stream=s,
        fill_drain=fill_drain, sram_read_bytes=reads, sram_write_bytes=writes,
        a_read_elems=a_el, b_read_elems=b_el, psum_elems=psum_el, c_write_elems=c_el,
        formula=formula,
    )


@numba.njit(cache=True)
def gemm_cycles_nb(m, k, n, rows, cols, dataflow_code, k_per_pe, weight_injection_cycles,
                   batch=1, double_buffer=False):
    """numba version of ``gemm_cost(...).cycles`` (int64).

    ``dataflow_code``: 0 = ws, 1 = os, 2 = cube.  Raises ValueError on bad arguments.
    """
    if m <= 0 or k <= 0 or n <= 0 or rows <= 0 or cols <= 0 or k_per_pe <= 0 or batch <= 0:
        raise ValueError("gemm_cycles_nb: m, k, n, rows, cols, k_per_pe, batch must be > 0")
    if weight_injection_cycles < 0:
        raise ValueError("gemm_cycles_nb: weight_injection_cycles must be >= 0")
    if dataflow_code not in (0, 1, 2):
        raise ValueError("gemm_cycles_nb: dataflow_code must be 0 (ws), 1 (os) or 2 (cube)")
    return np.int64(_cycles_core_jit(np.int64(m), np.int64(k), np.int64(n), np.int64(rows),
                                     np.int64(cols), np.int64(dataflow_code),
                                     np.int64(k_per_pe), np.int64(weight_injection_cycles),
                                     np.int64(batch), double_buffer))


@numba.njit(cache=True)
def _cycles_array_kernel(m, k, n, rows, cols, df, k_per_pe, t_inj, batch, double_buffer):
    out = np.empty(m.shape[0], dtype=np.int64)
    for i in range(m.shape[0]):
        out[i] = _cycles_core_jit(m[i], k[i], n[i], rows, cols, df, k_per_pe, t_inj,
                                  batch[i], double_buffer)
    return out


def gemm_cycles_array(
    m_arr,
    k_arr,
    n_arr,
    rows: int,
    cols: int,
    dataflow: str | int = "ws",
    k_per_pe: int = 1,
    weight_injection_cycles: int = 0,
    *,
    batch=1,
    double_buffer: bool = False,
) -> np.ndarray:
    """Cycles of many GEMMs at once (int64 array of the broadcast shape of the inputs).

    ``m_arr``, ``k_arr``, ``n_arr`` and ``batch`` broadcast against each other; the
    array parameters are scalars.  Element i equals
    ``gemm_cost(m[i], k[i], n[i], rows, cols, ...).cycles``.
    """
    df = dataflow_code(dataflow)
    _check_positive(rows=rows, cols=cols, k_per_pe=k_per_pe)
    _check_non_negative(weight_injection_cycles=weight_injection_cycles)
    m, k, n, b = np.broadcast_arrays(*(np.asarray(x) for x in (m_arr, k_arr, n_arr, batch)))
    shape = m.shape
    flat = []
    for name, arr in (("m", m), ("k", k), ("n", n), ("batch", b)):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must be integers, got dtype {arr.dtype}")
        if arr.size and arr.min() <= 0:
            raise ValueError(f"all {name} must be positive, got min {arr.min()}")
        flat.append(np.ascontiguousarray(arr, dtype=np.int64).ravel())
    out = _cycles_array_kernel(flat[0], flat[1], flat[2], np.int64(rows), np.int64(cols),
                               np.int64(df), np.int64(k_per_pe),
                               np.int64(weight_injection_cycles), flat[3], bool(double_buffer))
    return out.reshape(shape)
