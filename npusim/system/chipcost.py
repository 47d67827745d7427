"""Chip costs: how long an op takes on one chip (or a share of its cores), from the chip simulator.

The system level never reaches into a chip: it asks a :class:`ChipCost` "how long does this GEMM /
op / small graph take on this chip, at this fidelity, on this share of its cores?" and gets a
:class:`ChipCostResult`. Each answer comes from running the chip simulator below once
(a :class:`~npusim.sim.program.Program` of engine tasks timed by the systolic, vector, HBM and NoC
models on a :class:`~npusim.sim.Simulator`) and is memoised in memory and on disk, so a 384-NPU run
pays one simulation per distinct shape.

Units: ``time_us`` microseconds; ``cycles`` core clock cycles; bytes; ``*_gbps`` 10**9 bytes/s;
``tflops`` 10**12 operations/s (for INT8 that is TOPS); FLOPs count a multiply-add as 2.
Utilisations are fractions in [0, 1]: ``compute_utilization`` of the whole chip's peak for the
dtype, ``share_compute_utilization`` of the peak of the cores in the share.

**Core shares.** ``cores=None`` is the whole chip; ``cores=16`` the first 16 cores along a snake
path through the mesh rows (so consecutive cores are mesh neighbours); a list gives explicit core
ids. On the Ascend presets a modelled core is one cube core with its two vector cores, so
``cores=16`` of a 910C die is 16 cube + 32 vector cores (see ``arch/ascend-910c-die.yaml``). A
share is timed alone on the chip: by default it may use all of the chip's HBM bandwidth;
``hbm_fraction`` (0, 1] scales every channel's bandwidth for a stream that shares HBM with others
(the system level decides what share the concurrent streams get).

**GEMM** (:meth:`ChipCost.gemm`): the GEMM kernel of :mod:`npusim.mapping.gemm_kernel` (its
docstring states the kernel and its assumptions): planned for the share by its ``Planner``, its tasks
emitted by ``emit_gemm`` into a fresh program and simulated alone. The chip mapper lowers a GEMM op
with the same plan and emitter on a die with the arch's ``kernel.base_blocks`` for its dtype, so
``ChipCost.op(op, spec=...)`` and ``npusim run --forward`` time the same tiles there.

**Vector operators** (:meth:`ChipCost.vector`, and :meth:`ChipCost.op` for a ``vector`` op): as an
operator runtime runs one (Ascend's AIV kernels), the op's rows are split evenly over the share's
cores (whole rows; elementwise ops are rows of one element); each core streams its rows from HBM
in chunks of a quarter of its buffer (MTE2 on the core's DMA engines), runs the vector model on each
chunk (two buffers: a chunk loads while the one before computes) and writes the result back (MTE3;
``quantize`` and the fused norm/SwiGLU + quantisation classes: INT8 plus a 4-byte scale per row;
else the input dtype). It reads every full-size input (:func:`_vector_inputs`: an elementwise op's
graph inputs -- a residual Add's two --, a SwiGLU's gate and up, whose ``elements`` are its
outputs; else one: a norm's gamma is not charged). A ``copy`` (a tensor move) has no compute:
each chunk's write follows its load. With the arch's ``kernel`` section (Ascend: a modelled core
is one AIC and ``vector_cores_per_core`` = 2 AIVs): every working core first runs ``start_us`` and
the AIVs' prologue, ``vector_setup_us`` (the prologue when the kernel launches every AIV of the die)
times the share a kernel launching fewer pays
(:func:`~npusim.hw.compute.vector_kernel.launched_aivs`, :func:`~npusim.hw.compute.vector_kernel.setup_share`:
the prologue grows with the AIVs started); the rows are split over every AIV of the share as the vendor kernels' tilings
split them (``ceil(rows / AIVs)`` whole rows each, :func:`~npusim.hw.compute.vector_kernel.split_rows`),
a core's chunk is one UB loop of each of its AIVs, with the loop's rows and the input and output
queues' depths of the op's reference kernel (:func:`~npusim.hw.compute.vector_kernel.ub_tiling`:
RmsNorm single-buffered, DynamicQuant a double-buffered input and a single output; else two buffers
of input and output in ``ub_kb``): a loop's load waits for the compute ``in_buffers`` loops back and
its compute for the write ``out_buffers`` loops back (each AIV writes its own rows back: a loop's
write is split over the core's DMA engines, as its load is); an AddRmsNorm (``rmsnorm`` with
``fn="add"``) reads x1 and x2 and writes x and y; ``resident_inputs`` reads inputs the op before
left in the L2 from it, ``absorb_writes`` keeps the output in a write-back L2 with room
(:meth:`ChipCost.vector`); and with
``vector_cycles_per_repeat`` a chunk's compute is its busiest AIV's rows (the core's AIVs take them
evenly) timed from the instructions of the op's reference kernel at the AIV's vector width and
each instruction's start (:func:`~npusim.hw.compute.vector_kernel.aiv_tile_cycles`) instead of the
lane model. An InterleaveRope (``rope`` with ``fn="interleave"``, its row one batch's ``N x S x 64``
elements) runs as its tiling splits it (:func:`~npusim.hw.compute.vector_kernel.interleave_rope_split`:
by batch, or by heads with every block walking every batch), one loop per batch (or per loop of a
batch's heads), every queue single-buffered, each loop also loading that batch's cos and sin
(2 x 64 elements) from HBM; the AIVs it launches are its blocks (charged at the batches up to the
die's AIVs on the batch split, so the prologue never falls as the batches grow), and from the batches
where the tiling switches from the heads split to the batch split (which the vendor kernel may run
faster) its time is held at least at the last batch count of the heads split (never faster as B grows).

**Ops and graphs** (:meth:`ChipCost.op`, :meth:`ChipCost.graph`): a ``gemm`` op goes through the
GEMM kernel above (``batch x m`` rows against one weight, or ``batch`` products with their own
operands when ``weight_batched`` / not a weight), a ``vector`` op through the vector operator
above. Any other op (attention, ``moe``), and graphs, go through the
project's mapper (:func:`npusim.mapping.mapper.map_model`) onto the share, by default tensor
parallel over all of its cores with weights and KV cache streamed from HBM (the system level keeps
a die's weights in HBM, not in core SRAM); the mapper's model applies (activations start and end
in SRAM, collectives over the NoC; standard attention is split as the FlashAttention kernel splits it,
over (sequence, head, query block) units or, for decode, (sequence, KV head) units with split KV,
:mod:`npusim.mapping.flash_attention`; MLA keeps the head-parallel / split-KV lowering, so with its
single latent KV head every core of a head-parallel share reads the whole KV cache; its L2 hits -- attention's shared KV re-reads,
the cube/vector hand-off -- are the reuse model's at the analytical fidelity; at ``memory="tlm"``
the shared KV re-reads are DMAs the simulator's TLM L2 serves, :func:`~npusim.mapping.mapper.map_model`
``l2_addressed``). Pass ``spec`` to map differently (a ``gemm`` op
with a ``spec`` goes through the mapper too: on a die with ``kernel.base_blocks`` for its dtype the
mapper runs the GEMM kernel above on the TP group's cores, so the time is :meth:`ChipCost.gemm`'s on
those cores; elsewhere the mapper's TP lowering). A single attention op is one kernel: with the arch's
``kernel`` section its device-side start (``start_us``) is added once to the mapped program's time
(``kernel_start_us``; no prologue: the mapper's attention holds its own cube and vector work); a
single GEMM op the mapper runs as the die's kernel holds its start and prologue (``kernel_fixed_us``
as :meth:`ChipCost.gemm`'s); a ``moe`` op and graphs are several kernels: the mapper models the
starts of the GEMM kernels among them (not counted in ``kernel_fixed_us``), no other.

**Cache.** Results are memoised by (chip arch content — its hardware (its L2 too), not its name —, op kind,
shapes, dtype, memory and NoC fidelity, ideal L2 rate, core share, HBM fraction, mapping spec) in
memory and in one JSON file per result under ``cache_dir`` (default ``$NPUSIM_CACHE_DIR/chipcost``,
else ``$XDG_CACHE_HOME/npusim/chipcost`` or ``~/.cache/npusim/chipcost``), written atomically
(:func:`npusim.files.atomic_path`). The key includes a digest of the npusim sources that define the
chip model (engine, hw, sim, mapping, comm, arch, config, model IR and this file), so editing the
model invalidates every cached answer (old entries live in a directory named by the old digest and
are never read again; delete them at will). An unreadable or mismatching file is a miss.
:attr:`ChipCost.stats` counts memory hits, disk hits and misses.

Cost (``validation/perf/bench_chipcost.py``, ascend-910c-die, INT8, 2-CPU AMD EPYC): loading the
Numba kernel once per process ~0.2 s (when its cache is warm); a miss at the analytical fidelities
0.02-0.3 s for DeepSeek-V3 per-die GEMMs (m = 96..16384 tokens, n x k up to 7168 x 4096, or 7168 x
18432 up to m = 4096), 0.9 s for the largest (16384 x 7168 x 18432); at ``memory="tlm"`` (every
64-byte HBM transaction) 0.4-4 s for decode shapes and 13-150 s for prefill shapes. A memory hit
costs ~13 us, a disk hit ~0.3 ms.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from npusim.arch.derived import summarize
from npusim.arch.schema import DTYPE_BYTES, Arch
from npusim.config import validate
from npusim.errors import ConfigError
from npusim.files import write_json
from npusim.hw.compute.vector import quantizes
from npusim.hw.compute.vector_kernel import (INTERLEAVE_HEAD, UbTiling, aiv_tile_cycles, interleave_rope_split, is_copy,
                                              launched_aivs, setup_share, softmax_chunks, split_rows, ub_tiling)
from npusim.hw.memory import l2 as l2_model
from npusim.hw.memory.params import MODES as MEMORY_MODES
from npusim.mapping.gemm_kernel import (MB, Emitter, GemmPlan, Planner, _blocks, _cdiv, _nbytes, _split,
                                        check_swizzle, check_tile, default_out_dtype, emit_gemm, gemm_dims,
                                        head_cycles, kernel_fixed_cycles, kernel_name, runs_kernel)
from npusim.model.ir import Graph, Op
from npusim.sim.kernel import KIND_DMA
from npusim.sim.program import Program
from npusim.sim.simulator import NOC_MODES, Simulator

KEY_VERSION = 1
_PACKAGE = Path(__file__).resolve().parents[1]
# what defines the chip model: a change to any of these invalidates cached costs
MODEL_SOURCES = ("engine", "hw", "sim", "mapping", "comm", "arch", "config.py", "model/ir.py",
                 "system/chipcost.py")


# -- keys and digests -------------------------------------------------------------------------

@lru_cache(maxsize=1)
def code_digest() -> str:
    """Digest of the npusim sources that define the chip model (see ``MODEL_SOURCES``)."""
    h = hashlib.blake2b(digest_size=12)
    for entry in MODEL_SOURCES:
        path = _PACKAGE / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(f.relative_to(_PACKAGE).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def arch_digest(arch: Arch) -> str:
    """Digest of a chip's hardware (its name and description do not count)."""
    data = arch.model_dump(mode="json", exclude={"name", "description"})
    return hashlib.blake2b(json.dumps(data, sort_keys=True).encode(), digest_size=12).hexdigest()


