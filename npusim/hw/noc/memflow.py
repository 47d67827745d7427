"""HBM traffic over the mesh as flows: max-min fair shares of the links, inside the kernel.

At the ``path`` NoC fidelity with ``Simulator(memory_streams="flow")`` (the default since session 64; before,
the ``reserve`` streams: with the head-of-line coupling below the flows are within 6.6% of
flit on every row of ``validation/memory_flows_vs_flit.py`` against the streams' 22.5% (session 56,
after the flit routers' VC allocation was made round-robin per output), though not yet within issue 42's
3% on each, see docs/FIDELITY.md) a DMA's traffic
between its core and the routers where its HBM channels attach (:mod:`npusim.sim.mempath` splits
it: per attach router ``r`` the bursts ``n_r``, the flits towards the memory and the flits back) is
one *flow* per DMA engine (initiator): a rate ``x`` in bytes of the DMA per cycle that loads every
resource it crosses by a fixed coefficient, the flits that resource carries per byte of the DMA:

* mesh links of the XY routes ``core -> r`` (read requests, one flit a burst; write data) and
  ``r -> core`` (read data; write acknowledgements, one flit a burst): 1 flit a cycle each (the
  link width, ``noc.link_bytes_per_cycle`` bytes);
* the core's network interface (injection, 1 flit a cycle) and ejection port (1 flit a cycle);
* each attach router's memory port (ejection of what goes to the controllers) and its memory
  injection lanes (what the controllers send back): ``k`` flits a cycle each, ``k`` = the channels
  attached there (``Simulator(memory_port_lanes=...)``; with 0 lanes the router's core ports);
* its own cap, the DMA engine's closed loop: at most ``lim`` bursts in flight (its tags:
  ``max_outstanding`` transactions of ``transaction_bytes``, ``lim = max(1, min(bursts, max_outstanding,
  max_outstanding * transaction_bytes // burst bytes))``, as the flit model's DMA engines; a DMA of
  fewer bursts than its tags hold has only those in flight, so it lasts at least a round trip
  (session 51: before, a one-burst DMA drained in a fraction of one),
  :mod:`npusim.hw.noc.flit_engine`), each holding its tag for a zero-load round trip
  ``RTT_r = 2 ((h_r + 1) S + h_r L) + f_r - 1 + 5`` cycles (``h_r`` hops, ``S`` router pipeline, ``L``
  link latency, ``f_r`` flits a burst's data takes; 5: ``RTT_OVERHEAD``, the flit model's
  per-trip overhead measured on one engine): ``cap = lim * burst bytes / mean RTT``
  (Little's law; bursts are spread over the routers in proportion to ``n_r``, the DMA engine
  cycling over them).

A DMA's bursts to its routers move in a fixed proportion (the engine issues them round-robin), so
the flow is one rate, not one per route. Rates are max-min fair (progressive filling,
:func:`npusim.hw.maxmin.fill`, on per-resource flow lists and coefficient sums kept as flows start
and end) and recomputed when a flow starts or ends or a message changes what a link leaves them
(all changes at one cycle in one update; a change that cannot move any rate is skipped, see
:func:`memflow_note`). Only the resources that may fill take part in the filling (one whose flows,
all at their caps, would leave it room cannot), and a flow crossing none of them runs at its cap:
the same rates (see :func:`memflow_update`), at a cost set by the few resources that bind. That set
is kept as flows start and end and messages claim and release links (``mfl``), so an update
visits only its members, not every resource the flows cross (one that no longer may fill leaves
it at the next filling, not at once: :func:`_may_fill`). A flow's
bytes drain at its rate from its start; it ends ``RTT (1 - x / cap)`` cycles after its last byte
left (``x`` its last rate): a flow held back by the mesh (``x`` well below its cap) ends one round
trip after its bytes drained (the first request's trip and the last data's trip), a flow held by
its tags (``x = cap``) when its last window returns (``bytes / cap`` in all). The DMA task ends
when the flow and the DRAM access (:mod:`npusim.hw.memory.hbm`) have both ended, as before.

Head-of-line blocking at the routers' input ports (``HOL_COUPLING``, on by default since session 49;
:mod:`npusim.hw.noc.hol`): a mesh link feeds an input port of the next router, whose switch
allocator takes one flit a cycle from it; a flit bound for an output other inputs contend for holds
the port while it waits, so the link carries at most ``eta`` of its width (``eta`` from its flits'
mix of next outputs and the other inputs' loads there, at the current rates). Each update, after
the filling, every mesh link that may fill takes its ``eta`` (its capacity ``ceff`` is its width
less the messages holding it, times ``eta``) and the links are shared again, up to ``HOL_ITERS``
fillings, until no ``eta`` moves by more than ``HOL_TOL``; ``eta`` carries over to the next update
and returns to 1 when no flow crosses the link. The rates are always one max-min filling on the
``ceff`` kept. For this each entry of a flow keeps its flits by the output slot they leave the
link's router by and by the input slot they reach a resource's router by (a flow's entry on a link
sums several routes: one per attach router). Cost: per filling again, the filling, plus per link
that may fill a walk over its flows and those of its (at most 6) next outputs.

A head-of-line pass held (``HOL_PERIOD``, an option, 0 by default: a pass every update): an update
within ``HOL_PERIOD`` cycles of the last pass shares the links once on the ``eta`` that pass left.
The passes are most of an uncached serving run's cost once the KV spills to HBM (10 Mooncake
requests on npusim-64c: 60% of the run, 66M passes in 27.6M updates; two thirds of the updates come
within 64 cycles of the one before). Held for 1,024 cycles that run takes about 3x less wall time and
ends 0.04% earlier; the short rows of ``validation/memory_flows_vs_flit.py`` move by up to 3% (their
``eta`` settle from all flows starting at once, and where they settle depends on when they are read:
a hold of only 16 cycles moves them as much; with the cores starting 0-16 cycles apart, ``--jitter 16``,
by 1-7%, as the first passes see few flows), so the exact passes stay the default.

A sharing kept (``SHARE_PERIOD``, an option, 0 by default: a sharing at every change): a flow
starting, or flows draining, within ``SHARE_PERIOD`` cycles of the last sharing wait for the next
one, due when that period ends: the new flow stands at rate 0 until then, and what the drained flows
leave stays unused until then (the others keep their rates). A message claiming or releasing
a link, a mouse leaving a resource that may fill, and a change after the period are shared at once.
Since session 62 a drained flow's bandwidth is held for its engine (:func:`_defer_park`): its entries
stay in the sums, and if the engine's next DMA starts on the same entries and cap before the sharing
it owes is due (at most ``SHARE_PERIOD`` cycles after the drain), that DMA resumes the drained flow's
rate at once (:func:`_resume`) and the drain owes nothing: an engine's chain of equal DMAs then costs
no sharing at all (thirty uncached Mooncake requests: 10.1M of 14.3M flows resume, a third fewer
sharings). No resource carries beyond its width (a resumed rate was feasible at the last sharing and
nothing has taken capacity since: a claim is shared at once and ends the resumes), but a resumed flow
may run faster than a sharing then would give it while a new flow waits at rate 0.
Ten uncached Mooncake requests (with the passes held 1,024 cycles): kept 64 cycles, 16.7 M updates
instead of 27.6 M, 13% less wall time, the simulated time +0.01%; the short rows of
``validation/memory_flows_vs_flit.py`` move by at most 0.5% (docs/FIDELITY.md).

Sharings remembered (``MEMO_SLOTS``, on by default since session 57): the rates a sharing gives are a
function of its state -- the active flows (their routes, flits per byte on each resource and caps), the
messages holding and the mice loading the resources they cross -- and, through the head-of-line
passes' warm start, of the links' ``eta`` before it. A serving run meets the same states again and
again (the same layers' DMAs on the same cores: 10 uncached Mooncake requests on npusim-64c, 16 layers,
2.6M sharings of about 99k distinct states). So each sharing's state has a key (:func:`_memo_key`:
the flows' signatures, :func:`memflow_add` and :func:`memflow_go`, and the loaded resources' mixes,
:func:`_key_res`, summed as they change: O(1) to read), and a solved sharing is remembered under
it: the flows' rates and the mesh links' ``eta`` other than 1 (:func:`_memo_put`). A sharing whose
state is remembered takes them (:func:`_memo_get`: O(flows + links off 1), no filling, no pass). What
differs from solving it: the passes started, the first time, from the ``eta`` then, so a state reached
by another history might have settled elsewhere within the passes' tolerance; ``validation/
memory_flows_vs_flit.py`` rows move by at most 0.16% and a serving run's simulated time by less than
0.01% (``validation/perf/bench_serving.py --streams flow,flow-nomemo``). Deterministic: the table is
filled in the run's own order. With ``HOL_PERIOD``, a sharing on a held pass's ``eta`` is remembered
under its state's key and that pass (``S_HOL_STAMP``), so only a sharing on the same pass's ``eta`` takes
it (before session 59 under the state's key alone: the held ``eta``, read in another state, spread to
later sharings; cores starting 0-16 cycles apart, the memory patterns ran 11-18% faster than with a pass
every update, now 1-7%).

Left out (the flit model has them): per-flit arbitration and finite buffers (beyond the
head-of-line coupling above: no packet or VC state, no credits; messages are not among a port's
contenders), head-of-line blocking at the injection ports (NI, memory lanes), the controllers' queues' order (first-come first-served across cores: the flow model
shares a memory port fairly instead), and queueing delay in the round trip (the cap uses the
zero-load trip). Core-to-core messages keep the path model (:mod:`npusim.hw.noc.path`): a message
holds each link (and its destination's ejection port) exclusively from its header's claim to its
release, as before, and the flows see it as a load: while a message holds a link, that link's
capacity is the message's (``holds``: the path model counts the messages holding each link, and a
claim or release re-shares the flows' rates at that cycle). So a message is never slowed by the
flows (it waits only for other messages), flows crossing a held link stop meanwhile, and no link
ever carries more than its width.

Mice (``MICE``, on by default since session 51): a DMA whose bursts all fit in its engine's window
(one round trip) and whose resources the flows, at their caps, and the other mice leave room for it
at its cap, runs at its cap outside the filling: the flow model would give it its cap and move no
other rate (no resource it crosses may fill, before or after), so it costs no update at its start
and, unless flows filled one of its resources meanwhile, none at its end (one ``EV_MOUSE_END``).
Its load is kept apart (``mload``, taken off the flows' capacity), so no resource carries beyond
its width; what it leaves out is in :func:`_mouse_fits`. Uncached serving issues millions of such
DMAs once a little of the KV is in HBM (5 Mooncake requests on npusim-64c: 5.2M of 5.9M DMAs of at
most 4 KB, ~250 B on average; as we read it, KV reads scaled to the KV's share in HBM,
``serving/instance.py``'s ``kv_read_params``); ``validation/perf/bench_serving.py --streams flow,flow-all``.

Flows alone (``ALONE``, on by default since session 65): a flow that, listed at its start, crosses only
resources no other live flow crosses (and no message holds) takes ``min(cap, ceff / coefficient)`` over
them at once, the rate a sharing would give it, and no other rate moves, so its start shares nothing
(with ``SHARE_PERIOD`` it does not wait for a sharing either); a drained flow that crossed only such
resources is parked at once, and an update that ends only such flows shares nothing. What differs from
sharing them: rounding (the filling reaches the same minimum by summed increments; task times within a
cycle). Per-core DRAM (the NpuSim study's chip, ``npusim validate --only pd-ratios``) is where it pays:
a core's DMAs cross only its own ports and most run alone (one A7 ratio: 9.4M of 11.7M flows alone,
26.8 s of wall time instead of 33.9 s, the same results; docs/FIDELITY.md, "Flows alone").

Units: time in cycles of the NoC clock (the chip clock), rates in bytes per cycle, capacities in
flits per cycle. Deterministic: flows are kept in start order, and a resource's list of flows changes
order only by the same swaps (a leaving flow's place taken by the last) on every run.

Kept for speed, not for the model (session 61): a drained flow's entries stay in its resources' lists,
parked (rate 0, frozen, in no sum), until its engine's next DMA, which mostly takes the same entries
(:func:`_park`, :func:`_evict`); a resource that no longer may fill leaves the set that may fill at the
next filling (:func:`_purge`). Both leave every rate what the lists without them give, but the lists'
order differs, so a filling's sums may differ in their last bits, and a long serving run, which
amplifies such bits, ends elsewhere within its own spread (docs/FIDELITY.md, session 61).
"""

