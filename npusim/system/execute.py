"""Time a :class:`~npusim.system.workload.Workload` on a system: chip costs + the fabric engine.

Each kernel of the workload is costed once by the chip simulator on the system's die
(:class:`~npusim.system.chipcost.ChipCost`, memoised on disk): a GEMM by the chip-cost GEMM kernel,
a layer part or ONNX graph operator by operator (:func:`operators_cost`: its GEMMs by the GEMM
kernel, which uses the die's L2, its vector ops by the vector operator, attention and experts by the
mapper, one after another with their inputs and outputs in HBM, as an operator runtime launches them; each operator holds its stream at least the
system runtime's ``launch_us``, the host's launch floor); each node becomes system tasks:
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

Results: the step time (the makespan; with ``meta.repeat``, the simulated layers replaced by the
layer count at the measured period), each node's start and end (over its transfer and compute
tasks), and ``breakdown_us``: the step's critical path
(walked back from the last node through the dependency that finished last), each piece of it
filed under the category of the node it ends in, so the parts sum to the step time. Waiting for
a busy stream counts under the node that waited. ``link_utilization``: each directed fabric
link's wire bytes over (capacity x makespan), the busiest links first.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


def cost_kernels(wl: Workload, cc: ChipCost, hbm_fraction: float = 1.0,
                 launch_us: float = 0.0) -> tuple[list[float], list[float]]:
    """Each kernel's time on the die (microseconds) and the HBM bytes it moves, with the share
    ``hbm_fraction`` of the die's HBM bandwidth; every operator takes at least ``launch_us`` (the
    runtime's launch floor, :class:`~npusim.system.schema.Runtime`; ``fixed`` kernels are
    calibrated times and are kept as they are)."""
    cfg = None
    out: list[float] = []
    moved: list[float] = []
    for spec in wl.kernels:
        kind, cores = spec["type"], spec.get("cores")
        nbytes = 0.0
        if kind in ("gemm", "layer", "onnx"):
            if kind == "gemm":
                r = cc.gemm(spec["m"], spec["k"], spec["n"], spec.get("dtype", "bf16"), cores,
                            batch=spec.get("batch", 1), hbm_fraction=hbm_fraction)
                us = max(r.time_us, launch_us)
            else:
                cfg = cfg or (get_config(wl.meta["model"]) if kind == "layer" else None)
                graph = layer_part_graph(cfg, spec) if kind == "layer" else onnx_graph(spec)
                r = operators_cost(cc, graph, cores, hbm_fraction, launch_us)
                us = r.time_us
            nbytes = float(r.hbm_bytes)
        elif kind == "vector":
            op = Op(name=f"vector {spec['op_class']}", kind="vector", dtype=spec.get("dtype", "bf16"),
                    elements=int(spec["elements"]), op_class=spec["op_class"], fn=spec.get("fn"),
                    row_len=spec.get("row_len"))
            r = cc.vector(op, cores, hbm_fraction=hbm_fraction)
            us, nbytes = max(r.time_us, launch_us), float(r.hbm_bytes)
        elif kind == "fixed":
            us = float(spec["us"])
        elif kind == "sum":
            us = sum(out[i] for i in spec["of"]) * spec.get("times", 1)
            nbytes = sum(moved[i] for i in spec["of"]) * spec.get("times", 1)
        else:  # blend
            a, b = out[spec["a"]], out[spec["b"]]
            us = max(0.0, a + (b - a) * spec["weight"])
            nbytes = max(0.0, moved[spec["a"]] + (moved[spec["b"]] - moved[spec["a"]]) * spec["weight"])
        out.append(us)
        moved.append(nbytes)
    return out, moved


@dataclass(frozen=True)
class OperatorsCost:
    time_us: float
    hbm_bytes: int


def operators_cost(cc: ChipCost, graph, cores, hbm_fraction: float = 1.0, launch_us: float = 0.0) -> OperatorsCost:
    """A graph run operator after operator, as the die's runtime launches them (:meth:`ChipCost.op`:
    each GEMM by the chip-cost GEMM kernel, its operands from HBM or the L2; each vector op by the
    vector operator; attention and experts by the mapper); an operator's inputs and outputs pass
    through HBM; each takes at least ``launch_us``."""
    results = [cc.op(op, cores, hbm_fraction=hbm_fraction) for op in graph.ops]
    return OperatorsCost(sum(max(r.time_us, launch_us) for r in results), sum(r.hbm_bytes for r in results))


SHARE_STEPS = 20  # HBM shares are rounded to 1/20 (each distinct share is one more chip cost)


def shared_stream_times(wl: Workload, cc: ChipCost, kernel_us: list[float], kernel_bytes: list[float],
                        start: np.ndarray, end: np.ndarray, hbm_gbps: float,
                        launch_us: float = 0.0) -> list[float] | None:
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
                    recost[share] = cost_kernels(wl, cc, share, launch_us)[0]
                node_us[i] = (1 - min(o, 1.0)) * t_alone + min(o, 1.0) * recost[share][k]
    return node_us


def time_workload(wl: Workload, loaded: LoadedSystem, chip_cost: ChipCost | None = None,
                  fidelity: str = "flow", launch_us: float | None = None) -> WorkloadTiming:
    """Time ``wl`` on ``loaded`` (ranks on the system's first dies); see the module docstring.
    ``launch_us``: the operator launch floor (default: the workload's ``meta.launch_us``, as the
    path that built it chose, else the system's ``runtime.launch_us``)."""
    topo = loaded.topology
    if wl.ranks > len(topo.die_names):
        raise ConfigError(f"the workload has {wl.ranks} ranks but {loaded.system.name} has {len(topo.die_names)} dies "
                          "(a bigger --nodes or system)")
    cc = chip_cost or ChipCost(loaded.chip)
    launch = launch_us if launch_us is not None else wl.meta.get("launch_us", loaded.system.runtime.launch_us)
    kernel_us, kernel_bytes = cost_kernels(wl, cc, launch_us=launch)
    node_us = [kernel_us[n["kernel"]] if n["kind"] == "compute" else 0.0 for n in wl.nodes]
    timed = _time_nodes(wl, loaded, cc, node_us, fidelity)
    shared = shared_stream_times(wl, cc, kernel_us, kernel_bytes, timed[1], timed[2],
                                 summarize(loaded.chip).hbm_bandwidth_gbps, launch)
    if shared is not None and shared != node_us:  # a second pass only when a node's time changed
        node_us = shared
        timed = _time_nodes(wl, loaded, cc, node_us, fidelity)
    sim, start, end, tasks = timed
    makespan = float(end.max()) if len(end) else 0.0
    breakdown, path_within = _critical_path(wl, start, end)
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
    return WorkloadTiming(step_us=step, makespan_us=makespan, breakdown_us={k: round(v, 3) for k, v in breakdown.items()},
                          node_start_us=start, node_end_us=end, kernel_us=kernel_us, node_us=node_us,
                          links=_link_utilization(sim, makespan),
                          fabric={"fidelity": fidelity, "events": sim.events, "tasks": tasks},
                          period_breakdown_us={k: round(v, 3) for k, v in period_parts.items()})


def _time_nodes(wl: Workload, loaded: LoadedSystem, cc: ChipCost, node_us: list[float], fidelity: str):
    """One timing pass with each compute node taking ``node_us``: (simulator, node starts, node
    ends, tasks)."""
    topo = loaded.topology
    vertex = [topo.index[n] for n in topo.die_names[: wl.ranks]]
    sim = SystemSim(loaded, fidelity)
    w = WorkBuilder(sim)
    reduce = reduction_ps(loaded, cc)
    node_rank_task: list[dict[int, int]] = []  # per node: rank -> its last task there
    node_done: list[int] = []  # per node: the task after which all of it is done
    spans: list[tuple[int, int]] = []  # per node: its first and last task id

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

    for n, us in zip(wl.nodes, node_us):
        first = w.base + w.count
        kind, deps = n["kind"], n["deps"]
        if kind == "compute":
            r = n["rank"]
            t = w.compute(vertex[r], int(round(us * PS_PER_US)), ready(deps, r),
                          unit=n.get("stream", "compute"))
            per_rank, done = {r: t}, t
        elif kind == "barrier" and "rank" in n:
            done = w.barrier(ready(deps, n["rank"]))
            per_rank = {n["rank"]: done}
        elif kind == "barrier":
            done = w.barrier([node_done[d] for d in deps])
            per_rank = {}
        else:
            ranks = n["ranks"]
            starts = [joined(ready(deps, r, multi=True)) for r in ranks]
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
    w.submit()
    sim.run()
    start, end = _node_times(sim, spans)
    return sim, start, end, int(w.count)


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


def _critical_path(wl: Workload, start: np.ndarray, end: np.ndarray):
    """The critical path's time by category (sums to the makespan), and a function giving the same
    for the part of the path that ends within ``(lo, hi]`` (the repeated layer's period)."""
    if not wl.nodes:
        return {}, lambda lo, hi: {}
    path = []  # (node, its piece of the path)
    node = int(np.argmax(end))
    while True:
        deps = wl.nodes[node]["deps"]
        pred = max(deps, key=lambda d: end[d]) if deps else None
        base = end[pred] if pred is not None else 0.0
        path.append((node, max(0.0, end[node] - base)))
        if pred is None:
            break
        node = pred
    totals: dict[str, float] = {}
    for i, us in path:
        cat = wl.nodes[i]["category"]
        totals[cat] = totals.get(cat, 0.0) + us

    def within(lo: float, hi: float) -> dict[str, float]:
        out: dict[str, float] = {}
        for i, us in path:
            if lo < end[i] <= hi:
                cat = wl.nodes[i]["category"]
                out[cat] = out.get(cat, 0.0) + us
        return out

    return totals, within


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
