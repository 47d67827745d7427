"""HBM traffic at the path NoC fidelity (issue 23 item 8): where its time went, and the fix.

Before, the path fidelity carried HBM traffic far slower than the analytical NoC (the decode GEMM
96x7168x4096 INT8 on ascend-910c-die: 45.3 us at 680 GB/s against 20.2 us at 1,527 GB/s; the
default `npusim run` scenario: TTFT 280 ms against 91). The per-link counters of the path model
(``Simulator.noc.link_flits``; busy fraction = flits / lanes / cycles) showed why: a read sent one
full-width request flit per 64 B transaction, so the mesh carried as many request flits towards the
edge as data flits back, and under XY routing every core's requests to the edge routers of other
rows ran down the edge column's N/S links (98% busy on the 910C die; link width did not matter, a
request is one flit at any width). The fix (``npusim.sim.mempath``): one request per *burst* (a
DMA engine's contiguous run on one channel, at most the 256 B interleave chunk), and streams towards
the controllers eject at a memory port with a lane per attached channel rather than the core's
port. Both old models stay as ``Simulator`` ablations: ``memory_packets="transaction"`` and
``memory_port_lanes=0``.

What remains is physical for the presets' meshes: the edge columns' links out of the attach
routers (the 910C die's 6x4 mesh has 4 rows x 118 GB/s leaving each edge column; with every core
reading every channel evenly, the data for the other 5 columns caps the chip at
``2 * 4 * 118.4 / (5/6)`` = 1,137 GB/s, the "mesh cut" row), a core's ejection port (64 B a cycle;
the analytical NoC lets a core take more) and XY routing's funnel into a corner group.

The flit fidelity (``--flit``) has the same two fixes (its requests were already one per burst; its
memory ports since: memory-bound packets eject through an always-accepting port with a lane per
channel, ``npusim.hw.noc.flit``) and, since, memory *injection* lanes: the responses (read data,
write acknowledgements) enter the attach router through as many lanes of the memory's own, each a
switch input, not through the router's one network interface, which before carried them a flit a
cycle shared with its core's requests (64,648 flits for the busiest, a floor of 34.9 us). Measured
on the GEMM: 58.3 us before the memory ports, 54.9 with them, 47.0 with the injection lanes, path
29.8; with 128 B links 30.9 -> 29.1 -> 25.7 against the path's 20.2; per-transaction requests
87.7 -> 76.3 -> 67.2. The lanes are not what limits it now (busy 8% a lane, "mem inj"); what is
left is wormhole flow control with 2 VCs x 8-flit buffers: head-of-line blocking in the
input-queued routers under this many-to-many traffic (the busiest link 60% busy). With 16 VCs x 32
flits the GEMM takes 35.8 us, x 128 flits 32.8 (arch ``noc`` overrides, not a preset; 41.1 and
39.5 without memory ports). More injection is not always faster there: the 2x2 centre group of
table 3 reads 150 GB/s with the memory ports alone and 114 with 4 injection lanes per attach
router (147 with 1 lane a side, ``memory_port_lanes=1``): more packets in flight at once, the same 2 VCs.
Since (issue 42 item 1) a read at the flit fidelity is a closed loop: one-flit requests per burst
within the DMA engine's tags, each controller sending a burst's data when its request arrives, in
arrival order (``npusim.hw.noc.flit_engine``, "DMA reads"), not every DMA's whole reply stream
queued at its start: the GEMM 47.0 -> 38.3 us (128 B links 25.7 -> 20.2, the path's), all 64 cores
streaming 4 MiB 882 GB/s (path 1,024); the figures above are from before.

Tables: (1) the GEMM via ChipCost's plan at each fidelity and ablation, (2) the default serving
scenario's TTFT and throughput, (3) streaming reads (4 MiB a core) from all cores and 2x2 groups.

    python validation/path_noc_hbm.py [--flit] [--skip-serving]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.engine.tasks import SC_NEVENTS  # noqa: E402
from npusim.hw.noc import flit_kernel as fk  # noqa: E402
from npusim.hw.noc.flit import link_flits, memory_injection_flits, memory_port_flits  # noqa: E402
from npusim.sim import Simulator  # noqa: E402
from npusim.mapping.gemm_kernel import Planner  # noqa: E402
from npusim.system.chipcost import ChipCost  # noqa: E402

#: the path model's variants: (label, Simulator keyword arguments)
BEFORE = {"memory_packets": "transaction", "memory_port_lanes": 0}
VARIANTS = [
    ("path, before (txn requests, core port)", BEFORE),
    ("path, memory ports only", {"memory_packets": "transaction"}),
    ("path, burst requests only", {"memory_port_lanes": 0}),
    ("path, after (default)", {}),
]


@contextlib.contextmanager
def simulator_defaults(**kw):
    """Every Simulator built inside (by ChipCost, the serving loop, ...) gets these defaults."""
    init = Simulator.__init__
    names = init.__code__.co_varnames[1:init.__code__.co_argcount]
    old = init.__defaults__
    defaults = list(old)
    first = len(names) - len(defaults)
    for k, v in kw.items():
        defaults[names.index(k) - first] = v
    init.__defaults__ = tuple(defaults)
    try:
        yield
    finally:
        init.__defaults__ = old


def gemm_program(arch, m, k, n, dtype):
    """ChipCost's kernel for the GEMM: the plan it keeps (fastest at the analytical fidelities)."""
    cc = ChipCost(arch, persist=False)
    share = cc._share(None)
    pl = Planner(arch, share, dtype, "bf16", 1.0, None)
    best = None
    for plan in pl.candidates(m, k, n, 1, len(share)):
        prog, _ = cc._gemm_program(pl, plan, m, k, n, 1, dtype, share)
        sim = Simulator(arch, memory_mode="analytical", noc_mode="analytical")
        prog.submit(sim)
        sim.run()
        if best is None or sim.makespan() < best[0]:
            best = (sim.makespan(), prog)
    return best[1]


