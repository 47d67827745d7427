"""Measured Ascend operators against the die model (``published.yaml`` ``operators``; issue 39 item 1).

Each row of the section is one measurement on hardware (a kernel's time from msprof, a vendor
sample's table, a collective benchmark), with its source. This check runs every row the
simulator can express on the preset or system its source's hardware maps to (the source's
``target``) and prints the measured figure, npusim's, the error, and a naive model's error: the
roofline of the same work on the same preset. Rows are judged in microseconds per call.

How each family is run (assumptions):

* **gemm** -- :meth:`~npusim.system.chipcost.ChipCost.gemm` ``(m, k, n, batch)`` on the whole die
  (or the source's ``cores``; a 910B source's row that states 24 or 20 cores runs on the preset
  with that many, :data:`BY_CORES`), INT8 for W8A8 (``int8`` / ``w8a8``), FP32 for ``fp32``, else
  FP16/BF16 (``fp16 in, fp32 out``: FP16), with the kernel the row states it ran (:func:`_kernel`:
  CATLASS's multi-core split K -> ``catlass_splitk``; other CATLASS examples and PTO's hand-written
  GEMM -> ``catlass_basic``, their base blocks; CATLASS's single-core split K -> ``catlass_single_splitk``; aclnn MatMulV2/V3, QuantBatchMatmul and the rest ->
  the die's default, ``aclnn``), at the tiling the row states (``tile``: CATLASS's ``L1TileShape<M, N, K>``;
  ``swizzle``: ``GemmIdentityBlockSwizzle<offset, direction>``), else the kernel's own. Roofline:
  ``max(2 m n k batch / peak, compulsory bytes / HBM bandwidth)``.
* **vector** -- :meth:`~npusim.system.chipcost.ChipCost.vector` with the op class the kernel's name
  says (:data:`VECTOR_OPS`: norms, (dynamic) quantisation, RoPE, SwiGLU, adds, copies (TensorMove:
  no vector instruction), transposes, softmax), rows of the tensor's last dimension; a SwiGLU's
  tensor is its gate and up halves (outputs: half of it); fp16 rows run at fp16 (an Add is then
  one native instruction), others at bf16; an Add reads both operands; a fused norm (AddRmsNorm,
  AddRmsNormBias) is the residual Add and the norm in one kernel (``rmsnorm`` with ``fn="add"``: x1
  and x2 in, their sum x and y out; the bias is not counted); an InterleaveRope (x ``[B, N, S, 64]``) is
  ``rope`` with ``fn="interleave"``, a row one batch, run as its kernel's tiling splits it
  (:func:`npusim.hw.compute.vector_kernel.interleave_rope_split`). A row of an in-model profile (source
  ``kind: profiling``: kernels timed in a model's run) reads its first input from the L2 when it fits
  there (``ChipCost.vector(resident_inputs=1)``): the kernel before it wrote that tensor (a residual
  Add's or an AddRmsNorm's second input, written layers earlier, comes from HBM). A row timed alone
  (any other source: a benchmark or an isolated replay) finds the write-back L2 without earlier
  dirty lines: its writes stay in the L2 when its output and the inputs the L2 allocates fit there
  (``absorb_writes``; none allocated when the row's conditions say its loads bypass the L2) -- the
  vendor Add sample's cases 4 and 5 (calibration half) move 402 MB in 264 us through the L2 and in
  188 us with the loads bypassing it, above the HBM's 1.6 TB/s: its 134 MB of output never reached HBM.
  In a model's run the L2 is full of earlier kernels' dirty lines: every write reaches HBM. Kernels npusim has no model for
  (top-k, sort, gather, arg-max, cache scatter, the fused Triton prologue) are listed as not run.
  Roofline: bytes read and written / HBM bandwidth.
* **attention** -- a standard (MHA/GQA) attention op through the chip's mapper
  (:meth:`~npusim.system.chipcost.ChipCost.op`) with the row's batch, heads, query and KV lengths
  and head size (non-causal unless stated): the mapper's FlashAttention lowering
  (:mod:`npusim.mapping.flash_attention`: query-block split, cube/vector pipeline, split-KV decode);
  a KV length stated as a range (``"~4096-5632"``: a decode from the prompt to its last token) runs
  at its midpoint; absorbed MLA decode rows (``head_dim`` the latent, ``rope_dim`` its rotary part,
  one KV head) run as the mapper's MLA op (latent ``head_dim + rope_dim`` keys, ``head_dim``
  values, split-KV over the cores). Not run: rows without a KV length (``"not stated"``), MLA
  prefill, the varlen TND prefill rows (their sequences' lengths are not given: attention's work
  is the sum of their squares), linear attention / GDN / KDA (no model). Roofline: ``max(4 b h q kv d / peak, (Q + K + V + O) bytes / HBM bandwidth)``.
* **memory** -- a read-only global-memory stream (the vendor's DataCopy sample: GM -> UB over the
  AIVs, GM -> L1 with ND -> NZ over the AICs, no compute, no write-back): the kernel's start
  (``kernel.start_us``) plus ``npusim mem``'s stream of the tensor's bytes (``repeat`` passes)
  through the row's cores' DMA engines at the analytical memory fidelity (:meth:`_Runner.memory`).
  Not modelled: the bytes per row of a strided copy (a 128 B run costs more than its bytes),
  unaligned rows, ND -> NZ; not run: passes the L2 should serve (``l2_slices``). Roofline: the
  bytes at the HBM's peak.
* **collective** -- HCCL all-gather, reduce-scatter and all-reduce over the first ``ranks`` dies of
  ``target`` (:func:`~npusim.system.measure.run_collective`, flow fidelity), ``msg_bytes_total`` in
  the nccl-tests convention, or ``msg_bytes_per_rank``: one rank's tensor (:func:`collective_bytes`;
  MB read as 10^6 bytes unless the source's ``byte_units`` is ``binary``; ``8192B``: bytes), with
  HCCL's algorithm choice for the source's ``hccl_expansion`` (``HCCL_OP_EXPANSION_MODE``; else the
  system's); the note names the engine HCCL expands it on, on an A3 server (``aiv`` or ``aicpu``:
  :func:`~npusim.system.collectives.hccl_engine`, a label, not a cost). An hccl_test row
  (``all_reduce_test``: back-to-back op-base calls timed together) is the larger of the simulated
  collective and the eager runtime's ``hccl_dispatch_us`` (the host runs ahead of the device).
  Roofline: the bytes each rank must send (``(n-1)/n`` of the message; twice for all-reduce) over
  all of one die's outgoing links at once.
* **runtime** -- a row that measures a quantity of the runtime model
  (:class:`~npusim.system.schema.Runtime`; :data:`RUNTIME_QUANTITIES`) against that quantity on the
  source's target system (the schema's defaults when it names none): the eager host dispatch of an
  op (and of a fused-attention op), a graph replay's enqueue, the per-step parameter updates of a graph's attention operators
  (their count from the row), the device's gap at a graph boundary the host steps into
  (:meth:`~npusim.system.schema.Runtime.graph_boundary_us`, the next graph's ``attention_ops`` from the row:
  the synchronize, the replay enqueue, that op's update, the first task's crossing; the per-step scheduler
  is not per graph: the CloudMatrix384 paper's per-graph scheduling delay of MTP's pipeline breaks, where
  the CPU samples and prepares the next graph between two graphs of one step). A range runs at its midpoint. Baseline: no runtime cost (0). Not run:
  launch + synchronize round trips (the model has no synchronize), in-model minus isolated
  differences, host-bound step fractions, device-side transfer and memory latencies.

How each row was timed (``timing``, the row's or else its source's, read from the harness that produced
the figures): unset, the kernel on the device (msprof, in-kernel timestamps, device events); ``sync``,
one call timed on the host from before its dispatch to after ``synchronize()`` returned (the pto-isa
PTO-DSL harness's ``--timing sync``): the simulated figure is then the eager runtime's host dispatch
of one operator (an attention row's: ``attention_dispatch_us``), its kernel launch, the kernel, and the
synchronize's return
(:func:`host_timed`; the runtime schema's defaults, which every preset carries: ``npusim calibrate
--only runtime`` checks them); ``cold``, one launch per process with no warm-up, timed inside the
kernel (the pto-isa manual FA harness's ``main.cpp``): the kernel as simulated, with the note that a
first call's costs (instruction fetch, first touch of new buffers) are not modelled. The roofline
stays the kernel's.

Where a source times several kernels for one case (a baseline beside a tuned kernel, several
tilings), the fastest is compared (:func:`_fastest`), run as that row states it ran.

Rows of a source in the ``calibration`` half are ``fitted`` (they may steer modelling choices), of
the ``validation`` half ``outside``, except in a family listed in the section's ``steered_families``
(its validation rows were seen before a modelling choice: ``fitted``, the reason beside it) and the
rows listed in ``steered_rows`` (``source``, and ``shape`` if only some of its rows: the same, row
by row); each row carries ``family`` and ``half``. ``--quick`` runs the
rows of the validation half only.
"""

