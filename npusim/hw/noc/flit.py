"""Cycle-accurate, flit-level wormhole NoC model (state in numpy arrays, steps in Numba).

Model
-----
Every router has ``P = 5`` ports (local, N, E, S, W; see :mod:`.topology`), each with
``V`` virtual channels, and each VC a FIFO input buffer of ``B`` flits. Packets of ``F``
flits (head, body..., tail; a 1-flit packet is head and tail at once) are routed by a
table ``next_port[router, dest]`` (:mod:`.routing`). Units: everything is in router clock
cycles; one flit crosses one link per cycle (``flit_bytes = link width``).

Per cycle ``c`` (:func:`step`), in this order:

1. **Injection.** Each network interface (NI) takes the packet at the front of its
   source FIFO (unbounded in the model; ``source_queue_packets`` deep in the arrays, a
   full queue refuses new packets) and writes at most one flit into its router's local
   input port. A head flit claims a local-port VC (an empty one if any, else any with room,
   searched round-robin); later flits follow into the same VC while it has room. The
   local port's buffer state is visible to the NI without delay.
2. **Routers** (order-independent: nothing a router does is visible to another router
   in the same cycle). A flit written into an input buffer in cycle ``a`` is *ready* in
   cycle ``a + S`` (``S = router_stages``, the pipeline depth: route computation, VC and
   switch allocation, switch traversal). In its ready cycle or later:

   - *VC allocation* (head flits): look up the output port; claim a free VC of the
     downstream input port (the allowed VC class, see below), searching round-robin
     from a per-output pointer. A VC stays claimed until the packet's tail flit leaves
     (BookSim's ``wait_for_tail_credit = 0``: the next packet may share the downstream
     FIFO behind the tail). Each output serves the input ports (and memory injection
     lanes) asking for one of its VCs round-robin from a second per-output pointer, one
     VC a requester a cycle, so inputs that keep asking share its VCs evenly, as
     BookSim2's separable allocators' round-robin arbiters do. (Until session 55 the
     input ports claimed in their port order from a start that rotated by one each visit:
     two backlogged inputs of one saturated output got 0.8 / 0.2 or 0.4 / 0.6 of it by
     their port numbers. Session 55 drew the start and direction at each visit: fair
     between two ports, but with three or more the ports after the larger gaps in port
     order claimed first more often, 0.33 / 0.42 for the E / W inputs of one output, 0.18
     for an N input against 0.41 for E and the NI each; session 56 made it round-robin
     per output. ``tests/test_noc_link_saturation.py``.)
   - *Switch allocation*: separable input-first round-robin, one iteration, pointers
     advanced only on a grant (iSLIP-1-like): each input port picks one ready VC that
     holds a VC and a credit for it; each output port grants one requesting input.
   - *Switch and link traversal*: a granted flit leaves its buffer, a credit goes back
     upstream and becomes usable there in cycle ``c + link_latency``, and the flit is
     written into the downstream buffer arriving in cycle ``c + link_latency``
     (so it is ready there in ``c + link_latency + S``). The ejection port (local
     output) always accepts one flit per cycle: a flit granted to it is ejected in ``c``.

   Credits are the *ready* half and the link's flit the *valid* half of the
   valid/ready handshake between neighbours: a flit is only sent with a credit in hand,
   so a buffer never overflows and no flit is ever dropped.

Virtual-channel classes: on topologies with dateline links (ring, torus) the VCs are
split into two classes; a packet uses class 0 after injection and after each change of
dimension, and class 1 after crossing a dateline link, which makes dimension-order
routing deadlock-free there (needs ``vcs >= 2``). On a mesh all VCs form one class.

Memory ports
------------
A router may have a *memory-controller port* with ``k`` lanes (``make_state(memory_ports=...)``;
the engine gives each HBM attach router one lane per channel attached there, see
:mod:`npusim.sim.mempath`). A packet sent with :func:`send_packet_mem` (HBM read requests and
write data) leaves the network there instead of at the local ejection port: at its destination
its head is routed to the memory port, which, like the local port, needs no VC or credit and
always accepts, up to ``k`` flits a cycle from distinct input ports (each input port still sends
at most one flit a cycle; granted round-robin from a per-router pointer). So memory-bound and
core-bound traffic at an attach router do not share the one-flit-a-cycle local port. Routers
without lanes, and the BookSim2-compatible mode, eject such packets at the local port; with no
memory ports at all the model is the one before them, cycle for cycle (the
``Simulator(memory_port_lanes=0)`` ablation).

Symmetrically, what the memory sends back (read data, write acknowledgements) is injected by the
memory controller, not the core's NI: a packet sent with :func:`send_packet_from_mem` enters the
memory's own source queue at its source router, which ``k`` *memory injection lanes* serve (the
same ``k`` as the memory port's, at most ``MINJ_LANES_MAX`` = 15): a free lane takes the next
packet and sends its flits one a cycle, so up to ``k`` flits a cycle of ``k`` distinct packets
enter the router. A lane is an input of the router's switch like any input port: its head is
routed and asks for a downstream VC as a head at an input port does (none for a response to the
router's own core, which leaves at the local port), each flit needs a credit of that VC, and the
lanes compete with the input ports in VC and in switch allocation alike (an output serves one
requester at a time, round-robin over the input ports and then the lanes; until session 56 the
lanes asked for VCs only after every input port had, a leftover of the code's order, not a
choice). A lane's head is ready ``S`` cycles after the lane takes it, as a flit the NI writes
into the local input port is, so the zero-load latency is unchanged; a lane holds no buffer of
its own (its next flit is ready the cycle after the previous one left). Routers without lanes,
and the BookSim2-compatible mode, inject such packets through the NI; a router whose lanes are
idle arbitrates exactly as without them.

Zero-load latency (exact, tested)
---------------------------------
A packet of ``F`` flits travelling ``H`` hops on an otherwise empty network, with
router pipeline ``S`` and link latency ``L`` (all links equal), created in cycle ``t0``:
its head is injected in ``t0``, ejected in ``t0 + (H+1)*S + H*L``, and the tail follows
``F - 1`` cycles later, so::

    latency = (H + 1) * S + H * L + F - 1      [cycles, creation to tail ejection]

(network and packet latency coincide at zero load). It holds whenever buffers never run
out of credits mid-packet, i.e. ``F <= B`` or ``B >= S + 2L`` (the credit round trip of
a link is ``S + 2L`` cycles; of the local port ``S + 1``).

Parameter mapping to BookSim2 (``src/booksim_config.cpp`` defaults in brackets)
-------------------------------------------------------------------------------
=====================  ==============================================================
npusim                 BookSim2
=====================  ==============================================================
``vcs``                ``num_vcs`` [16]
``buffer_flits``       ``vc_buf_size`` [8] (``buffer_policy = private``)
``router_stages``      ``routing_delay + vc_alloc_delay + sw_alloc_delay +
                       st_prepare_delay + st_final_delay`` [1+1+1+0+1 = 4]
``link_latency``       channel latency (BookSim channels are 1-cycle FIFOs); credit
                       channels the same, ``credit_delay`` [0]
packet size            ``const_flits_per_packet`` [1]
rate (flits/node/cy)   ``injection_rate`` x ``packet_size`` (BookSim counts packets
                       unless ``injection_rate_uses_flits = 1``)
allocators             BookSim: ``vc_allocator = sw_allocator = islip``,
                       ``alloc_iters = 1``, round-robin arbiters. Here: switch
                       allocation separable input-first round-robin (iSLIP-1-like),
                       VC allocation round-robin over the requesting inputs per
                       output, one VC a requester a cycle
source queueing        ``include_queuing = 1`` [same]; ``uniform`` includes the source
                       itself as a destination [same]
=====================  ==============================================================

Differences from BookSim2's ``iq_router`` in the default mode: every flit (not just the
head) spends ``S`` cycles in a router; VC allocation grants in the cycle a head asks
(no iSLIP iterations) and switch allocation is input-first; injection and ejection channels add no latency (BookSim's add 1 and 2
cycles, see below); there is no speculation, output queue or internal speedup. Latency
agrees in structure (per-hop cost ``S + L``) but not to the cycle: on a 4x4 mesh with
BookSim's defaults (16 VCs x 8 flits), uniform 1-flit packets, the default mode gives
16.6-16.8 cycles at 0.05-0.25 flits/node/cycle where BookSim2 gives 19.7-20.1.

BookSim2-compatible mode (``booksim=True``; ``npusim noc --booksim-compatible``)
-------------------------------------------------------------------------------
Conventions read from BookSim2's source (``src/trafficmanager.cpp`` ``_Step``/``_Inject``/
``_RetireFlit``, ``src/channel.hpp``, ``src/routers/iq_router.cpp``,
``src/allocators/islip.cpp``, ``src/buffer_state.cpp``), each reproduced here:

- *Latency is counted from creation to the NI's read of the tail.* ``ctime`` is the cycle
  the Bernoulli trial succeeded (``include_queuing = 1``: source queueing included), the
  head can enter the injection channel in that cycle; ``atime`` is the cycle the
  destination reads the tail off the ejection channel. A BookSim channel of latency
  ``d`` delivers what was sent in cycle ``t`` to a reader in ``t + d + 1``; router to
  router this is part of the per-hop ``S + L``, but the injection channel adds one
  cycle before the first router and the ejection channel plus the read two after the
  last (``BOOKSIM_INJECTION_CYCLES``, ``BOOKSIM_EJECTION_CYCLES``). Zero-load latency
  becomes ``(H + 1) * S + H * L + F - 1 + 3`` (tested).
- *Pipeline.* A head takes route computation, VC allocation, switch allocation and
  switch traversal (``routing_delay + vc_alloc_delay + sw_alloc_delay + st_final_delay``
  = ``S``); body and tail flits only switch allocation and traversal (``min(S, 2)``
  cycles). A head that reaches its VC's front when the previous packet's tail leaves
  starts route computation in the next cycle (``_SWAllocUpdate`` sets the VC to
  ``routing``), so it traverses the switch ``S - 1`` cycles after that tail at the
  earliest.
- *Allocators.* VC and switch allocation are iSLIP with one iteration
  (``vc_allocator = sw_allocator = islip``, ``alloc_iters = 1``): every free output VC
  grants the first requesting input VC from its pointer, every input VC accepts the
  first grant from its own, pointers move only past an accepted grant; for the switch
  the same between input and output ports, each input port requesting every output one
  of its VCs can use (among its VCs for one output, round-robin). The ejection port's
  VCs are allocated like any other. An output VC is released at the tail's switch
  allocation (``wait_for_tail_credit = 0``) and claimable by a VC allocation two cycles
  later; a credit is usable upstream ``L + 1`` cycles after its flit left
  (``credit_delay = 0`` plus the credit channel and its read).
- *Injection.* The NI puts each new packet in the first local-port VC that is not full,
  trying them round-robin from the one after the last it used (``_last_vc``; ``_Step``'s
  "Find first available VC" loop: a VC is skipped if ``IsFullFor``, and at an NI none is
  held by another packet); it waits only when all are full. It sees the local port's
  credits one cycle after the router frees a slot, as BookSim's does.

Not reproduced: BookSim's random stream (Bernoulli trials and destinations draw from
npusim's generator, same distributions), its warm-up/convergence rule (npusim uses a
fixed warm-up and window; ``validation/noc_hotspot_booksim.py`` applies BookSim2's rule to
the flit model's figures), and the VC the switch allocator picks among several of one
input requesting the same output (BookSim: the earliest to become eligible, here
round-robin). Against BookSim2's figures, see ``validation/noc_booksim.py``.

Public interface for the event engine
-------------------------------------
``st = make_state(topo, routing, vcs, buffer_flits, router_stages, done_capacity=N)``;
then, from Python or from other Numba code: :func:`send_packet` (enqueue at a source
NI; :func:`send` is the checked Python wrapper; :func:`send_packet_mem` for the destination's
memory port, see "Memory ports"), :func:`step` (advance exactly one
cycle), :func:`run_cycles`, :func:`network_idle`; completions (tag and tail-ejection
cycle of each finished packet) are read with :func:`pop_completed`. ``step`` must be
called with consecutive cycles; a packet sent with creation cycle ``c`` can be injected
in the ``step(st, c)`` that follows. The kernels and the state layout are in
:mod:`npusim.hw.noc.flit_kernel`.
"""

