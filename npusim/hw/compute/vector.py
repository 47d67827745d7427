"""Cycle model of a core's SIMD vector unit.

Units: cycles of the core clock; element counts are scalars of the operand dtype.

Machine model
-------------
``lanes`` lanes each process one element stream.  An *op* of class ``c`` (one
add, one exp, one divide ... applied to one element) occupies a lane for
``1 / ops_per_cycle_per_lane[c]`` cycles; the classes are those of the arch
file (``elementwise``, ``activation``, ``exp``, ``reduction``, ``divide``;
defaults in :data:`DEFAULT_OPS_PER_CYCLE_PER_LANE`).  A lane issues one op per
cycle in program order, so an element that needs several ops in one pass costs
the *sum* of their lane-cycles (no dual issue across units).

Every operation is a sequence of *passes* over data in SRAM.  Passes depend on
each other (e.g. softmax needs the row max before exponentiating), so each pass
exposes the lane pipeline latency ``startup_cycles`` (SRAM read, execute,
write-back; default :data:`DEFAULT_STARTUP_CYCLES`).  Kinds of pass:

* stream pass over ``E`` elements with per-element cost ``c`` lane-cycles:
  ``ceil(ceil(E / lanes) * c)`` cycles; elements of different rows may share a
  lane vector (elementwise work ignores row boundaries);
* reduction pass over ``R`` rows of length ``L``: each row is spread over the
  lanes and reduced per lane (``ceil(ceil(L / lanes) * c)`` cycles per row, rows
  are not packed together), then across lanes by a pipelined log-tree of depth
  ``ceil(log2(min(lanes, L)))`` (one cycle per level); the tree accepts a new
  row every cycle, so its depth is exposed once per pass;
* per-row scalar pass: ``R`` scalars (row statistics) spread over the lanes.

Op classes and their passes (per element unless marked "per row"):

============  ========================================================================
elementwise   1 pass, ``ops_per_element`` (default 1) elementwise ops (add/mul/max...)
divide        1 pass, 1 divide op
exp           1 pass, 1 exp op
activation    1 pass; ``fn``: relu = 1 elementwise; sigmoid, tanh = 1 activation;
              silu = 1 activation + 1 elementwise (x*sigmoid(x)); gelu (tanh form)
              = 1 activation + 6 elementwise; swiglu (silu(gate)*up, elements =
              outputs) = 1 activation + 2 elementwise
reduction     1 reduction pass (sum / max), 1 reduction op per element, rows of
              ``row_len`` (default: the whole input is one row)
softmax       rows of ``row_len``: (1) max-reduce; (2) x - max and exp: 1 elementwise
              + 1 exp; (3) sum-reduce; (4) per row: 1 divide (reciprocal of the sum);
              (5) multiply by the reciprocal: 1 elementwise  -> 5 passes
rmsnorm       rows x cols, ``row_len`` = cols: (1) sum of squares: 1 reduction op
              (fused multiply-accumulate); (2) per row: 2 elementwise (/cols, +eps)
              + 1 divide (rsqrt); (3) x * r * gamma: 2 elementwise  -> 3 passes
layernorm     (1) sum-reduce; (2) per row: mean, 1 elementwise; (3) (x-mean)^2
              accumulated: 1 elementwise + 1 reduction; (4) per row: 2 elementwise
              + 1 divide (rsqrt(var+eps)); (5) (x-mean)*r*gamma + beta: 3 elementwise
              -> 5 passes
rope          1 pass, 2 elementwise (x*cos + rotate_half(x)*sin as mul + fma; the
              cos/sin tables are read from SRAM, rotate_half is free addressing)
copy          no pass: a tensor move is memory traffic only (0 cycles here)
transpose     1 pass, 1 elementwise op (a reorder through the lanes)
quantize      dynamic per-row (per-token) symmetric INT8 quantisation, rows of
              ``row_len``: (1) abs-max reduce: 1 elementwise (abs) + 1 reduction op;
              (2) per row: 1 divide (scale = 127 / absmax); (3) x * scale, round and
              convert: 2 elementwise  -> 3 passes
rmsnorm_quant the norm, then the INT8 quantisation of its output in the same operator
              (CANN's AddRmsNormQuant / AddRmsNormDynamicQuant): ``rmsnorm``'s passes,
              then ``quantize``'s over the same rows  -> 6 passes; ``layernorm_quant``
              likewise after ``layernorm`` (CANN's (Add)LayerNormQuant)  -> 8 passes
swiglu_quant  SwiGLU, then the quantisation of its output (CANN's SwiGluQuant): the
              ``activation`` pass with fn swiglu (elements = outputs), then
              ``quantize``'s over rows of ``row_len``  -> 4 passes
============  ========================================================================

The fused classes (:data:`FUSED_QUANT`) cost the vector unit the sum of the two ops' passes;
fusing saves the second operator (its launch, and its input's round trip through memory), which
is the operator runtime's cost, not this model's.

``utilization`` = ideal cycles / cycles, where ideal cycles are the lane-cycles
of all ops spread perfectly over all lanes (no ceil, tree or startup); it is in
(0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from npusim.arch.schema import DEFAULT_VECTOR_OPS_PER_CYCLE_PER_LANE

__all__ = [
    "ACTIVATION_FUNCTIONS",
    "DEFAULT_OPS_PER_CYCLE_PER_LANE",
    "DEFAULT_STARTUP_CYCLES",
    "FUSED_QUANT",
    "OP_CLASSES",
    "THROUGHPUT_CLASSES",
    "VectorCost",
    "quantizes",
    "vector_cost",
    "vector_cycles_array",
]

#: classes whose throughput the arch file gives (ops per cycle per lane)
THROUGHPUT_CLASSES = ("elementwise", "activation", "exp", "reduction", "divide")

#: defaults: simple ALU ops at full rate, transcendental/divide on a 1/4-rate unit (their one
#: home is the arch schema; an assumption, see its docstring)
DEFAULT_OPS_PER_CYCLE_PER_LANE: dict[str, float] = dict(DEFAULT_VECTOR_OPS_PER_CYCLE_PER_LANE)

#: lane pipeline latency exposed per dependent pass: SRAM read (2, the schema's default
#: ``sram.access_latency_cycles``) + execute (4) + write (2). Assumption, no published
#: source (listed in docs/ARCHITECTURE.md "Assumptions")
DEFAULT_STARTUP_CYCLES = 8

#: activation fn -> (activation ops, elementwise ops) per element
ACTIVATION_FUNCTIONS: dict[str, tuple[int, int]] = {
    "relu": (0, 1),
    "sigmoid": (1, 0),
    "tanh": (1, 0),
    "silu": (1, 1),
    "gelu": (1, 6),
    "swiglu": (1, 2),
}

#: fused op classes: an op followed by the INT8 quantisation of its output in one operator ->
#: (the first op's class, its activation fn)
FUSED_QUANT: dict[str, tuple[str, str | None]] = {
    "rmsnorm_quant": ("rmsnorm", None),
    "layernorm_quant": ("layernorm", None),
    "swiglu_quant": ("activation", "swiglu"),
}

OP_CLASSES = ("elementwise", "activation", "exp", "reduction", "divide",
              "softmax", "rmsnorm", "layernorm", "rope", "quantize", "copy", "transpose", *FUSED_QUANT)


def quantizes(op_class: str) -> bool:
    """True when ``op_class`` writes INT8 (plus a scale per row): ``quantize`` and the fused classes."""
    return op_class == "quantize" or op_class in FUSED_QUANT

# pass descriptors: (label, kind, {class: ops per item}), kind in "stream" | "reduce" | "row"
_Pass = tuple[str, str, dict[str, int]]


@dataclass(frozen=True)
class VectorCost:
    """Cost of one vector operation.

    Attributes:
        cycles: total cycles including per-pass startup.
        elements: input elements processed.
        utilization: ideal cycles / cycles, in (0, 1].
        op_class: the op class.
        passes: ``(pass label, cycles)`` per pass, in order (cycles include startup).
    """

    cycles: int
    elements: int
    utilization: float
    op_class: str
    passes: tuple[tuple[str, int], ...]


def _passes(op_class: str, fn: str | None, ops_per_element: int) -> list[_Pass]:
    """The pass recipe of ``op_class`` (see module docstring)."""
    if op_class == "elementwise":
        return [("elementwise", "stream", {"elementwise": ops_per_element})]
    if op_class == "divide":
        return [("divide", "stream", {"divide": 1})]
    if op_class == "exp":
        return [("exp", "stream", {"exp": 1})]
    if op_class == "activation":
        if fn not in ACTIVATION_FUNCTIONS:
            raise ValueError(f"activation needs fn in {sorted(ACTIVATION_FUNCTIONS)}, got {fn!r}")
        act, ew = ACTIVATION_FUNCTIONS[fn]
        return [(fn, "stream", {"activation": act, "elementwise": ew})]
    if op_class == "reduction":
        return [("reduce", "reduce", {"reduction": 1})]
    if op_class == "softmax":
        return [("max-reduce", "reduce", {"reduction": 1}),
                ("sub+exp", "stream", {"elementwise": 1, "exp": 1}),
                ("sum-reduce", "reduce", {"reduction": 1}),
                ("row-reciprocal", "row", {"divide": 1}),
                ("scale", "stream", {"elementwise": 1})]
    if op_class == "rmsnorm":
        return [("sumsq-reduce", "reduce", {"reduction": 1}),
                ("row-rsqrt", "row", {"elementwise": 2, "divide": 1}),
                ("scale", "stream", {"elementwise": 2})]
    if op_class == "layernorm":
        return [("sum-reduce", "reduce", {"reduction": 1}),
                ("row-mean", "row", {"elementwise": 1}),
                ("var-reduce", "reduce", {"elementwise": 1, "reduction": 1}),
                ("row-rsqrt", "row", {"elementwise": 2, "divide": 1}),
                ("normalize", "stream", {"elementwise": 3})]
    if op_class == "rope":
        return [("rope", "stream", {"elementwise": 2})]
    if op_class == "copy":  # a tensor move: memory traffic only, no vector op
        return []
    if op_class == "transpose":  # one reorder pass through the lanes
        return [("reorder", "stream", {"elementwise": 1})]
    if op_class == "quantize":
        return [("absmax-reduce", "reduce", {"elementwise": 1, "reduction": 1}),
                ("row-scale", "row", {"divide": 1}),
                ("quantize", "stream", {"elementwise": 2})]
    if op_class in FUSED_QUANT:
        base, base_fn = FUSED_QUANT[op_class]
        return _passes(base, base_fn, ops_per_element) + _passes("quantize", None, 1)
    raise ValueError(f"unknown vector op class {op_class!r}; valid: {list(OP_CLASSES)}")


def _throughputs(ops_per_cycle_per_lane: Mapping[str, float] | None) -> dict[str, float]:
    tp = dict(DEFAULT_OPS_PER_CYCLE_PER_LANE)
    if ops_per_cycle_per_lane:
        unknown = sorted(set(ops_per_cycle_per_lane) - set(THROUGHPUT_CLASSES))
        if unknown:
            raise ValueError(f"unknown throughput class(es) {unknown}; "
                             f"valid: {list(THROUGHPUT_CLASSES)}")
        for name, value in ops_per_cycle_per_lane.items():
            if not value > 0:
                raise ValueError(f"ops_per_cycle_per_lane[{name!r}] must be > 0, got {value!r}")
            tp[name] = float(value)
    return tp


def _lane_cycles(ops: dict[str, int], tp: dict[str, float]) -> float:
    """Lane-cycles one item of a pass occupies (ops issue serially)."""
    return sum(count / tp[cls] for cls, count in ops.items() if count)


def _pass_cycles(kind, ops, tp, elements, rows, row_len, lanes):
    """(cycles without startup, ideal cycles) of one pass; works on ints or arrays."""
    c = _lane_cycles(ops, tp)
    if kind == "stream":
        return np.ceil(-(-elements // lanes) * c), elements * c / lanes
    if kind == "row":
        return np.ceil(-(-rows // lanes) * c), rows * c / lanes
    per_row = np.ceil(-(-row_len // lanes) * c)
    depth = np.ceil(np.log2(np.minimum(lanes, row_len)))
    return rows * per_row + depth, elements * c / lanes


def _evaluate(op_class, elements, lanes, ops_per_cycle_per_lane, startup_cycles, row_len, fn,
              ops_per_element):
    """Shared scalar/array evaluation; returns (cycles, ideal, per-pass list)."""
    tp = _throughputs(ops_per_cycle_per_lane)
    recipe = _passes(op_class, fn, ops_per_element)
    rows = elements // row_len
    total = 0
    ideal = 0.0
    per_pass = []
    for label, kind, ops in recipe:
        cyc, idl = _pass_cycles(kind, ops, tp, elements, rows, row_len, lanes)
        cyc = cyc + startup_cycles
        per_pass.append((label, cyc))
        total = total + cyc
        ideal = ideal + idl
    return total, ideal, per_pass


def _check_common(op_class, lanes, startup_cycles, ops_per_element):
    if op_class not in OP_CLASSES:
        raise ValueError(f"unknown vector op class {op_class!r}; valid: {list(OP_CLASSES)}")
    if isinstance(lanes, bool) or not isinstance(lanes, (int, np.integer)) or lanes <= 0:
        raise ValueError(f"lanes must be a positive integer, got {lanes!r}")
    if (isinstance(startup_cycles, bool) or not isinstance(startup_cycles, (int, np.integer))
            or startup_cycles < 0):
        raise ValueError(f"startup_cycles must be a non-negative integer, got {startup_cycles!r}")
    if (isinstance(ops_per_element, bool) or not isinstance(ops_per_element, (int, np.integer))
            or ops_per_element <= 0):
        raise ValueError(f"ops_per_element must be a positive integer, got {ops_per_element!r}")


def vector_cost(
    op_class: str,
    elements: int,
    lanes: int,
    ops_per_cycle_per_lane: Mapping[str, float] | None = None,
    startup_cycles: int = DEFAULT_STARTUP_CYCLES,
    *,
    row_len: int | None = None,
    fn: str | None = None,
    ops_per_element: int = 1,
) -> VectorCost:
    """Cycles of one vector operation over ``elements`` elements on ``lanes`` lanes.

    Args:
        op_class: one of :data:`OP_CLASSES`.
        elements: number of input elements (> 0); for row-wise classes
            (reduction, softmax, rmsnorm, layernorm, quantize) ``rows * row_len``.
        lanes: SIMD lanes (> 0).
        ops_per_cycle_per_lane: throughput per class of :data:`THROUGHPUT_CLASSES`;
            missing classes take :data:`DEFAULT_OPS_PER_CYCLE_PER_LANE`.
        startup_cycles: pipeline latency exposed by each dependent pass.
        row_len: row length for row-wise classes (default ``elements``: one row);
            must divide ``elements``.
        fn: activation function for ``activation`` (see :data:`ACTIVATION_FUNCTIONS`).
        ops_per_element: elementwise ops per element for ``elementwise`` (fused ops).

    Raises:
        ValueError: unknown op class / fn / throughput class, non-positive sizes,
            ``row_len`` not dividing ``elements``.
    """
    _check_common(op_class, lanes, startup_cycles, ops_per_element)
    if isinstance(elements, bool) or not isinstance(elements, (int, np.integer)) or elements <= 0:
        raise ValueError(f"elements must be a positive integer, got {elements!r}")
    if row_len is None:
        row_len = elements
    if isinstance(row_len, bool) or not isinstance(row_len, (int, np.integer)) or row_len <= 0:
        raise ValueError(f"row_len must be a positive integer, got {row_len!r}")
    if elements % row_len:
        raise ValueError(f"row_len {row_len} does not divide elements {elements}")
    total, ideal, per_pass = _evaluate(op_class, int(elements), int(lanes), ops_per_cycle_per_lane,
                                       int(startup_cycles), int(row_len), fn, int(ops_per_element))
    cycles = int(total)
    return VectorCost(cycles=cycles, elements=int(elements), utilization=float(ideal) / cycles if cycles else 1.0,
                      op_class=op_class, passes=tuple((k, int(c)) for k, c in per_pass))


def vector_cycles_array(
    op_class: str,
    elements,
    lanes: int,
    ops_per_cycle_per_lane: Mapping[str, float] | None = None,
    startup_cycles: int = DEFAULT_STARTUP_CYCLES,
    *,
    row_len=None,
    fn: str | None = None,
    ops_per_element: int = 1,
) -> np.ndarray:
    """Vectorised :func:`vector_cost` cycles: int64 array, one entry per element count.

    ``elements`` and ``row_len`` broadcast against each other; entry i equals
    ``vector_cost(op_class, elements[i], lanes, ..., row_len=row_len[i]).cycles``.
    """
    _check_common(op_class, lanes, startup_cycles, ops_per_element)
    e = np.asarray(elements)
    r = e if row_len is None else np.asarray(row_len)
    e, r = np.broadcast_arrays(e, r)
    for name, arr in (("elements", e), ("row_len", r)):
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name} must be integers, got dtype {arr.dtype}")
        if arr.size and arr.min() <= 0:
            raise ValueError(f"all {name} must be positive, got min {arr.min()}")
    e = e.astype(np.int64)
    r = r.astype(np.int64)
    if np.any(e % r):
        raise ValueError("row_len must divide elements for every entry")
    total, _, _ = _evaluate(op_class, e, int(lanes), ops_per_cycle_per_lane, int(startup_cycles),
                            r, fn, int(ops_per_element))
    return np.asarray(total).astype(np.int64)
