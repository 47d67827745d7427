"""Collectives over an ordered list of cores, built as engine tasks.

Algorithms (``n`` cores in the given order, ``B`` bytes per core, chunks of ``B / n``):

* **ring reduce-scatter**: ``n - 1`` steps; in step ``s`` core ``i`` sends chunk
  ``(i - s) mod n`` to core ``i + 1``, which adds it to its own copy on the vector
  unit before forwarding it in the next step. Each core ends with one reduced chunk.
* **ring all-gather**: ``n - 1`` steps of forwarding chunks around the ring.
* **ring all-reduce** = reduce-scatter + all-gather (``2(n - 1)`` steps, each core
  sends ``2(n - 1)/n * B`` bytes: bandwidth-optimal).
* **2D all-reduce** over a ``rows x cols`` grid of the list (row-major): reduce-scatter
  along each row, all-reduce of the shards along each column, all-gather along each row.
  **2D all-gather**: all-gather along rows, then along columns.
* **multicast**: binomial tree, ``ceil(log2 n)`` rounds; **send_recv**: one message.
* **all-to-all(v)**: core ``i`` sends ``sizes[i][j]`` bytes straight to core ``j`` (one message per
  pair, no forwarding; its own share ``sizes[i][i]`` stays put). Core ``i``'s messages leave in
  the shifted order ``i + 1, i + 2, ...`` (mod ``n``), so at any step no core is everyone's
  destination; they overlap on the mesh as far as its links and the source's NoC queue allow
  (a message frees the queue once injected). ``alltoall`` is the uniform case: ``B`` bytes per
  core cut into ``n`` equal shares, one per core. A core holds its result when every message
  to it has arrived. MoE token dispatch and combine use it with the routed token counts.

The ring is the list order: neighbours in the list exchange data, whatever their mesh
distance, so the order decides the hop counts. Reductions are ``vector``
``elementwise`` ops over ``chunk / dtype_bytes`` elements. Every send waits for the data
it carries (the previous step's receive and reduction); a core's sends go through its
``noc`` queue in order. Collectives are recorded into a
:class:`~npusim.sim.program.Program` (``prog`` below), so a mapper can place them
among other tasks and the program stays arch-independent.

Bus bandwidth follows the NCCL convention: all-reduce ``busbw = algbw * 2(n-1)/n``,
all-gather, reduce-scatter and all-to-all ``algbw * (n-1)/n``, where ``algbw = bytes / time``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from npusim.arch.schema import DTYPE_BYTES
from npusim.choices import CHIP_COLLECTIVES as OPS
from npusim.errors import ConfigError
from npusim.sim.program import Program


@dataclass
class Collective:
    """Tasks of one collective: ``done[core]`` is the task after which ``core`` holds its result."""

    op: str
    cores: list[int]
    bytes_per_core: int
    tasks: list[int] = field(default_factory=list)
    done: dict[int, int] = field(default_factory=dict)

    def bus_factor(self) -> float:
        n = len(self.cores)
        if n <= 1:
            return 0.0
        if self.op.startswith("allreduce"):
            return 2 * (n - 1) / n
        if self.op in ("allgather", "allgather2d", "reducescatter", "alltoall"):
            return (n - 1) / n
        return 1.0


def _check(prog: Program, cores: list[int], nbytes: int) -> None:
    if len(cores) < 1:
        raise ConfigError("a collective needs at least one core")
    if len(set(cores)) != len(cores):
        raise ConfigError(f"cores must be distinct, got {cores}")
    for c in cores:
        prog.check_core(c)
    if nbytes < 0:
        raise ConfigError(f"bytes must be >= 0, got {nbytes}")


def _chunks(nbytes: int, n: int) -> list[int]:
    base, extra = divmod(nbytes, n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def _ring_phase(prog, coll, cores, chunks, ready, reduce, dtype, tag, offset=0):
    """One ring phase (reduce-scatter if ``reduce`` else all-gather): in step ``s`` core ``i``
    sends chunk ``(i + offset - s) mod n``. ``ready[i]`` is the task after which core ``i`` may
    send (or -1). Returns the per-core readiness after the phase. Recorded into a
    :class:`Program`, a phase is a block replayed for the same cores, chunks and readiness
    pattern (:meth:`Program.recorded`): the same tasks, recorded faster."""
    n = len(cores)
    if not isinstance(prog, Program):
        return _ring_steps(prog, coll.tasks, cores, chunks, ready, reduce, dtype, tag, offset)

    def build():
        tasks: list[int] = []
        out = _ring_steps(prog, tasks, cores, chunks, ready, reduce, dtype, tag, offset)
        return out + tasks, True

    outs, _ = prog.recorded(("ring", tuple(cores), tuple(chunks), bool(reduce), dtype, tag, offset), ready, build)
    coll.tasks.extend(outs[n:])
    return outs[:n]


def _ring_steps(prog, tasks, cores, chunks, ready, reduce, dtype, tag, offset):
    """The steps of :func:`_ring_phase`, recording each task (appending it to ``tasks``)."""
    n = len(cores)
    ready = list(ready)
    for s in range(n - 1):
        new_ready = list(ready)
        for i, src in enumerate(cores):
            dst_i = (i + 1) % n
            chunk = chunks[(i + offset - s) % n]
            deps = [t for t in (ready[i],) if t >= 0]
            send = prog.add_send(src, cores[dst_i], chunk, deps=deps, name=f"{tag} step{s} {src}->{cores[dst_i]}")
            tasks.append(send)
            after = send
            if reduce:
                red_deps = [send] + ([ready[dst_i]] if ready[dst_i] >= 0 else [])
                after = prog.add_vector(cores[dst_i], "elementwise", max(1, int(chunk / DTYPE_BYTES[dtype])), dtype,
                                       deps=red_deps, name=f"{tag} reduce step{s}")
                tasks.append(after)
            new_ready[dst_i] = after
        ready = new_ready
    return ready


def _one_ring_phase(prog: Program, op: str, cores: list[int], nbytes: int, deps, dtype: str, reduce: bool) -> Collective:
    _check(prog, cores, nbytes)
    coll = Collective(op, list(cores), nbytes)
    start = _gate(prog, deps)
    ready = _ring_phase(prog, coll, cores, _chunks(nbytes, len(cores)), [start] * len(cores), reduce, dtype,
                        "RS" if reduce else "AG")
    return _finish(coll, cores, ready, start)


def _finish(coll: Collective, cores, ready, start: int) -> Collective:
    """Record, per core, the task after which it holds its result (``start`` if it did nothing)."""
    coll.done = {c: (r if r >= 0 else start) for c, r in zip(cores, ready)}
    return coll


def ring_reduce_scatter(prog: Program, cores: list[int], nbytes: int, deps=(), dtype: str = "bf16") -> Collective:
    """Reduce ``nbytes`` per core; each core ends with one reduced chunk of ``nbytes / n``."""
    return _one_ring_phase(prog, "reducescatter", cores, nbytes, deps, dtype, reduce=True)


def ring_allgather(prog: Program, cores: list[int], nbytes: int, deps=(), dtype: str = "bf16") -> Collective:
    """Gather ``nbytes`` in total (``nbytes / n`` contributed by each core) onto every core."""
    return _one_ring_phase(prog, "allgather", cores, nbytes, deps, dtype, reduce=False)


def ring_allreduce(prog: Program, cores: list[int], nbytes: int, deps=(), dtype: str = "bf16") -> Collective:
    _check(prog, cores, nbytes)
    coll = Collective("allreduce", list(cores), nbytes)
    chunks = _chunks(nbytes, len(cores))
    start = _gate(prog, deps)
    ready = _ring_phase(prog, coll, cores, chunks, [start] * len(cores), True, dtype, "AR-RS")
    # after reduce-scatter core i owns chunk (i + 1) mod n; the all-gather phase forwards it on
    ready = _ring_phase(prog, coll, cores, chunks, ready, False, dtype, "AR-AG", offset=1)
    return _finish(coll, cores, ready, start)


def _grid(cores: list[int], rows: int, cols: int) -> list[list[int]]:
    if rows * cols != len(cores):
        raise ConfigError(f"a {rows}x{cols} grid needs {rows * cols} cores, got {len(cores)}")
    return [cores[r * cols:(r + 1) * cols] for r in range(rows)]


def allreduce_2d(prog: Program, cores: list[int], rows: int, cols: int, nbytes: int, deps=(),
                 dtype: str = "bf16") -> Collective:
    """Reduce-scatter along rows, all-reduce of each shard along columns, all-gather along rows."""
    _check(prog, cores, nbytes)
    grid = _grid(cores, rows, cols)
    coll = Collective("allreduce2d", list(cores), nbytes)
    start = _gate(prog, deps)
    row_chunks = _chunks(nbytes, cols)
    ready = {}
    for row in grid:
        out = _ring_phase(prog, coll, row, row_chunks, [start] * cols, True, dtype, "AR2D-RS")
        ready.update(zip(row, out))
    for j in range(cols):
        column = [grid[r][j] for r in range(rows)]
        shard = row_chunks[(j + 1) % cols]
        col_chunks = _chunks(shard, rows)
        out = _ring_phase(prog, coll, column, col_chunks, [ready[c] for c in column], True, dtype, "AR2D-colRS")
        out = _ring_phase(prog, coll, column, col_chunks, out, False, dtype, "AR2D-colAG", offset=1)
        ready.update(zip(column, out))
    for row in grid:
        out = _ring_phase(prog, coll, row, row_chunks, [ready[c] for c in row], False, dtype, "AR2D-AG", offset=1)
        ready.update(zip(row, out))
    return _finish(coll, cores, [ready[c] for c in cores], start)


def allgather_2d(prog: Program, cores: list[int], rows: int, cols: int, nbytes: int, deps=(),
                 dtype: str = "bf16") -> Collective:
    """All-gather along rows (each row gathers its cores' shares), then along columns."""
    _check(prog, cores, nbytes)
    grid = _grid(cores, rows, cols)
    coll = Collective("allgather2d", list(cores), nbytes)
    start = _gate(prog, deps)
    row_bytes = _chunks(nbytes, rows)
    ready = {}
    for r, row in enumerate(grid):
        out = _ring_phase(prog, coll, row, _chunks(row_bytes[r], cols), [start] * cols, False, dtype, "AG2D-row")
        ready.update(zip(row, out))
    for j in range(cols):
        column = [grid[r][j] for r in range(rows)]
        out = _ring_phase(prog, coll, column, row_bytes, [ready[c] for c in column], False, dtype, "AG2D-col")
        ready.update(zip(column, out))
    return _finish(coll, cores, [ready[c] for c in cores], start)


def multicast(prog: Program, cores: list[int], nbytes: int, deps=(), dtype: str = "bf16") -> Collective:
    """``cores[0]`` sends ``nbytes`` to all others along a binomial tree."""
    _check(prog, cores, nbytes)
    coll = Collective("multicast", list(cores), nbytes)
    start = _gate(prog, deps)
    have = {cores[0]: start}
    pending = list(cores[1:])
    while pending:
        for src in list(have):
            if not pending:
                break
            dst = pending.pop(0)
            t = prog.add_send(src, dst, nbytes, deps=[have[src]] if have[src] >= 0 else [], name=f"mcast {src}->{dst}")
            coll.tasks.append(t)
            have[dst] = t
    coll.done = {c: have[c] for c in cores}
    return coll


def alltoallv(prog: Program, cores: list[int], sizes, deps=(), ready=None, name: str = "A2A") -> Collective:
    """Core ``cores[i]`` sends ``sizes[i][j]`` bytes to ``cores[j]`` (an ``n x n`` matrix; the
    diagonal is what a core keeps and is not sent; zero entries send nothing). ``ready[i]``:
    tasks after which core ``i``'s data may leave (default: all of ``deps``). ``done[c]`` is the
    task after which ``c`` has received everything sent to it (and its own data is ready)."""
    n = len(cores)
    _check(prog, cores, 0)
    if len(sizes) != n or any(len(row) != n for row in sizes):
        raise ConfigError(f"all-to-all sizes must be a {n} x {n} matrix (one row and column per core)")
    if any(int(b) < 0 for row in sizes for b in row):
        raise ConfigError("all-to-all sizes must be >= 0 bytes")
    if ready is not None and len(ready) != n:
        raise ConfigError(f"all-to-all ready needs one entry per core ({n}), got {len(ready)}")
    coll = Collective("alltoall", list(cores), int(max((sum(int(b) for b in row) for row in sizes), default=0)))
    start = _gate(prog, deps) if ready is None else -1
    src_ready = [start] * n if ready is None else [_gate(prog, r) for r in ready]
    incoming: list[list[int]] = [[] for _ in range(n)]
    for i, src in enumerate(cores):
        for s in range(1, n):
            j = (i + s) % n
            nbytes = int(sizes[i][j])
            if nbytes <= 0:
                continue
            deps_i = [src_ready[i]] if src_ready[i] >= 0 else []
            t = prog.add_send(src, cores[j], nbytes, deps=deps_i, name=f"{name} {src}->{cores[j]}")
            coll.tasks.append(t)
            incoming[j].append(t)
    for j, c in enumerate(cores):
        got = incoming[j] + ([src_ready[j]] if src_ready[j] >= 0 else [])
        coll.done[c] = _gate(prog, got)
    return coll


def alltoall(prog: Program, cores: list[int], nbytes: int, deps=(), dtype: str = "bf16") -> Collective:
    """Uniform all-to-all: each core sends ``nbytes`` in total, ``nbytes / n`` to every core
    (its own share stays), the nccl-tests convention."""
    _check(prog, cores, nbytes)
    n = len(cores)
    share = _chunks(nbytes, n)
    coll = alltoallv(prog, cores, [list(share) for _ in range(n)], deps=deps)
    coll.bytes_per_core = nbytes
    return coll


def send_recv(prog: Program, src: int, dst: int, nbytes: int, deps=()) -> Collective:
    _check(prog, [src, dst] if src != dst else [src], nbytes)
    coll = Collective("sendrecv", [src, dst], nbytes)
    t = prog.add_send(src, dst, nbytes, deps=list(deps), name=f"send {src}->{dst}")
    coll.tasks.append(t)
    coll.done = {src: t, dst: t}
    return coll


def _gate(prog: Program, deps) -> int:
    """A zero-time barrier task joining ``deps`` (or -1 when there are none)."""
    deps = [d for d in deps if d is not None and d >= 0]
    if not deps:
        return -1
    if len(deps) == 1:
        return deps[0]
    return prog.add_barrier(deps, name="collective start")
