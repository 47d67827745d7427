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

    def bus_factor(self) -> float:
        n = len(self.ranks)
        if n <= 1:
            return 0.0
        if self.op == "allreduce":
            return 2 * (n - 1) / n
        if self.op in ("allgather", "reducescatter", "alltoall"):
            return (n - 1) / n
        return 1.0


def _ring_phase(w: WorkBuilder, ranks: list[int], chunk: int, ready: list[int], reduce_ps, via, steps: int | None = None):
    """``steps`` (default n-1) ring steps of ``chunk`` bytes; ``ready[i]``: what rank i's first send waits for.
    Returns each rank's last task."""
    n = len(ranks)
    last = list(ready)
    for _ in range(n - 1 if steps is None else steps):
        nxt = list(last)
        for i in range(n):
            dst = (i + 1) % n
            deps = [d for d in (last[i],) if d >= 0]
            t = w.transfer(ranks[i], ranks[dst], chunk, "write", via, deps=deps)
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
                     node_of: Callable[[int], int] | None = None, ready: list[int] | None = None) -> BuiltCollective:
    """Record one collective into ``w`` (see module docstring); raises ConfigError for bad choices.
    ``ready[i]``: the task rank ``i`` must finish before it takes part (-1 or None: none)."""
    if op in ("allreduce", "reducescatter"):
        topo = w.sim.topology
        cpus = [topo.names[r] for r in ranks if topo.vertex_kind[r] != "die"]
        if cpus:
            raise ConfigError(f"--ranks: {op} reduces on the ranks' NPU dies; {', '.join(cpus[:3])} "
                              "is not a die (CPUs can take part in all-gather, all-to-all, broadcast, send/recv)")
    if op not in OPS:
        raise ConfigError(f"--op {op}: expected one of {', '.join(OPS)} (or dispatch, combine)")
    algorithm = algorithm or ALGORITHMS[op][0]
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
    if op == "allreduce" and algorithm == "ring":
        chunk = _split(nbytes, n)
        last = _ring_phase(w, ranks, chunk, start, reduce_ps, via)
        last = _ring_phase(w, ranks, chunk, last, None, via)
    elif op == "allreduce" and algorithm == "halving_doubling":
        last = _halving_doubling(w, ranks, nbytes, reduce_ps, via, start)
    elif op == "allreduce" and algorithm == "hierarchical":
        last = _hierarchical_allreduce(w, ranks, nbytes, reduce_ps, via, node_of, start)
    elif op == "allreduce":
        last = _direct_phase(w, ranks, _split(nbytes, n), _direct_phase(w, ranks, _split(nbytes, n), start, reduce_ps,
                                                                           via), None, via)
    elif op in ("reducescatter", "allgather") and algorithm == "direct":
        last = _direct_phase(w, ranks, _split(nbytes, n), start, reduce_ps if op == "reducescatter" else None, via)
    elif op == "reducescatter":
        last = _ring_phase(w, ranks, _split(nbytes, n), start, reduce_ps, via)
    elif op == "allgather":
        last = _ring_phase(w, ranks, _split(nbytes, n), start, None, via)
    elif op == "alltoall" and algorithm == "direct":
        last = _alltoall_direct(w, ranks, np.full((n, n), _split(nbytes, n)), via, start)
    elif op == "alltoall":
        last = _alltoall_hierarchical(w, ranks, _split(nbytes, n), via, node_of, start)
    elif op == "broadcast":
        last = _binomial(w, ranks, nbytes, via, start)
    else:  # send/recv: the first rank writes to the second
        sent = w.transfer(ranks[0], ranks[1], nbytes, "write", via, deps=[d for d in start[:2] if d >= 0])
        last = [sent] * 2
    done = w.barrier([t for t in last if t >= 0])
    return BuiltCollective(op, algorithm, list(ranks), nbytes, done, last)


