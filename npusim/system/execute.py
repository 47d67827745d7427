"""Time a :class:`~npusim.system.workload.Workload` on a system: chip costs + the fabric engine.

Each kernel of the workload is costed once by the chip simulator on the system's die
(:class:`~npusim.system.chipcost.ChipCost`, memoised on disk): a GEMM by the chip-cost GEMM kernel,
a layer part or ONNX graph operator by operator (:func:`operators_cost`: its GEMMs by the GEMM
kernel, which uses the die's L2, its vector ops by the vector operator, attention and experts by the
mapper, one after another with their inputs and outputs in HBM, as an operator runtime launches them); each node becomes system tasks:
a compute node one task on its rank's stream (the die's ``compute`` or ``moe`` queue, in order),
a collective the transfers and reductions of :func:`~npusim.system.collectives.build_collective`
(reductions cost by :func:`~npusim.system.measure.reduction_ps`), a transfers node its writes
(:func:`~npusim.system.collectives.matrix_transfers`, AIV-direct or SDMA as the system's
initiator default says). The fabric model times the transfers with contention.

**Streams share the die.** A die with two in-order streams (``compute`` and ``moe``: the
``core_split`` overlap) runs them on disjoint cores but one HBM (and L2). A kernel is first costed
alone on the die; after a first timing pass, each compute node's overlap with the other stream
of its die is measured (the fraction ``o`` of its time the other stream runs a kernel, and that
kernel's mean HBM demand ``d_other``, bytes / time alone). When its own demand ``d`` and
``d_other`` together exceed the die's HBM bandwidth, the node gets the share ``d / (d +
d_other)`` of the HBM and L2 bandwidth while they overlap: its time is ``(1 - o) t_alone + o
t_share``, ``t_share`` the chip cost at that HBM fraction (rounded to 1/20); then the workload is
timed again with these times (one refinement: the second pass's overlaps are not fed back).
SDMA transfers' HBM traffic is not charged to the compute streams.

**The runtime** (:class:`~npusim.system.schema.Runtime`, the system's ``runtime:`` section, the
mode ``eager`` or ``graph``) is added here, the same for every workload, whichever path built it.
Each compute node counts its kernels (a layer part's operators, a GEMM or vector kernel: 1; a
``fixed`` time and the MoE operators' local work: 0, they are parts of one operator) and each
collective or transfers node is one operator. Eager: each die has a ``host`` queue that
dispatches the die's operators in the workload's order, ``host_dispatch_us`` each (an HCCL
collective ``hccl_dispatch_us``, an attention operator ``attention_dispatch_us``); a node waits for its dispatch (a task on the host queue), so the
device waits on the host only when the host is behind. A node of several operators (a layer part) waits for the dispatch of all of them: coarse,
it cannot start its first operator while the host dispatches its later ones (at most one node's
dispatch too late, and only where the device had caught up with the host). Marks at the step's
start (nodes with no dependencies) wait for the graph launch, or in eager mode for each die's
first operator's dispatch, so a repeated layer's extrapolation keeps that start-up. Graph: one ``graph_launch_us`` task on each die's host queue at the step's start that every
node of the die waits for; then, on the same host queue in the workload's order, each compute node
with attention operators updates their captured parameters (``graph_update_us`` per attention
operator, one task per node), and that node waits for its update too: the updates overlap the
device's work on the nodes before it, and the step becomes host-bound where a layer's device work
is shorter than its updates. Both: a compute node runs ``kernel_launch_us`` per kernel longer (the
``launch`` part of it), and after each die's last work one task on its host queue: the host's
synchronize on the step's tokens returning (``sync_us``) and the framework's ``scheduler_us``
(``scheduler_us`` may be overridden per run: a deployment's ``step_overhead_us``); with the next
step's launch and first update this is the gap between two replays
(:meth:`~npusim.system.schema.Runtime.replay_gap_us`).

Results: the step time (the makespan; with ``meta.repeat``, the simulated layers replaced by the
layer count at the measured period), each node's start and end (over its transfer and compute
tasks), and ``breakdown_us``: the step's critical path
(walked back from the last node through the dependency that finished last), each piece of it
filed under the category of the node it ends in, so the parts sum to the step time. Waiting for
a busy stream counts under the node that waited. The host's work on the path (dispatch the device
waited for, the graph launch and updates, the step's synchronize and scheduler) is ``host``; the kernel launches inside a compute
node's piece are ``launch`` (at most the piece). ``link_utilization``: each directed fabric
link's wire bytes over (capacity x makespan), the busiest links first.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from npusim.arch.derived import summarize
from npusim.errors import ConfigError
from npusim.model.ir import Op
from npusim.model.zoo import get_config
from npusim.system.chipcost import ChipCost
from npusim.system.collectives import build_collective, matrix_transfers
from npusim.system.load import LoadedSystem
from npusim.system.measure import reduction_ps
from npusim.system.parts import layer_part_graph, onnx_graph
from npusim.system.kernel import KIND_FLOW
from npusim.system.simulator import PS_PER_US, SystemSim
from npusim.system.work import WorkBuilder
from npusim.system.workload import Workload


@dataclass
class WorkloadTiming:
    step_us: float
    makespan_us: float
    breakdown_us: dict
    node_start_us: np.ndarray
    node_end_us: np.ndarray
    kernel_us: list[float]  # each kernel alone on its die
    node_us: list[float]  # each node's compute time as timed (its kernel's, or with the die's HBM shared; 0: not compute)
    links: list[dict] = field(default_factory=list)
    fabric: dict = field(default_factory=dict)
    period_breakdown_us: dict = field(default_factory=dict)  # the critical path within one repeated layer
    runtime: dict = field(default_factory=dict)  # the runtime mode and constants the step was timed with
    host_busy_us: float = 0.0  # the runtime's host tasks' time, summed over the dies

    @property
    def fixed_share(self) -> float:
        """The part of the step that is not simulated hardware work: host, launch and calibrated
        constants on the critical path, over the step time."""
        return fixed_share(self.breakdown_us, self.step_us)


#: breakdown categories that are not simulated hardware work (``fixed_share``)
FIXED_CATEGORIES = ("host", "launch", "calibrated")


def fixed_share(breakdown_us: dict, step_us: float) -> float:
    """(host + launch + calibrated) / step; 0 for an empty step."""
    return sum(breakdown_us.get(c, 0.0) for c in FIXED_CATEGORIES) / step_us if step_us > 0 else 0.0


@dataclass(frozen=True)
class StepRuntime:
    """The runtime a step is timed with (:class:`~npusim.system.schema.Runtime` resolved for one
    run): mode and constants, microseconds."""

    mode: str
    host_dispatch_us: float = 0.0
    graph_launch_us: float = 0.0
    kernel_launch_us: float = 0.0
    scheduler_us: float = 0.0
    graph_update_us: float = 0.0
    hccl_dispatch_us: float = 0.0
    attention_dispatch_us: float = 0.0
    sync_us: float = 0.0

    @classmethod
    def of(cls, loaded: LoadedSystem, phase: str, mode: str | None = None,
           scheduler_us: float | None = None) -> "StepRuntime":
        rt = loaded.system.runtime
        return cls(rt.mode_for(phase, mode), rt.host_dispatch_us, rt.graph_launch_us, rt.kernel_launch_us,
                   rt.scheduler_us if scheduler_us is None else float(scheduler_us), rt.graph_update_us,
                   rt.hccl_dispatch_us, rt.attention_dispatch_us, rt.sync_us)

    def as_dict(self) -> dict:
        return asdict(self)


def cost_kernels(wl: Workload, cc: ChipCost, hbm_fraction: float = 1.0, ops_out: list | None = None,
                 attention_out: list | None = None) -> tuple[list[float], list[float]]:
    """Each kernel's time on the die (microseconds) and the HBM bytes it moves, with the share
    ``hbm_fraction`` of the die's HBM bandwidth (``fixed`` kernels are calibrated times, kept as
    they are). ``ops_out``: filled with each kernel's operator count (the kernels the runtime
    launches for it: a layer part's or ONNX graph's operators, 1 for a GEMM or vector kernel, 0 for
    a ``fixed`` time; a ``sum`` its parts' times ``times``, a ``blend`` its first kernel's);
    ``attention_out``: likewise each kernel's attention operators (graph mode updates them per step)."""
    cfg = None
    out: list[float] = []
    moved: list[float] = []
    ops: list[int] = []
    attention: list[int] = []
    for spec in wl.kernels:
        kind, cores = spec["type"], spec.get("cores")
        nbytes, n_attn = 0.0, 0
        if kind in ("gemm", "layer", "onnx"):
            if kind == "gemm":
                r = cc.gemm(spec["m"], spec["k"], spec["n"], spec.get("dtype", "bf16"), cores,
                            batch=spec.get("batch", 1), hbm_fraction=hbm_fraction)
                us, n_ops = r.time_us, 1
            else:
                cfg = cfg or (get_config(wl.meta["model"]) if kind == "layer" else None)
                graph = layer_part_graph(cfg, spec) if kind == "layer" else onnx_graph(spec)
                r = operators_cost(cc, graph, cores, hbm_fraction)
                us, n_ops = r.time_us, len(graph.ops)
                n_attn = sum(op.kind == "attention" for op in graph.ops)
            nbytes = float(r.hbm_bytes)
        elif kind == "vector":
            op = Op(name=f"vector {spec['op_class']}", kind="vector", dtype=spec.get("dtype", "bf16"),
                    elements=int(spec["elements"]), op_class=spec["op_class"], fn=spec.get("fn"),
                    row_len=spec.get("row_len"))
            r = cc.vector(op, cores, hbm_fraction=hbm_fraction)
            us, nbytes, n_ops = r.time_us, float(r.hbm_bytes), 1
        elif kind == "fixed":
            us, n_ops = float(spec["us"]), 0
        elif kind == "sum":
            us = sum(out[i] for i in spec["of"]) * spec.get("times", 1)
            nbytes = sum(moved[i] for i in spec["of"]) * spec.get("times", 1)
            n_ops = sum(ops[i] for i in spec["of"]) * int(spec.get("times", 1))
            n_attn = sum(attention[i] for i in spec["of"]) * int(spec.get("times", 1))
        else:  # blend
            a, b = out[spec["a"]], out[spec["b"]]
            us = max(0.0, a + (b - a) * spec["weight"])
            nbytes = max(0.0, moved[spec["a"]] + (moved[spec["b"]] - moved[spec["a"]]) * spec["weight"])
            n_ops, n_attn = ops[spec["a"]], attention[spec["a"]]
        out.append(us)
        moved.append(nbytes)
        ops.append(n_ops)
        attention.append(n_attn)
    if ops_out is not None:
        ops_out[:] = ops
    if attention_out is not None:
        attention_out[:] = attention
    return out, moved


