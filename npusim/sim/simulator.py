"""The simulator: an :class:`~npusim.engine.Engine` wired to an arch's hardware models.

Resource queues per core, in this order: ``cube``, ``vector``, ``dma0`` ..
``dma{E-1}`` (one per DMA engine of ``cores.dma.engines``; each is also an HBM
initiator with its own tags), ``noc`` (messages to other cores, one at a time).
Queue id = ``core * queues_per_core + unit``. The NoC is the arch's 2D mesh at the
``path`` fidelity (message-level contention, the default), ``analytical`` (zero-load
latency) or ``flit`` (cycle-accurate routers, stepped every busy cycle). Every DMA's HBM
transaction streams also cross the mesh between the core and its channels' attach routers
(:mod:`npusim.sim.mempath`): contending with all traffic at the path and flit fidelities, at the
analytical one reserving their routes' links first come, first served
(:mod:`npusim.hw.noc.linkbound`: the links bound memory traffic; core-to-core messages stay
zero-load); ``memory_over_noc=False`` sends DMA tasks straight to the memory model.

Use: build tasks with :meth:`add_compute` / :meth:`add_dma` (or
:meth:`submit_batch` for many at once), then :meth:`run` — until a time, until a
task completes, or to the end — look at results, submit more, run again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from npusim._jitcache import announce_compile
from npusim.arch.derived import channel_bandwidths_gbps, hbm_attach_routers
from npusim.arch.schema import Arch
from npusim.engine import Engine
from npusim.engine.tasks import KIND_FIXED, SC_NEVENTS, SC_NOTIFIED, SC_NOW
from npusim.errors import ConfigError, DeadlockError
from npusim.hw.memory.hbm import (
    C_EXCLUSION_VIOLATIONS, C_PHASE_VIOLATIONS, L2_EVICTIONS, L2_HIT_BYTES, L2_HITS, L2_MERGED, L2_MISS_BYTES,
    L2_MISSES, L2_NSTATS, L2_WRITE_BYTES, new_hbm_state,
)
from npusim.hw.memory.params import P_L2_ON, P_L2_SLICES, memory_params
from npusim.hw.noc.flit import link_flits, zero_load_latency_cycles
from npusim.hw.noc.flit_engine import grow_flit_slots, new_flit_engine
from npusim.hw.noc.path import PRM_HOLD, grow_slots, new_path_state
from npusim.hw.noc.routing import build_routing
from npusim.hw.noc.topology import mesh_topology, to_arrays
from npusim.sim.mempath import C_BYTES, DEFAULT_STREAMS, MP_NEED_SLOTS, PACKET_MODELS, new_mempath, parse_streams
from npusim.sim.sramport import C_ARRAY, C_DMA, new_sram_ports
from npusim.sim.kernel import (
    BASE_HEADROOM,
    KIND_DMA,
    KIND_NOC,
    KIND_NOTIFY,
    STATUS_EVENT_LIMIT,
    STATUS_GROW,
    STATUS_GROW_FLIT,
    STATUS_GROW_NOC,
    STATUS_IDLE,
    STATUS_NOTIFY,
    STATUS_TIME_LIMIT,
    STATUS_WATCH,
    fidelity_of,
    kernel_for,
)

KINDS = (KIND_FIXED, KIND_DMA, KIND_NOC, KIND_NOTIFY)
NOC_MODES = ("path", "analytical", "flit")
FOREVER = 2**62


@dataclass(frozen=True)
class RunOutcome:
    """Why :meth:`Simulator.run` returned: ``finished`` (all tasks done), ``time_limit``,
    ``task_done`` (the watched task completed) or ``notify`` (a notify task completed:
    ``task``)."""

    reason: str
    cycle: int
    task: int = -1


class Simulator:
    """One simulation of work on one chip (see module docstring)."""

    def __init__(self, arch: Arch, memory_mode: str = "tlm", noc_mode: str = "path", txlog_rows: int = 0,
                 noc_graph=None, cmdlog_rows: int = 0, memory_over_noc: bool | None = None,
                 memory_streams: str = DEFAULT_STREAMS, memory_port_lanes: int | None = None,
                 memory_packets: str = "burst"):
        """``noc_graph``: a networkx topology (see ``npusim.hw.noc.topology``) with one router
        per core, instead of the arch's mesh. ``txlog_rows`` / ``cmdlog_rows``: capacity of the HBM
        model's transaction log / DRAM command trace (tests, debugging; 0 = off). ``memory_over_noc``: route HBM transaction streams over the
        NoC (default: at every fidelity; the analytical NoC times them by link reservations,
        :mod:`npusim.hw.noc.linkbound`; ``False``: DMAs go straight to the memory model). ``memory_streams``:
        at the path fidelity, ``flow`` (default) carries each DMA's traffic as a flow sharing the mesh's links
        max-min fairly (:mod:`npusim.hw.noc.memflow`, with the routers' head-of-line coupling,
        :mod:`npusim.hw.noc.hol`: within 6.6% of flit on the memory workloads, not yet the 3% issue 42 asks;
        docs/FIDELITY.md); ``flow@Q~S`` the flows with a head-of-line pass held ``Q`` cycles and a sharing kept
        ``S`` cycles (faster on long runs, :func:`npusim.sim.mempath.parse_streams`; the serving loop's default,
        ``npusim.sim.mempath.SERVING_STREAMS``); the old streams, kept for comparison (22.5% from flit):
        ``reserve`` times each memory stream by reserving its path when it starts, ``hop`` moves its header
        hop by hop (see :mod:`npusim.sim.mempath`).
        ``memory_port_lanes``: at the path and flit fidelities, streams towards the memory (read
        requests, write data) leave the mesh at their attach router's memory-controller port, one lane
        (one flit a cycle) per HBM channel attached there (``None``, the default), or ``k`` lanes per
        attach router; at the flit fidelity as many memory injection lanes send the responses (read
        data, write acknowledgements) into the mesh there, not the core's network interface. ``0``
        ejects the streams at the router's core port and injects the responses through its network
        interface, both shared with the core's own traffic (the model before the memory ports: an
        ablation). ``memory_packets``: a DMA's requests cross the
        mesh one per burst (``burst``, default: a contiguous run on one channel, at most the
        interleave chunk) or one per ``transaction_bytes`` transaction (``transaction``, the model
        before bursts: an ablation); see :mod:`npusim.sim.mempath`."""
        if noc_mode not in NOC_MODES:
            raise ConfigError(f"NoC fidelity '{noc_mode}' in the engine: expected one of {NOC_MODES}")
        self.arch = arch
        self.memory_mode = memory_mode
        self.noc_mode = noc_mode
        self.dma_engines = arch.cores.dma.engines
        self.units = ["cube", "vector", *[f"dma{i}" for i in range(self.dma_engines)], "noc"]
        self.queues_per_core = len(self.units)
        names = [f"core{c}.{u}" for c in range(arch.num_cores) for u in self.units]
        self.engine = Engine(names, event_list=True)
        params, self.period_ps = memory_params(arch, memory_mode)
        self.mem = new_hbm_state(params, arch.num_cores * self.dma_engines, txlog_rows, cmdlog_rows)
        # channels with their own bandwidth (core classes) move bursts, and issue them, faster or slower
        npc = arch.hbm.pseudo_channels
        burst_ps = np.repeat(np.round(arch.hbm.burst_bytes * npc / channel_bandwidths_gbps(arch) * 1000.0)
                             .astype(np.int64), npc)
        scaled = burst_ps != self.mem.u_burst_ps
        for tccd in (self.mem.u_tccd_ps, self.mem.u_tccdl_ps):
            tccd[scaled] = np.maximum(1, tccd[scaled] * burst_ps[scaled] // self.mem.u_burst_ps[scaled])
        self.mem.u_burst_ps[:] = burst_ps
        noc = arch.noc
        if noc_graph is None:  # the chip's mesh, as arrays (no graph is built)
            self.topology = mesh_topology(arch.cores.grid.width, arch.cores.grid.height, noc.link_bytes_per_cycle,
                                          noc.link_latency_cycles)
        else:
            self.topology = to_arrays(noc_graph)
        if self.topology.num_routers != arch.num_cores:
            raise ConfigError(f"NoC topology has {self.topology.num_routers} routers for {arch.num_cores} cores")
        self.routing = build_routing(self.topology, noc.routing)
        self._headroom = BASE_HEADROOM + int(self.routing.hop_matrix().max())
        self._compacted_makespan = 0
        attach = hbm_attach_routers(arch)
        if memory_port_lanes is None:  # one lane per channel attached at the router
            lanes = np.bincount(attach, minlength=self.topology.num_routers)
        else:
            lanes = np.full(self.topology.num_routers, max(1, int(memory_port_lanes)))
        # the flit model's state is large: a tiny one stands in unless it is used
        flit_topo, flit_routing = (self.topology, self.routing) if noc_mode == "flit" else _tiny_noc()
        self.flit = new_flit_engine(flit_topo, flit_routing, noc.virtual_channels, noc.buffer_depth_flits,
                                    noc.router_pipeline_cycles, noc.link_bytes_per_cycle, noc.max_packet_flits,
                                    memory_ports=lanes if noc_mode == "flit" else None,
                                    num_initiators=arch.num_cores * self.dma_engines,
                                    max_outstanding=arch.cores.dma.max_outstanding,
                                    transaction_bytes=min(arch.cores.dma.transaction_bytes, arch.hbm.interleave_bytes))
        self.noc = new_path_state(self.topology, self.routing, noc.router_pipeline_cycles, noc.link_latency_cycles,
                                  noc.link_bytes_per_cycle, 256, noc_mode, noc.buffer_depth_flits,
                                  memory_ports=lanes)
        if memory_over_noc is None:
            memory_over_noc = True
        self.memory_over_noc = bool(memory_over_noc)
        try:
            stream_model = parse_streams(memory_streams)[0]
        except ValueError as e:
            raise ConfigError(str(e)) from None
        if memory_packets not in PACKET_MODELS:
            raise ConfigError(f"memory packet model '{memory_packets}': expected one of {PACKET_MODELS}")
        self.memory_streams = memory_streams
        hbm = arch.hbm
        self.mempath = new_mempath(attach, self.routing.hop_matrix(), self.memory_over_noc,
                                   hbm.channels, hbm.interleave_bytes, hbm.attach == "per_core", self.dma_engines,
                                   min(arch.cores.dma.transaction_bytes, hbm.interleave_bytes),
                                   noc.link_bytes_per_cycle, noc.router_pipeline_cycles, noc.link_latency_cycles,
                                   arch.num_cores * self.dma_engines, memory_streams,
                                   memory_ports=memory_port_lanes is None or int(memory_port_lanes) > 0,
                                   packets=memory_packets, n_links=self.topology.num_links, memory_lanes=lanes,
                                   max_outstanding=arch.cores.dma.max_outstanding)
        # a DMA start pushes one event per stream it starts (two per attach router); a flow update
        # one per flow that ends, and the next update
        self._headroom += int(self.mempath.prm[MP_NEED_SLOTS]) + 2
        if stream_model == "flow":
            self._headroom += arch.num_cores * self.dma_engines + 2
            if self.memory_over_noc and noc_mode == "path":  # messages' links are counted for the flows
                self.noc.prm[PRM_HOLD] = 1
        if self.l2_tlm:  # an L2 fill's response releases every hit waiting for it: at most every slot
            self._headroom += self.mem.sl_addr.shape[0]
        # the SRAM ports in the timing path: at the TLM memory fidelity only (sramport.py)
        dma = arch.cores.dma
        rate = 8 * int(dma.port_bytes_per_cycle)
        srams = [arch.sram_for(c) for c in range(arch.num_cores)]
        self.sram_ports = new_sram_ports(memory_mode == "tlm", self.queues_per_core, self.dma_engines,
                                         [8 * s.banks * s.bytes_per_cycle_per_bank for s in srams],
                                         [max(1, rate)] * arch.num_cores)
        # the loop compiled for this fidelity only (npusim.sim.kernel.kernel_for)
        self._fidelity = fidelity_of(self.mem, self.noc, self.sram_ports)
        self._run_loop = kernel_for(*self._fidelity)

    @property
    def sram_timing(self) -> bool:
        """Whether the SRAM ports can stall compute: the detailed (TLM) memory fidelity."""
        return self.memory_mode == "tlm"

    # -- addressing -----------------------------------------------------------------
    def queue(self, core: int, unit: str) -> int:
        if not 0 <= core < self.arch.num_cores:
            raise ConfigError(f"core {core} out of range (0..{self.arch.num_cores - 1})")
        try:
            return core * self.queues_per_core + self.units.index(unit)
        except ValueError:
            raise ConfigError(f"unit '{unit}': expected one of {self.units}") from None

    def initiator(self, core: int, dma_engine: int = 0) -> int:
        return core * self.dma_engines + dma_engine

    # -- submission -------------------------------------------------------------------
    def add_compute(self, core: int, unit: str, cycles: int, deps: Sequence[int] = (), name: str | None = None) -> int:
        """A task occupying ``unit`` of ``core`` for ``cycles`` (from a compute model)."""
        if cycles < 0:
            raise ConfigError(f"task duration must be >= 0 cycles, got {cycles}")
        return self.engine.submit(KIND_FIXED, self.queue(core, unit), (int(cycles),), deps, name)

    def add_dma(self, core: int, nbytes: int, address: int = 0, write: bool = False, deps: Sequence[int] = (),
                dma_engine: int = 0, pattern: int = 0, stride: int = 0, name: str | None = None) -> int:
        """An HBM read (or write) of ``nbytes`` at ``address`` by one DMA engine of ``core``."""
        if not 0 <= dma_engine < self.dma_engines:
            raise ConfigError(f"dma_engine {dma_engine} out of range (0..{self.dma_engines - 1})")
        if nbytes < 0:
            raise ConfigError(f"DMA size must be >= 0 bytes, got {nbytes}")
        q = self.queue(core, f"dma{dma_engine}")
        prm = (int(nbytes), int(address), int(bool(write)), self.initiator(core, dma_engine), pattern, stride)
        return self.engine.submit(KIND_DMA, q, prm, deps, name)

    def add_send(self, src_core: int, dst_core: int, nbytes: int, deps: Sequence[int] = (),
                 name: str | None = None) -> int:
        """A NoC message of ``nbytes`` from ``src_core``'s router to ``dst_core``'s, on the source's
        ``noc`` queue; ends when its tail reaches the destination."""
        if nbytes < 0:
            raise ConfigError(f"message size must be >= 0 bytes, got {nbytes}")
        q = self.queue(src_core, "noc")
        self.queue(dst_core, "noc")  # range check
        return self.engine.submit(KIND_NOC, q, (src_core, dst_core, int(nbytes)), deps, name)

    def add_notify(self, deps: Sequence[int] = (), name: str | None = None) -> int:
        """A zero-time task after ``deps``; :meth:`run` returns (``reason="notify"``) when it completes."""
        deps = [int(d) for d in deps]
        if any(d < 0 or d >= self.engine.num_tasks for d in deps):
            raise ConfigError(f"notify {name or ''}: dependencies must be tasks submitted before (0..{self.engine.num_tasks - 1})")
        return self.engine.submit(KIND_NOTIFY, -1, (0,), deps, name, check=False)

    def noc_zero_load_cycles(self, src: int, dst: int, nbytes: int) -> int:
        """Uncontended latency of a message: ``(H + 1) * S + H * L + F - 1`` cycles."""
        noc = self.arch.noc
        flits = max(1, -(-int(nbytes) // noc.link_bytes_per_cycle))
        return int(zero_load_latency_cycles(self.routing.hops(src, dst), flits, noc.router_pipeline_cycles,
                                            noc.link_latency_cycles))

    @staticmethod
    def _check_kinds(kind) -> None:
        kind = np.asarray(kind)
        if kind.size and not np.isin(kind, KINDS).all():
            raise ConfigError(f"unknown task kind(s) {sorted(set(kind.tolist()) - set(KINDS))}; known: {KINDS}")

    def submit_batch(self, kind, queue, param, dep_ptr, dep_idx, names=None, check: bool = True,
                     rows=None) -> np.ndarray:
        """Submit many tasks (see ``Engine.submit_batch``; ``check=False`` for arrays already checked,
        ``rows`` where each lies in memory)."""
        kind = np.asarray(kind, dtype=np.int64)
        if check:
            self._check_kinds(kind)
        return self.engine.submit_batch(kind, queue, param, dep_ptr, dep_idx, names, check=check, rows=rows)

    def make_template(self, arrays: tuple, rows=None, check: bool = True):
        """Materialised program arrays (``Program.materialize``: dependencies inside the program)
        linked once, to submit many times with :meth:`submit_template` (``Engine.make_template``)."""
        kind, queue, param, ptr, idx = arrays
        if check:
            self._check_kinds(kind)
        return self.engine.make_template(kind, queue, param, ptr, idx, rows, check=check)

    def submit_template(self, tmpl, **kw) -> np.ndarray:
        """Submit a template after the tasks already here (``Engine.submit_template``)."""
        return self.engine.submit_template(tmpl, **kw)

    # -- running ----------------------------------------------------------------------
    @property
    def now(self) -> int:
        return self.engine.now

    @property
    def events(self) -> int:
        return int(self.engine.tt.sc[SC_NEVENTS])

    def run(self, until: int | None = None, until_task: int | None = None,
            progress: Callable[[int, int, int], None] | None = None, chunk_events: int = 1_000_000) -> RunOutcome:
        """Advance until cycle ``until``, until task ``until_task`` completes, or until all
        submitted tasks are done. Raises DeadlockError if tasks remain that can never run.
        ``progress(now_cycles, tasks_done, tasks_total)`` is called every ``chunk_events``."""
        eng = self.engine
        limit = FOREVER if until is None else int(until)
        watch = -1 if until_task is None else int(until_task)
        if watch >= 0 and eng.is_done(watch):
            return RunOutcome("task_done", self.now)
        announce_compile(self._run_loop, _kernel_name(*self._fidelity))
        while True:
            status = self._run_loop(eng.tt, eng.heap, eng.hs, self.mem, self.noc, self.flit, self.mempath,
                                    self.sram_ports, self.period_ps, limit, watch,
                                    chunk_events if progress else FOREVER, self._headroom)
            if status == STATUS_GROW:
                eng.grow_heap()
            elif status == STATUS_GROW_NOC:
                self.noc = grow_slots(self.noc)
            elif status == STATUS_GROW_FLIT:
                self.flit = grow_flit_slots(self.flit)
            elif status == STATUS_EVENT_LIMIT:
                progress(self.now, eng.num_done, eng.num_tasks)
            elif status == STATUS_WATCH:
                return RunOutcome("task_done", self.now)
            elif status == STATUS_NOTIFY:
                return RunOutcome("notify", self.now, int(eng.tt.sc[SC_NOTIFIED]))
            elif status == STATUS_TIME_LIMIT:
                return RunOutcome("time_limit", self.now)
            elif status == STATUS_IDLE:
                if eng.num_done < eng.num_tasks:
                    raise DeadlockError(eng.blocked_report())
                if progress:
                    progress(self.now, eng.num_done, eng.num_tasks)
                if until is not None:  # nothing left to do: the clock still moves to `until`
                    eng.tt.sc[SC_NOW] = max(self.now, limit)
                    return RunOutcome("time_limit", self.now)
                return RunOutcome("finished", self.now)

    # -- results ----------------------------------------------------------------------
    def task_times(self) -> tuple[np.ndarray, np.ndarray]:
        return self.engine.task_times()

    def makespan(self) -> int:
        """Cycle at which the last finished task ended (``now`` may be later: models keep
        bookkeeping events, e.g. a NoC link is released one cycle after a tail passes)."""
        n = self.engine.num_tasks
        return max(self._compacted_makespan, int(self.engine.tt.end[:n].max(initial=0)))

    def compact(self) -> np.ndarray:
        """Forget finished tasks (long runs: serving) and renumber the rest; returns
        ``new_id[old_id]`` (-1 = dropped). Read any results you need before calling it."""
        self._compacted_makespan = self.makespan()
        new_id = self.engine.compact()

        def remap(arr):
            live = arr >= 0
            arr[live] = new_id[arr[live]]

        remap(self.mem.in_task)
        remap(self.noc.m_task)
        remap(self.flit.m_task)
        remap(self.mempath.task)
        return new_id

    def link_flits(self) -> np.ndarray:
        """Flits sent on each mesh link so far (by link id, ``topology.num_links`` entries), from the
        model of this simulator's NoC fidelity: the path/analytical model's counters, or at the
        ``flit`` fidelity the cycle-accurate routers' (the path model's counters stay at zero
        there: its state stands by unused). Divided by the cycles, a link's busy fraction (one
        flit a cycle is full)."""
        n = self.topology.num_links
        if self.noc_mode == "flit":
            return link_flits(self.flit.fs, self.topology)
        return self.noc.link_flits[:n].copy()

    @property
    def hbm_bytes_over_noc(self) -> int:
        """Bytes of HBM traffic (DMA data) that crossed the mesh (0 when memory skips the NoC)."""
        return int(self.mempath.counters[C_BYTES])

    @property
    def sram_stall_cycles(self) -> int:
        """Cycles compute tasks started so far were stalled by the SRAM ports: their own operand
        streams (``param[3]``, decided when the program was timed) plus DMA traffic competing for
        the ports (decided at their start). 0 at the analytical memory fidelity."""
        c = self.sram_ports.counters
        return int(c[C_ARRAY] + c[C_DMA])

    @property
    def sram_dma_stall_cycles(self) -> int:
        """The part of :attr:`sram_stall_cycles` caused by DMA traffic sharing the ports."""
        return int(self.sram_ports.counters[C_DMA])

    def busy_cycles(self, include_running: bool = False) -> np.ndarray:
        """Busy cycles per queue, shape (cores, queues_per_core) (see ``Engine.busy_cycles``)."""
        return self.engine.busy_cycles(include_running).reshape(self.arch.num_cores, self.queues_per_core)

    @property
    def l2_tlm(self) -> bool:
        """Whether the transaction-level L2 is in the timing path (TLM memory and an arch ``l2``)."""
        return bool(self.mem.p[P_L2_ON])

    def l2_stats(self) -> dict | None:
        """What the TLM L2 saw (None without one): bytes read that hit / missed (``read_bytes`` =
        their sum: every byte a DMA read), bytes written through it, read transactions that hit /
        missed, hits that waited for a fill in flight, lines evicted, ``hit_rate`` (of the bytes
        read) and the bytes each slice moved (hits, fills and writes)."""
        if not self.l2_tlm:
            return None
        m = self.mem.l2
        slices = int(self.mem.p[P_L2_SLICES])
        hit, miss = int(m[L2_HIT_BYTES]), int(m[L2_MISS_BYTES])
        return {"hit_bytes": hit, "miss_bytes": miss, "read_bytes": hit + miss, "write_bytes": int(m[L2_WRITE_BYTES]),
                "hits": int(m[L2_HITS]), "misses": int(m[L2_MISSES]), "merged": int(m[L2_MERGED]),
                "evictions": int(m[L2_EVICTIONS]), "hit_rate": hit / (hit + miss) if hit + miss else 0.0,
                "slice_bytes": m[L2_NSTATS + slices:L2_NSTATS + 2 * slices].tolist()}

    def memory_checks(self) -> dict[str, int]:
        """TLM protocol checks: both counts must be zero."""
        return {
            "exclusion_rule_violations": int(self.mem.counters[C_EXCLUSION_VIOLATIONS]),
            "phase_order_violations": int(self.mem.counters[C_PHASE_VIOLATIONS]),
        }


#: CPU seconds a 2-core machine took to compile each fidelity's loop (``(tlm, flit)``), for the notice
_COMPILE_S = {(False, False): 15, (True, False): 35, (False, True): 25, (True, True): 50}


def _kernel_name(tlm: bool, flit: bool) -> str:
    """What the compile notice calls the loop of a fidelity, with its compile time."""
    return (f"chip simulation kernel for {'TLM' if tlm else 'analytical'} memory and the "
            f"{'flit' if flit else 'path/analytical'} NoC (about {_COMPILE_S[tlm, flit]} s on a 2-core machine)")


def _tiny_noc():
    topo = mesh_topology(2, 1)
    return topo, build_routing(topo, "xy")


__all__ = ["DeadlockError", "KIND_DMA", "KIND_FIXED", "KIND_NOC", "RunOutcome", "Simulator"]
