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
