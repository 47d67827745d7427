"""Import an ONNX model as an operator graph (:class:`npusim.model.ir.Graph`).

What :func:`load_onnx` does, in order:

1. **Load without weights.** ``onnx.load(path, load_external_data=False)``: only tensor
   shapes are needed. External-data references must stay inside the model's folder
   (no absolute paths, no ``..``, no symlink escapes); anything else is refused.
2. **Bind symbolic dimensions** of the graph inputs: names exporters use for the batch
   (``batch_size``, ``batch``, ...), the new tokens (``sequence_length``, ``seq_len``, ...),
   the cached tokens (``past_sequence_length``, ...) and their sum
   (``total_sequence_length``, ...) take ``batch``, ``seq_len``, ``kv_len - seq_len`` and
   ``kv_len``; ``dims`` gives any other name (or overrides these). Simple expressions such
   as ``past_sequence_length + 1`` are evaluated. An unbound name is an error naming it.
3. **Infer shapes** with ``onnx.shape_inference.infer_shapes`` (``data_prop=True``) on a
   weight-free copy of the graph, alternating with a small NumPy constant folder so that
   shapes computed at run time (``Shape -> Gather -> Concat -> Reshape``, ``Range``, ...)
   become known. (If in-memory inference fails the file-path variant is tried.)
4. **Fold compile-time work.** A node whose inputs are all initializers, constants or
   shapes (``Shape``/``Size``) produces the same value for every input of these sizes:
   shape arithmetic, position ids, causal masks, RoPE tables, transposed weights. An
   inference compiler precomputes these, so they cost nothing and emit no op.
5. **Convert** the remaining nodes (table below), fusing the patterns exporters leave
   behind: RMSNorm written out (``Pow(x, 2) -> ReduceMean -> Add(eps) -> Sqrt ->
   Reciprocal|Div -> Mul(x) [-> Mul(gamma)]``), SiLU (``Sigmoid(x) * x``), rotate-half RoPE
   (``x * cos + Concat(-x2, x1) * sin`` with compile-time cos/sin) and attention
   written out (``MatMul(Q, K^T) [-> scale/mask ops] -> Softmax [-> IsNaN/Where/Cast]
   -> MatMul(P, V)``). For attention (fused ops and written-out chains) the layout and
   head-repeat ops feeding K and V (``Transpose``/``Reshape``/``Unsqueeze``/``Expand``/scale
   ``Mul``) are absorbed: a fused kernel reads K/V strided and shares KV heads (GQA), so
   the expansion ratio found on the ``Expand`` gives ``kv_heads``.

Conversions (``numel`` = elements of the output unless stated):

========================================  =================================================
ONNX                                      IR op
========================================  =================================================
MatMul, MatMulInteger, QLinearMatMul,     ``gemm``: ``m`` x ``k`` x ``n``; ``weight=True`` when B
Gemm, MatMulNBits (com.microsoft)         is compile-time (an initializer, possibly
                                          transposed/cast/dequantized); batch dims that B
                                          shares are ``batch``, A-only ones fold into ``m``;
                                          a batched weight sets ``weight_batched``
Conv                                      ``gemm`` by im2col: ``m = N*prod(out spatial)``,
                                          ``k = C_in/groups*prod(kernel)``, ``n = C_out/groups``,
                                          ``batch = groups`` (own weight per group)
Gather on a 2-D compile-time table        ``embedding``
Attention (opset 23), com.microsoft       ``attention`` (+ a QKV ``gemm`` for the old
MultiHeadAttention / GroupQueryAttention  com.microsoft Attention)
/ Attention, written-out chains
Add Sub Mul Div Pow Sqrt Reciprocal Neg   ``vector`` elementwise (Div/Reciprocal/Sqrt: divide
Cast Where Equal Less Greater ... Exp     class; Exp/Log/Sin/Cos/non-square Pow: exp class)
Log Sin Cos Clip Max Min (De)Quantize...
Relu Gelu Sigmoid Tanh Erf Softplus ...   ``vector`` activation (``fn`` relu/gelu/sigmoid/tanh/
                                          silu; Erf costed as tanh)
Softmax, LogSoftmax                       ``vector`` softmax (rows of the softmax axis)
LayerNormalization, RMSNormalization,     ``vector`` layernorm / rmsnorm (Skip* variants add
SimplifiedLayerNormalization,             an elementwise residual add)
Skip(Simplified)LayerNormalization
RotaryEmbedding                           ``vector`` rope
ReduceMean/Sum/Max/Min/Prod/L2/...,       ``vector`` reduction (rows = the reduced extent)
ArgMax/ArgMin, TopK, pools
BatchNormalization                        ``vector`` elementwise (inference scale+shift)
Transpose Concat Split Slice Gather       ``data`` (bytes of the outputs)
GatherND Expand Tile Pad Scatter* ...
Reshape Squeeze Unsqueeze Flatten         free (no op; dependencies pass through)
Identity Dropout Shape Size Constant
========================================  =================================================

Not supported (listed in one :class:`~npusim.errors.ConfigError`, or costed as data
movement of their outputs with ``allow_unsupported=True`` and listed in
``graph.meta["unsupported"]``): control flow (If, Loop, Scan), recurrent cells (LSTM,
GRU, RNN), ConvTranspose, Einsum, custom domains other than ``com.microsoft``'s ops named
above, and anything else not in :data:`SUPPORTED_OPS`.

Assumptions: the attention of a written-out chain or fused op is causal when the op says
so (``is_causal``, ``unidirectional``, GroupQueryAttention) or when it has a mask and more
than one query (decoder exports; an encoder's padding mask is costed as causal too). The
KV-cache append of fused ops (``present_key``) is not costed. A lookup whose indices are
compile-time too is folded (GPT-2's position embedding when the graph has no past input:
positions are ``0..seq-1``). Tensor types map to IR dtypes
(float/fp16/bf16/int8/...; int32/int64 tensors are labelled ``fp32``, bool ``int8``, double
``fp32``; ``data`` ops count their real bytes); ``dtype`` re-labels every floating-point
tensor (e.g. cost an fp32 export as bf16).
"""

from __future__ import annotations

import ast
import heapq
import math
import os
import re
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npusim.arch.schema import DTYPE_BYTES
from npusim.errors import ConfigError
from npusim.model.ir import Graph, Op, check_shape

try:  # the importer is optional: the rest of npusim works without the onnx package
    import onnx
    import onnx.inliner
    from onnx import TensorProto, helper, numpy_helper
    from onnx import shape_inference as _si
except ImportError:  # pragma: no cover - exercised only without onnx installed
    onnx = None

#: symbolic dimension names bound from the load arguments
BATCH_DIM_NAMES = ("batch_size", "batch", "batch_dim", "n", "b", "N", "B")
SEQ_DIM_NAMES = ("sequence_length", "seq_len", "seq_length", "sequence", "seq", "num_tokens", "tokens",
                 "s", "S")
PAST_DIM_NAMES = ("past_sequence_length", "past_seq_len", "past_sequence_len", "past_length", "past_len",
                  "cache_length", "past_key_values_length")
TOTAL_DIM_NAMES = ("total_sequence_length", "total_seq_len", "total_sequence_len", "total_length",
                   "kv_len", "kv_length", "attention_mask_sequence_length", "all_sequence_length")

#: tensors with at most this many elements are evaluated by the constant folder
FOLD_VALUE_MAX_ELEMENTS = 1 << 16
_MAX_INFER_ROUNDS = 8

_FREE = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Dropout", "Shape", "Size", "Constant",
         "Optional", "OptionalGetElement"}
_DATA = {"Transpose", "Concat", "Split", "Slice", "Gather", "GatherND", "GatherElements", "Expand", "Tile", "Pad",
         "ScatterND", "ScatterElements", "Scatter", "Trilu", "DepthToSpace", "SpaceToDepth", "Resize", "Upsample",
         "ReverseSequence", "OneHot", "Range", "ConstantOfShape", "EyeLike", "SplitToSequence", "CenterCropPad",
         "Col2Im"}
