"""``SystemSim``: the engine and the fabric model of one system, fed with transfers and compute.

Python side of the system level: it names the engine's queues (per die: ``compute`` and ``moe``,
two compute streams on two core shares, ``aiv``, ``host`` (the die's host thread dispatching its
operators, :class:`~npusim.system.schema.Runtime`) and the SDMA engines; per CPU: ``dma``), turns a
transfer (initiator, target, read/write, bytes, SDMA or AIV-direct) into a ``KIND_FLOW`` task with
its route and protocol costs, and runs :func:`npusim.system.kernel.system_loop`.

Protocol costs (see :class:`npusim.system.schema.Protocol`), for a transfer of ``B`` payload
bytes between initiator ``I`` and target ``T`` on a fabric:

* a **write** moves ``B / write_efficiency[kind(T)]`` wire bytes from ``I`` to ``T``; it completes
  when the acknowledgement is back: one path latency ``I -> T`` after the last byte leaves, plus one
  ``T -> I``;
* a **read** sends a request (its latency ``I -> T``, no bandwidth charged), then moves
  ``B / read_efficiency[kind(T)]`` wire bytes from ``T`` to ``I``; it completes when the last byte
  arrives;
* both pay the fixed ``*_overhead_ns[kind(T)]`` (launch, target access, completion) before the
  first byte moves, plus the initiator's launch (``sdma_launch_ns`` / ``aiv_launch_ns``);
* SDMA transfers queue on the initiator's SDMA engines (round robin over them, each engine
  held until its transfer completes, its fixed overhead included); AIV-direct transfers have no
  engine queue; with ``aiv_max_gbps`` a die's AIV-direct writes share a virtual issue link of that
  rate (wire bytes; reads are not capped);
* ``notify`` transfers (HCCL's Notify Record to a peer, :mod:`npusim.system.collectives`) are
  synchronisation tasks of the initiator's stream, not memory copies: they take no SDMA engine (so
  they never queue behind another stream's copy) and no launch; they pay the fabric's protocol
  overhead and path latency like any write.

A transfer whose initiator and target are the same endpoint moves nothing and takes no time.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from npusim.choices import FABRIC_FIDELITIES as FIDELITIES
from npusim.engine import Engine
from npusim.engine.tasks import KIND_FIXED, SC_NEVENTS
from npusim.errors import ConfigError, DeadlockError
from npusim.hw.fabric.state import (FP_RETURN_PS, FP_ROUTE, FP_SETUP_PS, FP_WIRE_BYTES, MODE_FLOW,
                                    MODE_PACKET, S_ROUNDS, S_UPDATES, grow_packets, grow_tasks,
                                    new_fabric_state)
from npusim.system.kernel import (KINDS, KIND_FLOW, STATUS_EVENT_LIMIT, STATUS_GROW, STATUS_GROW_PACKETS, STATUS_IDLE,
                                  STATUS_NOTIFY, STATUS_TIME_LIMIT, STATUS_WATCH, system_loop)
from npusim.system.load import LoadedSystem

# the flow model's speed knobs (npusim.hw.fabric.flow); 0 and ~0 = exact max-min
DEFAULT_QUANTUM_NS = 50.0
DEFAULT_TOLERANCE = 1e-3
PS_PER_US = 1_000_000
#: the largest transfer, in bytes: at 1 GB/s it lasts 1e6 s = 1e18 ps, within the int64 clock
MAX_TRANSFER_BYTES = 1e15


class SystemSim:
    """One system's engine and fabric state (see module docstring)."""

    def __init__(self, loaded: LoadedSystem, fidelity: str = "flow", packet_bytes: int | None = None,
                 rate_quantum_ns: float = DEFAULT_QUANTUM_NS, fair_tolerance: float = DEFAULT_TOLERANCE):
        if fidelity not in FIDELITIES:
            raise ConfigError(f"fabric fidelity '{fidelity}': expected one of {', '.join(FIDELITIES)}")
        self.loaded = loaded
        self.system = loaded.system
        self.topology = topo = loaded.topology
        self.fidelity = fidelity
        init = self.system.initiator
        names: list[str] = []
        self.queue_of: dict[tuple[int, str], int] = {}
        for v, name in enumerate(topo.names):
            kind = topo.vertex_kind[v]
            units = ("compute", "moe", "aiv", "host", *(f"sdma{k}" for k in range(init.sdma_engines))) if kind == "die" else \
                ("dma",) if kind == "cpu" else ()
            for unit in units:
                self.queue_of[(v, unit)] = len(names)
                names.append(f"{name}.{unit}")
        self.engine = Engine(names, task_capacity=4096)
        self._sdma_next: dict[int, int] = {}
        self._route_id: dict[tuple[str, int, int], int] = {}
        self._route_links: list[np.ndarray] = []
        self._route_lat: list[int] = []
        self._route_vertices: list[list[int]] = []
        link_hop_ps = topo.link_lat_ps + topo.vertex_latency_ps[topo.link_dst]
        self._link_hop_ps = link_hop_ps
        pkt = packet_bytes or min(f.packet_bytes for f in self.system.fabrics.values())
        self.fs = new_fabric_state(topo.link_cap, link_hop_ps, np.zeros(1, np.int64), np.zeros(0, np.int64),
                                   np.zeros(0, np.int64), 4096, MODE_PACKET if fidelity == "packet" else MODE_FLOW, pkt,
                                   quantum_ps=int(round(rate_quantum_ns * 1000)), tolerance=fair_tolerance)
        self._routes_dirty = False
        self._proto_cache: dict[tuple[str, str, str], tuple[float, float]] = {}
        self._is_die = np.array([k == "die" for k in topo.vertex_kind], bool)

    # -- routes -------------------------------------------------------------------
    def route(self, src: int, dst: int, fabric: str | None = None, aiv: bool = False) -> tuple[int, str]:
        """``(route id, fabric name)`` from ``src`` to ``dst`` (on ``fabric``, or the first fabric
        that connects them); ``aiv`` routes start with the initiator's AIV issue link, if it has one.
        Route ids count the routes in the order this simulator first used them; each route's links
        and latency are memoised on the topology (:attr:`Topology.sim_routes`), for every simulator
        of that system."""
        key = (fabric, src, dst, aiv)
        found = self._route_id.get(key)
        if found is None:
            memo = self.topology.sim_routes.get(key)
            if memo is None:
                fab, vertices, links = self.topology.route(src, dst, fabric)
                aiv_link = self.topology.aiv_link.get(src if aiv else -1)
                if aiv_link is not None:
                    links = [aiv_link, *links]
                links = np.asarray(links, np.int64)
                memo = self.topology.sim_routes[key] = (fab, vertices, links, int(self._link_hop_ps[links].sum()))
            fab, vertices, links, lat = memo
            rid = len(self._route_links)
            self._route_links.append(links)
            self._route_lat.append(lat)
            self._route_vertices.append(vertices)
            found = self._route_id[key] = (rid, fab)
            self._routes_dirty = True
        return found

    def route_path(self, rid: int) -> list[str]:
        return [self.topology.names[v] for v in self._route_vertices[rid]]

    def route_hops(self, rid: int) -> int:
        return len(self._route_vertices[rid]) - 1

    def _sync_routes(self) -> None:
        if not self._routes_dirty:
            return
        lengths = np.array([r.shape[0] for r in self._route_links], np.int64)
        ptr = np.zeros(len(lengths) + 1, np.int64)
        np.cumsum(lengths, out=ptr[1:])
        links = np.concatenate(self._route_links) if self._route_links else np.zeros(0, np.int64)
        self.fs = self.fs._replace(route_ptr=ptr, route_link=links, route_lat=np.asarray(self._route_lat, np.int64))
        self.fs = grow_tasks(self.fs, self.engine.tt.kind.shape[0], int(lengths.max(initial=1)))
        self._routes_dirty = False

    # -- building work -------------------------------------------------------------
    def transfers(self, initiators, targets, nbytes, op: str = "write", via: str | None = None,
                  fabric: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(kinds, queues, params)`` of a batch of transfers (see module docstring); raises ConfigError.

        ``initiators``/``targets`` are vertex ids, ``nbytes`` one size or one per transfer. A
        transfer from an endpoint to itself is a zero-time ``KIND_FIXED`` task. SDMA transfers take
        their initiator's engines in turn, in the batch's order."""
        if op not in ("read", "write"):
            raise ConfigError(f"transfer op '{op}': expected read or write")
        init = self.system.initiator
        via = via or init.default
        if via not in ("sdma", "aiv", "notify"):
            raise ConfigError(f"transfer mechanism '{via}': expected sdma, aiv or notify")
        inits = np.atleast_1d(np.asarray(initiators, np.int64))
        tgts = np.atleast_1d(np.asarray(targets, np.int64))
        if np.any(np.asarray(nbytes, np.float64) > MAX_TRANSFER_BYTES):
            raise ConfigError(f"a transfer of {np.max(nbytes):.3g} bytes: more than {MAX_TRANSFER_BYTES:.0e}, beyond "
                              "what the fabric's 64-bit picosecond clock times")
        sizes = np.broadcast_to(np.asarray(nbytes, np.int64), inits.shape)
        n = inits.shape[0]
        kinds = np.full(n, KIND_FLOW, np.int64)
        queues = np.full(n, -1, np.int64)
        params = np.zeros((n, 4), np.int64)
        topo = self.topology
        die = self._is_die[inits]
        launch_ns = np.zeros(n, np.float64)
        for i in np.flatnonzero(~die):
            queues[i] = self.queue_of[(int(inits[i]), "dma")]
        sel = np.flatnonzero(die)
        if via == "sdma" and sel.shape[0]:  # each initiator's engines in turn, in the batch's order
            engines = init.sdma_engines
            who, inv, counts = np.unique(inits[sel], return_inverse=True, return_counts=True)
            first = np.cumsum(counts) - counts
            nth = np.empty(sel.shape[0], np.int64)
            nth[np.argsort(inv, kind="stable")] = np.arange(sel.shape[0]) - np.repeat(first, counts)
            k0 = np.array([self._sdma_next.get(int(a), 0) for a in who], np.int64)
            sdma0 = np.array([self.queue_of[(int(a), "sdma0")] for a in who], np.int64)
            queues[sel] = sdma0[inv] + (k0[inv] + nth) % engines  # a die's sdma queues are consecutive
            for a, k, c in zip(who.tolist(), k0.tolist(), counts.tolist()):
                self._sdma_next[a] = (k + c) % engines
            launch_ns[sel] = init.sdma_launch_ns
        elif via == "aiv" and sel.shape[0]:
            launch_ns[sel] = init.aiv_launch_ns
        write = op == "write"
        moving = np.flatnonzero(inits != tgts)
        kinds[inits == tgts] = KIND_FIXED  # nothing moves
        if not moving.shape[0]:
            return kinds, queues, params
        a_m, b_m = inits[moving], tgts[moving]
        src, dst = (a_m, b_m) if write else (b_m, a_m)
        aiv = (die[moving] & (via == "aiv" and write)).tolist()
        kind_of = topo.vertex_kind
        rids = np.empty(moving.shape[0], np.int64)
        eff = np.empty(moving.shape[0], np.float64)
        ovh = np.empty(moving.shape[0], np.float64)
        back = np.empty(moving.shape[0], np.int64)  # the reverse path passes the same vertices
        route, protocol, route_lat = self.route, self._protocol, self._route_lat
        for j, (s, d, b, v) in enumerate(zip(src.tolist(), dst.tolist(), b_m.tolist(), aiv)):
            rid, fab = route(s, d, fabric, v)
            rids[j], back[j] = rid, route_lat[rid]
            eff[j], ovh[j] = protocol(fab, kind_of[b], op)
        params[moving, FP_ROUTE] = rids
        params[moving, FP_WIRE_BYTES] = np.ceil(sizes[moving] / eff).astype(np.int64)
        setup = np.round((ovh + launch_ns[moving]) * 1000).astype(np.int64)
        params[moving, FP_SETUP_PS] = setup if write else setup + back
        params[moving, FP_RETURN_PS] = back if write else 0
        return kinds, queues, params

    def _protocol(self, fabric: str, kind: str, op: str) -> tuple[float, float]:
        key = (fabric, kind, op)
        found = self._proto_cache.get(key)
        if found is None:
            proto = self.system.fabrics[fabric].protocol
            eff = (proto.write_efficiency if op == "write" else proto.read_efficiency).get(kind)
            ovh = (proto.write_overhead_ns if op == "write" else proto.read_overhead_ns).get(kind)
            if eff is None or ovh is None:
                raise ConfigError(f"fabric '{fabric}' of {self.system.name}: its protocol gives no {op} figures for "
                                  f"a {kind} target (protocol.{op}_efficiency / {op}_overhead_ns)")
            found = self._proto_cache[key] = (eff, ovh)
        return found

    def submit(self, kinds: np.ndarray, queues: np.ndarray, params: np.ndarray, dep_ptr: np.ndarray,
               dep_idx: np.ndarray, names: Sequence[str] | None = None) -> np.ndarray:
        """Submit a batch of tasks (``KIND_FIXED`` with ``param[0]`` = picoseconds, or ``KIND_FLOW``)."""
        bad = np.setdiff1d(np.asarray(kinds), np.asarray(KINDS))
        if bad.shape[0]:
            raise ConfigError(f"system task kind {int(bad[0])}: expected one of {KINDS} (fixed, notify, flow)")
        ids = self.engine.submit_batch(kinds, queues, params, dep_ptr, dep_idx, names)
        self._routes_dirty = True  # re-size the per-transfer state on the next run
        return ids

    # -- running --------------------------------------------------------------------
    def run(self, until_ps: int | None = None, progress=None, chunk_events: int = 2_000_000) -> int:
        """Run until idle (or ``until_ps``); raises DeadlockError if tasks are left that cannot start."""
        self._sync_routes()
        eng = self.engine
        until = np.int64(until_ps if until_ps is not None else np.iinfo(np.int64).max // 2)
        while True:
            status = system_loop(eng.tt, eng.heap, eng.hs, self.fs, until, np.int64(-1), np.int64(chunk_events))
            if status == STATUS_GROW:
                eng.grow_heap()
            elif status == STATUS_GROW_PACKETS:
                self.fs = grow_packets(self.fs)
            elif status == STATUS_EVENT_LIMIT:
                if progress is not None:
                    progress(eng.now, eng.num_done, eng.num_tasks)
            elif status in (STATUS_TIME_LIMIT, STATUS_WATCH, STATUS_NOTIFY):
                return status
            elif status == STATUS_IDLE:
                if eng.num_done < eng.num_tasks:
                    raise DeadlockError("system simulation stopped with tasks that can never start:\n"
                                        + eng.blocked_report())
                return status

    # -- results ----------------------------------------------------------------------
    @property
    def now_ps(self) -> int:
        return self.engine.now

    @property
    def events(self) -> int:
        return int(self.engine.tt.sc[SC_NEVENTS])

    @property
    def rate_updates(self) -> int:
        return int(self.fs.sc[S_UPDATES])

    @property
    def filling_rounds(self) -> int:
        return int(self.fs.sc[S_ROUNDS])

    @property
    def peak_link_load(self) -> float:
        """Highest (sum of rates) / capacity any link carried at the flow fidelity (<= 1)."""
        return float(self.fs.fsc[0])

    def task_times_ps(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tt = self.engine.tt
        return tt.start[ids].copy(), tt.end[ids].copy()

    def link_bytes(self) -> np.ndarray:
        """Wire bytes each directed link carried."""
        return self.fs.link_bytes.copy()
