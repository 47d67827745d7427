"""Run one collective on an otherwise idle chip and measure it (behind ``npusim collective``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from npusim.arch.schema import Arch
from npusim.comm import collectives as C
from npusim.errors import ConfigError
from npusim.sim import Simulator
from npusim.sim.program import Program


@dataclass(frozen=True)
class CollectiveResult:
    op: str
    cores: list[int]
    bytes: int
    fidelity: str
    cycles: int
    time_us: float
    algbw_gbps: float
    busbw_gbps: float
    ring_hops: list[int]
    total_ring_hops: int
    messages: int
    link_flits_max: int

    def to_dict(self) -> dict:
        return asdict(self)


def run_collective(arch: Arch, op: str, cores: list[int], nbytes: int, fidelity: str = "path",
                   grid: tuple[int, int] | None = None, dtype: str = "bf16") -> CollectiveResult:
    if op not in C.OPS:
        raise ConfigError(f"--op {op}: expected one of {', '.join(C.OPS)}")
    sim = Simulator(arch, noc_mode=fidelity)
    prog = Program(arch.num_cores)
    if op in ("allreduce2d", "allgather2d"):
        if grid is None:
            raise ConfigError(f"--op {op} needs --grid RxC (rows x cols of the --cores list, row-major)")
        rows, cols = grid
        build = C.allreduce_2d if op == "allreduce2d" else C.allgather_2d
        coll = build(prog, cores, rows, cols, nbytes, dtype=dtype)
    elif op == "sendrecv":
        if len(cores) != 2:
            raise ConfigError("--op sendrecv needs exactly two --cores: SRC,DST")
        coll = C.send_recv(prog, cores[0], cores[1], nbytes)
    else:
        build = {"allreduce": C.ring_allreduce, "allgather": C.ring_allgather,
                 "reducescatter": C.ring_reduce_scatter, "multicast": C.multicast, "alltoall": C.alltoall}[op]
        coll = build(prog, cores, nbytes, dtype=dtype)
    prog.submit(sim)
    sim.run()
    cycles = sim.makespan()
    seconds = cycles / (arch.clock_ghz * 1e9)
    algbw = nbytes / seconds / 1e9 if seconds else 0.0
    n = len(cores)
    hops = [sim.routing.hops(cores[i], cores[(i + 1) % n]) for i in range(n)] if n > 1 else []
    return CollectiveResult(
        op=op, cores=list(cores), bytes=nbytes, fidelity=fidelity, cycles=cycles, time_us=seconds * 1e6,
        algbw_gbps=algbw, busbw_gbps=algbw * coll.bus_factor(), ring_hops=hops, total_ring_hops=sum(hops),
        messages=sum(1 for t in coll.tasks if prog.unit[t] == "noc"),
        # the path model's ports (links, ejection and memory ports); the flit model's mesh links
        link_flits_max=int(sim.link_flits().max() if fidelity == "flit" else sim.noc.link_flits.max()),
    )
