"""The collective rows of ``published.yaml`` ``operators``: their message sizes as the sources state
them (issue 39, session 43), and HCCL's algorithm choice on an A3 server."""

import pytest

from npusim.validate.operators import collective_bytes
from npusim.validate.published import published


def test_a_per_rank_message_is_scaled_to_the_nccl_tests_convention():
    # all-gather: the output is every rank's tensor; reduce-scatter: the input is n outputs; all-reduce: the buffer
    assert collective_bytes("allgather", {"msg_bytes_per_rank": "40.0MB"}, 16, binary=True) == 16 * 40 * 2**20
    assert collective_bytes("reducescatter", {"msg_bytes_per_rank": "14KB"}, 8, binary=True) == 8 * 14 * 1024
    assert collective_bytes("allreduce", {"msg_bytes_per_rank": "160KB"}, 16, binary=True) == 160 * 1024
    assert collective_bytes("allgather", {"msg_bytes_total": "1.3MB"}, 16) == 1_300_000
    assert collective_bytes("allgather", {"ranks": 8}, 8) is None


def test_the_msmodeling_comm_rows_state_one_ranks_tensor_in_binary_units():
    # generate_comm_microbench.py allocates one rank's tensor of message_bytes; 40.0MB = 4096 tokens x 5120 x 2 B
    sec = published()["operators"]
    src = next(s for s in sec["sources"] if s["id"] == "msmodeling-fork-comm-a3")
    assert src["byte_units"] == "binary"
    rows = [r for r in sec["rows"] if r["source"] == "msmodeling-fork-comm-a3" and r["family"] == "collective"]
    assert len(rows) >= 20
    assert all("msg_bytes_per_rank" in r["shape"] and "msg_bytes_total" not in r["shape"] for r in rows)
    assert all("per_device" not in r["shape"] for r in rows)


@pytest.fixture(scope="module")
def cm384():
    from npusim.system.load import load_system
    return load_system("cloudmatrix384")


def _built(loaded, op, ranks, per_rank, expansion=None, algorithm=None):
    from npusim.system.collectives import build_collective
    from npusim.system.simulator import SystemSim
    from npusim.system.work import WorkBuilder

    w = WorkBuilder(SystemSim(loaded, "flow"))
    nbytes = per_rank * ranks if op in ("allgather", "reducescatter") else per_rank
    return build_collective(w, op, list(range(ranks)), nbytes, algorithm, "sdma", lambda b: 0,
                            loaded.topology.node_of, expansion=expansion)


def _algorithm(loaded, op, ranks, per_rank, expansion=None):
    return _built(loaded, op, ranks, per_rank, expansion).algorithm


def test_hccl_keeps_the_mesh_up_to_its_entry_size_and_runs_the_double_ring_above_on_an_a3_server(cm384):
    # HCCL SelectAlgfor91093: AIV all-gather up to 512 KiB per rank, AIV reduce-scatter up to 1 MiB,
    # host-expanded small-count mesh up to 512 KiB; a double ring above
    assert _algorithm(cm384, "allgather", 16, 512 * 1024, "aiv") == "direct"
    assert _algorithm(cm384, "allgather", 16, 512 * 1024 + 2, "aiv") == "double_ring"
    assert _algorithm(cm384, "reducescatter", 8, 1024 * 1024, "aiv") == "direct"
    assert _algorithm(cm384, "reducescatter", 8, 1024 * 1024, "host") == "double_ring"
    assert _algorithm(cm384, "allreduce", 16, 64 << 20) == "direct"


def test_hccl_expands_the_a3_mesh_on_the_aiv_and_the_double_ring_on_the_ai_cpu(cm384):
    # SelectAlgfor91093's isAivSingleNode ends at the AIV entry size; above it a 910_93 keeps its
    # default AI CPU unfolding under HCCL_OP_EXPANSION_MODE=AIV (externalinput.cc ParseOpExpansion)
    assert _built(cm384, "allgather", 8, 512 * 1024, "aiv").engine == "aiv"
    assert _built(cm384, "allgather", 8, 512 * 1024 + 2, "aiv").engine == "aicpu"
    assert _built(cm384, "reducescatter", 8, 1024 * 1024, "aiv").engine == "aiv"
    assert _built(cm384, "reducescatter", 8, 1024 * 1024 + 2, "aiv").engine == "aicpu"
    assert _built(cm384, "allgather", 8, 64 * 1024, "host").engine == "aicpu"  # non-AIV: the 910_93 default
    assert _built(cm384, "allreduce", 8, 64 * 1024, "aiv").engine is None  # only the ops whose switch is modelled
    assert _built(cm384, "allgather", 8, 64 * 1024, "aiv", algorithm="double_ring").engine is None  # not HCCL's pick


