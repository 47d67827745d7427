"""Synthetic NoC traffic through the engine: the ``path`` and ``analytical`` fidelities of
``npusim noc`` (the ``flit`` fidelity runs its own cycle-driven kernel, ``npusim.hw.noc.flit``).

The experiment follows the flit model's methodology so the fidelities can be compared:
the packets are the same (:func:`npusim.hw.noc.traffic.packet_stream`, same seed, same
packets), created through warm-up, measurement and drain; each node's packets queue at its ``noc`` queue (an infinite source queue, in
creation order). A packet is a NoC message task gated by a timer task that ends at its
creation cycle. Packets created in the measurement window are measured; the run then
drains for up to ``drain_cycles``. Packet latency = creation to tail ejection (source
queueing included), network latency = head injection to tail ejection.

Link utilisation here is averaged over the whole run (flits per link / cycles
simulated), not only the measurement window as in the flit model.
"""

from __future__ import annotations

import time

import numpy as np

from npusim.arch import load_arch
from npusim.arch.schema import Arch
from npusim.choices import NOC_FIDELITIES
from npusim.config import deep_merge
from npusim.errors import ConfigError
from npusim.hw.noc.flit import BACKLOG_GROWTH_LIMIT, zero_load_latency_cycles
from npusim.hw.noc.traffic import NocParams, NocResult, SyntheticTraffic, make_pattern, packet_stream
from npusim.sim.kernel import KIND_NOC
from npusim.sim.simulator import Simulator


def _arch_for(params: NocParams) -> Arch:
    base = load_arch("npusim-64c").model_dump()
    n = params.width * params.height
    w, h = (n, 1) if params.topology == "ring" else (params.width, params.height)
    over = {
        "name": f"noc-{params.label}",
        "cores": {"grid": {"width": w, "height": h}},
        "hbm": {"channels": 1, "attach": "edge"},
        "noc": {"link_bytes_per_cycle": params.flit_bytes, "router_pipeline_cycles": params.router_stages,
                "link_latency_cycles": params.link_latency_cycles, "buffer_depth_flits": params.buffer_flits,
                "virtual_channels": params.vcs, "routing": params.routing},
    }
    return Arch.model_validate(deep_merge(base, over))