_DIVIDE = {"Div", "Reciprocal", "Sqrt"}
_EXP = {"Exp", "Log", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh"}
_ELEMENTWISE = {"Add", "Sub", "Mul", "Pow", "Neg", "Cast", "CastLike", "Where", "Equal", "Less", "LessOrEqual",
                "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Max", "Min", "Abs", "Sign", "Clip",
                "Floor", "Ceil", "Round", "Mod", "IsNaN", "IsInf", "Sum", "Mean", "BitShift", "BitwiseAnd",
                "BitwiseOr", "BitwiseNot", "BitwiseXor", "QuantizeLinear", "DequantizeLinear",
                "DynamicQuantizeLinear", "BatchNormalization", "CumSum", "Affine", "Shrink"} | _DIVIDE | _EXP
#: activation op -> vector ``fn``
_ACTIVATIONS = {"Relu": "relu", "LeakyRelu": "relu", "PRelu": "relu", "ThresholdedRelu": "relu",
                "HardSigmoid": "relu", "HardSwish": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Erf": "tanh",
                "Gelu": "gelu", "FastGelu": "gelu", "BiasGelu": "gelu", "QuickGelu": "silu", "Softplus": "sigmoid",
                "Softsign": "sigmoid", "Elu": "sigmoid", "Selu": "sigmoid", "Celu": "sigmoid", "Mish": "tanh",
                "Swish": "silu", "Silu": "silu"}
_REDUCTIONS = {"ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
               "ReduceSumSquare", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "TopK", "MaxPool",
               "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"}
_NORMS = {"LayerNormalization": "layernorm", "RMSNormalization": "rmsnorm",
          "SimplifiedLayerNormalization": "rmsnorm", "SkipSimplifiedLayerNormalization": "rmsnorm",
          "SkipLayerNormalization": "layernorm", "InstanceNormalization": "layernorm",
          "GroupNormalization": "layernorm"}
_GEMMS = {"MatMul", "MatMulInteger", "QLinearMatMul", "Gemm", "MatMulNBits", "Conv"}
_ATTENTIONS = {"Attention", "MultiHeadAttention", "GroupQueryAttention"}
_OTHER = {"Softmax", "LogSoftmax", "RotaryEmbedding"}

#: op types the importer converts (any domain among "", ai.onnx, com.microsoft)
SUPPORTED_OPS = frozenset(_FREE | _DATA | _ELEMENTWISE | set(_ACTIVATIONS) | _REDUCTIONS | set(_NORMS) | _GEMMS
                          | _ATTENTIONS | _OTHER)
_DOMAINS = ("", "ai.onnx", "com.microsoft")

# ONNX element type -> (IR dtype label, real bytes per element)
_ONNX_DTYPES = {
    1: ("fp32", 4), 10: ("fp16", 2), 16: ("bf16", 2), 11: ("fp32", 8),
    3: ("int8", 1), 2: ("int8", 1), 9: ("int8", 1), 22: ("int4", 0.5), 21: ("int4", 0.5),
    17: ("fp8", 1), 18: ("fp8", 1), 19: ("fp8", 1), 20: ("fp8", 1), 23: ("int4", 0.5), 24: ("fp8", 1),
    4: ("fp16", 2), 5: ("fp16", 2), 6: ("fp32", 4), 12: ("fp32", 4), 7: ("fp32", 8), 13: ("fp32", 8),
}
_FLOAT_TYPES = {1, 10, 11, 16, 17, 18, 19, 20, 23, 24}


def _require_onnx():
    if onnx is None:
        raise ConfigError("importing ONNX models needs the 'onnx' package: pip install onnx")


# ------------------------------------------------------------------------------------------
# loading and checks
# ------------------------------------------------------------------------------------------
def _read_model(path: Path):
    if not path.is_file():
        raise ConfigError(f"{path}: no such ONNX file")
    if path.stat().st_size == 0:  # protobuf reads an empty file as an empty model
        raise ConfigError(f"{path}: an empty file (0 bytes), not an ONNX model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and friends
        raise ConfigError(f"{path}: not a readable ONNX model ({type(exc).__name__}: {exc})") from None
    if not model.graph.node:
        raise ConfigError(f"{path}: the ONNX model's graph has no nodes (nothing to simulate)")
    if model.functions:
        try:
            model = onnx.inliner.inline_local_functions(model)
        except Exception as exc:
            raise ConfigError(f"{path}: cannot inline the model's local functions: {exc}") from None
    return model


def _all_tensors(graph):
    """Every TensorProto of a graph: initializers and Constant-node/attribute tensors, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.TENSORS:
                yield from attr.tensors
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_tensors(g)


def check_external_data(model, model_path: str | Path) -> list[str]:
    """Refuse external-data locations outside the model's folder; return the files referenced.

    A location must be a relative path without ``..`` components that, symlinks resolved,
    stays inside the folder holding the ``.onnx`` file. Nothing is read.

    Raises:
        ConfigError: an absolute path, a ``..`` component or an escaping symlink.
    """
    folder = Path(model_path).resolve().parent
    files = []
    for tensor in _all_tensors(model.graph):
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        loc = info.get("location", "")
        bad = (not loc or os.path.isabs(loc) or loc.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", loc)
               or ".." in re.split(r"[\\/]", loc))
        if not bad:
            try:
                (folder / loc).resolve().relative_to(folder)
            except ValueError:
                bad = True
        if bad:
            raise ConfigError(f"{model_path}: tensor {tensor.name!r} keeps its data in {loc!r}, outside the "
                              f"model's folder {folder}; refusing external data that is not a relative path "
                              f"inside that folder")
        files.append(loc)
    return sorted(set(files))


# ------------------------------------------------------------------------------------------
# symbolic dimensions
# ------------------------------------------------------------------------------------------
def _eval_dim_expr(expr: str, names: dict) -> int | None:
    """Value of a dim expression like ``past_sequence_length + 1`` (names, ints, + - * //)."""
    try:
        tree = ast.parse(expr, mode="eval")
    except SyntaxError:
        return None

    def ev(node):
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise KeyError(node.id)
            return names[node.id]
        if isinstance(node, ast.BinOp):
            a, b = ev(node.left), ev(node.right)
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.FloorDiv: lambda: a // b, ast.Div: lambda: a // b}
            if type(node.op) in ops:
                return ops[type(node.op)]()
        raise ValueError(ast.dump(node))

    try:
        return int(ev(tree))
    except (KeyError, ValueError, ZeroDivisionError):
        return None


def _dim_names(batch: int, seq_len: int, kv_len: int, dims: dict | None) -> dict:
    names = {}
    for group, value in ((BATCH_DIM_NAMES, batch), (SEQ_DIM_NAMES, seq_len), (PAST_DIM_NAMES, kv_len - seq_len),
                         (TOTAL_DIM_NAMES, kv_len)):
        for n in group:
            names[n] = value
    for k, v in (dims or {}).items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
            raise ConfigError(f"dims[{k!r}] must be a non-negative integer, got {v!r}")
        names[str(k)] = int(v)
    return names


def _bind_dims(model, names: dict, path) -> dict:
    """Set every symbolic dim of the graph inputs; return the names actually used."""
    init_names = {t.name for t in model.graph.initializer}
    used, unbound = {}, []
    for inp in model.graph.input:
        if inp.name in init_names or not inp.type.HasField("tensor_type"):
            continue
        shape = inp.type.tensor_type.shape
        for i, dim in enumerate(shape.dim):
            if dim.HasField("dim_value"):
                continue
            param = dim.dim_param
            value = names.get(param) if param else None
            if value is None and param:
                value = names.get(param.lower())
            if value is None and param:
                value = _eval_dim_expr(param, names)
            if value is None:
                unbound.append(f"{inp.name}[{i}] ({param!r})" if param else f"{inp.name}[{i}] (unnamed)")
                continue
            used[param or f"{inp.name}[{i}]"] = value
            dim.dim_value = int(value)
    if unbound:
        raise ConfigError(f"{path}: symbolic input dimension(s) without a value: {', '.join(unbound)}; "
                          f"give them with dims={{'name': value}} (CLI: --dim name=value); batch, sequence, "
                          f"past and total names bound automatically: {BATCH_DIM_NAMES[0]}, {SEQ_DIM_NAMES[0]}, "
                          f"{PAST_DIM_NAMES[0]}, {TOTAL_DIM_NAMES[0]} and their usual variants")
    return used


# ------------------------------------------------------------------------------------------
# constant folding (values of small compile-time tensors) and shape inference
# ------------------------------------------------------------------------------------------
def _attrs(node) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _np_dtype(onnx_type: int):
    return helper.tensor_dtype_to_np_dtype(onnx_type)


def _int_div(a, b):
    if np.issubdtype(np.result_type(a, b), np.integer):
        return (np.trunc(np.true_divide(a, b))).astype(np.result_type(a, b))
    return np.true_divide(a, b)


_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": _int_div, "Pow": np.power,
           "Equal": np.equal, "Less": np.less, "Greater": np.greater, "LessOrEqual": np.less_equal,
           "GreaterOrEqual": np.greater_equal, "And": np.logical_and, "Or": np.logical_or, "Xor": np.logical_xor,
           "BitwiseAnd": np.bitwise_and, "BitwiseOr": np.bitwise_or}
_UNARY = {"Neg": np.negative, "Not": np.logical_not, "Abs": np.abs, "Sqrt": np.sqrt, "Reciprocal": np.reciprocal,
          "Floor": np.floor, "Ceil": np.ceil, "Exp": np.exp, "Log": np.log, "Sin": np.sin, "Cos": np.cos,
          "IsNaN": np.isnan, "Sign": np.sign, "Identity": lambda x: x, "Round": np.round}


def _axes_arg(node, vals, attrs, index=1):
    if len(node.input) > index and node.input[index]:
        v = vals[index]
        return None if v is None else [int(a) for a in np.asarray(v).reshape(-1)]
    a = attrs.get("axes")
    return None if a is None else [int(x) for x in a]


def _fold_node(node, vals: list, in_shapes: list):
    """NumPy value of a compile-time node's first output, or None when not handled."""
    op, at = node.op_type, _attrs(node)
    if op == "Constant":
        if "value" in at:
            return numpy_helper.to_array(at["value"])
        for key, dt in (("value_float", np.float32), ("value_floats", np.float32), ("value_int", np.int64),
                        ("value_ints", np.int64)):
            if key in at:
                return np.asarray(at[key], dtype=dt)
        return None
    if op in ("Shape", "Size"):
        s = in_shapes[0]
        if s is None:
            return None
        if op == "Size":
            return np.asarray(math.prod(s), dtype=np.int64)
        start, end = at.get("start", 0), at.get("end", None)
        return np.asarray(s[start:end] if end is not None else s[start:], dtype=np.int64)
    need = [v for i, v in enumerate(vals) if node.input[i]]
    if any(v is None for v in need):
        return None
    x = vals[0] if vals else None
    if op in _BINARY:
        return np.asarray(_BINARY[op](vals[0], vals[1]))
    if op in _UNARY:
        return np.asarray(_UNARY[op](x))
    if op in ("Max", "Min", "Sum"):
        f = {"Max": np.maximum, "Min": np.minimum, "Sum": np.add}[op]
        out = vals[0]
        for v in vals[1:]:
            out = f(out, v)
        return np.asarray(out)
    if op == "Cast":
        return x.astype(_np_dtype(at["to"]))
    if op == "CastLike":
        return x.astype(vals[1].dtype)
    if op == "Gather":
        return np.take(x, vals[1].astype(np.int64), axis=at.get("axis", 0))
    if op == "Concat":
        return np.concatenate([np.atleast_1d(v) if v.ndim == 0 else v for v in vals if v is not None],
                              axis=at.get("axis", 0))
    if op == "Unsqueeze":
        axes = _axes_arg(node, vals, at)
        out = x
        for a in sorted(a % (x.ndim + len(axes)) for a in axes):
            out = np.expand_dims(out, a)
        return out
    if op == "Squeeze":
        axes = _axes_arg(node, vals, at)
        return np.squeeze(x) if axes is None else np.squeeze(x, axis=tuple(axes))
    if op == "Reshape":
        shape = [int(s) for s in vals[1]]
        if not at.get("allowzero", 0):
            shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
        return x.reshape(shape)
    if op == "Slice":
        if len(node.input) > 1:
            starts, ends = vals[1], vals[2]
            axes = vals[3] if len(vals) > 3 and node.input[3] else range(len(starts))
            steps = vals[4] if len(vals) > 4 and node.input[4] else [1] * len(starts)
        else:
            starts, ends = at["starts"], at["ends"]
            axes, steps = at.get("axes", range(len(starts))), [1] * len(starts)
        index = [slice(None)] * x.ndim
        for s, e, a, st in zip(starts, ends, axes, steps):
            index[int(a)] = slice(int(s), int(e), int(st))
        return x[tuple(index)]
    if op == "Where":
        return np.where(vals[0], vals[1], vals[2])
    if op == "Range":
        return np.arange(x, vals[1], vals[2]).astype(np.result_type(x))
    if op == "Expand":
        return np.array(np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(int(v) for v in vals[1]))))
    if op == "ConstantOfShape":
        fill = numpy_helper.to_array(at["value"]) if "value" in at else np.zeros(1, np.float32)
        return np.full(tuple(int(v) for v in x), fill.reshape(-1)[0], dtype=fill.dtype)
    if op == "Transpose":
        return np.transpose(x, at.get("perm"))
    if op == "Tile":
        return np.tile(x, [int(v) for v in vals[1]])
    if op in ("ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceMean"):
        axes = _axes_arg(node, vals, at)
        f = {"ReduceProd": np.prod, "ReduceSum": np.sum, "ReduceMax": np.max, "ReduceMin": np.min,
             "ReduceMean": np.mean}[op]
        axis = None if not axes else tuple(int(a) for a in axes)
        return np.asarray(f(x, axis=axis, keepdims=bool(at.get("keepdims", 1))))
    if op == "CumSum":
        axis = int(vals[1])
        y = np.flip(x, axis) if at.get("reverse") else x
        out = np.cumsum(y, axis=axis)
        if at.get("exclusive"):
            out = out - y
        out = np.flip(out, axis) if at.get("reverse") else out
        return out.astype(x.dtype)
    if op == "Mod":
        return np.fmod(x, vals[1]) if at.get("fmod") else np.mod(x, vals[1])
    return None