def _direct_phase(w: WorkBuilder, ranks: list[int], chunk: int, ready: list[int], reduce_ps, via):
    """Every rank writes ``chunk`` bytes to every other rank at once (after its ``ready``); a rank's
    result: all it received (added, ``n - 1`` chunks, when ``reduce_ps`` is given). Returns each
    rank's last task."""
    n = len(ranks)
    _, into = matrix_transfers(w, ranks, np.full((n, n), chunk, np.int64), via, ready)
    last = []
    for j in range(n):
        deps = into[j] + ([ready[j]] if ready[j] >= 0 else [])
        last.append(w.compute(ranks[j], reduce_ps(chunk) * (n - 1), deps) if reduce_ps is not None
                    else w.barrier(deps))
    return last


def _halving_doubling(w, ranks, nbytes, reduce_ps, via, start):
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
            t = w.transfer(ranks[i], ranks[j], size, "write", via, deps=deps)
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


def _hierarchical_allreduce(w, ranks, nbytes, reduce_ps, via, node_of, start):
    groups = _groups_by_node(ranks, node_of)
    local = len(groups[0])
    last = list(start)
    shard = _split(nbytes, local)
    if local > 1:
        for g in groups:  # reduce-scatter inside each node
            out = _ring_phase(w, [ranks[i] for i in g], shard, [last[i] for i in g], reduce_ps, via)
            for i, t in zip(g, out):
                last[i] = t
    if len(groups) > 1:
        for li in range(local):  # all-reduce of each shard across nodes
            members = [g[li] for g in groups]
            sub = [ranks[i] for i in members]
            chunk = _split(shard, len(members))
            out = _ring_phase(w, sub, chunk, [last[i] for i in members], reduce_ps, via)
            out = _ring_phase(w, sub, chunk, out, None, via)
            for i, t in zip(members, out):
                last[i] = t
    if local > 1:
        for g in groups:  # all-gather inside each node
            out = _ring_phase(w, [ranks[i] for i in g], shard, [last[i] for i in g], None, via)
            for i, t in zip(g, out):
                last[i] = t
    return last


def matrix_transfers(w: WorkBuilder, ranks, sizes, via: str | None, after=None):
    """Rank ``i`` writes ``sizes[i, j]`` bytes to rank ``j`` (zero sizes and ``i == j`` skipped), in the
    staggered order ``i+1, i+2, ...``, once ``after[i]`` (a task id, or -1) is done. Returns every
    transfer id and, per destination, the ids of the transfers into it."""
    n = len(ranks)
    sizes = np.asarray(sizes, np.int64)
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


def _alltoall_direct(w, ranks, sizes, via, ready=None):
    """All-to-all of an (n, n) size matrix; every rank's result is complete when everything sent
    to it has arrived: one barrier over all transfers (and ``ready``)."""
    ids, _ = matrix_transfers(w, ranks, sizes, via, ready)
    everything = w.barrier(ids.tolist() + [r for r in (ready or []) if r >= 0])
    return [everything] * len(ranks)


def _alltoall_hierarchical(w, ranks, chunk, via, node_of, ready):
    groups = np.asarray(_groups_by_node(ranks, node_of))  # (nodes, local) rank indices
    nodes, local = groups.shape
    n = len(ranks)
    intra = np.zeros((n, n), np.int64)  # (a, l) -> (a, m): everything bound for local index m of any node
    for g in groups:
        intra[np.ix_(g, g)] = chunk * nodes
    np.fill_diagonal(intra, 0)
    first = _alltoall_direct(w, ranks, intra, via, ready)
    inter = np.zeros((n, n), np.int64)  # then (a, l) -> (b, l): what node a had for node b's index l
    for li in range(local):
        col = groups[:, li]
        inter[np.ix_(col, col)] = chunk * local
    np.fill_diagonal(inter, 0)
    return _alltoall_direct(w, ranks, inter, via, ready=first)


def _binomial(w, ranks, nbytes, via, start):
    n = len(ranks)
    have = {0: start[0]}
    step = 1
    while step < n:
        for i in list(have):
            j = i + step
            if j < n:
                deps = [have[i]] if have[i] >= 0 else []
                t = w.transfer(ranks[i], ranks[j], nbytes, "write", via, deps=deps)
                have[j] = w.barrier([t, start[j]]) if start[j] >= 0 else t
        step *= 2
    return [have[i] for i in range(n)]