from __future__ import annotations

import time

import numpy as np

from npusim.errors import ConfigError, DeadlockError
from npusim.hw.noc import flit_kernel as fk
from npusim.hw.noc.flit_kernel import (  # noqa: F401  (re-exported kernel API)
    FlitState,
    flits_in_network,
    network_idle,
    run_cycles,
    run_synthetic,
    send_packet,
    send_packet_from_mem,
    send_packet_mem,
    step,
)
from npusim.hw.noc.routing import Routing, build_routing
from npusim.hw.noc.topology import Topology, to_arrays
from npusim.hw.noc.traffic import (STREAM_BLOCK_CYCLES, NocParams, NocResult, SyntheticTraffic, make_pattern,
                                   mean_hops, packet_stream)

#: largest flit-model state allocated (the machines npusim targets have 24 GiB)
MAX_STATE_BYTES = 8 * 2**30
#: cycles without any flit moving, with flits in the network, that count as a deadlock
DEADLOCK_CYCLES = 10_000
#: backlog growth during the window above this fraction of the flits offered in it = saturation
BACKLOG_GROWTH_LIMIT = 0.05


def make_state(topo: Topology, routing: Routing, vcs: int, buffer_flits: int, router_stages: int,
               source_queue_packets: int = 256, done_capacity: int = 0, booksim: bool = False,
               memory_ports=None, reply_queues: bool = False) -> FlitState:
    """Allocate an empty network: all buffers empty, all credits available.

    ``vcs`` VCs per port (1..64), ``buffer_flits`` flits per VC buffer, ``router_stages``
    cycles of router pipeline (>= 1); link latencies come from the topology.
    ``source_queue_packets`` bounds each NI's queue (a full queue refuses new packets).
    ``done_capacity > 0`` records completed packets for :func:`pop_completed` (the event
    engine needs this; synthetic runs do not). ``booksim=True`` selects BookSim2's router
    and latency conventions (see "BookSim2-compatible mode" in the module docstring).
    ``memory_ports[r]``: lanes of router ``r``'s memory-controller port (see "Memory ports" in the
    module docstring; missing or 0: none, memory-bound packets eject at the local port).
    ``reply_queues``: every router gets the memory's source queue even without memory ports
    (synthetic request-reply traffic queues its replies there, see
    :func:`~npusim.hw.noc.flit_kernel.run_synthetic`).
    """
    R, P, V, B, S = topo.num_routers, topo.num_ports, int(vcs), int(buffer_flits), int(router_stages)
    if not 1 <= V <= 64:
        raise ConfigError(f"vcs must be in 1..64, got {vcs}")
    if B < 1:
        raise ConfigError(f"buffer_flits must be >= 1, got {buffer_flits}")
    if S < 1:
        raise ConfigError(f"router_stages must be >= 1, got {router_stages}")
    if source_queue_packets < 1:
        raise ConfigError(f"source_queue_packets must be >= 1, got {source_queue_packets}")
    ncls = 2 if topo.has_dateline else 1
    if V < ncls:
        raise ConfigError(f"the {topo.kind} topology needs >= 2 virtual channels (dateline classes), got {V}")
    if routing.topo is not topo:
        raise ConfigError("routing was built for a different topology")
    nvc = R * P * V
    mem_queues = memory_ports is not None or reply_queues
    # every live packet holds a buffer slot, a queue entry (the NI's or the memory's) or a lane
    max_pkt = R * P * V * B + R * (source_queue_packets + 1) + (R * (source_queue_packets + fk.MINJ_LANES_MAX)
                                                                 if mem_queues else 0)
    done_cap = max(1, int(done_capacity))
    need = 8 * (nvc * (fk.NVCF + B * fk.NSLF) + max_pkt * (fk.NPKF + 1) + R * (fk.NNDF + source_queue_packets
                                                                                + P * fk.NPTF))
    if need > MAX_STATE_BYTES:
        raise ConfigError(f"flit NoC: {R} routers x {P} ports x {V} VCs x {B}-flit buffers (source queues of "
                          f"{source_queue_packets} packets) need {need / 2**30:.1f} GiB of state; the limit is "
                          f"{MAX_STATE_BYTES / 2**30:.0f} GiB (fewer routers, VCs or buffer flits)")
    table, rt = routing.kernel_arrays()

    cfg = np.zeros(fk.NCFG, np.int64)
    if P >= fk.PORT_MEMC:
        raise ConfigError(f"flit NoC: routers of at most {fk.PORT_MEMC - 1} ports, got {P}")
    if booksim and P > 5:
        raise ConfigError(f"BookSim mode supports routers of at most 5 ports, got {P}")
    cfg[[fk.C_R, fk.C_P, fk.C_V, fk.C_B, fk.C_S, fk.C_NCLS, fk.C_SQ, fk.C_MAXPKT, fk.C_RECORD_DONE,
         fk.C_DONE_CAP, fk.C_BOOKSIM]] = (R, P, V, B, S, ncls, source_queue_packets, max_pkt, int(done_capacity > 0),
                                          done_cap, int(bool(booksim)))
    ctr = np.zeros(fk.NCTR, np.int64)
    ctr[fk.K_FREE_TOP] = max_pkt
    ctr[fk.K_LAST_CYCLE] = -1

    vc = np.zeros((nvc, fk.NVCF), np.int64)
    vc[:, fk.VC_OUTPORT] = vc[:, fk.VC_OUTVC] = -1
    vc[:, fk.OV_CREDITS] = B
    slot = np.zeros((nvc * B, fk.NSLF), np.int64)
    slot[:, fk.SL_PKT] = -1
    node = np.zeros((R, fk.NNDF), np.int64)
    node[:, fk.ND_NI_PKT] = node[:, fk.ND_NI_VC] = -1
    node[:, fk.ND_WAKE] = fk.NEVER
    if memory_ports is not None:
        node[:, fk.ND_MEM_LANES] = np.maximum(0, np.asarray(memory_ports, np.int64))
        node[:, fk.ND_MINJ_LANES] = np.minimum(node[:, fk.ND_MEM_LANES], fk.MINJ_LANES_MAX)
    lane = np.full((R * fk.MINJ_LANES_MAX if memory_ports is not None else 1, fk.NLNF), -1, np.int64)
    pkt = np.zeros((max_pkt, fk.NPKF), np.int64)
    pkt[:, fk.PK_SRC] = -1
    return FlitState(
        cfg=cfg, ctr=ctr, vc=vc, slot=slot, port=_port_table(topo), node=node,
        sq=np.full(R * source_queue_packets, -1, np.int64), pkt=pkt, free=np.arange(max_pkt, dtype=np.int64),
        next_port=table, done=np.zeros((done_cap, 2), np.int64),
        scr=np.zeros(2 * P * V, np.int64), rt=rt,
        msq=np.full(R * source_queue_packets if mem_queues else 1, -1, np.int64), lane=lane,
    )