def _shape_of(vi):
    t = vi.type.tensor_type
    if not t.HasField("shape"):
        return None
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value") or d.dim_value < 0:
            return None
        dims.append(int(d.dim_value))
    return tuple(dims)


@dataclass
class _Tensors:
    """Shapes, element types, compile-time flags and small values of every tensor."""

    shapes: dict = field(default_factory=dict)
    types: dict = field(default_factory=dict)
    values: dict = field(default_factory=dict)
    static: set = field(default_factory=set)
    initializers: dict = field(default_factory=dict)  # name -> TensorProto
    declared: set = field(default_factory=set)  # shapes we inferred ourselves (contrib ops)

    def numel(self, name) -> int | None:
        s = self.shapes.get(name)
        return None if s is None else math.prod(s)


def _topo_sort(graph, path) -> list:
    """Nodes in a dependency order (ONNX requires one; this tolerates files that break it)."""
    nodes = list(graph.node)
    produced = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [{produced[x] for x in n.input if x in produced} for n in nodes]
    users = defaultdict(list)
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    indeg = [len(d) for d in deps]
    ready = [i for i, d in enumerate(indeg) if d == 0]
    order = []
    heapq.heapify(ready)
    while ready:
        i = heapq.heappop(ready)
        order.append(nodes[i])
        for j in users[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, j)
    if len(order) != len(nodes):
        raise ConfigError(f"{path}: the graph has a cycle; not a valid ONNX model")
    return order


def _infer_tensors(model, nodes, path) -> _Tensors:
    """Shapes of all tensors (bound inputs), alternating ONNX inference and constant folding."""
    g = model.graph
    info = _Tensors()
    for init in g.initializer:
        info.initializers[init.name] = init
        info.static.add(init.name)
        info.shapes[init.name] = tuple(int(d) for d in init.dims)
        info.types[init.name] = init.data_type
        if init.data_location != TensorProto.EXTERNAL and math.prod(init.dims) <= FOLD_VALUE_MAX_ELEMENTS:
            try:
                info.values[init.name] = numpy_helper.to_array(init)
            except Exception:
                pass
    for vi in g.input:
        if vi.name not in info.initializers and vi.type.HasField("tensor_type"):
            info.shapes[vi.name] = _shape_of(vi)
            info.types[vi.name] = vi.type.tensor_type.elem_type
    for node in nodes:  # compile-time flags
        ins = [x for x in node.input if x]
        if node.op_type in ("Shape", "Size", "Constant") or (ins and all(x in info.static for x in ins)
                                                             and not node.op_type.startswith("Random")):
            info.static.update(o for o in node.output if o)

    for _ in range(_MAX_INFER_ROUNDS):
        inferred = _run_shape_inference(_shadow_model(model, nodes, info), path, model)
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            s = _shape_of(vi)
            if s is not None and info.shapes.get(vi.name) is None:
                info.shapes[vi.name] = s
            if vi.type.tensor_type.elem_type and vi.name not in info.types:
                info.types[vi.name] = vi.type.tensor_type.elem_type
        new_contrib = _contrib_shapes(nodes, info)
        if not _fold_values(nodes, info) and not new_contrib:
            break
    return info


