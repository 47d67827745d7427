"""Measure one thing on an idle system: a point-to-point transfer, a collective, an MoE dispatch/combine.

Behind ``npusim fabric`` and ``npusim collective --system``; the validation scripts call these too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from npusim.arch import summarize
from npusim.arch.schema import DTYPE_BYTES
from npusim.model.ir import Op
from npusim.system.chipcost import ChipCost
from npusim.errors import ConfigError
from npusim.system.collectives import ALGORITHMS, build_collective, matrix_transfers
from npusim.system.load import LoadedSystem
from npusim.system.moe import combine_bytes_per_token, combine_local_ops, dispatch_bytes_per_token, \
    dispatch_local_ops, moe_traffic
from npusim.system.simulator import PS_PER_US, SystemSim
from npusim.system.work import WorkBuilder


def parse_ranks(loaded: LoadedSystem, spec: str) -> list[int]:
    """``16`` = the first 16 dies (npu0.die0, npu0.die1, npu1.die0, ...); or a comma list of names."""
    topo = loaded.topology
    text = str(spec).strip()
    if text.isdigit():
        n = int(text)
        dies = topo.die_names
        if not 1 <= n <= len(dies):
            raise ConfigError(f"--ranks {n}: {loaded.system.name} has {len(dies)} dies")
        return [topo.index[d] for d in dies[:n]]
    return [topo.endpoint(part) for part in text.split(",") if part.strip()]


def reduction_ps(loaded: LoadedSystem, chip_cost: ChipCost | None = None, dtype: str = "bf16"):
    """Time for a die to add a received chunk of ``nbytes`` into its own: the chip simulator's time
    for the element-wise add on all of the die's cores (memoised per size), but at least the HBM
    traffic of reading both operands and writing the sum (3 x bytes at the die's HBM bandwidth):
    the chip's mapper keeps activations on chip, while a received chunk lands in HBM."""
    chip_cost = chip_cost or ChipCost(loaded.chip)
    gbps = summarize(loaded.chip).hbm_bandwidth_gbps
    if dtype not in DTYPE_BYTES:
        raise ConfigError(f"--dtype {dtype}: expected one of {', '.join(DTYPE_BYTES)}")
    elem = DTYPE_BYTES[dtype]

    def cost(nbytes: int) -> int:
        op = Op(name="collective_reduce", kind="vector", dtype=dtype, elements=max(1, int(nbytes / elem)),
                op_class="elementwise", fn="add")
        compute_us = chip_cost.op(op).work_us  # inside the collective's kernel: no start or prologue of its own
        return int(round(max(compute_us * 1e6, 3 * nbytes / gbps * 1000)))

    return cost


@dataclass
class P2PResult:
    src: str
    dst: str
    op: str
    bytes: int
    fabric: str
    fidelity: str
    via: str
    latency_us: float
    bandwidth_gbps: float
    hops: int
    path: list[str]
    wire_bytes: int

    def to_dict(self) -> dict:
        return asdict(self)


def point_to_point(loaded: LoadedSystem, src: str, dst: str, op: str, nbytes: int, fidelity: str = "flow",
                   via: str | None = None, fabric: str | None = None) -> P2PResult:
    """One transfer on an idle fabric: ``src`` initiates, ``dst`` is the memory read or written."""
    sim = SystemSim(loaded, fidelity)
    topo = loaded.topology
    a, b = topo.endpoint(src), topo.endpoint(dst)
    if a == b:
        raise ConfigError("--src and --dst are the same endpoint")
    w = WorkBuilder(sim)
    tid = w.transfer(a, b, nbytes, op, via, fabric)
    w.submit()
    sim.run()
    start, end = sim.task_times_ps(np.array([tid]))
    us = (end[0] - start[0]) / PS_PER_US
    data_src, data_dst = (a, b) if op == "write" else (b, a)
    rid, fab = sim.route(data_src, data_dst, fabric)
    return P2PResult(
        src=topo.names[a], dst=topo.names[b], op=op, bytes=nbytes, fabric=fab, fidelity=fidelity,
        via=via or loaded.system.initiator.default, latency_us=us,
        bandwidth_gbps=nbytes / (us * 1e3) if us > 0 else 0.0, hops=sim.route_hops(rid), path=sim.route_path(rid),
        wire_bytes=int(sim.engine.tt.param[tid, 1]),
    )


@dataclass
class CollectiveRun:
    op: str
    algorithm: str
    ranks: int
    bytes_per_rank: int
    fidelity: str
    via: str
    time_us: float
    algbw_gbps: float
    bus_bandwidth_gbps: float
    transfers: int
    events: int
    rate_updates: int
    peak_link_load: float
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d.pop("extra")
        d.update(self.extra)
        return d


def _finish(sim: SystemSim, w: WorkBuilder, op: str, algorithm: str, n: int, nbytes: int, bus_factor: float,
            via: str, progress=None, **extra) -> CollectiveRun:
    w.submit()
    sim.run(progress=progress)
    us = sim.now_ps / PS_PER_US
    algbw = nbytes / (us * 1e3) if us > 0 else 0.0
    return CollectiveRun(op=op, algorithm=algorithm, ranks=n, bytes_per_rank=nbytes, fidelity=sim.fidelity, via=via,
                         time_us=us, algbw_gbps=algbw, bus_bandwidth_gbps=algbw * bus_factor,
                         transfers=w.transfers_recorded, events=sim.events, rate_updates=sim.rate_updates,
                         peak_link_load=sim.peak_link_load, extra=extra)


def run_collective(loaded: LoadedSystem, op: str, ranks: Sequence[int], nbytes: int, algorithm: str | None = None,
                   fidelity: str = "flow", via: str | None = None, progress=None, dtype: str = "bf16",
                   expansion: str | None = None, **sim_options) -> CollectiveRun:
    """``sim_options`` go to :class:`SystemSim` (``rate_quantum_ns``, ``fair_tolerance``, ``packet_bytes``);
    ``expansion``: HCCL's op expansion mode for its algorithm choice (None: the system's ``hccl.expansion``).
    ``extra["engine"]``: where HCCL expands its default choice on an A3 server (:func:`~npusim.system.collectives.hccl_engine`)."""
    sim = SystemSim(loaded, fidelity, **sim_options)
    w = WorkBuilder(sim)
    via = via or loaded.system.initiator.default
    chip_cost = ChipCost(loaded.chip)
    built = build_collective(w, op, list(ranks), nbytes, algorithm, via, reduction_ps(loaded, chip_cost, dtype),
                             loaded.topology.node_of, expansion=expansion)
    extra = {"engine": built.engine} if built.engine else {}  # HCCL's expansion engine (collectives.hccl_engine)
    return _finish(sim, w, op, built.algorithm, len(ranks), nbytes, built.bus_factor(), via, progress,
                   chip_cost_hits=chip_cost.stats.hits, chip_cost_misses=chip_cost.stats.misses, **extra)


def run_moe(loaded: LoadedSystem, op: str, ep: int, tokens_per_rank: int, top_k: int = 8, hidden: int = 7168,
            experts: int = 256, routing: str = "uniform", dtype: str = "int8", fidelity: str = "flow",
            via: str = "aiv", seed: int = 0, progress=None, copies: str | None = None,
            **sim_options) -> CollectiveRun:
    """MoE dispatch (tokens to the ranks of their experts) or combine (results back), EP ranks =
    the first ``ep`` dies (see :mod:`npusim.system.moe`): on each die the operator's calibrated
    per-call overhead and its local work (costed by the chip simulator on the whole die), then the
    transfers, then the receiver's local work; ``copies`` default: the system's decode
    (low-latency) kernels'."""
    if op not in ("dispatch", "combine"):
        raise ConfigError(f"--op {op}: expected dispatch or combine")
    dies = loaded.topology.die_names
    if ep > len(dies):
        raise ConfigError(f"--ep {ep}: {loaded.system.name} has {len(dies)} dies (one EP rank per die)")
    ranks = [loaded.topology.index[d] for d in dies[:ep]]
    copies = copies or loaded.system.moe_operators.decode_copies
    traffic = moe_traffic(ep, tokens_per_rank, top_k, experts, routing, seed, copies)
    per_token = dispatch_bytes_per_token(hidden, dtype) if op == "dispatch" else combine_bytes_per_token(hidden)
    counts = traffic.tokens if op == "dispatch" else traffic.tokens.T  # combine flows expert rank -> token rank
    sizes = counts * per_token
    np.fill_diagonal(sizes, 0)
    sim = SystemSim(loaded, fidelity, **sim_options)
    w = WorkBuilder(sim)
    ops = loaded.system.moe_operators
    overhead_us = ops.dispatch_overhead_us if op == "dispatch" else ops.combine_overhead_us
    # the operator's local work on each die (npusim.system.moe): dispatch quantises and packs before
    # sending and reorders what it received; combine takes the weighted sums of what came back
    cc = ChipCost(loaded.chip)

    def local_ps(vector_ops) -> int:
        # inside the operator's one fused kernel (its calibrated per-call overhead stands for its
        # start): each vector op's work without a kernel start or prologue of its own
        return int(round(sum(cc.vector(v).work_us for v in vector_ops) * PS_PER_US))
    sent, received = traffic.tokens.sum(axis=1), traffic.tokens.sum(axis=0)
    local = [dispatch_local_ops(tokens_per_rank, int(sent[i]), int(received[i]), hidden, dtype)
             if op == "dispatch" else ([], combine_local_ops(int(sent[i]), hidden)) for i in range(ep)]
    start = [w.compute(r, int(round(overhead_us * PS_PER_US)) + local_ps(local[i][0])) for i, r in enumerate(ranks)]
    _, into = matrix_transfers(w, ranks, sizes, via, start)
    for i, r in enumerate(ranks):
        w.compute(r, local_ps(local[i][1]), into[i] + [start[i]])
    # the expert side's traffic: what each rank receives (dispatch) or sends back (combine)
    rank_bytes = sizes.sum(axis=0) if op == "dispatch" else sizes.sum(axis=1)
    mean = float(rank_bytes.mean())
    return _finish(sim, w, op, "direct", ep, int(sizes.sum() // max(ep, 1)), 1.0, via, progress,
                   tokens_per_rank=tokens_per_rank, top_k=top_k, hidden=hidden, experts=experts,
                   routing=routing, dtype=dtype if op == "dispatch" else "bf16", bytes_per_token=per_token, copies=copies,
                   max_rank_bytes=int(rank_bytes.max()), mean_rank_bytes=mean, operator_overhead_us=overhead_us,
                   imbalance=float(rank_bytes.max() / mean) if mean > 0 else 1.0,
                   max_expert_tokens=int(traffic.expert_tokens.max()),
                   mean_expert_tokens=float(traffic.expert_tokens.mean()))


