"""The shared L2 cache between a chip's cores and its HBM: an analytical reuse model.

A kernel that knows its own loop order describes each group of *re-reads* (bytes a core loads
that some core of the chip loaded before) by the **reuse distance** of the group: how many
distinct bytes the whole chip loads between the first read and the re-read. Under LRU
replacement a re-read hits exactly when that distance is within the cache's capacity (the stack
distance property of LRU, Mattson et al., "Evaluation techniques for storage hierarchies", IBM
Systems Journal 9(2), 1970); first touches always miss. Hits cost no HBM bandwidth.

Assumptions: a fully associative LRU cache (set conflicts, write allocation and the vendor's
replacement policy are not modelled); every byte the kernel writes goes to HBM and takes no L2
room. Rates: the L2's aggregate bandwidth (bytes per core cycle) is shared evenly by the cores
reading it, and no core reads faster than its per-core L2 rate (or its DMA ports). Units: bytes,
core clock cycles.

This is the L2 of the analytical memory fidelity (and of the planners, which need an estimate before
anything is simulated). At the TLM fidelity the memory model simulates the cache itself, transaction
by transaction (:mod:`npusim.hw.memory.hbm`, "L2"): set-associative, sliced, with merged fills;
``validation/l2_tlm_vs_reuse.py`` prints what this model costs in accuracy against it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from npusim.arch.schema import L2Cache

MIB = 2**20


@dataclass(frozen=True)
class Reread:
    """``nbytes`` loaded again, ``distance`` distinct bytes (chip-wide) after their first load."""

    nbytes: float
    distance: float


def hit_bytes(rereads: Iterable[Reread], capacity_bytes: float) -> float:
    """Bytes of ``rereads`` the cache serves (LRU: those within ``capacity_bytes`` of reuse)."""
    return sum(r.nbytes for r in rereads if r.distance <= capacity_bytes)


def capacity_bytes(l2: L2Cache) -> float:
    return l2.capacity_mb * MIB


def core_rate(l2: L2Cache, clock_ghz: float, readers: int, port_bytes_per_cycle: float, share: float = 1.0) -> float:
    """Bytes per core cycle one of ``readers`` cores reads from the L2: its even share of the
    aggregate bandwidth (of the fraction ``share`` of it, when other work on the chip takes the
    rest), at most the L2's per-core read rate (else its DMA ports' ``port_bytes_per_cycle``)."""
    aggregate = l2.bandwidth_gbps * share / clock_ghz  # bytes per core cycle, all readers
    per_core = port_bytes_per_cycle if l2.core_bytes_per_cycle is None else l2.core_bytes_per_cycle
    return min(per_core, aggregate / max(1, readers))


def hit_latency_cycles(l2: L2Cache, clock_ghz: float) -> int:
    """Cycles added once to each L2 transfer (0 when the arch gives no hit latency)."""
    return 0 if l2.hit_latency_ns is None else round(l2.hit_latency_ns * clock_ghz)
