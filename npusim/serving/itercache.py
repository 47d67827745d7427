"""The iteration-cost cache: a cheaper serving fidelity that reuses each iteration shape's chip timing.

Without it every serving iteration's whole program (tens of thousands of compute, DMA and NoC
tasks) runs on the engine. With it (``npusim run --iteration-cache on``) an iteration *shape* is
simulated once, alone on an idle chip at the run's memory and NoC fidelity, and every later
iteration of that shape is replayed from a small *cost skeleton* — in the spirit of Vidur's
profiled operator costs, but measured by our own chip simulation instead of on a GPU.

Shape (the cache key, per instance): the iteration's attention groups ``(count, q, kv, causal)``
and sampled rows (:func:`npusim.serving.iteration.iteration_groups`) plus the kind of KV placement
(none, some or all in HBM), with three bucket sizes and a choice of KV edges (:class:`Buckets`):

* ``kv`` tokens: group KV lengths (already rounded up to 256 by the compiled shapes) are placed
  between bucket edges (the lower never below 256 or the group's own tokens). The stage replay
  interpolates *multilinearly*, one KV axis per group (:func:`grid_corners`): the ``2**g`` corner
  shapes of the iteration's cell are simulated and weighted by each group's own position between
  its edges (:meth:`~npusim.serving.stagecost.StageCost.combine`). A prefill chunk's KV token
  costs hundreds of times a decode's (its queries attend to every key), so one position for all
  groups (below) is off by up to 6% where the groups sit at different places in their buckets;
  per group it is within 0.4% (``validation/serving_kv_interpolation.py --grid``: Qwen3-4B on
  npusim-64c, a chunk of 512 beside a decode, cells 2-7k tokens wide). Over the README's trace
  replay (200 Mooncake requests) ``kv=4096,kv_edges=pow2`` simulates 2,360 shapes instead of
  4,864, every result within 1.0% of exact. The skeleton replay uses two corners (every group at its lower edge, every
  group at its upper edge) and replays the upper corner's skeleton with its delays, spans and
  busy cycles scaled to the duration interpolated linearly between them by the iteration's share
  of the attention KV tokens, and its KV reads to the interpolated KV bytes (weights are read in
  full): never more than the upper corner. ``kv=256`` is exact: the key is the compiled shape itself.
* ``kv_edges``: ``linear`` (the default: edges at multiples of the ``kv`` bucket) or ``pow2``
  (powers of two below the bucket, 256, 512, ..., its multiples above: no short cell spans more
  than twice its lower edge);
* ``batch``: decode-group request counts above the bucket are rounded up to a multiple of it
  (graph-mode padding already uses multiples of 8: ``batch=8`` is exact);
* ``chunk`` tokens: prefill chunks rounded up to a multiple of it (they are padded to 16
  already: ``chunk=16`` is exact); the chunk's cached prefix is kept.
* ``chunk_edges=interp``: a prefill chunk has two axes instead, its length (edges 16, ``16 r``,
  ``16 r**2``, ... below 512 and multiples of 512, ``r`` = ``chunk_ratio``) and its cached prefix
  (``kv - q``: 0, then the KV edges from ``prefix_min``), interpolated bilinearly — attention's
  work is their product, which that reproduces; a chunk's cost is concave in its length (weight
  streaming sets a floor), so a chunk between edges is overstated, by at most 1.2% / 2.9% / 7.7%
  with ``r`` = 2 / 4 / 32 (Qwen3-4B, npusim-64c, 4k prefix);
* ``decode_kv=shared``: all decode groups of an iteration on one axis, every one of them at the
  edges around their mean KV length (``mixed_kv``: those edges' bucket beside a prefill chunk,
  where the decodes' KV is a small share of the work): the real groups' KV tokens are kept (merging
  the groups into one instead moved the README trace's results by 4.6%);
* ``sampled``: LM-head rows rounded up to a multiple of it (the array pads them: 1, 2, 4, 8 and 16
  rows cost the same cycles to 1e-5 on Qwen3-4B);
* ``blend_kv``: the all-in-SRAM shapes that an iteration with a share of its KV in HBM blends with
  are interpolated on linear cells of this width (and chunk lengths over 16-512): that end weighs
  the share in SRAM, ~5% on long prompts.

``long`` (:func:`long_context`, which ``npusim run --iteration-cache auto`` picks when a prompt is
longer than 4,096 tokens) sets all of them: on the README's trace replay it simulates 422 shapes
instead of 4,864 (53 s instead of 577 s), every result within 1% of exact but the TBT median
(−3.2%), where one linear cell over the whole context on every axis is +5%: the pipeline's period
at full load (the wave) is convex in KV below ~8k tokens (``validation/serving_kv_interpolation.py``).
Those axes need more than two corners, so only the stage replay uses them.

Skeleton (:class:`IterationCost`): each compute and NoC queue's tasks cut into *segments* of
activity (at idle gaps over 1% of the iteration), and every DMA task a segment of its own (its
memory streams cross the mesh: merged transfers would claim links and HBM channel time ahead of
other cores' transfers that really went first — that made a replay alone up to 2.5% slow), each
with its offsets, busy cycles and, for DMA segments, bytes (KV reads kept apart so they rescale
with the share of KV in HBM), and the
dependencies between segments taken from the program's (through barriers). Replayed
(:meth:`IterationCost.tasks`), a segment is one task — a *hold* on compute/NoC queues (kept for the
span, counted busy for the busy cycles: ``KIND_FIXED`` with ``param[1]``) or a real DMA of its bytes
— gated by its source segments, plus a delay where it started later than they explain. Alone on
an idle chip the skeleton ends when the iteration did (to within 0.5%: a hold does not wait for
the dependencies of the tasks inside it); in a loaded run in-order queues pipeline iterations and
DMAs share HBM bandwidth and mesh links with every other transfer as before. Not reproduced: the
NoC messages inside an iteration (their queue time is kept; their link contention with other
traffic is not). Since HBM traffic crosses the mesh that matters: under load the pipeline's
stages stream weights over the mesh at once, the collectives of the uncached run wait behind
those streams and the cache's holds do not, so the skeleton replay is fast by ~15% on the default
scenario's throughput and ~78% on the Mooncake replay (``validation/serving_iteration_cache.py``).
The default replay is therefore the stage replay (:mod:`.stagecost`), which measures that contention
and is within 3% on throughput and 7.3% on mean TTFT/TBT (it was within 5% before the path NoC's
per-burst requests, session 25); ``npusim run`` uses it by default when one instance runs on the chip.

KV-cache management, scheduling, spills, KV transfers and metrics run exactly as without the
cache: only the chip timing of an iteration is reused. Results are deterministic: every
measurement runs on a fresh simulator. :class:`ShapeStore` keeps measured skeletons on disk
(``--iteration-cache-dir``) for later runs.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path

import numpy as np

from npusim.engine.tasks import KIND_FIXED
from npusim.errors import ConfigError
from npusim.files import write_with
from npusim.serving.iteration import KV_QUANTUM
from npusim.serving.stagecost import StageCost
from npusim.sim import Simulator
from npusim.sim.kernel import KIND_DMA, KIND_NOC
from npusim.sim.mempath import DEFAULT_STREAMS
from npusim.sim.program import submit_materialized


@dataclass(frozen=True)
class Buckets:
    """Bucket sizes of the cache key (see module docstring); the defaults are exact (the key is
    the compiled shape): coarser KV buckets simulate fewer shapes at a larger error (measured by
    ``validation/serving_iteration_cache.py``)."""

    kv: int = KV_QUANTUM
    batch: int = 8
    chunk: int = 16
    kv_edges: str = "linear"
    chunk_edges: str = "round"
    decode_kv: str = "group"
    sampled: int = 1
    chunk_ratio: int = 2
    prefix_min: int = KV_QUANTUM
    mixed_kv: int = 0
    blend_kv: int = 0

    def __post_init__(self):
        if self.kv < KV_QUANTUM or self.kv % KV_QUANTUM:
            raise ConfigError(f"iteration cache kv bucket {self.kv}: expected a positive multiple of {KV_QUANTUM} "
                              f"tokens (compiled shapes already round KV lengths to {KV_QUANTUM})")
        if self.batch < 1:
            raise ConfigError(f"iteration cache batch bucket {self.batch}: expected at least 1")
        if self.chunk < 16 or self.chunk % 16:
            raise ConfigError(f"iteration cache chunk bucket {self.chunk}: expected a positive multiple of 16 tokens "
                              f"(chunks are padded to 16 already)")
        if self.kv_edges not in KV_EDGES:
            raise ConfigError(f"iteration cache kv_edges '{self.kv_edges}': expected one of {', '.join(KV_EDGES)}")
        if self.chunk_edges not in CHUNK_EDGES:
            raise ConfigError(f"iteration cache chunk_edges '{self.chunk_edges}': expected one of "
                              f"{', '.join(CHUNK_EDGES)}")
        if self.decode_kv not in DECODE_KV:
            raise ConfigError(f"iteration cache decode_kv '{self.decode_kv}': expected one of {', '.join(DECODE_KV)}")
        if self.chunk_ratio < 2:
            raise ConfigError(f"iteration cache chunk_ratio {self.chunk_ratio}: expected at least 2")
        if self.sampled < 1:
            raise ConfigError(f"iteration cache sampled bucket {self.sampled}: expected at least 1")
        for key in ("prefix_min", "mixed_kv", "blend_kv"):
            v = getattr(self, key)
            if v < 0 or v % KV_QUANTUM or (key == "prefix_min" and (v == 0 or v & (v - 1))):
                what = "power of two, at least" if key == "prefix_min" else "non-negative multiple of"
                raise ConfigError(f"iteration cache {key} {v}: expected a {what} {KV_QUANTUM} tokens")

    @property
    def exact(self) -> bool:
        """Every key is a compiled shape: no rounding, no interpolation."""
        return (self.kv == KV_QUANTUM and self.batch <= 8 and self.chunk == 16 and self.chunk_edges == "round"
                and self.decode_kv == "group" and self.sampled <= 1)

    @property
    def stage_only(self) -> bool:
        """Keys only the stage replay's multilinear interpolation (:func:`grid_corners`) can use."""
        return (self.chunk_edges != "round" or self.decode_kv != "group" or self.sampled > 1 or self.mixed_kv > 0
                or self.blend_kv > 0)

    def rows(self, sampled: int) -> int:
        """Sampled (LM-head) rows rounded up to the ``sampled`` bucket (0 stays 0)."""
        return sampled if self.sampled <= 1 or not sampled else -(-sampled // self.sampled) * self.sampled

    @property
    def blend(self) -> "Buckets | None":
        """The buckets of the all-in-SRAM shapes that an iteration with a share of its KV in HBM
        blends with (``blend_kv``: one linear KV cell of that width on every axis), or None (the
        same buckets)."""
        if not self.blend_kv:
            return None
        return replace(self, kv=self.blend_kv, kv_edges="linear", mixed_kv=0, prefix_min=KV_QUANTUM, blend_kv=0,
                       chunk_ratio=BLEND_CHUNK_RATIO)


KV_EDGES = ("linear", "pow2")
CHUNK_EDGES = ("round", "interp")
DECODE_KV = ("group", "shared")
EXACT = Buckets(kv=KV_QUANTUM, batch=8, chunk=16)
TEXT_KEYS = ("kv_edges", "chunk_edges", "decode_kv")
INT_KEYS = ("kv", "batch", "chunk", "sampled", "chunk_ratio", "prefix_min", "mixed_kv", "blend_kv")


LONG_KV = 16384  # the long buckets' KV bucket (powers of two below it)
LONG_CHUNK_RATIO = 4  # their chunk-length edges: 16, 64, 256, 512, ...
BLEND_CHUNK_RATIO = 32  # the blend's: 16, 512, ... (weighed by the share of KV in SRAM, mostly small)
LONG_PREFIX_MIN = 4096  # and their lowest chunk-prefix edge above 0


def long_context(context_tokens: int) -> Buckets:
    """The ``long`` buckets for a model whose context is ``context_tokens`` (see the module
    docstring): KV edges at powers of two up to ``LONG_KV`` and its multiples above, chunk
    prefixes from ``LONG_PREFIX_MIN``, chunk lengths interpolated, an iteration's decode groups on
    one shared KV axis (one cell over the whole context beside a prefill chunk), sampled rows in
    eights, and the all-in-SRAM shapes a KV share in HBM blends with on linear ``LONG_KV`` cells."""
    context = max(KV_QUANTUM, -(-int(context_tokens) // KV_QUANTUM) * KV_QUANTUM)
    return Buckets(kv=LONG_KV, kv_edges="pow2", chunk_edges="interp", decode_kv="shared", sampled=8,
                   chunk_ratio=LONG_CHUNK_RATIO, prefix_min=LONG_PREFIX_MIN, mixed_kv=context, blend_kv=LONG_KV)


def preset_name(buckets: Buckets, context_tokens: int = 0) -> str:
    """``exact``, ``long`` or ``custom``: which of :func:`parse_buckets`' presets ``buckets`` is."""
    if buckets.exact:
        return "exact"
    return "long" if context_tokens > 0 and buckets == long_context(context_tokens) else "custom"


def parse_buckets(text: str, context_tokens: int | None = None) -> Buckets:
    """``kv=1024,batch=8,chunk=16,kv_edges=pow2,chunk_edges=interp,decode_kv=shared`` (any subset;
    the rest default), ``exact``, or ``long`` (:func:`long_context`: needs the model's context)."""
    if text.strip() == "exact":
        return EXACT
    if text.strip() == "long":
        if not context_tokens or context_tokens <= 0:
            raise ConfigError(f"--iteration-cache-buckets long: the model's config gives no context length to "
                              f"span; give kv=N instead")
        return long_context(context_tokens)
    values = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        key, sep, val = part.partition("=")
        if not sep or key.strip() not in INT_KEYS + TEXT_KEYS:
            raise ConfigError(f"--iteration-cache-buckets '{text}': expected kv=N,batch=N,chunk=N,sampled=N,"
                              f"prefix_min=N,mixed_kv=N,blend_kv=N,kv_edges=linear|pow2,chunk_edges=round|interp,"
                              f"decode_kv=group|shared (any of them), exact or long, got '{part}'")
        if key.strip() in TEXT_KEYS:
            values[key.strip()] = val.strip()
            continue
        try:
            values[key.strip()] = int(val)
        except ValueError:
            raise ConfigError(f"--iteration-cache-buckets '{text}': {key.strip()} must be an integer, "
                              f"got '{val}'") from None
    return Buckets(**values)


# -- the key ---------------------------------------------------------------------------------------

def _rounded(group, buckets: Buckets) -> tuple[int, int, int, bool]:
    """A group with its decode count and chunk length rounded up to their buckets (a padded chunk
    keeps its cached prefix)."""
    n, q, kv, causal = group
    if q == 1 and n > buckets.batch:
        n = -(-n // buckets.batch) * buckets.batch
    if q > 1:
        padded = -(-q // buckets.chunk) * buckets.chunk
        kv, q = kv + padded - q, padded
    return n, q, kv, causal


def _kv_edges(q: int, kv: int, buckets: Buckets) -> tuple[int, int]:
    """The KV bucket edges around ``kv`` (equal when ``kv`` is on one): multiples of the ``kv``
    bucket, or with ``kv_edges=pow2`` powers of two below it (256, 512, ... up to the bucket, so
    that no short cell spans more than twice its lower edge) and its multiples above it; the
    lower edge never below the group's own tokens or 256, the shortest compiled KV length."""
    bucket = buckets.kv
    if buckets.kv_edges == "pow2" and kv <= bucket:
        up = min(bucket, max(KV_QUANTUM, 1 << (kv - 1).bit_length()))
        down = 1 << ((up - 1).bit_length() - 1)
    else:
        up = -(-kv // bucket) * bucket
        down = up - bucket
    return (up if kv == up else max(down, q, KV_QUANTUM)), up


def corners(groups, buckets: Buckets) -> tuple[tuple, tuple, float]:
    """``(lower, upper, t)``: the two corner group tuples and the iteration's position between
    them (``t = 1``: the upper corner; both corners are the same when the buckets are exact)."""
    lo, hi = [], []
    num = den = 0
    for g in groups:
        n, q, kv, causal = _rounded(g, buckets)
        down, up = _kv_edges(q, kv, buckets)
        lo.append((n, q, down, causal))
        hi.append((n, q, up, causal))
        num += n * (kv - down)
        den += n * (up - down)
    t = 1.0 if den == 0 else num / den
    return tuple(lo), tuple(hi), t


CHUNK_TOP = 512  # chunk_edges=interp: chunk lengths interpolate between 16 * chunk_ratio ** i and multiples of this


def _chunk_edges(q: int, ratio: int) -> tuple[int, int]:
    """The chunk-length edges around a (padded) chunk of ``q`` tokens with ``chunk_edges=interp``:
    16, ``16 ratio``, ``16 ratio ** 2``, ... below ``CHUNK_TOP`` and its multiples from it (equal
    when ``q`` is on one). A chunk's cost is concave in its length (weight streaming sets a floor
    under short chunks), so the interpolation overstates chunks between edges: on Qwen3-4B at
    npusim-64c by at most 1.2% with ratio 2, 2.9% with 4 and 7.7% with 32 (one cell, 16-512)."""
    if q >= CHUNK_TOP:
        up = -(-q // CHUNK_TOP) * CHUNK_TOP
        return (q, q) if q == up else (up - CHUNK_TOP, up)
    down = 16
    while down * ratio <= q and down * ratio < CHUNK_TOP:
        down *= ratio
    up = min(down * ratio, CHUNK_TOP)
    return (q, q) if q == down else (down, up)


def _prefix_edges(prefix: int, buckets: Buckets) -> tuple[int, int]:
    """The cached-prefix edges around a chunk's ``prefix`` tokens with ``chunk_edges=interp``:
    the KV bucket's edges (:func:`_kv_edges`) with 0 as the lowest (equal when on one)."""
    if prefix <= 0:
        return 0, 0
    bucket, low = buckets.kv, buckets.prefix_min
    if buckets.kv_edges == "pow2" and prefix <= bucket:
        up = min(bucket, max(low, 1 << (prefix - 1).bit_length()))
        down = up // 2 if up > low else 0
    else:
        up = -(-prefix // bucket) * bucket
        down = up - bucket
    return (prefix, prefix) if prefix == up else (down, up)


def _chunk_axis(n: int, q: int, kv: int, causal: bool, buckets: Buckets) -> list[tuple[tuple, float]]:
    """A chunk's corners with ``chunk_edges=interp``: its length and its cached prefix (``kv - q``)
    each between their edges, bilinearly (attention's work is the product of the two, which a
    bilinear interpolation reproduces); a corner's KV is its prefix plus its length, rounded up
    to ``KV_QUANTUM`` as compiled shapes are."""
    q_lo, q_hi = _chunk_edges(q, buckets.chunk_ratio)
    p = max(0, kv - q)
    p_lo, p_hi = _prefix_edges(p, buckets)
    tq = 0.0 if q_hi == q_lo else (q - q_lo) / (q_hi - q_lo)
    tp = 0.0 if p_hi == p_lo else (p - p_lo) / (p_hi - p_lo)
    out = []
    for qq, wq in ((q_lo, 1 - tq), (q_hi, tq)):
        for pp, wp in ((p_lo, 1 - tp), (p_hi, tp)):
            if wq * wp > 0:
                out.append(((n, qq, -(-(pp + qq) // KV_QUANTUM) * KV_QUANTUM, causal), wq * wp))
    return out


def grid_corners(groups, buckets: Buckets) -> list[tuple[tuple, float]]:
    """The corners of the iteration's cell with their weights in a multilinear interpolation:
    one KV axis per group, each at its own position between its bucket's edges, so ``2 ** g``
    corners for ``g`` groups off a bucket edge and one (weight 1) on the edges; with
    ``chunk_edges=interp`` a chunk has two axes (its length and its cached prefix,
    :func:`_chunk_axis`); with ``decode_kv=shared`` the decode groups share one axis: all of them at
    the bucket edges around their mean KV length, weighted by its position between them (a decode's
    KV token costs the same in every group, so the work of the real groups is kept)."""
    axes: list[list[tuple[dict, float]]] = []
    shared, tokens, rows = {}, 0, 0
    for i, g in enumerate(groups):
        n, q, kv, causal = _rounded(g, buckets)
        if q > 1 and buckets.chunk_edges == "interp":
            axes.append([({i: c}, w) for c, w in _chunk_axis(n, q, kv, causal, buckets)])
            continue
        if q == 1 and buckets.decode_kv == "shared":
            shared[i] = (n, causal)
            tokens, rows = tokens + n * kv, rows + n
            continue
        down, up = _kv_edges(q, kv, buckets)
        t = 0.0 if down == up else (kv - down) / (up - down)
        axes.append([({i: (n, q, edge, causal)}, f) for edge, f in ((down, 1 - t), (up, t)) if f > 0])
    if shared:  # every decode group at the edges around their mean KV length
        mean = tokens / rows
        beside_chunk = buckets.mixed_kv and len(shared) < len(groups)
        down, up = _kv_edges(1, math.ceil(mean), Buckets(kv=buckets.mixed_kv) if beside_chunk else buckets)
        t = 0.0 if down == up else (mean - down) / (up - down)
        axes.append([({i: (n, 1, edge, causal) for i, (n, causal) in shared.items()}, f)
                     for edge, f in ((down, 1 - t), (up, t)) if f > 0])
    out: list[tuple[dict, float]] = [({}, 1.0)]
    for axis in axes:
        out = [({**c, **part}, w * f) for c, w in out for part, f in axis]
    return [(tuple(c[i] for i in range(len(groups)) if i in c), w) for c, w in out]


# -- the cost skeleton -----------------------------------------------------------------------------

GAP_FRACTION = 0.01  # a queue idle for longer than this share of the iteration starts a new segment


@dataclass
class IterationCost:
    """One iteration shape's chip timing, measured alone on an idle chip (cycles, bytes).

    Per *segment* (a run of one queue's tasks, see :func:`measure`): ``queue`` (engine queue
    id), ``kind`` (``KIND_FIXED`` for compute and NoC queues, or ``KIND_DMA``), ``start``/``end``
    (offsets from the iteration's start), ``busy`` cycles, and for DMA segments ``read``,
    ``kv_read`` (KV-cache reads at the share of KV in HBM ``fraction``) and ``write`` bytes with
    the ``initiator``, ``address`` and ``pattern`` of its first transfer. ``edge_src``/``edge_dst``
    are the segments' dependencies, from the program's: the destination's first task waited for
    a task of the source (through barriers too); ``edge_end`` says whether it waited for the
    source's end (else for a task inside it: the edge then runs from the source's start)."""

    duration: int
    queue: np.ndarray
    kind: np.ndarray
    start: np.ndarray
    end: np.ndarray
    busy: np.ndarray
    read: np.ndarray
    kv_read: np.ndarray
    write: np.ndarray
    initiator: np.ndarray
    address: np.ndarray
    pattern: np.ndarray
    edge_src: np.ndarray
    edge_dst: np.ndarray
    edge_end: np.ndarray
    fraction: float
    noc_bytes: int
    tasks_simulated: int

    ARRAYS = ("queue", "kind", "start", "end", "busy", "read", "kv_read", "write", "initiator", "address",
              "pattern", "edge_src", "edge_dst", "edge_end")
    SCALARS = ("duration", "fraction", "noc_bytes", "tasks_simulated")

    def __post_init__(self):
        self._template = None
        self._plain = None

    @property
    def hbm_bytes(self) -> int:
        return int(self.read.sum() + self.kv_read.sum() + self.write.sum())

    def _build(self) -> tuple:
        """The skeleton's task arrays (structure fixed per shape) and the rows whose parameters
        :meth:`tasks` sets per iteration."""
        n = len(self.queue)
        order = np.lexsort((np.arange(n), self.start))
        preds: list[list[tuple[int, bool]]] = [[] for _ in range(n)]
        for x, y, at_end in zip(self.edge_src.tolist(), self.edge_dst.tolist(), self.edge_end.tolist()):
            preds[y].append((x, at_end))
        kinds, queues, deps = [], [], []
        delay_rows, delay_cycles = [], []  # barrier delays (scaled by interpolation)
        hold_rows, hold_seg = [], []
        read_rows, read_seg, write_rows, write_seg = [], [], [], []

        def add(kind, queue, dep):
            kinds.append(kind)
            queues.append(queue)
            deps.append(dep)
            return len(kinds) - 1

        def delay(cycles, dep):
            row = add(KIND_FIXED, -1, dep)
            delay_rows.append(row)
            delay_cycles.append(int(max(0, cycles)))
            return row

        root = add(KIND_FIXED, -1, [])
        gate = np.full(n, -1, dtype=np.int64)  # the barrier a segment's task waits on (its start)
        task = np.full(n, -1, dtype=np.int64)  # the segment's (last) task
        for y in order.tolist():
            sy = int(self.start[y])
            if not preds[y]:
                g = delay(sy, [root]) if sy > 0 else root
            else:
                # a dependency on a segment's end adds no delay (the real one did not), except
                # for the latest-ending one, which carries any gap before the segment started;
                # one on a task inside a segment runs from that segment's start (an edge into a
                # segment binds by construction: then no end edge carries a delay)
                ends = [int(self.end[x]) for x, at_end in preds[y] if at_end]
                latest = max(ends) if ends and all(at_end for _, at_end in preds[y]) else None
                nodes = []
                for x, at_end in preds[y]:
                    if not at_end:
                        d = sy - int(self.start[x])
                        nodes.append(delay(d, [int(gate[x])]) if d > 0 else int(gate[x]))
                    elif int(self.end[x]) == latest and sy > latest:
                        nodes.append(delay(sy - latest, [int(task[x])]))
                        latest = None  # one carrier
                    else:
                        nodes.append(int(task[x]))
                nodes = sorted(set(nodes))
                g = nodes[0] if len(nodes) == 1 else add(KIND_FIXED, -1, nodes)
            gate[y] = g
            q = int(self.queue[y])
            if self.kind[y] == KIND_DMA:
                prev = g
                if self.read[y] or self.kv_read[y] or not self.write[y]:
                    prev = add(KIND_DMA, q, [prev])
                    read_rows.append(prev)
                    read_seg.append(y)
                if self.write[y]:
                    prev = add(KIND_DMA, q, [prev])
                    write_rows.append(prev)
                    write_seg.append(y)
                task[y] = prev
            else:
                task[y] = add(KIND_FIXED, q, [g])
                hold_rows.append(task[y])
                hold_seg.append(y)
        last = add(KIND_FIXED, -1, [root] + task.tolist())
        ptr = np.zeros(len(kinds) + 1, dtype=np.int64)
        ptr[1:] = np.cumsum([len(d) for d in deps])
        idx = np.fromiter((d for ds in deps for d in ds), dtype=np.int64, count=int(ptr[-1]))
        param = np.zeros((len(kinds), 6), dtype=np.int64)
        rw = np.array(write_rows, dtype=np.int64)
        ws = np.array(write_seg, dtype=np.int64)
        param[rw, 0] = self.write[ws]
        for rows, segs in ((np.array(read_rows, dtype=np.int64), np.array(read_seg, dtype=np.int64)), (rw, ws)):
            param[rows, 1], param[rows, 3], param[rows, 4] = self.address[segs], self.initiator[segs], \
                self.pattern[segs]
        param[rw, 2] = 1
        arrays = (np.asarray(kinds, dtype=np.int64), np.asarray(queues, dtype=np.int64), param, ptr, idx)
        return (arrays, last, np.array(delay_rows, dtype=np.int64), np.array(delay_cycles, dtype=np.int64),
                np.array(hold_rows, dtype=np.int64), np.array(hold_seg, dtype=np.int64),
                np.array(read_rows, dtype=np.int64), np.array(read_seg, dtype=np.int64))

    def tasks(self, fraction: float, time_scale: float = 1.0, kv_scale: float = 1.0) -> tuple[tuple, int]:
        """Engine arrays ``(kind, queue, param, dep_ptr, dep_idx)`` of the skeleton (dependencies
        relative to its first task, as :func:`npusim.sim.program.submit_materialized` takes), and
        the relative id of its last task (which ends when the iteration does). KV reads are
        scaled from the measured share of KV in HBM to ``fraction`` (and by ``kv_scale``); delays,
        spans and busy cycles by ``time_scale`` (interpolation, see :meth:`IterationCostCache.cost`)."""
        if self._template is None:
            self._template = self._build()
        (kinds, queue, param, ptr, idx), last, drows, dcyc, hrows, hseg, rrows, rseg = self._template
        plain = time_scale == 1.0 and kv_scale == 1.0 and (fraction == self.fraction or not self.kv_read.any())
        if plain and self._plain is not None:  # the common case, computed once (the engine copies it)
            return (kinds, queue, self._plain, ptr, idx), last
        param = param.copy()
        span = self.end[hseg] - self.start[hseg]
        busy = np.minimum(self.busy[hseg], span)
        if time_scale != 1.0:
            dcyc = np.round(dcyc * time_scale).astype(np.int64)
            span = np.round(span * time_scale).astype(np.int64)
            busy = np.minimum(np.round(busy * time_scale).astype(np.int64), span)
        param[drows, 0] = dcyc
        param[hrows, 0] = span
        # a hold counts only its busy cycles (param[1] > 0); a fully busy span is a plain task
        param[hrows, 1] = np.where(busy >= span, 0, np.maximum(1, busy))
        kv = self.kv_read[rseg]
        if self.fraction > 0 and (fraction != self.fraction or kv_scale != 1.0):
            kv = np.round(kv * (fraction / self.fraction) * kv_scale).astype(np.int64)
        param[rrows, 0] = self.read[rseg] + np.maximum(kv, 0)
        if plain:
            param.flags.writeable = False
            self._plain = param
        return (kinds, queue, param, ptr, idx), last


def _segments(q, start, end, dma, gap: int) -> np.ndarray:
    """Where segments begin, over tasks sorted by queue then start: a new queue, an idle gap
    longer than ``gap`` cycles, or a DMA task — each transfer replays as itself: its memory
    streams cross the mesh, and a transfer merged with the next ones would claim the links (and
    the analytical HBM model's channel time, booked when a transfer starts) for all of them at
    once, before the transfers of other cores that really went first."""
    new = np.ones(q.size, dtype=bool)
    reach = -1
    prev = -1
    for i in range(q.size):
        s, e = int(start[i]), int(end[i])
        if q[i] == prev and s <= reach + gap and not dma[i]:
            new[i] = False
            reach = max(reach, e)
            continue
        prev, reach = q[i], e
    return new


def measure(arch, memory_mode: str, noc_mode: str, arrays: tuple, kv_reads: np.ndarray,
            fraction: float, gap_fraction: float = GAP_FRACTION, memory_over_noc: bool | None = None,
            memory_streams: str = DEFAULT_STREAMS) -> IterationCost:
    """Simulate one iteration's materialised program alone on a fresh simulator and reduce it to
    its :class:`IterationCost`: each queue's tasks cut into *segments* of activity wherever the
    queue stays idle for more than ``gap_fraction`` of the iteration (a stage's first weight
    tiles are prefetched at once, the rest stream when its activations arrive), one entry per
    segment, and the segments' dependencies from the program's."""
    sim = Simulator(arch, memory_mode=memory_mode, noc_mode=noc_mode, memory_over_noc=memory_over_noc,
                    memory_streams=memory_streams)
    kinds, queue, param, ptr, idx = arrays
    ids = submit_materialized(sim, arrays)
    sim.run()
    start, end = sim.task_times()
    start, end = start[ids], end[ids]
    duration = int(end.max(initial=0))
    gap = max(1, int(duration * gap_fraction))
    on = np.flatnonzero(queue >= 0)
    order = on[np.lexsort((start[on], queue[on]))]
    q, st, en = queue[order], start[order], end[order]
    new = _segments(q, st, en, kinds[order] == KIND_DMA, gap)
    seg = np.cumsum(new) - 1
    n = int(seg[-1]) + 1 if seg.size else 0
    heads = np.flatnonzero(new)
    seg_queue = q[heads]
    first = st[heads]
    last = np.zeros(n, dtype=np.int64)
    np.maximum.at(last, seg, en)
    held = np.zeros(n, dtype=np.int64)
    np.add.at(held, seg, en - st)
    # the engine's busy cycles per queue, shared among its segments by the time their tasks held it
    qbusy = sim.engine.busy_cycles()[seg_queue]
    qheld = np.zeros(int(queue.max(initial=0)) + 1, dtype=np.int64)
    np.add.at(qheld, seg_queue, held)
    busy = np.where(qheld[seg_queue] > 0, qbusy * held // np.maximum(qheld[seg_queue], 1), 0)
    k = kinds[order]
    is_dma = k == KIND_DMA
    seg_kind = np.full(n, KIND_FIXED, dtype=np.int64)
    seg_kind[seg[is_dma]] = KIND_DMA
    is_kv = np.zeros(len(kinds), dtype=bool)
    is_kv[kv_reads] = True
    nbytes, is_write, kv = param[order, 0], param[order, 2] != 0, is_kv[order]
    read = np.zeros(n, dtype=np.int64)
    kv_read = np.zeros(n, dtype=np.int64)
    write = np.zeros(n, dtype=np.int64)
    np.add.at(write, seg[is_dma & is_write], nbytes[is_dma & is_write])
    np.add.at(kv_read, seg[is_dma & ~is_write & kv], nbytes[is_dma & ~is_write & kv])
    np.add.at(read, seg[is_dma & ~is_write & ~kv], nbytes[is_dma & ~is_write & ~kv])
    # each segment's first transfer gives its initiator, address and pattern
    initiator, address, pattern = (np.zeros(n, dtype=np.int64) for _ in range(3))
    dma_rows = np.flatnonzero(is_dma)
    if dma_rows.size:
        segs, firsts = np.unique(seg[dma_rows], return_index=True)
        rows = order[dma_rows[firsts]]
        initiator[segs], address[segs], pattern[segs] = param[rows, 3], param[rows, 1], param[rows, 4]
    src, dst, at_end = _edges(order, seg, heads, ptr, idx, queue, start, end, first, last)
    noc = kinds == KIND_NOC
    return IterationCost(
        duration=duration, queue=seg_queue, kind=seg_kind, start=first, end=last, busy=busy, read=read,
        kv_read=kv_read, write=write, initiator=initiator, address=address, pattern=pattern,
        edge_src=src, edge_dst=dst, edge_end=at_end, fraction=fraction,
        noc_bytes=int(param[noc, 2].sum()), tasks_simulated=len(kinds))


def _edges(order, seg, heads, ptr, idx, queue, start, end, seg_start, seg_end):
    """Segment dependencies: for each segment's first task, the segments of the queued tasks it
    waited for (through barriers: tasks without a queue). Only edges from a segment that started
    earlier (ties: a lower index) are kept, so the skeleton is acyclic; an edge waits for the
    source's end when the source ended by the destination's start, else for its start."""
    seg_of = np.full(len(queue), -1, dtype=np.int64)
    seg_of[order] = seg
    memo: dict[int, frozenset] = {}

    def sources(t: int) -> frozenset:
        """Segments of the queued tasks barrier ``t`` waits for (iteratively, memoised)."""
        stack = [t]
        while stack:
            b = stack[-1]
            if b in memo:
                stack.pop()
                continue
            missing = [int(p) for p in idx[ptr[b]:ptr[b + 1]] if queue[p] < 0 and int(p) not in memo]
            if missing:
                stack.extend(missing)
                continue
            out = set()
            for p in idx[ptr[b]:ptr[b + 1]].tolist():
                if queue[p] >= 0:
                    out.add(int(seg_of[p]))
                else:
                    out |= memo[p]
            memo[b] = frozenset(out)
            stack.pop()
        return memo[t]

    src, dst, at_end = [], [], []
    for y, row in enumerate(heads.tolist()):
        t = int(order[row])
        found = set()
        for p in idx[ptr[t]:ptr[t + 1]].tolist():
            found |= {int(seg_of[p])} if queue[p] >= 0 else sources(p)
        for x in sorted(found):
            if x == y or (seg_start[x], x) >= (seg_start[y], y):
                continue
            src.append(x)
            dst.append(y)
            at_end.append(bool(seg_end[x] <= seg_start[y]))
    return (np.array(src, dtype=np.int64), np.array(dst, dtype=np.int64), np.array(at_end, dtype=bool))


KEY_VERSION = 2  # 2: one segment per DMA task
_PACKAGE = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def code_digest() -> str:
    """Digest of every npusim source file: any code change invalidates stored skeletons."""
    h = hashlib.blake2b(digest_size=12)
    for f in sorted(_PACKAGE.rglob("*.py")):
        h.update(f.relative_to(_PACKAGE).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


class ShapeStore:
    """Measured skeletons on disk, one ``.npz`` per shape under ``directory/<code digest>/``, keyed
    by everything that determines them (``context``: the chip, the instance's mapping and cores,
    the model, the fidelity, the segmentation) plus the shape. Writes are atomic; a missing,
    foreign or corrupt file is measured again. Lets sweeps and repeated runs reuse shapes.
    ``cls``: the kind of cost kept (:class:`IterationCost` or a stage replay's
    :class:`~npusim.serving.stagecost.StageCost`), with its ``ARRAYS`` and ``SCALARS`` fields."""

    def __init__(self, directory: Path, context: dict, cls=IterationCost):
        self.dir = Path(directory) / code_digest()
        self.cls = cls
        self.context = {"v": KEY_VERSION, "cost": cls.__name__, **context}

    def _key(self, shape: tuple) -> tuple[str, str]:
        text = json.dumps({**self.context, "shape": shape}, sort_keys=True, separators=(",", ":"), default=str)
        return text, hashlib.blake2b(text.encode(), digest_size=16).hexdigest()

    def get(self, shape: tuple) -> IterationCost | None:
        text, digest = self._key(shape)
        try:
            with np.load(self.dir / f"{digest}.npz") as f:
                if str(f["key"]) != text:
                    return None
                return self.cls(**{k: f[k].copy() for k in self.cls.ARRAYS},
                                **{k: f[k].item() for k in self.cls.SCALARS})
        except (OSError, ValueError, KeyError):
            return None

    def put(self, shape: tuple, cost: IterationCost) -> None:
        text, digest = self._key(shape)
        data = {k: getattr(cost, k) for k in self.cls.ARRAYS + self.cls.SCALARS}

        def writer(tmp: Path) -> None:
            with open(tmp, "wb") as fh:
                np.savez(fh, key=np.array(text), **data)

        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            write_with(self.dir / f"{digest}.npz", writer)
        except OSError:
            pass  # a read-only or full directory costs speed, not correctness


class IterationCostCache:
    """Per-instance store of measured shapes: ``cost(groups, sampled, placement, fraction)``
    returns the skeleton to replay, measuring the corner shapes it needs on first use.
    ``measure_fn(groups, sampled, placement)`` simulates a shape (the instance's)."""

    def __init__(self, buckets: Buckets, measure_fn, store: ShapeStore | None = None, measure_many=None):
        self.buckets = buckets
        self._measure = measure_fn
        self._measure_many = measure_many
        self.store = store
        self.shapes: dict[tuple, IterationCost] = {}
        self._ends: dict[tuple, tuple] = {}  # stage_cost: (groups, rows, placement, on the blend's cell) -> (cost, interpolated)
        self.stats = {"hits": 0, "misses": 0, "shapes_simulated": 0, "shapes_from_disk": 0, "interpolated": 0}

    def _known(self, key: tuple):
        """The cost of shape ``key`` if measured before, in this run or on disk; else None."""
        hit = self.shapes.get(key)
        if hit is None and self.store is not None:
            hit = self.store.get(key)
            if hit is not None:
                self.stats["shapes_from_disk"] += 1
                self.shapes[key] = hit
        return hit

    def _keep(self, key: tuple, cost) -> None:
        """A shape just measured: kept for the run and on disk."""
        self.stats["shapes_simulated"] += 1
        if self.store is not None:
            self.store.put(key, cost)
        self.shapes[key] = cost

    def _shape(self, groups, sampled, placement) -> IterationCost:
        key = (groups, sampled, placement)
        hit = self._known(key)
        if hit is None:
            hit = self._measure(list(groups), sampled, placement)
            self._keep(key, hit)
        return hit

    def _ensure(self, keys: list[tuple]) -> None:
        """Measure the shapes of ``keys`` not known yet at once with ``measure_many`` (a list of
        ``(groups, sampled, placement)`` in, their costs out, in order), which can overlap one
        shape's simulation with the next one's program; without it :meth:`_shape` measures them
        one by one. Same costs either way."""
        if self._measure_many is None:
            return
        missing = [key for key in dict.fromkeys(keys) if self._known(key) is None]
        if missing:
            for key, cost in zip(missing, self._measure_many([(list(g), s, p) for g, s, p in missing])):
                self._keep(key, cost)

    def tasks(self, groups, sampled: int, placement: float, fraction: float) -> tuple[tuple, int]:
        """The skeleton to replay for an iteration (see :meth:`IterationCost.tasks`): the upper
        corner's, with its delays, spans and busy cycles scaled to the duration interpolated
        between the corners and its KV reads to the interpolated KV bytes — so the iteration
        costs no more than its upper corner and no less than its lower one."""
        lo, hi, t = corners(groups, self.buckets)
        known = (hi, sampled, placement) in self.shapes and (t >= 1 or (lo, sampled, placement) in self.shapes)
        self.stats["hits" if known else "misses"] += 1
        upper = self._shape(hi, sampled, placement)
        if t >= 1 or lo == hi:
            return upper.tasks(fraction)
        lower = self._shape(lo, sampled, placement)
        self.stats["interpolated"] += 1
        duration = lower.duration + (upper.duration - lower.duration) * t
        time_scale = min(1.0, duration / upper.duration) if upper.duration else 1.0
        kv_hi = upper.kv_read.sum()
        kv_scale = min(1.0, (lower.kv_read.sum() + (kv_hi - lower.kv_read.sum()) * t) / kv_hi) if kv_hi else 1.0
        return upper.tasks(fraction, time_scale, kv_scale)

    def stage_cost(self, groups, sampled: int, fraction: float):
        """The stage timing of an iteration (:mod:`npusim.serving.stagecost`): the corners of its
        cell (:func:`grid_corners`) interpolated, each between its shapes measured with no KV and
        with all KV in HBM by the share ``fraction`` in HBM (KV reads scale with it). With a
        ``blend_kv`` bucket the all-in-SRAM end of that blend is interpolated on its own coarser
        cell (:attr:`Buckets.blend`)."""
        before = self.stats["shapes_simulated"] + self.stats["shapes_from_disk"]
        rows = self.buckets.rows(sampled)

        def key(g, placement):
            return g, min(rows, sum(n * q for n, q, _, _ in g)), placement  # a corner samples no more rows than it has

        def memo(placement, buckets):
            return groups, rows, placement, buckets is not self.buckets

        def end(placement, buckets):
            """``(cost, interpolated)`` of the cell's corners at one placement, kept per groups
            (decode steps repeat them)."""
            hit = self._ends.get(memo(placement, buckets))
            if hit is None:
                costs = [(self._shape(*key(c, placement)), w) for c, w in grid_corners(groups, buckets)]
                hit = (costs[0][0], False) if len(costs) == 1 else (StageCost.combine(costs), True)
                if len(self._ends) >= ENDS_KEPT:
                    self._ends.clear()
                if ENDS_KEPT > 0:
                    self._ends[memo(placement, buckets)] = hit
            return hit

        blend = self.buckets.blend
        if fraction <= 0 or fraction >= 1 or blend is not None:
            ends = ([(0.0, blend), (1.0, self.buckets)] if 0 < fraction < 1
                    else [(0.0 if fraction <= 0 else 1.0, self.buckets)])
            # the missing corners of every end measured together (one batch overlaps more)
            self._ensure([key(c, p) for p, b in ends if memo(p, b) not in self._ends for c, _ in grid_corners(groups, b)])
            (cost, interpolated), *other = [end(p, b) for p, b in ends]
            if other:
                cost, interpolated = cost.blend(other[0][0], fraction), interpolated or other[0][1]
        else:  # each corner blended between its own two placements, then the corners combined
            cell = grid_corners(groups, self.buckets)
            self._ensure([key(c, p) for c, _ in cell for p in (0.0, 1.0)])

            def at(g):
                return self._shape(*key(g, 0.0)).blend(self._shape(*key(g, 1.0)), fraction)

            interpolated = len(cell) > 1
            cost = StageCost.combine([(at(c), w) for c, w in cell]) if interpolated else at(cell[0][0])
        self.stats["interpolated"] += interpolated
        fresh = self.stats["shapes_simulated"] + self.stats["shapes_from_disk"] > before
        self.stats["misses" if fresh else "hits"] += 1
        return cost


ENDS_KEPT = 4096  # interpolated ends stage_cost keeps (a few MB); cleared when full; 0: none


SHARED_CHIP_LIMIT = ("instances share the chip's HBM and mesh, but each instance's cached iterations were "
                     "measured without the others' traffic and replay without it: interference between "
                     "instances is missing (PD disaggregation, validation/serving_iteration_cache.py: mean TTFT "
                     "-70%, mean TBT -14%); simulate such runs with --iteration-cache off")


def summary(caches: list[IterationCostCache], buckets: Buckets | None, replay: str, instances: int = 1,
            spills_over_mesh: bool = True) -> dict:
    """The ``iteration_cache`` section of a serving summary (``limits``: what the replay misses in
    this run, said plainly; ``kv_spills_over_mesh``: whether KV spills crossed the mesh or went
    straight to the memory model, see :meth:`npusim.serving.simulate.ServingConfig.spills_off_mesh`)."""
    if buckets is None:
        return {"enabled": False}
    out = {"enabled": True, "replay": replay,
           "buckets": asdict(buckets),
           "limits": [SHARED_CHIP_LIMIT] if instances > 1 else [], "kv_spills_over_mesh": spills_over_mesh}
    for key in ("hits", "misses", "shapes_simulated", "shapes_from_disk", "interpolated"):
        out[key] = sum(c.stats[key] for c in caches)
    n = out["hits"] + out["misses"]
    out["hit_rate"] = out["hits"] / n if n else math.nan
    return out
