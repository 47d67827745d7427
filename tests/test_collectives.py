"""Collectives as engine tasks: traffic volume, fidelity agreement, layout effects, errors."""

import json

import pytest

from npusim.cli import main
from npusim.comm import allgather_2d, allreduce_2d, multicast, ring_allgather, ring_allreduce, ring_reduce_scatter
from npusim.comm.run import run_collective
from npusim.errors import ConfigError
from npusim.sim import Simulator
from npusim.sim.program import Program


def _message_bytes(prog, coll):
    return sum(int(prog.param[t][2]) for t in coll.tasks if prog.unit[t] == "noc")


def _run(arch, build, *args):
    prog = Program(arch.num_cores)
    coll = build(prog, *args)
    sim = Simulator(arch)
    prog.submit(sim)
    sim.run()
    return prog, coll, sim


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_volumes(arch64, n):
    cores = list(range(n))
    nbytes = 1 << 20
    for build, factor in ((ring_allreduce, 2 * (n - 1)), (ring_reduce_scatter, n - 1), (ring_allgather, n - 1)):
        prog, coll, sim = _run(arch64, build, cores, nbytes)
        # every core sends (n-1) chunks of B/n per phase
        assert _message_bytes(prog, coll) == pytest.approx(factor * nbytes, abs=factor * n)
        assert set(coll.done) == set(cores)
        assert all(sim.engine.is_done(t) for t in coll.done.values())


def test_fidelities_agree_at_zero_load(arch64):
    """One message per step and no overlapping paths: path == analytical."""
    for op in ("allgather", "reducescatter", "allreduce"):
        path = run_collective(arch64, op, [0, 1], 256 << 10, "path")
        ana = run_collective(arch64, op, [0, 1], 256 << 10, "analytical")
        assert path.cycles == ana.cycles, op
    path = run_collective(arch64, "allreduce", [0, 1, 2, 3], 1 << 20, "path")
    ana = run_collective(arch64, "allreduce", [0, 1, 2, 3], 1 << 20, "analytical")
    assert abs(path.cycles - ana.cycles) / ana.cycles < 0.001


@pytest.mark.parametrize("op,cores,grid", [("allreduce", [0, 1, 2, 3], None), ("allgather", [0, 1, 9, 8], None),
                                           ("allreduce2d", [0, 1, 8, 9], (2, 2))])
def test_flit_level_collectives_agree_with_path_level(arch64, op, cores, grid):
    """The cycle-accurate routers, driven by the engine, give the same collective time as the
    path model when the collective's messages do not contend (to within a cycle per step)."""
    flit = run_collective(arch64, op, cores, 64 << 10, "flit", grid)
    path = run_collective(arch64, op, cores, 64 << 10, "path", grid)
    assert abs(flit.cycles - path.cycles) <= 2 * len(cores)


def test_layout_changes_hops_and_time(arch64):
    good = run_collective(arch64, "allreduce", [0, 1, 2, 3], 1 << 20)
    bad = run_collective(arch64, "allreduce", [0, 2, 1, 3], 1 << 20)
    assert good.ring_hops == [1, 1, 1, 3] and bad.ring_hops == [2, 1, 2, 3]
    assert bad.total_ring_hops > good.total_ring_hops and bad.cycles > good.cycles
    assert good.busbw_gbps <= arch64.noc.link_bytes_per_cycle * arch64.clock_ghz


def test_two_d_collectives_complete_and_match_their_analytical_time(arch64):
    cores = [0, 1, 2, 3, 8, 9, 10, 11]
    for build in (allreduce_2d, allgather_2d):
        _, coll, sim = _run(arch64, build, cores, 2, 4, 1 << 20)
        assert set(coll.done) == set(cores)
    times = {}
    for op in ("allreduce2d", "allgather2d"):
        path = run_collective(arch64, op, cores, 1 << 20, "path", (2, 4))
        ana = run_collective(arch64, op, cores, 1 << 20, "analytical", (2, 4))
        # contention only adds to the zero-load (analytical) time; these rings barely contend
        assert ana.cycles <= path.cycles <= 1.2 * ana.cycles, op
        times[op] = path.cycles
    # all-reduce = reduce-scatter + all-gather: more data than the all-gather alone
    assert times["allreduce2d"] > times["allgather2d"]
    with pytest.raises(ConfigError, match="grid"):
        allreduce_2d(Program(64), cores, 3, 3, 1024)


def test_multicast_reaches_everyone_in_log_rounds(arch64):
    _, coll, sim = _run(arch64, multicast, list(range(8)), 4096)
    assert len(coll.tasks) == 7 and set(coll.done) == set(range(8))
    one = sim.noc_zero_load_cycles(0, 1, 4096)
    assert sim.now < 7 * one  # tree, not a chain


def test_bad_collective_arguments(arch64, capsys):
    with pytest.raises(ConfigError, match="distinct"):
        ring_allreduce(Program(64), [0, 0, 1], 64)
    with pytest.raises(ConfigError, match="out of range"):
        ring_allreduce(Program(64), [0, 99], 64)
    assert main(["collective", "--cores", "0,1,2", "--op", "allreduce2d"]) == 2
    assert "--grid" in capsys.readouterr().err


def test_collective_cli_json(capsys):
    assert main(["collective", "--cores", "0-3", "--bytes", "64KiB", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["ring_hops"] == [1, 1, 1, 3] and d["busbw_gbps"] > 0
