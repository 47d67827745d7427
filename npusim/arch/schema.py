"""The hardware description schema (``arch/*.yaml``).

Units are in the key names: ``_ghz``, ``_cycles`` (core clock cycles unless the
section says otherwise), ``_bytes``, ``_mb`` (MiB = 2**20 bytes), ``_gb``
(GiB = 2**30 bytes), ``_gbps`` (10**9 bytes per second), ``_ns``.
DRAM timings are given in DRAM clock cycles (tCK) or in ns (``timing.unit``).
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, NonNegativeInt, model_validator

from npusim.config import StrictModel


# Every numeric field is bounded to what the models can represent: sizes that are
# allocated (queues, banks, VCs), products that must stay far inside int64 cycle and
# byte arithmetic, and finite floats. The bound is in pydantic's message ("less than or
# equal to ..."). They are generous (10-1000x beyond any chip described in arch/).
#: cores per chip: the engine's path/analytical NoC models need a dense routing table
#: (equal to npusim.hw.noc.routing.DENSE_ROUTING_MAX_ROUTERS; a test checks)
MAX_CORES = 4096


def Pos(hi: int):  # noqa: N802 (a type)
    return Annotated[int, Field(gt=0, le=hi)]


def NonNeg(hi: int):  # noqa: N802
    return Annotated[int, Field(ge=0, le=hi)]


def PosF(hi: float):  # noqa: N802
    return Annotated[float, Field(gt=0, le=hi, allow_inf_nan=False)]

DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")
#: the base-block GEMM kernels a die's ``kernel.gemm_default`` may name (npusim.mapping.gemm_kernels)
GEMM_KERNELS = ("aclnn", "catlass_basic", "catlass_splitk", "catlass_single_splitk")
DTYPE_BYTES = {"fp32": 4.0, "fp16": 2.0, "bf16": 2.0, "fp8": 1.0, "int8": 1.0, "int4": 0.5}
VECTOR_OP_CLASSES = ("elementwise", "activation", "exp", "reduction", "divide")
#: vector-unit throughput per lane when the arch file gives none (the one home of these
#: defaults; ``npusim.hw.compute.vector`` uses them). Assumption, no published source:
#: simple ALU ops and reductions at full rate, activations at half rate, exp and divide on
#: a quarter-rate transcendental unit (a common SIMD design point; listed in
#: docs/ARCHITECTURE.md "Assumptions")
DEFAULT_VECTOR_OPS_PER_CYCLE_PER_LANE = {"elementwise": 1.0, "activation": 0.5, "exp": 0.25, "reduction": 1.0,
                                         "divide": 0.25}


class Grid(StrictModel):
    """The 2D mesh of cores: core id = y * width + x."""

    width: Pos(256)
    height: Pos(256)

    @model_validator(mode="after")
    def _routable(self):
        if self.width * self.height > MAX_CORES:
            raise ValueError(f"{self.width}x{self.height} = {self.width * self.height} cores: at most "
                             f"{MAX_CORES} (the chip's NoC models route with a dense table)")
        return self


class SystolicArray(StrictModel):
    """A rows x cols PE array; each PE does ``macs_per_pe_per_cycle[dtype]`` MACs per cycle
    along the reduction (K) dimension (1 for a classic array; 16 for a 16x16x16 cube).

    ``weight_injection_cycles`` (T_inj, WS only) is derived from ``rows``: missing means
    ``rows`` cycles (one PE row of weights shifted in per cycle). A value that is given is
    kept for this array, and scaled with it when the array is resized by an override
    (``npusim gemm --array``, a core class, an ``extends:`` file that changes ``rows``):
    see :meth:`resized` and :func:`merge_systolic`.
    """

    rows: Pos(4096)
    cols: Pos(4096)
    dataflow: Literal["ws", "os", "cube"] = "ws"
    macs_per_pe_per_cycle: dict[str, Pos(4096)] = Field(default_factory=lambda: {"fp16": 1, "bf16": 1, "int8": 2})
    weight_injection_cycles: NonNeg(10**6) | None = Field(
        default=None, description="cycles to shift a weight tile in (WS); missing = rows (one row per cycle)")
    double_buffered_weights: bool = Field(
        default=True, description="the next fold's weights load while the current fold computes (see hw/compute/systolic)")

    @model_validator(mode="after")
    def _known_dtypes(self):
        unknown = sorted(set(self.macs_per_pe_per_cycle) - set(DTYPES))
        if unknown:
            raise ValueError(f"unknown dtype(s) {unknown} in macs_per_pe_per_cycle; known: {list(DTYPES)}")
        return self

    @property
    def t_inj(self) -> int:
        """Weight-injection cycles in force: the given value, else ``rows``."""
        return self.rows if self.weight_injection_cycles is None else self.weight_injection_cycles

    def resized(self, rows: int, cols: int, t_inj: int | None = None) -> "SystolicArray":
        """This array with ``rows x cols`` PEs; T_inj follows the rows (see :func:`scaled_t_inj`)
        unless ``t_inj`` sets it."""
        wic = t_inj if t_inj is not None else scaled_t_inj(self.weight_injection_cycles, self.rows, rows)
        return self.model_copy(update={"rows": rows, "cols": cols, "weight_injection_cycles": wic})


def scaled_t_inj(t_inj: int | None, old_rows: int, new_rows: int) -> int | None:
    """T_inj of an array resized from ``old_rows`` to ``new_rows`` rows: unset stays unset
    (= rows); a given value keeps its rows-per-cycle rate, ``ceil(t_inj * new / old)``."""
    if t_inj is None or new_rows == old_rows:
        return t_inj
    return -(-t_inj * new_rows // old_rows)


def merge_arch_data(base: dict, override: dict) -> dict:
    """Deep merge of arch mappings (``extends:``, overrides) in which every ``systolic_array``
    mapping is merged by :func:`merge_systolic`, so derived keys follow their sources."""
    merged = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            merged[key] = merge_systolic(old, value) if key == "systolic_array" else merge_arch_data(old, value)
        else:
            merged[key] = value
    return merged


def merge_systolic(base: dict, override: dict) -> dict:
    """``override`` (a partial ``systolic_array`` mapping) over ``base``, derived keys following
    what they derive from: a ``weight_injection_cycles`` inherited from ``base`` is rescaled
    when ``override`` changes ``rows`` without setting it."""
    merged = {**base, **override}
    if ("rows" in override and "weight_injection_cycles" not in override
            and base.get("weight_injection_cycles") is not None and "rows" in base):
        try:
            merged["weight_injection_cycles"] = scaled_t_inj(int(base["weight_injection_cycles"]), int(base["rows"]),
                                                             int(override["rows"]))
        except (TypeError, ValueError, ZeroDivisionError):
            pass  # malformed values: validation reports them
    return merged


class VectorUnit(StrictModel):
    """SIMD vector unit: ``lanes`` elements per cycle at 1 op/lane/cycle; slower op
    classes (exp, divide) have fractional ``ops_per_cycle_per_lane``."""

    lanes: Pos(2**20)
    ops_per_cycle_per_lane: dict[str, PosF(4096)] = Field(
        default_factory=lambda: dict(DEFAULT_VECTOR_OPS_PER_CYCLE_PER_LANE))

    @model_validator(mode="after")
    def _known_classes(self):
        unknown = sorted(set(self.ops_per_cycle_per_lane) - set(VECTOR_OP_CLASSES))
        if unknown:
            raise ValueError(f"unknown op class(es) {unknown}; known: {list(VECTOR_OP_CLASSES)}")
        return self


class Sram(StrictModel):
    """Core-local SRAM (scratchpad): ``banks`` banks, each with one port that moves
    ``bytes_per_cycle_per_bank`` bytes per cycle. The port width in bits is
    ``8 * bytes_per_cycle_per_bank`` (NpuSim's ``sram_bitwidth``: the study's 64/128/256-bit
    ports are 8/16/32 here). The cube, the vector unit and the DMA engines share these ports.

    ``feeds_compute``: the cube and vector unit read their operands from this SRAM, so at the
    detailed (TLM) memory fidelity its port bandwidth can stall them (:mod:`npusim.hw.memory.sram_timing`).
    ``false`` says they read private operand buffers this file does not describe (Ascend's cube
    reads L0A/L0B, its vector cores the UB; the "sram" of those arch files is L1): the SRAM then
    never stalls compute, at any fidelity."""

    capacity_mb: PosF(2**14)
    banks: Pos(4096) = 16
    bytes_per_cycle_per_bank: Pos(2**16) = 64
    access_latency_cycles: NonNeg(10**6) = 2
    bank_interleave_bytes: Pos(2**30) = 64
    feeds_compute: bool = True

    @property
    def port_width_bits(self) -> int:
        """Width of one bank's port in bits (``8 * bytes_per_cycle_per_bank``)."""
        return 8 * self.bytes_per_cycle_per_bank