@dataclass(frozen=True)
class OperatorsCost:
    time_us: float
    hbm_bytes: int


def operators_cost(cc: ChipCost, graph, cores, hbm_fraction: float = 1.0) -> OperatorsCost:
    """A graph run operator after operator, as the die's runtime launches them (:meth:`ChipCost.op`:
    each GEMM by the chip-cost GEMM kernel, its operands from HBM or the L2; each vector op by the
    vector operator; attention and experts by the mapper); an operator's inputs and outputs pass
    through HBM. The runtime's costs (dispatch, launch) are added by :func:`time_workload`."""
    results = [cc.op(op, cores, hbm_fraction=hbm_fraction) for op in graph.ops]
    return OperatorsCost(sum(r.time_us for r in results), sum(r.hbm_bytes for r in results))


SHARE_STEPS = 20  # HBM shares are rounded to 1/20 (each distinct share is one more chip cost)


def shared_stream_times(wl: Workload, cc: ChipCost, kernel_us: list[float], kernel_bytes: list[float],
                        start: np.ndarray, end: np.ndarray, hbm_gbps: float) -> list[float] | None:
    """Each node's time with the HBM shared between the two streams of its die (see the module
    docstring), from a timing pass's node ``start``/``end``; None if no die runs two streams."""
    busy: dict[int, dict[str, list[int]]] = {}  # rank -> stream -> its compute nodes
    for i, n in enumerate(wl.nodes):
        if n["kind"] == "compute":
            busy.setdefault(n["rank"], {}).setdefault(n.get("stream", "compute"), []).append(i)
    if not any(len(streams) > 1 for streams in busy.values()):
        return None
    node_us = [kernel_us[n["kernel"]] if n["kind"] == "compute" else 0.0 for n in wl.nodes]
    bytes_per_us = hbm_gbps * 1e3
    recost: dict[float, list[float]] = {}
    for streams in busy.values():
        for stream, nodes in streams.items():
            others = [j for st, js in streams.items() if st != stream for j in js]
            if not others:
                continue
            o_start, o_end = start[others], end[others]
            o_demand = np.array([kernel_bytes[wl.nodes[j]["kernel"]] / max(kernel_us[wl.nodes[j]["kernel"]], 1e-9)
                                 for j in others])
            for i in nodes:
                k = wl.nodes[i]["kernel"]
                t_alone, dur = kernel_us[k], end[i] - start[i]
                if t_alone <= 0 or dur <= 0 or kernel_bytes[k] <= 0:
                    continue
                overlap = np.clip(np.minimum(o_end, end[i]) - np.maximum(o_start, start[i]), 0.0, None)
                o = float(overlap.sum()) / dur
                if o <= 0:
                    continue
                demand, other = kernel_bytes[k] / t_alone, float((overlap * o_demand).sum() / overlap.sum())
                if demand + other <= bytes_per_us:
                    continue
                share = max(1, round(SHARE_STEPS * demand / (demand + other))) / SHARE_STEPS
                if share >= 1:
                    continue
                if share not in recost:
                    recost[share] = cost_kernels(wl, cc, share)[0]
                node_us[i] = (1 - min(o, 1.0)) * t_alone + min(o, 1.0) * recost[share][k]
    return node_us