def _contrib_output_shapes(node, shapes: list, at: dict) -> list:
    """Output shapes of the com.microsoft ops we convert (ONNX's inference does not know
    them): one entry per output, None where not needed."""
    op, x = node.op_type, shapes[0] if shapes else None
    if x is None:
        return []
    if op in ("SimplifiedLayerNormalization", "LayerNormalization", "RMSNormalization", "FastGelu", "BiasGelu",
              "QuickGelu", "Gelu", "RotaryEmbedding"):
        return [x]
    if op in ("SkipSimplifiedLayerNormalization", "SkipLayerNormalization"):
        return [x, None, None, x]
    if op == "MatMulNBits":
        return [x[:-1] + (int(at["N"]),)]
    heads = int(at.get("num_heads", 1))
    if op == "MultiHeadAttention":
        if len(x) == 5:  # packed QKV [B, S, N, 3, H]
            return [(x[0], x[1], x[2] * x[4])]
        v = shapes[2] if len(shapes) > 2 else None
        if v is None:
            return []
        return [(x[0], x[1], v[1] * v[3] if len(v) == 4 else v[2])]
    if op == "GroupQueryAttention":
        kv_heads = int(at.get("kv_num_heads", heads))
        packed = len(node.input) < 2 or not node.input[1]
        hd = x[2] // (heads + 2 * kv_heads) if packed else x[2] // heads
        return [(x[0], x[1], heads * hd)]
    if op == "Attention" and node.domain == "com.microsoft":
        w = shapes[1] if len(shapes) > 1 else None
        if w is None:
            return []
        sizes = at.get("qkv_hidden_sizes") or [w[1] // 3] * 3
        return [(x[0], x[1], int(sizes[2]))]
    return []


def _contrib_shapes(nodes, info: _Tensors) -> bool:
    """Fill in output shapes ONNX inference left unknown for the onnxruntime ops we convert
    (com.microsoft domain, or the default domain as onnxruntime's tools write some of them);
    True if anything new."""
    new = False
    for node in nodes:
        if node.domain not in _DOMAINS or all(info.shapes.get(o) is not None for o in node.output if o):
            continue
        outs = _contrib_output_shapes(node, [info.shapes.get(x) if x else None for x in node.input], _attrs(node))
        for name, shape in zip(node.output, outs):
            if name and shape is not None and info.shapes.get(name) is None:
                info.shapes[name] = tuple(int(d) for d in shape)
                info.types.setdefault(name, info.types.get(node.input[0], TensorProto.FLOAT))
                info.declared.add(name)
                new = True
    return new


def _fold_values(nodes, info: _Tensors) -> bool:
    """Evaluate compile-time nodes whose inputs have values; True if anything new was found."""
    new = False
    for node in nodes:
        out = node.output[0] if node.output else ""
        if not out or out not in info.static or out in info.values:
            continue
        known = info.shapes.get(out)
        if known is not None and math.prod(known) > FOLD_VALUE_MAX_ELEMENTS:
            continue
        vals = [info.values.get(x) if x else None for x in node.input]
        in_shapes = [info.shapes.get(x) for x in node.input]
        try:
            with np.errstate(all="ignore"):
                value = _fold_node(node, vals, in_shapes)
        except Exception:
            value = None
        if value is None or value.size > FOLD_VALUE_MAX_ELEMENTS:
            continue
        value = np.asarray(value)
        info.values[out] = value
        info.shapes[out] = tuple(int(d) for d in value.shape)
        if out not in info.types:
            try:
                info.types[out] = helper.np_dtype_to_tensor_dtype(value.dtype)
            except Exception:
                pass
        new = True
    return new


def _shadow_model(model, nodes, info: _Tensors):
    """A weight-free copy for shape inference: large or external initializers become inputs
    with their shapes, folded values become initializers (their nodes dropped)."""
    g = model.graph
    inputs = [vi for vi in g.input if vi.name not in info.initializers]
    input_names = {vi.name for vi in inputs}
    inits = []
    for name, init in info.initializers.items():
        if name in info.values:
            inits.append(init)
        elif name not in input_names:
            inputs.append(helper.make_tensor_value_info(name, init.data_type, list(init.dims)))
            input_names.add(name)
    kept = []
    for node in nodes:
        outs = [o for o in node.output if o]
        if outs and all(o in info.values for o in outs) and all(o not in info.initializers for o in outs):
            for o in outs:
                try:
                    inits.append(numpy_helper.from_array(info.values[o], o))
                except Exception:
                    kept.append(node)
                    break
            continue
        kept.append(node)
    outputs = []
    for vi in g.output:
        t = vi.type.tensor_type
        outputs.append(helper.make_tensor_value_info(vi.name, t.elem_type, None))
    declared = [helper.make_tensor_value_info(n, info.types.get(n, TensorProto.FLOAT), list(info.shapes[n]))
                for n in sorted(info.declared)]
    graph = helper.make_graph(kept, g.name or "graph", inputs, outputs, initializer=inits, value_info=declared)
    return helper.make_model(graph, opset_imports=list(model.opset_import), ir_version=max(model.ir_version, 4))


def _run_shape_inference(shadow, path, original):
    try:
        return _si.infer_shapes(shadow, check_type=False, strict_mode=False, data_prop=True)
    except Exception as exc:
        first = exc
    try:  # the file-path variant (no 2 GB protobuf limit in memory)
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = os.path.join(tmp, "in.onnx"), os.path.join(tmp, "out.onnx")
            onnx.save(shadow, src)
            _si.infer_shapes_path(src, dst, check_type=False, strict_mode=False, data_prop=True)
            return onnx.load(dst, load_external_data=False)
    except Exception:
        raise ConfigError(f"{path}: ONNX shape inference failed: {first}") from None


# ------------------------------------------------------------------------------------------
# conversion
# ------------------------------------------------------------------------------------------
_LAYER_RE = re.compile(r"(?:^|[./_:\s\[])(?:layers|layer|h|blocks|block|decoder_layers)[._](\d+)(?=[._/\s:\]]|$)")


def _layer_of(node) -> int:
    texts = [node.name] + [p.value for p in node.metadata_props
                           if p.key in ("namespace", "pkg.torch.onnx.name_scopes")]
    for text in texts:
        m = _LAYER_RE.search(text)
        if m:
            return int(m.group(1))
    return -1


def _past_len(past) -> int:
    """Cached positions of a past_key input [B, kv_heads, P, head_dim]."""
    return past[2] if past is not None and len(past) == 4 else 0


def _spec_onnx_attention(at, shapes, has_kv, has_mask, bound_kv_len):
    """ONNX Attention (opset 23): Q/K/V 4-D [B, heads, S, D] or 3-D [B, S, heads*D]; past at input 4."""
    qs, ks, vs = shapes[0], shapes[1], shapes[2]
    if ks is None or vs is None:
        return None
    if len(qs) == 4:
        batch, heads, q_len, hd = qs
    else:
        batch, q_len, heads = qs[0], qs[1], int(at.get("q_num_heads", 1))
        hd = qs[2] // heads
    if len(ks) == 4:
        kvh, kv_new, vd = ks[1], ks[2], vs[3]
    else:
        kvh = int(at.get("kv_num_heads", heads))
        kv_new, vd = ks[1], vs[2] // kvh
    causal = bool(at.get("is_causal", 0)) or (has_mask and q_len > 1)
    return dict(batch=batch, heads=heads, kv_heads=kvh, q_len=q_len, kv_len=_past_len(shapes[4]) + kv_new,
                head_dim=hd, v_head_dim=vd, causal=causal)


def _spec_mha(at, shapes, has_kv, has_mask, bound_kv_len):
    """com.microsoft MultiHeadAttention: query [B, S, D] (or packed [B, S, N, 3, H]); key/value
    [B, L, D] or [B, N, L, H]; past at input 6; causal only when ``unidirectional``."""
    qs, ks, vs = shapes[0], shapes[1], shapes[2]
    heads = int(at.get("num_heads", 1))
    batch, q_len = qs[0], qs[1]
    if not has_kv:
        if len(qs) != 5:
            return None
        hd = vd = qs[4]
        kv_new = q_len
    else:
        if ks is None or vs is None:
            return None
        hd = qs[2] // heads if len(qs) == 3 else qs[-1]
        kv_new = ks[2] if len(ks) == 4 else ks[1]
        vd = vs[3] if len(vs) == 4 else vs[2] // heads
    return dict(batch=batch, heads=heads, kv_heads=heads, q_len=q_len, kv_len=_past_len(shapes[6]) + kv_new,
                head_dim=hd, v_head_dim=vd, causal=bool(at.get("unidirectional", 0)) and q_len > 1)


def _spec_gqa(at, shapes, has_kv, has_mask, bound_kv_len):
    """com.microsoft GroupQueryAttention (always causal): query [B, S, N*H] (packed with K and V
    when key is absent); with a past buffer the context is the bound ``kv_len`` (the buffer may
    be sized for the longest sequence)."""
    qs = shapes[0]
    heads, kvh = int(at.get("num_heads", 1)), int(at.get("kv_num_heads", 1))
    batch, q_len = qs[0], qs[1]
    hd = qs[2] // heads if has_kv else qs[2] // (heads + 2 * kvh)
    kv_len = max(bound_kv_len, q_len) if shapes[3] is not None else q_len
    return dict(batch=batch, heads=heads, kv_heads=kvh, q_len=q_len, kv_len=kv_len, head_dim=hd, v_head_dim=hd,
                causal=q_len > 1)


def _spec_ms_attention(at, shapes):
    """com.microsoft Attention (BERT/GPT-2 style): input [B, S, D_in] x weights [D_in, Dq+Dk+Dv]
    inside the op, past [2, B, N, P, H] at input 4, causal when ``unidirectional``."""
    qs, ws = shapes[0], shapes[1]
    if ws is None or len(qs) != 3:
        return None
    heads = int(at.get("num_heads", 1))
    sizes = at.get("qkv_hidden_sizes") or [ws[1] // 3] * 3
    past = shapes[4]
    p_len = past[3] if past is not None and len(past) == 5 else 0
    return dict(qkv=dict(m=qs[0] * qs[1], k=qs[2], n=ws[1]), batch=qs[0], heads=heads, kv_heads=heads,
                q_len=qs[1], kv_len=p_len + qs[1], head_dim=sizes[0] // heads, v_head_dim=sizes[2] // heads,
                causal=bool(at.get("unidirectional", 0)) and qs[1] > 1)


@dataclass
class _Group:
    """Nodes fused into one (or a few) IR ops, emitted when the anchor (last node) is reached."""

    kind: str
    anchor: int
    members: set
    external: list  # input tensors from outside the group
    spec: dict


class _Converter:
    def __init__(self, model, nodes, info: _Tensors, path, dtype, allow_unsupported, seq_len, kv_len):
        self.model, self.nodes, self.info, self.path = model, nodes, info, path
        self.dtype_override = dtype
        self.allow_unsupported = allow_unsupported
        self.seq_len, self.kv_len = seq_len, kv_len
        self.producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
        self.consumers = defaultdict(list)
        for i, n in enumerate(nodes):
            for x in n.input:
                if x:
                    self.consumers[x].append(i)
        self.group_of: dict[int, _Group] = {}
        self.ops: list[Op] = []
        self.names: set[str] = set()
        self.made: dict[str, tuple[str, ...]] = {}  # tensor -> IR ops it depends on
        self.patterns = defaultdict(int)
        self.unsupported: list[dict] = []
        self.unknown_shapes: list[str] = []
        self.folded = 0

    # -- helpers ---------------------------------------------------------------------------
    def is_static(self, t: str) -> bool:
        return t in self.info.static

    def shape(self, t: str):
        return self.info.shapes.get(t)

    def numel(self, t: str) -> int:
        s = self.shape(t)
        if s is None:
            raise _UnknownShape(t)
        return math.prod(s)

    def dyn_consumers(self, t: str) -> list[int]:
        """Consumers of ``t`` that are not compile-time nodes (Shape of t does not count)."""
        return [i for i in self.consumers.get(t, []) if not all(o in self.info.static for o in self.nodes[i].output
                                                                if o)]

    def dtype(self, t: str) -> str:
        et = self.info.types.get(t, TensorProto.FLOAT)
        if self.dtype_override and et in _FLOAT_TYPES:
            return self.dtype_override
        return _ONNX_DTYPES.get(et, ("fp32", 4))[0]

    def nbytes(self, t: str) -> int:
        et = self.info.types.get(t, TensorProto.FLOAT)
        if self.dtype_override and et in _FLOAT_TYPES:
            size = DTYPE_BYTES[self.dtype_override]
        else:
            size = _ONNX_DTYPES.get(et, ("fp32", 4))[1]
        return int(math.ceil(self.numel(t) * size))

    def weight_root(self, t: str) -> str:
        """The initializer a compile-time tensor derives from (through Transpose/Cast/...)."""
        seen = 0
        while t not in self.info.initializers and t in self.producer and seen < 16:
            node = self.nodes[self.producer[t]]
            cands = [x for x in node.input if x and x in self.info.static and (self.numel_or0(x) > 1)]
            if not cands:
                break
            t = max(cands, key=self.numel_or0)
            seen += 1
        return t

    def numel_or0(self, t):
        s = self.shape(t)
        return math.prod(s) if s is not None else 0

    def deps(self, tensors) -> tuple[str, ...]:
        out: dict[str, None] = {}
        for t in tensors:
            if t and not self.is_static(t):
                for d in self.made.get(t, ()):
                    out[d] = None
        return tuple(out)

    def unique(self, base: str) -> str:
        name = base or "op"
        k = 1
        while name in self.names:
            k += 1
            name = f"{base}#{k}"
        self.names.add(name)
        return name

    def node_name(self, idx: int) -> str:
        n = self.nodes[idx]
        return n.name or f"{n.op_type}_{idx}"

    # -- pattern matching ------------------------------------------------------------------
    def free_for(self, t: str, allowed: set) -> bool:
        """``t``'s dynamic consumers are all in ``allowed``."""
        return all(c in allowed for c in self.dyn_consumers(t))

    def trace_kv(self, t: str, limit: int = 12):
        """Walk back from an attention K/V (or Q) input over layout/repeat ops.

        Returns (source tensor, absorbed node indices, head-repeat ratio)."""
        absorbed, ratio = [], 1
        for _ in range(limit):
            p = self.producer.get(t)
            if p is None or self.is_static(t) or p in self.group_of:
                break
            node = self.nodes[p]
            op = node.op_type
            if len(self.dyn_consumers(t)) != 1:
                break
            if op in ("Reshape", "Expand", "Unsqueeze", "Squeeze", "Transpose", "Cast", "Identity"):
                src = node.input[0]
            elif op in ("Mul", "Div") and len(node.input) == 2 and self.is_static(node.input[1]) \
                    and self.numel_or0(node.input[1]) <= 1:
                src = node.input[0]
            elif op == "Mul" and self.is_static(node.input[0]) and self.numel_or0(node.input[0]) <= 1:
                src = node.input[1]
            else:
                break
            if self.is_static(src):
                break
            if op == "Expand":
                n_in, n_out = self.numel_or0(src), self.numel_or0(node.output[0])
                if n_in and n_out % n_in == 0:
                    ratio *= n_out // n_in
            absorbed.append(p)
            t = src
        return t, absorbed, ratio

    def match_patterns(self):
        for i, node in enumerate(self.nodes):
            if i in self.group_of or self.is_static(node.output[0] if node.output else ""):
                continue
            if node.op_type == "Softmax":
                self.match_attention_chain(i)
        for i, node in enumerate(self.nodes):
            if i in self.group_of or not node.output or self.is_static(node.output[0]):
                continue
            if node.op_type in _ATTENTIONS:
                self.match_fused_attention(i)
            elif node.op_type == "ReduceMean":
                self.match_rmsnorm(i)
        for i, node in enumerate(self.nodes):
            if i in self.group_of or not node.output or self.is_static(node.output[0]):
                continue
            if node.op_type == "Sigmoid":
                self.match_silu(i)
            elif node.op_type == "Add":
                self.match_rope(i)

    def add_group(self, kind, members, external, spec):
        members = set(members)
        if members & set(self.group_of):
            return False
        anchor = max(members)
        g = _Group(kind, anchor, members, external, spec)
        for m in members:
            self.group_of[m] = g
        return True

    def match_silu(self, i):
        node = self.nodes[i]
        x, s = node.input[0], node.output[0]
        cons = self.dyn_consumers(s)
        if len(cons) != 1:
            return
        mul = self.nodes[cons[0]]
        if mul.op_type != "Mul" or set(mul.input) != {x, s} or cons[0] in self.group_of:
            return
        if self.add_group("silu", {i, cons[0]}, [x], {"out": mul.output[0]}):
            self.patterns["silu"] += 1

    def match_rope(self, a):
        """Add(Mul(x, cos), Mul(Concat(Neg(Slice(x)), Slice(x)), sin)) with compile-time cos/sin
        (rotate-half RoPE as Llama/Qwen exports write it)."""
        add = self.nodes[a]
        prods = [self.producer.get(t) for t in add.input]
        if len(prods) != 2 or None in prods or any(self.nodes[p].op_type != "Mul" for p in prods):
            return
        for p_cos, p_sin in (prods, prods[::-1]):
            mc, msn = self.nodes[p_cos], self.nodes[p_sin]
            cos_x = [v for v in mc.input if not self.is_static(v)]
            rot = [v for v in msn.input if not self.is_static(v)]
            if len(cos_x) != 1 or len(rot) != 1 or len(mc.input) != 2 or len(msn.input) != 2:
                continue
            x, r = cos_x[0], rot[0]
            pc = self.producer.get(r)
            if pc is None or self.nodes[pc].op_type != "Concat" or len(self.nodes[pc].input) != 2:
                continue
            halves = [self.producer.get(t) for t in self.nodes[pc].input]
            if None in halves:
                continue
            neg = halves[0] if self.nodes[halves[0]].op_type == "Neg" else None
            if neg is None:
                continue
            s1 = self.producer.get(self.nodes[neg].input[0])
            s2 = halves[1]
            if s1 is None or any(self.nodes[s].op_type != "Slice" or self.nodes[s].input[0] != x for s in (s1, s2)):
                continue
            members = {a, p_cos, p_sin, pc, neg, s1, s2}
            for m in members - {a}:
                if not self.free_for(self.nodes[m].output[0], members):
                    return
            if self.add_group("rope", members, [x], {"x": x}):
                self.patterns["rope (rotate-half)"] += 1
            return

    def _single(self, t, op_types):
        cons = self.dyn_consumers(t)
        if len(cons) == 1 and self.nodes[cons[0]].op_type in op_types and cons[0] not in self.group_of:
            return cons[0]
        return None

    def match_rmsnorm(self, r):
        """Pow(x,2)|Mul(x,x) -> ReduceMean(last) -> Add(eps) -> Sqrt -> Reciprocal|Div -> Mul(x) [-> Mul(g)]."""
        red = self.nodes[r]
        sq_idx = self.producer.get(red.input[0])
        if sq_idx is None or sq_idx in self.group_of:
            return
        sq = self.nodes[sq_idx]
        if sq.op_type == "Pow":
            exp = self.info.values.get(sq.input[1])
            if exp is None or exp.size != 1 or float(exp.reshape(-1)[0]) != 2.0:
                return
        elif not (sq.op_type == "Mul" and sq.input[0] == sq.input[1]):
            return
        x = sq.input[0]
        xs = self.shape(x)
        if xs is None or not xs:
            return
        at = _attrs(red)
        axes = at.get("axes")
        if len(red.input) > 1 and red.input[1]:
            v = self.info.values.get(red.input[1])
            axes = None if v is None else [int(a) for a in v.reshape(-1)]
        if axes is None or [a % len(xs) for a in axes] != [len(xs) - 1] or not at.get("keepdims", 1):
            return
        if self.dyn_consumers(sq.output[0]) != [r]:
            return
        members = [sq_idx, r]
        add = self._single(red.output[0], {"Add"})
        if add is None or not any(self.is_static(v) for v in self.nodes[add].input):
            return
        members.append(add)
        sqrt = self._single(self.nodes[add].output[0], {"Sqrt"})
        if sqrt is None:
            return
        members.append(sqrt)
        nxt = self._single(self.nodes[sqrt].output[0], {"Reciprocal", "Div"})
        if nxt is None:
            return
        members.append(nxt)
        if self.nodes[nxt].op_type == "Reciprocal":
            scale = self._single(self.nodes[nxt].output[0], {"Mul"})
            if scale is None:
                return
            chain_t = self.nodes[nxt].output[0]
        else:
            scale, chain_t = nxt, self.nodes[sqrt].output[0]
            if self.nodes[nxt].input[1] != chain_t:
                return
        other = [v for v in self.nodes[scale].input if v != chain_t]
        roots = {x}
        px = self.producer.get(x)
        if px is not None and self.nodes[px].op_type == "Cast":
            roots.add(self.nodes[px].input[0])
        if len(other) != 1:
            return
        o = other[0]
        po = self.producer.get(o)
        cast_of_root = po is not None and self.nodes[po].op_type == "Cast" and self.nodes[po].input[0] in roots
        if not (o in roots or cast_of_root):
            return
        if scale not in members:
            members.append(scale)
        out = self.nodes[scale].output[0]
        for _ in range(2):  # optional Cast and Mul(gamma)
            nxt = self._single(out, {"Cast", "Mul"})
            if nxt is None:
                break
            n = self.nodes[nxt]
            if n.op_type == "Mul" and not any(self.is_static(v) for v in n.input if v != out):
                break
            members.append(nxt)
            out = n.output[0]
            if n.op_type == "Mul":
                break
        inner = members[:-1]
        for m in inner:
            if not all(self.free_for(o, set(members)) for o in self.nodes[m].output if o):
                return
        if self.add_group("rmsnorm", members, [x], {"x": x, "out": out}):
            self.patterns["rmsnorm"] += 1

    def match_attention_chain(self, s):
        """MatMul(Q, K^T) [-> scale/mask] -> Softmax [-> IsNaN/Where/Cast] -> MatMul(P, V)."""
        sm = self.nodes[s]
        ss = self.shape(sm.output[0])
        if ss is None or len(ss) < 2:
            return
        axis = _attrs(sm).get("axis", -1)
        if axis % len(ss) != len(ss) - 1:
            return
        # backwards to the score MatMul
        back, masks, t = [], [], sm.input[0]
        for _ in range(8):
            p = self.producer.get(t)
            if p is None or p in self.group_of or len(self.dyn_consumers(t)) != 1:
                return
            n = self.nodes[p]
            if n.op_type == "MatMul":
                break
            if n.op_type not in ("Add", "Where", "Mul", "Div", "Cast", "Sub"):
                return
            cands = [v for v in n.input if v and not self.is_static(v) and self.shape(v) == self.shape(n.output[0])]
            if n.op_type == "Where":
                cands = [v for v in n.input[1:] if v in cands] or cands
            if not cands:
                return
            main = next((v for v in cands if self.producer.get(v) is not None
                         and self.nodes[self.producer[v]].op_type in ("MatMul", "Add", "Where", "Mul", "Div",
                                                                      "Cast", "Sub")), cands[0])
            masks += [v for v in n.input if v and v != main and not self.is_static(v)]
            if any(self.is_static(v) for v in n.input if v and v != main) and n.op_type in ("Add", "Where"):
                masks.append("<static mask>")
            back.append(p)
            t = main
        else:
            return
        m1 = self.producer.get(t)
        if m1 is None or self.nodes[m1].op_type != "MatMul" or m1 in self.group_of:
            return
        q_in, k_in = self.nodes[m1].input[0], self.nodes[m1].input[1]
        if self.is_static(q_in) or self.is_static(k_in):
            return
        # forwards to the value MatMul
        fwd, frontier, m2 = [], [sm.output[0]], None
        inside = set()
        for _ in range(8):
            if not frontier:
                break
            t2 = frontier.pop()
            for c in self.dyn_consumers(t2):
                n = self.nodes[c]
                if n.op_type == "MatMul" and n.input[0] == t2:
                    if m2 not in (None, c):
                        return
                    m2 = c
                elif n.op_type in ("Where", "IsNaN", "Cast", "Dropout", "Identity") and c not in inside:
                    inside.add(c)
                    fwd.append(c)
                    frontier.append(n.output[0])
                elif c not in inside:
                    return
        if m2 is None or m2 in self.group_of:
            return
        v_in = self.nodes[m2].input[1]
        if self.is_static(v_in):
            return
        members = set(back) | {m1, s, m2} | set(fwd)
        chain_outputs = {self.nodes[i].output[0] for i in members}
        for i in members - {m2}:
            for o in self.nodes[i].output:
                if o and not self.free_for(o, members):
                    return
        q_src, q_abs, _ = self.trace_kv(q_in)
        k_src, k_abs, k_ratio = self.trace_kv(k_in)
        v_src, v_abs, _ = self.trace_kv(v_in)
        qs, ks, vs = self.shape(q_in), self.shape(k_in), self.shape(v_in)
        if None in (qs, ks, vs) or len(qs) < 2 or len(ks) < 2 or len(vs) < 2:
            return
        if qs[-1] != ks[-2] or ks[-1] != vs[-2]:
            return
        members |= set(q_abs) | set(k_abs) | set(v_abs)
        external = [q_src, k_src, v_src] + [m for m in masks if m != "<static mask>" and m not in chain_outputs]
        heads = qs[-3] if len(qs) >= 3 else 1
        spec = dict(batch=math.prod(qs[:-3]) if len(qs) >= 4 else 1, heads=heads,
                    kv_heads=heads // k_ratio if k_ratio > 1 and heads % k_ratio == 0 else heads,
                    q_len=qs[-2], kv_len=ks[-1], head_dim=qs[-1], v_head_dim=vs[-1],
                    causal=bool(masks) and qs[-2] > 1, dtype_of=q_in, out=self.nodes[m2].output[0])
        if self.add_group("attention", members, external, spec):
            self.patterns["attention (MatMul-Softmax-MatMul)"] += 1

    def match_fused_attention(self, i):
        """ONNX Attention (opset 23) and com.microsoft MultiHeadAttention / GroupQueryAttention /
        Attention -> one attention op (plus the QKV GEMM of com.microsoft Attention)."""
        node, at = self.nodes[i], _attrs(self.nodes[i])
        ins = list(node.input) + [""] * 8
        shapes = [self.shape(x) if x else None for x in ins]
        if shapes[0] is None:
            return
        members, external = {i}, [ins[0]]
        if node.op_type == "Attention" and node.domain == "com.microsoft":
            spec = _spec_ms_attention(at, shapes)
            if spec is None:
                return
            spec["qkv"]["weight"] = self.is_static(ins[1])
            spec["qkv"]["w"] = ins[1]
            external.append(ins[3])
        else:
            k_src, k_abs, ratio = self.trace_kv(ins[1]) if ins[1] else ("", [], 1)
            v_src, v_abs, _ = self.trace_kv(ins[2]) if ins[2] else ("", [], 1)
            mask_i = {"Attention": 3, "MultiHeadAttention": 4}.get(node.op_type)
            has_mask = mask_i is not None and bool(ins[mask_i])
            make = {"Attention": _spec_onnx_attention, "MultiHeadAttention": _spec_mha,
                    "GroupQueryAttention": _spec_gqa}[node.op_type]
            spec = make(at, shapes, bool(ins[1]), has_mask, self.kv_len)
            if spec is None:
                return
            heads = spec["heads"]
            if spec["kv_heads"] == heads and ratio > 1 and heads % ratio == 0:
                spec["kv_heads"] = heads // ratio  # K/V were repeated to all heads before the op
            members |= set(k_abs) | set(v_abs)
            external += [k_src, v_src] + ([ins[mask_i]] if has_mask and not self.is_static(ins[mask_i]) else [])
        spec.update(dtype_of=ins[0], out=node.output[0])
        if self.add_group("attention", members, [x for x in external if x], spec):
            self.patterns[f"attention ({node.op_type})"] += 1

    # -- emission --------------------------------------------------------------------------
    def emit(self, op: Op, outputs) -> None:
        self.ops.append(op)
        for o in outputs:
            if o:
                self.made[o] = (op.name,)

    def passthrough(self, node) -> None:
        d = self.deps(node.input)
        for o in node.output:
            if o:
                self.made[o] = d

    def vector(self, idx, node, op_class, elements, *, fn=None, row_len=None, suffix="", inputs=None, out=None):
        if elements <= 0:
            return self.passthrough(node)
        if row_len is not None and (row_len <= 0 or elements % row_len):
            row_len = None
        out = out or node.output[0]
        op = Op(self.unique(self.node_name(idx) + suffix), "vector", _layer_of(node), self.dtype(out),
                inputs=self.deps(inputs if inputs is not None else node.input), elements=int(elements),
                op_class=op_class, fn=fn, row_len=int(row_len) if row_len else None)
        self.emit(op, node.output if not suffix else [])
        return op.name

    def data(self, idx, node, nbytes=None, unsupported=False):
        outs = [o for o in node.output if o]
        if nbytes is None:
            nbytes = sum(self.nbytes(o) for o in outs)
        if nbytes <= 0:
            return self.passthrough(node)
        attrs = {"onnx_op": node.op_type}
        if unsupported:
            attrs["unsupported"] = True
        op = Op(self.unique(self.node_name(idx)), "data", _layer_of(node), self.dtype(outs[0]) if outs else "bf16",
                inputs=self.deps(node.input), nbytes=int(nbytes), attrs=attrs)
        self.emit(op, node.output)

    def gemm(self, idx, node, m, k, n, *, a, b, batch=1, weight=None, weight_batched=False, weight_dtype=None,
             suffix="", outputs=None, inputs=None):
        if min(m, k, n, batch) <= 0:
            return self.passthrough(node)
        weight = self.is_static(b) if weight is None else weight
        wdt = weight_dtype
        if weight and wdt is None:
            root = self.weight_root(b)
            wdt = self.dtype(root)
        dt = self.dtype(a)
        op = Op(self.unique(self.node_name(idx) + suffix), "gemm", _layer_of(node), dt,
                weight_dtype=wdt if weight and wdt != dt else None,
                inputs=self.deps(inputs if inputs is not None else [a] + ([] if weight else [b])),
                m=int(m), k=int(k), n=int(n), batch=int(batch), weight=bool(weight),
                weight_batched=bool(weight and weight_batched), attrs={"onnx_op": node.op_type})
        self.emit(op, node.output if outputs is None else outputs)
        return op.name

    def convert(self) -> list[Op]:
        self.match_patterns()
        for idx, node in enumerate(self.nodes):
            outs = [o for o in node.output if o]
            if outs and all(o in self.info.static for o in outs):
                self.folded += 1
                continue
            g = self.group_of.get(idx)
            try:
                if g is not None:
                    if idx == g.anchor:
                        self.emit_group(g)
                    continue
                self.convert_node(idx, node)
            except _UnknownShape as exc:
                self.unknown_shapes.append(f"{self.node_name(idx)} ({node.op_type}): {exc.tensor}")
                self.passthrough(node)
        return self.ops

    def emit_group(self, g: _Group):
        node = self.nodes[g.anchor]
        sp = g.spec
        if g.kind == "silu":
            self.vector(g.anchor, node, "activation", self.numel(sp["out"]), fn="silu", inputs=g.external)
        elif g.kind == "rope":
            self.vector(g.anchor, node, "rope", self.numel(sp["x"]), inputs=g.external)
        elif g.kind == "rmsnorm":
            xs = self.shape(sp["x"])
            self.vector(g.anchor, node, "rmsnorm", self.numel(sp["x"]), row_len=xs[-1], inputs=g.external)
        elif g.kind == "attention":
            deps = g.external
            if "qkv" in sp:
                qk = sp["qkv"]
                name = self.gemm(g.anchor, node, qk["m"], qk["k"], qk["n"], a=node.input[0], b=qk["w"],
                                 weight=qk["weight"], suffix=".qkv", outputs=[], inputs=g.external)
                deps = [node.input[0] + "#qkv"]
                self.made[deps[0]] = (name,) if name else self.deps(g.external)
            if min(sp["batch"], sp["q_len"], sp["kv_len"], sp["heads"]) <= 0:
                return self.passthrough(node)
            op = Op(self.unique(self.node_name(g.anchor)), "attention", _layer_of(node), self.dtype(sp["dtype_of"]),
                    inputs=self.deps(deps), batch=int(sp["batch"]), q_len=int(sp["q_len"]),
                    kv_len=int(sp["kv_len"]), heads=int(sp["heads"]), kv_heads=int(sp["kv_heads"]),
                    head_dim=int(sp["head_dim"]), v_head_dim=int(sp["v_head_dim"]), causal=bool(sp["causal"]),
                    attrs={"onnx_op": node.op_type, "fused_nodes": len(g.members)})
            self.emit(op, node.output)

    def convert_node(self, idx, node):
        op = node.op_type
        if node.domain not in _DOMAINS or op not in SUPPORTED_OPS:
            self.unsupported.append({"op_type": (f"{node.domain}::" if node.domain not in ("", "ai.onnx") else "")
                                     + op, "name": self.node_name(idx)})
            return self.data(idx, node, unsupported=True) if self._shapes_known(node) else self.passthrough(node)
        at = _attrs(node)
        out = node.output[0] if node.output else ""
        if op in _FREE:
            return self.passthrough(node)
        if op in _ATTENTIONS:  # not converted by match_fused_attention: its input shapes are unknown
            raise _UnknownShape(next((x for x in node.input if x and self.shape(x) is None), node.input[0]))
        if op in _GEMMS:
            return self.convert_gemm(idx, node, at)
        if op == "Gather":
            table, ids = node.input[0], node.input[1]
            ts = self.shape(table)
            if self.is_static(table) and ts is not None and len(ts) == 2 and at.get("axis", 0) == 0:
                op_ = Op(self.unique(self.node_name(idx)), "embedding", _layer_of(node), self.dtype(out),
                         weight_dtype=self.dtype(self.weight_root(table)), inputs=self.deps([ids]),
                         m=self.numel(ids), k=ts[0], n=ts[1], attrs={"onnx_op": op})
                self.emit(op_, node.output)
                self.patterns["embedding (Gather)"] += 1
                return None
            return self.data(idx, node)
        if op in _DATA:
            return self.data(idx, node)
        if op in _ACTIVATIONS:
            return self.vector(idx, node, "activation", self.numel(out), fn=_ACTIVATIONS[op])
        if op in ("Softmax", "LogSoftmax"):
            s = self.shape(out)
            axis = at.get("axis", -1)
            return self.vector(idx, node, "softmax", self.numel(out), row_len=s[axis % len(s)] if s else None)
        if op in _NORMS:
            return self.convert_norm(idx, node, at)
        if op == "RotaryEmbedding":
            return self.vector(idx, node, "rope", self.numel(out))
        if op in _REDUCTIONS:
            return self.convert_reduction(idx, node, at)
        if op in _ELEMENTWISE:
            cls = "divide" if op in _DIVIDE else "exp" if op in _EXP else "elementwise"
            if op == "Pow":
                e = self.info.values.get(node.input[1])
                cls = "elementwise" if e is not None and e.size == 1 and float(e.reshape(-1)[0]) in (1.0, 2.0, 3.0) \
                    else "exp"
            elems = sum(self.numel(o) for o in node.output if o)
            return self.vector(idx, node, cls, elems)
        return self.passthrough(node)  # pragma: no cover - every SUPPORTED_OPS entry is handled above

    def shape_error(self, idx, node, problem: str):
        """Operand shapes that no runtime would accept: one ConfigError naming the node."""
        raise ConfigError(f"{self.path}: node {self.node_name(idx)} ({node.op_type}): {problem}")

    def _shapes_known(self, node):
        return all(self.shape(o) is not None for o in node.output if o)

    def convert_gemm(self, idx, node, at):
        op = node.op_type
        if op == "Conv":
            x, w = node.input[0], node.input[1]
            xs, ws, ys = self.shape(x), self.shape(w), self.shape(node.output[0])
            if None in (xs, ws, ys):
                raise _UnknownShape(x if xs is None else w if ws is None else node.output[0])
            groups = int(at.get("group", 1))
            if len(xs) < 2 or len(ws) < 2 or groups < 1 or xs[1] != ws[1] * groups:
                self.shape_error(idx, node, f"input channels disagree: X {xs}, W {ws}, group {groups}")
            m = ys[0] * math.prod(ys[2:])
            k = ws[1] * math.prod(ws[2:])
            n = ws[0] // groups
            self.patterns["conv (im2col)"] += 1
            return self.gemm(idx, node, m, k, n, a=x, b=w, batch=groups, weight_batched=groups > 1)
        if op == "Gemm":
            a, b = node.input[0], node.input[1]
            sa, sb = self.shape(a), self.shape(b)
            if sa is None or sb is None:
                raise _UnknownShape(a if sa is None else b)
            if len(sa) != 2 or len(sb) != 2:
                self.shape_error(idx, node, f"Gemm takes 2-D A and B, got A {sa}, B {sb}")
            m, k = (sa[1], sa[0]) if at.get("transA", 0) else (sa[0], sa[1])
            kb, n = (sb[1], sb[0]) if at.get("transB", 0) else (sb[0], sb[1])
            if k != kb:
                self.shape_error(idx, node, f"inner dimensions disagree: A {sa} x B {sb} (K {k} vs {kb})")
            return self.gemm(idx, node, m, k, n, a=a, b=b)
        if op == "MatMulNBits":
            a, b = node.input[0], node.input[1]
            k, n, bits = int(at["K"]), int(at["N"]), int(at.get("bits", 4))
            m = self.numel(a) // k
            return self.gemm(idx, node, m, k, n, a=a, b=b, weight=True,
                             weight_dtype="int4" if bits <= 4 else "int8")
        ia, ib = (0, 3) if op == "QLinearMatMul" else (0, 1)
        a, b = node.input[ia], node.input[ib]
        sa, sb = self.shape(a), self.shape(b)
        if sa is None or sb is None:
            raise _UnknownShape(a if sa is None else b)
        sa = (1,) + sa if len(sa) == 1 else sa
        sb = sb + (1,) if len(sb) == 1 else sb
        m, k, n = sa[-2], sa[-1], sb[-1]
        if k != sb[-2]:
            self.shape_error(idx, node, f"inner dimensions disagree: A {sa} x B {sb} (K {k} vs {sb[-2]})")
        ba, bb = sa[:-2], sb[:-2]
        rank = max(len(ba), len(bb))
        ba, bb = (1,) * (rank - len(ba)) + ba, (1,) * (rank - len(bb)) + bb
        if any(da != db and 1 not in (da, db) for da, db in zip(ba, bb)):
            self.shape_error(idx, node, f"batch dimensions do not broadcast: A {sa} x B {sb}")
        batch = 1
        for da, db in zip(ba, bb):
            if db > 1:
                batch *= max(da, db)
            else:
                m *= da  # B broadcast over this dim: the rows stack into m
        return self.gemm(idx, node, m, k, n, a=a, b=b, batch=batch, weight_batched=batch > 1)

    def convert_norm(self, idx, node, at):
        op, x = node.op_type, node.input[0]
        xs = self.shape(x)
        if xs is None:
            raise _UnknownShape(x)
        cls = _NORMS[op]
        if op == "InstanceNormalization":
            row = math.prod(xs[2:])
        elif op == "GroupNormalization":
            row = math.prod(xs[1:]) // int(at.get("num_groups", 1))
        else:
            axis = int(at.get("axis", -1)) % len(xs)
            row = math.prod(xs[axis:])
        if op.startswith("Skip"):
            add = self.vector(idx, node, "elementwise", self.numel(x), suffix=".skip_add")
            self.patterns[f"{op} (add + norm)"] += 1
            inputs = [node.output[0] + "#skip"]
            self.made[inputs[0]] = (add,)
            self.vector(idx, node, cls, self.numel(x), row_len=row, inputs=inputs)
            if len(node.output) > 3 and node.output[3]:  # input + skip (+ bias): the residual stream
                self.made[node.output[3]] = (add,)
            return None
        return self.vector(idx, node, cls, self.numel(x), row_len=row)

    def convert_reduction(self, idx, node, at):
        op, x = node.op_type, node.input[0]
        xs = self.shape(x)
        if xs is None:
            raise _UnknownShape(x)
        elements = math.prod(xs)
        if op in ("GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"):
            row = math.prod(xs[2:])
        elif op in ("MaxPool", "AveragePool", "LpPool"):
            kernel = math.prod(at.get("kernel_shape", [1]))
            elements, row = self.numel(node.output[0]) * kernel, kernel
        elif op in ("ArgMax", "ArgMin", "TopK"):
            row = xs[int(at.get("axis", -1)) % len(xs)] if xs else 1
        else:
            axes = at.get("axes")
            if len(node.input) > 1 and node.input[1]:
                v = self.info.values.get(node.input[1])
                axes = None if v is None else [int(a) for a in v.reshape(-1)]
            if not axes:
                row = elements if not at.get("noop_with_empty_axes", 0) else 1
            else:
                row = math.prod(xs[a % len(xs)] for a in axes)
        return self.vector(idx, node, "reduction", elements, row_len=max(1, row))


class _UnknownShape(Exception):
    def __init__(self, tensor):
        super().__init__(tensor)
        self.tensor = tensor


def _unsupported_message(path, items) -> str:
    by_type = defaultdict(list)
    for it in items:
        by_type[it["op_type"]].append(it["name"])
    parts = []
    for op_type, names in sorted(by_type.items()):
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} nodes)" if len(names) > 3 else "")
        parts.append(f"{op_type} [{shown}]")
    return (f"{path}: {len(by_type)} unsupported ONNX op type(s): {'; '.join(parts)}. Supported ops are listed "
            f"in npusim.model.onnx_import.SUPPORTED_OPS; pass allow_unsupported=True (CLI: --allow-unsupported) "
            f"to cost them as data movement of their outputs")


