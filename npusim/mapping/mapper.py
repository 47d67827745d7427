"""The mapper: operator graph + chip + mapping spec -> a program of engine tasks.

How a forward pass is laid out (see ``spec.py`` for the partitions and layouts):

* **Groups.** ``replicas x stages`` tensor-parallel groups of ``t`` cores each
  (:mod:`.layout`). Replicas split the batch's sequences (data parallel); stages
  split the layers (pipeline parallel): embedding on the first stage, final norm and
  LM head on the last. With several sequences per replica the batch is cut into
  micro-batches that flow through the stages (a stage works on micro-batch ``j``
  while the next one works on ``j - 1``).
* **Activation layout.** Between ops the mapper tracks how the current activation is
  spread over the group: ``rep`` (every core has all of it), ``m`` (split by tokens),
  ``mb`` (``tp_mnk``: split by tokens over the grid's ``b`` axis, replicated over
  ``a``) or ``feat`` (split by features, e.g. attention heads). An op that needs
  another layout first converts it with a collective (all-gather); slicing a
  replicated activation is free. A norm over whole rows of a ``feat`` activation first
  all-reduces each token's partial statistics (4 bytes a token).
* **GEMMs on a die with its own GEMM kernel** (an arch ``kernel`` section with ``base_blocks`` for
  the op's dtype: the Ascend presets) run that kernel on the group's cores, as ``ChipCost.gemm`` times
  it (:mod:`.gemm_kernel`: the same plan and tasks; A and B read from HBM or the L2, C written to
  HBM, the kernel after every core's part of the op before); the partition below then only names
  the output layout the ops after it see (see :meth:`Mapper._kernel_gemm`). Elsewhere:
* **GEMMs** follow their partition: ``tp_k`` (K-split, partial sums reduce-scattered by
  output features; input ``rep`` or ``feat``, output ``feat`` — exactly the K-split input the
  next ``tp_k`` GEMM wants, so a chain of K-split GEMMs never all-gathers; an op that needs
  the whole activation all-gathers it first, which makes reduce-scatter + all-gather = the
  all-reduce), ``tp_mn`` (weights all-gathered N-tile by
  N-tile so only one gathered tile is in SRAM at a time, each core computes its token
  rows; output ``m``), ``tp_mnk`` (``a x b`` grid: weights all-gathered along ``b``,
  partial sums all-reduced along ``a``; output ``mb``); ``auto`` picks the lowest
  estimated time per GEMM: weight stream, gathers, compute and reductions as each lowering
  orders them (:meth:`Mapper._partition`).
* **Attention** is head-parallel when its input is replicated (output ``feat``: the
  K-split input a ``tp_k`` O-projection wants) and token-parallel otherwise (keys and
  values all-gathered across the group; in decode each core keeps its own sequences'
  cache). MLA (one latent KV shared by all heads) with at least one sequence per core is
  split by whole sequences instead (output ``m``), so no core reads another's cache; MLA decode
  splits the cached KV over the cores, or, when the op states its paged table's width
  (``Op.kv_table_keys``), as the incremental kernel's ``SplitBNS`` does (``flash_attention.paged_split``:
  pieces of the table, not of the sequence). QK^T and PV run on the cube, softmax on the vector unit; the KV cache is
  read from HBM (DMA) when it lives there, and prefill writes the new keys/values.
* **Weights** stay resident in SRAM when the stage's shards fit next to the KV cache
  (a core holds its stage's layers' KV only) and the reserve; otherwise each core streams
  its shard from HBM in tiles, with two tile buffers: a tile load waits until the GEMM two
  tiles back has freed its buffer, so loads run ahead of compute exactly as far as a
  double-buffered NPU program can. ``memory.weights: first_use`` keeps them resident but
  loads each shard from HBM by its first use (a cold start), once per core.
* **Micro-batches** (default: one per stage with resident weights, one otherwise): under
  TP-MN / TP-MNK the weights a core all-gathers stay gathered for the following
  micro-batches when the stage's gathered weights fit SRAM beside the shards; when they do
  not, the default is one micro-batch (see ``_default_microbatches``).
* **MoE** layers are expert-parallel within the group: expert ``e`` lives on the group's
  core ``e mod t``; each core owns a slice of the tokens and, when the activation is split by
  tokens, sends each of them once to every other core holding one of its experts (dispatch, an
  all-to-all over the NoC with the routed token counts; a replicated activation needs none),
  runs its experts on the tokens they received, sums each token's local expert outputs, and
  sends the sums back to the token's owner (combine, an all-to-all), which adds them up; see
  :meth:`Mapper._moe`. Embedding rows are fetched by DMA.


KV addresses: each core's KV region (upper half of HBM) has one area per layer, the core's
sequences back to back in it; a step's new keys/values are written after the cached ones.
The trip of every DMA over the mesh to the channels' routers is the simulator's
(:mod:`npusim.sim.mempath`), not the mapper's.

Not modelled yet: activation spills to HBM; converted layouts go through an all-gather (an
upper bound).
"""

from __future__ import annotations

import hashlib
import math
import operator
from dataclasses import dataclass, field, fields, replace
from functools import lru_cache

import numpy as np

from npusim.arch.derived import kv_cache_base_address
from npusim.arch.schema import DTYPE_BYTES, Arch
from npusim.comm.collectives import alltoallv, ring_allgather, ring_allreduce, ring_reduce_scatter
from npusim.errors import ConfigError
from npusim.hw.compute.systolic import gemm_cost
from npusim.hw.compute.vector import FUSED_QUANT
from npusim.hw.memory import l2 as l2_model
from npusim.mapping import flash_attention as fa
from npusim.mapping import gemm_kernel
from npusim.mapping.layout import Group, place_groups
from npusim.mapping.spec import MappingSpec
from npusim.model.ir import Graph, Op
from npusim.model.routing import routing_from_counts
from npusim.sim.program import Program, Relocation

SCORE_BYTES = 4  # flash attention's scores leave the cube's accumulators in fp32
FA_PRELOAD = 4  # FlashAttention steps whose QK^T runs ahead of a PV (pto-isa TFA qkPreloadNum, default 4)

MB = 2**20


@dataclass
class Mapped:
    """A mapped forward pass: the program plus what was decided and why."""

    program: Program
    groups: list[Group]
    replicas: int
    stages: int
    microbatches: int
    stage_layers: list[tuple[int, int]]
    weights_resident: bool
    decisions: dict[str, str] = field(default_factory=dict)  # GEMM op name -> partition used
    weight_bytes_per_core: int = 0
    resident_weight_bytes_per_core: int = 0  # all of them if weights_resident; some with weights: partial
    kv_in_hbm: bool = False
    kv_bytes_per_core: int = 0  # KV cache a core holds: its stage's layers, its replica's and TP share
    l2_read_bytes: int = 0  # loads the chip's L2 served (attention's shared KV re-reads)
    notes: list[str] = field(default_factory=list)


def op_class(op: Op) -> str:
    """Which partition class of the mapping spec a GEMM belongs to, from its name."""
    name = op.name.lower()
    for cls, keys in (("qkv", ("q_proj", "k_proj", "v_proj", "qkv", "q_a", "q_b", "kv_a", "kv_b", "c_attn")),
                      ("o_proj", ("o_proj", "out_proj", "attn.c_proj")),
                      ("ffn_up", ("up", "gate", "w1", "w3", "c_fc", "fc1")),
                      ("ffn_down", ("down", "w2", "mlp.c_proj", "fc2")),
                      ("lm_head", ("lm_head", "head"))):
        if any(k in name for k in keys):
            return cls
    return "other"


@lru_cache(maxsize=65536)
def _gemm_cycles(m, k, n, rows, cols, dataflow, k_per_pe, injection, double_buffer) -> int:
    """Cycles of one GEMM (memoised: serving maps the same shapes over and over)."""
    return gemm_cost(m, k, n, rows, cols, dataflow, k_per_pe, injection, double_buffer=double_buffer).cycles


@lru_cache(maxsize=64)
def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


#: an op's compared fields but its name, layer and inputs: what a lowering of it reads besides where it is
_op_shape = operator.attrgetter(*(f.name for f in fields(Op) if f.compare and f.name not in ("name", "layer", "inputs")))


def _split(total: int, parts: int, i: int) -> int:
    base, extra = divmod(int(total), parts)
    return base + (1 if i < extra else 0)


def _us_cycles(arch: Arch, us: float) -> int:
    """``us`` microseconds in ``arch``'s core cycles."""
    return int(round(us * 1e3 * arch.clock_ghz))


def attention_mix_start_us(arch: Arch, used: int, cores: int | None = None) -> float:
    """The extra start of an attention kernel launched as a MIX kernel (cube and vector cores
    together) on ``used`` cube cores of a group of ``cores`` (default: the die's) that its units are
    split over (microseconds): :func:`~npusim.mapping.gemm_kernel.mix_start_us`, the same function
    and the same ``coreNum`` rule as a GEMM's (the core count the kernel is tiled for; CATLASS
    ``select_kernel_b16.h`` ``headCost``, ``doc/CommonMatmul.md`` 2.3.3: "只要启动了mix kernel，就会有1~5us左右的额外开销"). The Ascend
    attention kernels are MIX kernels: ops-transformer ``fused_infer_attention_score_v3.cpp``
    (``KERNEL_TASK_TYPE_DEFAULT(KERNEL_TYPE_MIX_AIC_1_2)``, its MLA tiling keys ``MIX_AIC_1_1``) and
    ``incre_flash_attention.cpp`` (``MIX_AIC_1_2`` for ``__CCE_AICORE__ > 200``, A2/A3). Assumed: the
    launch cost CATLASS measured for its MIX matmul applies to any MIX kernel (it is the runtime's
    start of the AIVs, not the matmul's). Until session 46 the denominator was the die's AIC count
    whatever group the kernel ran on, while a GEMM's was its share. 0 without the arch's ``kernel``
    section or with no core used."""
    return gemm_kernel.mix_start_us(arch, used, arch.num_cores if cores is None else cores) if used > 0 else 0.0


def attention_prologue_cycles(arch: Arch, used: int, cores: int | None = None) -> tuple[int, int]:
    """``(AIC, AIV)`` cycles a working core of an attention kernel waits before its first task on
    the cube / vector side: the MIX kernel's extra start (:func:`attention_mix_start_us`, on both
    sides as the GEMM kernels charge it) plus the AIC's ``cube_setup_us`` / the AIVs'
    ``vector_setup_us`` prologue (the arch's ``kernel`` section, calibrated on GEMM and vector
    kernels, which are not MIX kernels: the two do not overlap). The kernel's device-side start
    (``kernel.start_us``) is not included (its caller's, once per kernel). (0, 0) without the section."""
    kc = arch.kernel
    if kc is None:
        return 0, 0
    mix = attention_mix_start_us(arch, used, cores)
    return _us_cycles(arch, kc.cube_setup_us + mix), _us_cycles(arch, kc.vector_setup_us + mix)


def _size(nbytes: float) -> str:
    """Bytes for a note: MB to one decimal, KB below 0.1 MB (so a small model's shard is not "0.0 MB")."""
    return f"{nbytes / MB:.1f} MB" if nbytes >= 0.1 * MB else f"{nbytes / 1024:.1f} KB"


