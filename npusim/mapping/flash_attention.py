"""How a FlashAttention kernel splits standard (MHA / GQA / MQA) attention over a die's cores.

Pure planning (no tasks): :func:`plan` returns the work units and how they are spread; the
mapper (:meth:`npusim.mapping.mapper.Mapper._lower_flash_attention`) records each core's pipeline, once per shape
(:meth:`~npusim.mapping.mapper.Mapper._flash_attention` replays it on other layers and cores).

The kernel modelled is the Ascend FlashAttention family (CANN's FlashAttentionScore /
FusedInferAttentionScore and the pto-isa ``TFA`` reference kernel, hw-native-sys/pto-isa
``kernels/manual/common/flash_atten/README.md``) -- FlashAttention-2 style tiling:

* **Work units.** Prefill-shaped ops (a head's queries fill at least a cube block): one unit per
  (sequence, query head, block of ``Q_BLOCK`` = 128 query rows) -- the pto-isa kernel's
  ``CUBE_S0 = 128``, one block per core and ``waves = ceil(blocks / cores)``; the units are spread
  as evenly as whole units allow (a core takes ``floor`` or ``ceil`` of ``units / cores``).
  Decode-shaped ops (``q_len x group <= Q_BLOCK``, ``group`` = query heads per KV head): the
  group's query heads are the rows of one unit per (sequence, KV head), so its KV is read once
  (grouped-query decode kernels); when these units are fewer than the cores, each one's KV is cut
  into ``kv_chunks`` pieces (split-KV, as flash-decoding and the paged/incremental attention
  kernels do) of at least ``MIN_CHUNK_BLOCKS`` KV blocks each, and a combine pass adds the
  partial outputs (rescaled by their softmax statistics).
* **Inside a unit** the keys/values stream in blocks of ``KV_BLOCK`` = 128 (the kernel's
  ``CUBE_S1``); per block: ``S = Q K^T`` on the cube (fp32), the online-softmax step on the vector
  unit (row max, exponentials, row sum; ``P`` in the input dtype), ``P V`` on the cube (fp32) and
  the vector unit's rescale-and-accumulate of the output (``O = O * exp(m_old - m_new) + P V``);
  at the end the output is divided by the row sums. The mapper pipelines these over blocks as the
  kernel does (QK of later blocks issued before PV of earlier ones: ``qkPreloadNum``).
* **Logical tiles.** The kernel groups its cube blocks into logical tiles of ``TILE_KEYS`` = 256
  keys (``TILE_S1``, ``TILE_S1 / CUBE_S1`` sub-tiles): ``P V`` accumulates in the cube's L0C over a
  tile's sub-tiles and is stored once per tile, and the vector side's rescale-and-accumulate (the
  kernel's ``compute_gu``) runs once per tile (``fa_performance_kernel.cpp``: ``TSTORE`` of
  ``pvAccTile`` only at the last sub-tile); :func:`tiles_per_block` is that rate per block.
* Causal prefill: the mean keys per query (the triangle), whole blocks (masking is not charged).

* **Paged MLA decode** (:func:`paged_split`): how ops-transformer's incremental attention tiling
  cuts a paged cache's sequences over the cores (pieces of the block table's keys), used by the
  mapper's MLA lowering when an op states its table's width.

Units: rows, keys and blocks are counts; nothing here is a time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Q_BLOCK = 128  # query rows per cube block (pto-isa TFA CUBE_S0; FlashAttention-2's m-block)
KV_BLOCK = 128  # keys per cube block (pto-isa TFA CUBE_S1 = 128)
TILE_KEYS = 256  # keys per logical tile (pto-isa TFA TILE_S1; scripts/generate_cases.py TILE_S1_DEFAULT = 256)
MIN_CHUNK_BLOCKS = 4  # split-KV: a chunk streams at least this many KV blocks (assumed; not calibrated)


@dataclass(frozen=True)
class FlashPlan:
    """The split of one attention op (see the module docstring)."""

    rows: int  # query rows of a unit's cube block (<= Q_BLOCK; packed query heads x q_len for decode)
    kv_block: int  # keys per streamed block
    blocks_per_unit: int  # KV blocks a unit streams
    units: int  # work units in total
    per_core: tuple[int, ...]  # units on each core
    kv_chunks: int  # split-KV pieces per (sequence, KV head) (1: no split)
    groups: int  # (sequence, head or KV-head group) pieces the combine pass merges (kv_chunks > 1)
    packed_heads: int  # query heads a unit carries as rows (GQA decode), else 1
    decode: bool  # True: decode-shaped (grouped heads, KV split when cores are idle)

    @property
    def cores_used(self) -> int:
        return sum(1 for u in self.per_core if u > 0)

    @property
    def keys(self) -> int:
        """Keys a unit attends (its blocks x block)."""
        return self.blocks_per_unit * self.kv_block


def tiles_per_block(blocks_per_unit: int) -> float:
    """Logical tiles per streamed KV block of a unit of ``blocks_per_unit`` blocks: the unit's
    ``ceil(blocks / (TILE_KEYS / KV_BLOCK))`` tiles over its blocks (1 for a unit of one block)."""
    per_tile = max(1, TILE_KEYS // KV_BLOCK)
    blocks = max(1, blocks_per_unit)
    return math.ceil(blocks / per_tile) / blocks


def spread(units: int, cores: int) -> tuple[int, ...]:
    base, extra = divmod(units, cores)
    return tuple(base + (1 if i < extra else 0) for i in range(cores))


def plan(batch: int, heads: int, kv_heads: int, q_len: int, keys_per_query: float, cores: int) -> FlashPlan:
    """The split of ``batch`` sequences x ``heads`` query heads (``kv_heads`` KV heads) of ``q_len``
    queries, each attending ``keys_per_query`` keys on average, over ``cores`` cores."""
    batch, heads, q_len, cores = max(1, batch), max(1, heads), max(1, q_len), max(1, cores)
    kv_heads = max(1, min(kv_heads or heads, heads))
    group = heads // kv_heads if heads % kv_heads == 0 else 1
    keys = max(1, math.ceil(keys_per_query))
    decode = q_len * group <= Q_BLOCK and group > 1 or q_len == 1
    if decode:
        packed = group if heads % kv_heads == 0 else 1
        rows = q_len * packed
        base = batch * (heads // packed)
        blocks = math.ceil(keys / KV_BLOCK)
        chunks = 1
        if base < cores and blocks >= 2 * MIN_CHUNK_BLOCKS:
            chunks = min(math.ceil(cores / base), blocks // MIN_CHUNK_BLOCKS)
        per_chunk = math.ceil(blocks / chunks)
        units = base * chunks
        return FlashPlan(rows=rows, kv_block=KV_BLOCK, blocks_per_unit=per_chunk, units=units,
                         per_core=spread(units, cores), kv_chunks=chunks, groups=base, packed_heads=packed,
                         decode=True)
    qblocks = math.ceil(q_len / Q_BLOCK)
    rows = math.ceil(q_len / qblocks)
    units = batch * heads * qblocks
    return FlashPlan(rows=rows, kv_block=KV_BLOCK, blocks_per_unit=math.ceil(keys / KV_BLOCK), units=units,
                     per_core=spread(units, cores), kv_chunks=1, groups=batch * heads, packed_heads=1, decode=False)


#: ops-transformer IFATiling (incre_flash_attention_tiling.cpp) constants of the split-KV decision
FD_CORE_RATIO = 0.5  # CheckCoreOkFlag: split-KV when batch x KV heads <= 0.5 x cores (cube-view / MLA modes)
FD_GQA_MIN_KEYS = 2048  # CheckCoreOkFlag: with several query heads per KV head, only from 2048 keys
FD_MIN_PIECE_KEYS = 512  # SplitBNS: fewer pieces while the longest sequence / pieces < 512
PAGE_BLOCK = 128  # SplitBNS: a paged cache's piece is a whole number of its blocks (the rows' block size)


@dataclass(frozen=True)
class PagedSplit:
    """How the incremental (decode) attention kernel cuts paged sequences over the cores."""

    parts: int  # kvSplitPart_: pieces the kernel cuts each (sequence, KV head) table into (1: no split)
    piece_keys: int  # keys of one piece (the table's keys / parts, whole blocks)
    pieces: int  # pieces that hold keys (the sequence's keys / piece_keys, rounded up; <= parts)

    def unit_keys(self, kv_len: int, u: int) -> int:
        """Keys of piece ``u`` (0-based) of a sequence of ``kv_len`` keys."""
        return max(0, min(self.piece_keys, kv_len - u * self.piece_keys))


def paged_split(batch_kv_heads: int, group: int, kv_len: int, table_keys: int, cores: int,
                block: int = PAGE_BLOCK) -> PagedSplit:
    """The split-KV decision of ops-transformer's incremental attention tiling for a paged cache
    (``attention/incre_flash_attention/op_host/incre_flash_attention_tiling.cpp``):
    ``IsFlashDecode`` / ``CheckCoreOkFlag`` split the KV when ``batch x KV heads <= 0.5 x cores``
    and, with ``group`` > 1 query heads per KV head, the longest sequence has at least 2048 keys;
    ``SplitBNS`` then takes ``kvSplitPart_ = cores // (batch x KV heads)`` pieces (fewer while the
    longest sequence / pieces < 512) and cuts **the table's** keys, not the sequence's, into them:
    with a paged cache ``seqSize_ = sMax_ = maxBlockNumPerBatch x blockSize``
    (``ProcessPageAttentionFlag`` / ``KvShapePostProcess``), ``computeSeqSize = ceil(sMax / parts)``
    rounded up to whole blocks. A sequence shorter than its table fills only the first pieces; the
    others are empty, so their cores idle. ``table_keys`` below ``kv_len`` is taken as ``kv_len``
    (a table always addresses the sequence). Units: keys and counts."""
    bn, cores = max(1, batch_kv_heads), max(1, cores)
    kv_len = max(1, kv_len)
    table = max(kv_len, table_keys)
    split = bn <= FD_CORE_RATIO * cores and (group <= 1 or kv_len >= FD_GQA_MIN_KEYS)
    parts = cores // bn if split else 1
    while parts > 1 and kv_len / parts < FD_MIN_PIECE_KEYS:
        parts -= 1
    parts = max(1, parts)
    piece = math.ceil(math.ceil(table / parts) / block) * block
    return PagedSplit(parts=parts, piece_keys=piece, pieces=min(parts, math.ceil(kv_len / piece)))


def ramp_steps(blocks: int, max_steps: int = 48) -> list[int]:
    """``blocks`` KV blocks of one core cut into about ``max_steps`` pipeline steps: equal middle
    steps of ``size`` blocks, reached from single blocks at both ends by doubling (1, 2, 4, ...
    below ``size``), so the pipeline's fill and drain are exposed at block granularity while the
    task count stays bounded."""
    if blocks <= max_steps:
        return [1] * blocks
    size = 1
    while True:
        ramp = []
        r = 1
        while r < size:
            ramp.append(r)
            r *= 2
        middle = blocks - 2 * sum(ramp)
        if middle > 0 and 2 * len(ramp) + math.ceil(middle / size) <= max_steps:
            break
        size += 1
    count = math.ceil(middle / size)
    base, extra = divmod(middle, count)
    return ramp + [base + (1 if i < extra else 0) for i in range(count)] + ramp[::-1]


__all__ = ["FlashPlan", "KV_BLOCK", "MIN_CHUNK_BLOCKS", "PagedSplit", "Q_BLOCK", "TILE_KEYS", "paged_split", "plan",
           "ramp_steps", "spread", "tiles_per_block"]
