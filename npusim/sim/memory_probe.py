"""Measure what the HBM model delivers: bandwidth and latency under access patterns.

``stream``: one linear sweep of the address range shared by the initiators (DMA
engines of all cores): initiator ``i`` of ``n`` reads transactions ``i, i+n, i+2n, ...``,
so together they walk the channels in address order, as a well-laid-out weight
load does; ``random``: random requests of ``request_bytes`` (default: the DMA
``transaction_bytes``), each at a random request-aligned address; ``strided``: each
initiator reads transaction-sized chunks ``stride`` bytes apart in a region of its own
(a stride that is a multiple of ``channels x interleave`` puts every request on one
channel).

Random request size (``request_bytes``, bytes, a power of two): a request of up to
``interleave_bytes`` is issued as one transaction of that size (the DMA transaction size
is set to it for the run), so it lands on one pseudo-channel, one bank and one row: one
row activation (ACT) per request. A larger request is split at the channel interleave,
one ``interleave_bytes`` transaction (one ACT) per chunk, the chunks on consecutive
channels. Random HBM reads are activation-bound (one ACT per ``max(tRRD_S, tFAW/4)`` per
pseudo-channel, :mod:`npusim.hw.memory.bounds`), so the fraction of peak they reach
scales with the bytes moved per ACT: about ``bursts per request x burst time /
max(tRRD_S, tFAW/4)`` up to the data bus. Cycle-accurate DRAM simulators' "random"
traffic is one access-granularity request per ACT (Ramulator2 HBM2/HBM3: 32 B,
``channel_width x prefetch / 8``; DRAMsim3's 128-bit HBM2 channel: 64 B); compare like
with like (``validation/hbm_random_request_size.py``).

Passes (``repeat``): the pattern runs ``repeat`` times, each initiator's pass after its previous
one, over the same addresses (``random`` draws new ones each pass); ``bytes`` is per pass. On a
chip with an L2 at the TLM fidelity the later passes of a region that fits the L2 hit there
(``l2_hit_rate``: of all the bytes read, what the L2 served; ``None`` without a TLM L2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from npusim.arch.schema import Arch
from npusim.choices import MEMORY_PATTERNS
from npusim.errors import ConfigError
from npusim.hw.memory.bounds import bandwidth_bound
from npusim.hw.memory.hbm import PATTERN_LINEAR, PATTERN_RANDOM, PATTERN_STRIDED
from npusim.hw.memory.params import LAT_BINS, P_LAT_BIN_PS, unloaded_read_latency_ps
from npusim.sim.simulator import Simulator

PATTERNS = dict(zip(MEMORY_PATTERNS, (PATTERN_LINEAR, PATTERN_RANDOM, PATTERN_STRIDED), strict=True))


@dataclass(frozen=True)
class MemoryReport:
    pattern: str
    mode: str
    write: bool
    bytes: int
    initiators: int
    cycles: int
    time_ns: float
    bandwidth_gbps: float
    peak_bandwidth_gbps: float
    efficiency: float  # HBM traffic over the peak (with L2 hits, bandwidth_gbps counts them too)
    bound_gbps: float | None  # analytical DRAM bound for the pattern (npusim.hw.memory.bounds); None: strided
    bound_limit: str | None  # the term that sets it: data_bus, act_rate or row_cycle
    bound_terms_gbps: dict | None
    request_bytes: int | None  # random: bytes per random request; None for the other patterns
    latency_ns_mean: float | None
    latency_ns_p99: float | None  # None: no request, or beyond latency_ns_hist_max
    latency_ns_hist_max: float  # the latency histogram's range; a p99 above it is reported as None
    unloaded_latency_ns: float
    row_hit_rate: float | None
    per_channel: list[dict]
    checks: dict
    repeat: int = 1  # passes over the pattern (bytes is one pass; bandwidth_gbps counts all of them)
    l2_hit_rate: float | None = None  # of the bytes read, the TLM L2's hits (None: no TLM L2)
    l2_hit_bytes: int | None = None
    l2_read_bytes: int | None = None  # bytes read through the L2: its hits + its misses

    def to_dict(self) -> dict:
        return asdict(self)


def _percentile_from_hist(hist: np.ndarray, q: float, bin_ns: float) -> float | None:
    total = hist.sum()
    if total == 0:
        return None
    idx = int(np.searchsorted(np.cumsum(hist), q * total))
    return (idx + 1) * bin_ns if idx < LAT_BINS else None  # beyond the histogram: latency_ns_hist_max


def random_request_arch(arch: Arch, request_bytes: int) -> Arch:
    """``arch`` with its DMA transaction size set for random requests of ``request_bytes``:
    ``min(request_bytes, interleave_bytes)`` (see the module docstring)."""
    if request_bytes < 8 or request_bytes & (request_bytes - 1):
        raise ConfigError(f"request_bytes must be a power of two >= 8, got {request_bytes}")
    txn = min(request_bytes, arch.hbm.interleave_bytes)
    if arch.hbm.interleave_bytes % txn:
        raise ConfigError(f"request_bytes {request_bytes}: hbm.interleave_bytes {arch.hbm.interleave_bytes} "
                          f"is not a multiple of {txn}")
    if txn == arch.cores.dma.transaction_bytes:
        return arch
    from npusim.arch.schema import merge_arch_data
    return Arch.model_validate(merge_arch_data(arch.model_dump(), {"cores": {"dma": {"transaction_bytes": txn}}}))


def measure_memory(arch: Arch, pattern: str = "stream", nbytes: int = 64 << 20, mode: str = "tlm",
                   initiators: int | None = None, write: bool = False, stride: int = 4096,
                   request_bytes: int | None = None, repeat: int = 1) -> MemoryReport:
    """Run ``pattern`` over ``nbytes`` (bytes) through ``initiators`` DMA engines (default all) and
    report bandwidth (GB/s), latency (ns) and the DRAM bound. ``request_bytes``: size of a random
    request (``random`` only; default the arch's DMA transaction size). ``repeat``: passes over
    the same addresses (see the module docstring)."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ConfigError(f"repeat must be a positive integer, got {repeat!r}")
    if pattern not in PATTERNS:
        raise ConfigError(f"pattern '{pattern}': expected one of {sorted(PATTERNS)}")
    if nbytes <= 0:
        raise ConfigError(f"--bytes must be positive, got {nbytes}")
    if request_bytes is not None and pattern != "random":
        raise ConfigError("request_bytes applies to the random pattern only")
    if pattern == "random":
        request_bytes = request_bytes or arch.cores.dma.transaction_bytes
        arch = random_request_arch(arch, request_bytes)
    sim = Simulator(arch, memory_mode=mode, memory_over_noc=False)  # the memory device alone
    max_init = arch.num_cores * sim.dma_engines
    n_init = max_init if initiators is None else initiators
    if not 1 <= n_init <= max_init:
        raise ConfigError(f"initiators must be in 1..{max_init} (cores x DMA engines), got {n_init}")
    txn = arch.cores.dma.transaction_bytes
    unit = max(txn, request_bytes or 0)  # an initiator's share: whole transactions (random: requests)
    share = -(-nbytes // n_init)
    share = -(-share // unit) * unit
    transfers = []  # one per initiator: (core, engine, address, pattern code, step, bytes)
    for i in range(n_init):
        if pattern == "stream":
            address, code, step = i * txn, PATTERN_STRIDED, n_init * txn
        elif pattern == "strided":  # disjoint strided regions, one per initiator
            address, code, step = i * (share // txn) * stride, PATTERN_STRIDED, stride
        else:  # random: blocks of request_bytes (one transaction each up to the interleave)
            address, code, step = i * share, PATTERNS[pattern], request_bytes
        size = min(share, nbytes - i * share)
        if size <= 0:
            break
        transfers.append((*divmod(i, sim.dma_engines), address, code, step, size))
    last = [-1] * len(transfers)
    for rep in range(repeat):  # each initiator's pass after its previous one
        for i, (core, eng, address, code, step, size) in enumerate(transfers):
            last[i] = sim.add_dma(core, size, address=address, write=write, dma_engine=eng, pattern=code,
                                  stride=step, deps=[last[i]] if rep else (), name=f"{pattern}{i}")
    sim.run()
    cycles = sim.makespan()
    time_ns = cycles / arch.clock_ghz
    mem = sim.mem
    bin_ns = mem.p[P_LAT_BIN_PS] / 1000.0
    peak = arch.hbm.total_bandwidth_gbps
    per_channel = []
    lat_mean = lat_p99 = hit_rate = None
    per_ch_bw = mem.ch_bytes / time_ns if time_ns else mem.ch_bytes * 0.0
    for ch in range(arch.hbm.channels):
        n = int(mem.ch_nreq[ch])
        per_channel.append({
            "channel": ch,
            "bytes": int(mem.ch_bytes[ch]),
            "bandwidth_gbps": float(per_ch_bw[ch]),
            "latency_ns_mean": float(mem.ch_lat_sum[ch] / n / 1000.0) if n else None,
            "latency_ns_p99": _percentile_from_hist(mem.ch_lat_hist[ch], 0.99, bin_ns),
            "row_hits": int(mem.ch_rowstat[ch, 0]),
            "row_misses": int(mem.ch_rowstat[ch, 1]),
            "row_conflicts": int(mem.ch_rowstat[ch, 2]),
        })
    if mode == "tlm":
        nreq = int(mem.ch_nreq.sum())
        lat_mean = float(mem.ch_lat_sum.sum() / nreq / 1000.0) if nreq else None
        lat_p99 = _percentile_from_hist(mem.ch_lat_hist.sum(axis=0), 0.99, bin_ns)
        accesses = int(mem.ch_rowstat.sum())
        hit_rate = float(mem.ch_rowstat[:, 0].sum() / accesses) if accesses else None
    bw = repeat * nbytes / time_ns if time_ns else 0.0
    l2 = sim.l2_stats()
    # efficiency is HBM's: with L2 hits, bw also counts what the L2 served
    hbm_bw = float(mem.ch_bytes.sum()) / time_ns if l2 is not None and l2["hit_bytes"] and time_ns else bw
    bound = bandwidth_bound(mem.p, mem.u_burst_ps, mem.u_tccd_ps, pattern, write, duration_ps=time_ns * 1000.0)
    return MemoryReport(
        pattern=pattern, mode=mode, write=write, bytes=nbytes, initiators=n_init, cycles=cycles, time_ns=time_ns,
        bandwidth_gbps=bw, peak_bandwidth_gbps=peak, efficiency=hbm_bw / peak,
        bound_gbps=bound["bound_gbps"] if bound else None, bound_limit=bound["limit"] if bound else None,
        bound_terms_gbps=bound["terms_gbps"] if bound else None, request_bytes=request_bytes,
        latency_ns_mean=lat_mean, latency_ns_p99=lat_p99, latency_ns_hist_max=LAT_BINS * bin_ns,
        unloaded_latency_ns=unloaded_read_latency_ps(mem.p, "conflict") / 1000.0,
        row_hit_rate=hit_rate, per_channel=per_channel, checks=sim.memory_checks(), repeat=repeat,
        l2_hit_rate=None if l2 is None or not l2["read_bytes"] else l2["hit_rate"],
        l2_hit_bytes=None if l2 is None else l2["hit_bytes"], l2_read_bytes=None if l2 is None else l2["read_bytes"],
    )
