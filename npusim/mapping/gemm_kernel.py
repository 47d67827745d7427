"""The die's GEMM kernel: how a GEMM is planned over a share of cores and emitted as engine tasks.

One lowering serves the chip simulator and the chip-cost interface (issue 39 item 2):
``ChipCost.gemm`` (:mod:`npusim.system.chipcost`) plans a GEMM with :class:`Planner`, emits it with
:func:`emit_gemm` into a program of its own and simulates it; the chip mapper
(:mod:`npusim.mapping.mapper`, ``npusim run --forward``, ``ChipCost.op(op, spec=...)``) lowers a
``gemm`` op with the same plan and :func:`emit_gemm` into its forward pass on a die whose arch
gives ``kernel.base_blocks`` for the op's dtype (the Ascend presets), on the op's TP group's cores
(the share). The tasks are the same -- per working core its kernel start and prologue, per step
its loads (HBM DMAs; the L2's hits as fixed-time reads on its DMA queues at the analytical
memory fidelity, real-address DMAs the TLM L2 serves at ``memory="tlm"``), its cube work and its
write-back -- so at any fidelity both time the same tiles; what differs is only what surrounds the
op (the mapper's dependencies on the ops before it, where the operands sit in HBM, which cores
form the share).

The kernel (assumptions): ``C[m x n] = A[m x k] . B[k x n]`` (``batch`` independent copies, each
with its own A, B and C), operands read from HBM and C written to HBM by each core's DMA engines,
like a vendor's operator benchmark. Planning by simulation (the candidates' race below) is
``ChipCost.gemm``'s; the mapper lowers only dies with base blocks, whose plan is a single one.

* The share's cores form a ``pb x pm x pn x pk`` grid (batch, M, N and K splits; fewer cores than
  the share if that is faster). A core owns a block of C (and a slice of K); blocks are cut in
  multiples of the array's rows / columns so no core pays padding another would not.
* Inside its block a core computes output tiles whose fp32 accumulators take at most a quarter of
  its SRAM (on the 910B/C: 128 KB = the cube's L0C, e.g. 128 x 256 or 176 x 176) and streams K in
  chunks whose A and B pieces, double-buffered, fit the other three quarters, in whole folds of the
  array (rows x MACs per PE of K); a tile too wide for one fold there (a decode GEMM's wide tiles)
  streams in the arch's L0 steps (``kernel.l0_k_bytes`` of K; one fold without a kernel section),
  the grain the cube's L1 -> L0 feed follows the loads at. A tile's cube time is
  the systolic model's for the whole K (one accumulation), shared among its chunks by K. A chunk's
  loads are split over the core's DMA engines and run up to two chunks ahead of the cube (two
  buffers); a finished tile is written to HBM at once.
* Operand reuse inside a core: if the A panel of a tile row (``tile_m x K``) fits half the SRAM it
  stays resident while the core walks that row's tiles (A read once per core), or the same for
  the B panel (``K x tile_n``); otherwise both are re-read per tile. Tiles are chosen for the least
  traffic.
* ``pk > 1`` (split K, for small outputs such as decode GEMMs): each core keeps its block's fp32
  partial sums, the ``pk`` cores of a block reduce-scatter them over the NoC (ring, vector adds)
  and each writes its share of C.
* **The L2** (the arch's ``l2`` section; the Ascend presets: 192 MB at ~7 TB/s, 110 B/cycle per
  core): the first load of every operand byte reaches HBM; a re-read hits when its reuse distance
  (the distinct bytes the chip loads in between, :mod:`npusim.hw.memory.l2`, LRU) fits the
  capacity. :meth:`Planner.l2_hbm_fractions` derives the re-reads from the kernel's loop order:
  the ``pn`` (``pm``) cores that share a block of A (B) load it at about the same step, and an
  operand not kept resident is re-loaded per tile, row or column of tiles. Each load of A (B) then
  reaches HBM with its operand's miss fraction and the rest is read from the L2, holding the
  core's DMA engines for ``bytes / rate`` cycles (the core's share of the L2 bandwidth, at most its
  per-core rate). ``l2_hit_rate`` is the fraction of loaded bytes the L2 served, ``min_hbm_bytes``
  the compulsory traffic (A and B read once, C written once). Writes bypass the L2. A chip without
  an ``l2`` section reads every load from HBM (A or B once per core or tile that needs it).
  Results (before issue 39's per-core rate): 2048^3 INT8 on the 910C die 35% of peak without the
  L2, 74% with it; 4096^3 FP16 on the 910B 37% -> 97%. With issue 39's kernel costs and every core's
  global-memory reads at 110 B/cycle (below) they are 66% and 96% (measured vendor kernels reach
  85-87% on such shapes, ``npusim validate --only chip-gemm``: the calibration half chose 110 over
  64, and neither is the ~80 B/cycle pto-isa's load-pipe busy ratios imply).
* **The L2 at the TLM fidelity** (``memory="tlm"`` and an arch ``l2``): the reuse model above
  still plans the kernel and the candidates race at the analytical fidelities, but the winner's
  loads are all DMAs at the operands' real addresses (:class:`Layout`: each operand block in the
  kernel's tile order, so a chunk of a tile is one contiguous run and cores sharing a block read
  the same addresses) and the simulator's transaction-level L2 (:mod:`npusim.hw.memory.hbm`,
  "L2": set-associative, sliced, LRU, write-through with write-allocate) decides what hits;
  ``l2_read_bytes`` / ``l2_hit_rate`` are what it measured. Differences from the reuse model, by
  construction: cores that load a block at the same step wait for its first loader's HBM fill
  (an MSHR merge) instead of reading it at the L2 rate at once; C's writes take L2 room; set
  conflicts. ``validation/l2_tlm_vs_reuse.py`` prints both, with the time each gives.
* ``l2_bytes_per_cycle`` (opt-in, a bracket) replaces the arch's L2 by an ideal one of unlimited
  capacity that serves every re-read at ``l2_bytes_per_cycle`` per core.
* Planning: an analytical estimate (per-core compute, per-core DMA, chip HBM time, prologue,
  epilogue, reduction) ranks every grid and tiling; the best grid for each number of cores used,
  if within ``PLAN_WINDOW`` (5%) of the best estimate, up to ``PLAN_CANDIDATES`` (3) of them, is
  simulated at the analytical fidelities and the fastest is kept; the winner is then simulated at
  the chosen fidelities (so every fidelity times the same kernel). The choice is still
  estimate-driven: over a sweep of DeepSeek-like shapes, a share of fewer cores or a slightly
  larger, better-aligned GEMM came out at most ~1% faster (~5% with the ideal L2).
* Task granularity: per core, chunks are merged into about ``MAX_STEPS`` (48) steps, with single
  chunks at both ends so the exposed prologue (first load) and epilogue (last compute and write)
  stay exact.
* **The die's operator-level costs** (the arch's ``kernel`` section,
  :class:`~npusim.arch.schema.KernelCosts`; the Ascend presets', derived from the calibration half
  of the measured operator rows by :mod:`npusim.validate.die_calibration`): every working core first
  runs one task of ``start_us + cube_setup_us`` (the kernel's device-side start and the AIC's
  prologue) before its first load, so the start is paid once per operator (``kernel_start_us`` in
  the result); a tile's cube time is at least its operands' feed from L1 into L0A / L0B (per L0
  step of ``l0_k_bytes`` of K per row, the larger of the two loads plus the MTE1 start against
  the step's MACs, L0 double-buffered). A core reads global memory (HBM through its DMA engines,
  the L2 at ``l2.core_bytes_per_cycle``) at most at its own rate, 110 B/cycle on the Ascend presets
  (the platform file's, chosen over CANN's cycle model's 64 by the calibration half's GEMM and
  attention rows; ``arch/ascend-910b.yaml``).
  Not modelled: the fix-pipe's write-back stalling the cube when a tile fills L0C
  (``FIXPIPE_WAITS``, off: in this kernel the write shares the DMA engines' in-order queues with
  loads issued two steps ahead, so the wait would serialise loads and MACs).
* **Base blocks** (the arch's ``kernel.base_blocks`` for the GEMM's dtype; the Ascend presets':
  CATLASS's basic matmul, ``L1TileShape`` 128 x 256 x 256 for fp16/bf16, 128 x 256 x 512 for INT8,
  128 x 128 x 256 for fp32): instead of the even split above, the kernel the die runs. The block
  size and any K split are the GEMM's kernel's (:mod:`npusim.system.gemm_kernels`: ``aclnn``, the
  presets' ``kernel.gemm_default``, re-tiles small shapes over all cores; ``catlass_basic`` keeps
  ``base_blocks``; ``catlass_splitk`` cuts K into slices, fp32 partials added by each core's vector
  side once all cores are done, read from the L2); what follows describes one block.
  C is cut into ``m x n`` base blocks (the last row / column of blocks holds the remainder), numbered
  by CATLASS's ``GemmIdentityBlockSwizzle<swizzle_offset, swizzle_direction>`` (batch items one after
  the other) and dealt to the share's cores in turn: core ``c`` takes blocks ``c``, ``c + used``, ...,
  so ``used = min(blocks, cores)`` cores work, in ``waves = ceil(blocks / used)`` -- a decode GEMM of
  a few blocks runs on a few cores, each loading at its own rate. A block is one tile over the whole
  K (its accumulators fill L0C): both operands are loaded for it (no panel stays resident from one
  block to the next), K streams in L1 stages of the base block's ``k`` (the emitter's steps, loads
  two steps ahead), and its C block is written back as it finishes, without holding the cube: the
  basic matmul's unit flag (``MmadAtlasA2Pingpong<true>``) lets the next block accumulate while the
  fix-pipe drains L0C. K is split over cores only by ``catlass_splitk`` (Ascend C's
  ``MultiCoreMatmulTiling`` splits K only when asked; ops-nn MatMulV3's multi-core split K is
  fp32-only and not modelled). The L2
  (:meth:`Planner.base_l2_fractions`): a block row of A (column of B) already loaded in an earlier
  wave hits if the distinct operand bytes of the waves in between fit the L2; one loaded by another
  core in the same wave waits for that core's fill (an MSHR merge: no HBM traffic, but each request
  waits about HBM's latency, so the core's outstanding-request window holds it to the pace of an
  HBM read, its DMA engines' rate, not the L2 rate; treating such reads as plain L2 hits instead
  made a 256 x 7168 x 2048 BF16 GEMM on the 910C die faster than a 64-row one, and put the
  calibration half's large GEMMs at 90-98% of peak, where the BasicMatmul baselines there measure
  41-60%; a second reader trailing the first by one L1 stage and reading the rest at the L2 rate
  put them at 93-97% of peak, every large calibration row, BasicMatmul baselines and tuned kernels
  alike, then measuring slower: 4096 x 8000 x 4096 781 us against 917 / 1231; kept out). Results on
  the calibration half's rows that time
  this very kernel with its default tiles (CATLASS's BasicMatmul baselines and tuning cases, 910B/B4;
  ``catlass_basic``):
  1024 x 576 x 6144 fp16 88.1 us vs 72.5 measured; 20 x 16384 x 6144 (24 blocks on 20 AIC, 2 waves)
  163 vs 181.4 (B in NZ) / 238.8 (ND); 1 x 5120 x 768 fp32 (6 blocks, 6 of 24 AIC) 28.5 vs 36.3;
  4096 x 8000 x 4096 1062 vs 1231. A source's tuned tiling is run when given (``tile``, ``swizzle``:
  :func:`check_tile`; the tuning cases' fastest rows then: 1024 x 576 x 6144 at 256 x 128 x 256
  48.2 vs 48.6, 20 x 16384 x 6144 at 32 x 320 x 128 128.2 vs 139.6, 1 x 5120 x 768 fp32 at
  16 x 32 x 1024 15.0 vs 15.5, 160 x 2048 x 6144 at swizzle <4, 1> 40.6 vs 35.3). CATLASS's
  single-core split K (example 34) is its own kernel (``catlass_single_splitk``,
  :func:`_emit_single_splitk`: 261 / 925 / 4766 us against 261 / 917 / 4669 measured; its
  2048 x 80000 x 4096 row measures 16,850 us, 3.3x the model, and its BasicMatmul baseline 57,144:
  not explained). Not modelled: PTO's hand-tiled kernel (run as the basic kernel), the NZ / ND
  layout difference (example 34's ND->NZ copies excepted).
* **INT8 on a CATLASS kernel** (:data:`QUANT_EPILOGUE_KERNELS`): the cube writes int32 C into a
  workspace the L2 holds and the vector side dequantises it into bf16 D (:class:`_VectorSide`);
  aclnn's INT8 GEMM keeps the bf16 write below (QuantBatchMatmulV3's own tiling and MIX templates
  are not modelled).
* Output dtype: bf16 for int8/int4/fp8 inputs (A8W8 with dequantisation on the way out, as
  DeepSeek-V3 on Ascend), else the input dtype. Both operands are costed at ``dtype`` (an op's
  ``weight_dtype`` is ignored). The share's cores must have the same systolic array.

Units: elements (block sizes, K), bytes, core clock cycles; ``*_bpc`` bytes per core cycle.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from npusim.arch.derived import summarize
from npusim.arch.schema import DTYPE_BYTES, Arch
from npusim.comm.collectives import ring_reduce_scatter
from npusim.errors import ConfigError
from npusim.hw.compute.systolic import gemm_cost
from npusim.hw.compute.vector_kernel import aiv_tile_cycles
from npusim.hw.memory import l2 as l2_model
from npusim.hw.memory.hbm import stream_latency_ps
from npusim.hw.memory.params import P_ISSUE_GAP, P_MAX_OUT, P_TXN_BYTES, memory_params
from npusim.mapping import gemm_kernels
from npusim.sim.program import Program

MAX_STEPS = 48  # per core, after merging K-chunks (see module docstring)
PLAN_CANDIDATES = 3  # GEMM plans simulated per miss (the fastest is kept) ...
PLAN_WINDOW = 0.05  # ... among those estimated within 5% of the best estimate
ACC_BYTES = 4  # fp32 / int32 accumulators
#: the next tile's MACs wait for the write-back of a tile that filled L0C; off: this kernel's writes
#: share the DMA engines' in-order queues with loads issued two steps ahead, so the wait also waited
#: for those loads and serialised loads and MACs (PTO's 6144^3 GEMM +61% instead of -14%), which the
#: hardware's separate fix-pipe does not do (see the module docstring)
FIXPIPE_WAITS = False
SPLIT_RUN_BYTES = 4096  # a load of twice this or more is split over the core's DMA engines
#: the base-block kernels whose INT8 GEMM dequantises on the vector cores through global memory
#: (CATLASS's quant kernels: the AIC's fixpipe writes int32 C to a workspace, the AIVs read it back
#: with the per-channel and per-token scales and write bf16 D; kernel/quant_matmul.hpp,
#: quant_matmul_full_loadA_tla.hpp, quant_multi_core_splitk_matmul_tla.hpp)
QUANT_EPILOGUE_KERNELS = ("catlass_basic", "catlass_splitk")
#: the per-token dequant epilogue's vector instructions per tile, each over the whole tile in fp32
#: (epilogue/block/block_epilogue_per_token_dequant.hpp: Cast C int32 -> fp32, RowBroadcastMul by the
#: per-channel scale, OneBlkColumnBroadcastMul by the per-token scale, Cast -> D), and its tile's rows
#: (examples/12_quant_matmul: EpilogueTileShape<32, 256>)
DEQUANT_INSTRUCTIONS = 4
DEQUANT_TILE_ROWS = 32
MB = 2**20


# -- GEMM planning ------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmPlan:
    """How a GEMM is spread over a share of cores (see module docstring)."""

    grid: tuple[int, int, int, int]  # pb, pm, pn, pk
    tile: tuple[int, int]  # largest output tile (m, n) of a core
    k_chunk: int
    reuse: str  # "a", "b" or "none": which operand panel stays resident in a core
    est_cycles: float
    est_hbm_bytes: int
    #: base blocks (the arch's ``kernel.base_blocks``): C cut into ``tile``-sized blocks dealt to
    #: ``used`` cores in ``waves``; ``grid`` is then (batch, block rows, block columns, 1)
    used: int = 0
    waves: int = 0
    kernel: str = ""  # the base-block kernel (npusim.system.gemm_kernels.KERNELS)
    splitk: int = 1  # K slices per base block (catlass_splitk)

    @property
    def base_blocks(self) -> bool:
        return self.used > 0

    @property
    def cores_used(self) -> int:
        if self.base_blocks:
            return self.used
        pb, pm, pn, pk = self.grid
        return pb * pm * pn * pk

    def describe(self) -> str:
        pb, pm, pn, pk = self.grid
        if self.base_blocks and self.kernel == "catlass_single_splitk":
            return (f"{self.kernel}: {pb * pm * pn} blocks of {self.tile[0]}x{self.tile[1]} ({pm}x{pn}, M x N), "
                    f"a range of them per core on {self.used} cores, walked once per K tile of {self.k_chunk} "
                    f"({self.splitk} tiles), fp32 partials added into a workspace")
        if self.base_blocks:
            split = f"K split {self.splitk} ways, partials reduced" if self.splitk > 1 else "no split K"
            return (f"{self.kernel}: {pb * pm * pn} base blocks of {self.tile[0]}x{self.tile[1]} ({pb}x{pm}x{pn}, "
                    f"batch x M x N) dealt to {self.used} cores in {self.waves} waves, K stages of {self.k_chunk}, "
                    f"{split}")
        reuse = {"a": "A panel resident", "b": "B panel resident", "none": "no panel reuse"}[self.reuse]
        return (f"{self.cores_used} cores as {pb}x{pm}x{pn}x{pk} (batch x M x N x K), tiles up to "
                f"{self.tile[0]}x{self.tile[1]}, K chunks of {self.k_chunk}, {reuse}")

    def as_tuple(self) -> tuple:
        return (*self.grid, *self.tile, self.k_chunk, self.reuse, self.used, self.waves, self.kernel, self.splitk)


def _split(total: int, parts: int, i: int) -> int:
    base, extra = divmod(int(total), parts)
    return base + (1 if i < extra else 0)


def _blocks(total: int, parts: int, unit: int) -> list[int]:
    """``total`` cut into ``parts`` blocks of whole ``unit``s (the last block holds the remainder)."""
    units = -(-total // unit)
    sizes = [_split(units, parts, i) * unit for i in range(parts)]
    sizes[-1] -= units * unit - total
    return sizes


def _base_sizes(total: int, size: int) -> list[int]:
    """``total`` cut into blocks of ``size`` (the last one holds the remainder)."""
    return [min(size, total - i * size) for i in range(_cdiv(total, size))]


def _swizzle(loops_m: int, loops_n: int, offset: int, direction: int) -> list[tuple[int, int]]:
    """(block row, block column) of each task index, CATLASS's ``GemmIdentityBlockSwizzle<offset,
    direction>`` (``include/catlass/gemm/block/block_swizzle.hpp``): direction 0 ("Zn") walks strips
    of ``offset`` block rows column by column, every other strip from the last column back;
    direction 1 ("Nz") the same with rows and columns swapped."""
    rows, cols = (loops_m, loops_n) if direction == 0 else (loops_n, loops_m)
    out = []
    for idx in range(rows * cols):
        strip, inner = divmod(idx, offset * cols)
        height = min(offset, rows - strip * offset)
        r = strip * offset + inner % height
        c = inner // height
        if strip % 2 == 1:
            c = cols - c - 1
        out.append((r, c) if direction == 0 else (c, r))
    return out


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _ceil_to(x: int, unit: int) -> int:
    return _cdiv(x, unit) * unit


def _counts(sizes: list[int]) -> dict[int, int]:
    out: dict[int, int] = {}
    for s in sizes:
        out[s] = out.get(s, 0) + 1
    return out


def _nbytes(elements: int, elem_bytes: float) -> int:
    return int(math.ceil(elements * elem_bytes))


@dataclass(frozen=True)
class _Block:
    """How one core works through its ``mb x kb x nb`` block (plus ``bb`` batch items)."""

    tm: int
    tn: int
    kc: int
    reuse: str
    a_bytes: int  # per batch item
    b_bytes: int
    cycles: float  # compute estimate, per batch item
    mb: int = 0  # the block: rows of C, its K, columns of C
    kb: int = 0
    nb: int = 0


class Planner:
    def __init__(self, arch: Arch, cores: list[int], dtype: str, out_dtype: str, hbm_fraction: float,
                 ideal_l2_bpc: float | None = None, gemm_kernel: str | None = None,
                 tile: tuple[int, int, int] | None = None, swizzle: tuple[int, int] | None = None):
        sa = arch.systolic_for(cores[0])
        if any(arch.systolic_for(c) != sa for c in cores):
            raise ConfigError("a chip-cost GEMM needs a share of cores with the same systolic array "
                              "(the share mixes core classes)")
        if dtype not in sa.macs_per_pe_per_cycle:
            raise ConfigError(f"dtype {dtype}: {arch.name}'s array supports {sorted(sa.macs_per_pe_per_cycle)}")
        self.arch, self.sa, self.dtype = arch, sa, dtype
        self.kpe = sa.macs_per_pe_per_cycle[dtype]
        self.e, self.eo = DTYPE_BYTES[dtype], DTYPE_BYTES[out_dtype]
        self.out_dtype = out_dtype
        self.share_cores = len(cores)  # the cube cores the kernel is tiled for (a MIX kernel's start)
        sram = min(arch.sram_for(c).capacity_mb for c in cores) * MB
        self.acc_elems = int(sram / 4 // ACC_BYTES)
        self.buf_bytes = sram * 3 / 4
        self.k_unit = sa.rows * self.kpe  # a chunk's K: one fold streams >= rows cycles
        p, period_ps = memory_params(arch, "analytical")
        txn = p[P_TXN_BYTES]
        port = min(txn / max(p[P_ISSUE_GAP], 1), p[P_MAX_OUT] * txn / stream_latency_ps(p))  # bytes/ps
        self.engines = arch.cores.dma.engines
        self.core_bpc = port * period_ps * self.engines  # bytes per core cycle, all engines
        self.hbm_bpc = summarize(arch).hbm_bandwidth_gbps * hbm_fraction / arch.clock_ghz  # bytes per core cycle
        self.link_bpc = arch.noc.link_bytes_per_cycle
        # the L2: the arch's (capacity, shared bandwidth), an ideal one (unlimited capacity, a rate
        # per core), or none (l2_capacity None: every load reaches HBM)
        self.ideal_l2_bpc = ideal_l2_bpc
        self.l2_capacity = math.inf if ideal_l2_bpc is not None else \
            l2_model.capacity_bytes(arch.l2) if arch.l2 is not None else None
        self.l2_latency = l2_model.hit_latency_cycles(arch.l2, arch.clock_ghz) \
            if arch.l2 is not None and ideal_l2_bpc is None else 0
        self.hbm_fraction = hbm_fraction
        self.kernel = arch.kernel  # operator-level costs (start, setup, L0 feed); None: not charged
        # the base-block kernel the GEMM runs (gemm_kernels.KERNELS): named, else the arch's default
        self.gemm_kernel = gemm_kernel or "catlass_basic"
        # a base-block kernel's tiling as its source states it (L1TileShape; swizzle offset, direction),
        # instead of the arch's base block and swizzle and the kernel's own tiling rule
        self.tile = check_tile(arch, cores, dtype, tile) if tile is not None else None
        self.swizzle = check_swizzle(swizzle) if swizzle is not None else None

    def head_cycles(self, setup_us: float) -> int:
        """Cycles a working core waits before its first load: the kernel's device-side start and the
        core's own prologue (``setup_us``), both from the arch's ``kernel`` section (0 without it)."""
        return head_cycles(self.arch, setup_us)

    def mix(self) -> bool:
        """Whether the base-block kernel is a MIX kernel (:func:`is_mix_kernel`)."""
        return is_mix_kernel(self.gemm_kernel, self.dtype, self.out_dtype,
                             self.kernel is not None and self.kernel.vector_cycles_per_repeat is not None)

    def mix_start_us(self, used: int) -> float:
        """The extra start of this kernel when ``used`` of the share's cube cores get tasks:
        :func:`mix_start_us` of the cores it launches (:func:`npusim.mapping.gemm_kernels.launched_cores`:
        the CATLASS examples launch the whole share, aclnn the cores its tiling uses) if it is a
        MIX kernel, else 0."""
        if not self.mix():
            return 0.0
        launched = gemm_kernels.launched_cores(self.gemm_kernel, used, self.share_cores)
        return mix_start_us(self.arch, launched, self.share_cores)

    def l2_rate(self, readers: int) -> float:
        """Bytes per cycle one of ``readers`` cores reads from the L2 (streams sharing the chip get
        the share ``hbm_fraction`` of its bandwidth, as of HBM's)."""
        if self.ideal_l2_bpc is not None:
            return self.ideal_l2_bpc
        return l2_model.core_rate(self.arch.l2, self.arch.clock_ghz, readers, self.core_bpc, self.hbm_fraction)

    def l2_hbm_fractions(self, m: int, k: int, n: int, batch: int, grid: tuple, big: _Block,
                         loads_a: float, loads_b: float) -> tuple[float, float]:
        """Of A's and of B's loads, the fractions that reach HBM; the rest hit in the L2.

        Re-reads, by the kernel's loop order (see the module docstring), with their reuse distance:
        the distinct bytes the chip loads in between (A's block is shared by the ``pn`` cores of
        its row of blocks, B's by the ``pm`` of its column; all cores progress alike):
        * *across cores*: the cores sharing a block load it at about the same step; between them
          the chip loads about two chunks per core (the loads run two steps ahead of the cube);
        * *inside a core*: an operand that is not kept resident is loaded again for every tile
          (A, walking a row of tiles), row of tiles (B) or column of tiles (A, with B resident);
          between two passes each core loads the A and B tiles of one pass.
        """
        if self.l2_capacity is None:
            return 1.0, 1.0
        pb, pm, pn, pk = grid
        used = pb * pm * pn * pk
        distinct_a, distinct_b = batch * _nbytes(m * k, self.e), batch * _nbytes(k * n, self.e)
        nt_m, nt_n = _cdiv(big.mb, big.tm), _cdiv(big.nb, big.tn)
        tile_a, tile_b = big.tm * big.kb * self.e, big.kb * big.tn * self.e  # one tile's operands, whole K

        def distance(a_tiles: int, b_tiles: int) -> float:  # distinct bytes of a pass, chip-wide
            return used * (a_tiles * tile_a / pn + b_tiles * tile_b / pm)

        across = 2 * used * (big.tm + big.tn) * big.kc * self.e
        pass_a = distance(nt_m, 1) if big.reuse == "b" else distance(1, 1)
        pass_b = distance(1, nt_n)
        fractions = []
        for loads, distinct, copies, per_pass in ((loads_a, distinct_a, pn, pass_a), (loads_b, distinct_b, pm, pass_b)):
            if loads <= 0:
                fractions.append(1.0)
                continue
            rereads = [l2_model.Reread(loads * (copies - 1) / copies, across),
                       l2_model.Reread(max(0.0, loads / copies - distinct), per_pass)]
            hits = min(loads - distinct, l2_model.hit_bytes(rereads, self.l2_capacity))
            fractions.append(1.0 - max(0.0, hits) / loads)
        return fractions[0], fractions[1]

    @lru_cache(maxsize=4096)  # noqa: B019 - one planner per call
    def cycles(self, m: int, k: int, n: int) -> float:
        """The cube's cycles for an ``m x k x n`` tile: the systolic model's, at least the time
        its operands take from L1 into L0A / L0B (the arch's ``kernel`` section: per L0 step of
        ``l0_k_bytes`` of K per row, each step's loads overlapping the MACs of the step before,
        so a step costs the larger of its two loads (each plus the MTE1 start) or its MACs)."""
        sa = self.sa
        cyc = gemm_cost(m, k, n, sa.rows, sa.cols, sa.dataflow, self.kpe, sa.t_inj,
                        double_buffer=sa.double_buffered_weights).cycles
        kc = self.kernel
        if kc is not None and (kc.l1_to_l0a_bytes_per_cycle or kc.l1_to_l0b_bytes_per_cycle):
            k0 = min(k, max(1, int(kc.l0_k_bytes / self.e)))
            full, rest = divmod(k, k0)

            def feed(kk: int) -> float:
                a = m * kk * self.e / kc.l1_to_l0a_bytes_per_cycle + kc.mte1_start_cycles \
                    if kc.l1_to_l0a_bytes_per_cycle else 0.0
                b = kk * n * self.e / kc.l1_to_l0b_bytes_per_cycle + kc.mte1_start_cycles \
                    if kc.l1_to_l0b_bytes_per_cycle else 0.0
                return max(a, b)

            cyc = max(cyc, full * feed(k0) + (feed(rest) if rest else 0.0))
        return cyc

    def chunk(self, tm: int, tn: int, kb: int) -> int:
        """A chunk's K: the most whole folds (``k_unit``) two chunks' operands fit in the buffer; a
        tile too wide for one fold streams in L0 steps (the arch's ``kernel.l0_k_bytes`` of K: the
        cube's L1 -> L0 feed follows the loads at that grain), else in one fold."""
        fit = int(self.buf_bytes / (2 * (tm + tn) * self.e))
        if fit >= self.k_unit:
            return min(fit // self.k_unit * self.k_unit, kb)
        step = max(1, int(self.kernel.l0_k_bytes / self.e)) if self.kernel is not None else self.k_unit
        return min(max(step, fit // step * step), kb)

    @lru_cache(maxsize=4096)  # noqa: B019
    def block(self, mb: int, kb: int, nb: int) -> _Block:
        """Tiles, chunk and panel reuse of a core's block with the least HBM traffic."""
        sa, e = self.sa, self.e
        best = None
        first = max(1, _cdiv(mb * sa.cols, self.acc_elems))  # fewer tile rows leave no room for a column
        for nt_m in range(first, _cdiv(mb, sa.rows) + 1):
            tm = min(mb, _ceil_to(_cdiv(mb, nt_m), sa.rows))
            nt_m = _cdiv(mb, tm)
            tn_max = self.acc_elems // tm // sa.cols * sa.cols
            if tn_max < 1:
                continue
            nt_n = _cdiv(nb, min(nb, tn_max))
            tn = min(nb, _ceil_to(_cdiv(nb, nt_n), sa.cols))
            nt_n = _cdiv(nb, tn)
            a_once, b_once = _nbytes(mb * kb, e), _nbytes(kb * nb, e)
            options = [("none", a_once * nt_n, b_once * nt_m)]
            if nt_n > 1 and tm * kb * e <= self.buf_bytes / 2:
                options.append(("a", a_once, b_once * nt_m))
            if nt_m > 1 and kb * tn * e <= self.buf_bytes / 2:
                options.append(("b", a_once * nt_n, b_once))
            reuse, a_bytes, b_bytes = min(options, key=lambda o: o[1] + o[2])
            key = (a_bytes + b_bytes, nt_m * nt_n)
            if best is None or key < best[0]:
                best = (key, tm, tn, reuse, a_bytes, b_bytes, nt_m, nt_n)
            if nt_n == 1:
                break  # tiles span the block's columns: more rows of tiles only re-read B
        _, tm, tn, reuse, a_bytes, b_bytes, nt_m, nt_n = best
        cycles = 0.0
        for ms, cm in _counts([min(tm, mb - i * tm) for i in range(nt_m)]).items():
            for ns, cn in _counts([min(tn, nb - j * tn) for j in range(nt_n)]).items():
                cycles += cm * cn * self.cycles(ms, kb, ns)
        return _Block(tm, tn, self.chunk(tm, tn, kb), reuse, a_bytes, b_bytes, cycles, mb, kb, nb)

    def estimate(self, m, k, n, batch, grid) -> tuple[float, int, _Block] | None:
        """(estimated cycles, HBM bytes, the largest core's block) of one grid, or None if it
        leaves a core without work or needs more accumulators than a tile holds."""
        pb, pm, pn, pk = grid
        sa = self.sa
        bs, ms, ns = _blocks(batch, pb, 1), _blocks(m, pm, sa.rows), _blocks(n, pn, sa.cols)
        ks = _blocks(k, pk, self.k_unit)
        if min(bs) <= 0 or min(ms) <= 0 or min(ns) <= 0 or min(ks) <= 0:
            return None
        if pk > 1 and ms[0] * ns[0] > self.acc_elems:
            return None  # split K keeps the whole block's partial sums: one tile
        reads_a = reads_b = 0
        for mb, cm in _counts(ms).items():
            for nb, cn in _counts(ns).items():
                for kb, ck in _counts(ks).items():
                    blk = self.block(mb, kb, nb)
                    reads_a += batch * cm * cn * ck * blk.a_bytes
                    reads_b += batch * cm * cn * ck * blk.b_bytes
        reads = reads_a + reads_b
        writes = batch * _nbytes(m * n, self.eo)
        big = self.block(ms[0], ks[0], ns[0])
        fa, fb = self.l2_hbm_fractions(m, k, n, batch, grid, big, reads_a, reads_b)
        total = reads_a * fa + reads_b * fb + writes
        hbm_share = (reads_a * fa + reads_b * fb) / max(1, reads)  # of the loads, reaching HBM
        bb = bs[0]
        core_reads = bb * (big.a_bytes + big.b_bytes)
        load_rate = self.core_bpc if hbm_share >= 1 else \
            1 / (hbm_share / self.core_bpc + (1 - hbm_share) / self.l2_rate(pb * pm * pn * pk))
        last_write = _nbytes(big.tm * big.tn, self.eo) / self.core_bpc if pk == 1 else 0.0
        io = max(core_reads / load_rate + bb * _nbytes(ms[0] * ns[0], self.eo) / pk / self.core_bpc,
                 total / self.hbm_bpc)
        io_bound = io + self.cycles(big.tm, big.kc, big.tn) + last_write  # the cube finishes the last chunk
        compute_bound = (big.tm + big.tn) * big.kc * self.e / load_rate + bb * big.cycles + last_write
        reduce = 0.0
        if pk > 1:  # ring reduce-scatter of the fp32 partial sums, then each core writes its share
            chunk = ms[0] * ns[0] * ACC_BYTES / pk
            lanes = self.arch.cores.vector_unit.lanes
            reduce = (pk - 1) * (chunk / self.link_bpc + chunk / ACC_BYTES / lanes + 20) + \
                _nbytes(ms[0] * ns[0], self.eo) / pk / self.core_bpc
        return max(io_bound, compute_bound) + reduce, int(total), big

    def plans(self, m: int, k: int, n: int, batch: int, share: int) -> list[GemmPlan]:
        """Candidate plans, best estimate first: the best grid for each number of cores used, as
        long as its estimate is within ``PLAN_WINDOW`` of the best, at most ``PLAN_CANDIDATES``."""
        sa = self.sa
        limits = (batch, _cdiv(m, sa.rows), _cdiv(n, sa.cols), _cdiv(k, self.k_unit))
        best: dict[int, tuple] = {}  # cores used -> (key, grid, block)
        for pb in range(1, min(limits[0], share) + 1):
            for pm in range(1, min(limits[1], share // pb) + 1):
                for pn in range(1, min(limits[2], share // (pb * pm)) + 1):
                    for pk in range(1, min(limits[3], share // (pb * pm * pn)) + 1):
                        grid = (pb, pm, pn, pk)
                        est = self.estimate(m, k, n, batch, grid)
                        if est is None:
                            continue
                        cyc, total, blk = est
                        used = pb * pm * pn * pk
                        key = (round(cyc, 6), total, used, grid)
                        if used not in best or key < best[used][0]:
                            best[used] = (key, grid, blk)
        ranked = sorted(best.values(), key=lambda x: x[0])
        top = ranked[0][0][0]
        return [GemmPlan(grid, (blk.tm, blk.tn), blk.kc, blk.reuse, cyc, total)
                for (cyc, total, _, _), grid, blk in ranked[:PLAN_CANDIDATES] if cyc <= top * (1 + PLAN_WINDOW)]

    def plan(self, m: int, k: int, n: int, batch: int, share: int) -> GemmPlan:
        return self.plans(m, k, n, batch, share)[0]

    def candidates(self, m: int, k: int, n: int, batch: int, share: int) -> list[GemmPlan]:
        """The plans a GEMM races: the kernel's own base-block plan when the arch gives one for
        this dtype, else the even split's :meth:`plans`."""
        return [self.base_plan(m, k, n, batch, share)] if self.base_shape() else self.plans(m, k, n, batch, share)

    # -- base blocks (the arch's kernel.base_blocks: the die's GEMM kernel's own tiling) --------

    def base_shape(self) -> tuple[int, int, int] | None:
        """(rows, columns, K per L1 stage) of the kernel's base block for this dtype, or None (the
        even split)."""
        kc = self.kernel
        if kc is None or kc.base_blocks.get(self.dtype) is None:
            return None
        if self.tile is None and self.gemm_kernel == "catlass_single_splitk" and self.e == 2:
            return gemm_kernels.SINGLE_SPLITK_TILE
        return self.tile or kc.base_blocks[self.dtype]

    def tiling(self, m: int, n: int, share: int) -> tuple[int, int, int]:
        """(rows, columns, K per L1 stage) of the base block the GEMM's kernel gives an ``m x n``
        output on ``share`` cores (:mod:`npusim.system.gemm_kernels`); the L1 stage is the arch's."""
        bm, bn, kl1 = self.base_shape()
        if self.gemm_kernel == "aclnn" and self.tile is None:
            bm, bn = gemm_kernels.aclnn_base(m, n, share)
        return bm, bn, kl1

    def base_order(self, m: int, k: int, n: int, batch: int, share: int
                   ) -> tuple[list[int], list[int], list[int], list[tuple[int, int, int, int]]]:
        """Block row sizes, block column sizes, K slice sizes and (batch item, block row, block
        column, K slice) of each task index: batch items one after the other, each slice-major
        (split K), each slice's blocks in the kernel's swizzle order."""
        bm, bn, kl1 = self.tiling(m, n, share)
        ms, ns = _base_sizes(m, bm), _base_sizes(n, bn)
        ks = [k]
        if self.gemm_kernel == "catlass_splitk":
            ks = gemm_kernels.k_slices(k, kl1, gemm_kernels.splitk_factor(len(ms) * len(ns), k, kl1, share))
        offset, direction = self.swizzle or (self.kernel.swizzle_offset, self.kernel.swizzle_direction)
        blocks = _swizzle(len(ms), len(ns), offset, direction)
        return ms, ns, ks, [(b, i, j, s) for b in range(batch) for s in range(len(ks)) for i, j in blocks]

    def single_splitk_tasks(self, m: int, k: int, n: int, batch: int, share: int
                            ) -> tuple[list[int], list[int], list[int], list[list[tuple[int, int, int]]]]:
        """``catlass_single_splitk`` (:mod:`npusim.system.gemm_kernels`): block row sizes, block
        column sizes, K tile sizes and each core's tasks (block row, block column, K tile) in its
        order -- its range of (m, n) blocks once per K tile, K outermost."""
        if batch != 1:
            raise ConfigError("catlass_single_splitk: one GEMM at a time (batch 1)")
        bm, bn, kl1 = self.tiling(m, n, share)
        ms, ns, ks = _base_sizes(m, bm), _base_sizes(n, bn), _base_sizes(k, kl1)
        offset = self.swizzle[0] if self.swizzle else gemm_kernels.SINGLE_SPLITK_SWIZZLE
        coords = [gemm_kernels.single_splitk_coord(t, len(ms), len(ns), offset) for t in range(len(ms) * len(ns))]
        tasks = [[(*coords[t], sl) for sl in range(len(ks)) for t in range(first, first + count)]
                 for first, count in gemm_kernels.single_splitk_ranges(len(coords), share) if count]
        return ms, ns, ks, tasks

    def base_block(self, mb: int, k: int, nb: int) -> _Block:
        """One base block: a single tile over the whole K (its accumulators fill L0C), both operands
        loaded for it (no panel stays resident across blocks), K in L1 stages."""
        return _Block(mb, nb, min(self.base_shape()[2], k), "none", _nbytes(mb * k, self.e),
                      _nbytes(k * nb, self.e), self.cycles(mb, k, nb), mb, k, nb)

    def base_l2_fractions(self, order: list[tuple[int, int, int, int]], used: int, ms: list[int], ns: list[int],
                          ks: list[int]) -> tuple[tuple[float, float], tuple[float, float]]:
        """Of A's and of B's loads, the fractions that reach HBM (the rest hit in the L2), and the
        fractions that hit on a fill under way, by the blocks' order: task ``t`` runs on core
        ``t % used`` in wave ``t // used``. A block row of A (column of B; of one K slice) loaded
        again in the same wave is a re-read at about the same step (the chip loads about two L1
        stages per core in between): it waits for the first reader's fill (an MSHR merge), so it
        costs no HBM traffic but arrives at HBM's pace; in a later wave its reuse distance is the
        distinct operand bytes of the waves in between (LRU, :mod:`npusim.hw.memory.l2`)."""
        if self.l2_capacity is None:
            return (1.0, 1.0), (0.0, 0.0)
        e, kl1 = self.e, min(self.base_shape()[2], max(ks))
        size = {0: [[_nbytes(mb * kb, e) for kb in ks] for mb in ms],
                1: [[_nbytes(kb * nb, e) for kb in ks] for nb in ns]}
        waves = _cdiv(len(order), used)
        cum = [0.0]  # distinct operand bytes of the waves before
        for w in range(waves):
            keys = {(side, b, x, sl) for b, i, j, sl in order[w * used:(w + 1) * used] for side, x in ((0, i), (1, j))}
            cum.append(cum[-1] + sum(size[side][x][sl] for side, _, x, sl in keys))
        across = 2 * used * (max(ms) + max(ns)) * kl1 * e
        last: dict[tuple, int] = {}
        loads, rereads, merged = [0.0, 0.0], [[], []], [[], []]
        for t, (b, i, j, sl) in enumerate(order):
            w = t // used
            for side, x in ((0, i), (1, j)):
                key, nbytes = (side, b, x, sl), size[side][x][sl]
                loads[side] += nbytes
                if key in last:
                    lw = last[key]
                    reread = l2_model.Reread(nbytes, across if lw == w else cum[w] - cum[lw + 1] + across)
                    (merged if lw == w else rereads)[side].append(reread)
                last[key] = w
        cap = self.l2_capacity
        hbm = tuple(1.0 - l2_model.hit_bytes(rereads[s] + merged[s], cap) / loads[s] if loads[s] else 1.0
                    for s in (0, 1))
        fill = tuple(l2_model.hit_bytes(merged[s], cap) / loads[s] if loads[s] else 0.0 for s in (0, 1))
        return hbm, fill

    def base_plan(self, m: int, k: int, n: int, batch: int, share: int) -> GemmPlan:
        """The kernel's own plan: base blocks (and K slices) dealt to ``min(tasks, share)`` cores in
        waves."""
        if self.gemm_kernel == "catlass_single_splitk":
            ms, ns, ks, tasks = self.single_splitk_tasks(m, k, n, batch, share)
            blk = self.base_block(ms[0], ks[0], ns[0])
            steps = max(len(t) for t in tasks)
            est = steps * max(blk.cycles, (blk.a_bytes + _nbytes(ms[0] * ns[0], ACC_BYTES)) / self.core_bpc)
            return GemmPlan((batch, len(ms), len(ns), 1), (ms[0], ns[0]), blk.kc, "a", est,
                            _nbytes(m * k + k * n, self.e) + _nbytes(m * n, self.eo), len(tasks),
                            _cdiv(steps, len(ks)), self.gemm_kernel, len(ks))
        ms, ns, ks, order = self.base_order(m, k, n, batch, share)
        used = min(len(order), share)
        waves = _cdiv(len(order), used)
        (fa, fb), _ = self.base_l2_fractions(order, used, ms, ns, ks)
        a = sum(_nbytes(ms[i] * ks[sl], self.e) for _, i, _, sl in order)
        b = sum(_nbytes(ks[sl] * ns[j], self.e) for _, _, j, sl in order)
        hbm = int(a * fa + b * fb) + batch * _nbytes(m * n, self.eo)
        blk = self.base_block(ms[0], ks[0], ns[0])
        est = waves * max(blk.cycles, (blk.a_bytes + blk.b_bytes) / self.core_bpc)  # a rough figure (reported)
        return GemmPlan((batch, len(ms), len(ns), 1), (ms[0], ns[0]), blk.kc, "none", est, hbm, used, waves,
                        self.gemm_kernel, len(ks))


# -- GEMM emission --------------------------------------------------------------------------------

@dataclass
class _Unit:
    cycles: float  # the chunk's share of its tile's cube time
    a_bytes: int  # A read before this chunk's compute (0: resident)
    b_bytes: int
    write: int  # bytes written after it (the tile's last chunk)
    runs: tuple = ()  # with a layout (the TLM L2): the (address, bytes) runs its A and B loads read


class Layout:
    """Where the operands live in HBM when the TLM L2 decides the hits (see the module docstring):
    per batch item, A's blocks of rows x K slice (``ms[i] x ks[kk]``) one after the other, B's
    blocks of K slice x columns likewise, then C. Inside a block a *panel* layout: the block's
    canonical tiles along M (A; B: along N) -- the tiling of the first core that reads the block
    -- one after the other, each tile cut along K into fractals of ``k_unit`` (the array's K per
    fold) stored in K order, a fractal row-major (A: each row's K elements together; B: each
    column's). So a chunk of a canonical tile is one contiguous run, and cores that tile a block
    differently read the same bytes at the same addresses (one run per fractal). This is the
    pre-formatted layout a vendor's GEMM reads (Ascend's fractal NZ-style formats); the L2 sees
    each operand byte at one address whoever reads it."""

    def __init__(self, planner: Planner, batch: int, bs, ms, ks, ns, whole_blocks: bool = False,
                 bases: tuple[int, int, int] | None = None):
        e, self.e, self.ku = planner.e, planner.e, planner.k_unit
        self.ms, self.ks, self.ns = ms, ks, ns
        self.a_off, self.b_off = {}, {}
        off = 0
        for i, mb in enumerate(ms):
            for kk, kb in enumerate(ks):
                self.a_off[i, kk] = off
                off += mb * kb
        self.a_item = off  # elements of one batch item's A
        off = 0
        for kk, kb in enumerate(ks):
            for j, nb in enumerate(ns):
                self.b_off[kk, j] = off
                off += kb * nb
        self.b_item = off
        if whole_blocks:  # base blocks: a block is one tile
            self.a_tile = {(i, kk): ms[i] for i in range(len(ms)) for kk in range(len(ks))}
            self.b_tile = {(kk, j): ns[j] for kk in range(len(ks)) for j in range(len(ns))}
        else:
            self.a_tile = {(i, kk): planner.block(ms[i], ks[kk], ns[0]).tm for i in range(len(ms))
                           for kk in range(len(ks))}
            self.b_tile = {(kk, j): planner.block(ms[0], ks[kk], ns[j]).tn for kk in range(len(ks))
                           for j in range(len(ns))}
        if bases is not None:  # where the caller keeps A, B and C (bytes)
            self.a_base, self.b_base, self.c_base = bases
            return
        align = 1 << 20
        self.a_base = 0
        self.b_base = _ceil_to(int(math.ceil(batch * self.a_item * e)), align)
        self.c_base = _ceil_to(self.b_base + int(math.ceil(batch * self.b_item * e)), align)

    def _runs(self, base_el: float, outer: int, kb: int, tile: int, o0: int, o1: int, k0: int, k1: int) -> list:
        """Element runs of outer indices ``[o0, o1)`` x K ``[k0, k1)`` of a block of ``outer x kb``
        elements stored in the panel layout with canonical tiles of ``tile`` along ``outer``."""
        ku, out = self.ku, []
        for t in range(o0 // tile, (o1 - 1) // tile + 1):
            t0 = t * tile
            rows = min(tile, outer - t0)
            tbase = base_el + t0 * kb
            r0, r1 = max(o0, t0), min(o1, t0 + rows)
            f0 = k0 // ku
            if r0 == t0 and r1 == t0 + rows:  # whole canonical tile: its fractals k0..k1 are contiguous
                out.append((tbase + rows * f0 * ku, rows * (k1 - k0)))
                continue
            for f in range(f0, -(-k1 // ku)):
                w = min(ku, kb - f * ku)
                out.append((tbase + rows * f * ku + (r0 - t0) * w, (r1 - r0) * w))
        return out

    def a_runs(self, item: int, i: int, kk: int, r0: int, r1: int, k0: int, k1: int) -> list:
        base = self.a_base / self.e + item * self.a_item + self.a_off[i, kk]
        return self._runs(base, self.ms[i], self.ks[kk], self.a_tile[i, kk], r0, r1, k0, k1)

    def b_runs(self, item: int, kk: int, j: int, n0: int, n1: int, k0: int, k1: int) -> list:
        base = self.b_base / self.e + item * self.b_item + self.b_off[kk, j]
        return self._runs(base, self.ns[j], self.ks[kk], self.b_tile[kk, j], n0, n1, k0, k1)

    def to_bytes(self, runs) -> list[tuple[int, int]]:
        """Element runs as byte runs, contiguous ones merged."""
        out: list[list[int]] = []
        for start, n in runs:
            a, b = int(math.floor(start * self.e)), int(math.ceil((start + n) * self.e))
            if out and out[-1][0] + out[-1][1] == a:
                out[-1][1] += b - a
            else:
                out.append([a, b - a])
        return [(a, n) for a, n in out]


def _step_sizes(units: int, max_steps: int) -> list[int]:
    """Units per step: single units at both ends, doubling towards ``g`` in the middle."""
    g = max(1, -(-units // max_steps))
    sizes_head, sizes_tail = [], []
    left, s = units, 1
    while s < g and left > 2 * s:
        sizes_head.append(s)
        sizes_tail.append(s)
        left -= 2 * s
        s *= 2
    middle = [g] * (left // g) + ([left % g] if left % g else [])
    return sizes_head + middle + sizes_tail[::-1]


class Emitter:
    def __init__(self, planner: Planner, prog: Program, layout: Layout | None = None, address: int = 0, deps=()):
        self.pl, self.prog = planner, prog
        self.layout = layout  # the TLM L2: loads read the operands' real addresses (Layout)
        # each DMA's address, placed as it goes from ``address`` (with a layout only C's)
        self.addr = address if layout is None else layout.c_base
        self.deps = list(deps)  # what every core's first task waits for (the ops before, in a forward pass)
        self.engine_bytes: dict[int, list[int]] = {}
        self.hbm_fraction = (1.0, 1.0)  # of A's and B's loads that reach HBM (the rest: L2 hits)
        self.merged_fraction = (0.0, 0.0)  # of the L2 hits, those of a fill under way (read at HBM's pace)
        self.l2_bpc = 0.0  # a core's L2 read rate, bytes per cycle (set_l2)
        self.l2_bytes = 0
        self.head = 0  # cycles of each working core's kernel start + prologue (a task before its first load)
        self.fixpipe_waits = False  # a tile's accumulators fill L0C: the next tile's MACs wait for its write-back
        #: called with (core, the write task, bytes written, name) after each step's write-back: the
        #: vector side's epilogue on what the cube wrote, returning (its last task, bytes it then
        #: writes to HBM), or None. Its write is queued one step later, behind the next step's loads
        #: (the DMA queues are in order; the vector side's own MTE3 does not wait for the cube's loads)
        self.epilogue = None
        #: C goes to a workspace the L2 keeps (a quant kernel's int32 ring, read back at once by the
        #: vector side): its write-back holds the core's DMA engine at the L2 rate and costs no HBM
        #: traffic (the vendor's L2 is write-back; the reuse model's writes otherwise bypass it)
        self.c_in_l2 = False
        self.first_loads_wait: list[int] = []  # what a core's first loads also wait for (a prologue's barrier)

    def _dma(self, core: int, nbytes: int, write: bool, deps, name: str, engine: int) -> int:
        t = self.prog.add_dma(core, nbytes, address=self.addr, write=write, deps=deps, dma_engine=engine, name=name)
        self.addr = (self.addr + nbytes + 4095) // 4096 * 4096
        self.engine_bytes.setdefault(core, [0] * self.pl.engines)[engine] += nbytes
        return t

    def _engine_parts(self, core: int, size: int) -> list[tuple[int, int]]:
        """``(engine, bytes)`` parts of a transfer of ``size`` bytes: split evenly over the core's
        DMA engines, each part at least ``SPLIT_RUN_BYTES`` (small transfers are not worth
        splitting; one goes to the least loaded engine)."""
        total = self.pl.engines
        engines = max(1, min(total, size // SPLIT_RUN_BYTES))
        first = self._least_loaded(core) if engines < total else 0
        parts = [((first + i) % total, _split(size, engines, i)) for i in range(engines)]
        return [(e, part) for e, part in parts if part]

    def loads(self, core: int, nbytes: int, l2_bytes: int, deps, name: str, merged_bytes: int = 0) -> list[int]:
        """``nbytes`` read from HBM and ``l2_bytes`` from the L2, each split over the core's DMA
        engines (:meth:`_engine_parts`); an L2 read holds its engine for bytes / its share of the rate.
        ``merged_bytes`` are L2 hits on a fill another core started at the same step: no HBM
        traffic, but they arrive no faster than that fill (the engines' HBM rate)."""
        out = []
        total = self.pl.engines
        for size, rate in ((nbytes, None), (l2_bytes, self.l2_bpc), (merged_bytes, self.pl.core_bpc)):
            for engine, part in self._engine_parts(core, size):
                if rate is not None:
                    cycles = math.ceil(part / (rate / total)) + self.pl.l2_latency
                    out.append(self.prog.add_compute(core, f"dma{engine}", cycles, deps=deps, name=f"{name} L2"))
                    self.engine_bytes.setdefault(core, [0] * total)[engine] += part
                    self.l2_bytes += part
                else:
                    out.append(self._dma(core, part, False, deps, name, engine))
        return out

    def load_runs(self, core: int, runs: list[tuple[int, int]], deps, name: str) -> list[int]:
        """Reads of the byte ``runs`` (address, bytes) at their addresses, for the TLM L2 to serve
        or pass to HBM, each split over the core's DMA engines as :meth:`loads` splits a load.
        (Whole runs on one engine each, fewer transfers, were slower: 50.7 against 46.6 us for
        2048^3 int8 on ascend-910c-die, one engine's tags then carry a run.)"""
        out = []
        for addr, size in runs:
            at = addr
            for engine, part in self._engine_parts(core, size):
                out.append(self.prog.add_dma(core, part, address=at, deps=deps, dma_engine=engine, name=name))
                self.engine_bytes.setdefault(core, [0] * self.pl.engines)[engine] += part
                at += part
        return out

    def _least_loaded(self, core: int) -> int:
        return int(np.argmin(self.engine_bytes.setdefault(core, [0] * self.pl.engines)))

    def write(self, core: int, nbytes: int, deps, name: str) -> int:
        return self._dma(core, nbytes, True, deps, name, self._least_loaded(core))

    def writes(self, core: int, nbytes: int, deps, name: str, to_l2: bool = False) -> list[int]:
        """A write of ``nbytes`` split over the core's DMA engines (:meth:`_engine_parts`), as
        :meth:`loads` splits a load (each vector core writing its own rows back by its own MTE3);
        ``to_l2``: the L2 absorbs it, each engine held for its part at its share of the L2 rate."""
        if not to_l2:
            return [self._dma(core, part, True, deps, name, engine) for engine, part in self._engine_parts(core, nbytes)]
        out = []
        for engine, part in self._engine_parts(core, nbytes):
            cycles = math.ceil(part / (self.l2_bpc / self.pl.engines)) + self.pl.l2_latency
            out.append(self.prog.add_compute(core, f"dma{engine}", cycles, deps=deps, name=f"{name} L2"))
            self.engine_bytes.setdefault(core, [0] * self.pl.engines)[engine] += part
        return out

    def write_l2(self, core: int, nbytes: int, deps, name: str) -> int:
        """A write the L2 absorbs (see ``c_in_l2``): the least loaded DMA engine held for
        ``nbytes`` at the core's L2 rate."""
        engine = self._least_loaded(core)
        self.engine_bytes.setdefault(core, [0] * self.pl.engines)[engine] += nbytes
        return self.prog.add_compute(core, f"dma{engine}", math.ceil(nbytes / self.l2_bpc) + self.pl.l2_latency,
                                     deps=deps, name=name)

    def units(self, mb: int, kb: int, nb: int, bb: int, blk: _Block, write_tiles: bool,
              where: tuple | None = None) -> list[_Unit]:
        """A core's chunks in loop order (see module docstring). ``where`` = (first batch item,
        block row i, block column j, K slice kk): with a layout, each chunk's loads as address runs."""
        e, eo = self.pl.e, self.pl.eo
        tms = [min(blk.tm, mb - i * blk.tm) for i in range(_cdiv(mb, blk.tm))]
        tns = [min(blk.tn, nb - j * blk.tn) for j in range(_cdiv(nb, blk.tn))]
        kcs = [min(blk.kc, kb - c * blk.kc) for c in range(_cdiv(kb, blk.kc))]
        order = ([(i, j) for j in range(len(tns)) for i in range(len(tms))] if blk.reuse == "b" else
                 [(i, j) for i in range(len(tms)) for j in range(len(tns))])
        out: list[_Unit] = []
        lay = self.layout if where is not None else None
        for item in range(bb):
            seen_a, seen_b = set(), set()
            for i, j in order:
                tm, tn = tms[i], tns[j]
                a_new = blk.reuse != "a" or i not in seen_a
                b_new = blk.reuse != "b" or j not in seen_b
                seen_a.add(i)
                seen_b.add(j)
                tile = self.pl.cycles(tm, kb, tn)  # one accumulation over the whole K (L0C)
                for c, kc in enumerate(kcs):
                    runs = ()
                    if lay is not None:
                        b0, bi, bj, kk = where
                        k0 = c * blk.kc
                        runs = tuple((lay.a_runs(b0 + item, bi, kk, i * blk.tm, i * blk.tm + tm, k0, k0 + kc)
                                      if a_new else []) +
                                     (lay.b_runs(b0 + item, kk, bj, j * blk.tn, j * blk.tn + tn, k0, k0 + kc)
                                      if b_new else []))
                    out.append(_Unit(tile * kc / kb, _nbytes(tm * kc, e) if a_new else 0,
                                     _nbytes(kc * tn, e) if b_new else 0,
                                     _nbytes(tm * tn, eo) if c == len(kcs) - 1 and write_tiles else 0, runs))
        return out

    def set_l2(self, m: int, k: int, n: int, batch: int, grid: tuple, big: _Block, work: list[list[_Unit]]) -> None:
        """Which share of the emitted loads of A and of B hit in the L2 (the planner's reuse
        model, on the loads as emitted), and the rate a core reads its hits at."""
        a_all = sum(u.a_bytes for units in work for u in units)
        b_all = sum(u.b_bytes for units in work for u in units)
        self.hbm_fraction = self.pl.l2_hbm_fractions(m, k, n, batch, grid, big, a_all, b_all)
        if self.pl.l2_capacity is not None:
            self.l2_bpc = self.pl.l2_rate(math.prod(grid))

    def _split_load(self, step: list[_Unit]) -> tuple[int, int, int]:
        """(HBM bytes, L2 bytes, merged L2 bytes) of a step's loads."""
        a = sum(u.a_bytes for u in step)
        b = sum(u.b_bytes for u in step)
        hbm = int(round(a * self.hbm_fraction[0] + b * self.hbm_fraction[1]))
        merged = min(a + b - hbm, int(round(a * self.merged_fraction[0] + b * self.merged_fraction[1])))
        return hbm, a + b - hbm - merged, merged

    def core_program(self, core: int, units: list[_Unit], tag: str) -> int:
        """Steps of merged chunks: loads (two steps ahead of the cube), GEMMs, writes; returns the
        core's last task."""
        prog = self.prog
        steps, i = [], 0
        for size in _step_sizes(len(units), MAX_STEPS):
            steps.append(units[i:i + size])
            i += size
        computes: list[int] = []
        loads: dict[int, list[int]] = {}
        head = prog.add_compute(core, "cube", self.head, deps=self.deps, name=f"{tag} kernel start") \
            if self.head else -1

        def issue_load(s: int) -> None:
            if s >= len(steps):
                return
            deps = [computes[s - 2]] if s >= 2 else ([head] if head >= 0 else self.deps) + self.first_loads_wait
            if self.layout is not None:  # real addresses: the TLM L2 decides what hits
                runs = self.layout.to_bytes([r for u in steps[s] for r in u.runs])
                loads[s] = self.load_runs(core, runs, deps, f"{tag} load{s}") if runs else list(deps)
                return
            hbm, l2, merged = self._split_load(steps[s])
            loads[s] = self.loads(core, hbm, l2, deps, f"{tag} load{s}", merged) if hbm or l2 or merged \
                else list(deps)

        issue_load(0)
        issue_load(1)
        last = head
        written = -1  # the last tile's write-back, when the next tile's MACs must wait for it
        pending = None  # the last step's epilogue (task, bytes, name), written out one step later
        done = 0.0  # cube cycles so far (rounded per step without drift)
        for s, step in enumerate(steps):
            before = int(round(done))
            done += sum(u.cycles for u in step)
            last = prog.add_compute(core, "cube", int(round(done)) - before, deps=[*loads.pop(s), last, written],
                                    name=f"{tag} gemm{s}")
            computes.append(last)
            issue_load(s + 2)  # its buffer is free once this step's GEMMs are done
            if pending:  # the previous step's epilogue writes out behind this step's loads
                self.write(core, pending[1], [pending[0]], pending[2])
                pending = None
            nbytes = sum(u.write for u in step)
            if nbytes:
                last_write = self.write_l2(core, nbytes, [last], f"{tag} write{s} (L2)") if self.c_in_l2 \
                    else self.write(core, nbytes, [last], f"{tag} write{s}")
                written = last_write if self.fixpipe_waits else -1
                if self.epilogue is not None:
                    task, out = self.epilogue(core, last_write, nbytes, f"{tag} epilogue{s}")
                    pending = (task, out, f"{tag} epilogue{s} write")
                    if s == len(steps) - 1:
                        return self.write(core, out, [task], pending[2])
                if s == len(steps) - 1:
                    return last_write
        return last


# -- the lowering both paths take ----------------------------------------------------------------

def check_tile(arch: Arch, cores: list[int], dtype: str, tile) -> tuple[int, int, int]:
    """A stated base block ``(m, n, k)`` (CATLASS's ``L1TileShape``), checked against the cores' L0C
    (fp32 accumulators in a quarter of the SRAM: 128 KB on the Ascend presets) and L1 (A and B
    stages double-buffered in the SRAM): a tiling the die cannot hold is an error, not a guess."""
    try:
        bm, bn, bk = (int(x) for x in tile)
    except (TypeError, ValueError):
        raise ConfigError(f"tile {tile!r}: expected three positive integers (m, n, k)") from None
    if min(bm, bn, bk) < 1 or any(x != y for x, y in zip((bm, bn, bk), tile)):
        raise ConfigError(f"tile {tile!r}: expected three positive integers (m, n, k)")
    sram = min(arch.sram_for(c).capacity_mb for c in cores) * MB
    if bm * bn * ACC_BYTES > sram / 4:
        raise ConfigError(f"tile {bm}x{bn}x{bk}: its fp32 accumulators ({bm * bn * ACC_BYTES} B) exceed the "
                          f"L0C ({int(sram / 4)} B, a quarter of the core's {int(sram)} B SRAM)")
    if 2 * (bm + bn) * bk * DTYPE_BYTES[dtype] > sram:
        raise ConfigError(f"tile {bm}x{bn}x{bk} {dtype}: two stages of A and B "
                          f"({int(2 * (bm + bn) * bk * DTYPE_BYTES[dtype])} B) exceed the core's {int(sram)} B L1")
    return bm, bn, bk


def check_swizzle(swizzle) -> tuple[int, int]:
    """A stated block swizzle ``(offset, direction)`` (CATLASS ``GemmIdentityBlockSwizzle``)."""
    try:
        offset, direction = (int(x) for x in swizzle)
    except (TypeError, ValueError):
        raise ConfigError(f"swizzle {swizzle!r}: expected (offset >= 1, direction 0 or 1)") from None
    if offset < 1 or direction not in (0, 1):
        raise ConfigError(f"swizzle {swizzle!r}: expected (offset >= 1, direction 0 or 1)")
    return offset, direction


def head_cycles(arch: Arch, setup_us: float) -> int:
    """Cycles a working core waits before its first load: the kernel's device-side start and the
    core's own prologue (``setup_us``), both from the arch's ``kernel`` section (0 without it)."""
    if arch.kernel is None:
        return 0
    return int(round((arch.kernel.start_us + setup_us) * 1e3 * arch.clock_ghz))


def is_mix_kernel(kernel: str, dtype: str, out_dtype: str, vector_timed: bool = True) -> bool:
    """Whether a base-block GEMM kernel launches its AIVs beside its AICs (a MIX kernel), from the
    vendor kernels:

    * ``catlass_splitk`` (``quant_multi_core_splitk_matmul_tla.hpp``) and ``catlass_single_splitk``
      (``single_core_slicek_matmul.hpp``): always (the AIVs reduce / pad and cast);
    * ``catlass_basic`` at INT8 (``quant_matmul.hpp``: the per-token dequant epilogue on the AIVs), when
      the arch times the vector side (``_VectorSide.timed``: else the epilogue is not emitted);
    * ``aclnn`` at INT8 with a bf16 output: ops-nn QuantBatchMatmulV3 (``quant_batch_matmul_v3_tiling.cpp``
      and ``_basic_tiling.cpp`` ``DoOpTiling``: ``isUbQuant_ = cDtype == DT_BF16 || isPertoken``, then
      ``CalcUbTiling``: the dequant runs in the AIVs' UB). Only its start is charged: the AIVs' dequant
      pass and its workspace are not emitted (the fix-pipe's bf16 write stands for them; session 44's
      MIX lowering was reverted, eb1939d). A per-token scale with fp16 out is MIX too (not seen here).

    The kernel's binary, not its plan, decides: a ``catlass_splitk`` plan of one K slice still
    launches the MIX kernel."""
    if kernel in ("catlass_splitk", "catlass_single_splitk"):
        return True
    if dtype != "int8":
        return False
    if kernel == "catlass_basic":
        return vector_timed
    return kernel == "aclnn" and out_dtype == "bf16"


def mix_start_us(arch: Arch, used: int, cores: int) -> float:
    """A MIX kernel's extra start when it launches ``used`` cube cores and is tiled for ``cores``
    (microseconds): ``kernel.mix_start_us + kernel.mix_start_core_us x used / cores``.

    Source: CATLASS ``examples/102_dynamic_optimized_matmul/include/select_kernel_b16.h``,
    ``GetPaddingTag``: ``headCost = 1 + 7 * blockDimAic / platformInfo.coreNum`` (us), with
    ``blockDimAic`` the cube cores the kernel launches (``min(tasks, coreNum)`` for aclnn; the whole
    share for the CATLASS examples, :meth:`Planner.mix_start_us`): one ``coreNum`` gives both the
    tiling's core count and the head cost's denominator. ``include/platform_info.h`` fills it from
    ``PlatformAscendCManager::GetInstance()->GetCoreNumAic()``, the AIC count the platform reports:
    the die's, or, under a core limit (torchair ``limit_core_num``'s ``_op_aicore_num``,
    ``aclrtSetStreamResLimit``), assumed the limited count the op's tiling is given (the docs say the
    op runs on that many cores; that its tiling sees it is an inference). So ``cores`` is the
    count the kernel is tiled for on every path (session 46): a GEMM's share
    (:meth:`Planner.mix_start_us`, whose tiling is the share's: ``gemm_kernels.aclnn_base(m, n,
    share)``) and an attention kernel's group (:func:`npusim.mapping.mapper.attention_mix_start_us`).
    The die's count for a kernel tiled for a share would let the tiler spread a small MIX GEMM
    over every core while paying a start that grows with them: a GEMM on the whole die slower than on
    half of it (256 x 1536 x 512 INT8 on the 910C die: 14.8 us on 24 cores, 12.7 on 12).
    ``used`` above ``cores`` is clipped to it. 0 without a ``kernel`` section."""
    kc = arch.kernel
    if kc is None:
        return 0.0
    cores = max(cores, 1)
    return kc.mix_start_us + kc.mix_start_core_us * min(max(used, 0), cores) / cores


def kernel_fixed_cycles(planner: Planner, plan: GemmPlan) -> int:
    """The start and prologue a working core of ``plan`` waits before its first load (cycles): the
    kernel's device-side start, the AIC's prologue and, on a MIX kernel, its extra start (what
    :func:`emit_gemm` puts on each core's cube first). 0 without the arch's ``kernel`` section."""
    if planner.kernel is None:
        return 0
    mix_us = planner.mix_start_us(plan.used) if plan.base_blocks else 0.0
    return planner.head_cycles(planner.kernel.cube_setup_us + mix_us)


def runs_kernel(arch: Arch, dtype: str) -> bool:
    """Whether a GEMM of ``dtype`` runs the die's base-block kernel (the arch's ``kernel.base_blocks``
    gives its block): the mapper then lowers it with :func:`emit_gemm` too."""
    return arch.kernel is not None and dtype in arch.kernel.base_blocks


def default_out_dtype(dtype: str) -> str:
    """C's dtype: bf16 for int8/int4/fp8 inputs (dequantised on the way out), else the input's."""
    return "bf16" if dtype in ("int8", "int4", "fp8") else dtype


def gemm_dims(op) -> tuple[int, int, int, int]:
    """``(m, k, n, batch)`` of the GEMM kernel a ``gemm`` op runs: ``batch x m`` rows against one
    weight, or ``batch`` products with their own operands (``weight_batched``, or not a weight)."""
    if op.weight and not op.weight_batched:
        return op.m * op.batch, op.k, op.n, 1
    return op.m, op.k, op.n, op.batch


def kernel_name(arch: Arch, kernel: str | None) -> str:
    """The base-block kernel a GEMM runs: ``kernel``, else the arch's ``kernel.gemm_default``."""
    if kernel is None:
        return arch.kernel.gemm_default if arch.kernel is not None else "catlass_basic"
    if kernel not in gemm_kernels.KERNELS:
        raise ConfigError(f"GEMM kernel '{kernel}': expected one of {list(gemm_kernels.KERNELS)}")
    return kernel


@dataclass
class Emitted:
    """What :func:`emit_gemm` added: each working core's last task, and the bytes the reuse
    model's L2 served (0 when the loads read real addresses: the simulator's L2 decides)."""

    ends: list[int]
    l2_bytes: int


def emit_gemm(prog: Program, planner: Planner, plan: GemmPlan, m: int, k: int, n: int, batch: int,
              share: list[int], *, addressed: bool = False, deps=(), address: int = 0,
              bases: tuple[int, int, int] | None = None, tag: str = "") -> Emitted:
    """The kernel's tasks for ``plan`` on the cores ``share`` added to ``prog``, every core's first
    task after ``deps``. Without ``addressed`` each DMA gets the next free address from ``address``
    and the L2's hits are the reuse model's; with it every load reads the operands' real addresses
    (:class:`Layout`; ``bases``: where A, B and C start, default one after the other from 0) and
    the simulator's L2 decides."""
    if plan.base_blocks:
        return _emit_base(prog, planner, plan, m, k, n, batch, share, addressed, deps, address, bases, tag)
    sa = planner.sa
    pb, pm, pn, pk = plan.grid
    bs, ms, ns = _blocks(batch, pb, 1), _blocks(m, pm, sa.rows), _blocks(n, pn, sa.cols)
    ks = _blocks(k, pk, planner.k_unit)
    em = Emitter(planner, prog, Layout(planner, batch, bs, ms, ks, ns, bases=bases) if addressed else None,
                 address, deps)
    if planner.kernel is not None:
        em.head = planner.head_cycles(planner.kernel.cube_setup_us)
        # the fix-pipe's write-back of a tile that fills L0C (no second buffer) before the next
        # tile accumulates: not charged (FIXPIPE_WAITS, see the module docstring)
        em.fixpipe_waits = FIXPIPE_WAITS and plan.tile[0] * plan.tile[1] > planner.acc_elems // 2
    work = []  # per block of C: its K group's (core, units, tag)
    idx = 0
    for b in range(pb):
        for i in range(pm):
            for j in range(pn):
                group = []
                for kk in range(pk):
                    core = share[idx]
                    idx += 1
                    blk = planner.block(ms[i], ks[kk], ns[j])
                    units = em.units(ms[i], ks[kk], ns[j], bs[b], blk, pk == 1,
                                     (sum(bs[:b]), i, j, kk) if addressed else None)
                    group.append((core, units, f"{tag}c{core} b{b} m{i} n{j} k{kk}"))
                work.append((b, i, j, group))
    if not addressed:
        em.set_l2(m, k, n, batch, plan.grid, planner.block(ms[0], ks[0], ns[0]),
                  [units for *_, group in work for _, units, _ in group])
    ends = []
    for b, i, j, group in work:
        lasts = [em.core_program(core, units, name) for core, units, name in group]
        if pk == 1:
            ends += lasts
            continue
        # reduce the fp32 partial sums over the NoC, each core writes its share
        cores = [core for core, _, _ in group]
        coll = ring_reduce_scatter(prog, cores, bs[b] * ms[i] * ns[j] * ACC_BYTES, deps=lasts, dtype="fp32")
        out = bs[b] * _nbytes(ms[i] * ns[j], planner.eo)
        for r, core in enumerate(cores):
            part = _split(out, pk, r)
            ends.append(em.write(core, part, [coll.done[core]], f"{tag}c{core} write C") if part
                        else coll.done[core])
    return Emitted(ends, em.l2_bytes)


class _VectorSide:
    """A base-block kernel's work on each core's vector side (its AIVs; the arch's ``kernel`` section
    times their instructions, :func:`~npusim.hw.compute.vector_kernel.aiv_tile_cycles`): the AIVs
    start with the kernel (``start_us + vector_setup_us``, beside the AIC's prologue) and then take
    what the cube wrote to global memory from the L2 (HBM without one), the core's AIVs splitting
    the rows evenly.

    * :meth:`dequant` -- an INT8 kernel's per-token dequant (:data:`QUANT_EPILOGUE_KERNELS`): int32 C
      and the scales (4 B per column and per row) read, :data:`DEQUANT_INSTRUCTIONS` fp32 instructions
      per :data:`DEQUANT_TILE_ROWS`-row tile, bf16 D written. Called after each step's write-back of
      the cube (the AIC goes on to its next blocks: the workspace's stages are not modelled), or once
      a split-K kernel's partials are reduced.
    * :meth:`reduce` -- split K's ``SplitkReduceAdd``: the ``factor`` fp32 / int32 partials read,
      ``factor - 1`` Adds, the sum written (int32 for INT8, which the dequant then reads; else C).

    Without the section's vector costs (``vector_cycles_per_repeat``) the reduce's adds take the
    lane model (``Program.add_vector``), as before, and there is no dequant pass."""

    def __init__(self, planner: Planner, em: "Emitter", deps, mix_us: float = 0.0):
        self.pl, self.em, self.deps = planner, em, list(deps)
        self.mix_us = mix_us  # the MIX kernel's extra start (mix_start_us), before the AIVs' prologue
        kc = planner.kernel
        self.timed = kc is not None and kc.vector_cycles_per_repeat is not None
        self.aivs = (kc.vector_cores_per_core or 1) if kc is not None else 1
        self.heads: dict[int, int] = {}
        self.last: dict[int, int] = {}  # core -> its vector side's last compute (one pipe)

    def head(self, core: int) -> list[int]:
        kc = self.pl.kernel
        if kc is None:
            return list(self.deps)
        if core not in self.heads:
            self.heads[core] = self.em.prog.add_compute(core, "vector",
                                                        self.pl.head_cycles(kc.vector_setup_us + self.mix_us),
                                                        deps=self.deps, name=f"c{core} AIV start")
        return [self.heads[core]]

    def _cycles(self, rows: int, cols: int, instructions: int, tile_rows: int | None = None) -> int:
        """One core's busiest AIV on ``rows x cols`` fp32 elements, ``instructions`` per tile."""
        kc = self.pl.kernel
        per_aiv = _cdiv(max(rows, 1), self.aivs)
        step = tile_rows or per_aiv
        total = 0
        for r0 in range(0, per_aiv, step):
            total += aiv_tile_cycles("elementwise", None, min(step, per_aiv - r0), cols,
                                     cycles_per_repeat=kc.vector_cycles_per_repeat,
                                     instruction_cycles=kc.vector_instruction_cycles, dtype="fp32")
        return instructions * total

    def _read(self, core: int, nbytes: int, deps, name: str) -> list[int]:
        l2 = self.pl.l2_capacity is not None
        return self.em.loads(core, 0 if l2 else nbytes, nbytes if l2 else 0, [*deps, *self.head(core)], name)

    def dequant(self, core: int, after: int, nbytes: int, name: str, cols: int) -> int:
        """The dequant of ``nbytes`` of int32 C the core's cube wrote (task ``after``); its last task.
        One task on the vector pipe: the AIVs' own MTE2 / MTE3 move the data, not the AIC's DMA
        queues (in order, they would hold the cube's next loads behind the epilogue), so the pass
        is its tiles through a double-buffered UB (``ubStages = 2``): the first tile's read and
        compute, then each further tile at the slower of the two -- reads at the core's L2 rate
        (HBM's without an L2) shared by its AIVs (an assumption, as FlashAttention's vector side
        shares the core's rate). Returns (the task, the bytes of bf16 D it writes): the caller
        queues that write to HBM on the core's DMA engines."""
        elements = nbytes // ACC_BYTES
        rows = _cdiv(elements, cols)
        per_aiv = _cdiv(rows, self.aivs)
        tiles = _cdiv(per_aiv, DEQUANT_TILE_ROWS)
        t_rows = min(per_aiv, DEQUANT_TILE_ROWS)
        read_bpc = (self.em.l2_bpc if self.pl.l2_capacity is not None else self.pl.core_bpc) / self.aivs
        read = (t_rows * cols + t_rows) * ACC_BYTES / read_bpc  # int32 C and the per-token scales
        comp = self._cycles(t_rows * self.aivs, cols, DEQUANT_INSTRUCTIONS)
        first = cols * ACC_BYTES / read_bpc  # the per-channel scales, once
        cycles = first + read + comp + (tiles - 1) * max(read, comp)
        prev = [self.last[core]] if core in self.last else []
        task = self.em.prog.add_compute(core, "vector", math.ceil(cycles), deps=[after, *self.head(core), *prev],
                                        name=f"{name} dequant")
        self.last[core] = task
        return task, _nbytes(elements, self.pl.eo)

    def reduce(self, core: int, deps, elements: int, factor: int, out_bytes: float, name: str) -> int:
        """Split K's reduce of the core's ``elements`` of C over ``factor`` partials; its write."""
        got = self._read(core, _nbytes(elements * factor, ACC_BYTES), deps, name)
        if self.timed:
            added = self.em.prog.add_compute(core, "vector", self._cycles(self.aivs, _cdiv(elements, self.aivs),
                                                                          factor - 1),
                                             deps=got, name=f"{name} add")
        else:
            added = self.em.prog.add_vector(core, "elementwise", elements * (factor - 1), "fp32", got, name)
        self.last[core] = added
        return self.em.write(core, _nbytes(elements, out_bytes), [added], f"{name} write")


def _emit_base(prog: Program, planner: Planner, plan: GemmPlan, m, k, n, batch, share, addressed, deps, address,
               bases, tag) -> Emitted:
    """The base-block kernel's tasks (see the module docstring): core ``c`` of the ``used``
    takes tasks ``c, c + used, ...`` of the kernel's order, each block's K (slice) streamed in
    L1 stages, its C block written back as it finishes (the write does not hold the cube: the
    next block accumulates while it drains, as the kernel's unit flag lets it). Split K
    (``catlass_splitk``): each task writes its fp32 partial C; once every core is done, the vector
    side of every core the kernel launches (the whole share, :func:`~npusim.mapping.gemm_kernels.launched_cores`)
    reads its share of the partials from the L2, adds them and writes C.
    INT8 on a CATLASS kernel (:data:`QUANT_EPILOGUE_KERNELS`): the cube writes int32 C and the
    vector side dequantises it (:class:`_VectorSide`) -- after each step's write-back, or, with
    split K, once every core has reduced its share (the kernel's all-core barrier), C's base
    blocks dealt to the launched cores in turn."""
    if planner.gemm_kernel == "catlass_single_splitk":
        return _emit_single_splitk(prog, planner, plan, m, k, n, share, deps, address, tag)
    ms, ns, ks, order = planner.base_order(m, k, n, batch, len(share))
    layout = Layout(planner, batch, None, ms, ks, ns, whole_blocks=True, bases=bases) if addressed else None
    em = Emitter(planner, prog, layout, address, deps)
    mix_us = planner.mix_start_us(plan.used)  # a MIX kernel's extra start, on both sides
    em.head = planner.head_cycles(planner.kernel.cube_setup_us + mix_us)
    vec = _VectorSide(planner, em, deps, mix_us)
    quant = planner.dtype == "int8" and planner.gemm_kernel in QUANT_EPILOGUE_KERNELS and vec.timed
    work: list[list[_Unit]] = [[] for _ in range(plan.used)]
    for t, (b, i, j, sl) in enumerate(order):
        units = em.units(ms[i], ks[sl], ns[j], 1, planner.base_block(ms[i], ks[sl], ns[j]), True,
                         (b, i, j, sl) if addressed else None)
        if len(ks) > 1 or quant:  # the partial sums leave L0C in fp32 / int32 (a quant kernel's workspace)
            units[-1].write = _nbytes(ms[i] * ns[j], ACC_BYTES)
        work[t % plan.used] += units
    if planner.l2_capacity is not None:
        em.l2_bpc = planner.l2_rate(plan.used)
    if not addressed:
        em.hbm_fraction, em.merged_fraction = planner.base_l2_fractions(order, plan.used, ms, ns, ks)
    if quant and len(ks) == 1:
        em.epilogue = lambda core, after, nbytes, name: vec.dequant(core, after, nbytes, name, ns[0])
        em.c_in_l2 = planner.l2_capacity is not None and not addressed
    ends = [em.core_program(share[c], units, f"{tag}c{share[c]}") for c, units in enumerate(work)]
    if len(ks) > 1:
        # every launched core's AIVs reduce an even share of C (SplitkReduceAdd: aivNum = GetBlockNum() x
        # GetSubBlockNum(), the cores with no cube task too), behind the AICs' finish flag and barrier
        launched = gemm_kernels.launched_cores(planner.gemm_kernel, plan.used, len(share))
        out = batch * m * n
        reduced = [vec.reduce(share[c], ends, _split(out, launched, c), len(ks), ACC_BYTES if quant else planner.eo,
                              f"{tag}c{share[c]} split-K reduce") for c in range(launched) if _split(out, launched, c)]
        ends = reduced
        if quant:  # CrossCoreBarrier: every AIV's reduce is done before any dequantises
            barrier = prog.add_barrier(reduced, f"{tag} split-K reduce barrier")
            ends = []
            # the per-token dequant walks C's base blocks, block t on launched core t % launched
            # (quant_multi_core_splitk_matmul_tla.hpp, operator()<AIV>: loopIdx = coreIdx; loopIdx +=
            # coreNum over the epilogue scheduler's blocks), the block split over the core's AIVs
            for t, (b, i, j, _) in enumerate(order[:len(order) // len(ks)]):
                core = share[t % launched]
                name = f"{tag}c{core} split-K b{b} m{i} n{j}"
                task, d = vec.dequant(core, barrier, _nbytes(ms[i] * ns[j], ACC_BYTES), name, ns[j])
                ends.append(em.write(core, d, [task], f"{name} write D"))
    return Emitted(ends, em.l2_bytes)


def _emit_single_splitk(prog: Program, planner: Planner, plan: GemmPlan, m, k, n, share, deps, address,
                        tag) -> Emitted:
    """``catlass_single_splitk``'s tasks (:mod:`npusim.system.gemm_kernels`): each core's vector
    side copies its share of A and B into the NZ workspace (read from HBM; written into the L2 when
    both fit it, else to HBM), then an all-core barrier; each AIC walks its tasks (A reloaded only
    on a new block row or K tile, B on a new column or K tile), adding each fp32 partial into the C
    workspace (held by the L2 when it fits: a write at the L2 rate, else to HBM); after every core,
    a barrier and each core's share of the workspace cast into C. The loads' L2 hits: all of them
    when the NZ copies sit in the L2, else the base kernel's reuse model on the cores' tasks
    interleaved step by step. The operands' real addresses (TLM) are not used: the reuse model
    decides the hits at every memory fidelity."""
    ms, ns, ks, tasks = planner.single_splitk_tasks(m, k, n, 1, len(share))
    used = len(tasks)
    em = Emitter(planner, prog, None, address, deps)
    mix_us = planner.mix_start_us(used)  # a MIX kernel's extra start, on both sides
    em.head = planner.head_cycles(planner.kernel.cube_setup_us + mix_us)
    vec = _VectorSide(planner, em, deps, mix_us)
    cap = planner.l2_capacity
    if cap is not None:
        em.l2_bpc = planner.l2_rate(used)
    operands = _nbytes(m * k, planner.e) + _nbytes(k * n, planner.e)
    nz_in_l2 = cap is not None and operands <= cap
    pads = []
    for c, core in enumerate(share):  # every launched core's AIVs take an even share of the copy
        part = _split(operands, len(share), c)
        if not part:
            continue
        got = em.loads(core, part, 0, vec.head(core), f"{tag}c{core} ND->NZ read")
        pads.append(em.write_l2(core, part, got, f"{tag}c{core} ND->NZ write (L2)") if nz_in_l2
                    else em.write(core, part, got, f"{tag}c{core} ND->NZ write"))
    em.first_loads_wait = [prog.add_barrier(pads, f"{tag} ND->NZ barrier")]
    work: list[list[_Unit]] = []
    for core_tasks in tasks:
        units_c, prev = [], None
        for i, j, sl in core_tasks:
            units = em.units(ms[i], ks[sl], ns[j], 1, planner.base_block(ms[i], ks[sl], ns[j]), True)
            if prev is not None and (prev[0], prev[2]) == (i, sl):
                for u in units:
                    u.a_bytes = 0
            if prev is not None and (prev[1], prev[2]) == (j, sl):
                for u in units:
                    u.b_bytes = 0
            units[-1].write = _nbytes(ms[i] * ns[j], ACC_BYTES)
            units_c += units
            prev = (i, j, sl)
        work.append(units_c)
    em.c_in_l2 = cap is not None and m * n * ACC_BYTES <= cap
    if cap is not None and not nz_in_l2:
        steps = max(len(t) for t in tasks)
        order = [(0, *t[s]) for s in range(steps) for t in tasks if s < len(t)]
        em.hbm_fraction, em.merged_fraction = planner.base_l2_fractions(order, used, ms, ns, ks)
    elif cap is not None:
        em.hbm_fraction = (0.0, 0.0)  # the NZ copies were written into the L2: every load hits
    ends = [em.core_program(share[c], units, f"{tag}c{share[c]}") for c, units in enumerate(work)]
    done = prog.add_barrier(ends, f"{tag} cube done barrier")
    out = []
    for c, core in enumerate(share[:used]):
        part = _split(m * n, used, c)
        name = f"{tag}c{core} cast C"
        got = vec._read(core, _nbytes(part, ACC_BYTES), [done], name) if em.c_in_l2 else \
            em.loads(core, _nbytes(part, ACC_BYTES), 0, [done, *vec.head(core)], name)
        if vec.timed:
            cast = prog.add_compute(core, "vector", vec._cycles(vec.aivs, _cdiv(part, vec.aivs), 1), deps=got,
                                    name=f"{name} Cast")
        else:
            cast = prog.add_vector(core, "elementwise", part, "fp32", got, name)
        out.append(em.write(core, _nbytes(part, planner.eo), [cast], f"{name} write"))
    return Emitted(out, em.l2_bytes)