class Dma(StrictModel):
    """DMA engines of a core; each keeps up to ``max_outstanding`` transactions in flight
    (TLM tags) and splits transfers into ``transaction_bytes`` requests."""

    engines: Pos(256) = 2
    max_outstanding: Pos(4096) = 16
    transaction_bytes: Pos(2**30) = 64
    bytes_per_cycle: PosF(2**30) | None = Field(default=None, description="per DMA engine port limit; None = one transaction per cycle")

    @property
    def port_bytes_per_cycle(self) -> float:
        """One engine's port rate: ``bytes_per_cycle``, or one transaction a cycle when unset."""
        return self.bytes_per_cycle if self.bytes_per_cycle is not None else float(self.transaction_bytes)


class Cores(StrictModel):
    """``cube_vector_exchange``: where a core's systolic array and vector unit hand each other data
    inside one kernel (flash attention's scores and probabilities): ``local`` (a shared on-core
    buffer: free) or ``global_memory`` (a *decoupled* core: the cube and vector units are separate
    cores with their own buffers that pass data through global memory, as Ascend's AIC and AIV on
    the Atlas A2/A3 generation -- the Ascend C programming guide, "基本架构", 分离架构: "AIV与AIC之间
    通过Global Memory进行数据传递"; each hand-off is a write and a read of the data at the L2's
    per-core rate, or through HBM on a chip without an L2)."""

    grid: Grid
    systolic_array: SystolicArray
    vector_unit: VectorUnit
    sram: Sram
    dma: Dma = Dma()
    cube_vector_exchange: Literal["local", "global_memory"] = "local"