def _port_table(topo: Topology) -> np.ndarray:
    """Per ``r * P + p``: downstream input port and latency of the output link, upstream
    output port and latency of the input link (-1 where there is no link)."""
    P = topo.num_ports
    port = np.zeros((topo.num_routers * P, fk.NPTF), np.int64)
    for col in (fk.PT_DOWN_IN, fk.PT_LINK, fk.PT_UP_OUT):
        port[:, col] = -1
    port[:, fk.PT_SREQ:fk.PT_SREQ + 5] = -1
    out_ip = topo.link_src * P + topo.link_src_port
    in_ip = topo.link_dst * P + topo.link_dst_port
    port[out_ip, fk.PT_DOWN_IN] = in_ip
    port[out_ip, fk.PT_LINK] = np.arange(topo.num_links)
    port[out_ip, fk.PT_LAT] = topo.link_latency_cycles
    port[out_ip, fk.PT_DATELINE] = topo.link_dateline
    port[in_ip, fk.PT_UP_OUT] = out_ip
    port[in_ip, fk.PT_UP_LAT] = topo.link_latency_cycles
    return port


#: BookSim mode: cycles the injection channel adds before the first router, and the
#: ejection channel plus the NI's read add after the last (see the module docstring)
BOOKSIM_INJECTION_CYCLES = 1
BOOKSIM_EJECTION_CYCLES = 2