def load_onnx(
    path: str | Path,
    batch: int = 1,
    seq_len: int = 128,
    kv_len: int | None = None,
    dims: dict | None = None,
    allow_unsupported: bool = False,
    dtype: str | None = None,
) -> Graph:
    """Import an ONNX model as a :class:`Graph` (see the module docstring).

    Args:
        path: the ``.onnx`` file (external data, if any, is never read).
        batch: value of the batch dimension names.
        seq_len: new tokens per sequence (sequence dimension names).
        kv_len: keys per sequence, new tokens included (default ``seq_len``: no cache);
            ``past_sequence_length`` names get ``kv_len - seq_len``.
        dims: values of other symbolic dimension names (they override the defaults).
        allow_unsupported: cost unsupported ops as data movement of their outputs (listed in
            ``graph.meta["unsupported"]``) instead of raising.
        dtype: re-label every floating-point tensor with this IR dtype (e.g. ``bf16``).

    Raises:
        ConfigError: missing, empty or unreadable file, a graph with no node or no operator to
            simulate, external data outside the folder, unbound
            dimensions, failed shape inference, unsupported ops, shapes left unknown.
    """
    _require_onnx()
    path = Path(path)
    if kv_len is None:
        kv_len = seq_len
    check_shape(batch, seq_len, kv_len)
    if dtype is not None and dtype not in DTYPE_BYTES:
        raise ConfigError(f"dtype must be one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    model = _read_model(path)
    external = check_external_data(model, path)
    bound = _bind_dims(model, _dim_names(batch, seq_len, kv_len, dims), path)
    nodes = _topo_sort(model.graph, path)
    info = _infer_tensors(model, nodes, path)
    conv = _Converter(model, nodes, info, path, dtype, allow_unsupported, seq_len, kv_len)
    ops = conv.convert()
    if not ops and not conv.unsupported:
        raise ConfigError(f"{path}: no operator to simulate (its {len(nodes)} node(s) fold into constants or "
                          "pass data through unchanged)")
    if conv.unsupported and not allow_unsupported:
        raise ConfigError(_unsupported_message(path, conv.unsupported))
    if conv.unknown_shapes and not allow_unsupported:
        shown = "; ".join(conv.unknown_shapes[:5])
        more = f" (and {len(conv.unknown_shapes) - 5} more)" if len(conv.unknown_shapes) > 5 else ""
        raise ConfigError(f"{path}: shape inference left {len(conv.unknown_shapes)} tensor shape(s) unknown: "
                          f"{shown}{more}; bind more symbolic dims with dims={{...}} or pass allow_unsupported=True "
                          f"to skip these nodes")
    phase = "decode" if seq_len == 1 and kv_len > 1 else "prefill"
    meta = {
        "source": str(path), "producer": f"{model.producer_name} {model.producer_version}".strip(),
        "opsets": {imp.domain or "ai.onnx": imp.version for imp in model.opset_import},
        "dims": bound, "nodes": len(nodes), "folded_nodes": conv.folded, "patterns": dict(conv.patterns),
        "unsupported": conv.unsupported, "unknown_shapes": conv.unknown_shapes, "external_data": external,
        "dtype_override": dtype,
    }
    return Graph(name=path.stem, ops=ops, phase=phase, batch=int(batch), seq_len=int(seq_len), kv_len=int(kv_len),
                 meta=meta)


def allowed_unsupported_notes(meta: dict) -> list[str]:
    """What ``allow_unsupported=True`` let through, in words (one note each, none when it let nothing
    through): the unsupported nodes costed as data movement of their outputs, by op type with their
    names, and the nodes skipped for shapes inference left unknown."""
    notes = []
    skipped = meta.get("unsupported") or []
    if skipped:
        names: dict[str, list[str]] = defaultdict(list)
        for u in skipped:
            names[u["op_type"]].append(u["name"])
        kinds = "; ".join(f"{k} x{len(v)} [{', '.join(v[:3])}{', ...' if len(v) > 3 else ''}]"
                          for k, v in sorted(names.items()))
        notes.append(f"--allow-unsupported: {len(skipped)} unsupported ONNX node(s) costed as data movement of "
                     f"their outputs, not computed: {kinds}")
    unknown = meta.get("unknown_shapes") or []
    if unknown:
        more = f" (and {len(unknown) - 3} more)" if len(unknown) > 3 else ""
        notes.append(f"--allow-unsupported: {len(unknown)} ONNX node(s) with unknown input shapes skipped (no cost): "
                     f"{'; '.join(unknown[:3])}{more}")
    return notes


__all__ = ["BATCH_DIM_NAMES", "PAST_DIM_NAMES", "SEQ_DIM_NAMES", "SUPPORTED_OPS", "TOTAL_DIM_NAMES",
           "allowed_unsupported_notes", "check_external_data", "load_onnx"]