def simulate_engine(params: NocParams, traffic: SyntheticTraffic, fidelity: str) -> NocResult:
    arch = _arch_for(params)
    sim = Simulator(arch, noc_mode=fidelity, noc_graph=params.build_graph())
    n = arch.num_cores
    pattern = make_pattern(traffic.pattern, sim.topology, traffic.hotspot_nodes, traffic.hotspot_fraction)
    # the packet stream every fidelity shares; traffic continues through the drain, as in the flit model
    created, src, dst = packet_stream(traffic, pattern, 0, traffic.warmup_cycles + traffic.measure_cycles
                                      + traffic.drain_cycles)
    F = traffic.packet_flits
    count = created.shape[0]
    # task 2i: timer ending at the creation cycle; task 2i+1: the message, after its timer
    kinds = np.zeros(2 * count, np.int64)
    kinds[1::2] = KIND_NOC
    queues = np.full(2 * count, -1, np.int64)
    queues[1::2] = src * sim.queues_per_core + sim.units.index("noc")
    params_arr = np.zeros((2 * count, 3), np.int64)
    params_arr[0::2, 0] = created
    params_arr[1::2] = np.stack([src, dst, np.full(count, F * params.flit_bytes)], axis=1)
    first = sim.engine.num_tasks
    dep_ptr = np.zeros(2 * count + 1, np.int64)
    dep_ptr[2::2] = np.arange(1, count + 1)
    dep_ptr[1::2] = np.arange(0, count)
    dep_idx = first + 2 * np.arange(count, dtype=np.int64)
    sim.submit_batch(kinds, queues, params_arr, dep_ptr, dep_idx)

    w0, w1 = traffic.warmup_cycles, traffic.warmup_cycles + traffic.measure_cycles
    t0 = time.perf_counter()
    outcome = sim.run(until=w1 + traffic.drain_cycles)
    wall = time.perf_counter() - t0
    finished = sim.engine.num_done == sim.engine.num_tasks
    start, end = sim.task_times()
    m_start, m_end = start[first + 1::2], end[first + 1::2]
    done = m_end >= 0
    measured = (created >= w0) & (created < w1)
    meas_done = measured & done
    hops = sim.routing.hop_matrix()[src, dst]
    # flits ejected inside the window: the tail is at `end`, the head F-1 cycles before
    lo = np.maximum(m_end - (F - 1), w0)
    hi = np.minimum(m_end, w1 - 1)
    ejected = np.where(done, np.clip(hi - lo + 1, 0, F), 0).sum()

    def backlog(t):  # flits created by t and not delivered by t
        return int((((created <= t) & (~done | (m_end > t))).sum()) * F)

    growth = backlog(w1) - backlog(w0)
    window_created = int(measured.sum()) * F
    reasons = []
    if not (done | ~measured).all():
        reasons.append(f"measured packets did not drain within {traffic.drain_cycles} cycles")
    if growth > BACKLOG_GROWTH_LIMIT * window_created + 2 * n * F:
        reasons.append(f"undelivered flits grew by {growth} during the measurement window")

    def avg(x):
        return float(x.mean()) if x.size else float("nan")

    t_zero = zero_load_latency_cycles(sim.routing.hop_matrix(), F, params.router_stages, params.link_latency_cycles)
    cycles = max(sim.makespan() if finished else outcome.cycle, 1)
    n_links = sim.topology.num_links
    return NocResult(
        fidelity=fidelity,
        topology=params.label,
        pattern=pattern.name,
        packet_flits=F,
        offered_flits_per_node_cycle=float(traffic.rate),
        generated_flits_per_node_cycle=window_created / (n * traffic.measure_cycles),
        accepted_flits_per_node_cycle=float(ejected) / (n * traffic.measure_cycles),
        avg_packet_latency_cycles=avg((m_end - created)[meas_done]),
        avg_network_latency_cycles=avg((m_end - m_start)[meas_done]),
        max_packet_latency_cycles=float((m_end - created)[meas_done].max()) if meas_done.any() else float("nan"),
        avg_hops=avg(hops[meas_done]),
        zero_load_latency_cycles=float((pattern.destination_probabilities() * t_zero).sum() / n),
        packets_measured=int(measured.sum()),
        packets_delivered=int(meas_done.sum()),
        saturated=bool(reasons),
        saturation_reason="; ".join(reasons),
        cycles_simulated=int(cycles),
        wall_seconds=wall,
        link_utilization=sim.noc.link_flits[:n_links] / float(cycles),
        link_names=[sim.topology.link_name(k) for k in range(n_links)],
        params=dict(routers=n, router_stages=params.router_stages, link_latency_cycles=params.link_latency_cycles,
                    flit_bytes=params.flit_bytes, routing=params.routing, warmup_cycles=traffic.warmup_cycles,
                    measure_cycles=traffic.measure_cycles, drain_cycles_max=traffic.drain_cycles,
                    seed=traffic.seed, messages=int(count), events=sim.events),
    )


def simulate_path(params: NocParams, traffic: SyntheticTraffic) -> NocResult:
    return simulate_engine(params, traffic, "path")


def simulate_analytical(params: NocParams, traffic: SyntheticTraffic) -> NocResult:
    return simulate_engine(params, traffic, "analytical")


FIDELITIES = NOC_FIDELITIES


def simulator(fidelity: str):
    """The ``simulate_X(params, traffic) -> NocResult`` function of a NoC fidelity."""
    if fidelity == "flit":
        from npusim.hw.noc.flit import simulate_flit

        return simulate_flit
    if fidelity == "path":
        return simulate_path
    if fidelity == "analytical":
        return simulate_analytical
    raise ConfigError(f"unknown NoC fidelity {fidelity!r}; known: {', '.join(FIDELITIES)}")


def simulate(fidelity: str, params: NocParams, traffic: SyntheticTraffic) -> NocResult:
    """Run a synthetic-traffic experiment at the given fidelity."""
    return simulator(fidelity)(params, traffic)