def time_workload(wl: Workload, loaded: LoadedSystem, chip_cost: ChipCost | None = None,
                  fidelity: str = "flow", runtime: StepRuntime | str | None = None) -> WorkloadTiming:
    """Time ``wl`` on ``loaded`` (ranks on the system's first dies); see the module docstring.
    ``runtime``: a :class:`StepRuntime`, or a mode (``eager`` / ``graph``) with the system's
    constants, or None: the system's default mode for the workload's phase."""
    topo = loaded.topology
    if wl.ranks > len(topo.die_names):
        raise ConfigError(f"the workload has {wl.ranks} ranks but {loaded.system.name} has {len(topo.die_names)} dies "
                          "(a bigger --nodes or system)")
    if not isinstance(runtime, StepRuntime):
        runtime = StepRuntime.of(loaded, wl.meta.get("phase", "decode"), runtime)
    cc = chip_cost or ChipCost(loaded.chip)
    kernel_ops: list[int] = []
    kernel_attn: list[int] = []
    kernel_us, kernel_bytes = cost_kernels(wl, cc, ops_out=kernel_ops, attention_out=kernel_attn)
    node_ops = [(_node_ops(n, kernel_ops), _node_ops(n, kernel_attn) if n["kind"] == "compute" else 0)
                for n in wl.nodes]
    node_us = [kernel_us[n["kernel"]] if n["kind"] == "compute" else 0.0 for n in wl.nodes]
    timed = _time_nodes(wl, loaded, cc, node_us, fidelity, runtime, node_ops)
    shared = shared_stream_times(wl, cc, kernel_us, kernel_bytes, timed[1], timed[2],
                                 summarize(loaded.chip).hbm_bandwidth_gbps)
    if shared is not None and shared != node_us:  # a second pass only when a node's time changed
        node_us = shared
        timed = _time_nodes(wl, loaded, cc, node_us, fidelity, runtime, node_ops)
    sim, start, end, tasks, path_nodes = timed
    n_wl = len(wl.nodes)
    makespan = float(end.max()) if len(end) else 0.0
    breakdown, path_within = _critical_path(path_nodes, start, end)
    step = makespan
    period_parts: dict[str, float] = {}
    repeat = wl.meta.get("repeat")
    if repeat and len(repeat["marks"]) >= 2:  # the simulated stretch -> L periods
        marks = repeat["marks"]
        t0, t1, t2 = end[repeat["start"]], end[marks[-2]], end[marks[-1]]
        period = float(t2 - t1)
        step += repeat["layers"] * period - float(t2 - t0)
        for cat, us in path_within(t0, t2).items():
            breakdown[cat] -= us
        period_parts = path_within(t1, t2)
        for cat, us in period_parts.items():
            breakdown[cat] = breakdown.get(cat, 0.0) + repeat["layers"] * us
        breakdown = {k: v for k, v in breakdown.items() if abs(v) > 1e-9}
    for cat in FIXED_CATEGORIES:  # always reported (0: none on the critical path)
        breakdown.setdefault(cat, 0.0)
    return WorkloadTiming(step_us=step, makespan_us=makespan, breakdown_us={k: round(v, 3) for k, v in breakdown.items()},
                          node_start_us=start[:n_wl], node_end_us=end[:n_wl], kernel_us=kernel_us, node_us=node_us,
                          links=_link_utilization(sim, makespan),
                          fabric={"fidelity": fidelity, "events": sim.events, "tasks": tasks},
                          period_breakdown_us={k: round(v, 3) for k, v in period_parts.items()},
                          runtime=runtime.as_dict(),
                          host_busy_us=float((end[n_wl:] - start[n_wl:]).sum()) if len(end) > n_wl else 0.0)


