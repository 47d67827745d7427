"""KV-cache memory manager of one core group: SRAM blocks, HBM ring buffers, spills,
admission control and optional prefix reuse.

One :class:`KVCacheManager` manages the KV cache of one *core group* (the set of cores
that holds a request's KV; the serving scheduler decides which group a request goes to
and keeps one manager per group). The scheduler calls it between iterations: ``admit``
a request, ``append`` the tokens each iteration produced (prefill chunks, decodes), ask
``location`` how many of a request's tokens are in SRAM and in HBM (for the attention and
DMA traffic it simulates), issue the returned :class:`Transfer` s as DMA writes, and
``free`` the request when it finishes.

Model and units
---------------

* ``bytes_per_token``: KV bytes of one token for the layers this group holds, summed over
  the group's cores. A *block* is ``block_tokens`` tokens = ``block_tokens *
  bytes_per_token`` bytes, a logical unit striped over the group's cores (per-core
  placement is not modelled).
* **SRAM** (``sram_bytes`` for the whole group): the static regions ``weights_bytes``,
  ``activation_bytes`` and ``temp_bytes`` are carved out first (:class:`ConfigError` if
  they exceed the SRAM); the rest, rounded down to whole blocks, is the KV block pool
  (``blocks_total``, possibly 0: then every token goes straight to HBM). Block ``b``
  occupies SRAM bytes ``[kv_base_bytes + b * block_bytes, ... + block_bytes)``.
  Each request's SRAM blocks form a linked list (``next_block[b]``, ``-1`` ends it; the
  request keeps head, tail and count), oldest tokens at the head; free blocks are a stack.
* **HBM** (``hbm_bytes``): at admission each request reserves one contiguous extent sized
  for its maximum token count, ``(input_len + output_len - prefix_hit_tokens) *
  bytes_per_token`` bytes: its KV ring buffer. Spilled tokens are written at the ring's
  write pointer, which is the number of tokens already in HBM; because the ring holds the
  request's maximum length the pointer never wraps (wrapping would need sliding-window
  attention, which is not modelled). Since the whole ring is reserved up front, an
  ``append`` never runs out of HBM. Extents come from a first-fit allocator over a
  sorted free-extent list that coalesces neighbours on free.
* **Token layout** of a request: its oldest ``hbm_tokens`` are in HBM, the newest
  ``sram_tokens`` in SRAM (``location`` returns ``(sram_tokens, hbm_tokens)``, prefix-cache
  hits included). The SRAM part always starts on a block boundary of the request's own
  token index (or is empty), so every SRAM block is full except the tail.
* **Spill policy** (on ``append``, when the free pool cannot hold the new tokens):
  (1) cached prefix blocks that no running request uses are demoted SRAM->HBM, least
  recently used first; (2) the growing request spills its own oldest blocks SRAM->HBM;
  (3) if even all its blocks plus the free pool cannot hold the new tokens, their oldest
  part is written straight to HBM (the KV is produced on the cores and written out, so it
  is reported as ``sram_to_hbm`` too). A request never takes another running request's
  SRAM blocks: the request that grows pays, other requests' attention traffic does not
  change under them, and an ``append`` touches one request's list only. Each spill is one
  contiguous HBM range, reported as one :class:`Transfer`.
* **Admission** reserves the ring. If HBM has no room: unreferenced cached prefixes are
  evicted (least recently used first), then with ``admission="queue"`` the request is
  refused (``Admission.ok`` False, ``reason`` says how much it needs and what is free; it
  should wait), with ``admission="preempt"`` the most recently admitted running requests
  are evicted one by one until the ring fits (they lose their KV and must be recomputed;
  ``Admission.preempted`` lists them, most recent first). Last-in-first-out preemption
  throws away the least work and keeps the oldest requests progressing. Because rings are
  reserved for the maximum length, running requests never run short of memory, so
  preemption only ever happens at admission: it favours arrivals over running requests.
  To bound recomputation and rule out two requests evicting each other forever, a
  request is preempted at most once: after that it is never a victim again and does not
  preempt others itself (it is admitted when memory frees, as with ``"queue"``). Nothing
  is evicted or preempted unless evicting all the candidates would leave a free extent
  that holds the ring (HBM fragmentation included, so a refused admission never preempted
  anyone). A request whose maximum KV exceeds the whole HBM is refused with a reason
  saying it can *never* fit (``Admission.permanent``). SRAM never refuses a request: what
  does not fit spills. No silent overflow: appending beyond ``input_len + output_len``
  raises ``ValueError``.
* **Prefix reuse** (``prefix_cache=True``): requests carry ``hash_ids``, one per
  ``prefix_block_tokens`` (512, Mooncake) tokens of their input; equal ids at the same
  position after the same earlier ids mean the same tokens. Cached prefix blocks form a
  trie keyed by ``(parent node, hash id)``, so a hit needs the whole chain to match (this
  is exact whether or not the ids are chained hashes). ``prefix_block_tokens`` must be a
  multiple of ``block_tokens`` (:class:`ConfigError` otherwise), so a cached prefix block
  is a whole number of SRAM blocks. On admission the longest cached chain is reused,
  capped at ``(input_len - 1) // 512`` blocks so at least one input token is computed
  (the one whose logits sample the first output token); the hit nodes are
  reference-counted and pinned while the request runs, and ``prefix_hit_tokens`` counts
  the tokens that need neither prefill compute nor new KV (the ring is that much
  smaller). When a request finishes, each full 512-token block of its *input* that is not
  cached yet becomes a cache node: the node keeps the request's SRAM blocks for those
  tokens and the matching byte range of its HBM ring (carved out; the rest of the ring is
  freed), so it always has an HBM home to be demoted to without allocating. Unreferenced
  nodes are demoted SRAM->HBM (LRU) when SRAM is needed and evicted (LRU, leaves first so
  the trie stays connected) when HBM is needed. Preempted requests do not donate (their
  KV is being given up to make room).

All sizes are integers: ``*_bytes`` in bytes, ``*_tokens`` in tokens, blocks in blocks.
Request ids are any hashable (ints in practice). Misuse by the caller (unknown or
duplicate request id, negative lengths, appending past the maximum) raises
``KeyError``/``ValueError``; invalid construction parameters raise :class:`ConfigError`.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from dataclasses import dataclass, field
from collections.abc import Hashable, Sequence

import numpy as np

from npusim.errors import ConfigError

SRAM_TO_HBM = "sram_to_hbm"
ADMISSION_POLICIES = ("queue", "preempt")
#: Rejection codes (``Admission.code``; keys of ``stats()["rejections"]``).
HBM_FULL = "hbm_full"
EXCEEDS_HBM = "exceeds_hbm_capacity"


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class Transfer:
    """A KV move the scheduler should simulate as a DMA write.

    ``request_id`` is the request whose KV moved, or ``None`` when a cached prefix block
    (no running request) was demoted. ``tokens`` tokens = ``nbytes`` bytes land at HBM
    bytes ``[hbm_offset_bytes, hbm_offset_bytes + nbytes)``.
    """

    request_id: Hashable | None
    nbytes: int
    tokens: int
    hbm_offset_bytes: int
    direction: str = SRAM_TO_HBM


@dataclass(slots=True)
class Admission:
    """Outcome of :meth:`KVCacheManager.admit`; truthy when admitted.

    ``reason``/``code`` explain a refusal (``code`` is :data:`HBM_FULL`: wait and retry, or
    :data:`EXCEEDS_HBM`: ``permanent``, the request can never fit).
    ``prefix_hit_tokens``: input tokens whose KV was reused from the prefix cache (no
    prefill compute, no new KV). ``preempted``: running requests evicted to make room
    (most recently admitted first); their KV is gone and they must be recomputed. A
    refused admission never preempts.
    """

    ok: bool
    reason: str | None = None
    code: str | None = None
    permanent: bool = False
    prefix_hit_tokens: int = 0
    preempted: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return self.ok


class ExtentAllocator:
    """First-fit allocator of byte extents in ``[0, capacity_bytes)``.

    Keeps only the free extents, sorted by offset (two parallel lists); ``free`` coalesces
    with both neighbours. Allocation scans for the first free extent large enough:
    O(free extents), which stays small (hundreds) in serving.
    """

    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self._off: list[int] = [0] if capacity_bytes > 0 else []
        self._size: list[int] = [capacity_bytes] if capacity_bytes > 0 else []
        self.free_bytes = capacity_bytes

    def alloc(self, nbytes: int) -> int | None:
        """Offset of a new extent of ``nbytes`` (> 0) bytes, or ``None`` if no free extent fits."""
        for i, size in enumerate(self._size):
            if size >= nbytes:
                off = self._off[i]
                if size == nbytes:
                    del self._off[i], self._size[i]
                else:
                    self._off[i] += nbytes
                    self._size[i] -= nbytes
                self.free_bytes -= nbytes
                return off
        return None

    def free(self, off: int, nbytes: int) -> int:
        """Return ``[off, off + nbytes)`` to the free list; returns the size of the
        (coalesced) free extent that now contains it. Freeing free space is an error."""
        if nbytes <= 0:
            return 0
        i = bisect.bisect_left(self._off, off)
        if i < len(self._off) and self._off[i] < off + nbytes:
            raise AssertionError(f"HBM double free: [{off}, {off + nbytes}) overlaps free extent at {self._off[i]}")
        if i > 0 and self._off[i - 1] + self._size[i - 1] > off:
            raise AssertionError(f"HBM double free: [{off}, {off + nbytes}) overlaps free extent at {self._off[i - 1]}")
        self.free_bytes += nbytes
        if i < len(self._off) and self._off[i] == off + nbytes:  # merge with the next
            nbytes += self._size[i]
            del self._off[i], self._size[i]
        if i > 0 and self._off[i - 1] + self._size[i - 1] == off:  # merge with the previous
            self._size[i - 1] += nbytes
            return self._size[i - 1]
        self._off.insert(i, off)
        self._size.insert(i, nbytes)
        return nbytes

    def largest_free(self) -> int:
        return max(self._size, default=0)

    def extents(self) -> list[tuple[int, int]]:
        """Free extents ``(offset_bytes, size_bytes)`` sorted by offset."""
        return list(zip(self._off, self._size))


class _Seq:
    """A run of KV tokens with SRAM blocks and an HBM extent: a request's own KV or a
    cached prefix block. Tokens ``[0, hbm_tokens)`` are in HBM at ``hbm_off``,
    ``[hbm_tokens, tokens)`` in ``nblocks`` SRAM blocks ``head -> ... -> tail``."""

    __slots__ = ("sid", "tokens", "hbm_tokens", "nblocks", "head", "tail", "hbm_off", "cap_tokens")

    def __init__(self, sid: int, hbm_off: int, cap_tokens: int):
        self.sid = sid
        self.tokens = 0
        self.hbm_tokens = 0
        self.nblocks = 0
        self.head = -1
        self.tail = -1
        self.hbm_off = hbm_off
        self.cap_tokens = cap_tokens


class _Request(_Seq):
    __slots__ = ("req_id", "input_len", "output_len", "hash_ids", "hits", "prefix_sram", "prefix_hbm")


class _Node(_Seq):
    """A cached prefix block (``prefix_block_tokens`` tokens), a trie node."""

    __slots__ = ("key", "parent", "children", "refs")


class KVCacheManager:
    """KV cache of one core group; see the module docstring for the model and policies.

    Parameters (bytes unless noted): ``sram_bytes`` SRAM of the whole group;
    ``hbm_bytes`` HBM available for KV; ``bytes_per_token`` KV bytes per token for this
    group's layers over its cores; ``block_tokens`` tokens per SRAM block;
    ``weights_bytes``/``activation_bytes``/``temp_bytes`` static SRAM regions;
    ``admission`` ``"queue"`` or ``"preempt"``; ``prefix_cache`` enables prefix reuse by
    ``hash_ids`` of ``prefix_block_tokens`` tokens each; ``debug`` runs
    :meth:`check_invariants` after every operation.
    """

    def __init__(self, sram_bytes: int, hbm_bytes: int, bytes_per_token: int, block_tokens: int = 16,
                 weights_bytes: int = 0, activation_bytes: int = 0, temp_bytes: int = 0,
                 admission: str = "queue", prefix_cache: bool = False, debug: bool = False,
                 prefix_block_tokens: int = 512):
        for name, v in (("sram_bytes", sram_bytes), ("hbm_bytes", hbm_bytes), ("weights_bytes", weights_bytes),
                        ("activation_bytes", activation_bytes), ("temp_bytes", temp_bytes)):
            if int(v) != v or v < 0:
                raise ConfigError(f"KV cache manager: {name} must be a non-negative integer number of bytes, got {v!r}")
        for name, v in (("bytes_per_token", bytes_per_token), ("block_tokens", block_tokens),
                        ("prefix_block_tokens", prefix_block_tokens)):
            if int(v) != v or v <= 0:
                raise ConfigError(f"KV cache manager: {name} must be a positive integer, got {v!r}")
        if admission not in ADMISSION_POLICIES:
            raise ConfigError(f"KV cache manager: admission must be one of {ADMISSION_POLICIES}, got {admission!r}")
        static = int(weights_bytes) + int(activation_bytes) + int(temp_bytes)
        if static > sram_bytes:
            raise ConfigError(
                f"KV cache manager: static SRAM regions (weights {weights_bytes} B + activations "
                f"{activation_bytes} B + temporaries {temp_bytes} B = {static} B) exceed the group's "
                f"SRAM of {sram_bytes} B")
        if prefix_cache and prefix_block_tokens % block_tokens:
            raise ConfigError(
                f"KV cache manager: with prefix_cache the prefix hash block ({prefix_block_tokens} tokens) "
                f"must be a multiple of block_tokens ({block_tokens})")
        self.sram_bytes = int(sram_bytes)
        self.hbm_bytes = int(hbm_bytes)
        self.bytes_per_token = int(bytes_per_token)
        self.block_tokens = int(block_tokens)
        self.block_bytes = self.block_tokens * self.bytes_per_token
        self.static_bytes = static
        self.kv_base_bytes = static
        self.admission = admission
        self.prefix_cache = bool(prefix_cache)
        self.prefix_block_tokens = int(prefix_block_tokens)
        self.debug = bool(debug)

        nb = (self.sram_bytes - static) // self.block_bytes
        self.blocks_total = nb
        self.next_block = np.full(nb, -1, dtype=np.int64)
        self.block_owner = np.full(nb, -1, dtype=np.int64)  # seq id, -1 = free
        self._free_stack = np.arange(nb - 1, -1, -1, dtype=np.int64)  # pops block 0 first
        self._free_top = nb
        self._hbm = ExtentAllocator(self.hbm_bytes)

        self._next_sid = 0
        self._requests: dict[Hashable, _Request] = {}  # insertion order = admission order
        self._nodes: dict[int, _Node] = {}
        self._trie: dict[tuple[int, Hashable], _Node] = {}
        self._lru: OrderedDict[int, _Node] = OrderedDict()  # unreferenced nodes, oldest first
        self._lru_sram: OrderedDict[int, _Node] = OrderedDict()  # ... those holding SRAM blocks
        self._reclaimable = 0  # SRAM blocks held by unreferenced nodes
        self._preempted_once: set = set()  # ids preempted before and not yet finished: protected
        self._stats = {
            "admitted": 0, "freed": 0, "rejections": {}, "preemptions": 0,
            "spills": 0, "spilled_bytes": 0, "direct_hbm_write_bytes": 0,
            "prefix_lookups": 0, "prefix_hit_requests": 0, "prefix_hit_tokens": 0,
            "prefix_nodes_created": 0, "prefix_evictions": 0, "prefix_demotions": 0, "prefix_demoted_bytes": 0,
        }

    # ------------------------------------------------------------------ public API
    def admit(self, req_id: Hashable, input_len: int, output_len: int, hash_ids: Sequence = ()) -> Admission:
        """Admit a request with ``input_len`` prompt tokens and up to ``output_len`` generated
        tokens: reserve its HBM ring and reuse cached prefix blocks of ``hash_ids`` (one
        hashable per ``prefix_block_tokens`` input tokens; ignored without ``prefix_cache``).

        Returns an :class:`Admission`. Cached prefixes are evicted and (``preempt``) running
        requests preempted only when that is sure to make room, so a refusal leaves every
        request and cached block in place.
        """
        if req_id in self._requests:
            raise ValueError(f"KV cache: request {req_id!r} is already admitted")
        if int(input_len) != input_len or input_len < 1 or int(output_len) != output_len or output_len < 0:
            raise ValueError(f"KV cache: request {req_id!r} needs input_len >= 1 and output_len >= 0, "
                             f"got {input_len!r}, {output_len!r}")
        max_tokens = int(input_len) + int(output_len)
        total_bytes = max_tokens * self.bytes_per_token
        if total_bytes > self.hbm_bytes:
            return self._reject(EXCEEDS_HBM, True,
                                f"{EXCEEDS_HBM}: request {req_id!r} can never fit: {max_tokens} tokens x "
                                f"{self.bytes_per_token} B/token = {total_bytes} B of KV exceeds the group's HBM "
                                f"of {self.hbm_bytes} B")
        hits = self._match_prefix(hash_ids, int(input_len)) if self.prefix_cache else []
        if self.prefix_cache and len(hash_ids):
            self._stats["prefix_lookups"] += 1
        self._pin(hits)
        preempted: list = []
        may_preempt = self.admission == "preempt" and req_id not in self._preempted_once
        off = self._reserve_hbm((max_tokens - len(hits) * self.prefix_block_tokens) * self.bytes_per_token,
                                may_preempt, preempted)
        if off is None and hits:  # the pinned hits may fragment HBM: retry without them
            self._unpin(hits)
            hits = []
            off = self._reserve_hbm(total_bytes, may_preempt, preempted)
        if off is None:
            return self._reject(
                HBM_FULL, False,
                f"{HBM_FULL}: request {req_id!r} needs {total_bytes} B of contiguous HBM for its KV ring buffer; "
                f"largest free extent is {self._hbm.largest_free()} B ({self._hbm.free_bytes} B free); "
                f"wait for running requests to finish", preempted)
        req = self._new_request(req_id, off, int(input_len), int(output_len), tuple(hash_ids), hits)
        self._requests[req_id] = req
        hit_tokens = len(hits) * self.prefix_block_tokens
        self._stats["admitted"] += 1
        if hits:
            self._stats["prefix_hit_requests"] += 1
            self._stats["prefix_hit_tokens"] += hit_tokens
        self._debug_check()
        return Admission(True, prefix_hit_tokens=hit_tokens, preempted=preempted)

    def append(self, req_id: Hashable, tokens: int) -> list[Transfer]:
        """Grow request ``req_id``'s KV by ``tokens`` (>= 0) tokens; returns the SRAM->HBM
        transfers this caused (demoted prefix blocks first, then the request's own spill)."""
        req = self._get(req_id)
        if int(tokens) != tokens or tokens < 0:
            raise ValueError(f"KV cache: append of {tokens!r} tokens to request {req_id!r}; need an integer >= 0")
        tokens = int(tokens)
        if tokens == 0:
            return []
        if req.tokens + tokens > req.cap_tokens:
            raise ValueError(
                f"KV cache: request {req_id!r} would hold {req.tokens + tokens} tokens of its own KV, more than the "
                f"{req.cap_tokens} reserved at admission (input_len + output_len - prefix hit tokens)")
        old_tokens, old_hbm = req.tokens, req.hbm_tokens
        new_tokens = old_tokens + tokens
        avail = req.nblocks + self._free_top + self._reclaimable
        if not avail:  # no SRAM block to hold it (a system's dies, KV in HBM only): straight to HBM
            # what the general path below does when no block can be had, without its block arrays
            n = new_tokens - old_hbm
            req.hbm_tokens = req.tokens = new_tokens
            st = self._stats
            st["spills"] += 1
            st["spilled_bytes"] += n * self.bytes_per_token
            st["direct_hbm_write_bytes"] += tokens * self.bytes_per_token
            self._debug_check()
            return [Transfer(req.req_id, n * self.bytes_per_token, n, req.hbm_off + old_hbm * self.bytes_per_token)]
        transfers: list[Transfer] = []
        B = self.block_tokens
        new_hbm = min(new_tokens, B * max(_ceil_div(old_hbm, B), _ceil_div(new_tokens, B) - avail))
        if new_hbm > old_hbm:
            spilled = self._spill_request(req, new_hbm)
            self._stats["direct_hbm_write_bytes"] += max(0, new_hbm - old_tokens) * self.bytes_per_token
        req.tokens = new_tokens
        need = _ceil_div(new_tokens - req.hbm_tokens, B) - req.nblocks
        while need > self._free_top:
            transfers.append(self._demote_lru_node())
        if need > 0:
            self._link(req, self._pop_free(need))
        if new_hbm > old_hbm:
            transfers.append(spilled)
        self._debug_check()
        return transfers

    def location(self, req_id: Hashable) -> tuple[int, int]:
        """``(sram_tokens, hbm_tokens)`` of request ``req_id``'s KV, prefix-cache hits included."""
        req = self._get(req_id)
        return req.prefix_sram + req.tokens - req.hbm_tokens, req.prefix_hbm + req.hbm_tokens

    def free(self, req_id: Hashable) -> None:
        """Release a finished request: its full input prefix blocks go to the prefix cache
        (when enabled), everything else returns to the free pool and the HBM allocator."""
        req = self._requests.pop(self._get(req_id).req_id)
        self._preempted_once.discard(req.req_id)
        self._release(req, donate=self.prefix_cache)
        self._stats["freed"] += 1
        self._debug_check()

    def evict_prefix_cache(self) -> int:
        """Drop every unreferenced cached prefix block; returns how many were dropped."""
        n = 0
        while self._evict_lru_node() is not None:
            n += 1
        self._debug_check()
        return n

    def __contains__(self, req_id: Hashable) -> bool:
        return req_id in self._requests

    @property
    def running(self) -> list:
        """Admitted, not yet freed request ids in admission order."""
        return list(self._requests)

    def hbm_extent(self, req_id: Hashable) -> tuple[int, int]:
        """``(offset_bytes, size_bytes)`` of the request's HBM ring buffer (its own KV;
        prefix-cache hits live in their nodes' extents)."""
        req = self._get(req_id)
        return req.hbm_off, req.cap_tokens * self.bytes_per_token

    def sram_blocks(self, req_id: Hashable) -> np.ndarray:
        """The request's SRAM block ids, oldest tokens first (walks its list)."""
        return self._walk(self._get(req_id))

    def occupancy(self) -> dict:
        """Current use of SRAM and HBM (bytes, blocks, tokens); ``sram_used_bytes`` counts the
        static regions plus allocated KV blocks, ``hbm_used_bytes`` the reserved extents."""
        used_blocks = self.blocks_total - self._free_top
        sram_tok = sum(r.tokens - r.hbm_tokens for r in self._requests.values())
        hbm_tok = sum(r.hbm_tokens for r in self._requests.values())
        return {
            "sram_total": self.sram_bytes,
            "sram_used_bytes": self.static_bytes + used_blocks * self.block_bytes,
            "sram_static_bytes": self.static_bytes,
            "sram_kv_pool_bytes": self.blocks_total * self.block_bytes,
            "sram_kv_used_bytes": used_blocks * self.block_bytes,
            "hbm_total": self.hbm_bytes,
            "hbm_used_bytes": self.hbm_bytes - self._hbm.free_bytes,
            "hbm_largest_free_bytes": self._hbm.largest_free(),
            "blocks_total": self.blocks_total,
            "blocks_free": self._free_top,
            "blocks_reclaimable": self._reclaimable,
            "running_requests": len(self._requests),
            "request_sram_tokens": sram_tok,
            "request_hbm_tokens": hbm_tok,
            "prefix_nodes": len(self._nodes),
            "prefix_nodes_unreferenced": len(self._lru),
        }

    def stats(self) -> dict:
        """Counters since construction: admitted, freed, rejections by code, preemptions,
        spills (transfers of requests' own KV) and spilled bytes (of which written straight
        to HBM), prefix lookups/hit requests/hit tokens, prefix nodes created, evicted and
        demoted (count and bytes). A JSON-serialisable copy."""
        s = dict(self._stats)
        s["rejections"] = dict(s["rejections"])
        return s

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        """Raise AssertionError naming the first broken invariant: block ownership vs the
        free list (a partition of the pool), each list's links, count, tail and token
        length, the SRAM alignment rule, HBM extents (requests, prefix nodes and free
        extents tile ``[0, hbm_bytes)`` without overlap), prefix refcounts and LRU sets."""
        nb, B = self.blocks_total, self.block_tokens
        seen = np.zeros(nb, dtype=bool)
        free = self._free_stack[:self._free_top]
        _check(self._free_top >= 0 and self._free_top <= nb, f"free-stack top {self._free_top} outside [0, {nb}]")
        _check(len(np.unique(free)) == len(free), "a block is on the free list twice")
        _check(bool(np.all(self.block_owner[free] == -1)), "a block on the free list has an owner")
        seen[free] = True
        seqs: list[_Seq] = [*self._requests.values(), *self._nodes.values()]
        extents: list[tuple[int, int, str]] = []
        for s in seqs:
            what = f"request {s.req_id!r}" if isinstance(s, _Request) else f"prefix node {s.sid}"
            ids = self._walk(s, limit=nb + 1)
            _check(len(ids) == s.nblocks, f"{what}: list has {len(ids)} blocks, count says {s.nblocks}")
            _check(not np.any(seen[ids]), f"{what}: a block is owned twice or is also free")
            seen[ids] = True
            _check(bool(np.all(self.block_owner[ids] == s.sid)), f"{what}: block_owner disagrees with its list")
            _check(s.tail == (int(ids[-1]) if len(ids) else -1), f"{what}: tail {s.tail} is not the list's last block")
            _check(0 <= s.hbm_tokens <= s.tokens <= s.cap_tokens,
                   f"{what}: need 0 <= hbm {s.hbm_tokens} <= tokens {s.tokens} <= cap {s.cap_tokens}")
            _check(s.nblocks == _ceil_div(s.tokens - s.hbm_tokens, B),
                   f"{what}: {s.nblocks} blocks for {s.tokens - s.hbm_tokens} SRAM tokens")
            _check(s.hbm_tokens % B == 0 or s.hbm_tokens == s.tokens,
                   f"{what}: SRAM part starts mid-block at token {s.hbm_tokens}")
            extents.append((s.hbm_off, s.cap_tokens * self.bytes_per_token, what))
        _check(bool(seen.all()), f"{int((~seen).sum())} blocks are neither free nor owned (leaked)")
        extents += [(o, n, "free extent") for o, n in self._hbm.extents()]
        extents.sort()
        pos = 0
        for off, size, what in extents:
            _check(off == pos, f"HBM: {what} at {off} B, expected {pos} B (overlap or leak)")
            pos = off + size
        _check(pos == self.hbm_bytes, f"HBM extents end at {pos} B, capacity {self.hbm_bytes} B")
        self._check_prefix()

    def _check_prefix(self) -> None:
        refs: dict[int, int] = {}
        for r in self._requests.values():
            parent = -1
            for i, n in enumerate(r.hits):
                _check(n.key == (parent, r.hash_ids[i]), f"request {r.req_id!r}: hit {i} is not its chain")
                refs[n.sid] = refs.get(n.sid, 0) + 1
                parent = n.sid
            _check(r.prefix_sram == sum(n.tokens - n.hbm_tokens for n in r.hits) and
                   r.prefix_hbm == sum(n.hbm_tokens for n in r.hits), f"request {r.req_id!r}: stale prefix location")
        children: dict[int, int] = {}
        for n in self._nodes.values():
            _check(self._trie.get(n.key) is n, f"prefix node {n.sid} is not in the trie under its key")
            _check(n.tokens == n.cap_tokens == self.prefix_block_tokens, f"prefix node {n.sid} is not a full block")
            _check(n.refs == refs.get(n.sid, 0), f"prefix node {n.sid}: refcount {n.refs}, "
                                                 f"referenced by {refs.get(n.sid, 0)} requests")
            _check((n.sid in self._lru) == (n.refs == 0), f"prefix node {n.sid}: LRU membership vs refcount")
            _check((n.sid in self._lru_sram) == (n.refs == 0 and n.nblocks > 0), f"prefix node {n.sid}: SRAM LRU")
            if n.parent is not None:
                _check(n.parent.sid in self._nodes, f"prefix node {n.sid}: parent evicted")
                children[n.parent.sid] = children.get(n.parent.sid, 0) + 1
        for n in self._nodes.values():
            _check(n.children == children.get(n.sid, 0), f"prefix node {n.sid}: child count")
        _check(len(self._trie) == len(self._nodes), "trie and node table differ")
        _check(self._reclaimable == sum(n.nblocks for n in self._lru_sram.values()), "reclaimable block count")

    def _debug_check(self) -> None:
        if self.debug:
            self.check_invariants()

    # ------------------------------------------------------------------ SRAM blocks
    def _pop_free(self, k: int) -> np.ndarray:
        """Take ``k`` blocks off the free stack."""
        self._free_top -= k
        return self._free_stack[self._free_top:self._free_top + k].copy()

    def _push_free(self, ids: np.ndarray) -> None:
        k = len(ids)
        self.block_owner[ids] = -1
        self.next_block[ids] = -1
        self._free_stack[self._free_top:self._free_top + k] = ids
        self._free_top += k

    def _link(self, s: _Seq, ids: np.ndarray) -> None:
        """Append blocks ``ids`` (in order) to the tail of ``s``'s list."""
        if not len(ids):
            return
        self.next_block[ids[:-1]] = ids[1:]
        self.next_block[ids[-1]] = -1
        self.block_owner[ids] = s.sid
        if s.tail >= 0:
            self.next_block[s.tail] = ids[0]
        else:
            s.head = int(ids[0])
        s.tail = int(ids[-1])
        s.nblocks += len(ids)

    def _walk(self, s: _Seq, limit: int | None = None) -> np.ndarray:
        """Block ids of ``s`` head to tail (at most ``limit`` steps, guarding against cycles)."""
        n = s.nblocks if limit is None else limit
        out = []
        b = s.head
        nxt = self.next_block
        while b >= 0 and len(out) < n:
            out.append(b)
            b = int(nxt[b])
        return np.array(out, dtype=np.int64)

    def _unlink_head(self, s: _Seq, k: int) -> np.ndarray:
        """Detach the ``k`` oldest blocks of ``s`` and return them (oldest first)."""
        out = []
        b = s.head
        nxt = self.next_block
        for _ in range(k):
            out.append(b)
            b = int(nxt[b])
        s.head = b
        s.nblocks -= k
        if s.nblocks == 0:
            s.head = s.tail = -1
        return np.array(out, dtype=np.int64)

    def _spill_request(self, req: _Request, new_hbm: int) -> Transfer:
        """Move ``req``'s tokens ``[hbm_tokens, new_hbm)`` to HBM: whole oldest blocks (all of
        them when ``new_hbm`` passes its current end; the excess is new tokens written straight
        to HBM). The blocks go back to the free stack."""
        old_hbm = req.hbm_tokens
        k = req.nblocks if new_hbm >= req.tokens else (new_hbm - old_hbm) // self.block_tokens
        self._push_free(self._unlink_head(req, k))
        req.hbm_tokens = new_hbm
        n = new_hbm - old_hbm
        self._stats["spills"] += 1
        self._stats["spilled_bytes"] += n * self.bytes_per_token
        return Transfer(req.req_id, n * self.bytes_per_token, n, req.hbm_off + old_hbm * self.bytes_per_token)

    # ------------------------------------------------------------------ HBM and admission
    def _reject(self, code: str, permanent: bool, reason: str, preempted: list | None = None) -> Admission:
        rej = self._stats["rejections"]
        rej[code] = rej.get(code, 0) + 1
        self._debug_check()
        return Admission(False, reason=reason, code=code, permanent=permanent, preempted=preempted or [])

    def _reserve_hbm(self, nbytes: int, may_preempt: bool, preempted: list) -> int | None:
        """Allocate ``nbytes`` of HBM, evicting unreferenced prefix nodes (LRU) first and
        then, if ``may_preempt``, preempting running requests (most recently admitted first,
        never one preempted before). Nothing is evicted or preempted unless that could make
        ``nbytes`` free; the victims' ids are appended to ``preempted``."""
        off = self._hbm.alloc(nbytes)
        if off is not None:
            return off
        victims = [r for r in reversed(self._requests.values())
                   if r.req_id not in self._preempted_once] if may_preempt else []
        if not self._placeable_after(victims, nbytes):
            return None
        victims.reverse()  # pop() takes the most recently admitted
        while off is None:
            grown = self._evict_lru_node()
            if grown is None and victims:
                victim = victims.pop()
                del self._requests[victim.req_id]
                grown = self._release(victim, donate=False)
                preempted.append(victim.req_id)
                self._preempted_once.add(victim.req_id)
                self._stats["preemptions"] += 1
            if grown is None:
                return None
            if grown >= nbytes:
                off = self._hbm.alloc(nbytes)
        return off

    def _placeable_after(self, victims: list[_Request], nbytes: int) -> bool:
        """Whether ``nbytes`` contiguous HBM bytes would be free after evicting every
        unreferenced prefix node and preempting all of ``victims`` (their rings and the
        nodes only they reference): exact, fragmentation included."""
        node_bytes = self.prefix_block_tokens * self.bytes_per_token
        extents = self._hbm.extents() + [(n.hbm_off, node_bytes) for n in self._lru.values()]
        refs: dict[int, int] = {}
        for r in victims:
            extents.append((r.hbm_off, r.cap_tokens * self.bytes_per_token))
            for n in r.hits:
                refs[n.sid] = refs.get(n.sid, 0) + 1
        extents += [(self._nodes[sid].hbm_off, node_bytes) for sid, k in refs.items() if self._nodes[sid].refs == k]
        return _has_coalesced_run(extents, nbytes)

    def _new_request(self, req_id, off: int, input_len: int, output_len: int, hash_ids: tuple,
                     hits: list) -> _Request:
        r = _Request(self._new_sid(), off, input_len + output_len - len(hits) * self.prefix_block_tokens)
        r.req_id, r.input_len, r.output_len, r.hash_ids, r.hits = req_id, input_len, output_len, hash_ids, hits
        r.prefix_sram = sum(n.tokens - n.hbm_tokens for n in hits)
        r.prefix_hbm = sum(n.hbm_tokens for n in hits)
        return r

    def _release(self, req: _Request, donate: bool) -> int:
        """Give back ``req``'s blocks and ring (keeping donated prefix blocks) and unpin its
        hits; returns the largest coalesced free HBM extent this produced."""
        ids = self._walk(req)
        keep = np.zeros(len(ids), dtype=bool)
        kept: list[tuple[int, int]] = []  # HBM ranges now owned by new prefix nodes
        chain = list(req.hits)
        if donate:
            chain += self._donate(req, ids, keep, kept)
        self._push_free(ids[~keep])
        grown = 0
        pos, end = req.hbm_off, req.hbm_off + req.cap_tokens * self.bytes_per_token
        for off, size in kept:
            grown = max(grown, self._hbm.free(pos, off - pos))
            pos = off + size
        grown = max(grown, self._hbm.free(pos, end - pos))
        for n in req.hits:
            n.refs -= 1
        for n in reversed(chain):  # deepest first: a parent is always more recent than its children
            if n.refs == 0:
                self._lru_touch(n)
        return grown

    def _donate(self, req: _Request, ids: np.ndarray, keep: np.ndarray, kept: list) -> list:
        """Turn ``req``'s full, uncached input blocks of ``prefix_block_tokens`` into prefix
        nodes that take over its SRAM blocks and HBM range for those tokens. Marks the blocks
        in ``keep``, records HBM ranges in ``kept``; returns the chain nodes past the hits."""
        P, B, bpt = self.prefix_block_tokens, self.block_tokens, self.bytes_per_token
        n_hit = len(req.hits)
        n_full = min(len(req.hash_ids), req.input_len // P, (n_hit * P + req.tokens) // P)
        parent = req.hits[-1] if req.hits else None
        chain = []
        for i in range(n_hit, n_full):
            key = (parent.sid if parent is not None else -1, req.hash_ids[i])
            node = self._trie.get(key)
            if node is None:
                a = (i - n_hit) * P  # the block's first token in the request's own index
                node = _Node(self._new_sid(), req.hbm_off + a * bpt, P)
                node.key, node.parent, node.children, node.refs = key, parent, 0, 0
                node.tokens = P
                node.hbm_tokens = min(P, max(0, req.hbm_tokens - a))
                if node.hbm_tokens < P:
                    lo = (a + node.hbm_tokens - req.hbm_tokens) // B
                    hi = (a + P - req.hbm_tokens) // B
                    self._link(node, ids[lo:hi])
                    keep[lo:hi] = True
                kept.append((node.hbm_off, P * bpt))
                if parent is not None:
                    parent.children += 1
                self._trie[key] = node
                self._nodes[node.sid] = node
                self._stats["prefix_nodes_created"] += 1
            chain.append(node)
            parent = node
        return chain

    # ------------------------------------------------------------------ prefix cache
    def _match_prefix(self, hash_ids: Sequence, input_len: int) -> list[_Node]:
        """Longest cached chain of ``hash_ids``, at most ``(input_len - 1) // P`` blocks."""
        hits: list[_Node] = []
        parent = -1
        for h in hash_ids[:(input_len - 1) // self.prefix_block_tokens]:
            node = self._trie.get((parent, h))
            if node is None:
                break
            hits.append(node)
            parent = node.sid
        return hits

    def _pin(self, nodes: list[_Node]) -> None:
        for n in nodes:
            if n.refs == 0:
                self._lru.pop(n.sid)
                if self._lru_sram.pop(n.sid, None) is not None:
                    self._reclaimable -= n.nblocks
            n.refs += 1

    def _unpin(self, nodes: list[_Node]) -> None:
        for n in nodes:
            n.refs -= 1
        for n in reversed(nodes):
            if n.refs == 0:
                self._lru_touch(n)

    def _lru_touch(self, n: _Node) -> None:
        """Mark unreferenced node ``n`` most recently used."""
        self._lru.pop(n.sid, None)
        self._lru[n.sid] = n
        if n.nblocks:
            if self._lru_sram.pop(n.sid, None) is None:
                self._reclaimable += n.nblocks
            self._lru_sram[n.sid] = n

    def _demote_lru_node(self) -> Transfer:
        """Write the least recently used unreferenced node's SRAM blocks to its HBM range."""
        sid, n = self._lru_sram.popitem(last=False)
        self._reclaimable -= n.nblocks
        self._push_free(self._unlink_head(n, n.nblocks))
        moved = n.tokens - n.hbm_tokens
        t = Transfer(None, moved * self.bytes_per_token, moved, n.hbm_off + n.hbm_tokens * self.bytes_per_token)
        n.hbm_tokens = n.tokens
        self._stats["prefix_demotions"] += 1
        self._stats["prefix_demoted_bytes"] += t.nbytes
        return t

    def _evict_lru_node(self) -> int | None:
        """Drop the least recently used unreferenced leaf node; returns the coalesced free
        HBM extent it joined, or ``None`` if there is none to drop."""
        victim = next((n for n in self._lru.values() if n.children == 0), None)
        if victim is None:
            return None
        del self._lru[victim.sid]
        if self._lru_sram.pop(victim.sid, None) is not None:
            self._reclaimable -= victim.nblocks
        self._push_free(self._unlink_head(victim, victim.nblocks))
        del self._trie[victim.key], self._nodes[victim.sid]
        if victim.parent is not None:
            victim.parent.children -= 1
        self._stats["prefix_evictions"] += 1
        return self._hbm.free(victim.hbm_off, victim.cap_tokens * self.bytes_per_token)

    # ------------------------------------------------------------------ misc
    def _get(self, req_id: Hashable) -> _Request:
        try:
            return self._requests[req_id]
        except KeyError:
            raise KeyError(f"KV cache: request {req_id!r} is not admitted "
                           f"(never admitted, freed or preempted)") from None

    def _new_sid(self) -> int:
        self._next_sid += 1
        return self._next_sid - 1


def _has_coalesced_run(extents: list[tuple[int, int]], nbytes: int) -> bool:
    """Whether non-overlapping extents ``(offset, size)``, merged where adjacent, contain
    a run of at least ``nbytes`` bytes."""
    run = 0
    end = None
    for off, size in sorted(extents):
        run = run + size if off == end else size
        if run >= nbytes:
            return True
        end = off + size
    return False


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise AssertionError(f"KV cache invariant broken: {message}")
