"""The system description schema (``arch/<system>.yaml`` with a top-level ``system:`` key).

A system is ``nodes`` identical nodes, each holding ``npus_per_node`` NPUs (each a package of
``npu.dies`` dies of the chip ``npu.chip``, an arch preset or file) and ``cpus_per_node`` CPUs,
joined by one or more *fabrics* (e.g. CloudMatrix384's UB plane and its RDMA plane). A fabric is
a list of switches and a list of link templates that the topology builder
(:mod:`npusim.system.topology`) expands into a graph:

* ``between: [die, die]`` — a full mesh between the dies of a node (Atlas 800 A2's HCCS);
* ``between: [die, S]`` / ``[cpu, S]`` — every die (CPU) to switch ``S``: its own node's copy when
  ``S`` is ``per: node``, else the one system-wide switch;
* ``between: [S, T]`` — switch to switch: per node when both are ``per: node``; each node's ``S``
  to the system-wide ``T`` when one of them is ``per: system``.

``count`` parallel links (the 7 UB ports of a die, the 16 uplinks of an L1 switch chip) are one
*bundle*: a link of ``count x bandwidth_gbps`` per direction, which assumes traffic is spread evenly
over its members (packet spraying; the CloudMatrix384 paper calls the UB Clos non-blocking). A
switch with ``chips: k`` stands for ``k`` parallel switch chips the same way.

Units are in key names: ``_gbps`` = 10**9 bytes/s per direction, ``_ns``, ``_gb`` = 2**30 bytes.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from npusim.config import StrictModel

ENDPOINT_KINDS = ("die", "cpu")


class DieLink(StrictModel):
    """The on-package link between the dies of one NPU (both directions)."""

    bandwidth_gbps: PositiveFloat
    latency_ns: NonNegativeFloat = 0.0


class Npu(StrictModel):
    """One NPU package: ``dies`` dies of the chip ``chip`` (arch preset name or file)."""

    chip: str
    dies: PositiveInt = 1
    die_link: DieLink | None = None

    @model_validator(mode="after")
    def _link_for_two_dies(self):
        if self.dies > 1 and self.die_link is None:
            raise ValueError("an NPU of more than one die needs die_link (bandwidth_gbps, latency_ns)")
        return self


class Cpu(StrictModel):
    """A host CPU as a fabric endpoint: its DRAM is the target of NPU reads/writes (caching pool)."""

    name: str = "cpu"
    dram_gb: PositiveFloat = 512.0  # the caching pool's capacity per CPU (shown by npusim info)


class Initiator(StrictModel):
    """How a die starts transfers.

    * ``sdma``: the die's SDMA engines (``sdma_engines`` queues; a transfer waits for a free
      engine, then pays ``sdma_launch_ns`` before its first byte moves);
    * ``aiv``: AI-vector-core direct writes (no engine queue; ``aiv_launch_ns``); with
      ``aiv_max_gbps`` a die's AIV-direct writes share a virtual issue link of that rate (wire
      bytes), what its vector cores can issue in all (reads are not capped).
    """

    sdma_engines: PositiveInt = 16
    sdma_launch_ns: NonNegativeFloat = 0.0
    aiv_launch_ns: NonNegativeFloat = 0.0
    aiv_max_gbps: PositiveFloat | None = None
    default: Literal["sdma", "aiv"] = "sdma"


class MoeOperators(StrictModel):
    """Fixed time of the MoE dispatch and combine operators on a die besides moving their bytes:
    kernel launch, token counting and layout, quantisation, synchronisation between ranks. Charged
    once per operator call per die, before its transfers.

    Kernel launches are the system runtime's (:class:`Runtime`: a launch per kernel of every layer,
    on every path); until issue 39 a ``layer_kernels`` key here charged cited per-kernel costs on
    DeepSeek deployments only.

    ``other_kernels_us``: a what-if, 0 in the presets: a fixed time per layer and microbatch on a
    die for small kernels not otherwise costed, half on the attention stream and half on the MoE
    stream. (Until session 26 the presets carried 226.6 us here, calibrated on xDeepServe's Figure
    20 at one batch: it stood for what the runtime's launches and the simulated small kernels now model.)

    ``decode_copies`` / ``prefill_copies``: what the phase's dispatch and combine kernels move per
    token (:mod:`npusim.system.moe`): ``per_expert``, one copy per selected expert (the
    low-latency kernels of decode: DeepEP low-latency, CANN MoeDistributeDispatch), or
    ``per_rank``, once per destination die (NVIDIA DeepEP's normal kernels of prefill; DeepEP-Ascend's
    normal kernels receive one row per selected expert, as its test_intranode.py counts them). The
    standalone operator (``npusim collective --system ... --op dispatch``) is the decode kernel.

    Prefill steps charge the same per-call overheads (the decode kernels'): the normal kernels' one
    published table (DeepEP-Ascend on an A3 SuperPOD, sgl-kernel-npu README) times a call at 4096
    tokens per rank only, milliseconds and bandwidth-bound, so no fixed per-call cost can be
    calibrated on it (``published.yaml`` ``moe_normal_kernels``, validation/moe_normal_kernels.py)."""

    dispatch_overhead_us: NonNegativeFloat = 0.0
    combine_overhead_us: NonNegativeFloat = 0.0
    source: str = ""
    other_kernels_us: NonNegativeFloat = 0.0
    other_kernels_source: str = ""
    decode_copies: Literal["per_expert", "per_rank"] = "per_expert"
    prefill_copies: Literal["per_expert", "per_rank"] = "per_rank"


#: the runtime modes a step may run in (``--runtime``)
RUNTIME_MODES = ("eager", "graph")

#: Cited runtime micro-benchmarks (``published.yaml`` ``operators``, family ``runtime``, sources of the
#: ``calibration`` half); ``npusim calibrate --only runtime`` recomputes each constant below from them.
HOST_DISPATCH_SOURCE = ("triton-ascend issue #1675 (910B2): eager torch.add host enqueue 12.142 us per op, "
                        "5,000 launches timed before the final synchronize (published.yaml operators, runtime, "
                        "calibration half)")
GRAPH_LAUNCH_SOURCE = ("vllm-ascend PR #15471: the host wall time of an ACL graph replay enqueue (NPUGraph.replay), "
                       "running average over 200 FULL-graph decode replays, 0.1 ms (GLM-5.3-Flash stack, most likely "
                       "Ascend 950PR: not stated)")
GRAPH_UPDATE_SOURCE = ("vllm-ascend PR #15471: the per-step FIA task update (graph_task_update_begin/end) issue cost, "
                       "2.4 ms for 11 attention ops = 218.2 us per captured attention op (same stack)")
HCCL_DISPATCH_SOURCE = ("FlagPerf A3 toolkit summary: hccl_test all_reduce_test, 2 dies of one A3 NPU, 8 KiB at the "
                        "range's minimum algbw 0.11962 GB/s = 68.48 us per back-to-back op-base call: the host's "
                        "cadence (its simulated device time, 5.8 us, hides under it)")
KERNEL_LAUNCH_SOURCE = ("ascend-dmi H2D latency on A3 (FlagPerf toolkit summary, 0.681-0.826 us, mean 0.754 us): a "
                        "task's crossing from the host's submission to the device; the rest of a launch+sync round "
                        "trip (ascend-rs appendix F, 910B3: 23-30 us) is the host's launch call (8.6 us) and the "
                        "kernel's device-side start, which belongs to the operator's time on the die")
ATTENTION_DISPATCH_SOURCE = ("pto-isa demos/torch_jit/flash_atten README (910B2, aarch64 host): eager "
                             "torch_npu.npu_fused_infer_attention_score, 50 calls back to back after 10 warm-up, "
                             "70.338 us per call at 128 x 1024 (flat at 70-77 us up to 2048 x 2048 while the device "
                             "work grows: the host's cadence; 46.83 us on an x86_64 host); Atlas 800I A2 and "
                             "CloudMatrix384 hosts are Kunpeng (aarch64) (npusim calibrate --only runtime)")
SYNC_SOURCE = ("ascend-rs appendix F (910B3): an AscendC kernel of negligible work launched and waited for with "
               "aclrtSynchronizeStream, median 28 us of 23-30 us (5 rows), less the host's direct launch call "
               "(triton-ascend #1675 optimized C launcher, 8.599 us), the task's H2D crossing (kernel_launch_us) and "
               "the kernel's time on the die (ascend-910b4 kernel.start_us + vector_setup_us): the synchronize's "
               "return to the host (npusim calibrate --only runtime)")


class Runtime(StrictModel):
    """What the software stack adds to a step's hardware work, the same on every path (a parallel
    plan, a DeepSeek deployment file, an ONNX export, a serving instance). Units: microseconds.

    Two modes (``--runtime``; ``decode_mode`` / ``prefill_mode`` are the system's defaults):

    * ``eager``: the host dispatches operator after operator (``host_dispatch_us`` each: the framework's
      Python/C++ dispatch and the launch call; a fused-attention operator ``attention_dispatch_us``,
      measured on its own: the costliest to dispatch) on a host stream per die; a kernel cannot start before
      the host has dispatched it, so the device waits on the host only when the host is slower (the
      host runs ahead of the device otherwise). An HCCL collective or MoE transfer is one operator.
    * ``graph`` (aclgraph / torchair): the step's kernels were captured once; the host replays the
      graph once per step (``graph_launch_us``) and the device runs the captured kernels.

    In graph mode the captured attention kernels' parameters that change every step (the KV lengths,
    a host list the attention op's tiling is computed from at dispatch) are updated on the host after
    the replay call, ``graph_update_us`` per attention operator, one after another (vLLM-Ascend's
    ``update_full_graph_params``: ``graph_task_update_begin/end`` per fused-attention op, RFC #13058);
    a captured attention kernel waits for its update (an event), the others run as soon as the
    device reaches them, so the updates overlap the device's work on earlier layers. In eager mode an
    HCCL collective costs the host ``hccl_dispatch_us`` (HCCL's op-base call expands the collective
    into its copy and notify tasks), any other operator ``host_dispatch_us``.

    In both modes every kernel (each operator of a compute node) pays ``kernel_launch_us`` on its
    device stream before it runs (the task's submission reaching the device; the kernel's device-side
    start on the cores is part of the operator's time on the die, :mod:`npusim.system.chipcost`).

    **Between two steps** (session 46) the host steps in: after the step's last kernel it waits for
    the sampled tokens (a synchronize's return, ``sync_us``: the next step's inputs depend on them),
    then spends ``scheduler_us``, the framework's per-step work (forming the next batch, its
    requests' bookkeeping; not overlapped), then replays the next graph. The device's idle gap
    between two graph replays is :meth:`replay_gap_us`: ``scheduler_us +`` :meth:`graph_boundary_us`,
    the part any graph boundary the host steps into pays (synchronize, replay enqueue, the next
    graph's first attention operator's parameter update, which nothing before it hides, and the first
    task's crossing). A boundary *inside* a step (MTP's draft graph run as a second graph, the CPU
    sampling between them: the CloudMatrix384 paper's 0.6-0.8 ms per graph schedule) pays
    :meth:`graph_boundary_us` without the per-step scheduler; the presets run MTP inside the step's
    one graph, as CloudMatrix-Infer's fix and vLLM-Ascend's full-graph MTP do, so no step charges it.
    Where a cited figure is the whole gap (xDeepServe's ~2 ms bubble between iterations on
    CloudMatrix384), ``scheduler_us`` is that figure less :meth:`graph_boundary_us` (``npusim
    calibrate --only runtime``), so the modelled gap is the measured one.

    ``sync_us`` is the host's wait for a synchronize to return once the device has finished (after
    ``aclrtSynchronizeStream`` / ``torch.npu.synchronize()``): charged once per step (above), and it
    prices a host-timed call of one operator (launch, run, synchronise: host dispatch +
    ``kernel_launch_us`` + the kernel + ``sync_us``), how some operator benchmarks time their
    kernels (:mod:`npusim.validate.operators`, a row's ``timing: sync``).

    A step's ``breakdown_us`` files host time (host dispatch the device waited for, graph launch and
    updates, the step's synchronize and scheduler) under ``host`` and per-kernel launches under ``launch`` (:mod:`npusim.system.execute`).
    ``sources``: where each constant comes from (``npusim calibrate --only runtime`` recomputes
    them); a constant left at 0 is not modelled."""

    decode_mode: Literal["eager", "graph"] = "graph"
    prefill_mode: Literal["eager", "graph"] = "eager"
    host_dispatch_us: NonNegativeFloat = 12.142
    attention_dispatch_us: NonNegativeFloat = 70.338
    graph_launch_us: NonNegativeFloat = 100.0
    graph_update_us: NonNegativeFloat = 218.18
    hccl_dispatch_us: NonNegativeFloat = 68.48
    kernel_launch_us: NonNegativeFloat = 0.7535
    scheduler_us: NonNegativeFloat = 0.0
    sync_us: NonNegativeFloat = 13.3205
    sources: dict[str, str] = Field(default_factory=lambda: {"host_dispatch_us": HOST_DISPATCH_SOURCE,
                                                             "attention_dispatch_us": ATTENTION_DISPATCH_SOURCE,
                                                             "graph_launch_us": GRAPH_LAUNCH_SOURCE,
                                                             "graph_update_us": GRAPH_UPDATE_SOURCE,
                                                             "hccl_dispatch_us": HCCL_DISPATCH_SOURCE,
                                                             "kernel_launch_us": KERNEL_LAUNCH_SOURCE,
                                                             "sync_us": SYNC_SOURCE})

    @model_validator(mode="after")
    def _source_keys(self):
        known = ("host_dispatch_us", "attention_dispatch_us", "graph_launch_us", "graph_update_us", "hccl_dispatch_us", "kernel_launch_us",
                 "scheduler_us", "sync_us")
        bad = sorted(set(self.sources) - set(known))
        if bad:
            raise ValueError(f"sources: unknown constant(s) {bad}; expected some of {list(known)}")
        return self

    def graph_boundary_us(self, attention_ops: int = 1) -> float:
        """The device's idle gap (us) at a graph boundary the host steps into, without the per-step
        scheduler: the synchronize's return on the previous graph's output (``sync_us``), the next
        graph's replay enqueue (``graph_launch_us``), the parameter update of its first
        ``attention_ops`` attention operators that no earlier device work hides (``graph_update_us``
        each; vLLM-Ascend updates after the replay call and the captured op waits on an event) and
        the first task's crossing (``kernel_launch_us``). The CPU's own sampling is not modelled
        (no cited figure)."""
        if attention_ops < 0:
            raise ValueError(f"graph_boundary_us: attention_ops {attention_ops} < 0")
        return self.sync_us + self.graph_launch_us + self.graph_update_us * attention_ops + self.kernel_launch_us

    def replay_gap_us(self, attention_ops: int = 1, scheduler_us: float | None = None) -> float:
        """The device's idle gap (us) between two graph-mode steps: ``scheduler_us`` (the
        framework's per-step work; ``scheduler_us`` given: a deployment's ``step_overhead_us``) plus
        :meth:`graph_boundary_us` (the first layer's ``attention_ops``)."""
        sched = self.scheduler_us if scheduler_us is None else float(scheduler_us)
        return sched + self.graph_boundary_us(attention_ops)

    def mode_for(self, phase: str, mode: str | None = None) -> str:
        """The runtime mode of a ``phase`` step: ``mode`` if given, else the system's default."""
        if mode is None:
            return self.decode_mode if phase == "decode" else self.prefill_mode
        if mode not in RUNTIME_MODES:
            from npusim.errors import ConfigError
            raise ConfigError(f"--runtime {mode}: expected one of {', '.join(RUNTIME_MODES)}")
        return mode


#: HCCL_BUFFSIZE's default (CANN environment variable reference: 200, unit MB)
HCCL_BUFFER_SOURCE = "CANN environment variable reference, HCCL_BUFFSIZE: default 200 (MB); each comm domain holds 2 x it"
HCCL_COPY_SOURCE = ("FlagPerf A3 toolkit summary: ascend-dmi D2D copy bandwidth per die 1513.97-1541.80 GB/s (mean "
                    "1527.89) read as HBM traffic (read + write), over the die's HBM peak")


class Hccl(StrictModel):
    """HCCL's op-base execution around a collective's transfers (:mod:`npusim.system.collectives`).

    ``user_buffer_copies``: a collective first copies each rank's input from the user's buffer into
    its CCL buffer and last copies the result out (local SDMA copies: a copied byte is read and
    written, at ``copy_efficiency`` of the die's HBM peak); ``buffer_mb``: the CCL buffer
    (``HCCL_BUFFSIZE``, MB of 2^20 bytes): a collective whose share (the larger of a rank's input
    and output, over the rank count inside a server: SDMA) does not fit runs in rounds, one after another, each with its copies
    and its own steps. ``expansion``: where HCCL expands a collective into tasks (``HCCL_OP_EXPANSION_MODE``:
    ``host``, or ``aiv`` on the vector cores); on an A3 server it moves the size up to which HCCL keeps
    the one-shot mesh (:data:`npusim.system.collectives.HCCL_A3_MESH_MAX_BYTES`).
    ``sources``: where each constant comes from (``npusim calibrate --only hccl``)."""

    user_buffer_copies: bool = True
    copy_efficiency: float = Field(default=0.9549, gt=0.0, le=1.0)
    buffer_mb: PositiveFloat = 200.0
    expansion: Literal["host", "aiv"] = "host"
    sources: dict[str, str] = Field(default_factory=lambda: {"buffer_mb": HCCL_BUFFER_SOURCE,
                                                             "copy_efficiency": HCCL_COPY_SOURCE})


class Protocol(StrictModel):
    """What a fabric's protocol costs per target kind (``die`` or ``cpu``).

    ``*_efficiency``: payload bytes per wire byte (headers, flow-control, read responses): a
    transfer of ``B`` bytes moves ``B / efficiency`` bytes over each link of its path.
    ``*_overhead_ns``: fixed time per transfer besides the path (initiator launch, target memory
    access, completion), charged once. A write completes when its acknowledgement is back at the
    initiator and a read when its data is: both are charged one round trip of the path latency.
    """

    read_efficiency: dict[str, float] = Field(default_factory=lambda: {"die": 1.0, "cpu": 1.0})
    write_efficiency: dict[str, float] = Field(default_factory=lambda: {"die": 1.0, "cpu": 1.0})
    read_overhead_ns: dict[str, NonNegativeFloat] = Field(default_factory=lambda: {"die": 0.0, "cpu": 0.0})
    write_overhead_ns: dict[str, NonNegativeFloat] = Field(default_factory=lambda: {"die": 0.0, "cpu": 0.0})

    @model_validator(mode="after")
    def _kinds(self):
        for name in ("read_efficiency", "write_efficiency", "read_overhead_ns", "write_overhead_ns"):
            table = getattr(self, name)
            bad = sorted(set(table) - set(ENDPOINT_KINDS))
            if bad:
                raise ValueError(f"{name}: unknown endpoint kind(s) {bad}; expected {list(ENDPOINT_KINDS)}")
            if name.endswith("efficiency") and any(not 0 < v <= 1 for v in table.values()):
                raise ValueError(f"{name}: efficiencies must be in (0, 1]")
        return self


class Switch(StrictModel):
    name: str
    per: Literal["node", "system"] = "node"
    chips: PositiveInt = 1
    ports_per_chip: PositiveInt | None = None
    latency_ns: NonNegativeFloat = 0.0


class Link(StrictModel):
    between: tuple[str, str]
    count: PositiveInt = 1
    bandwidth_gbps: PositiveFloat
    latency_ns: NonNegativeFloat = 0.0


class Fabric(StrictModel):
    description: str = ""
    switches: list[Switch] = Field(default_factory=list)
    links: list[Link]
    protocol: Protocol = Field(default_factory=Protocol)
    packet_bytes: PositiveInt = 4096

    @model_validator(mode="after")
    def _names(self):
        names = [s.name for s in self.switches]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"switch name(s) {dup} defined twice")
        clash = sorted(set(names) & {*ENDPOINT_KINDS, "npu"})
        if clash:
            raise ValueError(f"switch name(s) {clash} clash with endpoint kinds {list(ENDPOINT_KINDS)}")
        known = {*names, *ENDPOINT_KINDS}
        for i, link in enumerate(self.links):
            for end in link.between:
                if end not in known:
                    raise ValueError(f"links[{i}].between: '{end}' is a link to nowhere: not a switch of this "
                                     f"fabric ({', '.join(names) or 'none'}) nor an endpoint kind (die, cpu)")
            if link.between[0] == link.between[1] and link.between[0] != "die":
                raise ValueError(f"links[{i}].between: a link from '{link.between[0]}' to itself")
        return self


#: dies and CPUs a system may have: each is a vertex of the fabric graph with its own queues
MAX_ENDPOINTS = 65_536


class System(StrictModel):
    """A multi-NPU system: nodes of NPUs and CPUs on one or more fabrics."""

    name: str
    description: str = ""
    nodes: PositiveInt
    npus_per_node: PositiveInt
    cpus_per_node: NonNegativeInt = 0
    npu: Npu
    cpu: Cpu = Field(default_factory=Cpu)
    initiator: Initiator = Field(default_factory=Initiator)
    moe_operators: MoeOperators = Field(default_factory=MoeOperators)
    runtime: Runtime = Field(default_factory=Runtime)  # the software stack's costs (eager / graph)
    hccl: Hccl = Field(default_factory=Hccl)  # HCCL's op-base copies and CCL buffer around collectives
    fabrics: dict[str, Fabric]

    @model_validator(mode="after")
    def _some_fabric(self):
        if not self.fabrics:
            raise ValueError("fabrics: at least one fabric is needed")
        if self.num_dies + self.num_cpus > MAX_ENDPOINTS:
            raise ValueError(f"nodes x (npus_per_node x npu.dies + cpus_per_node) = {self.num_dies + self.num_cpus:,} "
                             f"endpoints: at most {MAX_ENDPOINTS:,} (CloudMatrix384 has 960)")
        return self

    @property
    def num_npus(self) -> int:
        return self.nodes * self.npus_per_node

    @property
    def num_dies(self) -> int:
        return self.num_npus * self.npu.dies

    @property
    def num_cpus(self) -> int:
        return self.nodes * self.cpus_per_node


class SystemFile(StrictModel):
    """The top level of a system file."""

    system: System