#: compute-node categories whose kernels are parts of one operator counted elsewhere: the MoE
#: dispatch / combine operators' local work (the operator is its transfers node)
_PART_OF_OPERATOR = ("dispatch", "combine")


def _node_ops(node: dict, kernel_ops: list[int]) -> int:
    """The operators the runtime dispatches and launches for ``node``: a compute node its kernel's
    (0 for the MoE operators' local work, part of the operator), a collective or transfers node 1
    (one HCCL / MoE operator), a barrier 0."""
    if node["kind"] == "compute":
        return 0 if node["category"] in _PART_OF_OPERATOR else kernel_ops[node["kernel"]]
    return 1 if node["kind"] in ("collective", "transfers") else 0


@dataclass
class _PathNodes:
    """The nodes the critical path walks: the workload's, then the runtime's host tasks (graph
    launch, host dispatch, scheduler); each with its dependencies in that numbering, its
    category and the launch time inside it (us)."""

    deps: list[list[int]]
    category: list[str]
    launch_us: list[float]


def _time_nodes(wl: Workload, loaded: LoadedSystem, cc: ChipCost, node_us: list[float], fidelity: str,
                rt: StepRuntime | None = None, node_ops: list[tuple[int, int]] | None = None):
    """One timing pass with each compute node taking ``node_us`` plus its kernels' launches, the
    runtime's host tasks as :class:`StepRuntime` says (``node_ops``: each node's operators and
    attention operators): (simulator, start and end of every path node -- the workload's nodes
    first --, tasks, :class:`_PathNodes`)."""
    from npusim.system.mapper import rank_ends

    rt = rt or StepRuntime("graph")
    node_ops, node_attn = zip(*node_ops) if node_ops else ([0] * len(wl.nodes), [0] * len(wl.nodes))
    topo = loaded.topology
    vertex = [topo.index[n] for n in topo.die_names[: wl.ranks]]
    sim = SystemSim(loaded, fidelity)
    w = WorkBuilder(sim)
    reduce = reduction_ps(loaded, cc)
    node_rank_task: list[dict[int, int]] = []  # per node: rank -> its last task there
    node_done: list[int] = []  # per node: the task after which all of it is done
    spans: list[tuple[int, int]] = []  # per node: its first and last task id
    n_wl = len(wl.nodes)
    p_deps = [list(n["deps"]) for n in wl.nodes]
    p_cat = [n["category"] for n in wl.nodes]
    p_launch = [0.0] * n_wl
    host_tasks: list[int] = []  # the runtime's host tasks, path nodes n_wl, n_wl + 1, ...
    host_last: dict[int, int] = {}  # rank -> its last host path node (eager dispatch chain; graph: launch, updates)
    eager = rt.mode == "eager"

    def dispatch_us(i: int) -> float:
        """Node ``i``'s eager host dispatch: an HCCL collective's, or its operators' (a fused-attention
        operator ``attention_dispatch_us``, any other ``host_dispatch_us``)."""
        if wl.nodes[i]["kind"] == "collective":
            return rt.hccl_dispatch_us
        attn = min(node_attn[i], node_ops[i])
        return (node_ops[i] - attn) * rt.host_dispatch_us + attn * rt.attention_dispatch_us

    def host(rank: int, us: float, deps: list[int], path_deps: list[int]) -> int:
        """A task of ``us`` on ``rank``'s host queue after ``deps``; its path node's index."""
        host_tasks.append(w.compute(vertex[rank], int(round(us * PS_PER_US)), deps, unit="host"))
        p_deps.append(path_deps)
        p_cat.append("host")
        p_launch.append(0.0)
        return n_wl + len(host_tasks) - 1

    first_dispatch: dict[int, tuple[int, int]] = {}  # eager: rank -> (its first dispatched node, host node)

    def chained(rank: int, us: float) -> int:
        """A host task of ``us`` on ``rank`` after its host queue's last one; its path node."""
        prev = host_last.get(rank)
        h = host(rank, us, [host_tasks[prev - n_wl]] if prev is not None else [], [prev] if prev is not None else [])
        host_last[rank] = h
        return h

    def host_ready(i: int, rank: int) -> int:
        """The host task node ``i`` waits for on ``rank`` (eager: its dispatch; graph: its attention
        operators' parameter update, else the step's graph launch); -1: none. Adds it to node
        ``i``'s path dependencies."""
        if eager:
            if not node_ops[i] or dispatch_us(i) <= 0:
                return -1
            if first_dispatch.get(rank, (-1,))[0] == i:  # dispatched before the step's start mark
                h = host_last[rank] = first_dispatch[rank][1]
            else:
                h = chained(rank, dispatch_us(i))
        elif node_attn[i] and rt.graph_update_us > 0:
            h = chained(rank, node_attn[i] * rt.graph_update_us)
        else:
            h = launched[rank]
        p_deps[i].append(h)
        return host_tasks[h - n_wl]

    # a node of one rank (compute, a rank's barrier) or of communication between ranks: a rank of a
    # communication node that takes no part in it has nothing there to wait for
    ranked = [("rank" in n) or n["kind"] in ("collective", "transfers") for n in wl.nodes]

    def ready(deps: list[int], rank: int, multi: bool = False) -> list[int]:
        """What ``rank`` waits for: each dependency's part on it, else the whole dependency; a
        node of several ranks skips the single-rank and communication nodes ``rank`` takes no
        part in (data crosses ranks only by communication, and this node is that communication:
        its other ranks wait for their own parts)."""
        out = []
        for d in deps:
            if rank in node_rank_task[d]:
                out.append(node_rank_task[d][rank])
            elif not (multi and ranked[d]):
                out.append(node_done[d])
        return out

    def joined(tasks: list[int]) -> int:
        tasks = [t for t in tasks if t >= 0]
        return -1 if not tasks else tasks[0] if len(tasks) == 1 else w.barrier(tasks)

    if not eager:  # the step's graph launched on each die's host before anything runs
        for r in range(wl.ranks):
            host_last[r] = host(r, rt.graph_launch_us, [], [])
    elif rt.host_dispatch_us > 0 or rt.hccl_dispatch_us > 0 or rt.attention_dispatch_us > 0:  # each die's first operator dispatched first
        for i, n in enumerate(wl.nodes):
            ranks = [n["rank"]] if n["kind"] == "compute" else n.get("ranks", []) if node_ops[i] else []
            for r in ranks:
                if r not in first_dispatch and node_ops[i] and dispatch_us(i) > 0:
                    first_dispatch[r] = (i, host(r, dispatch_us(i), [], []))
            if len(first_dispatch) == wl.ranks:
                break
        host_last.update({r: h for r, (_, h) in first_dispatch.items()})
    launched = dict(host_last)  # rank -> the host node the step's start waits for (graph launch, first dispatch)
    launches = [host_tasks[launched[r] - n_wl] for r in range(wl.ranks) if r in launched]

    for i, (n, us) in enumerate(zip(wl.nodes, node_us)):
        first = w.base + w.count
        kind, deps = n["kind"], n["deps"]
        if kind == "barrier" and not deps and launches and ("rank" not in n or n["rank"] in launched):
            # a mark at the step's start: after the graph launch (eager: the first operators' dispatch)
            if "rank" in n:
                p_deps[i].append(launched[n["rank"]])
                deps_tasks = [host_tasks[launched[n["rank"]] - n_wl]]
            else:
                p_deps[i].extend(launched[r] for r in sorted(launched))
                deps_tasks = launches
            done = w.barrier(deps_tasks)
            node_rank_task.append({n["rank"]: done} if "rank" in n else {})
            node_done.append(done)
            spans.append((first, w.base + w.count - 1))
            continue
        if kind == "compute":
            r = n["rank"]
            h = host_ready(i, r)
            launch = node_ops[i] * rt.kernel_launch_us
            p_launch[i] = launch
            t = w.compute(vertex[r], int(round((us + launch) * PS_PER_US)),
                          ready(deps, r) + ([h] if h >= 0 else []), unit=n.get("stream", "compute"))
            per_rank, done = {r: t}, t
        elif kind == "barrier" and "rank" in n:
            done = w.barrier(ready(deps, n["rank"]))
            per_rank = {n["rank"]: done}
        elif kind == "barrier":
            done = w.barrier([node_done[d] for d in deps])
            per_rank = {}
        else:
            ranks = n["ranks"]
            starts = [joined(ready(deps, r, multi=True) + [host_ready(i, r)]) for r in ranks]
            if kind == "collective":
                built = build_collective(w, n["op"], [vertex[r] for r in ranks], n["bytes"], n.get("algorithm"), reduce_ps=reduce,
                                         node_of=lambda v: topo.node_of(v), ready=starts)
                per_rank, done = dict(zip(ranks, built.per_rank)), built.done
            else:
                _, into = matrix_transfers(w, [vertex[r] for r in ranks], np.asarray(n["bytes"], np.int64),
                                           n.get("via"), starts)
                per_rank = {r: joined(into[i] + [starts[i]]) for i, r in enumerate(ranks)}
                done = w.barrier([t for t in per_rank.values() if t >= 0] or [s for s in starts if s >= 0])
        node_rank_task.append(per_rank)
        node_done.append(done)
        spans.append((first, w.base + w.count - 1))
    step_end = rt.sync_us + rt.scheduler_us
    if step_end > 0:  # each die's host after its last work: the synchronize on the step's tokens, the scheduler
        for r, ends in sorted(rank_ends(wl).items()):
            tasks = [node_rank_task[d].get(r, node_done[d]) for d in ends]
            if r in host_last:
                tasks.append(host_tasks[host_last[r] - n_wl])
            host(r, step_end, [t for t in tasks if t >= 0], list(ends))
    w.submit()
    sim.run()
    start, end = _node_times(sim, spans)
    if host_tasks:
        tt = sim.engine.tt
        ids = np.asarray(host_tasks)
        start = np.concatenate([start, tt.start[ids] / PS_PER_US])
        end = np.concatenate([end, tt.end[ids] / PS_PER_US])
    return sim, start, end, int(w.count), _PathNodes(p_deps, p_cat, p_launch)


