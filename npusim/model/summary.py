"""What a model costs per token: parameters, FLOPs, bytes and KV cache.

Units: parameters as counts; FLOPs count a multiply-add as 2 (vector ops count one FLOP
per element, as in :mod:`npusim.model.ir`); bytes as bytes.

* :func:`param_counts` counts a config's parameters analytically, by category, from the
  shapes of the checkpoint's tensors (biases and norm weights included).
* :func:`graph_totals` sums a graph (any graph: built or imported) per op kind.
* :func:`model_summary` combines both at reference sizes: prefill of one sequence of
  :data:`REF_PREFILL_SEQ_LEN` tokens and decode of one token against
  :data:`REF_DECODE_KV_LEN` keys, batch 1.
"""

from __future__ import annotations

from npusim.arch.schema import DTYPE_BYTES
from npusim.model.builder import build_graph
from npusim.model.configs import ModelConfig
from npusim.model.ir import KINDS, Graph, Op
from npusim.model.zoo import get_config, published

#: reference prompt length for ``flops_per_token_prefill`` (tokens)
REF_PREFILL_SEQ_LEN = 2048
#: reference context length for the decode figures (keys attended, the new token included)
REF_DECODE_KV_LEN = 2048


def _attention_params(cfg: ModelConfig) -> tuple[int, int, int]:
    """(linear weights, norm weights, biases) of one layer's attention block."""
    h = cfg.hidden_size
    if cfg.is_mla:
        heads, nope, rope, vd, lora = (cfg.num_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim,
                                       cfg.v_head_dim, cfg.kv_lora_rank)
        if cfg.q_lora_rank:
            q = h * cfg.q_lora_rank + cfg.q_lora_rank * heads * (nope + rope)
            q_norm = cfg.q_lora_rank
        else:
            q, q_norm = h * heads * (nope + rope), 0
        lin = q + h * (lora + rope) + lora * heads * (nope + vd) + heads * vd * h
        return lin, q_norm + lora, 0
    q_w, kv_w = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    lin = h * q_w + 2 * h * kv_w + q_w * h
    norms = 2 * cfg.head_dim if cfg.qk_norm else 0
    biases = (q_w + 2 * kv_w + h) if cfg.bias else 0
    return lin, norms, biases


def _mlp_params(cfg: ModelConfig, width: int) -> tuple[int, int]:
    """(linear weights, biases) of one dense MLP of intermediate ``width``."""
    h = cfg.hidden_size
    if cfg.gated_ffn:
        return 3 * h * width, 0
    return 2 * h * width, (width + h) if cfg.bias else 0


def _layer_params(cfg: ModelConfig, layer: int) -> dict:
    """Parameters of decoder layer ``layer`` by category."""
    h = cfg.hidden_size
    attn, attn_norms, attn_bias = _attention_params(cfg)
    norm_w = 2 * h if cfg.norm == "layernorm" else h  # weight (+ bias)
    out = {"attention": attn, "mlp": 0, "router": 0, "routed_experts": 0, "shared_experts": 0,
           "norms": 2 * norm_w + attn_norms, "biases": attn_bias}
    if cfg.layer_is_moe(layer):
        out["router"] = h * cfg.num_experts + (cfg.num_experts if cfg.router_bias else 0)
        out["routed_experts"] = cfg.num_experts * 3 * h * cfg.moe_intermediate_size
        out["shared_experts"] = cfg.num_shared_experts * 3 * h * cfg.moe_intermediate_size
    else:
        lin, bias = _mlp_params(cfg, cfg.intermediate_size)
        out["mlp"] = lin
        out["biases"] += bias
    return out


