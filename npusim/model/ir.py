"""The operator graph: what a model computes, with shapes, dtypes and byte sizes.

A :class:`Graph` is a list of :class:`Op` in topological order. Every op has a
``kind`` and the shape fields that kind uses; FLOPs and bytes are derived
properties, so builders and the ONNX importer only state shapes. Units: elements
for shapes, bytes for sizes, FLOPs count a multiply-add as 2.

Kinds and their fields:

* ``gemm``: ``Y[batch, m, n] = X[batch, m, k] . W[k, n]``. ``weight=True`` when ``W`` is a
  parameter (it can stay resident in SRAM or stream from HBM); ``False`` for an
  activation-by-activation product. ``m`` is the token dimension. With ``batch > 1`` a
  weight is shared by the ``batch`` products unless ``weight_batched=True``, which gives each
  product its own ``[k, n]`` weight (MLA's per-head absorbed projections, grouped convolution,
  an ONNX MatMul with a 3-D initializer).
* ``attention``: scaled dot-product attention of ``batch`` sequences, ``q_len`` new
  tokens each attending to ``kv_len`` keys (prefill: ``kv_len == q_len`` plus any
  prefix, ``causal=True``; decode: ``q_len == 1``), ``heads`` query heads of
  ``head_dim`` (``v_head_dim`` for values, default ``head_dim``) sharing ``kv_heads``
  key/value heads (MHA: equal, GQA: fewer, MQA: 1). ``kv_bytes_per_token`` is the KV
  cache read per key (MLA stores a compressed latent: set ``variant="mla"`` and
  ``kv_bytes_per_token`` explicitly).
* ``vector``: an element-wise / normalisation op on the vector unit: ``elements``,
  ``op_class`` (see ``npusim.hw.compute.vector.OP_CLASSES``), optional ``fn`` and
  ``row_len`` (for row-wise ops: softmax, norms).
* ``embedding``: gather of ``m`` rows of ``n`` elements from a ``[k, n]`` table.
* ``moe``: the routed experts of a MoE layer, whole: each of ``m`` tokens goes to its
  ``top_k`` of ``experts`` experts (dispatch), each expert is an FFN ``k -> n -> k`` (gate+up
  fused as ``2n`` when ``gated``, then the activation — SwiGLU when gated — then down), and each
  token's ``top_k`` outputs are summed weighted by their gate scores (combine). ``expert_tokens``
  (tokens per expert, length ``experts``) and ``expert_routing`` (token-major, ``top_k`` expert
  ids per token, ``m * top_k`` entries; :mod:`npusim.model.routing`) say who goes where; an op
  may state only the counts. FLOPs: the GEMMs (2 per multiply-add), the activation (one per
  element of the ``n`` outputs per routed token) and the weighted sum (one per element of the
  ``k`` outputs per routed token), as the vector ops count them; :attr:`Op.gemm_flops` is the
  GEMM part alone.
* ``data``: data movement with no arithmetic (reshape/transpose/concat/...): ``bytes``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from npusim.arch.schema import DTYPE_BYTES
from npusim.errors import ConfigError

KINDS = ("gemm", "attention", "vector", "embedding", "moe", "data")


def check_shape(batch, seq_len, kv_len) -> None:
    """A graph's sequence shape: positive integers, and keys at least the new tokens (they
    attend to themselves). Raises ConfigError naming the argument."""
    for label, value in (("batch", batch), ("seq_len", seq_len), ("kv_len", kv_len)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"{label} must be a positive integer, got {value!r}")
    if kv_len < seq_len:
        raise ConfigError(f"kv_len ({kv_len}) must be >= seq_len ({seq_len}): the new tokens attend to themselves")


@dataclass(frozen=True)
class Op:
    name: str
    kind: str
    layer: int = -1
    dtype: str = "bf16"
    weight_dtype: str | None = None  # default: dtype
    inputs: tuple[str, ...] = ()
    # gemm / embedding / moe
    m: int = 0
    k: int = 0
    n: int = 0
    batch: int = 1
    weight: bool = False
    weight_batched: bool = False  # each of the ``batch`` products has its own weight
    # attention
    q_len: int = 0
    kv_len: int = 0
    heads: int = 0
    kv_heads: int = 0
    head_dim: int = 0
    v_head_dim: int = 0
    causal: bool = False
    variant: str = "mha"
    kv_bytes_per_token_override: int = 0
    # keys a sequence's paged block table addresses (its width x the block size, the kernel's sMax);
    # 0: unstated (MLA decode then splits the KV as if the table were as long as the sequence)
    kv_table_keys: int = 0
    # vector
    elements: int = 0
    op_class: str = ""
    fn: str | None = None
    row_len: int | None = None
    # moe
    experts: int = 0
    top_k: int = 0
    gated: bool = True
    expert_tokens: tuple[int, ...] = ()
    expert_routing: tuple[int, ...] = ()  # token-major, top_k expert ids per token
    # data
    nbytes: int = 0
    attrs: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"op {self.name}: unknown kind {self.kind!r}; known: {KINDS}")
        if self.expert_routing and len(self.expert_routing) != self.m * self.top_k:
            raise ValueError(f"op {self.name}: expert_routing has {len(self.expert_routing)} entries, "
                             f"expected m * top_k = {self.m * self.top_k}")

    # -- sizes ----------------------------------------------------------------------------
    @property
    def elem_bytes(self) -> float:
        return DTYPE_BYTES[self.dtype]

    @property
    def weight_elem_bytes(self) -> float:
        return DTYPE_BYTES[self.weight_dtype or self.dtype]

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per key position, all KV heads (attention ops)."""
        if self.kv_bytes_per_token_override:
            return self.kv_bytes_per_token_override
        vd = self.v_head_dim or self.head_dim
        return int(self.kv_heads * (self.head_dim + vd) * self.elem_bytes)

    @property
    def flops(self) -> int:
        if self.kind == "gemm":
            return 2 * self.batch * self.m * self.k * self.n
        if self.kind == "attention":
            vd = self.v_head_dim or self.head_dim
            pairs = self.attended_pairs
            return 2 * self.heads * pairs * (self.head_dim + vd)
        if self.kind == "moe":  # GEMMs, then the activation and the weighted sum per routed token
            return self.gemm_flops + sum(self.expert_tokens) * (self.n + self.k)
        if self.kind == "vector":
            return self.elements
        return 0

    @property
    def gemm_flops(self) -> int:
        """FLOPs of the matrix products alone (``gemm``: all of them; ``moe``: the experts' GEMMs)."""
        if self.kind == "gemm":
            return self.flops
        if self.kind == "moe":
            mult = 3 if self.gated else 2  # gate + up + down, or up + down
            return 2 * sum(self.expert_tokens) * self.k * self.n * mult
        return 0

    @property
    def attended_pairs(self) -> int:
        """(query, key) pairs per head summed over the batch; causal prefill counts the triangle."""
        if self.causal:
            prefix = self.kv_len - self.q_len
            per_seq = self.q_len * prefix + self.q_len * (self.q_len + 1) // 2
        else:
            per_seq = self.q_len * self.kv_len
        return self.batch * per_seq

    @property
    def weight_bytes(self) -> int:
        if self.kind == "gemm" and self.weight:
            copies = self.batch if self.weight_batched else 1
            return int(copies * self.k * self.n * self.weight_elem_bytes)
        if self.kind == "embedding":
            return int(self.k * self.n * self.weight_elem_bytes)
        if self.kind == "moe":
            mult = 3 if self.gated else 2
            return int(self.experts * self.k * self.n * mult * self.weight_elem_bytes)
        return 0

    @property
    def activation_in_bytes(self) -> int:
        if self.kind == "gemm":
            extra = 0 if self.weight else self.batch * self.k * self.n * self.elem_bytes
            return int(self.batch * self.m * self.k * self.elem_bytes + extra)
        if self.kind == "attention":
            return int(self.batch * self.q_len * self.heads * self.head_dim * self.elem_bytes)
        if self.kind in ("vector",):
            return int(self.elements * self.elem_bytes)
        if self.kind in ("embedding",):
            return int(self.m * 4)
        if self.kind == "moe":
            return int(self.m * self.k * self.elem_bytes)
        return int(self.nbytes)

    @property
    def output_bytes(self) -> int:
        if self.kind == "gemm":
            return int(self.batch * self.m * self.n * self.elem_bytes)
        if self.kind == "attention":
            vd = self.v_head_dim or self.head_dim
            return int(self.batch * self.q_len * self.heads * vd * self.elem_bytes)
        if self.kind == "vector":
            return int(self.elements * self.elem_bytes)
        if self.kind == "embedding":
            return int(self.m * self.n * self.elem_bytes)
        if self.kind == "moe":
            return int(self.m * self.k * self.elem_bytes)
        return int(self.nbytes)

    @property
    def kv_read_bytes(self) -> int:
        """KV cache read by an attention op (each key position once per sequence)."""
        if self.kind != "attention":
            return 0
        return int(self.batch * self.kv_len * self.kv_bytes_per_token)


@dataclass
class Graph:
    """Ops in topological order plus what the graph was built for."""

    name: str
    ops: list[Op]
    phase: str = "prefill"  # prefill | decode
    batch: int = 1
    seq_len: int = 0  # new tokens per sequence
    kv_len: int = 0  # keys per sequence attended (decode: cache length + 1)
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        seen = set()
        for op in self.ops:
            if op.name in seen:
                raise ValueError(f"graph {self.name}: duplicate op name {op.name!r}")
            missing = [i for i in op.inputs if i not in seen]
            if missing:
                raise ValueError(f"graph {self.name}: op {op.name} uses {missing} before they are defined")
            seen.add(op.name)

    @property
    def flops(self) -> int:
        return sum(op.flops for op in self.ops)

    @property
    def weight_bytes(self) -> int:
        return sum(op.weight_bytes for op in self.ops)

    @property
    def kv_read_bytes(self) -> int:
        return sum(op.kv_read_bytes for op in self.ops)

    def layers(self) -> list[int]:
        return sorted({op.layer for op in self.ops if op.layer >= 0})