def run_prog(arch, prog, noc, **kw):
    sim = Simulator(arch, memory_mode="analytical", noc_mode=noc, **kw)
    prog.submit(sim)
    w0 = time.perf_counter()
    sim.run()
    return sim, time.perf_counter() - w0


def hot(sim, cycles):
    """Busiest mesh link, the busiest core/memory ejection port and the busiest memory injection lane
    (busy fractions; the flit model does not count a core port's flits, the path model does not
    limit injection: nan)."""
    t = sim.topology
    nl, r = t.num_links, t.num_routers
    if sim.noc_mode == "flit":
        fs = sim.flit.fs
        util = link_flits(fs, t) / max(1, cycles)
        lanes = fs.node[:, fk.ND_MEM_LANES]
        mem = memory_port_flits(fs)[lanes > 0] / lanes[lanes > 0] / max(1, cycles)
        inj = memory_injection_flits(fs)[lanes > 0] / lanes[lanes > 0] / max(1, cycles)
        k = int(util.argmax())
        return (f"{t.link_name(k)} {util[k]:.2f}", float("nan"), float(mem.max(initial=0.0)),
                float(inj.max(initial=0.0)))
    util = sim.noc.link_flits / sim.noc.link_lanes / max(1, cycles)
    k = int(util[:nl].argmax())
    return f"{t.link_name(k)} {util[k]:.2f}", float(util[nl:nl + r].max()), float(util[nl + r:].max()), float("nan")


def edge_cut_gbps(arch, cores) -> float:
    """Upper bound of a uniform read by ``cores`` from edge-attached channels (half west, half east):
    the data for cores outside an edge column leaves it over its ``H`` links."""
    w, h = arch.cores.grid.width, arch.cores.grid.height
    link = arch.noc.link_bytes_per_cycle * arch.clock_ghz
    outside = sum(1 for c in cores if c % w != 0) / len(cores)
    return h * link / (0.5 * outside)


def gemm_table(flit: bool, link_bytes=None) -> None:
    arch = load_arch("ascend-910c-die")
    if link_bytes:
        data = arch.model_dump(mode="json")
        data["noc"]["link_bytes_per_cycle"] = link_bytes
        arch = type(arch).model_validate(data)
    m, k, n = 96, 7168, 4096
    prog = gemm_program(arch, m, k, n, "int8")
    lb = arch.noc.link_bytes_per_cycle
    print(f"\n1. GEMM {m}x{k}x{n} INT8 on {arch.name}, {lb} B/cycle links (ChipCost's plan, memory analytical; "
          f"HBM peak {arch.hbm.channels * arch.hbm.bandwidth_per_channel_gbps:,.0f} GB/s)")
    print(f"{'fidelity':>40} {'us':>7} {'HBM GB/s':>9} {'of HBM':>7} {'busiest link':>20} {'core port':>9} "
          f"{'mem port':>8} {'mem inj':>7} {'events':>8} {'wall s':>7}")
    rows = [("analytical", "analytical", {})] + [(lbl, "path", kw) for lbl, kw in VARIANTS]
    if flit:
        rows += [(lbl.replace("path", "flit"), "flit", kw) for lbl, kw in VARIANTS]
    peak = arch.hbm.channels * arch.hbm.bandwidth_per_channel_gbps
    for label, noc, kw in rows:
        sim, wall = run_prog(arch, prog, noc, **kw)
        cyc = sim.makespan()
        us = cyc / arch.clock_ghz / 1e3
        gbps = sim.mem.ch_bytes.sum() / (cyc / arch.clock_ghz)
        link, core_port, mem_port, mem_inj = (hot(sim, cyc) if noc != "analytical"
                                              else ("-", float("nan"), float("nan"), float("nan")))
        print(f"{label:>40} {us:7.1f} {gbps:9.0f} {gbps / peak:7.0%} {link:>20} {core_port:9.2f} {mem_port:8.2f} "
              f"{mem_inj:7.2f} "
              f"{sim.engine.tt.sc[SC_NEVENTS]:8,d} {wall:7.2f}", flush=True)
    print(f"{'mesh cut (edge columns, see docstring)':>40} {'':>7} {min(peak, edge_cut_gbps(arch, range(arch.num_cores))):9.0f}")


