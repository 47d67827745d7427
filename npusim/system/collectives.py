"""Collectives across dies and NPUs, built as system tasks (fabric transfers + reductions).

``ranks`` is an ordered list of endpoint vertex ids; ``nbytes`` follows the nccl-tests
convention: the per-rank buffer of all-reduce and reduce-scatter (input), the output of
all-gather (each rank contributes ``nbytes / n``), what each rank sends in all-to-all
(``nbytes / n`` to every rank), the broadcast buffer. Bus bandwidth is nccl-tests' ``algbw x
factor`` (all-reduce ``2(n-1)/n``; all-gather, reduce-scatter, all-to-all ``(n-1)/n``; else 1).

Algorithms:

* ``ring`` all-reduce = ring reduce-scatter + ring all-gather: ``2(n-1)`` steps of
  ``nbytes / n`` chunks; a step's send waits for the previous step's receive (and reduction);
* ``halving_doubling`` all-reduce (recursive halving reduce-scatter + recursive doubling
  all-gather): ``2 log2 n`` steps; ``n`` must be a power of two;
* ``hierarchical`` all-reduce: ring reduce-scatter inside each node, ring all-reduce of the
  shards across nodes among the ranks of equal local index, ring all-gather inside each node
  (all nodes must hold the same number of the ranks);
* all-gather / reduce-scatter: ring;
* ``double_ring`` all-gather / reduce-scatter (HCCL's ``AlignedAllGatherDoubleRingFor91093`` /
  ``AlignedReduceScatterDoubleRingFor91093`` executors, the A3 server's large-message algorithms): two
  rings at once, one over the ranks in their order and one over them reversed, each carrying half of
  every rank's chunk in ``n - 1`` steps. With the ranks in die order (the two dies of a package side
  by side), each die receives one ring's traffic from its package sibling over the die-to-die link
  and the other's over the fabric: half the fabric traffic of the one-shot mesh;
* when no algorithm is given, HCCL's choice (:func:`_hccl_default`): ranks that are dies of one node
  run ``direct``, except an all-gather or reduce-scatter on a node of two-die packages (an A3 server)
  above the size HCCL keeps its one-shot mesh for (:data:`HCCL_A3_MESH_MAX_BYTES`), which runs
  ``double_ring``;
* ``direct`` all-reduce, reduce-scatter and all-gather (the one-shot "mesh" algorithms of
  fully connected servers, e.g. HCCL's on an 8-NPU HCCS mesh): reduce-scatter as every rank
  writing chunk ``j`` (``nbytes / n``) straight to rank ``j``, which adds the ``n - 1`` chunks it
  receives; all-gather as every rank writing its chunk to every other rank; all-reduce is the
  one then the other. Every link of a full mesh carries traffic at once, in two steps;
* all-to-all ``direct``: every rank writes its ``nbytes / n`` chunk to every other rank, all at
  once, destinations in the staggered order ``i+1, i+2, ...`` (SDMA transfers then queue on the
  engines in that order); ``hierarchical``: an intra-node all-to-all that gathers, on the rank
  of local index ``l``, everything bound for local index ``l`` of other nodes, then an inter-node
  all-to-all among ranks of equal local index;
* broadcast: binomial tree from the first rank; send/recv: first rank writes to the second.

**HCCL's per-step synchronisation** (``sync=True``, the default): HCCL builds a collective from
memory-copy tasks and Notify Record / Notify Wait synchronisation tasks between the ranks' streams
(Ascend HCCL user guide, "通信算子执行": a synchronisation task writes a 4-byte notify register; its
RDMASend carries 4 bytes). Each transfer of a step is therefore three transfers on the fabric:
the receiver tells the sender its buffer is free (a :data:`NOTIFY_BYTES` write to the sender,
after the receiver's previous step), the sender copies the chunk (after its own previous step and
that notify), then records the notify at the receiver (a :data:`NOTIFY_BYTES` write after the
copy); the receiver's step (and its reduction) waits for that notify. Each notify costs what a
4-byte write costs on the fabric -- its fixed per-transfer overhead and route latency, calibrated
on the CloudMatrix384 paper's Table 1 in the fabric presets -- so no constant is added here. A notify
is a task of its stream, not a memory copy: it holds no SDMA engine (``via="notify"``,
:class:`~npusim.system.simulator.SystemSim`), so it never waits behind another stream's copy (until
session 43 it took the next SDMA engine in turn and could queue behind a whole chunk's copy, which
roughly doubled a ring step when two rings ran at once).
``sync=False`` is the bare wire model (transfers only).

**HCCL's op-base buffers** (``sync=True``; the system's ``hccl`` section,
:class:`~npusim.system.schema.Hccl`): HCCL runs a collective out of its own CCL buffer, not the
user's (CANN HCCL user guide: single-operator mode copies the user's input into the CCL buffer and
the result back out). Each rank that is a die first copies its input into the CCL buffer and,
after the collective's last step, its output out of it: all-reduce ``nbytes`` in and out,
reduce-scatter ``nbytes`` in and ``nbytes / n`` out, all-gather ``nbytes / n`` in and ``nbytes`` out,
all-to-all ``nbytes`` both ways (broadcast and send/recv: no copies modelled). A copy is a local
SDMA task on the die's first copy engine lasting ``2 x bytes / (copy_efficiency x HBM peak)`` (read
and written once). The CCL buffer holds ``buffer_mb`` MiB (``HCCL_BUFFSIZE``); what one round must
hold is the larger of a rank's input and output (``nbytes`` for broadcast and send/recv), divided by
``n`` when every rank is a die of one server (SDMA; the torch_npu ``hccl_buffer_size`` guidance:
"pure SDMA: the larger message / rank size"), whole otherwise (RDMA). A collective that does not fit runs in ``ceil(share / buffer)`` rounds of
``nbytes / rounds``, one after another, each a whole collective with its own copies, handshakes and
steps: a message just over the buffer costs about two rounds' fixed costs. Not modelled here: the
host's launch of the collective (the runtime's, :mod:`npusim.system.execute`).
Known gap (session 47, not changed): HCCL's A3 double ring in op-base mode has no whole-message copy
phase -- in the all-gather the executor's ``DMAReduceFlag_`` makes the last step read straight into the
user's output and every other received slice is copied there by a local SDMA copy on a sub-stream
during the next step (hcomm ``aligned_all_gather_double_ring.cc`` ``PrepareDeviceMems``,
``LocalMemcpy``); the reduce-scatter likewise stages its input slice by slice on sub-streams
(``aligned_reduce_scatter_double_ring.cc`` ``MemcpyInitSlices``, ``LocalMemcpy``) and reduces inline in
its reads (``ReducerRun``); the ring transfers are reads of the previous rank's slice
(``RxAsyncMemcpy``), not writes. Modelled without the serial whole-message copies, the msModeling A3
rows above the AIV sizes would be 22-25% fast (all-gathers #98-#103, #113) and 34-38% fast
(reduce-scatters #104-#108, #114); with reads, 29-35% (all-gathers): the serial copies here stand in
for a per-step cost or ring rate (and the inline reduction's rate) that is not modelled -- no source
for them found yet.

Reductions run on the receiving die's ``compute`` queue for ``reduce_ps(bytes)`` picoseconds
(the caller supplies it from the chip cost model; 0 ignores reduction time).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from npusim.choices import SYSTEM_ALGORITHMS as ALGORITHMS
from npusim.choices import SYSTEM_COLLECTIVES as OPS
from npusim.errors import ConfigError
from npusim.system.work import WorkBuilder



@dataclass
class BuiltCollective:
    op: str
    algorithm: str
    ranks: list[int]
    bytes_per_rank: int
    done: int  # barrier task after which every rank holds its result
    per_rank: list[int] | None = None  # each rank's last task: after it, that rank holds its result
    rounds: int = 1  # HCCL's CCL-buffer rounds (module docstring)
    engine: str | None = None  # HCCL's expansion engine for its default choice on an A3 server (hccl_engine)

    def bus_factor(self) -> float:
        n = len(self.ranks)
        if n <= 1:
            return 0.0
        if self.op == "allreduce":
            return 2 * (n - 1) / n
        if self.op in ("allgather", "reducescatter", "alltoall"):
            return (n - 1) / n
        return 1.0


NOTIFY_BYTES = 4  # an HCCL notify record: a 4-byte write of the peer's notify register (HCCL user guide)

#: The largest per-rank message (bytes: HCCL's ``dataSize = count x unit size``, one rank's input of an
#: all-gather, one rank's output of a reduce-scatter) that HCCL runs as a one-shot mesh inside one A3
#: (910_93) server, by op-base expansion mode (``hccl.expansion``); above it, the server's double ring.
#: HCCL source (CANN open-source hccl, all_gather_operator.cc / reduce_scatter_operator.cc
#: ``SelectAlgfor91093``; hccl_aiv.h): AIV mode takes the AIV mesh executors up to
#: ``AIV_ALL_GATHER_A3_ENTRY_SIZE`` = 512 KiB and ``AIV_REDUCE_SCATTER_A3_ENTRY_SIZE`` = 1 MiB; host
#: mode takes the small-count mesh (``AllGatherSmallCount``, ``ReduceScatterDeterExecutor``) up to
#: ``HCCL_SMALL_COUNT_512_KB``; larger messages on a double-ring server topology go to the
#: ``...DoubleRingFor91093Executor`` s. Cited code constants, not calibrated.
#: Above the switch nothing else changes with size for one server's ranks in op-base mode (CANN hcomm
#: ``all_gather_operator.cc`` ``SelectAlgfor91093``, read at libochao-huawei/hcomm@84fcf61): the small-count
#: mesh needs at most 512 KiB per rank; the zero-copy executors need symmetric / zero-copy memory; the
#: mid-count, pipeline and ring-exchange executors more than one super pod; the semi-ring
#: (``IsSupportUnifiedMarch``) graph mode with AICPU unfolding; and the CCL buffer (200 MB) holds these
#: messages in one round (:func:`ccl_rounds`; even split over two rings and 8 ranks, 12.5 MiB each). The
#: all-gather therefore runs one executor from 512 KiB to several MiB per rank and its time only grows
#: with the message (tests/test_operator_collectives.py). What changes at the switch is the engine
#: (:func:`hccl_engine`): below it the AIV mesh kernel, above it, with ``HCCL_OP_EXPANSION_MODE=AIV`` on a
#: 910_93, the AI CPU's expansion of the double ring into SDMA and notify tasks. The msModeling report's
#: 8-die microbenchmark (published.yaml ``msmodeling-fork-comm-a3``, session 47 notes) jumps 5x there
#: (30.4 us at 465,920 B per rank, 155-171 us at 595,968-946,176 B) while its 16-die all-gathers of the
#: same AICPU double ring match this model within 15%, its own host-timed all-gather is slower at 768 KiB
#: than at 3.5 MiB, and the fork's latest runner changes its timing protocol at the same 512 KB (one
#: profiled iteration per session above, ten below; whether that runner produced these rows is not
#: stated). No figure for the AICPU engine's fixed cost is published (CANN's HCCL guide only calls it
#: large); those three rows are left unmodelled (sessions 45, 47).
HCCL_A3_MESH_MAX_BYTES = {"aiv": {"allgather": 512 * 1024, "reducescatter": 1024 * 1024},
                          "host": {"allgather": 512 * 1024, "reducescatter": 512 * 1024}}


def _a3_server(w: WorkBuilder, ranks: list[int], node_of) -> bool:
    """Every rank is a die of one node of two-die packages (an A3 server: HCCL's double-ring topology)."""
    topo = w.sim.topology
    return (node_of is not None and w.sim.system.npu.dies >= 2
            and all(topo.vertex_kind[r] == "die" for r in ranks) and len({node_of(r) for r in ranks}) == 1)


def hccl_engine(w: WorkBuilder, op: str, ranks: list[int], node_of, nbytes: int,
                expansion: str | None = None) -> str | None:
    """Where HCCL expands its default all-gather / reduce-scatter on an A3 server (``None`` for other ops
    and ranks): ``aiv``, the AIV mesh kernel, when the op-base expansion mode is ``aiv`` and the per-rank
    message is at most :data:`HCCL_A3_MESH_MAX_BYTES` (hcomm ``SelectAlgfor91093``: ``isAivSingleNode``);
    above it in that mode ``aicpu``: a 910_93 keeps its default AI CPU unfolding when
    ``HCCL_OP_EXPANSION_MODE`` is ``AIV`` (hcomm ``externalinput.cc`` ``ParseOpExpansion``), so the double
    ring's SDMA and notify tasks are issued by the AI CPU (CANN HCCL guide, "communication engines": AI
    CPU+TS, "static overhead large, unfriendly to small data", no figure). The schema's ``host`` mode
    stands for HCCL's non-AIV modes, whose default on a 910_93 (the variable unset) is the same AI CPU
    unfolding: ``aicpu`` at every size. A label of what runs: no engine changes the modelled time (no
    cited fixed cost of the AI CPU engine)."""
    if op not in ("allgather", "reducescatter") or not _a3_server(w, ranks, node_of):
        return None
    mode = expansion or w.sim.system.hccl.expansion
    return "aiv" if mode == "aiv" and _split(nbytes, len(ranks)) <= HCCL_A3_MESH_MAX_BYTES["aiv"][op] else "aicpu"


def _synced(w: WorkBuilder, src: int, dst: int, nbytes: int, via, src_deps: list[int], dst_deps: list[int],
            sync: bool) -> int:
    """One step's transfer ``src -> dst`` (vertex ids) with HCCL's handshake when ``sync`` (see the
    module docstring): the receiver's buffer-free notify (after ``dst_deps``), the copy (after
    ``src_deps`` and that notify), the done notify. Returns the task the receiver waits for."""
    if not sync:
        return w.transfer(src, dst, nbytes, "write", via, deps=src_deps)
    ack = w.transfer(dst, src, NOTIFY_BYTES, "write", "notify", deps=dst_deps)
    data = w.transfer(src, dst, nbytes, "write", via, deps=src_deps + [ack])
    return w.transfer(src, dst, NOTIFY_BYTES, "write", "notify", deps=[data])


def _hccl_default(w: WorkBuilder, op: str, ranks: list[int], node_of, nbytes: int = 0,
                  expansion: str | None = None) -> str:
    """The algorithm HCCL picks when none is given: inside one server (every rank a die of the same
    node: the node's dies reach each other directly, over an HCCS full mesh on Atlas 800 A2 or one
    UB switch level on CloudMatrix384) ``direct`` -- HCCL's server-internal algorithm is chosen by
    the hardware topology (Mesh, Ring, Double-Ring or Star; HCCL user guide, "集合通信算法"), and
    Mesh is the one for fully connected dies; otherwise the op's first algorithm (ring, direct
    all-to-all, binomial broadcast). On a node of two-die packages (an A3 server: HCCL's double-ring
    server topology) an all-gather or reduce-scatter whose per-rank message (``nbytes / n``) is above
    :data:`HCCL_A3_MESH_MAX_BYTES` (by ``expansion``, default the system's ``hccl.expansion``) runs
    ``double_ring``, as HCCL's ``SelectAlgfor91093`` does."""
    topo = w.sim.topology
    if (op in ("allreduce", "allgather", "reducescatter") and node_of is not None
            and all(topo.vertex_kind[r] == "die" for r in ranks) and len({node_of(r) for r in ranks}) == 1):
        mode = expansion or w.sim.system.hccl.expansion
        if (op in ("allgather", "reducescatter") and _a3_server(w, ranks, node_of)
                and _split(nbytes, len(ranks)) > HCCL_A3_MESH_MAX_BYTES[mode][op]):
            return "double_ring"
        return "direct"
    return ALGORITHMS[op][0]


def _ring_phase(w: WorkBuilder, ranks: list[int], chunk: int, ready: list[int], reduce_ps, via, steps: int | None = None,
                sync: bool = True):
    """``steps`` (default n-1) ring steps of ``chunk`` bytes; ``ready[i]``: what rank i's first send waits for.
    Returns each rank's last task."""
    n = len(ranks)
    last = list(ready)
    for _ in range(n - 1 if steps is None else steps):
        nxt = list(last)
        for i in range(n):
            dst = (i + 1) % n
            deps = [d for d in (last[i],) if d >= 0]
            t = _synced(w, ranks[i], ranks[dst], chunk, via, deps, [d for d in (last[dst],) if d >= 0], sync)
            if reduce_ps is not None:
                red_deps = [t] + ([last[dst]] if last[dst] >= 0 else [])
                t = w.compute(ranks[dst], reduce_ps(chunk), red_deps)
            elif last[dst] >= 0:
                t = w.barrier([t, last[dst]])
            nxt[dst] = t
        last = nxt
    return last


def _split(nbytes: int, n: int) -> int:
    return max(1, -(-nbytes // n))


def build_collective(w: WorkBuilder, op: str, ranks: list[int], nbytes: int, algorithm: str | None = None,
                     via: str | None = None, reduce_ps: Callable[[int], int] = lambda b: 0,
                     node_of: Callable[[int], int] | None = None, ready: list[int] | None = None,
                     sync: bool = True, expansion: str | None = None) -> BuiltCollective:
    """Record one collective into ``w`` (see module docstring); raises ConfigError for bad choices.
    ``ready[i]``: the task rank ``i`` must finish before it takes part (-1 or None: none).
    ``sync``: HCCL's notify handshake around every step's transfer (see the module docstring).
    ``expansion``: HCCL's op expansion mode for its algorithm choice (None: the system's ``hccl.expansion``)."""
    if op in ("allreduce", "reducescatter"):
        topo = w.sim.topology
        cpus = [topo.names[r] for r in ranks if topo.vertex_kind[r] != "die"]
        if cpus:
            raise ConfigError(f"--ranks: {op} reduces on the ranks' NPU dies; {', '.join(cpus[:3])} "
                              "is not a die (CPUs can take part in all-gather, all-to-all, broadcast, send/recv)")
    if op not in OPS:
        raise ConfigError(f"--op {op}: expected one of {', '.join(OPS)} (or dispatch, combine)")
    if expansion is not None and expansion not in HCCL_A3_MESH_MAX_BYTES:
        raise ConfigError(f"expansion {expansion!r}: expected one of {', '.join(HCCL_A3_MESH_MAX_BYTES)}")
    engine = None if algorithm else hccl_engine(w, op, ranks, node_of, nbytes, expansion)
    algorithm = algorithm or _hccl_default(w, op, ranks, node_of, nbytes, expansion)
    if algorithm not in ALGORITHMS[op]:
        raise ConfigError(f"--algorithm {algorithm}: {op} supports {', '.join(ALGORITHMS[op])}")
    if len(set(ranks)) != len(ranks):
        raise ConfigError("--ranks: a rank is listed twice")
    n = len(ranks)
    if n < 2:
        raise ConfigError(f"--ranks: {op} needs at least two ranks")
    start = [-1] * n if ready is None else [int(r) for r in ready]
    if len(start) != n:
        raise ValueError(f"ready: {len(start)} tasks for {n} ranks")
    hccl = w.sim.system.hccl if sync else None
    rounds = ccl_rounds(w, op, ranks, nbytes, node_of) if hccl is not None else 1
    piece = _split(nbytes, rounds)
    last = start
    for _ in range(rounds):
        last = _copies(w, ranks, _copy_bytes(op, piece, n)[0], last, hccl)
        last = _algorithm(w, op, algorithm, ranks, piece, last, reduce_ps, via, node_of, sync)
        last = _copies(w, ranks, _copy_bytes(op, piece, n)[1], last, hccl)
    done = w.barrier([t for t in last if t >= 0])
    return BuiltCollective(op, algorithm, list(ranks), nbytes, done, last, rounds, engine)


#: (bytes copied into the CCL buffer, bytes copied out) per rank, as a function of (nbytes, n)
_COPIES = {"allreduce": lambda b, n: (b, b), "reducescatter": lambda b, n: (b, _split(b, n)),
           "allgather": lambda b, n: (_split(b, n), b), "alltoall": lambda b, n: (b, b)}


def _copy_bytes(op: str, nbytes: int, n: int) -> tuple[int, int]:
    """What each rank copies into and out of the CCL buffer (module docstring); (0, 0): no copies."""
    return _COPIES[op](nbytes, n) if op in _COPIES else (0, 0)


def ccl_rounds(w: WorkBuilder, op: str, ranks: list[int], nbytes: int, node_of=None) -> int:
    """How many rounds HCCL's CCL buffer splits the collective into (module docstring)."""
    hccl = w.sim.system.hccl
    topo = w.sim.topology
    n = len(ranks)
    share = max(_copy_bytes(op, nbytes, n)) or nbytes  # the larger of input and output
    in_server = node_of is not None and all(topo.vertex_kind[r] == "die" for r in ranks) \
        and len({node_of(r) for r in ranks}) == 1
    if in_server:
        share = _split(share, n)
    return max(1, -(-share // int(hccl.buffer_mb * 2**20)))


def local_copy_ps(sim, nbytes: int) -> int:
    """A die's local SDMA copy of ``nbytes`` (read and written once at ``hccl.copy_efficiency`` of
    the die's HBM peak), picoseconds."""
    from npusim.arch.derived import summarize

    gbps = getattr(sim, "_hbm_gbps", None)
    if gbps is None:
        gbps = sim._hbm_gbps = summarize(sim.loaded.chip).hbm_bandwidth_gbps
    return int(round(2 * nbytes / (sim.system.hccl.copy_efficiency * gbps) * 1000))  # bytes / (GB/s) = ns


def _copies(w: WorkBuilder, ranks: list[int], nbytes: int, after: list[int], hccl) -> list[int]:
    """Each die rank's copy of ``nbytes`` between the user's buffer and the CCL buffer, after its
    ``after`` task; a rank that is not a die (or no copy) keeps its task."""
    if hccl is None or not hccl.user_buffer_copies or nbytes <= 0:
        return list(after)
    topo = w.sim.topology
    ps = local_copy_ps(w.sim, nbytes)
    return [w.compute(r, ps, [a] if a >= 0 else [], unit="sdma0") if topo.vertex_kind[r] == "die" else a
            for r, a in zip(ranks, after)]


def _algorithm(w, op, algorithm, ranks, nbytes, start, reduce_ps, via, node_of, sync) -> list[int]:
    """The collective's steps (one round of ``nbytes``), each rank from its ``start`` task; returns
    each rank's last task."""
    n = len(ranks)
    if op == "allreduce" and algorithm == "ring":
        chunk = _split(nbytes, n)
        last = _ring_phase(w, ranks, chunk, start, reduce_ps, via, sync=sync)
        last = _ring_phase(w, ranks, chunk, last, None, via, sync=sync)
    elif op == "allreduce" and algorithm == "halving_doubling":
        last = _halving_doubling(w, ranks, nbytes, reduce_ps, via, start, sync)
    elif op == "allreduce" and algorithm == "hierarchical":
        last = _hierarchical_allreduce(w, ranks, nbytes, reduce_ps, via, node_of, start, sync)
    elif op == "allreduce":
        last = _direct_phase(w, ranks, _split(nbytes, n), _direct_phase(w, ranks, _split(nbytes, n), start, reduce_ps,
                                                                           via, sync), None, via, sync)
    elif op in ("reducescatter", "allgather") and algorithm == "double_ring":
        last = _double_ring(w, ranks, _split(nbytes, n), start, via, sync)
    elif op in ("reducescatter", "allgather") and algorithm == "direct":
        last = _direct_phase(w, ranks, _split(nbytes, n), start, reduce_ps if op == "reducescatter" else None, via,
                             sync)
    elif op == "reducescatter":
        last = _ring_phase(w, ranks, _split(nbytes, n), start, reduce_ps, via, sync=sync)
    elif op == "allgather":
        last = _ring_phase(w, ranks, _split(nbytes, n), start, None, via, sync=sync)
    elif op == "alltoall" and algorithm == "direct":
        last = _alltoall_direct(w, ranks, np.full((n, n), _split(nbytes, n)), via, start, sync)
    elif op == "alltoall":
        last = _alltoall_hierarchical(w, ranks, _split(nbytes, n), via, node_of, start, sync)
    elif op == "broadcast":
        last = _binomial(w, ranks, nbytes, via, start, sync)
    else:  # send/recv: the first rank writes to the second
        sent = _synced(w, ranks[0], ranks[1], nbytes, via, [d for d in start[:1] if d >= 0],
                       [d for d in start[1:2] if d >= 0], sync)
        last = [sent] * 2
    return last


def _double_ring(w: WorkBuilder, ranks: list[int], chunk: int, ready: list[int], via, sync: bool = True):
    """Two rings at once over ``chunk`` bytes per rank (module docstring): the ranks in order and
    reversed, each ring ``n - 1`` steps of half the chunk. A rank's result is both rings' last task.
    A reduce-scatter reduces inline, in the SDMA write into the receiver's buffer (HCCL's
    ``CollAlignedReduceScatterDoubleRingFor91093Executor`` sets ``DMAReduceFlag_`` in op-base mode and
    passes the SDMA inline-reduce attribute), so no reduction kernel runs on the receiver; the
    inline reduction is assumed to keep the write's rate. Known gap (session 46): the msModeling
    fork's A3 microbenchmarks (published.yaml ``msmodeling-fork-comm-a3``) time a double-ring
    reduce-scatter at 1.19-1.26x the all-gather of the same size at every size (1.3-40 MiB per rank,
    16 dies; 3.5 MiB, 8 dies), which this model times alike (ratio 1.00): the inline reduction's
    rate, for which no cited figure is at hand, is the one mechanism that would explain all of them.
    Returns each rank's last task."""
    n = len(ranks)
    half = _split(chunk, 2)
    fwd = _ring_phase(w, ranks, half, ready, None, via, sync=sync)
    rev = _ring_phase(w, ranks[::-1], chunk - half if chunk > half else half, ready[::-1], None, via,
                      sync=sync)[::-1]
    return [w.barrier([a, b]) for a, b in zip(fwd, rev)] if n > 1 else fwd


def _direct_phase(w: WorkBuilder, ranks: list[int], chunk: int, ready: list[int], reduce_ps, via, sync: bool = True):
    """Every rank writes ``chunk`` bytes to every other rank at once (after its ``ready``); a rank's
    result: all it received (added, ``n - 1`` chunks, when ``reduce_ps`` is given). Returns each
    rank's last task."""
    n = len(ranks)
    _, into = matrix_transfers(w, ranks, np.full((n, n), chunk, np.int64), via, ready, sync=sync)
    last = []
    for j in range(n):
        deps = into[j] + ([ready[j]] if ready[j] >= 0 else [])
        last.append(w.compute(ranks[j], reduce_ps(chunk) * (n - 1), deps) if reduce_ps is not None
                    else w.barrier(deps))
    return last


def _halving_doubling(w, ranks, nbytes, reduce_ps, via, start, sync=True):
    n = len(ranks)
    if n & (n - 1):
        raise ConfigError(f"halving_doubling all-reduce needs a power-of-two number of ranks, got {n}")
    last = list(start)
    size = nbytes
    dist = n // 2
    schedule = []
    while dist >= 1:  # recursive halving reduce-scatter: exchange half of the current block
        size = _split(size, 2)
        schedule.append((dist, size, True))
        dist //= 2
    for dist, size, _ in reversed(list(schedule)):  # recursive doubling all-gather mirrors it
        schedule.append((dist, size, False))
    for dist, size, reduce in schedule:
        nxt = list(last)
        for i in range(n):
            j = i ^ dist
            deps = [d for d in (last[i],) if d >= 0]
            t = _synced(w, ranks[i], ranks[j], size, via, deps, [d for d in (last[j],) if d >= 0], sync)
            red_deps = [t] + ([last[j]] if last[j] >= 0 else [])
            nxt[j] = w.compute(ranks[j], reduce_ps(size), red_deps) if reduce else w.barrier(red_deps)
        last = nxt
    return last


def _groups_by_node(ranks, node_of):
    if node_of is None:
        raise ConfigError("hierarchical algorithms need the ranks' nodes")
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(ranks):
        groups.setdefault(node_of(r), []).append(i)
    sizes = {len(g) for g in groups.values()}
    if len(sizes) != 1:
        raise ConfigError("hierarchical algorithms need the same number of ranks in every node "
                          f"(got {sorted(len(g) for g in groups.values())})")
    return list(groups.values())


def _hierarchical_allreduce(w, ranks, nbytes, reduce_ps, via, node_of, start, sync=True):
    groups = _groups_by_node(ranks, node_of)
    local = len(groups[0])
    last = list(start)
    shard = _split(nbytes, local)
    if local > 1:
        for g in groups:  # reduce-scatter inside each node
            out = _ring_phase(w, [ranks[i] for i in g], shard, [last[i] for i in g], reduce_ps, via, sync=sync)
            for i, t in zip(g, out):
                last[i] = t
    if len(groups) > 1:
        for li in range(local):  # all-reduce of each shard across nodes
            members = [g[li] for g in groups]
            sub = [ranks[i] for i in members]
            chunk = _split(shard, len(members))
            out = _ring_phase(w, sub, chunk, [last[i] for i in members], reduce_ps, via, sync=sync)
            out = _ring_phase(w, sub, chunk, out, None, via, sync=sync)
            for i, t in zip(members, out):
                last[i] = t
    if local > 1:
        for g in groups:  # all-gather inside each node
            out = _ring_phase(w, [ranks[i] for i in g], shard, [last[i] for i in g], None, via, sync=sync)
            for i, t in zip(g, out):
                last[i] = t
    return last


def matrix_transfers(w: WorkBuilder, ranks, sizes, via: str | None, after=None, sync: bool = False):
    """Rank ``i`` writes ``sizes[i, j]`` bytes to rank ``j`` (zero sizes and ``i == j`` skipped), in the
    staggered order ``i+1, i+2, ...``, once ``after[i]`` (a task id, or -1) is done. Returns every
    transfer id and, per destination, the ids of the transfers into it. ``sync``: each with HCCL's
    notify handshake (:func:`_synced`; the ids are then the done notifies)."""
    n = len(ranks)
    sizes = np.asarray(sizes, np.int64)
    if sync:
        into_s: list[list[int]] = [[] for _ in range(n)]
        ids_s = []
        for i in range(n):
            for j in (i + np.arange(1, n)) % n:
                if sizes[i, j] > 0:
                    t = _synced(w, ranks[i], ranks[j], int(sizes[i, j]), via,
                                [after[i]] if after is not None and after[i] >= 0 else [],
                                [after[j]] if after is not None and after[j] >= 0 else [], True)
                    ids_s.append(t)
                    into_s[int(j)].append(t)
        return np.asarray(ids_s, np.int64), into_s
    ranks_arr = np.asarray(ranks, np.int64)
    into: list[list[int]] = [[] for _ in range(n)]
    ids_all = []
    for i in range(n):
        order = (i + np.arange(1, n)) % n
        order = order[sizes[i, order] > 0]
        if order.shape[0]:
            deps = [after[i]] if after is not None and after[i] >= 0 else []
            ids = w.transfers(np.full(order.shape[0], ranks_arr[i]), ranks_arr[order], sizes[i, order], "write", via,
                              deps=deps)
            ids_all.append(ids)
            for j, t in zip(order, ids):
                into[j].append(int(t))
    return (np.concatenate(ids_all) if ids_all else np.zeros(0, np.int64)), into


def _alltoall_direct(w, ranks, sizes, via, ready=None, sync=False):
    """All-to-all of an (n, n) size matrix; every rank's result is complete when everything sent
    to it has arrived: one barrier over all transfers (and ``ready``)."""
    ids, _ = matrix_transfers(w, ranks, sizes, via, ready, sync=sync)
    everything = w.barrier(ids.tolist() + [r for r in (ready or []) if r >= 0])
    return [everything] * len(ranks)


def _alltoall_hierarchical(w, ranks, chunk, via, node_of, ready, sync=True):
    groups = np.asarray(_groups_by_node(ranks, node_of))  # (nodes, local) rank indices
    nodes, local = groups.shape
    n = len(ranks)
    intra = np.zeros((n, n), np.int64)  # (a, l) -> (a, m): everything bound for local index m of any node
    for g in groups:
        intra[np.ix_(g, g)] = chunk * nodes
    np.fill_diagonal(intra, 0)
    first = _alltoall_direct(w, ranks, intra, via, ready, sync)
    inter = np.zeros((n, n), np.int64)  # then (a, l) -> (b, l): what node a had for node b's index l
    for li in range(local):
        col = groups[:, li]
        inter[np.ix_(col, col)] = chunk * local
    np.fill_diagonal(inter, 0)
    return _alltoall_direct(w, ranks, inter, via, ready=first, sync=sync)


def _binomial(w, ranks, nbytes, via, start, sync=True):
    n = len(ranks)
    have = {0: start[0]}
    step = 1
    while step < n:
        for i in list(have):
            j = i + step
            if j < n:
                deps = [have[i]] if have[i] >= 0 else []
                t = _synced(w, ranks[i], ranks[j], nbytes, via, deps, [d for d in (start[j],) if d >= 0], sync)
                have[j] = w.barrier([t, start[j]]) if start[j] >= 0 else t
        step *= 2
    return [have[i] for i in range(n)]
