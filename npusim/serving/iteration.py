"""The operator graph of one serving iteration: a mixed batch of prefill chunks and decodes.

Continuous batching runs, in one forward pass, ``c`` new tokens of each request being
prefilled (a chunk; its keys are the prefix already cached plus the chunk itself) and
one new token of each request being decoded (against its whole cache). The token-wise
ops (projections, norms, MLP, MoE) see all ``T`` tokens of the iteration at once;
attention is per request. So the graph is the model's graph for ``T`` tokens with each
layer's attention op replaced by one op per *bucket* of requests (prefill chunks each
on their own; decodes grouped into at most ``decode_buckets`` groups by KV length, each
at its group's mean length — an approximation that keeps the op count small), and the
LM head computing logits only for the requests that sample a token this iteration.

With ``pad=True`` (the serving default) the compute graph is padded the way graph-mode
serving engines pad it, so iterations share compiled shapes: each decode group's request
count to 1, 2, 4, 8 or the next multiple of 8 (vLLM's CUDA-graph batch sizes), a prefill
chunk to the next multiple of 16 tokens, and the sampled rows likewise. The padding costs
compute (at most 7 decode rows per group and 15 tokens per chunk) but no KV memory, and the
attention work of the real requests is kept (padded slots read no KV).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from npusim.model.builder import build_graph
from npusim.model.ir import Graph, Op


@dataclass(frozen=True)
class Work:
    """One request's share of an iteration: ``q`` new tokens attending to ``kv`` keys
    (new ones included); ``samples`` is True when the iteration produces a token for it."""

    q: int
    kv: int
    samples: bool


def padded_count(n: int) -> int:
    """1, 2, 4, 8, then the next multiple of 8 (graph-mode batch sizes)."""
    return n if n <= 2 else 4 if n <= 4 else -(-n // 8) * 8


def _buckets(work: list[Work], decode_buckets: int, pad: bool) -> list[tuple[int, int, int, bool]]:
    """(count, q, kv, causal) attention groups. Padding keeps the attention work of the real
    requests: a padded chunk keeps its cached prefix (``kv - q``), and a padded decode group
    spreads its requests' keys over the padded rows (padded slots read no KV)."""
    out = []
    for w in work:
        if w.q > 1:
            q = -(-w.q // 16) * 16 if pad else w.q
            out.append((1, q, w.kv + q - w.q, True))
    dec = np.array(sorted(w.kv for w in work if w.q == 1), dtype=np.int64)
    if dec.size:
        for part in np.array_split(dec, min(decode_buckets, dec.size)):
            n = padded_count(part.size) if pad else int(part.size)
            out.append((n, 1, max(1, int(round(part.sum() / n))), False))
    return out


KV_QUANTUM = 256  # compiled shapes round KV lengths up to this many tokens


def _groups(work, decode_buckets, kv_quantum, pad) -> tuple[list[tuple[int, int, int, bool]], int]:
    """The attention groups with KV lengths rounded up to ``kv_quantum``, and the sampled rows
    (padded like a decode group, at most one per token row)."""
    groups = [(n, q, -(-kv // kv_quantum) * kv_quantum, c) for n, q, kv, c in _buckets(work, decode_buckets, pad)]
    sampled = sum(w.samples for w in work)
    if pad and sampled:
        sampled = min(padded_count(sampled), sum(n * q for n, q, _, _ in groups))
    return groups, sampled


def iteration_groups(work: list[Work], decode_buckets: int = 2, kv_quantum: int = KV_QUANTUM,
                     pad: bool = True) -> tuple[tuple[tuple[int, int, int, bool], ...], int]:
    """The iteration's attention groups ``(count, q, kv, causal)`` and its sampled rows: all its
    graph depends on (:func:`build_groups_graph`)."""
    groups, sampled = _groups(work, decode_buckets, kv_quantum, pad)
    return tuple(groups), sampled


def iteration_signature(work: list[Work], decode_buckets: int = 2, kv_quantum: int = KV_QUANTUM,
                        pad: bool = True) -> tuple:
    """A key under which iterations cost the same: their graphs are identical."""
    groups, sampled = _groups(work, decode_buckets, kv_quantum, pad)
    return tuple(groups) + (sampled,)


def build_iteration_graph(model, work: list[Work], precision: str = "bf16", layers: int | None = None,
                          decode_buckets: int = 2, kv_quantum: int = KV_QUANTUM, pad: bool = True) -> Graph:
    if not work:
        raise ValueError("an iteration needs at least one request")
    groups, sampled = _groups(work, decode_buckets, kv_quantum, pad)
    return build_groups_graph(model, groups, sampled, precision, layers, pad)


def build_groups_graph(model, groups, sampled: int, precision: str = "bf16", layers: int | None = None,
                       pad: bool = True) -> Graph:
    """The iteration graph of attention ``groups`` ``(count, q, kv, causal)`` with ``sampled``
    LM-head rows (see :func:`iteration_groups`)."""
    if not groups:
        raise ValueError("an iteration needs at least one request")
    tokens = sum(n * q for n, q, _, _ in groups)
    base = build_graph(model, phase="decode", batch=1, seq_len=tokens, kv_len=tokens, precision=precision,
                       layers=layers)
    ops: list[Op] = []
    for op in base.ops:
        if op.kind == "attention":
            for i, (n, q, kv, causal) in enumerate(groups):
                name = op.name if i == len(groups) - 1 else f"{op.name}.g{i}"
                ops.append(replace(op, name=name, batch=n, q_len=q, kv_len=max(kv, q), causal=causal))
        elif op.kind == "gemm" and op.name.endswith("lm_head"):
            if sampled:
                ops.append(replace(op, m=sampled))
        else:
            ops.append(op)
    kept = {o.name for o in ops}
    ops = [o if all(i in kept for i in o.inputs) else replace(o, inputs=tuple(i for i in o.inputs if i in kept))
           for o in ops]
    # everything about the graph follows from the groups, so equal signatures mean equal graphs
    return Graph(name=f"{base.meta.get('model', base.name)}-iteration", ops=ops, phase="mixed",
                 batch=sum(n for n, _, _, _ in groups), seq_len=tokens, kv_len=max(kv for _, _, kv, _ in groups),
                 meta={**base.meta, "tokens": tokens, "sampled": sampled, "padded": pad})