from __future__ import annotations

from collections import namedtuple

import numpy as np
import npusim._jitcache  # noqa: F401  (stamps the Numba cache: before any @njit)
from numba import njit

from npusim.engine.eventlist import event_push
from npusim.hw.maxmin import fill
from npusim.hw.noc.hol import NSLOT, SLOT_EJ, SLOT_LANES, SLOT_MEM, SLOT_NI, others_from, port_eta, settled_requests
from npusim.hw.noc.path import EV_NOC_PART_END

EV_MFLOW_UPDATE = 23
EV_MOUSE_END = 24  # id = initiator: its mouse's last byte arrived (memflow_mouse_end, then its DMA's part ends)
#: a resource whose active flows, all at their caps, would load it to at most this share of what
#: messages leave of it cannot fill: it is left out of the filling (exact, see memflow_update)
ROOM = 1.0 - 1e-6
#: cycles a burst's round trip takes beyond the two zero-load trips: the flit model's DMA engine
#: issues the next request the cycle after a tag frees, its controller answers the cycle after the
#: request arrives, and the request and the data each wait a cycle at the network interface / the
#: memory injection lane. Measured, not fitted to a workload: one DMA engine of npusim-64c reading
#: from one router at 3, 7, 8 and 14 hops with 8 bursts in flight (window-limited) takes
#: ``2 ((h + 1) S + h L) + f - 1 + 5`` cycles a round trip at the flit fidelity, every one of them
#: (``validation/memory_flows_vs_flit.py --rtt``).
RTT_OVERHEAD = 5
#: head-of-line coupling at the routers' input ports (:mod:`npusim.hw.noc.hol`): each mesh link that
#: may fill gets the effective capacity ``eta`` its port leaves it at the flows' current mix, read
#: when memflows are made (``False``: plain max-min on the links' widths, the model before session 49)
HOL_COUPLING = True
#: fillings an update may take while the links' ``eta`` settle (warm-started from the last update's);
#: read, like HOL_COUPLING, when memflows are made (``prm[P_HOL]``: 0 without the coupling)
HOL_ITERS = 4
#: a link's ``eta`` moving less than this (relative) counts as settled: no filling again for it
HOL_TOL = 1e-3
#: run a DMA whose requests all fit in its engine's window (one round trip of bursts) as a *mouse*
#: where the flows leave it room at its cap (:func:`_mouse_fits`): at its cap, outside the filling,
#: with no update at its start; read, like HOL_COUPLING, when memflows are made (``False``: every
#: DMA a flow of the filling)
MICE = True
#: cycles a head-of-line pass stays good for: an update within this many cycles of the last pass
#: shares the links once on the ``eta`` that pass left, without a pass of its own; read, like
#: HOL_COUPLING, when memflows are made (0: a pass every update, exact)
HOL_PERIOD = 0
#: cycles a sharing of the links stays in force for changes that only take bandwidth away from it: a
#: flow starting, or flows draining, within this many cycles of the last sharing wait for the next
#: one (the new flow at rate 0 until then, what the drained ones leave held for their engines' next
#: DMAs, which resume their rates), at most this long; a message claiming or releasing a link is
#: shared at once. Read, like HOL_COUPLING, when memflows are made (0: a sharing at every change, exact)
SHARE_PERIOD = 0

#: start a flow that crosses only resources no other live flow crosses at its rate at once, and end one
#: such without sharing the links again (:func:`_alone`): the rates a sharing would give, bar rounding;
#: read, like HOL_COUPLING, when memflows are made (``False``: every start and end shared)
ALONE = True

#: remember each sharing's outcome by what determines it (:func:`_memo_key`: the active flows, their
#: routes and caps, and the messages and mice loading the resources they cross) and give a sharing of
#: a state seen before those rates at once (``MEMO_SLOTS`` table entries, direct-mapped by the key;
#: their rates and links' ``eta`` in a ring of ``MEMO_ARENA`` pairs, an entry overwritten there is
#: forgotten). Read, like HOL_COUPLING, when memflows are made (0: every sharing solved). Not exact in
#: one respect: a sharing's head-of-line passes start from the links' ``eta`` the last one left, so
#: the same state reached by another history may settle at slightly other ``eta`` (within ``HOL_TOL``
#: per pass); a remembered outcome is the first one's.
MEMO_SLOTS = 1 << 16
MEMO_ARENA = 1 << 21  # 32 MiB of pairs at most, touched only as they are written

MemFlows = namedtuple("MemFlows", [
    "prm", "rcap", "ceff",  # parameters; per resource: capacity, and what messages leave of it (flits/cycle)
    "e_n", "e_res", "e_coef",  # per initiator: its resources and flits per byte on each
    "pos",  # scratch: a resource's entry in the row being built (-1: none)
    "fcap", "rate", "rem", "rtt", "nbytes", "binv",  # per initiator: cap, rate (bytes/cycle), bytes left, RTT, bytes, 1 / bytes
    "act",  # active initiators, in start order
    # per resource, kept between updates as flows start and end: its active flows
    # ``rl[row[l] : row[l] + rn[l]]`` (with their entry index ``rk``; ``eslot[f, k]``: where entry
    # ``k`` of flow ``f`` sits in its resource's list), and the resources with any (``tl``, ``tpos``)
    "rl", "rk", "rn", "row", "eslot", "tl", "tpos",
    # per resource, how many of its listed entries are live (``rv``; the others are parked: a drained
    # flow's entries stay listed until its engine's next DMA, :func:`_park`); per initiator, whether its
    # entries are parked
    "rv", "parked",
    "A0",  # per resource: its active flows' coefficient sum (flits per byte), kept as they start and end
    "B0",  # per resource: the load its active flows put on it at their caps (flits/cycle), kept the same way
    "A", "R", "cnt", "live", "frozen", "fz",  # the solver's scratch (npusim.hw.maxmin.fill)
    # per flow, kept with the set below: its entries on the resources that may fill (``ln[f]`` of them:
    # resource, coefficient, entry index ``k``; ``lslot[f, k]``: where entry ``k`` sits there)
    "ln", "lres", "lcoef", "lk", "lslot",
    "outl",  # scratch of an update: resources left out of the filling that may carry the peak load
    "fin",  # scratch of an update: the flows in the filling (those crossing a resource in it)
    # the resources that may fill, kept as flows start and end and messages claim and release links
    # (and, until the next filling's setup, some that no longer may): ``mfl[:sc[S_NMF]]`` (``mpos[l]``:
    # where ``l`` sits there, -1: not in it)
    "mfl", "mpos",
    "stl", "stale",  # claimed links whose flows all stood (no update): read again at the next update
    "tdrain",  # per initiator: the cycle its last flow drained (-1: none yet), for the gap counters
    # head-of-line coupling (npusim.hw.noc.hol): per entry of a flow, its flits (the whole DMA's, as
    # its routes were built) by the output slot they leave the router a link entry feeds by (``e_tout``: 0 the core's
    # ejection, 1..4 the link of that port, 5 the memory port) and by the input slot they reach an
    # output's router by (``e_tin``: 0 the NI, 1..4 the link from that port's neighbour, 5 the memory
    # lanes); per router, its links by port (``olink``); per link, its input slot at the router it
    # feeds and that router; per resource, ``eta`` (1 but for links); scratch
    "e_tout", "e_tin", "olink", "lslot_in", "lhead", "eta", "hres", "hlam", "hN", "ht", "hcap", "hchg",
    "heta",
    # per output resource, an update's settled requests of its input slots (``hu``, sum ``hU``), valid
    # while ``hstamp`` equals the update's stamp ``sc[S_HOL_STAMP]``: one solve for every link feeding it
    "hu", "hU", "hstamp",
    # per resource, its flows' loads by output slot (``hso``) and by input slot (``hsi``) at the current
    # rates, valid while ``hls`` equals ``sc[S_LOADS_STAMP]``: one walk of its list a pass for both
    "hso", "hsi", "hls",
    # mice (MICE): per resource, the load the mice running now put on it (flits/cycle, at their caps;
    # a mouse's entries e_* are kept, per byte, until it ends)
    "mload",
    # the sharings remembered (MEMO_SLOTS): the state's key now (``mk``: the active flows' signatures'
    # mixes summed, and the loaded resources' ``hc`` summed), per flow its signature (``fsig``), per
    # resource its load's mix (``hc``, 0 unless flows cross it and messages or mice load it); per table
    # entry its key, start in the ring of pairs, flows, links and the peak load it left; scratch of a
    # hit: per link the ``eta`` it gives (``mev``, valid where ``mst`` is the hit's stamp)
    "mk", "fsig", "hc", "mt_key", "mt_off", "mt_nf", "mt_nl", "mt_peak", "ma_i", "ma_v", "mst", "mev",
    # the mesh links whose ``eta`` is not 1, ``xl[:sc[S_NX]]`` (``xpos[l]``: where ``l`` sits there, -1: not in it)
    "xl", "xpos",
    # the routes built (memflow_go): this DMA's parts as memflow_add gives them (``parts[:sc[S_NPARTS]]``:
    # attach router, bursts, flits out, flits back); per initiator, the flits of each entry counted into
    # the path model's link counters (``e_flits``) and what its entries were last built for (``b_n``
    # entries, from ``b_nparts`` parts ``b_parts`` of ``b_bytes`` bytes; ``b_n`` 0: none)
    "parts", "e_flits", "b_n", "b_nparts", "b_parts", "b_bytes",
    # a sharing period's drains (SHARE_PERIOD): per initiator, whether its drained flow's entries still
    # stand in its resources' sums (``pend``: its park deferred to the next sharing, :func:`_defer_park`)
    # and the rate it drained at (``orate``); the initiators so drained, ``pl[:sc[S_NPEND]]``
    "pend", "orate", "pl",
    "sc", "fsc",
])
(P_NLINKS, P_NR, P_S, P_L, P_TAGS, P_INFLIGHT, P_HOL, P_MICE, P_HOL_PERIOD, P_SHARE_PERIOD, P_MEMO,
 P_ALONE) = range(12)