def zero_load_latency_cycles(hops, packet_flits: int, router_stages: int, link_latency_cycles: int,
                             booksim: bool = False):
    """``(H + 1) * S + H * L + F - 1``: creation to tail ejection on an empty network;
    with ``booksim`` the injection and ejection channels add
    ``BOOKSIM_INJECTION_CYCLES + BOOKSIM_EJECTION_CYCLES`` (= 3)."""
    h = np.asarray(hops)
    extra = BOOKSIM_INJECTION_CYCLES + BOOKSIM_EJECTION_CYCLES if booksim else 0
    return (h + 1) * router_stages + h * link_latency_cycles + packet_flits - 1 + extra


# =====================================================================================
# Python-side helpers for callers of step()
# =====================================================================================

def send(st: FlitState, src: int, dst: int, nflits: int, cycle: int, tag: int) -> int:
    """Checked Python wrapper of :func:`send_packet`; returns the packet row.

    Raises ConfigError on bad arguments or a full source queue (enlarge
    ``source_queue_packets`` in :func:`make_state`).
    """
    n = int(st.cfg[fk.C_R])
    if not (0 <= src < n and 0 <= dst < n):
        raise ConfigError(f"send: src {src} / dst {dst} outside 0..{n - 1}")
    if nflits < 1:
        raise ConfigError(f"send: a packet needs >= 1 flit, got {nflits}")
    k = send_packet(st, src, dst, nflits, cycle, tag)
    if k < 0:
        raise ConfigError(f"send: source queue of node {src} is full ({int(st.cfg[fk.C_SQ])} packets)")
    return int(k)


