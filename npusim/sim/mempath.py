"""HBM traffic over the mesh: a DMA task's transaction streams as NoC messages to the channels' routers.

Each HBM channel meets the mesh at a router (``hbm.attach``, see
:func:`npusim.arch.derived.hbm_attach_routers`). At the ``path`` and ``flit`` NoC fidelities a
``KIND_DMA`` task of core ``c`` becomes, besides the DRAM access timed by
:mod:`npusim.hw.memory.hbm`, one request stream and one response stream per attach router
``r`` its transactions map to (by the same address map as the memory model: channel =
``(addr / interleave) mod channels``; with ``attach: per_core`` the core's own channel;
random addresses spread evenly over the channels):

* **read**: requests ``c -> r``, one header-only packet (one flit) per *burst*; responses
  ``r -> c`` carrying the data, ``max(bursts, ceil(bytes / link width))`` flits (at the flit
  fidelity a read is not two streams: the DMA engine issues its requests burst by burst within its
  tags and each controller sends a burst's data when its request arrives, in arrival order, see
  :mod:`npusim.hw.noc.flit_engine`, "DMA reads");
* **write**: the data ``c -> r`` (same flit count as a read response), then one one-flit
  acknowledgement per burst ``r -> c`` (at the flit fidelity burst by burst within the tags, an
  acknowledgement sent when its burst's data arrives, as for reads).

A burst is what a DMA engine asks one channel for in one request (an AXI burst): a contiguous run
of addresses inside one interleave chunk (at most ``hbm.interleave_bytes``, never more than
``MAX_BURST_BYTES`` = 4 KB); scattered (random, strided) accesses are one burst per
``transaction_bytes`` transaction. The memory model still serves the burst transaction by
transaction (its tags, queues and DRAM timing are unchanged). Before bursts a request per 64 B
transaction was a full-width flit: the mesh carried as many request flits towards the edge as
data flits back, and on the ascend-910c-die preset the read requests alone saturated the edge
columns' links (``Simulator(memory_packets="transaction")`` keeps that model as an ablation;
``validation/path_noc_hbm.py``).

Streams towards the memory (read requests, write data) leave the mesh at the attach router's
*memory-controller port*, one lane (one flit a cycle) per channel attached there, not at the
core's own ejection port (``Simulator(memory_port_lanes=...)``: ``k`` lanes per router, or ``0``,
the core's port, the model before: an ablation). Responses leave at the core's ejection port.
Both NoC fidelities model the port: the path model as a link with ``k`` lanes
(:func:`npusim.hw.noc.path.memory_port`), the flit model as an always-accepting sink taking up
to ``k`` flits a cycle from distinct input ports (:mod:`npusim.hw.noc.flit`, "Memory ports").
Responses (read data, write acknowledgements: the stream ``r -> core``, started by
:func:`mem_start`) enter the mesh on the memory's behalf, not through the
core's network interface: the flit model injects them through the attach router's ``k`` memory
injection lanes (the same ``k``; up to ``k`` flits a cycle of ``k`` distinct packets, each lane
competing in switch allocation and holding VCs and credits like an input port; the core's NI
stays its own); the path model does not limit injection at all. ``memory_port_lanes=0`` turns
both sides off: the flit model then ejects requests and injects responses at the attach router's
core ports, its NI a flit a cycle shared with the core there (the model before,
``validation/path_noc_hbm.py --flit``).

Each stream is one message of the NoC model (a *part* of the DMA task: it holds no queue), so
it contends for links and ejection ports with every other message — collectives, KV transfers,
other cores' memory streams. A core that hosts its channel's router still crosses that router
(zero mesh hops: the ejection port only).

Timing (a pipeline approximation, documented rather than hidden): the streams start when the
DMA task starts, alongside the DRAM access, and the task ends when the DRAM has served every
transaction and every stream's tail has arrived — plus, after the DRAM's last transaction, the
zero-load time the last response header needs to cross the mesh back to the core
(``(H + 1) S + H L``, ``H`` the hops from the farthest router used). So the slower of the DRAM
and the mesh paces a transfer; what is left out is back-pressure from the mesh into the
controller (a congested path does not slow the DRAM's service of other initiators) and a
write's data arriving at the controller before the DRAM writes it. At the flit fidelity the mesh side is a closed
loop (requests within the DMA engine's tags, data sent as requests arrive,
:mod:`npusim.hw.noc.flit_engine`), but the controller sends a burst's data the cycle its request
arrives: the DRAM's access time is not in that loop (the memory model applies the same tags to its
own latency separately), so a read takes the slower of the two loops, not their sum.

Stream model at the path fidelity (``Simulator(memory_streams=...)``): ``flow`` (default since session 64,
``DEFAULT_STREAMS``) carries each DMA's traffic as one max-min fair flow with the routers' head-of-line coupling
(:mod:`npusim.hw.noc.memflow`); the serving loop's default is its held variant ``SERVING_STREAMS``
(:func:`parse_streams`). The old streams stay as options, for comparison: ``reserve`` —
a stream's header claims the free links ahead of it in one go, at the time it would reach each,
at most 8 hops' time ahead, and moves hop by hop only where it must wait on a mesh link
(:func:`npusim.hw.noc.path.path_reserve_part`); the DMA's streams that reserved their whole path
end in one event. ``hop`` — every stream's header moves hop by hop (an event per hop). Reserve
costs ~40% fewer events on Qwen3-4B iterations and stays within 0.8% of hop
(``validation/memory_stream_model.py``).

At the ``analytical`` NoC fidelity the same streams (same routers, bytes and flits) reserve the
links of their routes and their ports first come, first served, each link on its own, without
events (:mod:`npusim.hw.noc.linkbound`): the mesh bounds the memory traffic's bandwidth (no link
above its peak) at a pass over each route per stream; the DMA's streams end together in one
event. A simulator built with ``memory_over_noc=False`` keeps the shortcut (DMA tasks go straight
to the memory model, no mesh traffic: what the analytical NoC did before issue 42; ``npusim mem``
measures the memory device alone that way).

Counters: ``C_BYTES`` is the DMA data bytes that crossed the mesh (``hbm_bytes_over_noc``);
``C_PARTS`` the stream messages started.
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.hw.memory.hbm import PATTERN_LINEAR, PATTERN_RANDOM
from npusim.hw.noc.flit_engine import flit_read_add, flit_read_go
from npusim.engine.eventlist import event_push
from npusim.hw.noc.memflow import memflow_add, memflow_go, new_memflows
from npusim.hw.noc.linkbound import reserve_route
from npusim.hw.noc.path import (EV_NOC_PART_END, MODE_ANALYTICAL, MODE_FLIT, MODE_PATH, PRM_MODE, memory_port,
                                path_reserve_part, path_start_part)

MemPath = namedtuple("MemPath", ["prm", "attach", "routers", "pending", "task", "tail", "r_bytes", "r_pkt",
                                 "hops", "counters", "fl"])
(MP_ON, MP_CHANNELS, MP_INTERLEAVE, MP_PRIVATE, MP_ENGINES, MP_TXN, MP_WIDTH, MP_S, MP_L,
 MP_NEED_SLOTS, MP_NROUTERS, MP_RESERVE, MP_MEMPORT, MP_BURST) = range(14)
MAX_BURST_BYTES = 4096  # a burst never crosses a 4 KB boundary (AXI's rule): the longest packet of a DMA
STREAM_MODELS = ("flow", "reserve", "hop")
STREAM_VARIANTS = "flow@CYCLES, flow~CYCLES or flow@CYCLES~CYCLES"  # the flows' speed variants (parse_streams)
#: the path fidelity's default stream model (session 64; before, ``reserve``): the flows are within 6.6% of flit on
#: every row of ``validation/memory_flows_vs_flit.py`` against the streams' 22.5% (the decode step +2.7% against
#: -12.7%), at the same CPU on a chip's operators and forward passes (docs/FIDELITY.md, "The flows the default")
DEFAULT_STREAMS = "flow"
#: the serving loop's default at the path fidelity: the flows with a head-of-line pass held 16,384 cycles and a
#: sharing kept 256 (a drained flow's rate held that long for its engine's next DMA). On 100 uncached Mooncake
#: requests within 0.2% of the exact flows on makespan, TTFT and TPOT over four draws of the arrivals, a fifth of
#: their CPU (sessions 62-63); on one iteration within 1%. Not for runs shorter than the hold (an operator of
#: 20,000-70,000 cycles moves up to +5%: ``DEFAULT_STREAMS`` there).
SERVING_STREAMS = "flow@16384~256"
STREAM_FLOW, STREAM_RESERVE, STREAM_HOP = 2, 1, 0  # prm[MP_RESERVE]
PACKET_MODELS = ("burst", "transaction")  # a DMA's requests: one per burst (default) or per transaction  # path fidelity: streams reserve their path at once, or move hop by hop
C_BYTES, C_PARTS, C_DMAS = 0, 1, 2


def parse_streams(spec: str) -> tuple[str, int | None, int | None]:
    """A ``memory_streams`` value -> (the stream model, cycles a head-of-line pass is held, cycles a sharing is
    kept): one of ``STREAM_MODELS``, or the flows' speed variants ``flow@Q`` (a pass held ``Q`` cycles,
    ``memflow.HOL_PERIOD``), ``flow~S`` (a sharing kept ``S`` cycles, ``memflow.SHARE_PERIOD``) and ``flow@Q~S``;
    ``None`` where the spec gives none (the module's default). Raises ``ValueError`` saying what is expected."""
    head, tilde, share = spec.partition("~")
    model, at, hold = head.partition("@")
    if (model not in STREAM_MODELS or ((at or tilde) and model != "flow") or (at and not hold.isdigit())
            or (tilde and not share.isdigit())):
        raise ValueError(f"memory stream model '{spec}': expected one of {', '.join(STREAM_MODELS)}, or {STREAM_VARIANTS} "
                         "(the flows with a head-of-line pass held, and a sharing kept, that many cycles)")
    return model, int(hold) if at else None, int(share) if tilde else None


def new_mempath(attach: np.ndarray, hops: np.ndarray, on: bool, channels: int, interleave: int, private: bool,
                dma_engines: int, txn_bytes: int, link_bytes: int, router_stages: int, link_latency: int,
                num_initiators: int, streams: str = DEFAULT_STREAMS, memory_ports: bool = True,
                packets: str = "burst", n_links: int = 0, memory_lanes=None, max_outstanding: int = 16) -> MemPath:
    """State for ``num_initiators`` DMA engines; ``attach[ch]`` = router of channel ``ch``;
    ``hops[a, b]`` = mesh hops from router ``a`` to ``b``; ``streams``: the path fidelity's
    stream model (``flow``, ``reserve`` or ``hop``, see the module docstring, or a variant of the flows,
    :func:`parse_streams`; ``flow`` needs
    ``n_links`` (mesh links), ``memory_lanes`` (per router) and the DMA engines' ``max_outstanding``
    transactions); ``memory_ports``: streams
    towards the memory eject at the router's memory-controller port (else at the core's port);
    ``packets``: ``burst`` (one request per contiguous run of a channel, see the module docstring)
    or ``transaction`` (one per ``txn_bytes`` transaction: the model before bursts, an ablation)."""
    if packets not in PACKET_MODELS:
        raise ValueError(f"memory packets '{packets}': expected one of {PACKET_MODELS}")
    streams, hol_period, share_period = parse_streams(streams)
    attach = np.asarray(attach, np.int64)
    routers = np.unique(attach)
    n_routers = int(hops.shape[0])
    prm = np.array([int(on), channels, interleave, int(private), dma_engines, txn_bytes, link_bytes,
                    router_stages, link_latency, 2 * (1 if private else len(routers)) + 1, n_routers,
                    {"flow": STREAM_FLOW, "reserve": STREAM_RESERVE, "hop": STREAM_HOP}[streams], int(memory_ports),
                    min(interleave, MAX_BURST_BYTES) if packets == "burst" else txn_bytes], np.int64)
    if streams == "flow" and on:
        lanes = np.ones(n_routers, np.int64) if memory_lanes is None else np.asarray(memory_lanes, np.int64)
        fl = new_memflows(n_links, n_routers, num_initiators, router_stages, link_latency, lanes,
                          max_outstanding, txn_bytes, hol_period=hol_period, share_period=share_period)
    else:  # a tiny stand-in (the state is typed the same way)
        fl = new_memflows(1, 1, 1, router_stages, link_latency, np.ones(1, np.int64), max_outstanding, txn_bytes,
                          memo=False)
    return MemPath(prm=prm, attach=attach, routers=routers, pending=np.zeros(num_initiators, np.int64),
                   task=np.full(num_initiators, -1, np.int64), tail=np.zeros(num_initiators, np.int64),
                   r_bytes=np.zeros(n_routers, np.int64), r_pkt=np.zeros(n_routers, np.int64),
                   hops=np.asarray(hops, np.int64), counters=np.zeros(4, np.int64), fl=fl)


@njit(cache=True, _nrt=False, inline="always")
def _add(mp, ch, nbytes, npkt):
    r = mp.attach[ch]
    mp.r_bytes[r] += nbytes
    mp.r_pkt[r] += npkt


@njit(cache=True, _nrt=False, inline="always")
def _split_over_routers(mp, core, nbytes, addr, pattern, stride):
    """Bytes and packets (requests) of the DMA per attach router (into ``r_bytes``/``r_pkt``): a
    contiguous run of addresses on one channel is one burst of at most ``MP_BURST`` bytes (linear
    and private; the interleave chunk caps it), scattered accesses one packet each."""
    p = mp.prm
    txn = p[MP_TXN]
    bl = p[MP_BURST]
    il = p[MP_INTERLEAVE]
    n_ch = p[MP_CHANNELS]
    if p[MP_PRIVATE] != 0:
        mp.r_bytes[core] += nbytes
        mp.r_pkt[core] += (nbytes + bl - 1) // bl
        return
    if pattern == PATTERN_RANDOM:
        base, extra = nbytes // n_ch, nbytes % n_ch
        for ch in range(n_ch):
            b = base + (1 if ch < extra else 0)
            if b > 0:
                _add(mp, ch, b, (b + txn - 1) // txn)
        return
    if pattern != PATTERN_LINEAR:  # strided: transaction by transaction, as the memory model walks them
        off = 0
        i = 0
        while off < nbytes:
            a = addr + i * stride
            size = min(txn, nbytes - off, il - a % il)
            _add(mp, (a // il) % n_ch, size, 1)
            off += size
            i += 1
        return
    end = addr + nbytes
    a = addr
    # the head chunk, up to the first interleave boundary
    first = min(end, (a // il + 1) * il)
    _add(mp, (a // il) % n_ch, first - a, (first - a + bl - 1) // bl)
    if first >= end:
        return
    j0 = first // il
    j1 = end // il  # full chunks j0 .. j1 - 1, then a tail chunk
    full = j1 - j0
    if full > 0:
        per, extra = full // n_ch, full % n_ch
        per_pkt = (il + bl - 1) // bl
        for i in range(min(n_ch, full)):
            ch = (j0 + i) % n_ch
            cnt = per + (1 if i < extra else 0)
            _add(mp, ch, cnt * il, cnt * per_pkt)
    tail = end - j1 * il
    if tail > 0:
        _add(mp, j1 % n_ch, tail, (tail + bl - 1) // bl)


@njit(cache=True, _nrt=False, inline="always")
def mem_start(mp, noc, fnoc, heap, hs, init, task, nbytes, addr, is_write, pattern, stride, now):
    """Start the mesh streams of initiator ``init``'s DMA task; returns how many started (0:
    the DMA goes to the memory model alone). The task then has ``parts + 1`` parts pending
    (the streams and the DRAM access)."""
    p = mp.prm
    if p[MP_ON] == 0 or nbytes <= 0:
        return 0
    core = init // p[MP_ENGINES]
    _split_over_routers(mp, core, nbytes, addr, pattern, stride)
    w = p[MP_WIDTH]
    S, L = p[MP_S], p[MP_L]
    flit_mode = noc.prm[PRM_MODE] == MODE_FLIT
    analytical = noc.prm[PRM_MODE] == MODE_ANALYTICAL  # links reserved first come, first served (linkbound)
    reserve = p[MP_RESERVE] == STREAM_RESERVE and noc.prm[PRM_MODE] == MODE_PATH
    flow = p[MP_RESERVE] == STREAM_FLOW and noc.prm[PRM_MODE] == MODE_PATH
    parts = 0
    bursts = 0
    streams = 0
    tail = 0
    last = -1  # the latest tail of the streams that reserved their whole path
    for r in range(p[MP_NROUTERS]):
        b = mp.r_bytes[r]
        if b == 0:
            continue
        n = mp.r_pkt[r]
        data_flits = max(n, (b + w - 1) // w)
        out_flits, back_flits = (data_flits, n) if is_write else (n, data_flits)
        if flit_mode:
            # bursts paced by the DMA engine's tags, what comes back sent in the order they
            # arrive (flit_engine: "DMA reads"); one part for all its routers, counted below
            flit_read_add(fnoc, init, r, n, out_flits, back_flits)
        elif analytical:
            port = memory_port(noc, r) if p[MP_MEMPORT] != 0 else noc.n_links + r
            last = max(last, reserve_route(noc, core, r, out_flits, now, port),
                       reserve_route(noc, r, core, back_flits, now, noc.n_links + core))
        elif flow:  # one flow for all its routers (npusim.hw.noc.memflow), started below
            memflow_add(mp.fl, init, r, n, out_flits, back_flits, p[MP_MEMPORT])
            bursts += n
        elif reserve:
            port = memory_port(noc, r) if p[MP_MEMPORT] != 0 else noc.n_links + r
            t_out = path_reserve_part(noc, heap, hs, init, core, r, out_flits, now, port)
            t_back = path_reserve_part(noc, heap, hs, init, r, core, back_flits, now, noc.n_links + core)
            parts += (t_out < 0) + (t_back < 0)
            last = max(last, t_out, t_back)
        else:
            port = memory_port(noc, r) if p[MP_MEMPORT] != 0 else noc.n_links + r
            path_start_part(noc, heap, hs, init, core, r, out_flits, now, port)
            path_start_part(noc, heap, hs, init, r, core, back_flits, now, noc.n_links + core)
            parts += 2
        streams += 2
        h = mp.hops[r, core]
        tail = max(tail, (h + 1) * S + h * L)
        mp.counters[C_BYTES] += b
        mp.r_bytes[r] = 0
        mp.r_pkt[r] = 0
    if flit_mode and streams > 0:
        flit_read_go(fnoc, heap, hs, init, core, nbytes, now, 1 if p[MP_MEMPORT] != 0 else 0)
        parts += 1
    if flow and streams > 0:
        memflow_go(mp.fl, noc, heap, hs, init, core, nbytes, bursts, p[MP_MEMPORT], now)
        parts += 1
    if last >= 0:  # the reserved streams (or the analytical NoC's) end together: one part, one event
        event_push(heap, hs, last, EV_NOC_PART_END, init)
        parts += 1
    mp.counters[C_PARTS] += streams
    mp.counters[C_DMAS] += 1
    mp.pending[init] = parts + 1
    mp.task[init] = task
    mp.tail[init] = tail
    return parts


@njit(cache=True, _nrt=False, inline="always")
def mem_part_done(mp, init):
    """One part of ``init``'s DMA task ended; returns the task if it was the last, else -1."""
    mp.pending[init] -= 1
    if mp.pending[init] > 0:
        return -1
    task = mp.task[init]
    mp.task[init] = -1
    return task


__all__ = ["C_BYTES", "C_DMAS", "C_PARTS", "MAX_BURST_BYTES", "PACKET_MODELS", "STREAM_MODELS", "STREAM_VARIANTS",
           "parse_streams", "MemPath", "mem_part_done", "mem_start", "new_mempath"]