class DramTiming(StrictModel):
    """JEDEC-style DRAM timings. ``unit: cycles`` means DRAM clock cycles (tCK).

    Optional timings and what a missing one means (so arch files written before they existed
    keep their behaviour): ``tCCD_L`` (column to column in one bank group) = ``tCCD``
    (``tCCD`` is tCCD_S, different bank groups); ``tRRD_S`` (ACT to ACT, different bank
    groups of a pseudo-channel) = 0, no limit; ``tRRD_L`` (same bank group) = ``tRRD_S``;
    ``tFAW`` (at most four ACTs per pseudo-channel in any tFAW window) = 0, no window;
    ``tRC`` (ACT to ACT, same bank) = ``tRAS + tRP``; ``tRCDWR`` (ACT to write) = ``tRCD``;
    ``tRTP`` (read to precharge) = 0; ``tRFCsb`` (per-bank refresh) is required with
    ``hbm.refresh: per_bank``.
    """

    unit: Literal["cycles", "ns"] = "cycles"
    tRCD: PosF(1e6)
    tCL: PosF(1e6)
    tRP: PosF(1e6)
    tRAS: PosF(1e6)
    tCCD: PosF(1e6) = 2
    tWL: float = Field(default=2, ge=0, le=1e6)
    tWR: float = Field(default=8, ge=0, le=1e6)
    tWTR: float = Field(default=4, ge=0, le=1e6)
    tRTW: float = Field(default=4, ge=0, le=1e6)
    tREFI: float = Field(default=0, ge=0, le=1e6, description="0 disables refresh")
    tRFC: float = Field(default=0, ge=0, le=1e6)
    tCCD_L: float | None = Field(default=None, ge=0, le=1e6)
    tRRD_S: float | None = Field(default=None, ge=0, le=1e6)
    tRRD_L: float | None = Field(default=None, ge=0, le=1e6)
    tFAW: float | None = Field(default=None, ge=0, le=1e6)
    tRC: float | None = Field(default=None, ge=0, le=1e6)
    tRCDWR: float | None = Field(default=None, ge=0, le=1e6)
    tRTP: float | None = Field(default=None, ge=0, le=1e6)
    tRFCsb: float | None = Field(default=None, ge=0, le=1e6)


#: what a missing optional timing stands for: another timing (name), a sum of them, or 0
_TIMING_DEFAULTS = {"tCCD_L": "tCCD", "tRRD_S": 0, "tRRD_L": "tRRD_S", "tFAW": 0, "tRC": ("tRAS", "tRP"),
                    "tRCDWR": "tRCD", "tRTP": 0, "tRFCsb": 0}