def pop_completed(st: FlitState) -> tuple[np.ndarray, np.ndarray]:
    """Tags and tail-ejection cycles of the packets completed since the last call."""
    if st.ctr[fk.K_DONE_OVERFLOW]:
        raise DeadlockError("flit NoC: the completion buffer overflowed; pop completions more often "
                            "or raise done_capacity")
    n = int(st.ctr[fk.K_DONE_CNT])
    tags, times = st.done[:n, 0].copy(), st.done[:n, 1].copy()
    st.ctr[fk.K_DONE_CNT] = 0
    return tags, times


def memory_port_flits(st: FlitState) -> np.ndarray:
    """Flits ejected at each router's memory-controller port since :func:`make_state`."""
    return st.node[:, fk.ND_MEM_FLITS].copy()


def memory_injection_flits(st: FlitState) -> np.ndarray:
    """Flits injected by each router's memory injection lanes since :func:`make_state`."""
    return st.node[:, fk.ND_MINJ_FLITS].copy()


def link_flits(st: FlitState, topo: Topology) -> np.ndarray:
    """Flits sent on each link (by link id) since :func:`make_state`."""
    return st.port[topo.link_src * topo.num_ports + topo.link_src_port, fk.PT_FLITS].copy()


def conservation(st: FlitState) -> dict:
    """Flit, packet and credit accounting; ``ok`` is False if any flit or packet was lost,
    duplicated or misdelivered, or any credit lost or invented."""
    ctr, B = st.ctr, int(st.cfg[fk.C_B])
    in_buffers = int(st.vc[:, fk.VC_COUNT].sum())
    queued = int(st.node[:, fk.ND_SQ_CNT].sum())
    at_ni = int((st.node[:, fk.ND_NI_PKT] >= 0).sum())
    live = int(st.cfg[fk.C_MAXPKT] - ctr[fk.K_FREE_TOP])
    credits = st.vc[:, fk.OV_CREDITS]
    report = {
        "flits_created": int(ctr[fk.K_FLITS_CREATED]),
        "flits_injected": int(ctr[fk.K_FLITS_INJ]),
        "flits_ejected": int(ctr[fk.K_FLITS_EJ]),
        "flits_in_buffers": in_buffers,
        "packets_created": int(ctr[fk.K_PKTS_CREATED]),
        "packets_done": int(ctr[fk.K_PKTS_DONE]),
        "packets_live": live,
        "delivery_errors": int(ctr[fk.K_ERRORS]),
    }
    report["ok"] = bool(
        ctr[fk.K_FLITS_INJ] == ctr[fk.K_FLITS_EJ] + in_buffers
        and ctr[fk.K_PKTS_CREATED] == ctr[fk.K_PKTS_DONE] + live
        and live >= queued + at_ni
        and ctr[fk.K_ERRORS] == 0
        and np.all(credits >= 0)
        and np.all(credits + st.vc[:, fk.OV_CQ_CNT] + _downstream_occupancy(st) == B)
        # an idle network holds no VC (a VC left claimed would block its output forever)
        and (ctr[fk.K_PKTS_CREATED] != ctr[fk.K_PKTS_DONE] or not st.vc[:, fk.OV_BUSY].any())
    )
    return report