def serving_table() -> None:
    from npusim.cli import main as cli_main

    print("\n2. Default scenario (`npusim run`: Qwen3-4B on npusim-64c, 32 requests, PD fusion, TP 4 x 16 stages, "
          "stage replay)")
    print(f"{'fidelity':>40} {'TTFT ms':>8} {'TBT ms':>7} {'tok/s':>7} {'HBM GB/s':>9} {'wall s':>7}")
    rows = [("analytical", "analytical", {}), ("path, before", "path", BEFORE), ("path, after (default)", "path", {})]
    for label, noc, kw in rows:
        with tempfile.TemporaryDirectory() as out, simulator_defaults(**kw):
            buf = io.StringIO()
            w0 = time.perf_counter()
            with contextlib.redirect_stdout(buf):
                cli_main(["run", "--fidelity", noc, "--json", "--no-progress", "--out", out, "--force"])
            wall = time.perf_counter() - w0
        s = json.loads(buf.getvalue())
        print(f"{label:>40} {s['ttft_ms']['mean']:8.1f} {s['tbt_ms']['mean']:7.2f} "
              f"{s['throughput_tokens_per_s']:7.1f} {s['hbm_bytes'] / s['duration_s'] / 1e9:9.0f} {wall:7.1f}",
              flush=True)


def streaming_table(flit: bool) -> None:
    arch = load_arch("npusim-64c")
    print(f"\n3. Streaming reads on {arch.name}, 4 MiB a core over both DMA engines (memory analytical), GB/s "
          f"(HBM peak {arch.hbm.channels * arch.hbm.bandwidth_per_channel_gbps:,.0f}; a core's port "
          f"{arch.noc.link_bytes_per_cycle * arch.clock_ghz:.0f})")
    groups = {"all 64 cores": list(range(64)), "2x2 corner (0,1,8,9)": [0, 1, 8, 9],
              "2x2 centre (27,28,35,36)": [27, 28, 35, 36]}
    rows = [("analytical", "analytical", {}), ("path, before", "path", BEFORE), ("path, after", "path", {})]
    if flit:
        rows += [("flit, before", "flit", BEFORE), ("flit, after", "flit", {})]
    print(f"{'cores':>28} " + " ".join(f"{lbl:>14}" for lbl, _, _ in rows) + f" {'busiest link (last)':>24}")
    for name, cores in groups.items():
        out = []
        for _, noc, kw in rows:
            sim = Simulator(arch, memory_mode="analytical", noc_mode=noc, **kw)
            nbytes = streaming_reads(sim, cores)
            sim.run()
            out.append(nbytes / sim.makespan() * arch.clock_ghz)
        link = hot(sim, sim.makespan())[0]  # the last row's
        print(f"{name:>28} " + " ".join(f"{v:14.0f}" for v in out) + f" {link:>24}", flush=True)


def streaming_reads(sim, cores, per_core=4 << 20, pieces=8) -> int:
    """Every core of ``cores`` reads ``per_core`` bytes (distinct addresses) in ``pieces`` DMAs per engine."""
    engines = sim.dma_engines
    size = per_core // engines // pieces
    a = 0
    for c in cores:
        for e in range(engines):
            for _ in range(pieces):
                sim.add_dma(c, size, address=a, dma_engine=e)
                a += size
    return a


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flit", action="store_true", help="the flit fidelity too (its variants as the path's; "
                    "~1.5 min to compile the first time, ~1 min to run)")
    ap.add_argument("--skip-serving", action="store_true", help="leave out the default scenario (~1 min)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    gemm_table(args.flit)
    gemm_table(args.flit, link_bytes=128)
    if not args.skip_serving:
        serving_table()
    streaming_table(args.flit)
    print(f"\nwall time {time.perf_counter() - t0:.1f} s; {machine_line()}")


if __name__ == "__main__":
    main()
