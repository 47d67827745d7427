"""The pieces of a decoder layer a system workload costs as one kernel (``layer`` kernels of
:mod:`npusim.system.workload`): the model's operator graph for one layer, built for the kernel's
batch and sharded as the plan splits it, then cut to one part.

Sharding: ``heads_split`` divides the attention heads (KV heads too, down to one: a rank keeps a
replica when there are fewer KV heads than ranks), ``ffn_split`` the dense FFN's intermediate
width, ``vocab_split`` the vocabulary of the LM head. ``kv_dtype: int8`` halves the KV cache's
bytes per token (its reads and its footprint; the attention's arithmetic stays bf16).

Parts: ``attention`` (the layer's first norm to the attention residual), ``ffn`` (the dense FFN
block), ``router`` (the MoE block's norm and gate), ``attention+router`` (both, one graph),
``shared`` (DeepSeek-style shared experts), ``moe_tail`` (what follows the experts: their
weighted sum and the residual), ``head`` (final norm and LM head; ``layer`` -1); no part: the
whole layer, or the ops after the one named ``after`` up to the one named ``upto`` (names
without the ``L<i>.`` prefix, e.g. ``mlp_norm``).
"""

from __future__ import annotations

from dataclasses import replace

from npusim.errors import ConfigError
from npusim.model.builder import build_graph
from npusim.model.ir import Graph


def _select(ops, part: str | None, after: str | None = None, upto: str | None = None):
    names = [op.name.split(".", 1)[1] if "." in op.name else op.name for op in ops]

    def index(name: str) -> int:
        if name not in names:
            raise ConfigError(f"the layer has no op named '{name}' (its ops: {', '.join(names) or 'none'})")
        return names.index(name)
    if part is None:  # the whole layer, or the ops after / up to the named ones
        lo = index(after) + 1 if after else 0
        hi = index(upto) + 1 if upto else len(ops)
        return ops[lo:hi]
    if part == "attention+router":
        return _select(ops, "attention") + _select(ops, "router")
    if part == "head":
        return [op for op in ops if op.name != "embed"]
    cut = index("attn_residual") + 1
    if part == "attention":
        return ops[:cut]
    rest = list(zip(names[cut:], ops[cut:]))
    if part == "ffn":
        return [op for _, op in rest]
    if part == "router":
        return [op for n, op in rest if n in ("mlp_norm", "moe.router", "moe.route")]
    if part == "shared":
        return [op for n, op in rest if n.startswith("moe.shared.")]
    return [op for n, op in rest if n in ("moe.combine", "mlp_residual")]  # moe_tail


def layer_part_graph(cfg, spec: dict) -> Graph:
    """The ops a ``layer`` kernel names (see :mod:`npusim.system.workload`), sharded and built."""
    hs, fs, vs = spec.get("heads_split", 1), spec.get("ffn_split", 1), spec.get("vocab_split", 1)
    shard = replace(cfg, num_heads=max(1, cfg.num_heads // hs), num_kv_heads=max(1, cfg.num_kv_heads // hs),
                    intermediate_size=max(1, cfg.intermediate_size // fs) if cfg.intermediate_size else 0,
                    vocab_size=max(1, cfg.vocab_size // vs))
    layer = spec["layer"]
    graph = build_graph(shard, spec["phase"], batch=spec["batch"], seq_len=spec["seq_len"], kv_len=spec["kv_len"],
                        precision=spec.get("precision", "bf16"), layers=max(1, layer + 1))
    ops = _select([op for op in graph.ops if op.layer == layer], spec.get("part"), spec.get("after"), spec.get("upto"))
    if not ops:
        raise ConfigError(f"workload kernel {spec}: {cfg.name} has no ops for part '{spec.get('part')}'")
    if spec.get("kv_dtype", "bf16") == "int8":
        ops = [replace(op, kv_bytes_per_token_override=max(1, op.kv_bytes_per_token // 2))
               if op.kind == "attention" else op for op in ops]
    kept = {op.name for op in ops}
    ops = [replace(op, inputs=tuple(i for i in op.inputs if i in kept)) for op in ops]
    return Graph(f"{graph.name}.{spec.get('part') or 'layer'}", ops, graph.phase, graph.batch, graph.seq_len, graph.kv_len, graph.meta)


def onnx_graph(spec: dict) -> Graph:
    """An ``onnx`` kernel's graph: the exported model's forward pass for the kernel's batch."""
    from npusim.model.onnx_import import load_onnx

    decode = spec["phase"] == "decode"
    return load_onnx(spec["path"], batch=spec["batch"], seq_len=1 if decode else spec["seq_len"],
                     kv_len=spec["kv_len"], dtype=spec.get("dtype", "bf16"))