def _downstream_occupancy(st: FlitState) -> np.ndarray:
    """Per output VC: flits in the downstream buffer it feeds (B - credits where none)."""
    V, B = int(st.cfg[fk.C_V]), int(st.cfg[fk.C_B])
    down = st.port[:, fk.PT_DOWN_IN]
    occ = B - st.vc[:, fk.OV_CREDITS] - st.vc[:, fk.OV_CQ_CNT]  # identity where there is no link
    linked = np.nonzero(down >= 0)[0]
    src = (linked[:, None] * V + np.arange(V)).ravel()
    dst = (down[linked][:, None] * V + np.arange(V)).ravel()
    occ[src] = st.vc[dst, fk.VC_COUNT]
    return occ


# =====================================================================================
# Synthetic-traffic experiment (the "flit" fidelity)
# =====================================================================================

def saturated_throughput(params: NocParams, packet_flits: int, flows, cycles: int, warmup: int = 2000,
                         seed: int = 1, chunk: int = 8, backlog: int = 32):
    """Open-loop saturation micro-benchmark (``validation/noc_link_saturation.py``): every source
    of ``flows`` = ``[(src, [dst, ...]), ...]`` is kept backlogged (its queue topped up to
    ``backlog`` packets every ``chunk`` cycles, more than it can inject meanwhile), a source with
    several destinations drawing each packet's uniformly (``seed``); packets of ``packet_flits``
    flits. After ``warmup`` cycles, ``cycles`` are measured. Returns the flits a cycle sent on each
    output port (index ``router * num_ports + port``; the local port's ejections are not counted
    there) and the flits a cycle ejected in the whole network. Units: flits per router cycle (1.0 =
    a link's width)."""
    if packet_flits < 1 or cycles < 1 or warmup < 0 or chunk < 1 or backlog <= chunk:
        raise ConfigError(f"saturated_throughput: packet_flits >= 1, cycles >= 1, warmup >= 0 and backlog > "
                          f"chunk >= 1 (got {packet_flits}, {cycles}, {warmup}, {backlog}, {chunk})")
    topo = to_arrays(params.build_graph())
    for src, dsts in flows:  # checked before the state is built
        if not dsts or not all(0 <= int(x) < topo.num_routers for x in (src, *dsts)):
            raise ConfigError(f"saturated_throughput: bad flow ({src}, {dsts}) on {topo.num_routers} routers")
    st = make_state(topo, build_routing(topo, params.routing), params.vcs, params.buffer_flits,
                    params.router_stages, source_queue_packets=2 * backlog, booksim=params.booksim_compatible)
    rng = np.random.default_rng(seed)
    cycle, base, ej0, t0 = 0, None, 0, 0
    while base is None or cycle < t0 + cycles:
        for src, dsts in flows:
            while st.node[src, fk.ND_SQ_CNT] < backlog:
                d = dsts[0] if len(dsts) == 1 else dsts[int(rng.integers(len(dsts)))]
                send(st, int(src), int(d), packet_flits, cycle, 0)
        if base is None and cycle >= warmup:
            base, ej0, t0 = st.port[:, fk.PT_FLITS].copy(), int(st.ctr[fk.K_FLITS_EJ]), cycle
        cycle = run_cycles(st, cycle, chunk, False)
    n = float(cycle - t0)
    return (st.port[:, fk.PT_FLITS] - base) / n, (int(st.ctr[fk.K_FLITS_EJ]) - ej0) / n