def test_the_8_die_kernel_duration_rows_are_the_runners_byte_sizes():
    # run_comm_bench.sh DSV3_BYTES: 465920 595968 786432 946176; the report prints 465KB/596KB/946KB in decimal kB
    sec = published()["operators"]
    rows = [r for r in sec["rows"] if r["op"] == "HCCL allGather kernel Duration"]
    per_rank = [collective_bytes("allgather", r["shape"], 8, binary=True) // 8 for r in rows]
    assert per_rank == [465_920, 595_968, 786_432, 946_176]
    assert [p <= 512 * 1024 for p in per_rank] == [True, False, False, False]  # the AIV entry size falls between


def test_a_server_of_one_die_npus_keeps_the_mesh():
    from npusim.system.load import load_system
    assert _algorithm(load_system("atlas-800i-a2"), "allgather", 8, 8 << 20) == "direct"
    assert _built(load_system("atlas-800i-a2"), "allgather", 8, 8 << 20, "aiv").engine is None


def test_the_double_ring_beats_the_mesh_on_large_messages(cm384):
    # each die takes half of its traffic over its package's die-to-die link: half the fabric bytes
    from npusim.system.measure import run_collective
    nbytes = 16 * (2 << 20)
    ring2 = run_collective(cm384, "allgather", list(range(16)), nbytes, "double_ring").time_us
    mesh = run_collective(cm384, "allgather", list(range(16)), nbytes, "direct").time_us
    assert ring2 < 0.85 * mesh


def test_a_notify_never_waits_behind_a_copy(cm384):
    # a notify is a stream task: with every SDMA engine of die 0 busy copying 64 MiB, it still
    # lands in about a write's fixed cost
    from npusim.system.simulator import SystemSim
    from npusim.system.work import WorkBuilder

    sim = SystemSim(cm384, "flow")
    w = WorkBuilder(sim)
    engines = cm384.system.initiator.sdma_engines
    for k in range(engines):
        w.transfer(0, 2 + k % 8, 64 << 20, "write", "sdma")
    note = w.transfer(0, 3, 4, "write", "notify")
    w.submit()
    sim.run()
    assert sim.engine.tt.end[note] < 10_000_000  # ps: 10 us, where the copies take milliseconds


def test_an_all_gather_and_a_reduce_scatter_of_one_size_are_two_cases():
    # _fastest collapses kernels of one case; until session 43 it collapsed every reduce-scatter row
    # of the msModeling report into the all-gather of the same size
    from npusim.validate.operators import _fastest
    rows = [{"source": "s", "family": "collective", "op": "HCCL allGather (x)", "shape": {"ranks": 8},
             "measured_us": 10.0},
            {"source": "s", "family": "collective", "op": "HCCL reduceScatter (x)", "shape": {"ranks": 8},
             "measured_us": 12.0}]
    assert [i for i, _, _ in _fastest(rows)] == [0, 1]


def test_an_a3_all_gather_never_gets_faster_as_its_message_grows(cm384):
    # physics: 8 dies of one A3 server, per-rank messages across HCCL's mesh -> double-ring switch
    # (512 KiB) and up to 4 MiB; HCCL's SelectAlgfor91093 runs one executor above the switch in op-base
    # mode (no other branch applies to one server), so nothing may make a larger message faster
    from npusim.system.measure import run_collective
    sizes = [256 << 10, 512 << 10, (512 << 10) + 1024, 768 << 10, 1 << 20, 2 << 20, 4 << 20]
    times = [run_collective(cm384, "allgather", list(range(8)), 8 * s).time_us for s in sizes]
    assert all(b >= a for a, b in zip(times, times[1:])), list(zip(sizes, times))