from __future__ import annotations

import math
import re

from npusim.arch.derived import summarize
from npusim.arch.schema import DTYPE_BYTES
from npusim.errors import NpusimError
from npusim.validate.published import published
from npusim.validate.rows import Row

#: kernel name (a prefix of the row's ``op``) -> (vector op class, activation function): the vector
#: model's classes (npusim.hw.compute.vector.OP_CLASSES)
VECTOR_OPS = {
    # AscendQuantV2: DynamicQuant's instructions (an assumption), launched on every AIV of the die
    # (npusim.hw.compute.vector_kernel.FULL_DIE_LAUNCH: ops-nn ascend_quant_v2_tiling.cpp WriteTilingData)
    "AscendQuantV2": ("quantize", "ascend_quant_v2"), "DynamicQuant": ("quantize", None),
    "AddRmsNormBias": ("rmsnorm", "add"), "RmsNorm": ("rmsnorm", None),
    # InterleaveRope: its own kernel and tiling (ops-transformer posembedding/interleave_rope; vector_kernel
    # interleave_rope_split), its row one batch of x [B, N, S, 64]
    "InterleaveRope": ("rope", "interleave"), "RotaryPositionEmbedding": ("rope", None), "RoPE (": ("rope", None),
    "SwiGlu": ("activation", "swiglu"),
    "Add (": ("elementwise", None), "TensorMove": ("copy", None), "Transpose (": ("transpose", None),
    "TransData": ("transpose", None), "SoftmaxV2": ("softmax", None),
}
HCCL_OPS = {"allGather": "allgather", "reduceScatter": "reducescatter", "allReduce": "allreduce"}

