"""The names the command line offers: fidelities, partitions, layouts, collectives, patterns.

One light module (standard library only: no numpy, Numba or pydantic) so that ``npusim --help``
and ``npusim SUB --help`` build their parsers without importing the simulators. The modules
that implement these names import their tuples from here, so the parser's choices and what
the implementation accepts are one list.
"""

#: the chip preset used when no ``--arch`` is given
DEFAULT_ARCH = "npusim-64c"

#: NoC models of a chip (``npusim.sim``): cycle-accurate flits, NpuSim's path handshake, hops and bandwidth
NOC_FIDELITIES = ("path", "analytical", "flit")
#: memory models (``npusim.hw.memory``): transaction-level, or latency + bandwidth
MEMORY_FIDELITIES = ("tlm", "analytical")
#: fabric models between NPUs (``npusim.system.simulator``): max-min fair flows, or packets
FABRIC_FIDELITIES = ("flow", "packet")

#: GEMM partitions and TP-group core layouts of the chip mapper (``npusim.mapping``)
PARTITIONS = ("tp_k", "tp_mn", "tp_mnk", "tp_n", "auto")
LAYOUTS = ("linear_seq", "linear_interleave", "ring", "mesh2d")

#: collectives over cores of a chip (``npusim.comm.collectives``)
CHIP_COLLECTIVES = ("allreduce", "allgather", "reducescatter", "allreduce2d", "allgather2d", "multicast", "sendrecv",
                    "alltoall")
#: collectives over dies of a system and the algorithms each offers, the first its default
#: (``npusim.system.collectives``)
SYSTEM_ALGORITHMS = {
    "allreduce": ("ring", "halving_doubling", "hierarchical", "direct"),
    "allgather": ("ring", "direct", "double_ring"),
    "reducescatter": ("ring", "direct", "double_ring"),
    "alltoall": ("direct", "hierarchical"),
    "broadcast": ("binomial",),
    "sendrecv": ("direct",),
}
SYSTEM_COLLECTIVES = tuple(SYSTEM_ALGORITHMS)
#: MoE expert-parallel token traffic (``npusim.system.measure.run_moe``)
MOE_OPS = ("dispatch", "combine")

#: HBM access patterns of ``npusim mem`` (``npusim.sim.memory_probe``)
MEMORY_PATTERNS = ("stream", "random", "strided")
#: synthetic NoC traffic patterns and topologies of ``npusim noc`` (``npusim.hw.noc.traffic``)
TRAFFIC_PATTERNS = ("uniform", "transpose", "bitcomp", "hotspot", "neighbor")
TOPOLOGIES = ("mesh", "torus", "ring")

#: groups of calibrated constants ``npusim calibrate --only`` recomputes (``npusim.validate.calibrate.GROUPS``)
CALIBRATION_GROUPS = ("operators", "hccs", "table1", "runtime", "die", "hccl")

#: a request stream (``npusim.serving.workload``): the benchmark client's flags (vllm bench serve's names;
#: any of them makes a serving run a client's), every flag that selects serving, --dataset's choices
CLIENT_FLAGS = ("dataset", "num_prompts", "max_concurrency", "request_rate", "sweep_concurrency")
SERVING_FLAGS = ("trace", "rate", "requests", *CLIENT_FLAGS)
DATASETS = ("random", "sharegpt-like", "mooncake-like")
#: synthetic requests a run takes without --force, and the memory each costs (request, record and its
#: token times, measured on the default scenario's lengths)
MAX_REQUESTS = 1_000_000
BYTES_PER_REQUEST = 3_000
#: the source without a client flag: 32 requests at 8/s, prompts 128-512, outputs 32-128 tokens
DEFAULT_RATE, DEFAULT_REQUESTS, DEFAULT_INPUT, DEFAULT_OUTPUT = 8.0, 32, "128:512", "32:128"
#: --dataset random's lengths when --input-len/--output-len are not given (vllm bench serve's defaults)
RANDOM_INPUT, RANDOM_OUTPUT = 1024, 128
#: --iteration-cache auto: prompts longer than this use the long buckets (npusim.scenarios.run)
LONG_PROMPT_TOKENS = 4096