def param_counts(model: str | dict | ModelConfig) -> dict:
    """Parameter counts of a model by category (counts, not bytes).

    Keys: ``embedding``, ``position_embedding``, ``lm_head`` (0 when tied), ``attention``,
    ``mlp`` (dense MLPs), ``router``, ``routed_experts``, ``shared_experts``, ``norms``,
    ``biases``; ``total`` (the main model, MTP excluded), ``non_embedding`` (``total``
    minus embedding tables and LM head, as model cards state it), ``active`` (used per
    token: only ``experts_per_token`` of the routed experts; embeddings included, as the
    Qwen3 and DeepSeek cards count them), ``mtp`` (the MTP module as stored in the
    checkpoint, with its own copies of the embedding table and head) and ``total_with_mtp``.
    """
    cfg = get_config(model)
    h = cfg.hidden_size
    cats = {"embedding": cfg.vocab_size * h,
            "position_embedding": 0 if cfg.rope else cfg.max_position_embeddings * h,
            "lm_head": 0 if cfg.tie_word_embeddings else cfg.vocab_size * h,
            "attention": 0, "mlp": 0, "router": 0, "routed_experts": 0, "shared_experts": 0,
            "norms": 2 * h if cfg.norm == "layernorm" else h, "biases": 0}
    for layer in range(cfg.num_layers):
        for key, value in _layer_params(cfg, layer).items():
            cats[key] += value
    total = sum(cats.values())
    out = dict(cats)
    out["total"] = total
    out["non_embedding"] = total - cats["embedding"] - cats["lm_head"] - cats["position_embedding"]
    routed = cats["routed_experts"]
    out["active"] = (total - routed + routed * cfg.experts_per_token // cfg.num_experts) if cfg.is_moe else total
    mtp = 0
    for j in range(cfg.num_mtp_layers):
        layer = cfg.num_layers + j
        mtp += sum(_layer_params(cfg, layer).values())
        mtp += 2 * cfg.vocab_size * h + 3 * h + 2 * h * h  # embed + head copies, enorm/hnorm/norm, eh_proj
    out["mtp"] = mtp
    out["total_with_mtp"] = total + mtp
    return out


def _weight_read_bytes(op: Op) -> int:
    """Weight bytes ``op`` reads once per forward pass at its batch (embedding: the rows
    looked up; MoE: only experts that received tokens)."""
    if op.kind == "embedding":
        return int(min(op.m, op.k) * op.n * op.weight_elem_bytes)
    if op.kind == "moe":
        active = sum(1 for c in op.expert_tokens if c > 0)
        mult = 3 if op.gated else 2
        return int(active * op.k * op.n * mult * op.weight_elem_bytes)
    return op.weight_bytes


def graph_totals(graph: Graph) -> dict:
    """Per-kind and overall totals of a graph.

    Returns ``{"ops", "flops", "weight_bytes", "unique_weight_bytes", "weight_read_bytes",
    "kv_read_bytes", "activation_bytes", "kv_bytes_per_token", "by_kind": {kind: {...}}}``
    where ``unique_weight_bytes`` skips ops marked ``attrs["shared_weight"]`` (tied
    embeddings, MTP), ``activation_bytes`` = activation input + output bytes and
    ``kv_bytes_per_token`` sums the attention ops' per-token KV-cache bytes (all layers).
    """
    keys = ("ops", "flops", "weight_bytes", "unique_weight_bytes", "weight_read_bytes", "kv_read_bytes",
            "activation_bytes")
    by_kind = {k: dict.fromkeys(keys, 0) for k in KINDS}
    kv_per_token = 0
    for op in graph.ops:
        row = by_kind[op.kind]
        row["ops"] += 1
        row["flops"] += op.flops
        row["weight_bytes"] += op.weight_bytes
        row["unique_weight_bytes"] += 0 if op.attrs.get("shared_weight") else op.weight_bytes
        row["weight_read_bytes"] += _weight_read_bytes(op)
        row["kv_read_bytes"] += op.kv_read_bytes
        row["activation_bytes"] += op.activation_in_bytes + op.output_bytes
        if op.kind == "attention":
            kv_per_token += op.kv_bytes_per_token
    out = {k: sum(r[k] for r in by_kind.values()) for k in keys}
    out["kv_bytes_per_token"] = kv_per_token
    out["by_kind"] = {k: v for k, v in by_kind.items() if v["ops"]}
    return out


def model_summary(model: str | dict | ModelConfig, precision: str = "bf16",
                  prefill_seq_len: int = REF_PREFILL_SEQ_LEN, decode_kv_len: int = REF_DECODE_KV_LEN) -> dict:
    """Parameters, FLOPs and bytes per token of a model at reference sizes (batch 1).

    Keys:
        ``name``, ``family``, ``source``, ``config``;
        ``params`` (total, MTP excluded), ``params_active`` (per token; = ``params`` for
        dense models), ``params_non_embedding``, ``params_mtp``, ``params_breakdown``;
        ``published`` (the model card's counts, built-ins only);
        ``weight_bytes``: all parameters stored once at ``precision`` (a8w8: GEMM and
        expert weights 1 byte, embeddings, norms, biases and the router 2 bytes);
        ``kv_bytes_per_token``: KV cache per token, all layers (bf16);
        ``flops_per_token_prefill``: FLOPs of a ``prefill_seq_len``-token prefill divided by
        its tokens (the causal attention triangle included), ``gemm_flops_per_token_prefill``
        the GEMM/MoE part alone; ``bytes_per_token_prefill``: weights and KV cache that prefill
        reads (each once per pass), divided by its tokens;
        ``flops_per_token_decode``, ``gemm_flops_per_token_decode``: one decode token at
        ``decode_kv_len`` keys;
        ``bytes_per_token_decode``: bytes a batch-1 decode step reads: weights it touches
        (all dense weights, the experts its token is routed to, one embedding row) plus the
        KV cache (``decode_kv_len`` keys), activations excluded; ``weight_read_bytes_decode``
        and ``kv_read_bytes_decode`` are its two parts;
        ``reference``: the sizes used (clamped to the position table of models with learned
        positions, e.g. 1024 for GPT-2).
    """
    cfg = get_config(model)
    if not cfg.rope:  # learned absolute positions: the table bounds the context
        prefill_seq_len = min(prefill_seq_len, cfg.max_position_embeddings)
        decode_kv_len = min(decode_kv_len, cfg.max_position_embeddings)
    params = param_counts(cfg)
    pre = build_graph(cfg, "prefill", 1, prefill_seq_len, precision=precision)
    dec = build_graph(cfg, "decode", 1, 1, decode_kv_len, precision=precision)
    tp, td = graph_totals(pre), graph_totals(dec)
    small = params["norms"] + params["biases"] + (cfg.num_experts if cfg.router_bias else 0) * max(
        0, cfg.num_layers - cfg.first_dense_layers)
    weight_bytes = tp["unique_weight_bytes"] + int(small * DTYPE_BYTES["bf16"])

    def gemm_flops(g: Graph) -> int:
        return sum(op.gemm_flops for op in g.ops)

    pub = published(cfg.name) if isinstance(model, str) and not model.lower().endswith(".json") else None
    return {
        "name": cfg.name, "family": cfg.family, "source": cfg.source, "config": cfg.to_dict(),
        "precision": precision,
        "params": params["total"], "params_active": params["active"],
        "params_non_embedding": params["non_embedding"], "params_mtp": params["mtp"],
        "params_breakdown": params,
        "published": (pub.__dict__ if pub else None),
        "weight_bytes": weight_bytes,
        "kv_bytes_per_token": td["kv_bytes_per_token"],
        "flops_per_token_prefill": tp["flops"] / prefill_seq_len,
        "gemm_flops_per_token_prefill": gemm_flops(pre) / prefill_seq_len,
        "flops_per_token_decode": td["flops"],
        "gemm_flops_per_token_decode": gemm_flops(dec),
        "bytes_per_token_prefill": (tp["weight_read_bytes"] + tp["kv_read_bytes"]) / prefill_seq_len,
        "bytes_per_token_decode": td["weight_read_bytes"] + td["kv_read_bytes"],
        "weight_read_bytes_decode": td["weight_read_bytes"],
        "kv_read_bytes_decode": td["kv_read_bytes"],
        "reference": {"batch": 1, "prefill_seq_len": prefill_seq_len, "decode_kv_len": decode_kv_len},
    }


__all__ = ["REF_DECODE_KV_LEN", "REF_PREFILL_SEQ_LEN", "graph_totals", "model_summary", "param_counts"]