#: runtime row (a phrase of its ``op``) -> (the runtime model's figure for it, what it is)
RUNTIME_QUANTITIES = (
    ("eager torch.add host enqueue", lambda rt, r: rt.host_dispatch_us, "host_dispatch_us"),
    ("eager fused-attention host dispatch", lambda rt, r: rt.attention_dispatch_us, "attention_dispatch_us"),
    ("replay enqueue", lambda rt, r: rt.graph_launch_us, "graph_launch_us"),
    # CloudMatrix384 paper's MTP pipeline break: the device's gap at a graph boundary inside a step that the
    # CPU steps into (sampling, the next graph's inputs, its launch); the runtime model charges such a
    # boundary (Runtime.graph_boundary_us) between any two replays, the per-step scheduler (batch forming)
    # besides it. Until session 46 compared with scheduler_us + graph_launch_us + kernel_launch_us (+200%:
    # xDeepServe's 2 ms bubble is per step, not per graph); before session 45 with graph_launch_us alone
    ("graph launch / scheduling delay", lambda rt, r: rt.graph_boundary_us(int(r["shape"].get("attention_ops", 1))),
     "graph_boundary_us: sync_us + graph_launch_us + graph_update_us x the next graph's attention ops + "
     "kernel_launch_us, the gap the model charges at a graph boundary besides the per-step scheduler"),
    ("task update", lambda rt, r: rt.graph_update_us * int(r["shape"].get("attention_ops", r["shape"].get("layers", 0))),
     "graph_update_us x attention ops"),
)
INT8 = ("int8", "w8a8", "bf16->int8")
TIMINGS = ("sync", "cold")  # a row's ``timing`` besides the default (the kernel on the device, warm)