class Hbm(StrictModel):
    """HBM (or per-core DRAM) channels.

    ``attach`` says where channels meet the NoC: ``edge`` spreads them over the west and
    east mesh edges, ``per_core`` gives every core its own channel (NpuSim-style
    distributed memory; needs channels == cores), or an explicit list of router ids.

    Organisation: a channel has one controller (request queue, scheduler) and
    ``pseudo_channels`` pseudo-channels, each with its own ``bus_width_bits`` data bus,
    ``banks`` banks in ``bank_groups`` groups, activation window (tRRD/tFAW) and refresh
    (JESD235 counts array timings per pseudo-channel). Missing: one pseudo-channel and one
    bank group, i.e. each channel is one independent bus (the behaviour before they existed).
    Data-bus bandwidth defaults to DDR: ``pseudo_channels * bus_width_bits/8 * pin_rate_gbps``
    GB/s with ``pin_rate_gbps`` = ``2 / tck_ns`` when missing; ``channel_bandwidth_gbps``
    overrides a whole channel's I/O rate while keeping the core timings.

    ``refresh``: ``all_bank`` (every tREFI a pseudo-channel closes all banks for tRFC) or
    ``per_bank`` (every tREFI / banks one bank, round robin, is refreshed for tRFCsb; the
    other banks keep working). ``write_queue_depth`` > 0 gives each channel a write queue
    of that many entries next to the ``request_queue_depth`` read queue: writes wait there
    and are drained in bursts, from ``write_high_watermark`` entries (or when no read is
    waiting) down to ``write_low_watermark`` (missing: 3/4 and 1/4 of the depth); 0
    (missing) = reads and writes share one queue, scheduled alike.

    ``partitioned_queues`` (default false): ``false`` is one queue shared by the channel's
    pseudo-channels (Ramulator2's generic controller, whose HBM timings the presets use).
    ``true``: the channel's ``request_queue_depth`` and ``write_queue_depth`` entries (and the
    write watermarks) are split evenly between its pseudo-channels, each with its own
    read/write drain mode, so requests waiting on one pseudo-channel (e.g. during its refresh)
    cannot take the other's entries — gem5's HBM controller (``HBMCtrl.partitioned_q``;
    DRAMSys's default ``Bankwise`` buffer partitions per bank). Measured
    (``validation/hbm_timing.py``), splitting does not help random reads in npusim: the DMA
    engines stall in order on the refreshing pseudo-channel's full share either way. Partitioned, the depths must divide by
    ``pseudo_channels``; a watermark applies to a pseudo-channel's partition as
    ``watermark / pseudo_channels`` (unrounded: occupancy x pseudo_channels is compared).

    ``preset`` names a DRAM organisation + timing set from
    :mod:`npusim.arch.hbm_presets` (HBM2/HBM3, after Ramulator2's and DRAMSys's presets); keys given
    next to it override the preset's, timing key by timing key.
    """

    preset: str | None = None
    channels: Pos(4096)
    capacity_gb: PosF(2**20)
    attach: Literal["edge", "per_core"] | list[NonNegativeInt] = "edge"
    tck_ns: PosF(1e3) = 1.0
    bus_width_bits: Pos(2**16) = 64
    pin_rate_gbps: PosF(1e6) | None = None
    channel_bandwidth_gbps: PosF(1e6) | None = None
    burst_length: Pos(4096) = 4
    pseudo_channels: Pos(64) = 1
    banks: Pos(4096) = 16
    bank_groups: Pos(4096) = 1
    row_bytes: Pos(2**24) = 1024
    request_queue_depth: Pos(2**16) = 32
    write_queue_depth: NonNeg(2**16) = 0
    write_high_watermark: Pos(2**16) | None = None
    write_low_watermark: NonNeg(2**16) | None = None
    refresh: Literal["all_bank", "per_bank"] = "all_bank"
    partitioned_queues: bool = False
    interleave_bytes: Pos(2**30) = 256
    frontend_latency_ns: float = Field(default=10.0, ge=0, le=1e6, description="controller + PHY fixed latency, each way")
    timing: DramTiming

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data):
        if not isinstance(data, dict) or data.get("preset") is None:
            return data
        from npusim.arch.hbm_presets import HBM_PRESETS

        name = data["preset"]
        if name not in HBM_PRESETS:
            raise ValueError(f"hbm.preset '{name}': expected one of {sorted(HBM_PRESETS)}")
        base = HBM_PRESETS[name]
        merged = {**base, **{k: v for k, v in data.items() if k != "timing"}}
        timing = data.get("timing")
        merged["timing"] = {**base["timing"], **timing} if isinstance(timing, dict) else (timing or base["timing"])
        return merged

    @model_validator(mode="after")
    def _organisation_consistent(self):
        if self.banks % self.bank_groups:
            raise ValueError(f"hbm.banks ({self.banks}) must be a multiple of hbm.bank_groups ({self.bank_groups})")
        if self.write_queue_depth:
            if self.write_high_watermark is None:
                object.__setattr__(self, "write_high_watermark", max(1, self.write_queue_depth * 3 // 4))
            if self.write_low_watermark is None:
                object.__setattr__(self, "write_low_watermark", self.write_queue_depth // 4)
            hi, lo = self.write_high_watermark, self.write_low_watermark
            if not (0 <= lo < hi <= self.write_queue_depth):
                raise ValueError(f"hbm write queue: need 0 <= write_low_watermark ({lo}) < write_high_watermark "
                                 f"({hi}) <= write_queue_depth ({self.write_queue_depth})")
        if self.partitioned_queues and self.pseudo_channels > 1:
            for key in ("request_queue_depth", "write_queue_depth"):
                v = getattr(self, key)
                if v and v % self.pseudo_channels:
                    raise ValueError(f"hbm.{key} ({v}) must be a multiple of hbm.pseudo_channels "
                                     f"({self.pseudo_channels}) with partitioned_queues (split evenly between "
                                     f"the pseudo-channels); or set hbm.partitioned_queues: false")
        if self.refresh == "per_bank" and (not self.timing.tRFCsb or not self.timing.tREFI):
            raise ValueError("hbm.refresh 'per_bank' needs timing.tRFCsb and timing.tREFI > 0")
        return self

    def timing_cycles(self, name: str) -> int:
        """A timing parameter in tCK cycles (ns values rounded up); a missing optional one is
        what :class:`DramTiming` says it means."""
        value = getattr(self.timing, name)
        if value is None:
            default = _TIMING_DEFAULTS[name]
            if isinstance(default, str):
                return self.timing_cycles(default)
            if isinstance(default, tuple):
                return sum(self.timing_cycles(n) for n in default)
            return int(default)
        return int(math.ceil(value / self.tck_ns - 1e-9)) if self.timing.unit == "ns" else int(math.ceil(value))

    @property
    def burst_bytes(self) -> int:
        return self.bus_width_bits // 8 * self.burst_length

    @property
    def bandwidth_per_channel_gbps(self) -> float:
        """A whole channel (all its pseudo-channels)."""
        if self.channel_bandwidth_gbps is not None:
            return self.channel_bandwidth_gbps
        pin = self.pin_rate_gbps if self.pin_rate_gbps is not None else 2 / self.tck_ns
        return self.pseudo_channels * self.bus_width_bits / 8 * pin

    @property
    def total_bandwidth_gbps(self) -> float:
        return self.channels * self.bandwidth_per_channel_gbps


class Noc(StrictModel):
    """2D-mesh network-on-chip parameters (used by the NoC models)."""

    link_bytes_per_cycle: Pos(2**16) = 64
    router_pipeline_cycles: Pos(1024) = 4
    link_latency_cycles: Pos(2**16) = 1
    buffer_depth_flits: Pos(2**16) = 8
    virtual_channels: Pos(64) = 2
    routing: Literal["xy", "yx"] = "xy"
    max_packet_flits: Pos(2**20) = 16


class L2Cache(StrictModel):
    """The chip's shared last-level cache between the cores' DMA engines and HBM (Ascend's L2).

    Two models use it (see :mod:`npusim.hw.memory.l2` and :mod:`npusim.hw.memory.hbm`):

    * the **analytical reuse model** (the analytical memory fidelity, and the planners): an LRU
      cache of ``capacity_mb`` MiB seen through reuse distances: a re-read of bytes that were
      loaded before hits when fewer than the capacity's distinct bytes were loaded in between;
      a hit costs no HBM bandwidth and moves at the core's even share of ``bandwidth_gbps``
      (aggregate, read/write mixed, all cores together), at most ``core_bytes_per_cycle`` (one
      core's read rate from the L2; ``None``: its DMA ports' rate, as from HBM);
    * the **transaction-level cache** (``--memory tlm``): ``capacity_mb`` MiB of ``line_bytes``
      lines in ``ways``-way sets (LRU per set), each line's sectors (one per DMA transaction, at
      most 32 a line) valid separately; lines interleaved over ``slices`` slices by address, each slice serving
      ``bandwidth_gbps / slices``; a read that hits is served by its slice (no HBM traffic), one
      that misses goes to HBM and fills its sector; writes go to HBM (write-through) and, with
      ``write_allocate``, also update or allocate their line (a later read of written data hits).

    ``hit_latency_ns`` (optional; ``None``: not published, not modelled) is added to each L2
    transfer (analytical) or each hit transaction (TLM)."""

    capacity_mb: PosF(2**20)
    bandwidth_gbps: PosF(1e7)
    core_bytes_per_cycle: PosF(2**20) | None = None
    hit_latency_ns: float | None = Field(default=None, ge=0, le=1e6, allow_inf_nan=False)
    line_bytes: Pos(2**16) = Field(default=512, description="bytes per line (a power of two, a multiple of "
                                   "hbm.interleave_bytes); the TLM cache keeps a valid bit per sector: per DMA "
                                   "transaction, at most 32 per line")
    ways: Pos(1024) = 16
    slices: Pos(1024) = 1
    write_allocate: bool = True
    source: str = ""

    @model_validator(mode="after")
    def _geometry(self):
        if self.line_bytes & (self.line_bytes - 1):
            raise ValueError(f"l2.line_bytes must be a power of two, got {self.line_bytes}")
        if self.capacity_mb * 2**20 < self.line_bytes * self.ways:
            raise ValueError(f"l2.capacity_mb {self.capacity_mb:g} MiB holds less than one set of "
                             f"l2.ways {self.ways} x l2.line_bytes {self.line_bytes}")
        return self


class KernelCosts(StrictModel):
    """What running an *operator* (a kernel) costs a die beyond its array, vector lanes and memory
    traffic: the operator-level mechanisms of an Ascend-like die (issue 39 item 2), used by the chip
    cost kernels (:mod:`npusim.system.chipcost`). Without this section none of them is charged.

    * ``start_us``: the device-side start of a kernel (the task is dispatched to the cores and they
      begin), paid once per operator: every core that works starts this late;
    * ``cube_setup_us`` / ``vector_setup_us``: each working core's fixed prologue of a cube (AIC) or
      vector (AIV) kernel (tiling data, first load latency, the pipeline filling and draining, the
      final synchronisation), paid by every core side by side, so once per operator on the critical path;
      ``vector_setup_us`` is the prologue when the kernel launches every AIV of the die: a vector kernel
      launching fewer pays a share of it that grows with the AIVs launched
      (:func:`npusim.hw.compute.vector_kernel.setup_share`, with ``mix_start_us`` / ``mix_start_core_us``
      as its shape);
    * ``l1_to_l0a_bytes_per_cycle`` / ``l1_to_l0b_bytes_per_cycle`` and ``mte1_start_cycles``: the
      cube's operand feed from L1 into L0A / L0B, per L0 step of ``l0_k_bytes`` of K per row; the
      cube's time per step is at least the larger of the two loads (L0 double-buffered: the loads
      of one step overlap the MACs of the one before);
    * ``vector_cores_per_core``: AIV cores per modelled core (each takes an even share of the
      core's rows); ``ub_kb``: one AIV's unified buffer, which bounds a vector kernel's tile
      (its reference kernel's UB tiling, :func:`npusim.hw.compute.vector_kernel.ub_tiling`); ``vector_cycles_per_repeat``: an AIV's cycles per
      vector instruction repeat (256 bytes, the arch's vector width per AIV) and
      ``vector_instruction_cycles`` each instruction's start, which time a vector op's tile from
      its reference kernel's instructions (:mod:`npusim.hw.compute.vector_kernel`; without them
      the lane model of :mod:`npusim.hw.compute.vector` does);
    * ``base_blocks``: per input dtype, the die's GEMM kernel's base block ``[m, n, k]``: C is cut
      into ``m x n`` blocks dealt to the cube cores in turn (core ``c`` takes blocks ``c``,
      ``c + cores``, ...: cores used = min(blocks, cores), waves = ceil(blocks / cores)); a block
      streams its whole K through L1 in stages of ``k`` (two stages); K is never split over cores;
      the blocks are numbered by CATLASS's ``GemmIdentityBlockSwizzle<swizzle_offset,
      swizzle_direction>`` (direction 0: ``swizzle_offset`` rows of blocks walked column by column,
      every other strip backwards; 1: rows and columns swapped). A dtype without an entry (or no
      entry at all) takes the even split of :mod:`npusim.system.chipcost`;
    * ``gemm_default``: the base-block kernel a GEMM runs unless its caller names one
      (:mod:`npusim.mapping.gemm_kernels`: ``aclnn``, ops-nn MatMulV3's per-shape base blocks, what
      framework GEMMs call; ``catlass_basic``, ``base_blocks`` always; ``catlass_splitk``, K split
      over the cores);
    * ``soc_version``: the SoC version the vendor's host-side tiling sees (CANN's
      ``platform_ascendc::SocVersion``: ``ascend910b`` for Atlas A2, ``ascend910_93`` for an Atlas A3
      die); some tilings branch on it (ops-nn RmsNorm takes its multi-row MERGE_N kernel only on
      ASCEND910B, :func:`npusim.hw.compute.vector_kernel.rmsnorm_mode`);
    * ``mix_start_us`` / ``mix_start_core_us``: the extra start of a MIX kernel (one that launches
      the AIVs beside the AICs: a GEMM with a vector-side epilogue, split-K reduce or padding pass):
      ``mix_start_us + mix_start_core_us x (cube cores it launches / cube cores of the die)``, on
      every working core before its first task (:func:`npusim.mapping.gemm_kernel.mix_start_us`);
      cited, not derived (CATLASS's kernel selector's cost model for A2/A3, see the preset);
    * ``source``: where the figures come from (``npusim calibrate --check`` recomputes them).

    Units: microseconds, bytes per core cycle, core cycles, KiB (``ub_kb``), elements (base blocks)."""

    start_us: float = Field(default=0.0, ge=0, le=1e6, allow_inf_nan=False)
    cube_setup_us: float = Field(default=0.0, ge=0, le=1e6, allow_inf_nan=False)
    vector_setup_us: float = Field(default=0.0, ge=0, le=1e6, allow_inf_nan=False)
    mix_start_us: float = Field(default=0.0, ge=0, le=1e6, allow_inf_nan=False)
    mix_start_core_us: float = Field(default=0.0, ge=0, le=1e6, allow_inf_nan=False)
    l1_to_l0a_bytes_per_cycle: PosF(2**20) | None = None
    l1_to_l0b_bytes_per_cycle: PosF(2**20) | None = None
    mte1_start_cycles: NonNeg(10**6) = 0
    l0_k_bytes: Pos(2**20) = 128
    vector_cores_per_core: Pos(64) = 1
    ub_kb: PosF(2**20) | None = None
    vector_cycles_per_repeat: PosF(1e6) | None = None
    vector_instruction_cycles: float = Field(default=0.0, ge=0, le=1e6, allow_inf_nan=False)
    base_blocks: dict[str, tuple[Pos(2**20), Pos(2**20), Pos(2**20)]] = Field(default_factory=dict)
    swizzle_offset: Pos(2**20) = 1
    swizzle_direction: Literal[0, 1] = 0
    gemm_default: Literal[GEMM_KERNELS] = "catlass_basic"
    soc_version: Literal["ascend910b", "ascend910_93"] = "ascend910b"
    source: str = ""

    @model_validator(mode="after")
    def _base_block_dtypes(self):
        bad = sorted(set(self.base_blocks) - set(DTYPE_BYTES))
        if bad:
            raise ValueError(f"base_blocks: unknown dtype {bad[0]!r} (expected one of {sorted(DTYPE_BYTES)})")
        return self


class CoreClass(StrictModel):
    """Cores that differ from ``cores`` (heterogeneous chips, e.g. PD-disaggregated decode
    cores): their own systolic array, SRAM, or — with ``hbm.attach: per_core`` — DRAM channel
    bandwidth. Anything not given is the ``cores`` default, key by key: a class's
    ``systolic_array`` or ``sram`` is merged over the ``cores`` one (so a class that gives only
    ``rows``/``cols`` keeps the chip's dataflow and MACs per PE, and its T_inj follows its rows,
    see :func:`merge_systolic`)."""

    cores: list[NonNegativeInt]
    systolic_array: SystolicArray | None = None
    sram: Sram | None = None
    channel_bandwidth_gbps: PosF(1e6) | None = None


class Arch(StrictModel):
    """A whole NPU: clock, a grid of cores (identical unless ``core_classes`` says otherwise),
    HBM channels, the NoC and (optionally) a shared L2 cache."""

    name: str
    description: str = ""
    # at least 1 MHz: slower clocks overflow the picosecond timebase of the memory model
    clock_ghz: float = Field(ge=1e-3, le=1e3, allow_inf_nan=False)
    cores: Cores
    hbm: Hbm
    noc: Noc = Noc()
    l2: L2Cache | None = None  # none: every load a core makes reaches HBM
    kernel: KernelCosts | None = None  # none: operators cost only their hardware work
    core_classes: dict[str, CoreClass] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _classes_inherit(cls, data):
        """Core classes' ``systolic_array`` / ``sram`` are partial: merged over ``cores``'."""
        if not isinstance(data, dict) or not isinstance(data.get("core_classes"), dict):
            return data
        cores = data.get("cores")
        cores = cores.model_dump() if isinstance(cores, StrictModel) else cores if isinstance(cores, dict) else {}
        cores = {k: v.model_dump() if isinstance(v, StrictModel) else v for k, v in cores.items()}
        classes = {}
        for name, c in data["core_classes"].items():
            if isinstance(c, dict):
                c = dict(c)
                for key in ("systolic_array", "sram"):
                    base = cores.get(key)
                    if isinstance(c.get(key), dict) and isinstance(base, dict):
                        c[key] = merge_systolic(base, c[key]) if key == "systolic_array" else {**base, **c[key]}
            classes[name] = c
        return {**data, "core_classes": classes}

    @property
    def num_cores(self) -> int:
        return self.cores.grid.width * self.cores.grid.height

    def core_class_of(self, core: int) -> CoreClass | None:
        for cls in self.core_classes.values():
            if core in cls.cores:
                return cls
        return None

    def systolic_for(self, core: int) -> SystolicArray:
        cls = self.core_class_of(core)
        return cls.systolic_array if cls and cls.systolic_array else self.cores.systolic_array

    def sram_for(self, core: int) -> Sram:
        cls = self.core_class_of(core)
        return cls.sram if cls and cls.sram else self.cores.sram

    @model_validator(mode="after")
    def _cube_reads_no_sram(self):
        """A ``cube`` array reads L0A / L0B (hw/compute/systolic.py): no SRAM may feed it."""
        for c in range(self.num_cores):
            if self.systolic_for(c).dataflow == "cube" and self.sram_for(c).feeds_compute:
                raise ValueError(f"core {c}: systolic_array.dataflow 'cube' reads its operands from L0A / L0B, "
                                 "not from an SRAM it streams: set sram.feeds_compute to false")
        return self

    @model_validator(mode="after")
    def _classes_consistent(self):
        seen: dict[int, str] = {}
        for name, cls in self.core_classes.items():
            for c in cls.cores:
                if c >= self.num_cores:
                    raise ValueError(f"core_classes.{name}.cores: core {c} is outside the {self.num_cores}-core mesh")
                if c in seen:
                    raise ValueError(f"core {c} is in core_classes {seen[c]!r} and {name!r}")
                seen[c] = name
            if cls.channel_bandwidth_gbps is not None and self.hbm.attach != "per_core":
                raise ValueError(f"core_classes.{name}.channel_bandwidth_gbps needs hbm.attach: per_core "
                                 "(each core its own DRAM channel)")
        return self

    @model_validator(mode="after")
    def _attach_consistent(self):
        n = self.num_cores
        attach = self.hbm.attach
        if attach == "per_core" and self.hbm.channels != n:
            raise ValueError(f"hbm.attach 'per_core' needs hbm.channels == number of cores ({n}), got {self.hbm.channels}")
        if isinstance(attach, list):
            if len(attach) != self.hbm.channels:
                raise ValueError(f"hbm.attach lists {len(attach)} routers but hbm.channels is {self.hbm.channels}")
            bad = [r for r in attach if r >= n]
            if bad:
                raise ValueError(f"hbm.attach router ids {bad} are outside the {n}-core mesh (0..{n - 1})")
        return self

    @model_validator(mode="after")
    def _l2_consistent(self):
        """The TLM L2 names a line by its address, and looks up one line per DMA transaction: the
        addresses must be global (per-core channels each have their own address 0) and a
        transaction (which never crosses an HBM interleave chunk) must lie within one line."""
        if self.l2 is None:
            return self
        if self.hbm.attach == "per_core":
            raise ValueError("l2: a shared L2 needs one global HBM address space; hbm.attach 'per_core' gives each "
                             "core's channel its own (remove the l2 section or attach the channels at the edge)")
        if self.l2.line_bytes % self.hbm.interleave_bytes:
            raise ValueError(f"l2.line_bytes {self.l2.line_bytes} must be a multiple of hbm.interleave_bytes "
                             f"{self.hbm.interleave_bytes} (a DMA transaction then lies within one line)")
        return self