# sc: active flows, update version, an update pending now, time of the last advance, updates, filling
# rounds, flows started, flows and resources in the filling (summed over updates), resources crossed now,
# message claims and releases that could not move a rate (no update), resources crossed (summed over
# updates; S_SOLVED_RES: those of them that took part in the filling), resources that may fill now
# (the kept set), resources an update's setup visited (summed), flows started by an initiator whose
# previous flow drained at this very cycle / within RTT_GAP cycles / longer before (the rest: its first),
# claimed links left stale (memflow_note), resources that joined the set that may fill, updates whose
# sharing waited for the same cycle's DMA starts (a flow's part ended at once)
(S_NACT, S_VERSION, S_PENDING, S_TLAST, S_UPDATES, S_ROUNDS, S_FLOWS, S_SOLVED, S_NTOUCH, S_SOLVED_RES,
 S_SKIPPED, S_CROSSED, S_NMF, S_VISITED, S_GAP0, S_GAP_SHORT, S_GAP_LONG, S_NSTALE, S_JOINS,
 S_DEFERRED, S_HOL_FILLS, S_HOL_STAMP, S_MICE, S_HOL_LAST, S_HOL_HELD, S_TSHARE, S_NEXT_T, S_WAITED,
 S_UNSHARED, S_MEMO_HITS, S_MEMO_WPOS, S_NX, S_NPARTS, S_REUSED, S_LOADS_STAMP, S_NPEND, S_RESUMED,
 S_OWED, S_DUE, S_ALONE, S_ALONE_END) = range(41)  # S_HOL_FILLS: fillings again after the links' eta moved;
# S_HOL_STAMP: head-of-line passes so far (stamps the outputs' settled requests); S_MICE: DMAs timed as mice;
# S_HOL_LAST: the cycle of the last update that made passes; S_HOL_HELD: updates that held the last pass (HOL_PERIOD);
# S_MEMO_HITS: sharings given a remembered outcome (MEMO_SLOTS); S_MEMO_WPOS: pairs written to the memo's ring so far;
# S_NX: mesh links whose eta is not 1 (``xl``); S_NPARTS: parts given for the DMA being started;
# S_REUSED: flows started on their initiator's entries as its last DMA left them (no routes built);
# S_LOADS_STAMP: stamps the resources' slot loads (``hso``, ``hsi``): moved by every head-of-line pass;
# S_TSHARE: the cycle of the last sharing; S_NEXT_T: when the update of the current version is due (-1: none);
# S_WAITED: flow starts that waited for the next sharing (SHARE_PERIOD); S_UNSHARED: updates that ended drained
# flows without a sharing; S_NPEND: drained flows whose park waits for the next sharing (``pl``); S_RESUMED:
# flows that resumed their initiator's last rate within a sharing period (:func:`memflow_go`); S_OWED: changes
# since the last sharing that owe the next one (a drain not resumed, a flow started without resuming); S_DUE:
# when the next sharing is due for them (NEVER: none owed); S_ALONE: flows started alone on every resource they
# cross (:func:`_alone`: their rates set at once, no sharing); S_ALONE_END: updates that ended only such flows
# and shared nothing
#: a flow starting at most this many cycles after its initiator's previous one drained counts as
#: short-gapped (S_GAP_SHORT): about a round trip on npusim-64c's mesh
RTT_GAP = 64
#: no flow moves: no drain is due
NEVER = np.int64(2 ** 62)
F_PEAK_LOAD = 0  # fsc: highest load / capacity seen


def new_memflows(n_links: int, n_routers: int, num_initiators: int, router_stages: int, link_latency: int,
                 memory_lanes, max_outstanding: int, transaction_bytes: int, memo: bool = True,
                 hol_period: int | None = None, share_period: int | None = None) -> MemFlows:
    """State for ``num_initiators`` DMA engines on a NoC of ``n_links`` mesh links and
    ``n_routers`` routers; ``memory_lanes[r]``: lanes of router ``r``'s memory port and injection;
    ``memo``: remember sharings (as ``MEMO_SLOTS`` says; ``False``: a stand-in that shares nothing);
    ``hol_period``, ``share_period``: cycles a head-of-line pass is held and a sharing kept (``None``: the
    module's ``HOL_PERIOD`` and ``SHARE_PERIOD``).
    Resource ids: mesh links ``0 .. n_links-1``, then per router the core's ejection port
    (``n_links + r``), the memory port (``n_links + R + r``), the core's injection
    (``n_links + 2R + r``) and the memory injection lanes (``n_links + 3R + r``)."""
    nres = n_links + 4 * n_routers
    lanes = np.maximum(1, np.asarray(memory_lanes, np.int64)).astype(np.float64)
    rcap = np.ones(nres, np.float64)
    rcap[n_links + n_routers:n_links + 2 * n_routers] = lanes
    rcap[n_links + 3 * n_routers:] = lanes
    ni = int(num_initiators)
    width = nres
    memo = memo and MEMO_SLOTS > 0 and MEMO_ARENA > 0
    # powers of two (a key's slot and a pair's place are masks); 1 each when off
    slots = 1 << max(0, int(MEMO_SLOTS - 1).bit_length()) if memo else 1
    arena = 1 << max(0, int(MEMO_ARENA - 1).bit_length()) if memo else 1
    mf = MemFlows(
        prm=np.array([n_links, n_routers, router_stages, link_latency, max(1, int(max_outstanding)),
                      max(1, int(max_outstanding)) * int(transaction_bytes),
                      max(1, int(HOL_ITERS)) if HOL_COUPLING else 0, int(bool(MICE)),
                      max(0, int(HOL_PERIOD if hol_period is None else hol_period)),
                      max(0, int(SHARE_PERIOD if share_period is None else share_period)), int(memo),
                      int(bool(ALONE))],
                     np.int64),
        rcap=rcap, ceff=rcap.copy(),
        e_n=np.zeros(ni, np.int64), e_res=np.zeros((ni, width), np.int64), e_coef=np.zeros((ni, width), np.float64),
        pos=np.full(nres, -1, np.int64),
        fcap=np.zeros(ni, np.float64), rate=np.zeros(ni, np.float64), rem=np.zeros(ni, np.float64),
        rtt=np.zeros(ni, np.float64), nbytes=np.zeros(ni, np.int64), binv=np.zeros(ni, np.float64), act=np.zeros(ni, np.int64),
        rl=np.zeros(nres * ni, np.int64), rk=np.zeros(nres * ni, np.int64), rn=np.zeros(nres, np.int64),
        row=np.arange(nres, dtype=np.int64) * ni, eslot=np.zeros((ni, width), np.int64),
        tl=np.zeros(nres, np.int64), tpos=np.full(nres, -1, np.int64),
        rv=np.zeros(nres, np.int64), parked=np.zeros(ni, np.int64),
        A0=np.zeros(nres, np.float64), B0=np.zeros(nres, np.float64),
        A=np.zeros(nres, np.float64), R=np.zeros(nres, np.float64), cnt=np.zeros(nres, np.int64),
        live=np.zeros(nres, np.int64), frozen=np.zeros(ni, np.int64), fz=np.zeros(ni, np.int64),
        ln=np.zeros(ni, np.int64), lres=np.zeros((ni, width), np.int64), lcoef=np.zeros((ni, width), np.float64),
        lk=np.zeros((ni, width), np.int64), lslot=np.zeros((ni, width), np.int64),
        outl=np.zeros(nres, np.int64), fin=np.zeros(ni, np.int64),
        mfl=np.zeros(nres, np.int64), mpos=np.full(nres, -1, np.int64), tdrain=np.full(ni, -1, np.int64),
        stl=np.zeros(nres, np.int64), stale=np.zeros(nres, np.int64),
        e_tout=np.zeros((ni, width, NSLOT), np.float64), e_tin=np.zeros((ni, width, NSLOT), np.float64),
        olink=np.full((max(1, int(n_routers)), NSLOT), -1, np.int64),
        lslot_in=np.zeros(nres, np.int64), lhead=np.zeros(nres, np.int64), eta=np.ones(nres, np.float64),
        hres=np.zeros(NSLOT + 2, np.int64), hlam=np.zeros(NSLOT + 2, np.float64), hN=np.zeros(NSLOT + 2, np.float64),
        ht=np.zeros(NSLOT + 2, np.float64), hcap=np.ones(NSLOT, np.float64),
        hchg=np.zeros(nres, np.int64), heta=np.ones(nres, np.float64),
        hu=np.zeros((nres, NSLOT), np.float64), hU=np.zeros(nres, np.float64), hstamp=np.zeros(nres, np.int64),
        hso=np.zeros((nres, NSLOT), np.float64), hsi=np.zeros((nres, NSLOT), np.float64), hls=np.zeros(nres, np.int64),
        mload=np.zeros(nres, np.float64),
        mk=np.zeros(2, np.uint64), fsig=np.zeros(ni, np.uint64), hc=np.zeros(nres, np.uint64),
        mt_key=np.zeros(slots, np.uint64), mt_off=np.zeros(slots, np.int64), mt_nf=np.zeros(slots, np.int64),
        mt_nl=np.zeros(slots, np.int64), mt_peak=np.zeros(slots, np.float64),
        ma_i=np.zeros(arena, np.int64), ma_v=np.zeros(arena, np.float64),
        mst=np.zeros(nres if memo else 1, np.int64), mev=np.ones(nres if memo else 1, np.float64),
        xl=np.zeros(nres, np.int64), xpos=np.full(nres, -1, np.int64),
        parts=np.zeros((max(1, int(n_routers)), 4), np.int64), e_flits=np.zeros((ni, width), np.int64),
        b_n=np.zeros(ni, np.int64), b_nparts=np.zeros(ni, np.int64),
        b_parts=np.zeros((ni, max(1, int(n_routers)), 4), np.int64), b_bytes=np.zeros(ni, np.int64),
        pend=np.zeros(ni, np.int64), orate=np.zeros(ni, np.float64), pl=np.zeros(ni, np.int64),
        sc=np.zeros(41, np.int64), fsc=np.zeros(1, np.float64),
    )
    mf.sc[S_NEXT_T] = -1
    mf.sc[S_DUE] = NEVER
    return mf