def host_timed(kernel_us: float, timing: str | None, family: str = "") -> tuple[float, str]:
    """A kernel's simulated time as the row's harness timed it (``timing``; module docstring): ``None``,
    the kernel itself; ``"sync"``, one eager call timed on the host around dispatch and synchronize:
    the operator's eager dispatch (``attention_dispatch_us`` for the ``attention`` family, else
    ``host_dispatch_us``) ``+ kernel_launch_us + kernel + sync_us`` of the runtime schema's defaults;
    ``"cold"``, the kernel itself (a cold first launch's extra costs are not modelled: said in the note)."""
    if timing is None:
        return kernel_us, ""
    if timing not in TIMINGS:
        raise NpusimError(f"published.yaml operators: timing {timing!r}: expected one of {TIMINGS} or none")
    if timing == "cold":
        return kernel_us, "cold single launch timed in the kernel (timing cold): first-call costs not modelled"
    from npusim.system.schema import Runtime

    rt = Runtime()
    dispatch = rt.attention_dispatch_us if family == "attention" else rt.host_dispatch_us
    host = dispatch + rt.kernel_launch_us + rt.sync_us
    return kernel_us + host, (f"host-timed call (timing sync): kernel {kernel_us:.2f} us + host dispatch "
                              f"{dispatch:g} + launch {rt.kernel_launch_us:g} + sync {rt.sync_us:g} us")


def _dtype(text: str) -> str:
    t = str(text).lower()
    if t.startswith(INT8) or "int8" in t.split(" ")[0]:
        return "int8"
    if t.split(" ")[0] == "fp32":  # FP32 inputs (the cube's FP32 rate)
        return "fp32"
    return "fp16" if t.startswith("fp16") else "bf16"


def _bytes(text, binary: bool = False) -> int:
    """'1.3MB' -> 1,300,000; '74KB' -> 74,000 (decimal units); ``binary`` (a source whose
    ``byte_units`` is ``binary``): '40.0MB' -> 40 x 2**20."""
    m = re.fullmatch(r"\s*([\d.]+)\s*(KB|MB|GB|B)\s*", str(text))
    if not m:
        raise ValueError(f"not a byte size: {text!r}")
    base = 1024 if binary else 1000
    return int(float(m.group(1)) * {"B": 1, "KB": base, "MB": base ** 2, "GB": base ** 3}[m.group(2)])


def collective_bytes(op: str, shape: dict, ranks: int, binary: bool = False) -> int | None:
    """A collective row's message in npusim's nccl-tests convention (:mod:`npusim.system.collectives`:
    all-gather's output, reduce-scatter's input, all-reduce's buffer): ``msg_bytes_total`` is that
    already; ``msg_bytes_per_rank`` is one rank's tensor (all-gather's input, reduce-scatter's output,
    all-reduce's buffer), so all-gather and reduce-scatter scale it by the ranks. None: neither key."""
    if "msg_bytes_total" in shape:
        return _bytes(shape["msg_bytes_total"], binary)
    if "msg_bytes_per_rank" in shape:
        per = _bytes(shape["msg_bytes_per_rank"], binary)
        return per * ranks if op in ("allgather", "reducescatter") else per
    return None


def _int(x) -> int | None:
    return x if isinstance(x, int) and not isinstance(x, bool) and x > 0 else None


def _kv_len(x) -> tuple[int | None, str]:
    """A row's KV length: an int, or a stated range ``"~A-B ..."`` read as its midpoint (the mean
    position of a decode that runs from A to B: the source does not print the lengths); else None."""
    if _int(x):
        return x, ""
    m = re.match(r"\s*~?\s*(\d+)\s*-\s*(\d+)", str(x))
    if not m:
        return None, ""
    lo, hi = int(m.group(1)), int(m.group(2))
    return (lo + hi) // 2, f"KV length {lo}-{hi} stated, its midpoint {(lo + hi) // 2} run"