def _scale(op: Op, frac: float) -> Op:
    """The share ``frac`` of ``op``'s sequences (data parallel / micro-batch slice)."""
    if frac == 1.0:
        return op
    from dataclasses import replace

    def sc(x: int) -> int:
        return max(1, int(round(x * frac))) if x else 0

    if op.kind in ("gemm", "embedding") and op.attrs.get("per_token", True):
        return replace(op, m=sc(op.m))
    if op.kind == "attention":
        return replace(op, batch=sc(op.batch))
    if op.kind == "vector":
        row = op.row_len or 1
        return replace(op, elements=sc(op.elements // row) * row)
    if op.kind == "moe":  # the first tokens' routing; Mapper._moe picks the slice it really gets
        m = sc(op.m)
        picks = _routing(op)[:m]
        return replace(op, m=m, expert_tokens=tuple(np.bincount(picks.ravel(), minlength=op.experts).tolist()),
                       expert_routing=tuple(picks.ravel().tolist()))
    if op.kind == "data":
        return replace(op, nbytes=sc(op.nbytes))
    return op


def _routing(op: Op) -> np.ndarray:
    """``(m, top_k)`` expert ids of a ``moe`` op's tokens: its ``expert_routing``, or an
    assignment meeting its ``expert_tokens`` (:func:`~npusim.model.routing.routing_from_counts`)."""
    if op.expert_routing:
        return np.asarray(op.expert_routing, dtype=np.int64).reshape(op.m, op.top_k)
    if not op.expert_tokens:
        raise ConfigError(f"MoE op {op.name} states neither expert_tokens nor expert_routing")
    picks = routing_from_counts(op.expert_tokens, op.top_k)
    if picks.shape[0] != op.m:
        raise ConfigError(f"MoE op {op.name}: expert_tokens route {picks.shape[0]} tokens, but m = {op.m}")
    return picks


class _GroupState:
    """The current activation's layout on one group and, per core, the task that made it."""

    def __init__(self, group: Group):
        self.group = group
        self.cores = list(group.cores)
        self.layout = "rep"
        self.ready = [-1] * len(self.cores)

    def set(self, layout: str, tasks: list[int]) -> None:
        self.layout = layout
        self.ready = list(tasks)


class Mapper:
    def __init__(self, graph: Graph, arch: Arch, spec: MappingSpec, kv_hbm_fraction: float | None = None,
                 cores: list[int] | None = None, l2_addressed: bool = False):
        self.graph, self.arch, self.spec = graph, arch, spec
        # the program runs with the TLM L2 (see map_model): L2 traffic as DMAs at real addresses
        self.l2_addressed = bool(l2_addressed) and arch.l2 is not None
        self.kv_hbm_fraction = kv_hbm_fraction
        self.region = list(cores) if cores is not None else None
        # with core classes the smallest SRAM among the cores used bounds what every core holds
        self.sram_bytes = min(arch.sram_for(c).capacity_mb for c in (self.region or range(arch.num_cores))) * MB
        self.prog = Program(arch.num_cores, meta={"model": graph.name, "phase": graph.phase, "batch": graph.batch,
                                                  "seq_len": graph.seq_len, "kv_len": graph.kv_len,
                                                  "spec": spec.model_dump(mode="json")})
        self.t = spec.tensor_parallel.degree
        self.grid = spec.tensor_parallel.grid()
        self.link_gbps = arch.noc.link_bytes_per_cycle * arch.clock_ghz
        self.decisions: dict[str, str] = {}
        self.l2_read_bytes = 0  # reads the chip's L2 served (attention: KV re-reads, cube/vector hand-offs)
        self.weight_addr: dict[str, int] = {}
        self.next_addr = 0
        self.tile_bytes = spec.memory.weight_tile_kb * 1024
        self.buffers: dict[int, list[int]] = {}  # core -> GEMM tasks that use its last weight tiles
        self.dma_turn: dict[int, int] = {}  # core -> weight loads issued (they alternate DMA engines)
        self.resident_ops: set[str] = set()  # memory.weights partial: ops whose weights stay in SRAM
        self.gemm_planners: dict[tuple, gemm_kernel.Planner] = {}  # the die's GEMM kernel (_kernel_gemm)
        self.act_turn = 0  # which of the two activation areas the next kernel GEMM reads A from (_kernel_gemm)
        self.moe_ops = {op.name: op for op in graph.ops if op.kind == "moe"}
        self.moe_cursor: dict[str, int] = {}  # MoE op -> first token of its next slice
        self.first_use = False  # memory.weights first_use: resident weights loaded by their first use
        self.loaded: set[tuple] = set()  # (core, op, piece) whose weights first_use has loaded
        self.kept: dict[tuple, list[int]] = {}  # gathered weights kept across micro-batches -> gather tasks
        self.gathered_bytes, self.keep_gathered = 0.0, False
        self.memo_ctx: tuple | None = None  # set by plan() once memory is decided (see _memo_context)
        self.attention_ctx: tuple | None = None
        self._arch_digest: str | None = None  # the arch's, for keys (_arch_key)
        self._partitions: dict[tuple, str] = {}  # auto partition choices (_partition)
        half = int(arch.hbm.capacity_gb * 2**30) // 2  # weights in the lower half, KV caches in the upper
        self.kv_base = [kv_cache_base_address(arch, c) for c in range(arch.num_cores)]
        # each core's KV region holds one area per layer (its sequences back to back), so
        # different layers' caches sit in different DRAM rows
        self.kv_layers = {layer: i for i, layer in enumerate(graph.layers())}
        self.kv_layer_stride = (half // arch.num_cores) // max(1, len(self.kv_layers)) // 4096 * 4096

    # -- planning ---------------------------------------------------------------------------
    def plan(self) -> Mapped:
        g, arch, spec = self.graph, self.arch, self.spec
        stages = spec.pipeline.stages
        layers = g.layers()
        if stages > max(1, len(layers)):
            raise ConfigError(f"pipeline.stages {stages} exceeds the model's {len(layers)} layers")
        replicas = spec.data_parallel
        available = arch.num_cores if self.region is None else len(self.region)
        if replicas == "auto":
            replicas = max(1, available // (self.t * stages))
        replicas = min(replicas, max(1, g.batch))
        if self.region is None:
            groups = place_groups(arch.cores.grid.width, arch.cores.grid.height, self.t, stages, replicas,
                                  spec.layout.group, spec.layout.origin)
        else:
            groups = self._region_groups(stages, replicas)
        stage_layers = self._stage_layers(layers, stages)
        per_replica = [_split(g.batch, replicas, r) for r in range(replicas)]
        mapped = Mapped(self.prog, groups, replicas, stages, 1, stage_layers, False)
        self._decide_memory(mapped, stage_layers)
        stage_ops = self._ops_by_stage(stage_layers)
        default_micro = self._default_microbatches(mapped, stage_ops, groups[0].cores[0])
        micro = spec.pipeline.microbatches or default_micro
        micro = max(1, min(micro, min(per_replica)))
        mapped.microbatches = micro
        self.memo_ctx = self._memo_context()
        self.attention_ctx = None if self.memo_ctx is None else (self.memo_ctx, self._kv_context())
        if micro > 1 and not self.resident:
            mapped.notes.append(f"{micro} micro-batches each stream the weights again (pipeline.microbatches)")
        if micro > 1 and self.resident and self.gathered_bytes and not self.keep_gathered:
            mapped.notes.append(f"{micro} micro-batches each all-gather the TP-MN/MNK weights again "
                                f"(pipeline.microbatches; {self.gathered_bytes / MB:.1f} MB per core gathered do not "
                                f"fit SRAM beside the shards)")
        for r in range(replicas):
            for mb in range(micro):
                seqs = _split(per_replica[r], micro, mb)
                frac = seqs / g.batch
                prev_state = None
                for s in range(stages):
                    grp = groups[r * stages + s]
                    state = _GroupState(grp)
                    if prev_state is not None:
                        self._stage_transfer(prev_state, state, stage_ops[s - 1], frac)
                    for op in stage_ops[s]:
                        self._emit(state, _scale(op, frac), f"r{r}.mb{mb}.")
                    prev_state = state
        mapped.decisions = self.decisions
        mapped.l2_read_bytes = self.l2_read_bytes
        return mapped

    def _region_groups(self, stages: int, replicas: int) -> list[Group]:
        """Groups on a given ordered list of cores (a region of the chip, e.g. the prefill or the
        decode cores of PD disaggregation): consecutive runs of ``t`` cores, in the list's order."""
        t, cores = self.t, self.region
        need = t * stages * replicas
        if need > len(cores):
            raise ConfigError(f"{replicas} replica(s) x {stages} stage(s) x TP {t} = {need} cores, "
                              f"but the region has {len(cores)}")
        return [Group(g // stages, g % stages, tuple(cores[g * t:(g + 1) * t]), (1, t))
                for g in range(stages * replicas)]

    def _stage_layers(self, layers: list[int], stages: int) -> list[tuple[int, int]]:
        if self.spec.pipeline.layers is not None:
            ranges = [tuple(x) for x in self.spec.pipeline.layers]
            if ranges[-1][1] != (layers[-1] if layers else 0):
                raise ConfigError(f"pipeline.layers must cover layers {layers[0]}..{layers[-1]}, got {ranges}")
            return ranges
        if not layers:
            return [(0, 0)]
        n = len(layers)
        counts = [_split(n, stages, s) for s in range(stages)]
        if self.spec.pipeline.balance == "cost":
            counts = self._balanced_counts(layers, stages) or counts
        out, start = [], 0
        for count in counts:
            out.append((layers[start], layers[start + count - 1]))
            start += count
        return out

    def _balanced_counts(self, layers: list[int], stages: int) -> list[int] | None:
        """Layers per stage that minimise the costliest stage, where an op costs its roofline
        time on one core (FLOPs at the array's peak or weight bytes at the core's share of HBM
        bandwidth, whichever is longer) and ops outside the layers (the LM head, final norm)
        count towards the last stage, ops before them towards the first. None if nothing costs."""
        arch = self.arch
        sa = arch.cores.systolic_array
        flops_per_ns = 2 * sa.rows * sa.cols * max(sa.macs_per_pe_per_cycle.values()) * arch.clock_ghz
        bytes_per_ns = arch.hbm.total_bandwidth_gbps / arch.num_cores
        index = {layer: i for i, layer in enumerate(layers)}
        cost = [0.0] * len(layers)
        head = tail = 0.0
        seen = False
        for op in self.graph.ops:
            c = max(op.flops / flops_per_ns, (op.weight_bytes if op.kind != "embedding" else 0) / bytes_per_ns)
            if op.layer in index:
                cost[index[op.layer]] += c
                seen = True
            elif seen:
                tail += c
            else:
                head += c
        if not any(cost):
            return None
        n = len(cost)
        prefix = [0.0]
        for c in cost:
            prefix.append(prefix[-1] + c)
        # best_max[s][i], best_sq[s][i]: the least max-stage cost, then the least sum of squared
        # stage costs, of layers i.. in stages s..; O(S n^2) (plain floats and locals: this runs
        # for every serving iteration's shape)
        inf = float("inf")
        best_max = [[inf] * (n + 1) for _ in range(stages + 1)]
        best_sq = [[inf] * (n + 1) for _ in range(stages + 1)]
        cut = [[0] * (n + 1) for _ in range(stages + 1)]
        best_max[stages][n] = best_sq[stages][n] = 0.0
        eps = 1e-9 * prefix[-1]
        eps_sq = eps * eps
        for s in range(stages - 1, -1, -1):
            left = stages - s
            first = head if s == 0 else 0.0
            last = tail if s == stages - 1 else 0.0
            rest_max, rest_sq = best_max[s + 1], best_sq[s + 1]
            for i in range(n - left, -1, -1):
                at = prefix[i]
                cur_max = cur_sq = inf
                cur_cut = 0
                for j in range(i + 1, n - left + 2):
                    c = prefix[j] - at + first + last
                    v_max = c if c >= rest_max[j] else rest_max[j]
                    v_sq = c * c + rest_sq[j]
                    if v_max < cur_max - eps or (v_max <= cur_max + eps and v_sq < cur_sq - eps_sq):
                        cur_max, cur_sq, cur_cut = v_max, v_sq, j
                best_max[s][i], best_sq[s][i], cut[s][i] = cur_max, cur_sq, cur_cut
        counts, i = [], 0
        for s in range(stages):
            j = cut[s][i]
            counts.append(j - i)
            i = j
        return counts

    def _ops_by_stage(self, stage_layers) -> list[list[Op]]:
        out: list[list[Op]] = [[] for _ in stage_layers]
        stage_of: dict[int, int] = {}
        seen_layer = False
        for op in self.graph.ops:
            if op.layer >= 0:
                seen_layer = True
                s = stage_of.get(op.layer)
                if s is None:
                    s = stage_of[op.layer] = next(i for i, (a, b) in enumerate(stage_layers) if a <= op.layer <= b)
            else:
                s = len(stage_layers) - 1 if seen_layer else 0
            out[s].append(op)
        return out

    def _default_microbatches(self, mapped: Mapped, stage_ops, core: int) -> int:
        """Micro-batches keep the stages busy at once, but each one would stream streamed weights
        again, so those go through as one batch; resident weights get one micro-batch per stage.
        Under TP-MN / TP-MNK a core all-gathers its row's weight shards before each GEMM: gathered
        weights stay gathered across micro-batches when every GEMM's gathered weights of the stage
        fit SRAM beside the shards (``keep_gathered``); when they do not, every micro-batch would
        all-gather them again — (t-1)/t of the stage's weights over the links per micro-batch,
        which costs more than the pipelining gains (a 16-core PD-disaggregation case ran 1.68x
        longer) — so the default is then one micro-batch. (Kept gathers make micro-batches pay in
        prefill: 2x faster on that chip with 256 MB SRAM; a decode step of a few tokens a
        micro-batch still loses, each micro-batch injecting every weight into the array again —
        see validation/mapper_memory_study.py.)"""
        stages = mapped.stages
        self.gathered_bytes = 0.0
        self.keep_gathered = False
        if self.t > 1:
            for ops in stage_ops:
                total = 0.0
                for op in ops:
                    if op.kind == "gemm" and op.weight:
                        part = self._partition(op, core)
                        a = {"tp_mn": 1, "tp_mnk": self.grid[0]}.get(part)
                        if a is not None:  # the core gathers K/a x N of the weights
                            total += op.weight_bytes / a
                self.gathered_bytes = max(self.gathered_bytes, total)
        if not (stages > 1 and self.resident):
            return 1
        if not self.gathered_bytes:
            return stages
        self.keep_gathered = (mapped.weight_bytes_per_core + self.gathered_bytes + self.kv_sram_bytes
                              <= self.sram_budget)
        return stages if self.keep_gathered else 1

    def _decide_memory(self, mapped: Mapped, stage_layers) -> None:
        """Resident weights if every core's shards (plus its KV share) fit its SRAM budget. A core
        holds the KV cache of its stage's layers only: the largest stage's, over the replicas and
        the TP degree."""
        arch, spec, g = self.arch, self.spec, self.graph
        stages_ops = self._ops_by_stage(stage_layers)
        # embedding tables stay in HBM (rows are fetched); everything else wants SRAM
        shard = max(sum(op.weight_bytes for op in ops if op.kind != "embedding") for ops in stages_ops) / self.t
        # with a given HBM share (a serving KV manager places the cache) KV takes no SRAM here
        stage_kv = max(sum(op.kv_read_bytes for op in ops) for ops in stages_ops)
        kv = 0 if self.kv_hbm_fraction is not None else stage_kv / max(1, mapped.replicas) / self.t
        mapped.kv_bytes_per_core = int(kv)
        sram = self.sram_bytes
        # what the reserve for activations and temporaries leaves: nothing when the reserve is at
        # least the core's SRAM (the default 2 MB against the Ascend presets' 0.5 MB L1)
        budget = max(0.0, sram - spec.memory.sram_reserve_mb * MB)
        room = (f"{budget / MB:.1f} MB of SRAM" if budget > 0 else
                f"any SRAM: memory.sram_reserve_mb ({spec.memory.sram_reserve_mb:g} MB) keeps all of each core's "
                f"{sram / MB:g} MB for activations and temporaries")
        hbm = arch.hbm.capacity_gb * 2**30
        total_weights = g.weight_bytes
        if total_weights + g.kv_read_bytes > hbm + sram * arch.num_cores:
            raise ConfigError(
                f"{g.name} does not fit {arch.name}: {total_weights / 2**30:.1f} GiB of weights and "
                f"{g.kv_read_bytes / 2**30:.1f} GiB of KV cache, but the chip has {arch.hbm.capacity_gb:g} GiB HBM "
                f"+ {sram * arch.num_cores / 2**30:.1f} GiB SRAM")
        want_w, want_kv = spec.memory.weights, spec.memory.kv_cache
        mapped.kv_in_hbm = want_kv == "hbm" or (want_kv == "auto" and kv > budget)
        kv_sram = 0 if mapped.kv_in_hbm else kv
        if want_kv == "sram" and kv > budget:
            raise ConfigError(f"memory.kv_cache: sram, but each core needs {kv / MB:.1f} MB of KV cache and "
                              f"has {budget / MB:.1f} MB (capacity minus sram_reserve_mb)")
        fits = shard + kv_sram <= budget
        if want_w in ("sram", "first_use") and not fits:
            raise ConfigError(f"memory.weights: {want_w}, but each core's weight shards need {shard / MB:.1f} MB "
                              f"(+ {kv_sram / MB:.1f} MB KV) and it has {budget / MB:.1f} MB")
        mapped.weights_resident = want_w in ("sram", "first_use") or (want_w in ("auto", "partial") and fits)
        self.first_use = want_w == "first_use"
        self.sram_budget, self.kv_sram_bytes = budget, kv_sram
        if self.first_use:
            mapped.notes.append(f"weights stay in SRAM once loaded: each core's {shard / MB:.1f} MB per stage are "
                                f"loaded from HBM on first use (memory.weights: first_use)")
        mapped.weight_bytes_per_core = int(shard)
        mapped.resident_weight_bytes_per_core = int(shard) if mapped.weights_resident else 0
        if want_w == "partial" and not fits:
            self._partial_residency(mapped, stages_ops, budget - kv_sram)
        if not mapped.weights_resident and want_w == "hbm":
            mapped.notes.append(f"weights stream from HBM (memory.weights: hbm; {_size(shard)} per core per "
                                f"stage {'would fit' if fits else 'do not fit'} {room}"
                                + (f" beside {kv_sram / MB:.1f} MB of KV cache" if kv_sram else "") + ")")
        elif not mapped.weights_resident:
            mapped.notes.append(f"weights stream from HBM ({_size(shard)} per core per stage do not fit "
                                f"{room}" + (f" beside {kv_sram / MB:.1f} MB of KV cache"
                                                                    if kv_sram else "") + (
                                    f"; {mapped.resident_weight_bytes_per_core / MB:.1f} MB of them stay resident"
                                    if want_w == "partial" else "") + ")")
        self.resident = mapped.weights_resident
        self.kv_in_hbm = mapped.kv_in_hbm
        if self.kv_hbm_fraction is None:
            self.kv_hbm_fraction = 1.0 if mapped.kv_in_hbm else 0.0

    def _partial_residency(self, mapped: Mapped, stages_ops, budget: float) -> None:
        """``memory.weights: partial``: a stage whose weight shards fit ``budget`` (the SRAM left
        after the reserve and the KV share) keeps them all; another keeps whole weight tensors,
        in graph order, while they fit what two streaming tile buffers leave, and streams the
        others through those buffers."""
        most = 0
        for ops in stages_ops:
            weighted = [op for op in ops if op.kind != "embedding" and op.weight and op.weight_bytes > 0]
            room = budget if sum(op.weight_bytes for op in weighted) / self.t <= budget else \
                budget - 2 * self.tile_bytes
            used = 0.0
            for op in weighted:
                share = op.weight_bytes / self.t
                if share <= room - used:
                    self.resident_ops.add(op.name)
                    used += share
            most = max(most, int(used))
        mapped.resident_weight_bytes_per_core = most

    # -- memoised lowering ---------------------------------------------------------------------
    def _memo_context(self) -> tuple | None:
        """Everything besides the op, its group's cores and state that lowering a GEMM or an
        attention op reads (the chip, the spec and what was decided from them), as a key; None
        when lowering has effects a replay would not reproduce (first-use loads, weights kept
        gathered across micro-batches)."""
        if self.first_use or self.keep_gathered:
            return None
        return (self._arch_key(), _digest(self.spec.model_dump_json()), self.t, self.grid,
                self.sram_bytes, self.tile_bytes, self.resident, tuple(sorted(self.resident_ops)), self.l2_addressed)

    def _arch_key(self) -> str:
        """The chip's digest, for memo keys (computed once per mapper)."""
        if self._arch_digest is None:
            self._arch_digest = _digest(self.arch.model_dump_json())
        return self._arch_digest

    def _kv_context(self) -> tuple:
        """What lowering an attention op reads beyond :meth:`_memo_context`: where the KV cache is."""
        return (self.kv_hbm_fraction, self.kv_in_hbm, tuple(self.kv_base), self.kv_layer_stride,
                tuple(sorted(self.kv_layers.items())), self.l2_addressed)

    def _memo_emit(self, st: _GroupState, op: Op, name: str, lower, ctx: tuple) -> None:
        """Lower a GEMM or attention op through :meth:`Program.recorded`: an op lowered before with
        the same name, shape, cores, activation layout, weight address, DMA-engine turns and
        pending weight buffers (by any mapper of the same context, e.g. an earlier serving
        iteration with as many tokens) is replayed, task for task, with its effects on the
        mapper's state; otherwise ``lower(st, op, name)`` records it."""
        cores = st.cores
        engines = self.arch.cores.dma.engines
        bufs = [self.buffers.get(c) for c in cores]
        ext = list(st.ready) + [x for b in bufs if b for x in b]
        key = ("op", ctx, op, name, tuple(cores), st.layout,
               tuple(-1 if b is None else len(b) for b in bufs),
               tuple(self.dma_turn.get(c, 0) % engines for c in cores),
               self.weight_addr.get(op.name), self.next_addr, self.act_turn)
        turns = [self.dma_turn.get(c, 0) for c in cores]
        l2_before = self.l2_read_bytes
        addresses, had_address = len(self.weight_addr), op.name in self.weight_addr
        built = []

        def build():
            built.append(True)
            lower(st, op, name)
            after = [self.buffers.get(c) for c in cores]
            outs = list(st.ready) + [x for b in after if b for x in b]
            new_address = not had_address and op.name in self.weight_addr
            if len(self.weight_addr) != addresses + new_address:
                return outs, None  # it placed other weights: effects this block does not track
            extra = (len(st.ready), st.layout, tuple(-1 if b is None else len(b) for b in after),
                     tuple(self.dma_turn.get(c, 0) - t for c, t in zip(cores, turns)),
                     self.decisions.get(op.name), self.weight_addr.get(op.name), self.next_addr,
                     self.l2_read_bytes - l2_before, self.act_turn)
            return outs, extra

        outs, extra = self.prog.recorded(key, ext, build)
        if built:  # lowered now: the mapper's state is already what it did
            return
        n_ready, layout, lens, turned, decision, address, next_addr, l2_bytes, self.act_turn = extra
        self.l2_read_bytes += l2_bytes
        st.layout, st.ready = layout, outs[:n_ready]
        at = n_ready
        for c, n in zip(cores, lens):
            if n >= 0:
                self.buffers[c] = outs[at:at + n]
                at += n
        for c, d in zip(cores, turned):
            if d:
                self.dma_turn[c] = self.dma_turn.get(c, 0) + d
        if decision is not None:
            self.decisions[op.name] = decision
        if address is not None:
            self.weight_addr[op.name] = address
        self.next_addr = next_addr

    def _memo_vector(self, st: _GroupState, op: Op, name: str) -> None:
        """A vector op through :meth:`Program.recorded` (see :meth:`_memo_emit`): it reads the op,
        the group's cores and layout and the model's hidden size, and sets only the readiness."""
        hidden = self.graph.meta.get("config", {}).get("hidden_size", 0)
        key = ("vector", self.memo_ctx, op, name, tuple(st.cores), st.layout, hidden)
        built = []

        def build():
            built.append(True)
            self._vector(st, op, name)
            return list(st.ready), (st.layout, len(st.ready))

        outs, (layout, n) = self.prog.recorded(key, st.ready, build, fn_table=True)
        if not built:
            st.layout, st.ready = layout, outs[:n]

    # -- emission ---------------------------------------------------------------------------
    def _emit(self, st: _GroupState, op: Op, tag: str) -> None:
        name = tag + op.name
        if op.kind in ("gemm", "attention"):  # memoised unless memo_ctx is None (see _memo_context)
            lower, ctx = (self._gemm, self.memo_ctx) if op.kind == "gemm" else (self._attention, self.attention_ctx)
            # standard attention's FlashAttention is recorded per shape, free of its layer and cores
            # (_flash_attention): a block of the whole op, for its name and cores only, would hold it twice
            if ctx is None or (op.kind == "attention" and op.variant != "mla"):
                lower(st, op, name)
            else:
                self._memo_emit(st, op, name, lower, ctx)
        elif op.kind == "vector":
            (self._vector if self.memo_ctx is None else self._memo_vector)(st, op, name)
        elif op.kind == "embedding":
            self._embedding(st, op, name)
        elif op.kind == "moe":
            self._moe(st, op, name)
        elif op.kind == "data" and op.nbytes:
            self._vector(st, Op(op.name, "vector", op.layer, op.dtype, elements=max(1, int(op.nbytes / op.elem_bytes)),
                                op_class="elementwise"), name)

    def _share(self, st: _GroupState, total: int, i: int) -> int:
        """Core i's part of a per-token quantity under the current layout."""
        if st.layout == "m" or st.layout == "feat":
            return _split(total, self.t, i)
        if st.layout == "mb":
            a, b = self.grid
            return _split(total, b, i % b)
        return int(total)

    def _vector(self, st: _GroupState, op: Op, name: str) -> None:
        """Each core works on its share of rows (whole rows for row-wise ops: norms, softmax)."""
        row = op.row_len or 1
        rows = max(1, op.elements // row)
        hidden = self.graph.meta.get("config", {}).get("hidden_size", 0)
        norm = FUSED_QUANT.get(op.op_class, (op.op_class,))[0]  # a fused norm + quantisation normalises too
        if st.layout == "feat" and self.t > 1 and norm in ("rmsnorm", "layernorm") and hidden and row >= hidden:
            # each core holds a slice of every row: all-reduce the per-token partial sums (fp32; a
            # quantisation's per-row abs-max over split rows is not all-reduced, fused or not)
            coll = ring_allreduce(self.prog, st.cores, 4 * rows, deps=st.ready, dtype="fp32")
            st.ready = [coll.done[c] for c in st.cores]
        tasks = [self.prog.add_vector(c, op.op_class, self._share(st, rows, i) * row, op.dtype,
                                      deps=[st.ready[i]], name=name, fn=op.fn, row_len=op.row_len)
                 for i, c in enumerate(st.cores)]
        st.ready = tasks

    def _to_rep(self, st: _GroupState, nbytes: int, name: str) -> None:
        """All-gather the activation (``nbytes`` in full) so every core holds it."""
        if st.layout == "rep" or self.t == 1:
            st.layout = "rep"
            return
        if st.layout == "mb":
            a, b = self.grid
            done = list(st.ready)
            for i in range(a):
                row = [st.cores[i * b + j] for j in range(b)]
                coll = ring_allgather(self.prog, row, nbytes, deps=[st.ready[i * b + j] for j in range(b)])
                for j in range(b):
                    done[i * b + j] = coll.done[row[j]]
            st.set("rep", done)
            return
        coll = ring_allgather(self.prog, st.cores, nbytes, deps=st.ready)
        st.set("rep", [coll.done[c] for c in st.cores])

    # -- GEMM ---------------------------------------------------------------------------------
    def _partition(self, op: Op, core: int) -> str:
        """The spec's partition for ``op``'s class, or with ``auto`` the cheapest estimate on
        ``core``'s array (a group's cores share one core class in the layouts we build)."""
        cls = op_class(op)
        choice = self.spec.tensor_parallel.partition.for_class(cls)
        if self.t == 1:
            return "tp_k"
        if choice != "auto":
            return choice
        # what the estimate reads besides the mapper's fixed context: the op's shape and class,
        # the core's array, whether its weights stream (a layer's GEMMs repeat in every layer)
        sa = self.arch.systolic_for(core)
        key = (cls, _op_shape(op), id(sa), self.resident, self.first_use, op.name in self.resident_ops)
        if key not in self._partitions:
            self._partitions[key] = self._cheapest_partition(op, core)
        return self._partitions[key]

    def _cheapest_partition(self, op: Op, core: int) -> str:
        """``auto``'s choice for ``op`` on ``core``'s array: the partition of the least estimated time."""
        sa = self.arch.systolic_for(core)
        kpe = sa.macs_per_pe_per_cycle.get(op.dtype, 1)
        e = op.elem_bytes
        bw = self.link_gbps  # bytes per ns == GB/s

        def comp(m, k, n):
            return _gemm_cycles(max(1, m), max(1, k), max(1, n), sa.rows, sa.cols, sa.dataflow, kpe,
                                sa.t_inj, sa.double_buffered_weights) / self.arch.clock_ghz

        t, (a, b) = self.t, self.grid
        m, k, n = op.m * op.batch, op.k, op.n
        # every partition streams 1/t of a streamed weight per core (tp_mn / tp_mnk then gather the rest
        # along the row); with few tokens the stream, not the array, bounds each core
        streamed = op.weight and not (self.resident and not self.first_use) and op.name not in self.resident_ops
        stream = op.weight_bytes / t / self._core_stream_gbps() if streamed else 0.0

        def pipe(stages: list[float], pieces: int) -> float:
            """``stages`` (the whole operand's time in each) run piece by piece through two buffers: a
            piece's first stage waits for the piece two back to leave the last one, so a piece takes
            the slowest stage's share or half the chain's, whichever is longer; the first fills it."""
            q = max(1, pieces)
            per = [x / q for x in stages]
            cycle = max(max(per), sum(per) / 2) if len(per) > 2 else max(per)  # two stages overlap fully
            return sum(per) + (q - 1) * cycle

        def tiles(k_c: int, n_c: int) -> int:  # the N tiles a core's streamed shard comes in
            return len(self._tile_widths(core, max(1, int(op.weight_bytes / t)), n_c)) if op.weight else 1

        def gathered(k_c: int) -> int:  # the N pieces a row's weight all-gather is cut into
            return self._gathered_tiles(k_c, n, op.weight_elem_bytes) if op.weight else 1

        cost = {  # the lowerings' own orders (_k_split_gemm, _grid_gemm, _n_split_gemm)
            # partial sums reduce-scattered tile by tile behind the next tile's GEMM
            "tp_k": pipe([stream, comp(m, math.ceil(k / t), n), (t - 1) / t * m * n * e / bw], tiles(k // t, n)),
            # each piece: shards streamed, all-gathered along the row, the GEMM
            "tp_mn": pipe([stream, (t - 1) / t * k * n * e / bw, comp(math.ceil(m / t), k, n)], gathered(k)),
            # the input gathered first, then the N shard streamed tile by tile
            "tp_n": (t - 1) / t * m * k * e / bw + pipe([stream, comp(m, k, math.ceil(n / t))], tiles(k, n // t)),
        }
        if a > 1 and b > 1:  # rows gather their K/a shards piece by piece, then columns all-reduce
            cost["tp_mnk"] = (pipe([stream, (b - 1) / b * (k / a) * n * e / bw, comp(math.ceil(m / b), math.ceil(k / a), n)],
                                   gathered(k // a))
                              + 2 * (a - 1) / a * (m / b) * n * e / bw)
        return min(cost, key=cost.get)

    def _core_stream_gbps(self) -> float:
        """A core's share of the HBM while every core of the mapping streams (GB/s), at most its DMA
        engines' port rate: the estimate's weight-stream rate (``auto``'s ranking only)."""
        from npusim.arch.derived import channel_bandwidths_gbps

        cores = len(self.region) if self.region else self.arch.num_cores
        dma = self.arch.cores.dma
        port = dma.engines * dma.port_bytes_per_cycle * self.arch.clock_ghz
        return min(port, float(channel_bandwidths_gbps(self.arch).sum()) / cores)

    def _weight_base(self, op: Op) -> int:
        if op.name not in self.weight_addr:
            self.weight_addr[op.name] = self.next_addr
            self.next_addr += -(-op.weight_bytes // 4096) * 4096
        return self.weight_addr[op.name]

    def _tile_widths(self, core: int, nbytes: int, n: int) -> list[int]:
        """N-widths of the tiles a weight shard of ``nbytes`` (``n`` output columns) streams in:
        about ``weight_tile_kb`` each, cut at multiples of the core's array width so no tile
        pays for a padded fold that the whole GEMM would not (a compiler aligns tiles too)."""
        cols = self.arch.systolic_for(core).cols
        units = max(1, -(-n // cols))
        count = min(units, max(1, -(-nbytes // self.tile_bytes)))
        widths = [cols * _split(units, count, i) for i in range(count)]
        widths[-1] -= cols * units - n  # the last tile holds the remainder
        return widths

    def _pieces(self, nbytes: int) -> list[tuple[int, int]]:
        """``(offset, bytes)`` of the DMA loads a first-use weight load is cut into (tiles of
        about ``weight_tile_kb``, alternating the DMA engines). They depend on nothing: a cold
        start loads the weights as early as the DMA queues allow, each GEMM waits for its own."""
        count = max(1, -(-int(nbytes) // self.tile_bytes))
        return [(nbytes * i // count, nbytes * (i + 1) // count - nbytes * i // count) for i in range(count)]

    def _next_engine(self, core: int) -> int:
        """DMA engines take a core's weight loads in turn, so two tiles stream at once."""
        i = self.dma_turn.get(core, 0)
        self.dma_turn[core] = i + 1
        return i % self.arch.cores.dma.engines

    def _compute_with_weights(self, core: int, rank: int, op: Op, shard_bytes: int, m: int, k: int, n: int,
                              deps: list[int], name: str, widths: list[int] | None = None) -> list[int]:
        """The GEMM ``m x k x n`` on ``core`` with its weight shard loaded first if it is not resident:
        tiled along N, load i waits for the GEMM two tiles back (two buffers). Returns each N tile's
        GEMM task. ``widths`` (summing to ``n``) fixes the tiles, also for resident weights (a
        K-split GEMM reduces its output tile by tile); by default resident weights run as one GEMM."""
        prog = self.prog
        deps = list(deps)
        if self.first_use and shard_bytes > 0 and op.weight and (core, op.name, 0) not in self.loaded:
            self.loaded.add((core, op.name, 0))
            base = self._weight_base(op) + rank * shard_bytes
            deps += [prog.add_dma(core, tb, address=base + off, dma_engine=self._next_engine(core),
                                  name=f"{name} first load W{i}")
                     for i, (off, tb) in enumerate(self._pieces(shard_bytes))]
        elif not (self.resident or shard_bytes <= 0 or not op.weight or op.name in self.resident_ops):
            return self._streamed_gemm(core, rank, op, shard_bytes, m, k, n, deps, name, widths)
        tasks, last = [], -1
        for i, n_i in enumerate(widths or [n]):
            last = prog.add_gemm(core, m, k, n_i, op.dtype, op.batch, deps=[last, *deps] if last >= 0 else deps,
                                 name=name if widths is None else f"{name} tile{i}")
            tasks.append(last)
        return tasks

    def _streamed_gemm(self, core: int, rank: int, op: Op, shard_bytes: int, m: int, k: int, n: int,
                       deps: list[int], name: str, widths: list[int] | None) -> list[int]:
        """The weight shard streamed from HBM in N tiles through two buffers (see above)."""
        prog = self.prog
        base = self._weight_base(op) + rank * shard_bytes
        buffers = self.buffers.setdefault(core, [])
        last = -1
        offset = 0
        tasks = []
        for i, n_i in enumerate(widths or self._tile_widths(core, shard_bytes, n)):
            tb = shard_bytes * (offset + n_i) // n - shard_bytes * offset // n
            load_deps = [buffers[-2]] if len(buffers) >= 2 else []
            load = prog.add_dma(core, tb, address=base + shard_bytes * offset // n, deps=load_deps,
                                dma_engine=self._next_engine(core), name=f"{name} load W{i}")
            offset += n_i
            last = prog.add_gemm(core, m, k, n_i, op.dtype, op.batch, deps=[load, last, *deps] if last >= 0 else
                                 [load, *deps], name=f"{name} tile{i}")
            tasks.append(last)
            buffers.append(last)
            del buffers[:-2]
        return tasks

    def _reshard(self, st: _GroupState, to: str, total_bytes: int, rows: int, heads: int, name: str) -> None:
        """Between the head split (``feat``: core ``i`` holds heads share ``i`` of every row) and the
        row split (``m``: core ``j`` holds rows share ``j`` of every head) of an activation of
        ``total_bytes``: an all-to-all in which each core sends each other core the block the
        other needs (what cores sharing L2 do by reading each other's output)."""
        t = self.t

        def shares(parts: int) -> list[float]:
            return [_split(parts, t, i) / parts for i in range(t)]
        own = shares(heads if st.layout == "feat" else rows)
        need = shares(rows if to == "m" else heads)
        sizes = [[0 if i == j else int(total_bytes * own[i] * need[j]) for j in range(t)] for i in range(t)]
        coll = alltoallv(self.prog, st.cores, sizes, ready=[[r] for r in st.ready], name=f"{name} reshard")
        st.set(to, [coll.done[c] for c in st.cores])

    def _head_batched_gemm(self, st: _GroupState, op: Op, name: str) -> None:
        """A GEMM batched over heads with a weight per head (MLA's absorbed ``uk``/``uv``): the
        heads are split over the cores, each core computing its heads for every token with only
        its heads' weights (as an attention kernel splits heads); no partial sums to reduce. The
        input is made head-split first (an all-to-all from a row split, nothing from ``rep`` or
        ``feat``); the output is head-split (``feat``)."""
        t = self.t
        self.decisions[op.name] = "tp_heads"
        if st.layout == "m":
            self._reshard(st, "feat", int(op.m * op.batch * op.k * op.elem_bytes), op.m, op.batch, name)
        elif st.layout == "mb":
            self._to_rep(st, int(op.m * op.batch * op.k * op.elem_bytes), name + " gather")
        self._weight_base(op)  # the whole op's weights get their address range
        outs = []
        for i, c in enumerate(st.cores):
            heads = _split(op.batch, t, i)
            if heads <= 0:
                outs.append(st.ready[i])
                continue
            share = replace(op, batch=heads)
            shard = int(op.weight_bytes * heads / op.batch) if op.weight else 0
            outs.append(self._compute_with_weights(c, i, share, shard, op.m, op.k, op.n, [st.ready[i]], name)[-1])
        st.set("feat", outs)

    def _gemm(self, st: _GroupState, op: Op, name: str) -> None:
        if gemm_kernel.runs_kernel(self.arch, op.dtype):
            self._kernel_gemm(st, op, name)
            return
        if op.weight_batched and op.batch >= self.t > 1:
            self._head_batched_gemm(st, op, name)
            return
        part = self._partition(op, st.cores[0])
        self.decisions[op.name] = part
        if part == "tp_n":
            self._n_split_gemm(st, op, name)
            return
        t = self.t
        a, b = {"tp_k": (t, 1), "tp_mn": (1, t), "tp_mnk": self.grid}.get(part, (0, 0))
        if a == 0:
            raise ConfigError(f"unknown partition {part!r} for {op.name}")
        needs_rows = b > 1
        # the input must be replicated, or already split the way this GEMM wants it
        ok = st.layout == "rep" or (st.layout == "feat" and a == t and b == 1) or \
            (st.layout == "m" and a == 1 and b == t) or (st.layout == "mb" and (a, b) == self.grid)
        if not ok:
            self._to_rep(st, int(op.m * op.batch * op.k * op.elem_bytes), name + " gather")
        self._grid_gemm(st, op, a, b, name)
        st.layout = "feat" if not needs_rows else ("m" if a == 1 else "mb")
        if t == 1:
            st.layout = "rep"

    def _kernel_gemm(self, st: _GroupState, op: Op, name: str) -> None:
        """The die's own GEMM kernel (an arch with ``kernel.base_blocks`` for the op's dtype): the
        plan and tasks of :mod:`npusim.mapping.gemm_kernel`, as ``ChipCost.gemm`` times the op
        alone, on the group's cores -- A read from HBM (or the L2), B (the weight) from HBM, C
        written to HBM; every working core starts once every core of the group is done with the
        op before (a kernel follows the one before it on the stream), and the next op waits for
        every core's last write. Where the operands sit: without ``l2_addressed`` each DMA takes
        the next address from the op's weight address and the L2's hits are the reuse model's;
        with it B is read at the weight's address (a GEMM without weights: after its A) and A and
        C sit in two activation areas from a quarter of HBM, taken in turn: a GEMM reads A where
        the kernel GEMM before it wrote C (the activation it produced, through the ops between,
        which the mapper keeps in SRAM), so the TLM L2 serves what that write left in it.
        C is in HBM, which every core reads: no all-gather converts the next GEMM's input. The
        layout recorded for the ops after it (vector ops, attention, which keep the mapper's
        SRAM-resident activations) is the one the spec's partition gives its output."""
        m, k, n, batch = gemm_kernel.gemm_dims(op)
        kernel = gemm_kernel.kernel_name(self.arch, None)
        key = (op.dtype, tuple(st.cores), kernel)
        planner = self.gemm_planners.get(key)
        if planner is None:
            planner = self.gemm_planners[key] = gemm_kernel.Planner(
                self.arch, st.cores, op.dtype, gemm_kernel.default_out_dtype(op.dtype), 1.0, None, kernel)
        plan = planner.base_plan(m, k, n, batch, len(st.cores))
        ready = sorted({d for d in st.ready if d >= 0})
        deps = [self.prog.add_barrier(ready, f"{name} waits")] if len(ready) > 1 else ready
        base = self._weight_base(op) if op.weight else self.next_addr
        bases = None
        if self.l2_addressed:
            capacity = int(self.arch.hbm.capacity_gb * 2**30)
            area = [capacity // 4, capacity // 4 + capacity // 8]  # weights below, KV caches from half
            a_at, c_at = area[self.act_turn], area[1 - self.act_turn]
            b_at = base if op.weight else a_at + -(-int(batch * m * k * planner.e) // MB) * MB
            bases = (a_at, b_at, c_at)
        self.act_turn = 1 - self.act_turn
        done = gemm_kernel.emit_gemm(self.prog, planner, plan, m, k, n, batch, st.cores,
                                     addressed=self.l2_addressed, deps=deps, address=base, bases=bases,
                                     tag=f"{name} ")
        self.l2_read_bytes += done.l2_bytes
        end = self.prog.add_barrier(done.ends, f"{name} done") if len(done.ends) > 1 else done.ends[0]
        if op.weight_batched and op.batch >= self.t > 1:
            layout = "feat"  # as _head_batched_gemm leaves it
        else:
            layout = {"tp_k": "feat", "tp_n": "feat", "tp_mn": "m", "tp_mnk": "mb"}[self._partition(op, st.cores[0])]
        self.decisions[op.name] = f"{plan.kernel} kernel"
        st.set(layout if self.t > 1 else "rep", [end] * len(st.cores))

    def _grid_gemm(self, st: _GroupState, op: Op, a: int, b: int, name: str) -> None:
        """The GEMM on an ``a x b`` grid of the group (row-major over its ring order): core
        ``(i, j)`` holds a ``K/a x N/b`` weight shard; the shards are all-gathered along each
        row (``b > 1``) N-piece by N-piece, each core computes ``M/b x K/a x N``, and partial
        sums are all-reduced along each column (``a > 1``). ``tp_k`` is ``t x 1`` (its partial
        sums reduce-scattered N tile by N tile, see :meth:`_k_split_gemm`), ``tp_mn`` ``1 x t``.
        Weight pieces use two buffers: piece ``p`` is fetched once the GEMM of piece ``p - 2``
        has finished with its buffer."""
        if b == 1:
            self._k_split_gemm(st, op, a, name)
            return
        prog = self.prog
        m, k, n = op.m, op.k, op.n
        e = op.elem_bytes
        grid = [[st.cores[i * b + j] for j in range(b)] for i in range(a)]
        partial = list(st.ready)
        for i in range(a):
            row = grid[i]
            k_i = _split(k, a, i)
            frac_k = k_i / k
            pieces = self._gathered_tiles(k_i, n, op.weight_elem_bytes) if op.weight else 1
            outs = [st.ready[i * b + j] for j in range(b)]
            history: list[list[int]] = []
            for p in range(pieces):
                n_p = _split(n, pieces, p)
                gathered = [st.ready[i * b + j] for j in range(b)]
                key = (op.name, tuple(row), p)
                if op.weight and key in self.kept:  # gathered by an earlier micro-batch, still in SRAM
                    gathered = self.kept[key]
                elif op.weight:
                    free = history[-2] if len(history) >= 2 else [-1] * b
                    loads = []
                    for j, c in enumerate(row):
                        shard = int(op.weight_bytes * frac_k * _split(n_p, b, j) / n)
                        if self.first_use and shard and (c, op.name, p) not in self.loaded:
                            self.loaded.add((c, op.name, p))
                            base = self._weight_base(op) + int(op.weight_bytes * (i / a + p / (a * pieces))) + j * shard
                            loads.append(prog.add_barrier(
                                [free[j]] + [prog.add_dma(c, tb, address=base + off, dma_engine=self._next_engine(c),
                                                          name=f"{name} first load W{p}")
                                             for off, tb in self._pieces(shard)], name=f"{name} W{p} loaded"))
                        elif self.resident or shard == 0 or op.name in self.resident_ops:
                            loads.append(free[j])
                        else:
                            base = self._weight_base(op) + int(op.weight_bytes * (i / a + p / (a * pieces))) + j * shard
                            loads.append(prog.add_dma(c, shard, address=base, deps=[free[j]],
                                                      dma_engine=self._next_engine(c), name=f"{name} load W{p}"))
                    coll = ring_allgather(prog, row, int(op.weight_bytes * frac_k * n_p / n), deps=loads, dtype=op.dtype)
                    gathered = [coll.done[c] for c in row]
                    if self.keep_gathered:
                        self.kept[key] = gathered
                for j, c in enumerate(row):
                    outs[j] = prog.add_gemm(c, _split(m, b, j), k_i, n_p, op.dtype, op.batch,
                                            deps=[gathered[j], st.ready[i * b + j], outs[j]], name=f"{name} n{p}")
                history.append(list(outs))
            for j in range(b):
                partial[i * b + j] = outs[j]
        done = list(partial)
        if a > 1:
            for j in range(b):
                col = [grid[i][j] for i in range(a)]
                coll = ring_allreduce(prog, col, int(_split(m, b, j) * op.batch * n * e),
                                      deps=[partial[i * b + j] for i in range(a)], dtype=op.dtype)
                for i in range(a):
                    done[i * b + j] = coll.done[col[i]]
        st.ready = done

    def _n_split_gemm(self, st: _GroupState, op: Op, name: str) -> None:
        """``tp_n``: every core computes all ``M`` rows against its ``K x N/t`` weight shard (its
        own, streamed or resident: no weight moves between cores); the input replicated first."""
        if self.t > 1:
            self._to_rep(st, int(op.m * op.batch * op.k * op.elem_bytes), name + " gather")
        outs = []
        for i, c in enumerate(st.cores):
            n_i = _split(op.n, self.t, i)
            if n_i <= 0:
                outs.append(st.ready[i])
                continue
            shard = int(op.weight_bytes * n_i / op.n) if op.weight else 0
            outs.append(self._compute_with_weights(c, i, op, shard, op.m, op.k, n_i, [st.ready[i]], name)[-1])
        st.set("feat" if self.t > 1 else "rep", outs)

    def _k_split_gemm(self, st: _GroupState, op: Op, a: int, name: str) -> None:
        """``tp_k`` (or one core): core ``i`` computes ``M x K/a x N`` with its own weight shard
        (streamed in tiles or resident); with ``a > 1`` the partial sums are reduce-scattered N
        tile by N tile (the tiles weights stream in, or as large for resident weights), each
        tile's reduction overlapping the next tile's GEMM, so each core ends with its N/a output
        features summed over the group."""
        prog = self.prog
        m, k, n = op.m, op.k, op.n
        widths = self._tile_widths(st.cores[0], max(1, int(op.weight_bytes / a)) if op.weight else 1, n) \
            if a > 1 else None
        tiles = []
        for i, c in enumerate(st.cores[:a]):
            k_i = _split(k, a, i)
            shard = int(op.weight_bytes * k_i / k) if op.weight else 0
            tiles.append(self._compute_with_weights(c, i, op, shard, m, k_i, n, [st.ready[i]], name, widths))
        if a == 1:
            st.ready = [tiles[0][-1]]
            return
        ends: list[list[int]] = [[] for _ in range(a)]
        for p, n_p in enumerate(widths):
            coll = ring_reduce_scatter(prog, st.cores, int(m * op.batch * n_p * op.elem_bytes),
                                       deps=[tiles[i][p] for i in range(a)], dtype=op.dtype)
            for i, c in enumerate(st.cores):
                ends[i].append(coll.done[c])
        st.ready = [prog.add_barrier(x, f"{name} reduced") if len(x) > 1 else x[0] for x in ends]

    def _gathered_tiles(self, k: int, n: int, e: float) -> int:
        """How many N-pieces a weight all-gather is cut into so a gathered piece takes at most
        an eighth of a core's SRAM."""
        return max(1, math.ceil(k * n * e / (self.sram_bytes / 8)))

    # -- attention, MoE, embedding ------------------------------------------------------------------
    def _kv_address(self, core: int, op: Op, offset: float = 0) -> int:
        """HBM address of ``offset`` bytes into ``core``'s KV area of ``op``'s layer."""
        area = self.kv_layers.get(op.layer, 0) * self.kv_layer_stride
        return self.kv_base[core] + area + int(offset) % max(1, self.kv_layer_stride)

    def _attention(self, st: _GroupState, op: Op, name: str) -> None:
        t, prog = self.t, self.prog
        vd = op.v_head_dim or op.head_dim
        pairs_per_seq = op.attended_pairs / max(1, op.batch)
        keys = max(1, int(round(pairs_per_seq / max(1, op.q_len))))  # mean keys per query
        # MLA decode (the cached KV dominates): split the KV over the cores, whatever the batch
        mla_decode = op.variant == "mla" and t > 1 and op.kv_len > 4 * op.q_len
        if st.layout == "feat" and mla_decode:  # head-split queries (the absorbed q): each core its sequences'
            self._reshard(st, "m", op.activation_in_bytes, op.batch * op.q_len, op.heads, name)
        elif st.layout == "mb" or (op.variant == "mla" and st.layout == "feat" and t > 1 and op.batch >= t):
            self._to_rep(st, op.activation_in_bytes, name + " gather")
        # MLA's one latent KV "head" is shared by all query heads: split by heads, every core would
        # read every sequence's whole cache; decode splits whole sequences instead
        mla_by_sequence = op.variant == "mla" and st.layout in ("rep", "m") and t > 1 and (op.batch >= t or mla_decode)
        head_parallel = (st.layout in ("rep", "feat") or t == 1) and not mla_by_sequence
        if not head_parallel and op.q_len > 1 and t > 1 and not mla_by_sequence:
            # token-parallel prefill: every core needs every key and value
            kv_bytes = int(op.batch * op.q_len * op.kv_bytes_per_token)
            coll = ring_allgather(prog, st.cores, kv_bytes, deps=st.ready, dtype=op.dtype)
            st.ready = [coll.done[c] for c in st.cores]
        if op.variant != "mla":  # standard attention: the FlashAttention kernel on each core's share
            self._flash_attention(st, op, name, token_parallel=not head_parallel)
            return
        # decode with fewer KV heads than cores: (sequence, KV head) units over the cores, each unit's
        # query heads the rows of one GEMM and its KV read once, as grouped-query decode kernels do
        # (split by query heads, every core of a KV head's group would read that head's whole cache)
        gqa_units = (head_parallel and op.variant != "mla" and t > 1 and op.kv_heads < t
                     and op.kv_len > 4 * op.q_len and op.heads % op.kv_heads == 0)
        # cores that read the same KV head (head-parallel with fewer KV heads than cores, MLA's one
        # latent head included): with an L2 all but one of them hit there
        sharers = t // max(1, op.kv_heads) if head_parallel and not gqa_units and t > op.kv_heads else 1
        l2 = self._kv_l2(op, sharers)

        def share_of(i: int) -> tuple[int, int, int, float]:
            """Core ``i``'s ``(seqs, q_len, heads, kv bytes per token)`` outside the split-KV decode."""
            if gqa_units:  # "seqs" counts units here, "heads" the query heads of one unit
                return (_split(op.batch * op.kv_heads, t, i), op.q_len, op.heads // op.kv_heads,
                        op.kv_bytes_per_token / op.kv_heads)
            if head_parallel:
                return (op.batch, op.q_len, _split(op.heads, t, i),
                        op.kv_bytes_per_token * max(1, _split(op.kv_heads, t, i)) / max(1, op.kv_heads))
            if op.batch >= t or op.q_len == 1:  # token-parallel by whole sequences
                return _split(op.batch, t, i), op.q_len, op.heads, op.kv_bytes_per_token
            # token-parallel inside a sequence: a slice of its queries against all keys, each core
            # reading its share of a prefix
            return 1, _split(op.batch * op.q_len, t, i), op.heads, op.kv_bytes_per_token / t

        split_kv = mla_by_sequence and mla_decode
        shares = [None if split_kv else share_of(i) for i in range(len(st.cores))]
        # a paged cache whose table width the op states: the incremental kernel's own split
        # (fa.paged_split), each core its (sequence, piece) units' keys; idle cores do nothing
        paged = self._mla_paged_units(op, t) if split_kv and op.kv_table_keys > 0 else None
        # the attention kernel is a MIX kernel: each working core's AIC and AIVs first pay its extra
        # start and their prologues (attention_prologue_cycles; the split-KV decode gives every core work)
        used = (sum(1 for u in paged if u) if paged is not None else len(st.cores)) if split_kv \
            else sum(1 for x in shares if min(x[:3]) > 0)
        prologue = attention_prologue_cycles(self.arch, used, len(st.cores))
        outs = []
        for i, c in enumerate(st.cores):
            if paged is not None and not paged[i]:
                outs.append(self._mla_paged_core(c, op, i, [], op.kv_bytes_per_token, [st.ready[i]], name,
                                                 write_deps=[st.ready[i]]))
                continue
            if split_kv or min(shares[i][:3]) > 0:
                head = [st.ready[i]]
                if prologue[0] > 0:  # before the AIC's first load
                    head = [prog.add_compute(c, "cube", prologue[0], deps=head, name=f"{name} AIC start")]
                if prologue[1] > 0:  # the AIVs' on their pipe (in order before the softmax)
                    prog.add_compute(c, "vector", prologue[1], deps=[st.ready[i]], name=f"{name} AIV start")
            if paged is not None:
                outs.append(self._mla_paged_core(c, op, i, paged[i], op.kv_bytes_per_token, head, name,
                                                 write_deps=[st.ready[i]]))
                continue
            if split_kv:
                outs.append(self._mla_split_kv(c, op, i, keys, op.kv_bytes_per_token, head, name,
                                               write_deps=[st.ready[i]]))
                continue
            seqs, q_len, heads, kv_share = shares[i]
            if seqs <= 0 or heads <= 0 or q_len <= 0:
                outs.append(prog.add_barrier([st.ready[i]], name))
                continue
            deps = list(head)
            cache = int(seqs * (op.kv_len - op.q_len) * kv_share * self.kv_hbm_fraction)
            if cache > 0 and self.l2_addressed and sharers > 1:
                # the TLM L2 decides: the cores sharing a KV head read it whole from one place
                home = st.cores[min(i // sharers * sharers, len(st.cores) - 1)]
                deps.append(prog.add_dma(c, cache, address=self._kv_address(home, op), deps=head,
                                         name=f"{name} read KV"))
            elif cache > 0:
                hit = int(cache * (1 - 1 / sharers)) if l2 else 0
                if cache - hit > 0:
                    deps.append(prog.add_dma(c, cache - hit, address=self._kv_address(c, op), deps=head,
                                             name=f"{name} read KV"))
                if hit > 0:
                    cycles = math.ceil(hit / l2[0]) + l2[1]
                    deps.append(prog.add_compute(c, f"dma{min(1, self.arch.cores.dma.engines - 1)}", cycles,
                                                 deps=head, name=f"{name} read KV L2"))
                    self.l2_read_bytes += hit
            # MLA: every head of a sequence attends the same latent keys, so the heads are the rows of
            # one GEMM per sequence (grouped-query units: per unit); otherwise one GEMM per (sequence, head)
            rows, products = (q_len * heads, seqs) if op.variant == "mla" or gqa_units else (q_len, seqs * heads)
            scores = prog.add_gemm(c, rows, op.head_dim, keys, op.dtype, products, deps=deps, name=f"{name} QK")
            elements = seqs * heads * q_len * keys
            soft = prog.add_vector(c, "softmax", elements, op.dtype, name=f"{name} softmax", row_len=keys,
                                   deps=[self._exchange(c, op, elements * SCORE_BYTES, [scores], f"{name} scores")])
            out = prog.add_gemm(c, rows, keys, vd, op.dtype, products, name=f"{name} PV",
                                deps=[self._exchange(c, op, elements * DTYPE_BYTES[op.dtype], [soft], f"{name} P")])
            if self.kv_in_hbm and self.kv_hbm_fraction >= 1:
                # the new keys/values land after the cached ones
                prog.add_dma(c, int(seqs * q_len * kv_share),
                             address=self._kv_address(c, op, seqs * (op.kv_len - op.q_len) * kv_share), write=True,
                             dma_engine=min(1, self.arch.cores.dma.engines - 1), deps=[st.ready[i]],
                             name=f"{name} write KV")
            outs.append(out)
        st.set("feat" if head_parallel and t > 1 else "m" if mla_by_sequence else st.layout, outs)

    def _flash_attention(self, st: _GroupState, op: Op, name: str, token_parallel: bool = False) -> None:
        """:meth:`_lower_flash_attention`, recorded once per shape (:meth:`Program.recorded` with a
        :class:`~npusim.sim.program.Relocation`): the same attention of another layer, another
        group of as many cores or another attention group of the batch replays it, its tasks
        moved to the group's cores, its names to ``name`` and its DMAs to the layer's KV area
        (every DMA of the lowering is at :meth:`_kv_address` of its own core). The key holds
        everything else the lowering reads: the op's shape, the chip, the TP degree, where the KV
        cache is, the group's size and layout, ``token_parallel``; the replay also adds the L2
        reads the lowering counted. Task for task what the lowering records
        (``tests/test_program_digests.py``), 36x fewer lowerings for Qwen3-4B's 36 layers."""
        key = ("flash attention", self._arch_key(), self.t, self.kv_hbm_fraction, self.kv_in_hbm, self.l2_addressed,
               self.kv_layer_stride, _op_shape(op), st.layout, token_parallel)
        where = Relocation(tuple(st.cores), name, tuple(self._kv_address(c, op) for c in st.cores))
        l2_before = self.l2_read_bytes
        built = []

        def build():
            built.append(True)
            self._lower_flash_attention(st, op, name, token_parallel)
            return list(st.ready), (st.layout, self.l2_read_bytes - l2_before)

        outs, (layout, l2_bytes) = self.prog.recorded(key, st.ready, build, relocate=where)
        if not built:
            st.set(layout, outs)
            self.l2_read_bytes += l2_bytes

    def _lower_flash_attention(self, st: _GroupState, op: Op, name: str, token_parallel: bool = False) -> None:
        """Standard (MHA/GQA/MQA) attention as the FlashAttention kernel runs it
        (:mod:`npusim.mapping.flash_attention`): (sequence, head, query block) units -- decode:
        (sequence, KV head) units with the group's query heads as rows, their KV split over idle
        cores -- spread evenly over the group's cores, each core streaming its units' KV blocks
        through a software pipeline. Per KV block on a core:

        * the cube's side (engine ``dma0``, the AIC's loads and fix-pipe writes): the K and V
          block loaded (from HBM the first time a byte is read on the chip, re-reads from the L2
          when the op's distinct KV fits it), ``S = Q K^T`` written out in fp32, ``P`` read back,
          ``P V`` written out in fp32 once per logical tile
          (:func:`~npusim.mapping.flash_attention.tiles_per_block`: it accumulates in L0C over a
          tile's blocks);
        * the vector side (engine ``dma1``, the AIVs' loads and stores): ``S`` read, ``P`` written,
          ``P V`` read (once per logical tile);
        * the cube: ``QK^T`` and ``PV``; the vector unit: the online-softmax step (the ``softmax``
          class over the block) and, once per logical tile, the rescale-and-accumulate of the
          output (2 element-wise ops per output element).

        Each working core first pays the MIX kernel's extra start (:func:`attention_mix_start_us`)
        and its prologues (the arch's ``kernel`` section: ``cube_setup_us`` on the cube before its
        first load, ``vector_setup_us`` on the vector unit; :func:`attention_prologue_cycles`); the
        kernel's device-side start is its caller's, e.g. ``ChipCost``'s once per op.
        The step's new keys/values are written after the pipeline by tokens over every core of
        the group (the cache-write kernel's split), whatever split the attention's units took.

        On a decoupled core (``cores.cube_vector_exchange: global_memory``: the Ascend presets'
        AIC/AIV) every hand-off crosses global memory (the L2): each side's transfers run at the
        L2's per-core rate, the two sides sharing the core's even part of the L2's aggregate
        bandwidth (over the cores the op uses) in proportion to their bytes; without an L2, the
        hand-offs are HBM writes and reads. On a ``local`` core the hand-offs are free and only KV
        read from HBM moves (keys/values of the step itself and KV held in SRAM are on chip).
        Pipelining: steps of KV blocks (:func:`~npusim.mapping.flash_attention.ramp_steps`),
        the next :data:`FA_PRELOAD` steps' ``QK^T`` and softmax issued before a step's ``PV`` (the
        kernel's QK preload, ``qkPreloadNum``; its buffers are not bounded further), the scores
        and probabilities of earlier steps moved around a step's ``PV`` so that no in-order queue
        (cube, vector, the two sides' engines) waits on the unit it feeds; K/V read from HBM are
        split over the core's DMA engines (as the GEMM kernel's loads). The combine of a
        split KV: each core writes its partial outputs, and after all cores the (sequence, head
        group) pieces are merged, spread over the cores (read the pieces, 2 element-wise ops per
        element). Output: the group's layout becomes ``feat`` (split by heads) as before -- with
        query blocks or KV pieces of a head on several cores, moving the output to a clean head
        split is not charged. ``token_parallel`` (the activation split by tokens, layout ``m``):
        each core runs the kernel on its own queries -- whole sequences when there are at least as
        many as cores or one query each, else a slice of one sequence's queries -- against all
        keys (the caller all-gathered the step's K/V over the NoC first), and the layout stays."""
        t, prog, arch = self.t, self.prog, self.arch
        vd = op.v_head_dim or op.head_dim
        e = DTYPE_BYTES[op.dtype]
        keys_per_query = op.attended_pairs / max(1, op.batch * op.q_len)
        if token_parallel:  # each core its own queries, all heads (see the docstring)
            p = None
            plans, units_of = [], []
            for i in range(len(st.cores)):
                whole = op.batch >= t or op.q_len == 1
                seqs, q = (_split(op.batch, t, i), op.q_len) if whole else (1, _split(op.batch * op.q_len, t, i))
                pl = fa.plan(seqs, op.heads, op.kv_heads, q, keys_per_query, 1)
                plans.append(pl)
                units_of.append(pl.units if seqs > 0 and q > 0 else 0)
        else:
            p = fa.plan(op.batch, op.heads, op.kv_heads, op.q_len, keys_per_query, t)
            plans = [p] * len(st.cores)
            units_of = [p.per_core[i] if i < len(p.per_core) else 0 for i in range(len(st.cores))]
        ref = next((pl for pl, u in zip(plans, units_of) if u > 0), plans[0])
        decoupled = arch.cores.cube_vector_exchange != "local"
        kv_head_bytes = (op.head_dim + vd) * e  # K and V of one key position of one KV head
        frac = self.kv_hbm_fraction or 0.0
        # distinct KV in global memory: the cached part (its HBM share) and, on a decoupled core
        # that stages everything through global memory, the step's own keys/values
        cached = max(0, op.kv_len - op.q_len)
        resident_tokens = cached * frac + (op.q_len if decoupled else 0)
        resident_share = min(1.0, resident_tokens / max(1, op.kv_len))
        distinct = op.batch * op.kv_heads * resident_tokens * kv_head_bytes
        block_kv = fa.KV_BLOCK * kv_head_bytes  # one streamed block's K and V
        reads = sum(u * pl.blocks_per_unit for pl, u in zip(plans, units_of)) * block_kv * resident_share
        l2 = arch.l2
        fits = l2 is not None and distinct <= l2_model.capacity_bytes(l2)
        hbm_share = (min(1.0, distinct / reads) if fits else 1.0) if reads > 0 else 0.0
        if self.l2_addressed:  # the TLM L2 decides: every global KV read is a DMA at its block's address
            hbm_share = 1.0 if reads > 0 else 0.0
        kv_blocks = math.ceil(op.kv_len / fa.KV_BLOCK)
        group = op.heads // op.kv_heads if op.kv_heads and op.heads % op.kv_heads == 0 else 1

        def kv_at(i: int, unit: int, block: int, pl) -> float:
            """Offset of the K/V block that core ``i``'s ``unit`` (its index among the core's) streams
            as its ``block``-th: the same (sequence, KV head, block) is at the same place for every
            core (the TLM L2 then serves the sharers' re-reads)."""
            whole = op.batch >= t or op.q_len == 1
            if token_parallel:
                u, nseq = unit, (_split(op.batch, t, i) if whole else 1)
                seq0 = sum(_split(op.batch, t, k) for k in range(i)) if whole else 0
            else:
                u, nseq, seq0 = sum(units_of[:i]) + unit, op.batch, 0
            if pl.decode:
                g, chunk = divmod(u, pl.kv_chunks)
                seq, hk = divmod(g, max(1, op.heads // pl.packed_heads))
                kvh, first_block = (hk if pl.packed_heads > 1 else hk // group), chunk * pl.blocks_per_unit
            else:
                qb = max(1, pl.units // max(1, nseq * op.heads))
                seq, rest = divmod(u, op.heads * qb)
                kvh, first_block = (rest // qb) // group, 0
            kvh = min(op.kv_heads - 1, kvh)
            return (((seq0 + seq) * op.kv_heads + kvh) * kv_blocks + first_block + block) * block_kv

        # per block: bytes each side moves through global memory besides the KV (P V: once per logical tile)
        s_bytes, p_bytes = ref.rows * ref.kv_block * SCORE_BYTES, ref.rows * ref.kv_block * e
        o_bytes = ref.rows * vd * 4 * fa.tiles_per_block(ref.blocks_per_unit)
        used = max(1, sum(1 for u in units_of if u > 0))
        clock = arch.clock_ghz
        engines = arch.cores.dma.engines
        if l2 is not None:  # both sides' L2 traffic (a local core: only its KV re-reads)
            hand = (s_bytes + p_bytes + o_bytes) if decoupled else 0
            cube_side = block_kv * resident_share * (1 - hbm_share) + hand
            vec_side = hand
            port = arch.cores.dma.bytes_per_cycle
            if decoupled:  # the two sides share the core's part of the L2 by their bytes
                total = cube_side + vec_side
                rates = (l2_model.core_rate(l2, clock, used, port, cube_side / total),
                         l2_model.core_rate(l2, clock, used, port, vec_side / total))
            else:  # a local core's KV re-reads, split over its engines
                rates = (l2_model.core_rate(l2, clock, used, port, 1 / max(1, min(2, engines))),) * 2
            latency = l2_model.hit_latency_cycles(l2, clock)
        else:
            rates, latency = None, 0
        side = (0, min(1, engines - 1))  # the cube's and the vector's engine

        def move(c: int, which: int, nbytes: float, deps: list[int], what: str, from_hbm: bool = False,
                 offset: float = 0.0, write: bool = False, kv: bool = False) -> int:
            """``nbytes`` through global memory on side ``which`` (0 cube, 1 vector); ``kv``: K/V
            re-read from the L2 (also on a local core)."""
            nbytes = int(nbytes)
            if nbytes <= 0 or (not decoupled and not from_hbm and not kv):
                return deps[0] if len(deps) == 1 else prog.add_barrier(deps, f"{name} {what}")
            if from_hbm or rates is None:
                return prog.add_dma(c, nbytes, address=self._kv_address(c, op, offset), write=write, deps=deps,
                                    dma_engine=side[which], name=f"{name} {what}")
            if not write:
                self.l2_read_bytes += nbytes
            return prog.add_compute(c, f"dma{side[which]}", math.ceil(nbytes / rates[which]) + latency, deps=deps,
                                    name=f"{name} {what} L2")

        # each working core's prologue of the mix kernel: the AIC's and the AIVs' (the arch's kernel
        # section, calibrated on GEMM and vector kernels; the kernel's start is its caller's), each
        # behind the MIX kernel's extra start on the cores the kernel launches (attention_mix_start_us)
        prologue = attention_prologue_cycles(arch, used, len(st.cores))
        outs = []
        first = 0
        for i, c in enumerate(st.cores):
            units, p_c = units_of[i], plans[i]
            s_bytes, p_bytes = p_c.rows * p_c.kv_block * SCORE_BYTES, p_c.rows * p_c.kv_block * e
            tiles = fa.tiles_per_block(p_c.blocks_per_unit)  # P V stored and rescaled once per logical tile
            o_bytes, o_full = p_c.rows * vd * 4 * tiles, p_c.rows * vd * 4
            deps0 = [st.ready[i]]
            if units <= 0:
                outs.append(prog.add_barrier(deps0, name))
                continue
            if prologue[0] > 0:  # the MIX start + AIC prologue before its first load, the AIVs' on their pipe
                deps0 = [prog.add_compute(c, "cube", prologue[0], deps=deps0, name=f"{name} AIC start")]
            if prologue[1] > 0:
                prog.add_compute(c, "vector", prologue[1], deps=[st.ready[i]], name=f"{name} AIV start")
            steps = fa.ramp_steps(units * p_c.blocks_per_unit)
            kv_of: dict[int, int] = {}  # step -> its K/V loaded
            qk_of: dict[int, int] = {}  # step -> its QK^T
            soft_of: dict[int, int] = {}  # step -> its softmax
            p_of: dict[int, int] = {}  # step -> its P written out
            acc = -1
            n = len(steps)
            for s in range(-FA_PRELOAD, n):
                # issue order = each in-order queue's order, as the kernel's software pipeline: the
                # QK^T of step s + PRELOAD, the scores of s + PRELOAD - 1 and the probabilities of
                # s + PRELOAD - 2 go out around step s's PV, so no engine waits on the unit it feeds
                if s >= 0:
                    p_in = move(c, 0, steps[s] * p_bytes, [p_of[s]], "P in")
                    pv = prog.add_gemm(c, p_c.rows, p_c.kv_block, vd, op.dtype, steps[s], deps=[p_in, kv_of[s]],
                                       name=f"{name} PV")
                j = s + FA_PRELOAD
                if 0 <= j < n:  # K/V of step j: HBM reads split over the core's engines, L2 re-reads
                    kv_bytes = steps[j] * block_kv * resident_share
                    hbm = kv_bytes * hbm_share
                    loads = []
                    if hbm >= 1:
                        b0 = sum(steps[:j])
                        at = kv_at(i, b0 // p_c.blocks_per_unit, b0 % p_c.blocks_per_unit, p_c)
                        parts = engines if hbm >= 2 * 4096 else 1
                        for k in range(parts):
                            loads.append(move(c, k, hbm / parts, deps0, "read KV", from_hbm=True,
                                              offset=at + k * hbm / parts))
                    if kv_bytes - hbm >= 1:  # a local core's engines carry nothing else: both take part
                        parts = 1 if decoupled or kv_bytes - hbm < 2 * 4096 else engines
                        for k in range(parts):
                            loads.append(move(c, k, (kv_bytes - hbm) / parts, deps0, "read KV", kv=True))
                    kv_of[j] = loads[0] if len(loads) == 1 else prog.add_barrier(loads or deps0, f"{name} KV")
                    qk_of[j] = prog.add_gemm(c, p_c.rows, op.head_dim, p_c.kv_block, op.dtype, steps[j],
                                             deps=[kv_of[j]], name=f"{name} QK")
                if s >= 0:
                    pv_out = move(c, 0, steps[s] * o_bytes, [pv], "PV out", write=True)
                j = s + FA_PRELOAD - 1
                s_out = move(c, 0, steps[j] * s_bytes, [qk_of[j]], "S out", write=True) if 0 <= j < n else -1
                if s >= 0:
                    o_in = move(c, 1, steps[s] * o_bytes, [pv_out], "PV in")
                    acc = prog.add_vector(c, "elementwise", math.ceil(2 * steps[s] * tiles * p_c.rows * vd), op.dtype,
                                          deps=[o_in] + ([acc] if acc >= 0 else []), name=f"{name} rescale")
                if 0 <= j < n:
                    s_in = move(c, 1, steps[j] * s_bytes, [s_out], "S in")
                    soft_of[j] = prog.add_vector(c, "softmax", steps[j] * p_c.rows * p_c.kv_block, op.dtype, deps=[s_in],
                                                 name=f"{name} softmax", row_len=p_c.kv_block)
                j = s + FA_PRELOAD - 2
                if 0 <= j < n:
                    p_of[j] = move(c, 1, steps[j] * p_bytes, [soft_of[j]], "P out", write=True)
            # divide by the row sums; a split KV's partial output (and its row statistics) goes out
            done = prog.add_vector(c, "elementwise", units * p_c.rows * vd, op.dtype, deps=[acc], name=f"{name} normalise")
            if p_c.kv_chunks > 1:
                done = move(c, 1, units * (o_full + 8 * p_c.rows), [done], "partial out", write=True)
            outs.append(done)
            first += units * p_c.blocks_per_unit
        if p is not None and p.kv_chunks > 1:  # merge the pieces of each (sequence, head group), spread over the cores
            everyone = prog.add_barrier(outs, f"{name} pieces")
            outs = []
            merge = fa.spread(p.groups, len(st.cores))
            for i, c in enumerate(st.cores):
                g = merge[i]
                if g <= 0:
                    outs.append(everyone)
                    continue
                pieces = g * p.kv_chunks * (p.rows * vd * 4 + 8 * p.rows)
                got = move(c, 1, pieces, [everyone], "pieces in")
                outs.append(prog.add_vector(c, "elementwise", 2 * g * p.kv_chunks * p.rows * vd, op.dtype,
                                            deps=[got], name=f"{name} combine"))
        if self.kv_in_hbm and frac >= 1:  # the step's new keys/values land after the cached ones
            # written by tokens over every core of the group (as the cache-write kernel,
            # ReshapeAndCache, splits its tokens), whatever split the attention's units took
            for i, c in enumerate(st.cores):
                new = _split(op.batch * op.q_len, len(st.cores), i) * op.kv_heads * kv_head_bytes
                if new > 0:
                    prog.add_dma(c, int(new), address=self._kv_address(c, op, cached * kv_head_bytes), write=True,
                                 dma_engine=side[1], deps=[st.ready[i]], name=f"{name} write KV")
        st.set("feat" if t > 1 and not token_parallel else st.layout, outs)

    def _exchange(self, c: int, op: Op, nbytes: int, deps: list[int], name: str) -> int:
        """Core ``c``'s cube and vector units handing ``nbytes`` to each other inside a kernel (flash
        attention's scores to the vector unit, its probabilities back): free on a ``local`` core;
        on a decoupled one (``cores.cube_vector_exchange: global_memory``) a write and a read of the
        data through global memory, each on the core's DMA engines at the L2's per-core rate (the
        hand-off stays in the L2; without an L2, two HBM transfers). Returns the task the consumer
        waits for."""
        if self.arch.cores.cube_vector_exchange == "local" or nbytes <= 0:
            return deps[0] if len(deps) == 1 else self.prog.add_barrier(deps, name)
        l2, prog = self.arch.l2, self.prog
        if l2 is None:
            at = self._kv_address(c, op)
            w = prog.add_dma(c, nbytes, address=at, write=True, deps=deps, name=f"{name} to global memory")
            return prog.add_dma(c, nbytes, address=at, deps=[w], name=f"{name} from global memory")
        rate = l2_model.core_rate(l2, self.arch.clock_ghz, self.t, self.arch.cores.dma.bytes_per_cycle)
        cycles = math.ceil(nbytes / rate) + l2_model.hit_latency_cycles(l2, self.arch.clock_ghz)
        self.l2_read_bytes += nbytes
        w = prog.add_compute(c, "dma0", cycles, deps=deps, name=f"{name} to L2")
        return prog.add_compute(c, f"dma{min(1, self.arch.cores.dma.engines - 1)}", cycles, deps=[w],
                                name=f"{name} from L2")

    def _kv_l2(self, op: Op, sharers: int) -> tuple[float, int] | None:
        """``(bytes per cycle, latency cycles)`` at which one of ``sharers`` cores reads the KV
        the others also read from the chip's L2 (:mod:`npusim.hw.memory.l2`: every core but the
        first to load a byte hits, when the op's cached KV, read at about the same time by all
        of them, fits the L2), or None: no L2, no re-read, or too large to stay in it."""
        l2 = self.arch.l2
        if l2 is None or sharers <= 1:
            return None
        distinct = op.batch * max(0, op.kv_len - op.q_len) * op.kv_bytes_per_token * (self.kv_hbm_fraction or 0)
        if not l2_model.hit_bytes([l2_model.Reread(1.0, distinct)], l2_model.capacity_bytes(l2)):
            return None
        dma = self.arch.cores.dma
        rate = l2_model.core_rate(l2, self.arch.clock_ghz, self.t, dma.bytes_per_cycle)
        return rate, l2_model.hit_latency_cycles(l2, self.arch.clock_ghz)

    def _kv_read(self, c: int, op: Op, nbytes: int, offset: float, deps: list[int], name: str) -> list[int]:
        """Core ``c`` reading ``nbytes`` of cached KV from HBM, split over its DMA engines when the read
        is at least two 4 KB pieces (as the FlashAttention path's and the GEMM kernel's loads: the
        core's per-core rate is its engines' sum). Returns the reads' tasks (none for 0 bytes)."""
        if nbytes <= 0:
            return []
        engines = max(1, self.arch.cores.dma.engines)
        parts = engines if nbytes >= 2 * 4096 else 1
        size = nbytes // parts
        return [self.prog.add_dma(c, size if k < parts - 1 else nbytes - size * (parts - 1),
                                  address=self._kv_address(c, op, offset + k * size), dma_engine=k, deps=deps,
                                  name=f"{name} read KV") for k in range(parts)]

    def _mla_paged_units(self, op: Op, t: int) -> list[list[int]]:
        """Each core's units' keys under the incremental kernel's paged split (:func:`fa.paged_split`,
        ops-transformer ``IFATiling::SplitBNS`` / ``SplitBN``): with a split, core ``b x parts + p``
        takes piece ``p`` of sequence ``b`` (empty pieces leave their cores idle); without one, the
        sequences are dealt to the cores in contiguous runs (the first ``batch % cores`` one more)."""
        sp = fa.paged_split(op.batch, op.heads, op.kv_len, op.kv_table_keys, t)
        out: list[list[int]] = [[] for _ in range(t)]
        if sp.parts > 1:
            for b in range(op.batch):
                for p in range(sp.parts):
                    core = b * sp.parts + p
                    if core < t and sp.unit_keys(op.kv_len, p) > 0:
                        out[core].append(sp.unit_keys(op.kv_len, p))
            return out
        for i, n in enumerate(fa.spread(op.batch, t)):
            out[i] = [op.kv_len] * n
        return out

    def _mla_paged_core(self, c: int, op: Op, i: int, unit_keys: list[int], kv_share: float, deps: list[int],
                        name: str, write_deps: list[int] | None = None) -> int:
        """Core ``i``'s MLA decode units under the paged split (:meth:`_mla_paged_units`): its keys
        (``sum(unit_keys)``) stream in pipeline steps of about 512 keys (at most 8; each step's KV
        read, split over the core's engines, is issued up front on the in-order DMA queues, so a
        step's QK^T, softmax and PV overlap the next steps' reads), then the combine pass when the
        kernel cut sequences into pieces. A core without units only writes its share of the new
        tokens' KV."""
        prog = self.prog
        keys = sum(unit_keys)
        rows, vd = op.q_len * op.heads, op.v_head_dim or op.head_dim
        done = []
        if keys > 0:
            steps = max(1, min(8, math.ceil(keys / 512)))
            cached = max(0, keys - op.q_len * len(unit_keys))  # the new token's key is not read back
            for s in range(steps):
                step_keys = max(1, _split(keys, steps, s))
                cache = int(_split(cached, steps, s) * kv_share * self.kv_hbm_fraction)
                reads = self._kv_read(c, op, cache, s * cache, deps, name)
                done.append(self._mla_step(c, op, step_keys, 1, list(deps) + reads, name))
        new_kv = int(_split(op.batch, self.t, i) * op.q_len * kv_share)  # this core's share of the new tokens
        if self.kv_in_hbm and self.kv_hbm_fraction >= 1 and new_kv > 0:
            prog.add_dma(c, new_kv, address=self._kv_address(c, op, keys * kv_share), write=True,
                         dma_engine=min(1, self.arch.cores.dma.engines - 1), deps=write_deps or deps,
                         name=f"{name} write KV")
        if not done:
            return prog.add_barrier(list(deps), name)
        if all(k >= op.kv_len for k in unit_keys):  # whole sequences: nothing to combine
            return prog.add_barrier(done, name)
        return prog.add_vector(c, "elementwise", len(unit_keys) * rows * vd, op.dtype, deps=done,
                               name=f"{name} combine")

    def _mla_step(self, c: int, op: Op, keys: int, units: int, deps: list[int], name: str) -> int:
        """One pipeline step of MLA decode on core ``c``: ``units`` units of ``keys`` keys each --
        ``QK^T`` on the cube, the scores handed to the vector side, softmax, the probabilities handed
        back, ``PV`` on the cube (each hand-off by :meth:`_exchange`). Returns the ``PV`` task."""
        prog = self.prog
        rows, vd = op.q_len * op.heads, op.v_head_dim or op.head_dim
        scores = prog.add_gemm(c, rows, op.head_dim, keys, op.dtype, units, deps=deps, name=f"{name} QK")
        elements = units * rows * keys
        soft = prog.add_vector(c, "softmax", elements, op.dtype, name=f"{name} softmax", row_len=keys,
                               deps=[self._exchange(c, op, elements * SCORE_BYTES, [scores], f"{name} scores")])
        p_ready = self._exchange(c, op, elements * DTYPE_BYTES[op.dtype], [soft], f"{name} P")
        return prog.add_gemm(c, rows, keys, vd, op.dtype, units, deps=[p_ready], name=f"{name} PV")

    def _mla_split_kv(self, c: int, op: Op, i: int, keys: int, kv_share: float, deps: list[int], name: str,
                      write_deps: list[int] | None = None) -> int:
        """Core ``i``'s share of MLA decode attention, balanced by splitting the KV (split-KV, as
        FlashMLA / flash-decoding kernels do): each sequence's keys are cut into ``chunks`` pieces
        so that ``batch x chunks`` (sequence, piece) units divide evenly over the ``t`` cores (also
        when there are fewer sequences than cores: one sequence's KV is spread over all), at
        least 4 a core (a kernel streams a sequence's KV in tiles too); a core's units run in at
        most 8 pipeline steps whose KV reads overlap the previous step's
        compute (DMA and compute are separate in-order queues); the partial outputs of a split
        sequence are rescaled and summed by a vector pass (``chunks > 1``). ``deps``: what the core's
        KV reads and QK^T wait for (the caller's AIC start: the MIX kernel's extra start and the AIC
        prologue); ``write_deps``: what the step's new KV write waits for (default ``deps``)."""
        t, prog = self.t, self.prog
        chunks = t // math.gcd(op.batch, t)
        chunks *= -(-4 // (op.batch * chunks // t))  # at least 4 units a core, so loads pipeline
        units = op.batch * chunks // t
        chunk_keys = max(1, round(keys / chunks))  # keys per unit (the sequence's keys to within chunks/2)
        cached = max(0, op.kv_len - op.q_len) / chunks  # cached tokens per unit, read from HBM
        rows, vd = op.q_len * op.heads, op.v_head_dim or op.head_dim
        pieces = min(units, 8)
        done = []
        for p in range(pieces):
            n = _split(units, pieces, p)
            step = list(deps)
            cache = int(n * cached * kv_share * self.kv_hbm_fraction)
            step += self._kv_read(c, op, cache, p * cache, deps, name)
            done.append(self._mla_step(c, op, chunk_keys, n, step, name))
        if self.kv_in_hbm and self.kv_hbm_fraction >= 1:
            prog.add_dma(c, int(_split(op.batch, t, i) * op.q_len * kv_share),
                         address=self._kv_address(c, op, units * cached * kv_share), write=True,
                         dma_engine=min(1, self.arch.cores.dma.engines - 1), deps=write_deps or deps,
                         name=f"{name} write KV")
        if chunks == 1:
            return prog.add_barrier(done, name)
        return prog.add_vector(c, "elementwise", units * rows * vd, op.dtype, deps=done, name=f"{name} combine")

    def _moe(self, st: _GroupState, op: Op, name: str) -> None:
        """Expert parallelism inside the group, tokens moved by all-to-all.

        * **Tokens.** Core ``i`` owns the ``i``-th slice of the tokens (the ``m`` split; a
          ``feat``/``mb`` activation is all-gathered first). Expert ``e`` lives on core ``e mod t``.
        * **Dispatch.** With the activation split by tokens (``m``), each core sends each of its
          tokens once to every other core holding at least one of the token's experts
          (deduplicated per core, as DeepEP-style kernels do): ``k`` elements of the op's dtype
          per token, an all-to-all with those counts (:func:`~npusim.comm.collectives.alltoallv`).
          A token whose experts are all on its own core moves nothing; the sender's scatter is
          the messages themselves (no vector pass). A replicated activation (``rep``, e.g. after
          a ``tp_k`` router) is already on every core: nothing moves, each core takes its
          experts' tokens from its own copy.
        * **Experts.** When a core has received everything, it runs each of its experts that got
          tokens: gate+up GEMM ``n_e x k x 2n``, the SwiGLU (``n_e x n`` elements, vector unit,
          overlapping the next expert's GEMM), down GEMM ``n_e x n x k``; weights resident or
          streamed per expert like any GEMM's. Each is counted once, on one core.
        * **Combine.** The core scales each expert output by its gate score and sums each token's
          local outputs (``k`` elements per routed token: the weighted sum of the ``moe`` op),
          sends one bf16 partial sum per (token, core) back to the token's owner (all-to-all), and
          the owner adds up the partials it received (one add per element per received partial,
          a reduction of the combine like an all-reduce's). The output is split by tokens (``m``).

        Which tokens go where comes from the op's routing (:func:`_routing`); with several
        replicas or micro-batches each emission takes the next slice of the layer's tokens.
        Not modelled: the router's gate scores and top-k indices travelling with the tokens
        (bytes per token are ``k`` elements), int8 activations' per-token scales."""
        t, prog = self.t, self.prog
        picks = self._moe_slice(op)
        m = picks.shape[0]
        counts = np.bincount(picks.ravel(), minlength=op.experts)
        if t == 1:
            st.set("rep", [self._experts_on(st.cores[0], 0, op, counts, st.ready[0], name)])
            return
        if st.layout not in ("rep", "m"):
            self._to_rep(st, op.activation_in_bytes, name + " gather")
        owner = np.repeat(np.arange(t), [_split(m, t, i) for i in range(t)])
        hit = np.zeros((m, t), dtype=bool)
        hit[np.repeat(np.arange(m), op.top_k), (picks % t).ravel()] = True
        tokens = np.zeros((t, t), dtype=np.int64)  # tokens[s, d]: tokens owned by s with an expert on d
        np.add.at(tokens, owner, hit.astype(np.int64))
        remote = tokens.copy()
        np.fill_diagonal(remote, 0)
        if st.layout == "rep":  # every core holds every token already
            arrived = list(st.ready)
        else:
            disp = alltoallv(prog, st.cores, (remote * int(op.k * op.elem_bytes)).tolist(),
                             ready=[[r] for r in st.ready], name=f"{name} dispatch")
            arrived = [disp.done[c] for c in st.cores]
        partial = [self._experts_on(c, d, op, counts, arrived[d], name) for d, c in enumerate(st.cores)]
        back = alltoallv(prog, st.cores, (remote.T * int(op.k * DTYPE_BYTES["bf16"])).tolist(),
                         ready=[[p] for p in partial],
                         name=f"{name} combine")
        outs = [prog.add_vector(c, "elementwise", int(remote[s].sum()) * op.k, "bf16", deps=[back.done[c], partial[s]],
                                name=f"{name} combine sum") for s, c in enumerate(st.cores)]
        st.set("m", outs)

    def _moe_slice(self, op: Op) -> np.ndarray:
        """The routing of the tokens this emission of ``op`` carries: consecutive emissions of a
        layer's MoE op (replicas, micro-batches, in plan order) take consecutive token slices of
        the graph op's routing (wrapping around if rounding asks for more)."""
        full = self.moe_ops.get(op.name, op)
        if op.m >= full.m:
            return _routing(op)
        picks = _routing(full)
        first = self.moe_cursor.get(op.name, 0)
        self.moe_cursor[op.name] = (first + op.m) % full.m
        return picks[(first + np.arange(op.m)) % full.m]

    def _experts_on(self, c: int, d: int, op: Op, counts: np.ndarray, arrived: int, name: str) -> int:
        """Core ``c`` (rank ``d`` of the group) runs its experts ``d, d + t, ...`` on the tokens routed
        to them, then the weighted sum of its outputs per token; returns the last task."""
        prog, h = self.prog, op.k
        up = 2 * op.n if op.gated else op.n
        downs = []
        for e in range(d, op.experts, self.t):
            n_e = int(counts[e])
            if n_e <= 0:
                continue
            x = self._expert_gemm(c, op, e, "gate_up", n_e, h, up, [arrived], name)
            a = prog.add_vector(c, "activation", n_e * op.n, "bf16", deps=[x], name=f"{name} e{e} act",
                                fn="swiglu" if op.gated else "gelu")
            downs.append(self._expert_gemm(c, op, e, "down", n_e, op.n, h, [a], name))
        routed = int(sum(int(counts[e]) for e in range(d, op.experts, self.t)))
        return prog.add_vector(c, "elementwise", routed * h, "bf16", deps=downs or [arrived],
                               name=f"{name} weighted sum")

    def _expert_gemm(self, c: int, op: Op, e: int, part: str, m: int, k: int, n: int, deps: list[int],
                     name: str) -> int:
        """One GEMM of expert ``e`` with its own weight (``k x n``), resident or streamed."""
        if self.resident or op.name in self.resident_ops:
            return self.prog.add_gemm(c, m, k, n, op.dtype, deps=deps, name=f"{name} e{e} {part}")
        w = Op(f"{op.name}.e{e}.{part}", "gemm", op.layer, op.dtype, op.weight_dtype, m=m, k=k, n=n, weight=True)
        return self._compute_with_weights(c, 0, w, w.weight_bytes, m, k, n, deps, f"{name} e{e} {part}")[-1]

    def _embedding(self, st: _GroupState, op: Op, name: str) -> None:
        row = int(op.n * op.weight_elem_bytes)
        tasks = []
        for i, c in enumerate(st.cores):
            rows = _split(op.m, self.t, i)
            tasks.append(self.prog.add_dma(c, rows * row, address=self._weight_base(op) + i * rows * row,
                                           deps=[st.ready[i]], name=name) if rows else
                         self.prog.add_barrier([st.ready[i]], name))
        st.set("m" if self.t > 1 else "rep", tasks)

    def _stage_transfer(self, prev: _GroupState, nxt: _GroupState, prev_ops: list[Op], frac: float) -> None:
        """Send the activation from stage s to stage s+1, core to core (each its share)."""
        last = next((op for op in reversed(prev_ops) if op.output_bytes), None)
        total = int(last.output_bytes * frac) if last else 0
        layout = prev.layout if prev.layout in ("m", "feat") else "m"
        tasks = []
        for i, (src, dst) in enumerate(zip(prev.cores, nxt.cores)):
            share = _split(total, self.t, i)
            tasks.append(self.prog.add_send(src, dst, share, deps=[prev.ready[i]], name="stage transfer")
                         if src != dst else prev.ready[i])
        nxt.set(layout if self.t > 1 else "rep", tasks)


def map_model(graph: Graph, arch: Arch, spec: MappingSpec, kv_hbm_fraction: float | None = None,
              cores: list[int] | None = None, l2_addressed: bool = False) -> Mapped:
    """Lay ``graph`` onto ``arch`` following ``spec``; see the module docstring.

    ``kv_hbm_fraction``: the share of each attention's cached keys/values read from HBM
    (a serving memory manager knows it); default: all of it when the spec puts the KV
    cache in HBM, none otherwise. New keys/values are written to HBM only in the former case.
    ``cores``: map onto this ordered list of cores only (TP groups are consecutive runs of it).
    ``l2_addressed``: the program will run with the transaction-level L2 (TLM memory, an arch ``l2``):
    the KV re-reads of cores that share a KV head become DMAs of the whole head from one address
    (its first sharer's KV area), and the simulated cache decides what hits. Default: the reuse
    model's split (one core's share from HBM, the others' as fixed-time L2 reads). The cube/vector
    hand-offs through global memory keep the reuse model's fixed-time L2 write and read at every
    fidelity: the TLM L2 is write-through, so a hand-off written there would cost HBM bandwidth
    that Ascend's write-back L2 does not spend on it (a 512-token GQA prefill chunk on
    ascend-910b took about 2.5x as long that way, its fp32 scores all written to HBM)."""
    if spec.tensor_parallel.degree > arch.num_cores:
        raise ConfigError(f"tensor_parallel.degree {spec.tensor_parallel.degree} exceeds the chip's "
                          f"{arch.num_cores} cores")
    bad = [op for op in graph.ops if op.kind in ("gemm", "attention", "moe") and op.dtype not in
           arch.cores.systolic_array.macs_per_pe_per_cycle]
    if bad:
        raise ConfigError(f"{graph.name}: {len(bad)} ops use a dtype {arch.name}'s array does not support "
                          f"(e.g. {bad[0].name}: {bad[0].dtype}); supported: "
                          f"{sorted(arch.cores.systolic_array.macs_per_pe_per_cycle)}")
    return Mapper(graph, arch, spec, kv_hbm_fraction, cores, l2_addressed).plan()


__all__ = ["Mapped", "map_model", "op_class"]