def simulate_flit(params: NocParams, traffic: SyntheticTraffic) -> NocResult:
    """Run one synthetic-traffic experiment on the flit-level model.

    Saturation is declared (``saturated=True`` with a reason) when a source queue fills
    up (nodes then stop creating packets, so the window still measures what the network
    accepts), when the measured packets do not drain within ``drain_cycles_max``, or when
    the created-but-undelivered backlog grows during the window by more than 5 % of the
    flits offered in it plus ``2 * nodes * F`` flits of slack for fluctuations.
    Raises DeadlockError if the network stops moving.
    """
    topo = to_arrays(params.build_graph())
    routing = build_routing(topo, params.routing)
    pattern = make_pattern(traffic.pattern, topo, traffic.hotspot_nodes, traffic.hotspot_fraction)
    st = make_traffic_state(topo, routing, params, pattern, traffic)
    warm_up()
    t0 = time.perf_counter()
    out, port_window = run_traffic(st, pattern, traffic)
    wall = time.perf_counter() - t0
    check = conservation(st)
    if not check["ok"]:
        raise AssertionError(f"flit NoC lost or duplicated flits or credits (a bug): {check}")
    if out[fk.O_DEADLOCK]:
        raise DeadlockError(f"flit NoC: no flit moved for {DEADLOCK_CYCLES} cycles with "
                            f"{int(flits_in_network(st))} flits in the network "
                            f"({params.routing} routing on {params.label})")
    link_window = port_window[topo.link_src * topo.num_ports + topo.link_src_port]
    return _result(params, traffic, topo, routing, pattern, st, out, link_window, wall)


def make_traffic_state(topo: Topology, routing: Routing, params: NocParams, pattern, traffic: SyntheticTraffic):
    """A fresh network for a synthetic experiment: with ``traffic.memory_lanes`` memory ports of
    that many lanes at the pattern's hotspot nodes; request-reply traffic records completions
    (each arriving request makes a reply) and has reply queues at every router."""
    lanes = None
    if traffic.memory_lanes:
        lanes = np.zeros(topo.num_routers, np.int64)
        lanes[np.asarray(pattern.hot_nodes, np.int64)] = traffic.memory_lanes
    rr = traffic.reply_flits > 0
    return make_state(topo, routing, params.vcs, params.buffer_flits, params.router_stages,
                      traffic.source_queue_packets, done_capacity=topo.num_routers * (2 + fk.MINJ_LANES_MAX) if rr else 0,
                      booksim=params.booksim_compatible, memory_ports=lanes, reply_queues=rr)


