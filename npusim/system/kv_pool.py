"""An EMS-style context caching pool: prompt KV blocks kept in the CPUs' DRAM, found by prefix hash.

The CloudMatrix384 paper's Elastic Memory Service keeps KV blocks of earlier prompts in the
disaggregated DRAM pool of the supernode's CPUs and serves them back over UB, so a prompt that
shares a prefix with an earlier one skips computing it. Here a block is ``block_tokens`` prompt
tokens named by the trace's ``hash_ids`` (Mooncake semantics: block ``i``'s hash covers the whole
prefix up to it, so a hit must be a *prefix* of the prompt's blocks).

* :meth:`KVPool.lookup` returns how many leading blocks of a prompt are held (and marks them
  recently used; :meth:`KVPool.held_prefix` asks without touching or counting);
* :meth:`KVPool.insert` stores a prompt's blocks after its prefill, evicting the least recently
  used blocks when the pool is full (``capacity_blocks``);
* each block lives in one CPU's DRAM: ``cpu_of(hash) = hash mod cpus`` (blocks spread evenly);
* counters: ``lookups``, ``hit_blocks``, ``inserted``, ``evicted`` — blocks are conserved:
  ``inserted - evicted == len(pool)``.
"""

from __future__ import annotations

from collections import OrderedDict


class KVPool:
    """LRU set of prompt KV blocks (see module docstring)."""

    def __init__(self, capacity_blocks: int, cpus: int):
        if capacity_blocks < 0 or cpus <= 0:
            raise ValueError("a caching pool needs capacity >= 0 blocks and at least one CPU")
        self.capacity_blocks = capacity_blocks
        self.cpus = cpus
        self._blocks: OrderedDict[int, None] = OrderedDict()
        self.lookups = self.hit_blocks = self.inserted = self.evicted = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def cpu_of(self, block_hash: int) -> int:
        return block_hash % self.cpus

    def held_prefix(self, hashes: tuple[int, ...]) -> int:
        """Leading blocks of ``hashes`` held by the pool (no side effect)."""
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            n += 1
        return n

    def lookup(self, hashes: tuple[int, ...]) -> int:
        """Leading blocks of ``hashes`` held by the pool (each marked most recently used)."""
        self.lookups += 1
        n = 0
        for h in hashes:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            n += 1
        self.hit_blocks += n
        return n

    def insert(self, hashes: tuple[int, ...]) -> list[int]:
        """Store ``hashes`` (those not held yet); returns the newly stored ones."""
        new = []
        for h in hashes:
            if h in self._blocks:
                self._blocks.move_to_end(h)
                continue
            if self.capacity_blocks == 0:
                break
            while len(self._blocks) >= self.capacity_blocks:
                self._blocks.popitem(last=False)
                self.evicted += 1
            self._blocks[h] = None
            self.inserted += 1
            new.append(h)
        return new