def default_cache_dir() -> Path:
    """``$NPUSIM_CACHE_DIR/chipcost``, else ``$XDG_CACHE_HOME/npusim/chipcost``, else ``~/.cache/...``."""
    root = os.environ.get("NPUSIM_CACHE_DIR")
    if root:
        return Path(root).expanduser() / "chipcost"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "npusim" / "chipcost"


# -- results --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChipCostResult:
    """The cost of one op on a chip (share). See the module docstring for units."""

    kind: str  # gemm | op | graph
    name: str
    arch: str
    dtype: str
    memory_fidelity: str
    noc_fidelity: str
    cores: int  # cores in the share
    cores_used: int  # cores that got work
    chip_cores: int
    hbm_fraction: float
    cycles: int
    time_us: float
    flops: int
    tflops: float
    compute_utilization: float  # of the whole chip's peak for the dtype
    share_compute_utilization: float  # of the share's peak
    peak_tflops_chip: float
    peak_tflops_share: float
    hbm_bytes: int  # moved by the model (read + written)
    hbm_read_bytes: int
    hbm_write_bytes: int
    min_hbm_bytes: int  # compulsory: GEMM A, B read and C written once; mapper: weights and cached KV once
    l2_read_bytes: int  # loads served by the L2 (the arch's, or the ideal one; 0 without one)
    l2_hit_rate: float  # of the bytes loaded, the fraction the L2 served (GEMMs; mapper ops: attention's KV re-reads)
    hbm_bandwidth_gbps: float  # hbm_bytes / time
    hbm_peak_bandwidth_gbps: float  # the chip's (times hbm_fraction)
    hbm_utilization: float
    tasks: int
    mapping: str  # what the kernel / mapper did, for people
    plan: tuple = ()  # GEMM: (pb, pm, pn, pk, tile_m, tile_n, k_chunk, reuse); else ()
    sram_stall_cycles: int = 0  # compute cycles lost to the SRAM ports, summed over tasks (TLM memory only)
    kernel_start_us: float = 0.0  # the device-side kernel start inside time_us (the arch's kernel.start_us; 0: none)
    kernel_fixed_us: float = 0.0  # the start and the cores' prologue inside time_us (what a kernel pays before any work)

    @property
    def work_us(self) -> float:
        """``time_us`` without the kernel's start and the cores' prologue: the op's time as part of a
        larger fused kernel (a collective's reduction step, a MoE dispatch's local work), which pays
        its own start once."""
        return self.time_us - self.kernel_fixed_us

    def to_dict(self) -> dict:
        d = asdict(self)
        d["plan"] = list(self.plan)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ChipCostResult:
        names = {f.name for f in fields(cls)}
        if set(d) != names:
            raise ValueError(f"fields differ: {sorted(set(d) ^ names)}")
        return cls(**{**d, "plan": tuple(d["plan"])})


