"""DMA reads at the flit fidelity (npusim.hw.noc.flit_engine, "DMA reads"): requests paced by the DMA
engine's tags, each controller serving bursts in the order their requests arrived."""

import numpy as np
import pytest

from npusim.arch.derived import hbm_attach_routers
from npusim.hw.noc.flit import zero_load_latency_cycles
from npusim.sim import Simulator


def _with_tags(arch, tags, txn=None):
    dma = {"max_outstanding": tags} if txn is None else {"max_outstanding": tags, "transaction_bytes": txn}
    cores = arch.cores.model_copy(update={"dma": arch.cores.dma.model_copy(update=dma)})
    return arch.model_copy(update={"cores": cores})


def _read_cycles(arch, core, nbytes, write=False):
    sim = Simulator(arch, memory_mode="analytical", noc_mode="flit")
    sim.add_dma(core, nbytes, address=0, write=write)
    sim.run()
    return sim.makespan()


@pytest.mark.parametrize("write", [False, True])
def test_one_tag_makes_each_burst_a_round_trip(arch64, write):
    """With one tag of a whole burst (``max_outstanding: 1``, ``transaction_bytes: 256``) a DMA
    engine has one burst in flight: its 64 bursts of a 16 KiB read (256 B each, one per channel,
    address 0 up) take at least the sum of their zero-load round trips, request (1 flit) out and
    data (4 flits) back (4,224 cycles; measured 4,351); with the arch's tags the bursts overlap and
    the read takes under a third of that (measured 599). Before the tags (two free-running streams
    per router) the one-tag read took 3,587 cycles, the DRAM's time, below the sum. A write is the
    same loop the other way: a burst's data (4 flits) out, a one-flit acknowledgement back."""
    core, nbytes = 27, 16 * 1024
    S, L = arch64.noc.router_pipeline_cycles, arch64.noc.link_latency_cycles
    attach = hbm_attach_routers(arch64)
    hops = Simulator(arch64, noc_mode="flit").routing.hop_matrix()
    bursts = nbytes // arch64.hbm.interleave_bytes
    flits = arch64.hbm.interleave_bytes // arch64.noc.link_bytes_per_cycle
    out, back = (flits, 1) if write else (1, flits)
    trips = sum(int(zero_load_latency_cycles(hops[core, attach[ch]], out, S, L))
                + int(zero_load_latency_cycles(hops[attach[ch], core], back, S, L)) for ch in range(bursts))
    one = _read_cycles(_with_tags(arch64, 1, 256), core, nbytes, write)
    many = _read_cycles(arch64, core, nbytes, write)
    assert one >= trips
    assert many < trips / 3


def test_quadrant_read_keeps_the_hottest_links_busy(arch64):
    """The 16 cores of a quadrant (x 4..7, y 0..3) each read 256 KiB: under XY routing the data of
    the 8 attach routers of rows 4..7 enters the quadrant over the 4 links (x,4)->(x,3), each
    carrying an eighth of it, so those links bound the read at 8 flits a cycle. Served in request
    order within the DMA engines' tags, the busiest link is busy at least 3/4 of the read and the
    read reaches 3/4 of the bound (measured: 0.87, 0.85); the model before (every DMA's whole
    reply stream queued at the controllers at its start, long runs to one core) kept it 0.52 busy
    at 0.50 of the bound (``validation/noc_engine_vs_synthetic.py``: 1 MiB a core, 0.44)."""
    w = arch64.cores.grid.width
    quad = [y * w + x for y in range(4) for x in range(4, 8)]
    sim = Simulator(arch64, memory_mode="analytical", noc_mode="flit")
    per = 256 * 1024 // sim.dma_engines
    a = 0
    for c in quad:
        for e in range(sim.dma_engines):
            sim.add_dma(c, per, address=a, dma_engine=e)
            a += per
    sim.run()
    cycles = sim.makespan()
    busy = sim.link_flits() / cycles
    assert busy.max() <= 1.0
    assert busy.max() >= 0.75
    bound = 8 * arch64.noc.link_bytes_per_cycle  # bytes a cycle
    assert a / cycles >= 0.75 * bound