@njit(cache=True, _nrt=False, inline="always")
def _member_add(lst, pos, sc, count, x):
    """``x`` joins the set ``lst[:sc[count]]`` (``pos[x]``: its place there)."""
    n = sc[count]
    lst[n] = x
    pos[x] = n
    sc[count] = n + 1


@njit(cache=True, _nrt=False, inline="always")
def _member_drop(lst, pos, sc, count, x):
    """``x`` leaves the set ``lst[:sc[count]]``: the last member takes its place."""
    n = sc[count] - 1
    p = pos[x]
    m = lst[n]
    lst[p] = m
    pos[m] = p
    pos[x] = -1
    sc[count] = n


@njit(cache=True, _nrt=False, inline="always")
def _schedule(mf, heap, hs, t):
    """An update at cycle ``t``, of a new version (the one scheduled before is superseded)."""
    mf.sc[S_VERSION] += 1
    mf.sc[S_NEXT_T] = t
    event_push(heap, hs, t, EV_MFLOW_UPDATE, mf.sc[S_VERSION])


@njit(cache=True, _nrt=False, inline="always")
def _share_now(mf, heap, hs, now):
    """A change that may move rates at cycle ``now``: an update then, unless one is pending."""
    if mf.sc[S_PENDING] == 0:
        mf.sc[S_PENDING] = 1
        _schedule(mf, heap, hs, now)


@njit(cache=True, _nrt=False, inline="always")
def _acc(mf, init, res, flits):
    k = mf.pos[res]
    if k < 0:
        k = mf.e_n[init]
        mf.pos[res] = k
        mf.e_res[init, k] = res
        mf.e_coef[init, k] = 0.0
        mf.e_flits[init, k] = 0
        for s in range(NSLOT):
            mf.e_tout[init, k, s] = 0.0
            mf.e_tin[init, k, s] = 0.0
        mf.e_n[init] = k + 1
    mf.e_coef[init, k] += flits
    return k


@njit(cache=True, _nrt=False, inline="always")
def _route(mf, noc, init, src, dst, flits, slot0, last):
    """Load every mesh link of the XY route ``src -> dst`` with ``flits`` (the flow's share and the
    path model's per-link flit counters), its flits entering at ``src`` by input slot ``slot0`` and
    leaving at ``dst`` by output slot ``last`` (for the head-of-line coupling: each link entry's
    flits by the output they take next and by the input they came from); the route's hops and the
    input slot its flits reach ``dst`` by."""
    h = 0
    x = src
    slot = slot0
    kp = -1
    while x != dst:
        port = noc.next_port[x, dst]
        lk = noc.link_id[x, port]
        k = _acc(mf, init, lk, flits)
        mf.e_tin[init, k, slot] += flits
        if kp >= 0:
            mf.e_tout[init, kp, port] += flits
        kp = k
        noc.link_flits[lk] += flits
        mf.e_flits[init, k] += flits
        mf.olink[x, port] = lk
        x = noc.nbr_router[x, port]
        mf.lslot_in[lk] = port  # the link from this neighbour: input slot ``port`` at ``x``
        mf.lhead[lk] = x
        slot = port
        h += 1
    if kp >= 0:
        mf.e_tout[init, kp, last] += flits
    return h, slot


@njit(cache=True, _nrt=False)
def memflow_add(mf, init, r, bursts, out_flits, back_flits, memports):
    """Initiator ``init``'s DMA moves ``out_flits`` towards attach router ``r`` and ``back_flits``
    back, in ``bursts`` bursts. Call per router, then :func:`memflow_go` (which builds the routes,
    or finds them built: an engine's DMAs mostly repeat the one before)."""
    if mf.prm[P_MEMO] != 0:  # what this router's part adds to the flow's signature (its routes and loads)
        mf.fsig[init] += _mix(np.uint64(r) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(bursts) * np.uint64(0x632BE59BD9B4E019)
                              + np.uint64(out_flits) * np.uint64(0xD6E8FEB86659FD93) + np.uint64(back_flits)
                              + np.uint64(memports))
    n = mf.sc[S_NPARTS]
    mf.parts[n, 0] = r
    mf.parts[n, 1] = bursts
    mf.parts[n, 2] = out_flits
    mf.parts[n, 3] = back_flits
    mf.sc[S_NPARTS] = n + 1


@njit(cache=True, _nrt=False, inline="always")
def _built_before(mf, init, nbytes):
    """Whether initiator ``init``'s entries, as its last flow left them, are this DMA's: the same
    parts (:func:`memflow_add`) and bytes (its entries are per byte)."""
    n = mf.sc[S_NPARTS]
    if mf.b_n[init] == 0 or mf.b_bytes[init] != nbytes or mf.b_nparts[init] != n:
        return False
    for i in range(n):
        for c in range(4):
            if mf.b_parts[init, i, c] != mf.parts[i, c]:
                return False
    return True


@njit(cache=True, _nrt=False)
def _build_part(mf, noc, init, core, r, bursts, out_flits, back_flits, memports):
    """Initiator ``init``'s entries (of core ``core``) for its part at attach router ``r``: the
    routes both ways, the ports and, for the path model's per-link flit counters, the flits
    (``e_flits``, added to ``noc.link_flits``); returns the part's burst round trip times its bursts."""
    nl = mf.prm[P_NLINKS]
    nr = mf.prm[P_NR]
    # out: the core's NI, the route core -> r, the memory port (or r's core port)
    _acc(mf, init, nl + 2 * nr + core, out_flits)
    ej = nl + nr + r if memports != 0 else nl + r
    _, slot = _route(mf, noc, init, core, r, out_flits, SLOT_NI, SLOT_MEM if memports != 0 else SLOT_EJ)
    k = _acc(mf, init, ej, out_flits)
    mf.e_tin[init, k, slot] += out_flits
    mf.e_flits[init, k] += out_flits
    noc.link_flits[ej] += out_flits
    # back: the memory injection lanes (or r's NI), the route r -> core, the core's ejection port
    _acc(mf, init, nl + 3 * nr + r if memports != 0 else nl + 2 * nr + r, back_flits)
    h, slot = _route(mf, noc, init, r, core, back_flits, SLOT_LANES if memports != 0 else SLOT_NI, SLOT_EJ)
    k = _acc(mf, init, nl + core, back_flits)
    mf.e_tin[init, k, slot] += back_flits
    mf.e_flits[init, k] += back_flits
    noc.link_flits[nl + core] += back_flits
    # the round trip of one burst here, weighted by the bursts (mean taken in memflow_go)
    S, L = mf.prm[P_S], mf.prm[P_L]
    per = (out_flits + back_flits) / bursts  # a burst's flits both ways: one is a header-only packet
    return bursts * (2.0 * ((h + 1) * S + h * L) + per - 2.0 + RTT_OVERHEAD)


@njit(cache=True, _nrt=False, inline="always")
def _build(mf, noc, init, core, nbytes, bursts, memports):
    """Initiator ``init``'s entries for the parts given (:func:`memflow_add`), per byte of its
    ``nbytes``, and its mean burst round trip (``rtt``); kept as built (``b_*``) for the next DMA."""
    n = mf.sc[S_NPARTS]
    acc = 0.0
    for i in range(n):
        acc += _build_part(mf, noc, init, core, mf.parts[i, 0], mf.parts[i, 1], mf.parts[i, 2], mf.parts[i, 3],
                           memports)
        for c in range(4):
            mf.b_parts[init, i, c] = mf.parts[i, c]
    mf.rtt[init] = acc / bursts
    inv = 1.0 / nbytes
    for k in range(mf.e_n[init]):  # its entries per byte (``pos`` was the routes' scratch)
        mf.pos[mf.e_res[init, k]] = -1
        mf.e_coef[init, k] *= inv
    mf.b_n[init] = mf.e_n[init]
    mf.b_nparts[init] = n
    mf.b_bytes[init] = nbytes