@dataclass
class CacheStats:
    """Lookups answered from memory, from disk, and by simulating (misses); ``miss_seconds`` is the
    wall time the misses took (for benchmarks; never part of a result)."""

    memory_hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    disk_writes: int = 0
    miss_seconds: float = 0.0

    @property
    def hits(self) -> int:
        return self.memory_hits + self.disk_hits

    @property
    def lookups(self) -> int:
        return self.hits + self.misses

    def as_dict(self) -> dict:
        return {**asdict(self), "hits": self.hits, "lookups": self.lookups}


def _vector_inputs(op: Op) -> int:
    """Full-size tensors a vector op streams in per element: a SwiGLU's gate and up (its elements are
    its outputs); an elementwise op's graph inputs (a residual Add's two; at least one); else one
    (a norm's or quantisation's per-row or per-column parameters are not charged)."""
    if op.fn == "swiglu" or op.op_class == "swiglu_quant":
        return 2
    if op.op_class == "elementwise":
        return max(1, len(op.inputs))
    if _adds_residual(op):  # AddRmsNorm: x1 and x2
        return 2
    return 1


def _vector_out_bytes(op: Op, e_in: float) -> float:
    """Bytes a vector op writes per element of its rows: INT8 for the quantisations (their 4-byte
    scale per row aside), x and y for an AddRmsNorm, else its input dtype."""
    if quantizes(op.op_class):
        return 1.0
    return 2 * e_in if _adds_residual(op) else e_in


def _adds_residual(op: Op) -> bool:
    """An AddRmsNorm (``rmsnorm`` with ``fn="add"``): it reads x1 and x2 and writes their sum x beside
    the norm's y (ops-nn ``add_rms_norm``; :data:`npusim.hw.compute.vector_kernel.RECIPES`)."""
    return op.op_class == "rmsnorm" and op.fn == "add"



# -- the interface ---------------------------------------------------------------------------------

def _snake_cores(arch: Arch) -> list[int]:
    w, h = arch.cores.grid.width, arch.cores.grid.height
    return [y * w + (x if y % 2 == 0 else w - 1 - x) for y in range(h) for x in range(w)]


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