def run_traffic(st: FlitState, pattern, traffic: SyntheticTraffic) -> tuple[np.ndarray, np.ndarray]:
    """Run a synthetic experiment (warm-up, window, drain) on a fresh state, fed block by
    block from :func:`npusim.hw.noc.traffic.packet_stream`; returns the kernel's summary
    array (``flit_kernel.O_*``) and flits per output port in the window. Request-reply
    traffic (``traffic.reply_flits``) needs a state from :func:`make_traffic_state`."""
    port_window = np.zeros(st.port.shape[0], np.int64)
    out = np.zeros(fk.NOUT, np.int64)
    # replies not yet due: at most one per request in flight (every live packet holds a row)
    cap = int(st.cfg[fk.C_MAXPKT]) if traffic.reply_flits else 1
    pend = np.zeros(fk.PD_ROWS + 4 * cap, np.int64)
    pend[fk.PD_CAP] = cap
    cycle = 0
    block = 4 * STREAM_BLOCK_CYCLES
    while not out[fk.O_FINISHED]:
        cyc, src, dst = packet_stream(traffic, pattern, cycle, cycle + block)
        cycle = run_synthetic(st, cyc, src, dst, traffic.packet_flits, cycle, cycle + block, traffic.warmup_cycles,
                              traffic.measure_cycles, traffic.drain_cycles, DEADLOCK_CYCLES, port_window, out,
                              traffic.reply_flits, pend)
    return out, port_window


_WARM = []


def warm_up() -> None:
    """Compile (or load from cache) the kernels once per process, so that reported
    simulation speeds exclude JIT time."""
    if _WARM:
        return
    topo = to_arrays(NocParams(2, 1).build_graph())
    st = make_state(topo, build_routing(topo, "xy"), 1, 1, 1, 1)
    run_traffic(st, make_pattern("uniform", topo), SyntheticTraffic(rate=0.5, warmup_cycles=1, measure_cycles=2))
    _WARM.append(True)


def _saturation_reason(traffic: SyntheticTraffic, n: int, out: np.ndarray) -> str:
    if out[fk.O_REFUSED]:
        return f"source queues filled up ({traffic.source_queue_packets} packets)"
    growth = int(out[fk.O_WIN_BACKLOG_END] - out[fk.O_WIN_BACKLOG_START])
    if growth > BACKLOG_GROWTH_LIMIT * out[fk.O_WIN_FLITS_CREATED] + 2 * n * traffic.packet_flits:
        return f"undelivered flits grew by {growth} during the measurement window"
    if not out[fk.O_DRAINED]:
        return f"measured packets did not drain within {traffic.drain_cycles} cycles"
    return ""


def _result(params, traffic, topo, routing, pattern, st, out, link_window, wall) -> NocResult:
    n, ctr = topo.num_routers, st.ctr
    window = n * traffic.measure_cycles
    done = int(ctr[fk.K_MEAS_DONE])

    def avg(key):
        return float(ctr[key]) / done if done else float("nan")

    t0 = zero_load_latency_cycles(mean_hops(pattern, routing), traffic.packet_flits, params.router_stages,
                                  params.link_latency_cycles, params.booksim_compatible)
    reason = _saturation_reason(traffic, n, out)
    return NocResult(
        fidelity="flit",
        topology=params.label,
        pattern=pattern.name,
        packet_flits=traffic.packet_flits,
        offered_flits_per_node_cycle=float(traffic.rate),
        generated_flits_per_node_cycle=float(out[fk.O_WIN_FLITS_CREATED]) / window,
        accepted_flits_per_node_cycle=float(out[fk.O_WIN_FLITS_EJ]) / window,
        avg_packet_latency_cycles=avg(fk.K_SUM_PKT_LAT),
        avg_network_latency_cycles=avg(fk.K_SUM_NET_LAT),
        max_packet_latency_cycles=float(ctr[fk.K_MAX_PKT_LAT]) if done else float("nan"),
        avg_hops=avg(fk.K_SUM_HOPS),
        zero_load_latency_cycles=float(t0),
        packets_measured=int(ctr[fk.K_MEAS_CREATED]),
        packets_delivered=done,
        saturated=bool(reason),
        saturation_reason=reason,
        cycles_simulated=int(out[fk.O_CYCLES]),
        wall_seconds=wall,
        link_utilization=link_window / float(traffic.measure_cycles),
        link_names=[topo.link_name(k) for k in range(topo.num_links)],
        params=dict(routers=n, vcs=params.vcs, buffer_flits=params.buffer_flits, router_stages=params.router_stages,
                    link_latency_cycles=params.link_latency_cycles, flit_bytes=params.flit_bytes,
                    routing=params.routing, booksim_compatible=params.booksim_compatible,
                    warmup_cycles=traffic.warmup_cycles,
                    measure_cycles=traffic.measure_cycles, drain_cycles_max=traffic.drain_cycles,
                    seed=traffic.seed, packets_refused=int(out[fk.O_REFUSED]),
                    max_source_queue_packets=int(out[fk.O_MAX_QUEUE])),
    )