def _node_times(sim: SystemSim, spans: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Each node's first start and last end (us) over its tasks that do work (transfers, compute);
    a node of zero-time marks only takes theirs."""
    tt = sim.engine.tt
    n_tasks = sim.engine.num_tasks
    work = (tt.queue[:n_tasks] >= 0) | (tt.kind[:n_tasks] == KIND_FLOW)
    start = np.empty(len(spans))
    end = np.empty(len(spans))
    for i, (a, b) in enumerate(spans):
        sel = np.flatnonzero(work[a: b + 1]) + a
        if not sel.shape[0]:
            sel = np.arange(a, b + 1)
        start[i] = tt.start[sel].min()
        end[i] = tt.end[sel].max()
    return start / PS_PER_US, end / PS_PER_US


def _critical_path(nodes: _PathNodes, start: np.ndarray, end: np.ndarray):
    """The critical path's time by category (sums to the makespan), and a function giving the same
    for the part of the path within ``(lo, hi]`` (the repeated layer's period: each piece of the
    path clipped to it, so the parts sum to ``hi - lo``). A node's piece runs from the end of the
    dependency it waited for last to its own end; the kernel launches in a compute node are the
    first part of its piece (at most the piece), filed under ``launch``."""
    if not nodes.deps:
        return {}, lambda lo, hi: {}
    path = []  # (node, its piece of the path: from, to)
    node = int(np.argmax(end))
    while True:
        deps = nodes.deps[node]
        pred = max(deps, key=lambda d: end[d]) if deps else None
        base = end[pred] if pred is not None else 0.0
        path.append((node, min(base, end[node]), end[node]))
        if pred is None:
            break
        node = pred

    def add(out: dict, i: int, a: float, b: float, lo: float, hi: float) -> None:
        cut = a + min(b - a, nodes.launch_us[i])  # (a, cut]: launches; (cut, b]: the node's category
        for cat, x, y in (("launch", a, cut), (nodes.category[i], cut, b)):
            us = min(y, hi) - max(x, lo)
            if us > 0:
                out[cat] = out.get(cat, 0.0) + us

    def within(lo: float, hi: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, a, b in path:
            add(out, i, a, b, lo, hi)
        return out

    return within(-np.inf, np.inf), within


def _link_utilization(sim: SystemSim, makespan_us: float, top: int = 20) -> list[dict]:
    """The ``top`` busiest directed links: wire bytes, mean GB/s over the step, utilisation (<= 1)."""
    topo = sim.topology
    wire = sim.link_bytes()
    if makespan_us <= 0 or wire.sum() == 0:
        return []
    ps = makespan_us * PS_PER_US
    util = wire / (topo.link_cap * ps)
    order = np.argsort(-util, kind="stable")[:top]
    return [{"link": f"{topo.names[topo.link_src[i]]}->{topo.names[topo.link_dst[i]]}",
             "fabric": topo.link_fabric[i], "bytes": int(wire[i]), "gbps": float(wire[i] / ps * 1000),
             "utilization": float(util[i])} for i in order if wire[i] > 0]