class ChipCost:
    """Chip costs from the chip simulator, memoised (see the module docstring).

    ``arch``: an :class:`~npusim.arch.schema.Arch`, or a preset name / arch file.
    ``memory``: HBM fidelity, ``analytical`` (default) or ``tlm``; ``noc``: ``analytical``
    (default), ``path`` or ``flit``. ``cache_dir``: where results persist (default
    :func:`default_cache_dir`); ``persist=False`` keeps them in memory only. At ``memory="tlm"`` on
    a chip with an L2 the simulator's transaction-level cache serves the GEMM's re-reads (its loads
    read real addresses); ``l2_cache=False`` keeps the reuse-distance model there instead (an
    ablation).
    """

    def __init__(self, arch: Arch | str | Path, memory: str = "analytical", noc: str = "analytical",
                 cache_dir: str | Path | None = None, persist: bool = True,
                 l2_bytes_per_cycle: float | None = None, l2_cache: bool = True):
        if not isinstance(arch, Arch):
            from npusim.arch import load_arch
            arch = load_arch(arch)
        if memory not in MEMORY_MODES:
            raise ConfigError(f"memory fidelity '{memory}': expected one of {sorted(MEMORY_MODES)}")
        if noc not in NOC_MODES:
            raise ConfigError(f"NoC fidelity '{noc}': expected one of {list(NOC_MODES)}")
        if l2_bytes_per_cycle is not None and not (isinstance(l2_bytes_per_cycle, (int, float))
                                                   and l2_bytes_per_cycle > 0):
            raise ConfigError(f"l2_bytes_per_cycle must be a positive number, got {l2_bytes_per_cycle!r}")
        self.arch, self.memory, self.noc = arch, memory, noc
        self.l2 = None if l2_bytes_per_cycle is None else float(l2_bytes_per_cycle)
        # at memory="tlm", False keeps the reuse-distance L2 beside the TLM HBM (an ablation that
        # isolates what the transaction-level cache changes; validation/l2_tlm_vs_reuse.py)
        self.l2_cache = bool(l2_cache)
        self.persist = persist
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.stats = CacheStats()
        self._code = code_digest()
        self._arch_key = arch_digest(arch)
        self._memo: dict[str, ChipCostResult] = {}
        self._summary = summarize(arch)
        self._variants: dict[float, Arch] = {1.0: arch}

    # -- public -----------------------------------------------------------------------------------
    def gemm(self, m: int, k: int, n: int, dtype: str = "bf16", cores: int | Sequence[int] | None = None, *,
             batch: int = 1, out_dtype: str | None = None, hbm_fraction: float = 1.0,
             name: str | None = None, kernel: str | None = None, tile: Sequence[int] | None = None,
             swizzle: Sequence[int] | None = None) -> ChipCostResult:
        """``batch`` GEMMs ``[m x k] . [k x n]`` spread over the share, operands from HBM, results
        to HBM (see the module docstring for the kernel). ``kernel``: the base-block kernel
        (:data:`npusim.mapping.gemm_kernels.KERNELS`) on a die with ``kernel.base_blocks``; None: the
        arch's ``kernel.gemm_default``. ``tile`` (m, n, k) and ``swizzle`` (offset, direction): the
        kernel's base block and block order as a source states them (CATLASS's ``L1TileShape`` and
        ``GemmIdentityBlockSwizzle``), instead of the arch's and the kernel's tiling rule."""
        m, k, n, batch = (_positive_int(lbl, v) for lbl, v in (("m", m), ("k", k), ("n", n), ("batch", batch)))
        out_dtype = out_dtype or default_out_dtype(dtype)
        for lbl, d in (("dtype", dtype), ("out_dtype", out_dtype)):
            if d not in DTYPE_BYTES:
                raise ConfigError(f"{lbl} '{d}': expected one of {list(DTYPE_BYTES)}")
        kernel = kernel_name(self.arch, kernel)
        share = self._share(cores)
        frac = self._fraction(hbm_fraction)
        key = {"kind": "gemm", "m": m, "k": k, "n": n, "batch": batch, "dtype": dtype, "out_dtype": out_dtype,
               "kernel": kernel}
        if (tile is not None or swizzle is not None) and not runs_kernel(self.arch, dtype):
            raise ConfigError(f"tile / swizzle: {self.arch.name} has no base-block GEMM kernel for {dtype} "
                              "(its arch's kernel.base_blocks)")
        if tile is not None:
            tile = check_tile(self.arch, share, dtype, tile)
            key["tile"] = list(tile)
        if swizzle is not None:
            swizzle = check_swizzle(swizzle)
            key["swizzle"] = list(swizzle)
        label = name or f"gemm {f'{batch}x' if batch > 1 else ''}{m}x{k}x{n} {dtype}"
        return self._lookup(key, share, frac, label, lambda: self._run_gemm(m, k, n, batch, dtype, out_dtype,
                                                                            share, frac, label, kernel, tile, swizzle))

    def plan_gemm(self, m: int, k: int, n: int, dtype: str = "bf16", cores: int | Sequence[int] | None = None, *,
                  batch: int = 1, out_dtype: str | None = None, hbm_fraction: float = 1.0,
                  kernel: str | None = None) -> list[GemmPlan]:
        """The candidate plans :meth:`gemm` simulates (it keeps the fastest), best estimate first;
        nothing is simulated or cached here."""
        m, k, n, batch = (_positive_int(lbl, v) for lbl, v in (("m", m), ("k", k), ("n", n), ("batch", batch)))
        share = self._share(cores)
        frac = self._fraction(hbm_fraction)
        planner = Planner(self.arch, share, dtype, out_dtype or default_out_dtype(dtype), frac, self.l2,
                           kernel_name(self.arch, kernel))
        return planner.candidates(m, k, n, batch, len(share))

    def op(self, op: Op, cores: int | Sequence[int] | None = None, *, spec=None,
           hbm_fraction: float = 1.0) -> ChipCostResult:
        """One model op on the share: GEMMs by :meth:`gemm`, anything else by the mapper."""
        if not isinstance(op, Op):
            raise ConfigError(f"op must be an npusim.model.ir.Op, got {type(op).__name__}")
        if op.kind == "gemm" and spec is None:
            m, k, n, batch = gemm_dims(op)
            return self.gemm(m, k, n, op.dtype, cores, batch=batch, hbm_fraction=hbm_fraction, name=op.name)
        if op.kind == "vector" and spec is None:
            return self.vector(op, cores, hbm_fraction=hbm_fraction)
        phase = "decode" if op.kind == "attention" and op.q_len == 1 else "prefill"
        graph = Graph(op.name, [replace(op, inputs=())], phase=phase,
                      batch=max(1, op.batch if op.kind == "attention" else 1))
        return self.graph(graph, cores, spec=spec, hbm_fraction=hbm_fraction, _kind="op")

    def vector(self, op: Op, cores: int | Sequence[int] | None = None, *, hbm_fraction: float = 1.0,
               resident_inputs: int = 0, absorb_writes: bool = False,
               inputs_bypass_l2: bool = False) -> ChipCostResult:
        """One vector operator on the share (see the module docstring): its rows split evenly over
        the cores, each streaming its rows from HBM through its buffer and back. ``resident_inputs``:
        how many of its full-size inputs (the first ones) the op before it wrote and the L2 still
        holds (in a model's run: the previous kernel's output); they are read from the L2 when
        together within its capacity, else from HBM. ``absorb_writes``: the L2 has room for the op's
        output (a kernel run alone: the write-back L2 holds no earlier dirty lines), so its writes
        stay in the L2 when the output and the inputs the L2 allocates (none with
        ``inputs_bypass_l2``: the kernel's loads skip the L2) fit its capacity, else reach HBM."""
        if not isinstance(op, Op) or op.kind != "vector":
            raise ConfigError("vector() needs an npusim.model.ir.Op of kind 'vector'")
        if isinstance(resident_inputs, bool) or not isinstance(resident_inputs, int) or resident_inputs < 0:
            raise ConfigError(f"resident_inputs must be a count >= 0, got {resident_inputs!r}")
        share = self._share(cores)
        frac = self._fraction(hbm_fraction)
        resident = self._resident_inputs(op, resident_inputs)
        absorbed = bool(absorb_writes) and self._absorbs_writes(op, bool(inputs_bypass_l2))
        key = {"kind": "vector", "op_class": op.op_class, "elements": op.elements, "row_len": op.row_len,
               "fn": op.fn, "dtype": op.dtype, "inputs": _vector_inputs(op)}
        if resident:
            key["resident_inputs"] = resident
        if absorbed:
            key["writes_in_l2"] = True
        res = self._lookup(key, share, frac, op.name, lambda: self._run_vector(op, share, frac, resident, absorbed))
        split = self._interleave_split(op, share)
        if split is not None and split.axis == "batch" and split.switch > 1:
            # the tiling switched from the heads split to the batch split at ``switch`` batches: never
            # faster than the heads split's last batch count (the vendor kernel may be; not claimed)
            below = self.vector(replace(op, elements=(split.switch - 1) * op.row_len), cores, hbm_fraction=hbm_fraction,
                                resident_inputs=resident_inputs, absorb_writes=absorb_writes,
                                inputs_bypass_l2=inputs_bypass_l2)
            if below.time_us > res.time_us:
                seconds = below.time_us / 1e6
                bw = res.hbm_bytes / seconds / 1e9
                res = replace(res, cycles=below.cycles, time_us=below.time_us, hbm_bandwidth_gbps=bw,
                              hbm_utilization=bw / res.hbm_peak_bandwidth_gbps if res.hbm_peak_bandwidth_gbps else 0.0,
                              mapping=res.mapping + f"; held at its {split.switch - 1}-batch heads-split time "
                                                    "(never faster across the tiling's switch)")
        return res

    def _interleave_split(self, op: Op, share: list[int]):
        """The InterleaveRope tiling (:func:`~npusim.hw.compute.vector_kernel.interleave_rope_split`) of
        ``op`` on ``share`` when it is one (``rope`` with ``fn="interleave"``) and the arch has the vector
        kernel's tiling (``kernel.ub_kb``), else None; its row must be whole heads of 64."""
        kc = self.arch.kernel
        if op.op_class != "rope" or op.fn != "interleave" or kc is None or kc.ub_kb is None:
            return None
        row = op.row_len or 0
        if row <= 0 or row % INTERLEAVE_HEAD or op.elements % row:
            raise ConfigError(f"{op.name}: an InterleaveRope's row_len is one batch's N x S x {INTERLEAVE_HEAD} "
                              f"elements and its elements whole batches; got row_len {op.row_len}, "
                              f"elements {op.elements}")
        return interleave_rope_split(op.elements // row, row // INTERLEAVE_HEAD, len(share) * kc.vector_cores_per_core,
                                     kc.ub_kb * 1024)

    def _absorbs_writes(self, op: Op, bypass: bool) -> bool:
        """Whether a write-back L2 with room keeps ``op``'s whole output (:meth:`vector`): the output
        and the input bytes it allocates (none when the loads bypass it) within its capacity."""
        if self.arch.l2 is None or not self.l2_cache:
            return False
        e = DTYPE_BYTES[op.dtype]
        out = _nbytes(op.elements, _vector_out_bytes(op, e))
        ins = 0 if bypass else _nbytes(op.elements, e * _vector_inputs(op))
        return out + ins <= l2_model.capacity_bytes(self.arch.l2)

    def _resident_inputs(self, op: Op, wanted: int) -> int:
        """Inputs of ``op`` read from the L2 (:meth:`vector`): ``wanted`` of them (at most its inputs)
        when their bytes fit the L2's capacity (the reuse model's rule: a re-read within the capacity
        hits, :func:`npusim.hw.memory.l2.hit_bytes`), else 0; 0 on a chip without an L2."""
        n = min(wanted, _vector_inputs(op))
        if not n or self.arch.l2 is None or not self.l2_cache:
            return 0
        nbytes = _nbytes(op.elements, DTYPE_BYTES[op.dtype]) * n
        hit = l2_model.hit_bytes([l2_model.Reread(nbytes, nbytes)], l2_model.capacity_bytes(self.arch.l2))
        return n if hit else 0

    def graph(self, graph: Graph, cores: int | Sequence[int] | None = None, *, spec=None,
              hbm_fraction: float = 1.0, _kind: str = "graph") -> ChipCostResult:
        """A small graph (e.g. a layer's per-die share) mapped by the mapper onto the share."""
        from npusim.mapping.mapper import op_class
        from npusim.mapping.spec import MappingSpec

        if not isinstance(graph, Graph) or not graph.ops:
            raise ConfigError("graph must be an npusim.model.ir.Graph with at least one op")
        share = self._share(cores)
        frac = self._fraction(hbm_fraction)
        if spec is None:
            spec = validate(MappingSpec, {
                "name": "chipcost", "tensor_parallel": {"degree": len(share)}, "data_parallel": 1,
                "memory": {"weights": "hbm", "kv_cache": "hbm"}}, "chipcost default mapping")
        ops = []
        for op in graph.ops:
            d = {f.name: getattr(op, f.name) for f in fields(op) if f.name not in ("name", "layer", "inputs", "attrs")}
            d["class"] = op_class(op)
            d["layered"] = op.layer >= 0
            ops.append(d)
        key = {"kind": _kind, "ops": ops, "phase": graph.phase, "batch": graph.batch, "seq_len": graph.seq_len,
               "kv_len": graph.kv_len, "spec": spec.model_dump(mode="json", exclude={"name", "description"})}
        return self._lookup(key, share, frac, graph.name, lambda: self._run_graph(graph, spec, share, frac, _kind))

    def clear_memory(self) -> None:
        """Forget the in-memory memo (the disk cache stays)."""
        self._memo.clear()

    # -- cache --------------------------------------------------------------------------------------
    def _key(self, what: dict, share: list[int], frac: float) -> tuple[dict, str]:
        key = {"v": KEY_VERSION, "code": self._code, "arch": self._arch_key, "memory": self.memory,
               "noc": self.noc, "l2": self.l2, "cores": share, "hbm_fraction": frac, **what}
        if not self.l2_cache:
            key["l2_cache"] = False
        text = json.dumps(key, sort_keys=True, separators=(",", ":"))
        return key, hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def _path(self, digest: str) -> Path:
        return self.cache_dir / self._code / f"{digest}.json"

    def _lookup(self, what: dict, share: list[int], frac: float, name: str, compute) -> ChipCostResult:
        """The memoised result for ``what`` (named ``name``: names are not part of the key)."""
        key, digest = self._key(what, share, frac)
        hit = self._memo.get(digest)
        if hit is not None:
            self.stats.memory_hits += 1
            return hit if hit.name == name else replace(hit, name=name)
        if self.persist:
            hit = self._read(digest, key)
            if hit is not None:
                self.stats.disk_hits += 1
                self._memo[digest] = hit
                return hit if hit.name == name else replace(hit, name=name)
        t0 = time.perf_counter()
        result = compute()
        self.stats.miss_seconds += time.perf_counter() - t0
        self.stats.misses += 1
        self._memo[digest] = result
        if self.persist:
            try:
                write_json(self._path(digest), {"key": key, "result": result.to_dict()}, indent=None)
                self.stats.disk_writes += 1
            except OSError:
                pass  # a read-only or full cache directory costs speed, not correctness
        return result

    def _read(self, digest: str, key: dict) -> ChipCostResult | None:
        try:
            data = json.loads(self._path(digest).read_text())
            if data["key"] != json.loads(json.dumps(key)):
                return None
            return ChipCostResult.from_dict(data["result"])
        except (OSError, ValueError, KeyError, TypeError):
            return None  # missing, partial from another version, or corrupt: simulate again

    # -- shares ----------------------------------------------------------------------------------------
    def _share(self, cores) -> list[int]:
        n = self.arch.num_cores
        if cores is None:
            return _snake_cores(self.arch)
        if isinstance(cores, (int, np.integer)) and not isinstance(cores, bool):
            if not 1 <= cores <= n:
                raise ConfigError(f"cores={cores}: {self.arch.name} has {n} cores (1..{n})")
            return _snake_cores(self.arch)[:int(cores)]
        try:
            ids = [int(c) for c in cores]
        except (TypeError, ValueError):
            raise ConfigError(f"cores must be a count or a list of core ids, got {cores!r}") from None
        if not ids or len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= n:
            raise ConfigError(f"cores {ids}: expected distinct core ids in 0..{n - 1}")
        return ids

    def _fraction(self, hbm_fraction: float) -> float:
        f = float(hbm_fraction)
        if not 0 < f <= 1:
            raise ConfigError(f"hbm_fraction must be in (0, 1], got {hbm_fraction!r}")
        return f

    def _arch_for(self, frac: float) -> Arch:
        """The chip with every HBM channel's bandwidth, and its L2's aggregate bandwidth, scaled by
        ``frac`` (a stream sharing the die gets that share of both, as the reuse model's
        :meth:`~npusim.mapping.gemm_kernel.Planner.l2_rate` charges it; the L2's capacity is not divided)."""
        if frac not in self._variants:
            data = self.arch.model_dump(mode="json")
            data["hbm"]["channel_bandwidth_gbps"] = self.arch.hbm.bandwidth_per_channel_gbps * frac
            if data.get("l2") is not None:
                data["l2"]["bandwidth_gbps"] *= frac
            for cls in data["core_classes"].values():
                if cls.get("channel_bandwidth_gbps") is not None:
                    cls["channel_bandwidth_gbps"] *= frac
            self._variants[frac] = validate(Arch, data, f"{self.arch.name} at {frac:g} of its HBM bandwidth")
        return self._variants[frac]

    def _peak_tflops(self, cores: Sequence[int], dtype: str) -> float:
        total = 0.0
        for c in cores:
            sa = self.arch.systolic_for(c)
            total += sa.rows * sa.cols * sa.macs_per_pe_per_cycle.get(dtype, 0) * 2 * self.arch.clock_ghz / 1e3
        return total

    # -- simulation ------------------------------------------------------------------------------------
    def _simulate(self, prog: Program, frac: float, memory: str | None = None, noc: str | None = None) -> Simulator:
        arch = self._arch_for(frac)
        if not self.l2_cache and arch.l2 is not None:  # the ablation: no L2 in the simulator's memory model
            arch = arch.model_copy(update={"l2": None})
        sim = Simulator(arch, memory_mode=memory or self.memory, noc_mode=noc or self.noc)
        prog.submit(sim)
        sim.run()
        return sim

    def _result(self, kind: str, name: str, dtype: str, share: list[int], frac: float, sim: Simulator,
                prog: Program, flops: int, min_bytes: int, mapping: str, plan: tuple = (),
                l2_bytes: int = 0, start_cycles: int = 0, fixed_cycles: int = 0) -> ChipCostResult:
        """``start_cycles``: a kernel start the program does not hold as a task (a single operator
        lowered by the mapper), added to its makespan; ``fixed_cycles``: the start and prologue the
        program holds as head tasks (reported as ``kernel_fixed_us``)."""
        arch = self.arch
        cycles = sim.makespan() + start_cycles
        seconds = cycles / (arch.clock_ghz * 1e9)
        kinds = np.asarray(prog.kind, dtype=np.int64)
        dma = np.flatnonzero(kinds == KIND_DMA)
        sizes = np.asarray([prog.param[i][0] for i in dma], dtype=np.int64)
        writes = np.asarray([prog.param[i][2] for i in dma], dtype=bool)
        hbm = int(sim.mem.ch_bytes.sum())
        reads = int(sizes[~writes].sum())
        l2_tlm = sim.l2_stats()
        if l2_tlm is not None:  # the TLM L2 served some DMA reads: they never reached HBM
            l2_bytes += l2_tlm["hit_bytes"]
            reads -= l2_tlm["hit_bytes"]
        used = sorted({c for c in prog.core if c >= 0})
        peak_chip = self._peak_tflops(range(arch.num_cores), dtype)
        peak_share = self._peak_tflops(share, dtype)
        tflops = flops / seconds / 1e12 if seconds else 0.0
        peak_bw = self._summary.hbm_bandwidth_gbps * frac
        bw = hbm / seconds / 1e9 if seconds else 0.0
        return ChipCostResult(
            kind=kind, name=name, arch=arch.name, dtype=dtype, memory_fidelity=self.memory, noc_fidelity=self.noc,
            cores=len(share), cores_used=len(used), chip_cores=arch.num_cores, hbm_fraction=frac,
            cycles=int(cycles), time_us=seconds * 1e6, flops=int(flops), tflops=tflops,
            compute_utilization=tflops / peak_chip if peak_chip else 0.0,
            share_compute_utilization=tflops / peak_share if peak_share else 0.0,
            peak_tflops_chip=peak_chip, peak_tflops_share=peak_share,
            hbm_bytes=hbm, hbm_read_bytes=reads, hbm_write_bytes=int(sizes[writes].sum()),
            min_hbm_bytes=int(min_bytes), l2_read_bytes=int(l2_bytes),
            l2_hit_rate=l2_bytes / (l2_bytes + reads) if l2_bytes + reads else 0.0, hbm_bandwidth_gbps=bw,
            hbm_peak_bandwidth_gbps=peak_bw,
            hbm_utilization=bw / peak_bw if peak_bw else 0.0, tasks=len(prog), mapping=mapping, plan=plan,
            sram_stall_cycles=sim.sram_stall_cycles,
            kernel_start_us=arch.kernel.start_us if arch.kernel is not None and (start_cycles or fixed_cycles)
            else 0.0,
            kernel_fixed_us=(start_cycles + fixed_cycles) / (arch.clock_ghz * 1e3))

    def _run_gemm(self, m, k, n, batch, dtype, out_dtype, share, frac, label, kernel, tile=None,
                  swizzle=None) -> ChipCostResult:
        planner = Planner(self.arch, share, dtype, out_dtype, frac, self.l2, kernel, tile, swizzle)
        # the candidates race at the analytical fidelities; the winner runs at the chosen ones, so
        # every fidelity times the same kernel
        best = None
        cheap = self.memory == "analytical" and self.noc == "analytical"
        candidates = planner.candidates(m, k, n, batch, len(share))
        for plan in candidates:
            prog, l2_bytes = self._gemm_program(planner, plan, m, k, n, batch, share)
            if len(candidates) == 1 and not cheap:
                best = (None, plan, prog, l2_bytes)
                break
            sim = self._simulate(prog, frac, "analytical", "analytical")
            if best is None or sim.makespan() < best[0].makespan():
                best = (sim, plan, prog, l2_bytes)
        sim, plan, prog, l2_bytes = best
        if self._tlm_l2():  # the same plan, its loads at their addresses: the TLM L2 decides the hits
            prog, l2_bytes = self._gemm_program(planner, plan, m, k, n, batch, share, addressed=True)
        if not cheap:
            sim = self._simulate(prog, frac)
        e, eo = DTYPE_BYTES[dtype], DTYPE_BYTES[out_dtype]
        min_bytes = batch * (_nbytes(m * k, e) + _nbytes(k * n, e) + _nbytes(m * n, eo))
        fixed = kernel_fixed_cycles(planner, plan)
        return self._result("gemm", label, dtype, share, frac, sim, prog, 2 * batch * m * k * n, min_bytes,
                            plan.describe(), plan.as_tuple(), l2_bytes, fixed_cycles=fixed)

    def _gemm_program(self, planner: Planner, plan: GemmPlan, m, k, n, batch, share,
                      addressed: bool = False) -> tuple[Program, int]:
        """The kernel's tasks alone in a program; returns it and the bytes its loads took from the
        L2 (:func:`~npusim.mapping.gemm_kernel.emit_gemm`)."""
        prog = Program(self.arch.num_cores, meta={"chipcost": "gemm", "m": m, "k": k, "n": n, "batch": batch})
        return prog, emit_gemm(prog, planner, plan, m, k, n, batch, share, addressed=addressed).l2_bytes

    def _tlm_l2(self) -> bool:
        """Whether the simulator's TLM L2 serves the GEMM's re-reads (TLM memory, an arch L2, no
        ideal-L2 bracket): the loads then read real addresses instead of the reuse model's split."""
        return self.memory == "tlm" and self.arch.l2 is not None and self.l2 is None and self.l2_cache

    def _run_vector(self, op: Op, share: list[int], frac: float, resident: int = 0,
                    absorbed: bool = False) -> ChipCostResult:
        row = op.row_len or 1
        rows = max(1, op.elements // row)
        e_in = DTYPE_BYTES[op.dtype]
        quant = quantizes(op.op_class)  # quantize, or a fused norm/SwiGLU + quantisation
        e_out = _vector_out_bytes(op, e_in)  # INT8 out (+ a 4-byte scale per row); AddRmsNorm: x and y
        e_l2 = e_in * resident  # per element, the inputs the L2 holds (written by the op before)
        e_in = e_in * _vector_inputs(op)  # every input it streams in, per element
        prog = Program(self.arch.num_cores, meta={"chipcost": "vector", "op": op.name})
        any_dtype = next(iter(self.arch.systolic_for(share[0]).macs_per_pe_per_cycle))  # the array is not used
        planner = Planner(self.arch, share, any_dtype, "bf16", frac)
        em = Emitter(planner, prog)  # for its DMA engines
        kc = self.arch.kernel
        by_kernel = kc is not None and kc.vector_cycles_per_repeat is not None  # reference-kernel instructions
        aivs = kc.vector_cores_per_core if kc is not None else 1
        header = ""
        interleave = self._interleave_split(op, share)  # InterleaveRope's own tiling (vector_kernel)
        if kc is not None:  # the AIVs' prologue grows with the AIVs the kernel launches (vector_kernel)
            launched = launched_aivs(op.op_class, op.fn, rows, len(share) * aivs)
            if interleave is not None:  # its blocks; on the batch split charged at the batches up to the die's AIVs
                launched = min(rows, len(share) * aivs) if interleave.axis == "batch" else interleave.blocks
            setup_us = kc.vector_setup_us * setup_share(launched, self.arch.num_cores * aivs, kc.mix_start_us,
                                                        kc.mix_start_core_us)
            head = planner.head_cycles(setup_us)
            header = f", {launched} AIVs launched"
        else:
            head = 0
        copy = is_copy(op.op_class)
        tiled = kc is not None and kc.ub_kb is not None  # the vendor kernels' tiling over AIVs (vector_kernel)
        side_in = 0  # bytes a loop loads beside its rows' (InterleaveRope: that batch's cos and sin)
        if tiled and interleave is not None:  # one loop a batch (or a batch's loop of heads), all single-buffered
            per_aiv = list(interleave.loops)
            row = interleave.heads * INTERLEAVE_HEAD
            core_aivs = [per_aiv[a:a + aivs] for a in range(0, len(per_aiv), aivs)]
            ub = UbTiling(1, 1, 1)
            nin, nout, split = 1, 1, None
            side_in = 2 * INTERLEAVE_HEAD * DTYPE_BYTES[op.dtype]
        elif tiled:
            per_aiv = split_rows(rows, len(share) * aivs)  # every working AIV's rows
            core_aivs = [per_aiv[a:a + aivs] for a in range(0, len(per_aiv), aivs)]  # core i: AIVs i*aivs..
            ub = ub_tiling(op.op_class, row, e_in, e_out, kc.ub_kb * 1024, soc=kc.soc_version, fn=op.fn)
            nin, nout = ub.in_buffers, ub.out_buffers
            # a softmax row the UB cannot hold: two passes over its chunks, the row read twice (vector_kernel)
            split = softmax_chunks(op.op_class, row, e_in, e_out, kc.ub_kb * 1024) if by_kernel else None
        else:  # two input buffers; the output's are not modelled
            nin, nout, split = 2, 1 << 62, None
        reads = 2 if split else 1  # the input's passes from global memory
        used = len(core_aivs) if tiled else min(len(share), rows)
        if e_l2 or absorbed:  # resident inputs, absorbed writes: each core at its share of the L2's rate
            em.l2_bpc = planner.l2_rate(used)
        for i, core in enumerate(share[:used]):
            if tiled:  # loop c: each of the core's AIVs its next ub.rows rows; the busiest sets the compute
                mine = core_aivs[i]
                loops = [[min(ub.rows, max(0, r - c * ub.rows)) for r in mine] for c in range(_cdiv(max(mine), ub.rows))]
                chunks, busiest = [sum(x) for x in loops], [max(x) for x in loops]
            else:
                core_rows = _split(rows, used, i)
                buf = self.arch.sram_for(core).capacity_mb * MB / 4  # a quarter of the buffer per chunk
                chunk_rows = max(1, min(core_rows, int(buf // max(1.0, row * (e_in + e_out)))))
                chunks = _blocks(core_rows, _cdiv(core_rows, chunk_rows), 1)
                busiest = [_cdiv(r, aivs) for r in chunks]
            computes: list[int] = []
            writes: list[list[int]] = []
            start = prog.add_compute(core, "vector", head, name=f"{op.name} c{core} kernel start") if head else -1
            last = start
            for c, r in enumerate(chunks):
                # the input queue's buffers: a load waits for the compute nin loops back (a copy: its write)
                deps = ((writes[c - nin] if copy else [computes[c - nin]]) if c >= nin else [start])
                from_l2 = _nbytes(r * row, e_l2)
                load = em.loads(core, reads * (_nbytes(r * row, e_in) - from_l2) + r * side_in, reads * from_l2, deps,
                                f"{op.name} c{core} load{c}")
                # the output's buffers: a loop's compute waits for the write nout loops back
                out_free = writes[c - nout] if c >= nout else []
                if copy:  # MTE2 then MTE3: no vector instruction
                    done = [*load]
                elif not by_kernel:
                    last = prog.add_vector(core, op.op_class, r * row, op.dtype, deps=[*load, last, *out_free],
                                           name=f"{op.name} c{core} {c}",
                                           fn=op.fn if op.op_class == "activation" else None, row_len=op.row_len)
                    done = [last]
                else:  # the busiest of the core's AIVs sets the loop's compute
                    cls, n_rows, n_len = (("softmax_split", busiest[c] * split[1], split[0]) if split
                                          else (op.op_class, busiest[c], row))
                    cycles = aiv_tile_cycles(cls, op.fn, n_rows, n_len,
                                             cycles_per_repeat=kc.vector_cycles_per_repeat,
                                             instruction_cycles=kc.vector_instruction_cycles, dtype=op.dtype,
                                             soc=kc.soc_version)
                    last = prog.add_compute(core, "vector", cycles, deps=[*load, last, *out_free],
                                            name=f"{op.name} c{core} {c}")
                    done = [last]
                out = _nbytes(r * row, e_out) + (4 * r if quant else 0)
                if absorbed or tiled:  # each AIV writes its own rows back (its own MTE3); absorbed: into the L2
                    writes.append(em.writes(core, out, done, f"{op.name} c{core} write{c}", to_l2=absorbed))
                else:
                    writes.append([em.write(core, out, done, f"{op.name} c{core} write{c}")])
                if not copy:
                    computes.append(last)
        sim = self._simulate(prog, frac)
        min_bytes = _nbytes(op.elements, e_in) + _nbytes(op.elements, e_out)  # e_in: every input's bytes
        how = (", copy: MTE2 and MTE3 only" if copy else
               f", {aivs} vector cores per core, reference-kernel instructions" if by_kernel else "")
        how += header
        how += f", each row in {split[1]} UB chunks of {split[0]}, read twice (two passes)" if split else ""
        how += (f", InterleaveRope split by {interleave.axis}: {interleave.blocks} AIVs, up to {max(interleave.loops)} "
                f"single-buffered loops of {interleave.heads} heads each" if interleave is not None else "")
        how += f", {resident} input(s) from the L2" if resident else ""
        how += ", writes kept by the L2" if absorbed else ""
        return self._result("vector", op.name, op.dtype, share, frac, sim, prog, 0, min_bytes,
                            f"vector: {rows} rows of {row} over {used} cores{how}, streamed from and to HBM",
                            l2_bytes=em.l2_bytes, fixed_cycles=head)

    def _run_graph(self, graph: Graph, spec, share: list[int], frac: float, kind: str) -> ChipCostResult:
        from npusim.mapping.mapper import map_model

        arch = self._arch_for(frac)
        mapped = map_model(graph, arch, spec, cores=share, l2_addressed=self._tlm_l2())
        sim = self._simulate(mapped.program, frac)
        dtype = next((op.dtype for op in graph.ops if op.kind in ("gemm", "attention", "moe")),
                     graph.ops[0].dtype if graph.ops else "bf16")
        # weights and cached keys/values read once (the mapper does not read a step's new KV back)
        min_bytes = graph.weight_bytes + sum(op.batch * (op.kv_len - op.q_len) * op.kv_bytes_per_token
                                             for op in graph.ops if op.kind == "attention")
        parts = sorted(set(mapped.decisions.values()))
        mapping = (f"mapper: TP {spec.tensor_parallel.degree} over {len(share)} cores"
                   + (f" ({', '.join(parts)})" if parts else "")
                   + ("" if not graph.weight_bytes else "; weights resident" if mapped.weights_resident
                      else "; weights streamed from HBM"))
        # one attention op is one kernel (a fused FlashAttention / paged attention): its device-side
        # start once, after the mapper's program (which holds none); one GEMM on a die whose kernel
        # the mapper runs holds its start and prologue as ChipCost.gemm's does; a graph or a MoE block
        # is several kernels: the GEMM kernels in it hold theirs, not counted in kernel_fixed_us
        one = graph.ops[0] if kind == "op" and len(graph.ops) == 1 else None
        start = fixed = 0
        if one is not None and one.kind == "attention" and self.arch.kernel is not None:
            start = head_cycles(self.arch, 0.0)
        elif one is not None and one.kind == "gemm" and runs_kernel(self.arch, one.dtype):
            m, k, n, batch = gemm_dims(one)  # the plan the mapper's _kernel_gemm runs: its start, prologue, MIX start
            planner = Planner(self.arch, share, one.dtype, default_out_dtype(one.dtype), 1.0, None,
                              kernel_name(self.arch, None))
            fixed = kernel_fixed_cycles(planner, planner.base_plan(m, k, n, batch, len(share)))
        return self._result(kind, graph.name, dtype, share, frac, sim, mapped.program, graph.flops, min_bytes,
                            mapping, l2_bytes=mapped.l2_read_bytes, start_cycles=start, fixed_cycles=fixed)


__all__ = ["ChipCost", "ChipCostResult", "CacheStats", "GemmPlan", "arch_digest", "code_digest",
           "default_cache_dir"]
