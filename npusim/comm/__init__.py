"""Collective communication on the NoC, expressed as engine tasks (NoC sends + vector
reductions), for the mapper to place over any ordered list of cores."""

from npusim.comm.collectives import (
    OPS,
    Collective,
    allgather_2d,
    allreduce_2d,
    alltoall,
    alltoallv,
    multicast,
    ring_allgather,
    ring_allreduce,
    ring_reduce_scatter,
    send_recv,
)

__all__ = ["OPS", "Collective", "allgather_2d", "allreduce_2d", "alltoall", "alltoallv", "multicast",
           "ring_allgather", "ring_allreduce", "ring_reduce_scatter", "send_recv"]