@njit(cache=True, _nrt=False)
def memflow_go(mf, noc, heap, hs, init, core, nbytes, bursts, memports, now):
    """Start initiator ``init``'s flow (of core ``core``) of ``nbytes`` bytes in ``bursts`` bursts
    (its parts given by :func:`memflow_add`; ``noc``: the path model's state, for the routes, its
    per-link flit counters and the messages holding each link or port now, ``link_holds``: a
    resource the flows did not cross before takes its capacity from it); its end is reported as
    ``EV_NOC_PART_END`` for ``init``."""
    holds = noc.link_holds
    reuse = _built_before(mf, init, nbytes)
    if mf.parked[init] != 0 and not reuse:  # its last flow's entries, parked in the lists, are not this DMA's
        _settle(mf, init)
        _evict(mf, init)
        mf.e_n[init] = 0
    if reuse:  # its last DMA's entries, as they were left: the same bits
        mf.e_n[init] = mf.b_n[init]
        for k in range(mf.b_n[init]):
            x = mf.e_flits[init, k]
            if x != 0:
                noc.link_flits[mf.e_res[init, k]] += x
        mf.sc[S_REUSED] += 1
    else:
        _build(mf, noc, init, core, nbytes, bursts, memports)
    mf.sc[S_NPARTS] = 0
    burst_bytes = (nbytes + bursts - 1) // bursts
    lim = max(1, min(bursts, mf.prm[P_TAGS], mf.prm[P_INFLIGHT] // burst_bytes))  # no more than it has
    cap = lim * burst_bytes / mf.rtt[init]
    q = mf.prm[P_SHARE_PERIOD]
    if (mf.pend[init] == 1 and reuse and cap == mf.fcap[init] and mf.orate[init] > 0.0 and mf.sc[S_PENDING] == 0
            and now < mf.sc[S_DUE] and mf.sc[S_NSTALE] == 0):
        _resume(mf, heap, hs, init, nbytes, now)
        return
    _settle(mf, init)  # (its sums were taken at its last cap)
    mf.fcap[init] = cap
    if bursts <= lim and mf.prm[P_MICE] != 0 and _mouse_fits(mf, holds, init):  # a mouse: at its cap
        if mf.parked[init] != 0:  # a mouse is in no list
            _evict(mf, init)
        cap = mf.fcap[init]
        for k in range(mf.e_n[init]):
            l = mf.e_res[init, k]
            mf.mload[l] += mf.e_coef[init, k] * cap
            if mf.rv[l] > 0:  # the flows there keep what is left (they stay out of the filling)
                _key_res(mf, holds, l)
                mf.ceff[l] = _ceff(mf, holds, l)
        mf.sc[S_MICE] += 1
        mf.fsig[init] = 0  # (its routers' parts summed for a flow's signature)
        event_push(heap, hs, now + max(np.int64(1), np.int64(np.ceil(nbytes / cap))), EV_MOUSE_END, init)
        return
    _sign(mf, init, nbytes)
    if mf.parked[init] != 0:  # its entries, parked where its last flow left them, live again
        for k in range(mf.e_n[init]):
            _live_in(mf, holds, init, k, mf.e_res[init, k], False)
        mf.parked[init] = 0
    else:
        for k in range(mf.e_n[init]):
            _list_add(mf, holds, init, k, mf.e_res[init, k])
    if mf.prm[P_ALONE] != 0 and mf.sc[S_PENDING] == 0 and _alone(mf, holds, init):  # no other flow to share with: its rate now
        _start_alone(mf, heap, hs, init, nbytes, now)
        return
    _activate(mf, init, nbytes, 0.0, now)
    _owe(mf, max(now, mf.sc[S_TSHARE] + q))
    if q > 0 and mf.sc[S_PENDING] == 0 and mf.sc[S_UPDATES] > 0 and now < mf.sc[S_DUE]:
        # SHARE_PERIOD: it waits at rate 0 for the next sharing, due when the last one's period ends or
        # the first change since it is a period old
        mf.sc[S_WAITED] += 1
        tb = mf.sc[S_DUE]
        if mf.sc[S_NEXT_T] < 0 or tb < mf.sc[S_NEXT_T]:
            _schedule(mf, heap, hs, tb)
    else:
        _share_now(mf, heap, hs, now)


@njit(cache=True, _nrt=False, inline="always")
def _sign(mf, init, nbytes):
    """Initiator ``init``'s flow of ``nbytes`` joins the memo key (its signature: its routers' parts,
    :func:`memflow_add`, then this); nothing with the memo off."""
    if mf.prm[P_MEMO] != 0:
        mf.fsig[init] = _mix(mf.fsig[init] + _mix(np.uint64(init) * np.uint64(0x2545F4914F6CDD1D) + np.uint64(nbytes)))
        mf.mk[0] += mf.fsig[init]


@njit(cache=True, _nrt=False, inline="always")
def _activate(mf, init, nbytes, rate, now):
    """Initiator ``init``'s flow of ``nbytes`` joins the active flows at ``rate`` (the others advanced to ``now``)."""
    mf.rem[init] = float(nbytes)
    mf.rate[init] = rate
    mf.nbytes[init] = nbytes
    mf.binv[init] = 1.0 / nbytes
    last = mf.tdrain[init]
    if last >= 0:
        gap = now - last
        if gap == 0:
            mf.sc[S_GAP0] += 1
        elif gap <= RTT_GAP:
            mf.sc[S_GAP_SHORT] += 1
        else:
            mf.sc[S_GAP_LONG] += 1
    _advance(mf, now)
    mf.act[mf.sc[S_NACT]] = init
    mf.sc[S_NACT] += 1
    mf.sc[S_FLOWS] += 1


@njit(cache=True, _nrt=False, inline="always")
def _alone(mf, holds, init):
    """Whether initiator ``init``'s flow, listed (just started, or just drained and not yet parked),
    crosses only resources no other live flow crosses (``rv`` 1: its own entry; a drained flow's deferred
    park counts as live) and no message holds. Then its start or its end moves no other flow's rate: the
    others cross none of its resources, and the head-of-line coupling reads a link's next outputs' loads
    only from flows crossing them (:func:`_slot_loads`). At its start the max-min filling would give it
    ``min(cap, ceff / coefficient)`` over them (:func:`_start_alone`): its resources were untouched before
    it (``rv`` was 0), so their ``ceff`` was just read and their ``eta`` is 1."""
    for k in range(mf.e_n[init]):
        l = mf.e_res[init, k]
        if mf.rv[l] != 1 or (l < holds.shape[0] and holds[l] > 0) or mf.ceff[l] <= 0.0:
            return False
    return True


@njit(cache=True, _nrt=False, inline="always")
def _start_alone(mf, heap, hs, init, nbytes, now):
    """Initiator ``init``'s flow starts alone (:func:`_alone`): at the rate a sharing would give it, at
    once, with no sharing (and with ``SHARE_PERIOD`` no wait for one); the next update comes no later than
    its drain. Rounding aside (the filling reaches the same minimum by summed increments), the rates are
    the ones a sharing would set."""
    x = mf.fcap[init]
    for k in range(mf.e_n[init]):
        a = mf.e_coef[init, k]
        if a > 0.0 and mf.ceff[mf.e_res[init, k]] < a * x:
            x = mf.ceff[mf.e_res[init, k]] / a
    peak = mf.fsc[F_PEAK_LOAD]
    for k in range(mf.e_n[init]):
        v = mf.e_coef[init, k] * x / mf.ceff[mf.e_res[init, k]]
        if v > peak:
            peak = v
    mf.fsc[F_PEAK_LOAD] = peak
    mf.sc[S_ALONE] += 1
    _activate(mf, init, nbytes, x, now)
    t = now + max(np.int64(1), np.int64(np.ceil(mf.rem[init] / x)))
    if mf.sc[S_NEXT_T] < 0 or t < mf.sc[S_NEXT_T]:
        _schedule(mf, heap, hs, t)


@njit(cache=True, _nrt=False, inline="always")
def _resume(mf, heap, hs, init, nbytes, now):
    """Initiator ``init``'s DMA starts on the entries, and at the cap, its flow drained with within this
    sharing period, its park deferred (:func:`_defer_park`): it resumes the rate that flow drained at.
    Its entries stood in the sums meanwhile and no rate moved, so the state is the last sharing's as far
    as it goes; the next update comes no later than its drain."""
    _sign(mf, init, nbytes)
    mf.parked[init] = 0
    mf.pend[init] = 2  # listed for the flush still, no longer pending
    mf.sc[S_OWED] -= 1
    if mf.sc[S_OWED] == 0:  # nothing else changed since the last sharing: none is owed
        mf.sc[S_DUE] = NEVER
    mf.sc[S_RESUMED] += 1
    _activate(mf, init, nbytes, mf.orate[init], now)
    t = now + max(np.int64(1), np.int64(np.ceil(mf.rem[init] / mf.rate[init])))
    if mf.sc[S_NEXT_T] < 0 or t < mf.sc[S_NEXT_T]:
        _schedule(mf, heap, hs, t)


@njit(cache=True, _nrt=False)
def _mouse_fits(mf, holds, init):
    """Whether initiator ``init``'s DMA (its entries given, per byte) may run as a *mouse* (``MICE``): at its cap, with no update at its start or end. It may where
    the flow model would give it its cap and move no other flow's rate: on every resource it
    crosses no message holds it, the resource is not one that may fill, and it stays one that
    cannot with the DMA added at its cap (the flows there at their caps, the mice running and this
    one within ``ROOM`` of its capacity) -- exactly the flow model's rule for a flow crossing no
    resource that may fill (:func:`memflow_update`). Its load is then kept apart (``mload``: the
    flows' capacity there is what the mice leave), so no resource ever carries beyond its width.

    What differs from running it as a flow: the flows' head-of-line coupling does not see the mice's
    flits (:func:`_slot_loads` reads the flows' lists), a mouse keeps its cap if later flows fill a
    resource it crosses (its capacity is held for it: those flows share what is left), and a
    message claiming a link a mouse crosses does not stop it (the link carries the mouse's last
    bytes beside the message). ``validation/memory_flows_vs_flit.py`` and
    ``validation/perf/bench_serving.py --streams flow,flow-all`` compare with every DMA a flow."""
    cap = mf.fcap[init]
    for k in range(mf.e_n[init]):
        l = mf.e_res[init, k]
        if _fills(mf, l) or (l < holds.shape[0] and holds[l] > 0):
            return False
        c = (mf.rcap[l] - (holds[l] if l < holds.shape[0] else 0.0)) * mf.eta[l]
        if mf.B0[l] + mf.mload[l] + mf.e_coef[init, k] * cap > c * ROOM:
            return False
    return True


@njit(cache=True, _nrt=False)
def memflow_mouse_end(mf, holds, heap, hs, init, now):
    """Initiator ``init``'s mouse ended (``EV_MOUSE_END``; the caller then ends its DMA's part): its load leaves its resources;
    where one of them may fill (flows filled it since the mouse started) the flows there may now
    go faster, so they are shared again at this cycle."""
    cap = mf.fcap[init]
    poke = False
    for k in range(mf.e_n[init]):
        l = mf.e_res[init, k]
        mf.mload[l] -= mf.e_coef[init, k] * cap
        if mf.mload[l] < 1e-12:
            mf.mload[l] = 0.0
        if mf.rv[l] > 0:
            _key_res(mf, holds, l)
            mf.ceff[l] = _ceff(mf, holds, l)
            poke |= _fills(mf, l)
            _may_fill(mf, l)
    mf.e_n[init] = 0
    mf.tdrain[init] = now
    if poke and mf.sc[S_NACT] > 0:
        _share_now(mf, heap, hs, now)


@njit(cache=True, _nrt=False, inline="always")
def _advance(mf, now):
    dt = now - mf.sc[S_TLAST]
    if dt > 0:
        for i in range(mf.sc[S_NACT]):
            f = mf.act[i]
            mf.rem[f] -= mf.rate[f] * dt
    mf.sc[S_TLAST] = now


@njit(cache=True, _nrt=False, inline="always")
def _fills(mf, l):
    """Whether resource ``l`` may fill: flows cross it and they, all at their caps, would load it
    beyond ``ROOM`` of what messages leave of it (``B0[l] > ceff[l] ROOM``)."""
    return mf.rv[l] > 0 and mf.B0[l] > mf.ceff[l] * ROOM


@njit(cache=True, _nrt=False, inline="always")
def _may_fill(mf, l):
    """Resource ``l`` joins the set of those that may fill (``mfl``) if it may fill (:func:`_fills`)
    and is not in it; called whenever ``B0[l]``, ``rv[l]`` or ``ceff[l]`` changes. One that no
    longer may fill leaves the set only at the next filling's setup (:func:`_purge`): an engine's
    flow drains and its next DMA, on the same routes, starts a few cycles later, and its resources
    would leave the set and join it again between two sharings, each time with every flow's entry
    there (session 61). So the set holds every resource that may fill, and between fillings perhaps
    others: what reads it between fillings asks :func:`_fills` instead."""
    if mf.mpos[l] < 0 and _fills(mf, l):
        _member_add(mf.mfl, mf.mpos, mf.sc, S_NMF, l)
        mf.sc[S_JOINS] += 1
        for q in range(mf.row[l], mf.row[l] + mf.rn[l]):  # its flows' entries on it join theirs
            _entry_in(mf, mf.rl[q], mf.rk[q], l)


@njit(cache=True, _nrt=False, inline="always")
def _purge(mf):
    """The resources in the set that no longer may fill leave it (:func:`_may_fill`), their flows'
    entries there with them: after it the set is exactly those that may fill."""
    i = mf.sc[S_NMF] - 1
    while i >= 0:  # backwards: a leaving member's place takes the last, already seen
        l = mf.mfl[i]
        if not _fills(mf, l):
            _member_drop(mf.mfl, mf.mpos, mf.sc, S_NMF, l)
            for q in range(mf.row[l], mf.row[l] + mf.rn[l]):  # its flows' entries on it leave theirs
                _entry_out(mf, mf.rl[q], mf.rk[q])
        i -= 1


@njit(cache=True, _nrt=False, inline="always")
def _entry_in(mf, f, k, l):
    """Entry ``k`` of flow ``f`` (on resource ``l``, which may fill) joins the flow's entries on
    the resources that may fill (what the filling reads)."""
    m = mf.ln[f]
    mf.lres[f, m] = l
    mf.lcoef[f, m] = mf.e_coef[f, k]
    mf.lk[f, m] = k
    mf.lslot[f, k] = m
    mf.ln[f] = m + 1


@njit(cache=True, _nrt=False, inline="always")
def _entry_out(mf, f, k):
    """Entry ``k`` of flow ``f`` leaves them (the flow's last such entry takes its place)."""
    m = mf.lslot[f, k]
    last = mf.ln[f] - 1
    if m != last:
        kk = mf.lk[f, last]
        mf.lres[f, m] = mf.lres[f, last]
        mf.lcoef[f, m] = mf.lcoef[f, last]
        mf.lk[f, m] = kk
        mf.lslot[f, kk] = m
    mf.ln[f] = last


@njit(cache=True, _nrt=False, inline="always")
def _list_add(mf, holds, f, k, l):
    """Entry ``k`` of flow ``f`` (resource ``l``) joins ``l``'s list, live (:func:`_live_in`)."""
    n = mf.rn[l]
    q = mf.row[l] + n
    mf.rl[q] = f
    mf.rk[q] = k
    mf.eslot[f, k] = n
    mf.rn[l] = n + 1
    _live_in(mf, holds, f, k, l, True)


@njit(cache=True, _nrt=False, inline="always")
def _live_in(mf, holds, f, k, l, fresh):
    """Entry ``k`` of flow ``f``, listed at resource ``l``, is live: its sums take it (and ``l`` the
    touched ones, with its capacity less the messages holding it now); ``fresh``: it was just listed
    (else it was parked there, and its place among the flow's entries on the resources that may fill
    was kept: :func:`_park`)."""
    n = mf.rv[l]
    if n == 0:
        _member_add(mf.tl, mf.tpos, mf.sc, S_NTOUCH, l)
        mf.ceff[l] = _ceff(mf, holds, l)
    mf.rv[l] = n + 1
    if n == 0:  # flows cross it now: its load by messages and mice joins the memo key
        _key_res(mf, holds, l)
    mf.A0[l] += mf.e_coef[f, k]
    mf.B0[l] += mf.e_coef[f, k] * mf.fcap[f]
    if mf.mpos[l] >= 0:  # it may fill already: the entry joins the flow's entries there
        if fresh:
            _entry_in(mf, f, k, l)
    else:  # it may join the set now (with every listed flow's entry on it)
        _may_fill(mf, l)


@njit(cache=True, _nrt=False, inline="always")
def _park(mf, f):
    """Flow ``f`` drained: its entries leave its resources' sums but stay listed, parked (rate 0 and
    frozen: what reads a list skips them), until its engine's next DMA, which mostly takes the same
    entries (:func:`memflow_go`) and so lists nothing anew; another DMA's, or a mouse's, evicts them
    first (:func:`_evict`). A parked entry keeps its place among the flow's entries on the resources
    that may fill (``lres``; the set's joins and leaves keep them, as a live flow's). The rates are
    those the lists without parked entries give, but the lists' order differs, so a filling's sums may
    differ in their last bits (session 61)."""
    _park_sums(mf, f)
    mf.rate[f] = 0.0
    mf.frozen[f] = 1
    mf.parked[f] = 1


@njit(cache=True, _nrt=False, inline="always")
def _park_sums(mf, f):
    """Flow ``f``'s entries leave their resources' sums (:func:`_park`)."""
    for k in range(mf.e_n[f]):
        l = mf.e_res[f, k]
        n = mf.rv[l] - 1
        mf.rv[l] = n
        mf.A0[l] -= mf.e_coef[f, k]
        mf.B0[l] -= mf.e_coef[f, k] * mf.fcap[f]
        if n == 0:  # untouched now: the last touched resource takes its place (its sum starts anew)
            mf.mk[1] -= mf.hc[l]  # and its load leaves the memo key
            mf.hc[l] = 0
            mf.A0[l] = 0.0
            mf.B0[l] = 0.0
            _set_eta(mf, l, 1.0)  # and its head-of-line share, read again from the next flows' mix
            _member_drop(mf.tl, mf.tpos, mf.sc, S_NTOUCH, l)


@njit(cache=True, _nrt=False, inline="always")
def _owe(mf, due):
    """A change owes the next sharing, due at cycle ``due`` at the latest."""
    mf.sc[S_OWED] += 1
    if due < mf.sc[S_DUE]:
        mf.sc[S_DUE] = due


@njit(cache=True, _nrt=False, inline="always")
def _defer_park(mf, f, due):
    """Flow ``f`` drained within a sharing period (``SHARE_PERIOD``): parked as :func:`_park` says,
    but its entries stay in their resources' sums until the next sharing (:func:`_flush`), holding
    the bandwidth it drained at (``orate``) for its engine's next DMA: if that DMA starts on the
    same entries before then, it resumes that rate (:func:`memflow_go`) and nothing moves."""
    mf.orate[f] = mf.rate[f]
    mf.rate[f] = 0.0
    mf.frozen[f] = 1
    mf.parked[f] = 1
    if mf.pend[f] == 0:  # (2: listed already, resumed since)
        mf.pl[mf.sc[S_NPEND]] = f
        mf.sc[S_NPEND] += 1
    mf.pend[f] = 1
    _owe(mf, due)


@njit(cache=True, _nrt=False, inline="always")
def _settle(mf, f):
    """Flow ``f``'s deferred park (:func:`_defer_park`), if any, takes its entries out of the sums now."""
    if mf.pend[f] == 1:
        _park_sums(mf, f)
        mf.pend[f] = 2


@njit(cache=True, _nrt=False, inline="always")
def _flush(mf):
    """Every deferred park takes its entries out of the sums (a sharing's first step): the sums are
    then the active flows' alone."""
    for i in range(mf.sc[S_NPEND]):
        f = mf.pl[i]
        _settle(mf, f)
        mf.pend[f] = 0
    mf.sc[S_NPEND] = 0


@njit(cache=True, _nrt=False, inline="always")
def _evict(mf, f):
    """Flow ``f``'s parked entries leave their resources' lists (the last of a list takes its place),
    and its entries on the resources that may fill go with them."""
    for k in range(mf.e_n[f]):
        l = mf.e_res[f, k]
        n = mf.rn[l] - 1
        i = mf.eslot[f, k]
        last = mf.row[l] + n
        g, kg = mf.rl[last], mf.rk[last]
        mf.rl[mf.row[l] + i] = g
        mf.rk[mf.row[l] + i] = kg
        mf.eslot[g, kg] = i
        mf.rn[l] = n
    mf.ln[f] = 0
    mf.parked[f] = 0


@njit(cache=True, _nrt=False, inline="always")
def _set_eta(mf, l, e):
    """Mesh link ``l``'s head-of-line share is ``e`` (the list of links off 1 follows)."""
    mf.eta[l] = e
    p = mf.xpos[l]
    if e != 1.0:
        if p < 0:
            _member_add(mf.xl, mf.xpos, mf.sc, S_NX, l)
    elif p >= 0:
        _member_drop(mf.xl, mf.xpos, mf.sc, S_NX, l)


@njit(cache=True, _nrt=False, inline="always")
def _ceff(mf, holds, l):
    """What the flows may use of resource ``l``: its width less the messages holding it (``holds``
    covers the links and ports; the memory lanes beyond carry no message), times its ``eta``, less
    the mice running across it (``mload``)."""
    c = mf.rcap[l] - holds[l] if l < holds.shape[0] else mf.rcap[l]
    return max(0.0, c * mf.eta[l] - mf.mload[l]) if c > 0.0 else 0.0


@njit(cache=True, _nrt=False, inline="always")
def _mix(x):
    """A 64-bit mix of ``x`` (SplitMix64's finalizer): keys summed from mixes rarely collide."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True, _nrt=False, inline="always")
def _key_res(mf, holds, l):
    """Resource ``l``'s part of the memo key (``mk[1]``): the messages holding it and the mice's load
    on it, while flows cross it; call wherever ``holds[l]``, ``mload[l]`` or whether flows cross ``l``
    may have changed (nothing to do with the memo off)."""
    if mf.prm[P_MEMO] == 0:
        return
    h = holds[l] if l < holds.shape[0] else 0
    new = np.uint64(0)
    if mf.rv[l] > 0 and (h > 0 or mf.mload[l] > 0.0):  # the mice's load in 2^-20 flit steps
        new = _mix(np.uint64(l) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(h) * np.uint64(0x632BE59BD9B4E019)
                   + np.uint64(np.int64(np.round(mf.mload[l] * 1048576.0))))
    mf.mk[1] += new - mf.hc[l]
    mf.hc[l] = new


@njit(cache=True, _nrt=False, inline="always")
def _memo_key(mf):
    """The key of the state a sharing starts from (never 0, an empty entry's)."""
    return _mix(mf.mk[0] ^ _mix(mf.mk[1] + np.uint64(0x2545F4914F6CDD1D))) | np.uint64(1)


@njit(cache=True, _nrt=False)
def _memo_get(mf, holds, key, nact):
    """Give the sharing of the state ``key`` (``nact`` active flows) the rates and links' ``eta``
    remembered for it, if they still are (its entry not overwritten in the table or the ring);
    returns whether it did. Each touched mesh link takes the remembered ``eta`` (1 if none was kept),
    its ``ceff`` and membership of the set that may fill following."""
    slot = np.int64(key & np.uint64(mf.mt_key.shape[0] - 1))
    if mf.mt_key[slot] != key or mf.mt_nf[slot] != nact:
        return False
    off = mf.mt_off[slot]
    m = mf.ma_i.shape[0]
    if off < mf.sc[S_MEMO_WPOS] - m:  # its pairs were overwritten
        return False
    mask = m - 1
    for i in range(nact):
        p = (off + i) & mask
        mf.rate[mf.ma_i[p]] = mf.ma_v[p]
    mf.sc[S_MEMO_HITS] += 1
    stamp = mf.sc[S_MEMO_HITS]
    end = off + nact + mf.mt_nl[slot]
    for i in range(off + nact, end):
        mf.mst[mf.ma_i[i & mask]] = stamp
    i = mf.sc[S_NX] - 1
    while i >= 0:  # links off 1 now that are at 1 in the state remembered (backwards: a removal moves the last here)
        l = mf.xl[i]
        if mf.mst[l] != stamp:
            _set_eta(mf, l, 1.0)
            mf.ceff[l] = _ceff(mf, holds, l)
            _may_fill(mf, l)
        i -= 1
    for i in range(off + nact, end):
        l = mf.ma_i[i & mask]
        e = mf.ma_v[i & mask]
        if e != mf.eta[l]:
            _set_eta(mf, l, e)
            mf.ceff[l] = _ceff(mf, holds, l)
            _may_fill(mf, l)
    if mf.mt_peak[slot] > mf.fsc[F_PEAK_LOAD]:
        mf.fsc[F_PEAK_LOAD] = mf.mt_peak[slot]
    return True


@njit(cache=True, _nrt=False)
def _memo_put(mf, key, nact, peak):
    """Remember the sharing just solved for the state ``key``: its ``nact`` flows' rates and the touched
    mesh links' ``eta`` other than 1 (appended to the ring), and the peak load it left."""
    nlk = mf.sc[S_NX]
    m = mf.ma_i.shape[0]
    if nact + nlk > m:
        return
    off = mf.sc[S_MEMO_WPOS]
    mask = m - 1
    for i in range(nact):
        f = mf.act[i]
        mf.ma_i[(off + i) & mask] = f
        mf.ma_v[(off + i) & mask] = mf.rate[f]
    for i in range(nlk):
        l = mf.xl[i]
        mf.ma_i[(off + nact + i) & mask] = l
        mf.ma_v[(off + nact + i) & mask] = mf.eta[l]
    mf.sc[S_MEMO_WPOS] = off + nact + nlk
    slot = np.int64(key & np.uint64(mf.mt_key.shape[0] - 1))
    mf.mt_key[slot] = key
    mf.mt_off[slot] = off
    mf.mt_nf[slot] = nact
    mf.mt_nl[slot] = nlk
    mf.mt_peak[slot] = peak


@njit(cache=True, _nrt=False)
def _slot_loads(mf, res):
    """``hso[res, s]`` / ``hsi[res, s]``: the flits a cycle the flows crossing resource ``res`` put on
    output / input slot ``s`` at their current rates (their entries' flits by slot for the whole DMA,
    ``e_tout`` and ``e_tin``, taken per byte), walked once while ``sc[S_LOADS_STAMP]`` stands."""
    stamp = mf.sc[S_LOADS_STAMP]
    if mf.hls[res] == stamp:
        return
    mf.hls[res] = stamp
    for s in range(NSLOT):
        mf.hso[res, s] = 0.0
        mf.hsi[res, s] = 0.0
    for q in range(mf.row[res], mf.row[res] + mf.rn[res]):
        f = mf.rl[q]
        x = mf.rate[f]
        if x > 0.0:  # (parked entries stand at 0)
            k = mf.rk[q]
            inv = mf.binv[f]
            for s in range(NSLOT):
                mf.hso[res, s] += x * (mf.e_tout[f, k, s] * inv)
                mf.hsi[res, s] += x * (mf.e_tin[f, k, s] * inv)


@njit(cache=True, _nrt=False)
def _hol_link(mf, l):
    """``eta`` of mesh link ``l`` at the flows' current rates (:mod:`npusim.hw.noc.hol`): its flits'
    loads by the output they take at the router ``D`` it feeds and, at each of those outputs, the
    loads of ``D``'s input slots (from the outputs' flow lists)."""
    nl, nr = mf.prm[P_NLINKS], mf.prm[P_NR]
    D = mf.lhead[l]
    sp = mf.lslot_in[l]
    _slot_loads(mf, l)
    n = 0
    for s in range(NSLOT):  # the outputs it uses, compacted
        if mf.hso[l, s] > 0.0:
            mf.hlam[n] = mf.hso[l, s]
            mf.hres[n] = nl + D if s == SLOT_EJ else (nl + nr + D if s == SLOT_MEM else mf.olink[D, s])
            n += 1
    if n == 0:
        return mf.eta[l]
    mf.hcap[SLOT_LANES] = mf.rcap[nl + 3 * nr + D]  # the memory lanes request in parallel
    stamp = mf.sc[S_HOL_STAMP]
    for j in range(n):
        o = mf.hres[j]
        if mf.hstamp[o] != stamp:  # the output's requests, solved once a pass for every input feeding it
            _slot_loads(mf, o)
            mf.hU[o] = settled_requests(mf.hsi[o], mf.hcap, mf.rcap[o], mf.hu[o])
            mf.hstamp[o] = stamp
        mf.hN[j] = others_from(mf.hu[o], mf.hU[o], sp, mf.rcap[o])
    return port_eta(mf.hlam, mf.hN, n, mf.ht)


@njit(cache=True, _nrt=False)
def _hol_update(mf, holds):
    """Each mesh link that may fill takes the ``eta`` of its port at the current rates
    (:func:`_hol_link`); returns how many moved by more than ``HOL_TOL`` (their ``ceff`` and
    membership of the set that may fill follow; the others keep theirs, so ``ceff`` is always what
    the last filling used)."""
    nl = mf.prm[P_NLINKS]
    nchg = 0
    mf.sc[S_HOL_STAMP] += 1  # the rates moved since the last pass: every output's requests anew
    mf.sc[S_LOADS_STAMP] += 1  # and every resource's loads
    for i in range(mf.sc[S_NMF]):
        l = mf.mfl[i]
        if l >= nl:
            continue
        e = _hol_link(mf, l)
        if abs(e - mf.eta[l]) > HOL_TOL * mf.eta[l]:
            mf.hchg[nchg] = l
            mf.heta[nchg] = e
            nchg += 1
    for i in range(nchg):
        l = mf.hchg[i]
        _set_eta(mf, l, mf.heta[i])
        mf.ceff[l] = _ceff(mf, holds, l)
        _may_fill(mf, l)
    return nchg


@njit(cache=True, _nrt=False)
def memflow_note(mf, holds, changed):
    """Path-model messages claimed or released links (``changed``: the link's id + 1, or -1 if
    several changed): the touched resources' capacities (``ceff``) and the set that may fill follow
    ``holds``. Returns 1 if a rate may move, else 0: no flow crosses the link, its capacity is
    unchanged, it can fill neither before nor after (such a resource never binds, see
    :func:`memflow_update`), or it was claimed and every flow crossing it stands already (rate 0:
    held back elsewhere)."""
    if changed < 0:  # several: read every touched resource again
        for i in range(mf.sc[S_NTOUCH]):
            l = mf.tl[i]
            _key_res(mf, holds, l)
            mf.ceff[l] = _ceff(mf, holds, l)
            _may_fill(mf, l)
        return 1
    l = changed - 1
    if mf.rv[l] == 0:  # no flow crosses it (its capacity is read when one does)
        return 0
    _key_res(mf, holds, l)
    c = _ceff(mf, holds, l)
    if c == mf.ceff[l]:  # what the set and the last solve used
        return 0
    if c == 0.0:  # a claim: its flows stop; nothing changes if they all stand already
        idle = True
        for q in range(mf.row[l], mf.row[l] + mf.rn[l]):
            if mf.rate[mf.rl[q]] > 0.0:
                idle = False
                break
        if idle:  # the next update reads its capacity again (a release before then changes nothing)
            if mf.stale[l] == 0:
                mf.stale[l] = 1
                mf.stl[mf.sc[S_NSTALE]] = l
                mf.sc[S_NSTALE] += 1
            return 0
    was = _fills(mf, l)
    mf.ceff[l] = c
    _may_fill(mf, l)
    return 1 if was or _fills(mf, l) else 0


@njit(cache=True, _nrt=False)
def memflow_poke(mf, holds, heap, hs, now, changed):
    """A path-model message claimed or released a link (``changed``: its id + 1, or -1 if several
    changed): note it (:func:`memflow_note`) and share the links again at this cycle, unless no
    rate can move. Skipping those is exact: the solve's inputs that matter are the same."""
    if mf.sc[S_NACT] == 0:
        return
    if memflow_note(mf, holds, changed) == 0:
        mf.sc[S_SKIPPED] += 1
        return
    _share_now(mf, heap, hs, now)


@njit(cache=True, _nrt=False)
def memflow_update(mf, holds, heap, hs, version, now, parts):
    """``EV_MFLOW_UPDATE``: end the flows that drained, share the links among the rest, schedule
    the next end (with ``SHARE_PERIOD``, an update that only ends drained flows within the period of
    the last sharing shares nothing: the next update is then due at the next end or the period's
    end). If a drained flow's part ends this very cycle (at its cap: no round trip left)
    and is its DMA's last (``parts[f]``: the DMA's parts pending, :mod:`npusim.sim.mempath`), the
    sharing waits for a second update later in the cycle, after the DMAs that end then and the ones
    that start after them: one sharing for both, exactly, since no byte moves within a cycle.
    ``holds[l]``: path-model messages holding link or port ``l`` now (its capacity is
    theirs while they do). ``fsc[F_PEAK_LOAD]`` keeps the highest load / capacity left by the
    messages seen. Cost: O(entries of the flows on the resources that may fill, the kept set
    ``mfl``) to set up (while no resource has filled yet, also O(resources the flows cross), for
    the peak load), then the filling (:func:`npusim.hw.maxmin.fill`: per round O(the resources
    that may fill + flows), and O(entries) of the flows frozen before the last round), then O(active
    flows) for the next end.

    Only resources that may fill take part in the filling: one whose flows would load it to at most
    ``ROOM`` of its capacity even all at their caps (``B0[l] = sum_f a_fl cap_f``, kept as flows
    start and end) is left out. Exact: in every round such a resource's ``R/A`` exceeds the cap
    headroom ``cap_f - level`` of one of its unfrozen flows by at least ``(1 - ROOM) c``, so it is
    never the round's minimum and never freezes a flow (the filling's tolerance freezes within
    ``1e-9 c``): the rates are the same bits. A flow that crosses none of the resources left in
    runs at its cap (the filling would freeze it there, within its tolerance ``1e-9``), and the
    filling takes a frozen flow's load off the sums of the resources in it only (each sum loses its
    flows in the same order: the same bits)."""
    if version != mf.sc[S_VERSION]:
        return  # superseded
    now_asked = mf.sc[S_PENDING] != 0  # a change at this cycle asked for it (else: a drain, or a period's end)
    mf.sc[S_PENDING] = 0
    mf.sc[S_NEXT_T] = -1
    mf.sc[S_UPDATES] += 1
    _advance(mf, now)
    n = mf.sc[S_NACT]
    j = 0
    ends_now = False
    moved = False  # a drained flow shared a resource with a live one: the others' rates may move
    q = mf.prm[P_SHARE_PERIOD]
    for i in range(n):  # keep start order: compact in place
        f = mf.act[i]
        if mf.rem[f] < 0.5:
            x = mf.rate[f] / mf.fcap[f]
            extra = np.int64(np.ceil(mf.rtt[f] * (1.0 - x))) if x < 1.0 else np.int64(0)
            ends_now |= extra == 0 and parts[f] == 1  # the DMA's last part: it ends now
            event_push(heap, hs, now + extra, EV_NOC_PART_END, f)
            mf.mk[0] -= mf.fsig[f]  # 0 when the memo is off
            mf.fsig[f] = 0
            alone = mf.prm[P_ALONE] != 0 and _alone(mf, holds, f)
            moved |= not alone
            if q > 0 and not alone:  # its park waits for the next sharing: its engine's next DMA may resume its rate
                _defer_park(mf, f, now + q)
            else:  # (alone, what it leaves no other flow can use: nothing to hold, no sharing owed)
                _park(mf, f)
            mf.tdrain[f] = now
        else:
            mf.act[j] = f
            mf.frozen[f] = 0
            j += 1
    mf.sc[S_NACT] = j
    if j == 0:
        return
    if q == 0 and n > j and not moved and not now_asked and mf.sc[S_NSTALE] == 0:
        # only flows alone drained: no rate moves (with SHARE_PERIOD they owe nothing: the branch below)
        mf.sc[S_ALONE_END] += 1
        t = _next_drain(mf, now)
        if t < NEVER:
            _schedule(mf, heap, hs, t)
        return
    if q > 0 and not now_asked and mf.sc[S_NSTALE] == 0 and now < mf.sc[S_DUE]:
        # SHARE_PERIOD: no sharing owed (every drained flow resumed), or not yet due; the rest keep their
        # rates (no resource carries more for it) until the next sharing
        mf.sc[S_UNSHARED] += 1
        t = min(_next_drain(mf, now), mf.sc[S_DUE])
        if t < NEVER:
            _schedule(mf, heap, hs, t)
        return
    if ends_now:  # a flow's part ends this cycle: its engine's next DMA may start now, share once with it
        mf.sc[S_DEFERRED] += 1
        _share_now(mf, heap, hs, now)
        return
    mf.sc[S_TSHARE] = now
    _flush(mf)
    mf.sc[S_OWED] = 0
    mf.sc[S_DUE] = NEVER
    for i in range(mf.sc[S_NSTALE]):  # links claimed with their flows standing: their capacity now
        l = mf.stl[i]
        mf.stale[l] = 0
        if mf.rv[l] > 0:
            mf.ceff[l] = _ceff(mf, holds, l)
            _may_fill(mf, l)
    mf.sc[S_NSTALE] = 0
    memo = mf.prm[P_MEMO] != 0
    key = _memo_key(mf) if memo else np.uint64(0)
    if memo and _memo_take(mf, holds, heap, hs, key, j, now):  # a state seen before: its rates (MEMO_SLOTS)
        return
    # share the links; with the head-of-line coupling, again while the links' eta move (each filling
    # uses the eta the previous one left: the rates are always those of one filling on ``ceff``)
    iters = max(np.int64(1), mf.prm[P_HOL])
    if iters > 1 and mf.prm[P_HOL_PERIOD] > 0:  # the last pass's eta still good: one filling on them
        if mf.sc[S_HOL_STAMP] > 0 and now - mf.sc[S_HOL_LAST] < mf.prm[P_HOL_PERIOD]:
            iters = 1
            mf.sc[S_HOL_HELD] += 1
            if memo:  # a sharing on this very pass's eta, remembered under the state and the pass
                key = _mix(key ^ (np.uint64(mf.sc[S_HOL_STAMP]) * np.uint64(0xD1B54A32D192ED03))) | np.uint64(1)
                if _memo_take(mf, holds, heap, hs, key, j, now):
                    return
        else:
            mf.sc[S_HOL_LAST] = now
    for it in range(iters):
        if it > 0:
            for i in range(j):
                mf.frozen[mf.act[i]] = 0
        nt = mf.sc[S_NTOUCH]
        nlv = 0
        _purge(mf)
        nmf = mf.sc[S_NMF]
        for i in range(nmf):  # each resource that may fill (the kept set): its capacity now, its flows
            l = mf.mfl[i]
            mf.R[l] = mf.ceff[l]
            mf.A[l] = mf.A0[l]
            mf.cnt[l] = mf.rv[l]  # its unfrozen flows: the parked ones stay frozen
            mf.live[nlv] = l
            nlv += 1
        nout = 0  # resources left out whose load may be the highest yet (fsc[F_PEAK_LOAD] only grows)
        peak = mf.fsc[F_PEAK_LOAD]
        visited = nmf
        if peak < ROOM:  # a resource left out is loaded below ROOM of its capacity: only then may it set the peak
            visited += nt
            for i in range(nt):
                l = mf.tl[i]
                if mf.mpos[l] < 0 and mf.B0[l] > peak * mf.ceff[l]:
                    mf.outl[nout] = l
                    nout += 1
        nin = 0
        for i in range(j):  # a flow crossing no resource that may fill runs at its cap: only the others fill
            f = mf.act[i]
            if mf.ln[f] == 0:
                mf.rate[f] = mf.fcap[f]
            else:
                mf.fin[nin] = f
                nin += 1
        mf.sc[S_SOLVED] += nin
        mf.sc[S_SOLVED_RES] += nlv
        mf.sc[S_CROSSED] += nt
        mf.sc[S_VISITED] += visited
        # the filling reads a flow's entries only to take a frozen flow's load off the sums: those on the
        # resources in it suffice (each resource's sum loses its flows in the same order: the same bits)
        if nin > 0:
            mf.sc[S_ROUNDS] += fill(nin, mf.fin, mf.ln, mf.lres, mf.lcoef, mf.fcap, mf.ceff, mf.rate, mf.A, mf.R,
                                    mf.cnt, mf.row, mf.rn, mf.rl, mf.live, nlv, mf.frozen, mf.fz, 1e-9)
        if it + 1 == iters or _hol_update(mf, holds) == 0:
            break
        mf.sc[S_HOL_FILLS] += 1
    for i in range(nlv):
        l = mf.live[i]
        c = mf.ceff[l]  # what the flows may use: the width less the messages holding it
        if c > 0.0:
            v = (c - mf.R[l]) / c
            if v > peak:
                peak = v
    for i in range(nout):  # the resources left out of the filling: their load, where it may be the peak
        l = mf.outl[i]
        c = mf.ceff[l]
        if mf.B0[l] > peak * c:
            load = 0.0
            for q in range(mf.row[l], mf.row[l] + mf.rn[l]):
                load += mf.e_coef[mf.rl[q], mf.rk[q]] * mf.rate[mf.rl[q]]
            if load > peak * c:
                peak = load / c
    mf.fsc[F_PEAK_LOAD] = peak
    if memo:  # remember it (a sharing on a held pass's eta under a key of its own: that eta is the pass's, not the state's)
        _memo_put(mf, key, j, peak)
    t = _next_drain(mf, now)
    if t < NEVER:  # else no flow can move: the engine reports the tasks that wait (no progress)
        _schedule(mf, heap, hs, t)


@njit(cache=True, _nrt=False, inline="always")
def _memo_take(mf, holds, heap, hs, key, nact, now):
    """The sharing remembered under ``key`` (:func:`_memo_get`), if any, and the next update for it;
    returns whether there was one."""
    if not _memo_get(mf, holds, key, nact):
        return False
    t = _next_drain(mf, now)
    if t < NEVER:
        _schedule(mf, heap, hs, t)
    return True


@njit(cache=True, _nrt=False, inline="always")
def _next_drain(mf, now):
    """The cycle the first active flow drains at its rate (``NEVER`` if none moves)."""
    nxt = np.inf
    for i in range(mf.sc[S_NACT]):
        f = mf.act[i]
        r = mf.rate[f]
        if r > 0.0:
            t = mf.rem[f] / r
            if t < nxt:
                nxt = t
    return now + max(np.int64(1), np.int64(np.ceil(nxt))) if nxt < np.inf else NEVER


__all__ = ["EV_MFLOW_UPDATE", "EV_MOUSE_END", "MemFlows", "memflow_add", "memflow_go", "memflow_note", "memflow_poke",
           "memflow_mouse_end", "memflow_update", "new_memflows"]