def _cores(r: dict) -> int | None:
    return _int(r.get("cores"))


def _kernel(op: str) -> str | None:
    """The base-block kernel a GEMM row states it ran (:mod:`npusim.mapping.gemm_kernels`); None:
    the die's default (aclnn)."""
    t = op.lower()
    if "multi_core_splitk" in t:
        return "catlass_splitk"
    if "singlecoresplitk" in t or "single_core_splitk" in t:
        return "catlass_single_splitk"
    if "catlass" in t or t.startswith("pto"):
        return "catlass_basic"
    return None


def _steered(r: dict, steered_rows: list[dict]) -> bool:
    """Whether a ``steered_rows`` entry names this row (its source, and its shape if given)."""
    return any(e["source"] == r["source"] and e.get("shape", r.get("shape")) == r.get("shape") for e in steered_rows)


class _Runner:
    """Runs rows on their targets, one ChipCost per preset and one loaded system per system."""

    def __init__(self):
        self.costs: dict = {}
        self.systems: dict = {}

    def cost(self, arch: str):
        from npusim.system.chipcost import ChipCost

        if arch not in self.costs:
            self.costs[arch] = ChipCost(arch)
        return self.costs[arch]

    def gemm(self, r: dict, target: str) -> tuple[float, float, str] | None:
        s = r.get("shape") or {}
        m, k, n = (_int(s.get(x)) for x in ("m", "k", "n"))
        if not (m and k and n) or "ranks" in s or "measured_us" not in r:
            return None
        batch = _int(s.get("batch")) or 1
        dtype = _dtype(r.get("dtype", "bf16"))
        cc = self.cost(target)
        res = cc.gemm(m, k, n, dtype, _cores(r), batch=batch, kernel=_kernel(str(r["op"])), tile=r.get("tile"),
                      swizzle=r.get("swizzle"))
        flops = 2.0 * m * k * n * batch
        roof = max(flops / (res.peak_tflops_chip * 1e6), res.min_hbm_bytes / (res.hbm_peak_bandwidth_gbps * 1e3))
        kernel = res.mapping.split(":")[0] if ":" in res.mapping else "even split"  # base blocks: "<kernel>: ..."
        tiling = "".join(f" {lbl} {'x'.join(map(str, r[key]))}" for lbl, key in (("tile", "tile"), ("swizzle", "swizzle"))
                         if r.get(key))
        return res.time_us, roof, f"{kernel}{tiling}, {100 * res.compute_utilization:.0f}% of peak"

    def vector(self, r: dict, target: str, in_model: bool = False) -> tuple[float, float, str] | None:
        from npusim.model.ir import Op

        kind = next((v for k, v in VECTOR_OPS.items() if str(r["op"]).startswith(k)), None)
        tensor = (r.get("shape") or {}).get("tensor")
        if kind is None or not isinstance(tensor, list) or "measured_us" not in r:
            return None
        elements = 1
        for d in tensor:
            elements *= int(d)
        op_class, fn = kind
        swiglu = fn == "swiglu" or op_class == "swiglu_quant"  # the tensor is gate and up: outputs are half
        outputs, row_len = (elements // 2, int(tensor[-1]) // 2) if swiglu else (elements, int(tensor[-1]))
        if fn == "interleave":  # x [B, N, S, 64]: a row is one batch (N x S heads of 64), the kernel's loop
            row_len = elements // int(tensor[0])
        dtype = "fp16" if _dtype(r.get("dtype", "bf16")) == "fp16" else "bf16"  # the row's 2-byte input
        add_norm = op_class == "rmsnorm" and fn == "add"  # AddRmsNorm: x1, x2 in; x1 + x2 and y out
        inputs = ("x", "y") if str(r["op"]).startswith("Add") else ()  # an Add reads both operands
        op = Op(r["op"], "vector", dtype=dtype, elements=outputs, op_class=op_class, fn=fn, row_len=row_len,
                inputs=inputs)
        cc = self.cost(target)
        bypass = "bypass the L2" in str(r.get("conditions", ""))  # the row's loads skip the L2 (asc-devkit Add)
        res = cc.vector(op, _cores(r), resident_inputs=1 if in_model else 0, absorb_writes=not in_model,
                        inputs_bypass_l2=bypass)
        nbytes = (2 * elements * max(1, len(inputs)) + (1 if op_class == "quantize" else 2) * outputs
                  * (2 if add_norm else 1))
        roof = nbytes / (res.hbm_peak_bandwidth_gbps * 1e3)
        return res.time_us, roof, op_class + (f" {fn}" if fn else "") + (
            "; in-model: its first input from the L2" if in_model and res.l2_read_bytes else "") + (
            "; run alone: its writes kept by the L2" if "writes kept" in res.mapping else "")

    def memory(self, r: dict, target: str) -> tuple[float, float, str] | None:
        """A read-only global-memory stream (a DataCopy benchmark: no compute, no write-back):
        the kernel's device-side start (``kernel.start_us``) plus ``npusim mem``'s stream of the
        tensor's bytes, ``repeat`` passes, through the DMA engines of the row's cores at the analytical
        memory fidelity (:func:`npusim.sim.memory_probe.measure_memory`). Not run: passes the L2
        should serve (``l2_slices``: the analytical stream has no L2). The run length per row of a
        strided copy and the ND -> NZ conversion are not modelled (every byte streams at the
        channels' rate). Roofline: the bytes at the HBM's peak."""
        from npusim.sim.memory_probe import measure_memory

        s = r.get("shape") or {}
        tensor = s.get("read_tensor")
        if not tensor or "measured_us" not in r or s.get("l2_slices"):
            return None
        arch = self.cost(target).arch
        repeat = _int(s.get("repeat")) or 1
        nbytes = math.prod(int(x) for x in tensor) * DTYPE_BYTES[_dtype(r.get("dtype", "fp16"))]
        cores = min(_cores(r) or arch.num_cores, arch.num_cores)
        rep = measure_memory(arch, "stream", nbytes, mode="analytical", repeat=repeat,
                             initiators=cores * arch.cores.dma.engines)
        start = arch.kernel.start_us if arch.kernel is not None else 0.0
        roof = repeat * nbytes / (summarize(arch).hbm_bandwidth_gbps * 1e3)
        return start + rep.time_ns / 1e3, roof, (f"read-only stream of {repeat} x {nbytes / 1e6:.1f} MB over {cores} cores, "
                                                 f"{rep.bandwidth_gbps:.0f} GB/s + kernel start {start} us")

    def attention(self, r: dict, target: str) -> tuple[float, float, str] | None:
        from npusim.model.ir import Op

        s = r.get("shape") or {}
        q, heads, d = (_int(s.get(x)) for x in ("q_len", "heads", "head_dim"))
        kv, kv_note = _kv_len(s.get("kv_len"))
        mla = "MLA" in str(r["op"])
        rope = _int(s.get("rope_dim"))
        if not (q and kv and heads and d) or "measured_us" not in r:
            return None
        batch = _int(s.get("batch")) or 1
        causal = bool(s.get("causal", False))
        dtype = _dtype(r.get("dtype", "fp16"))
        if mla or rope:  # absorbed MLA decode: one latent KV head (nope + rope) shared by all query heads
            if not (mla and rope and q == 1 and _int(s.get("kv_heads")) in (None, 1)):
                return None
            latent = d + rope
            # a paged cache's table width (blocks per sequence x block size): the kernel splits it, not the KV
            table = (_int(s.get("max_blocks_per_seq")) or 0) * (_int(s.get("block_size")) or 0)
            op = Op("attention", "attention", dtype=dtype, q_len=q, kv_len=kv, heads=heads, kv_heads=1,
                    head_dim=latent, v_head_dim=d, batch=batch, variant="mla", kv_bytes_per_token_override=latent * 2,
                    kv_table_keys=table)
            nbytes = 2 * batch * (kv * latent + heads * q * (latent + d))
            how = "MLA decode (absorbed)"
        else:
            kv_heads = _int(s.get("kv_heads")) or heads
            op = Op("attention", "attention", dtype=dtype, q_len=q, kv_len=kv, heads=heads,
                    kv_heads=kv_heads, head_dim=d, v_head_dim=d, batch=batch, causal=causal)
            nbytes = 2 * batch * d * (2 * heads * q + 2 * kv_heads * kv)
            how = "FlashAttention"
        cc = self.cost(target)
        res = cc.op(op, _cores(r))
        roof = max(op.flops / (res.peak_tflops_chip * 1e6), nbytes / (res.hbm_peak_bandwidth_gbps * 1e3))
        return res.time_us, roof, f"{how}, {res.cores_used} cores" + (f"; {kv_note}" if kv_note else "")

    def collective(self, r: dict, target: str, binary: bool = False,
                   expansion: str | None = None) -> tuple[float, float, str] | None:
        from npusim.system.load import load_system
        from npusim.system.measure import run_collective

        s = r.get("shape") or {}
        op = next((v for k, v in HCCL_OPS.items() if k in str(r["op"])), None)
        ranks = _int(s.get("ranks"))
        nbytes = collective_bytes(op, s, ranks, binary) if op and ranks else None
        if nbytes is None or "measured_us" not in r:
            return None
        if target not in self.systems:
            self.systems[target] = load_system(target)
        loaded = self.systems[target]
        run = run_collective(loaded, op, list(range(ranks)), nbytes, expansion=expansion)
        topo = loaded.topology
        out_gbps = float(topo.link_cap[topo.link_src == topo.index["npu0.die0"]].sum()) * 1e3  # bytes/ps -> GB/s
        share = (ranks - 1) / ranks * nbytes * (2 if op == "allreduce" else 1)
        how = f"{run.algorithm}, {ranks} dies" + (f", {run.extra['engine']} engine" if run.extra.get("engine") else "")
        if "all_reduce_test" in str(r["op"]):  # hccl_test: back-to-back op-base calls, the host runs ahead
            dispatch = loaded.system.runtime.hccl_dispatch_us
            how += f"; back-to-back eager calls: max(device {run.time_us:.2f} us, runtime.hccl_dispatch_us)"
            return max(run.time_us, dispatch), share / (out_gbps * 1e3), how
        return run.time_us, share / (out_gbps * 1e3), how

    def runtime(self, r: dict, target: str | None) -> tuple[float, float, str] | None:
        """The runtime model's figure for a runtime row (:data:`RUNTIME_QUANTITIES`); None: no such
        quantity."""
        from npusim.system.load import load_system
        from npusim.system.schema import Runtime

        found = next(((fn, how) for text, fn, how in RUNTIME_QUANTITIES if text in str(r["op"])), None)
        if found is None:
            return None
        if target and target not in self.systems:
            self.systems[target] = load_system(target)
        rt = self.systems[target].system.runtime if target else Runtime()
        return float(found[0](rt, r)), 0.0, f"runtime.{found[1]} ({target or 'schema default'})"


#: a 910B-generation source whose row states its AI cores runs on the preset with that many cube cores
BY_CORES = {24: "ascend-910b", 20: "ascend-910b4"}


def _target(src: dict, r: dict) -> str | None:
    target = src.get("target")
    if target in BY_CORES.values() and _cores(r) in BY_CORES:
        return BY_CORES[_cores(r)]
    return target


def operator_rows(quick: bool = False, families: tuple[str, ...] | None = None) -> list[Row]:
    """The measured operator rows (``quick``: the validation half only; ``families``: only those)."""
    sec = published()["operators"]
    sources = {s["id"]: s for s in sec["sources"]}
    steered = sec.get("steered_families", {})  # families whose validation rows steered a choice: fitted
    steered_rows = sec.get("steered_rows", [])  # single validation rows that steered a choice: fitted
    runner = _Runner()
    run = {"gemm": runner.gemm, "vector": runner.vector, "attention": runner.attention,
           "collective": runner.collective, "runtime": runner.runtime, "memory": runner.memory}
    rows: list[Row] = []
    profiled = {s["id"] for s in sec["sources"] if s.get("kind") == "profiling"}
    for i, r, alternatives in _fastest(sec["rows"], profiled):
        src = sources[r["source"]]
        half = src["half"]
        if (quick and half != "validation") or (families and r["family"] not in families):
            continue
        fn = run.get(r["family"])
        target = _target(src, r)
        try:
            extra = {"binary": src.get("byte_units") == "binary",
                     "expansion": src.get("hccl_expansion")} if r["family"] == "collective" else {}
            if r["family"] == "vector":
                extra = {"in_model": src.get("kind") == "profiling"}
            got = fn(r, target, **extra) if fn and (target or r["family"] == "runtime") else None
        except NpusimError as exc:  # a row the simulator refuses: shown as not run, counted as a miss
            got = (None, None, f"could not run: {exc}")
        if got is None:
            continue
        sim_us, roof_us, how = got
        if sim_us is not None and r["family"] not in ("runtime", "collective"):
            sim_us, timed = host_timed(sim_us, r.get("timing", src.get("timing")), r["family"])
            how += f"; {timed}" if timed else ""
        rows.append(Row(name=f"{r['family']} {str(r['op'])[:24]} #{i}", source=f"{src['title']} ({src['url'].split()[0]})",
                        published=_measured_us(r), simulated=sim_us, tolerance=sec["tolerance"], unit="us",
                        kind="fitted" if half == "calibration" or r["family"] in steered
                        or _steered(r, steered_rows) else "outside",
                        baseline=roof_us,
                        family=r["family"], half=half,
                        note=f"{target}; {how}; shape {r.get('shape')}"
                             + (f"; the fastest of {alternatives} kernels the source times for it" if alternatives > 1
                                else "")))
    return rows


def _collective_op(r: dict) -> str | None:
    """A collective row's HCCL op (an all-gather and a reduce-scatter of one size are two cases, not
    two kernels of one case); None for other families."""
    if r["family"] != "collective":
        return None
    return next((v for k, v in HCCL_OPS.items() if k in str(r["op"])), str(r["op"]))


def _measured_us(r: dict) -> float:
    """A row's time: ``measured_us``, else the midpoint of its stated range."""
    if "measured_us" in r:
        return float(r["measured_us"])
    return (float(r["measured_us_min"]) + float(r["measured_us_max"])) / 2


def _fastest(rows: list[dict], profiled: set[str] | frozenset[str] = frozenset()):
    """``(index, row, kernels)`` for each distinct measured case: rows of one source, family, shape,
    dtype, core count (and collective op) that time different kernels (a baseline and a tuned one, several tilings)
    collapse to the fastest, the kernel the hardware can run the case at (npusim plans the best
    kernel it finds); rows without a time in microseconds, and runtime rows (each measures a
    different quantity), pass through alone. A vector row of a source in ``profiled`` (an in-model
    profile: one row per (kernel name, input shapes) group of the model's run) is its own case: two
    kernels of one shape there are two operators the model ran (an Add and an AddRmsNormBias over
    the same [256, 7168]), not alternatives (until session 44 the faster hid the other)."""
    best: dict = {}  # case -> [index, row, kernels], in the order cases first appear
    for i, r in enumerate(rows):
        own = str(r["op"]) if r["family"] == "vector" and r["source"] in profiled else None
        key = (r["source"], r["family"], repr(r.get("shape")), str(r.get("dtype")), r.get("cores"),
               _collective_op(r), own) if "measured_us" in r and r["family"] != "runtime" else ("alone", i)
        entry = best.setdefault(key, [i, r, 0])
        entry[2] += 1
        if "measured_us" in r and r["measured_us"] < entry[1]["measured_us"]:
            entry[0], entry[1] = i, r
    for i, r, kernels in best.values():
        yield i, r, kernels
