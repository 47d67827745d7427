"""Operator graphs of built-in (or custom-config) models for one forward pass.

:func:`build_graph` lays out, layer by layer, the operators a serving implementation runs
(vLLM / SGLang style), with their shapes; FLOPs and bytes follow from :mod:`npusim.model.ir`.

What one decoder layer contains (``T = batch * seq_len`` new tokens, ``L`` = layer index,
op names ``L{L}.<block>.<op>``):

* ``L.attn_norm`` (RMSNorm / LayerNorm over ``hidden``);
* attention, GQA (GPT-2, Llama, Qwen3): **separate** ``q_proj``, ``k_proj``, ``v_proj``
  GEMMs as in the checkpoints (GPT-2: one fused ``qkv_proj``, its ``c_attn``); Qwen3
  ``q_norm`` / ``k_norm`` (RMSNorm per head); ``rope`` on q and k (one vector op); the
  ``attention`` op (prefill: causal over ``kv_len`` keys = ``seq_len`` new + any cached
  prefix; decode: ``seq_len`` (normally 1) new tokens against ``kv_len`` keys, the new
  one(s) included); ``o_proj``;
* attention, MLA (DeepSeek-V3): ``q_a_proj`` -> ``q_a_norm`` -> ``q_b_proj``; ``kv_a_proj``
  (hidden -> ``kv_lora_rank + qk_rope_head_dim`` = the 576-element latent the KV cache
  stores) -> ``kv_a_norm``; ``rope`` on the rope parts of q and k. Prefill is *not
  absorbed*: ``kv_b_proj`` up-projects the latents of all ``kv_len`` context tokens to
  per-head keys/values and the attention is MHA with ``head_dim`` 192 / ``v_head_dim``
  128. Decode is *absorbed* (DeepSeek's inference code, FlashMLA): ``uk_absorb`` maps each
  head's q_nope into the latent space (a per-head ``[128 x 512]`` GEMM, ``weight_batched``),
  the attention is MQA over the latent (one KV head, ``head_dim`` 576, ``v_head_dim``
  512), and ``uv_absorb`` maps each head's output back (``[512 x 128]`` per head). Both
  read ``kv_lora_rank + qk_rope_head_dim`` elements per cached token;
* ``L.attn_residual`` (element-wise add), ``L.mlp_norm``;
* dense MLP: ``gate_up_proj`` (gate and up **fused** into one GEMM of width
  ``2 * intermediate``), ``act`` (SwiGLU: ``silu(gate) * up``), ``down_proj``; GPT-2:
  ``up_proj``, GELU, ``down_proj``;
* MoE MLP: ``router`` GEMM (kept in bf16 under a8w8, as W8A8 recipes keep the gate),
  ``route`` (softmax over experts, or sigmoid for DeepSeek; top-k selection included),
  the ``experts`` op (kind ``moe``: dispatch of each token to its ``top_k`` experts, the
  experts' gate/up GEMM, SwiGLU and down GEMM, and the weighted sum of each token's ``top_k``
  outputs; which token goes to which expert from :func:`npusim.model.routing.route_tokens`,
  per token, seeded), shared experts as ``shared.gate_up_proj`` / ``shared.act`` /
  ``shared.down_proj`` and then ``combine`` (adding the shared expert's output to the routed
  one; only with shared experts);
* ``L.mlp_residual``.

Around the layers: ``embed`` (token embedding lookup; GPT-2 also ``pos_embed`` and
``embed_add``), ``final_norm`` over all ``T`` tokens (as vLLM does) and ``lm_head``:
prefill computes logits only for the last token of each sequence (``m = batch``), decode
for every new token (``m = T``). Biases (GPT-2) are fused into their GEMM's epilogue (no op).
With ``mtp=True`` (DeepSeek-V3) one multi-token-prediction layer follows, numbered
``L{num_layers}`` like the checkpoint's ``model.layers.61``: ``mtp.embed`` (the shared
embedding table), ``mtp.enorm`` / ``mtp.hnorm``, ``mtp.eh_proj`` (``2*hidden -> hidden``), a
full decoder layer, ``mtp.norm`` and ``mtp.lm_head`` (shared with the main head).

Precision: ``bf16`` everything; ``a8w8`` makes GEMM and expert operands int8 (weights and
activations) while the KV cache, attention, embeddings, the router, the LM head and all
vector ops stay bf16: each tensor an INT8 GEMM (or the experts) reads is quantised per token
(abs-max, scale, convert; once per tensor, shared by the GEMMs that read it). Where the tensor is
the output of a norm or of SwiGLU read by nothing but that quantisation, the quantisation is
fused into its producer, as Ascend W8A8 serving stacks (vllm-ascend, MindIE) run it: the norm
becomes one ``rmsnorm_quant`` / ``layernorm_quant`` op (CANN's AddRmsNormQuant /
AddRmsNormDynamicQuant, (Add)LayerNormQuant) and the SwiGLU before a down projection one
``swiglu_quant`` op (CANN's SwiGluQuant), keeping the producer's name; its work is the two ops'
(:data:`npusim.hw.compute.vector.FUSED_QUANT`), one operator. What stays a separate
``<gemm>.quant`` op (class ``quantize``): the attention output before ``o_proj`` (and MLA's
inputs of ``uk_absorb``/``uv_absorb``), a MoE layer's normed input (the bf16 router reads it
too: ``<moe>.experts.quant``, shared by the shared experts' GEMM), MTP's ``eh_proj`` input (a
concatenation of two norms), GELU outputs (no fused kernel assumed). The residual add CANN's
Add* variants also fold in stays its own op (as under bf16). De-quantisation is the GEMM's
epilogue (bf16 out), and the experts' re-quantisation between their up and down GEMMs is inside
the ``moe`` op (not a separate op). Ops whose weight is shared with another op (tied embeddings,
MTP's embedding and head) carry ``attrs["shared_weight"]`` naming the owner, so totals can count
it once.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from npusim.errors import ConfigError
from npusim.model.configs import ModelConfig
from npusim.model.ir import Graph, Op, check_shape
from npusim.model.routing import expert_token_counts, route_tokens
from npusim.model.zoo import get_config

PHASES = ("prefill", "decode")
PRECISIONS = ("bf16", "a8w8")


@dataclass
class _Builder:
    """Accumulates ops; knows the dtypes of the chosen precision."""

    cfg: ModelConfig
    precision: str
    ops: list[Op] = field(default_factory=list)
    _quantized: dict = field(default_factory=dict)  # (input, rows, width) -> its quantisation op

    @property
    def gemm_dtype(self) -> str:
        return "int8" if self.precision == "a8w8" else "bf16"

    def add(self, op: Op) -> str:
        self.ops.append(op)
        return op.name

    def gemm(self, name, layer, m, k, n, inputs, *, weight=True, batch=1, weight_batched=False, dtype=None,
             **attrs) -> str:
        dtype = dtype or self.gemm_dtype
        if dtype == "int8":
            inputs = self.quantized(name, layer, m * batch, k, inputs)
        return self.add(Op(name, "gemm", layer, dtype, inputs=_t(inputs), m=m, k=k, n=n,
                           batch=batch, weight=weight, weight_batched=weight_batched, attrs=attrs))

    def quantized(self, name, layer, rows, width, inputs) -> str:
        """``inputs`` (bf16 activations, ``rows x width``) quantised to INT8 per token for an INT8
        GEMM: one ``quantize`` vector op per tensor, shared by the GEMMs that read it."""
        key = (_t(inputs), rows, width)
        if key not in self._quantized:
            self._quantized[key] = self.vector(f"{name}.quant", layer, rows * width, "quantize", inputs,
                                               row_len=width)
        return self._quantized[key]

    def vector(self, name, layer, elements, op_class, inputs, *, fn=None, row_len=None) -> str:
        return self.add(Op(name, "vector", layer, "bf16", inputs=_t(inputs), elements=elements, op_class=op_class,
                           fn=fn, row_len=row_len))

    def norm(self, name, layer, rows, width, inputs) -> str:
        return self.vector(name, layer, rows * width, self.cfg.norm, inputs, row_len=width)


def _t(inputs) -> tuple[str, ...]:
    if isinstance(inputs, str):
        return (inputs,)
    return tuple(dict.fromkeys(i for i in inputs if i))


def build_graph(
    model: str | dict | ModelConfig,
    phase: str = "prefill",
    batch: int = 1,
    seq_len: int | None = None,
    kv_len: int | None = None,
    precision: str = "bf16",
    moe_skew: float = 0.0,
    seed: int = 0,
    layers: int | None = None,
    mtp: bool = False,
) -> Graph:
    """The operator graph of one forward pass of ``model`` (see the module docstring).

    Args:
        model: a built-in name (:func:`npusim.model.zoo.list_models`), a config dict (our
            field names or a Hugging Face ``config.json``), a ``.json`` path or a
            :class:`ModelConfig`.
        phase: ``prefill`` or ``decode``.
        batch: sequences in the batch.
        seq_len: new tokens per sequence (prefill: the prompt chunk; decode: default 1,
            more for speculative/MTP verification).
        kv_len: keys each sequence attends, new tokens included (prefill: default
            ``seq_len``, larger with a cached prefix or in chunked prefill; decode:
            required, the context length after appending the new token(s)).
        precision: ``bf16`` or ``a8w8`` (int8 GEMM operands, bf16 KV cache and vector ops).
        moe_skew: Zipf exponent of the expert popularity (0 = uniform routing).
        seed: seeds the expert routing (layer ``L`` uses ``seed * 1_000_003 + L``: its
            popularity permutation and its tokens' top-k draws).
        layers: build only the first ``layers`` decoder layers (default: all).
        mtp: append the model's multi-token-prediction layer(s) (DeepSeek-V3).

    Raises:
        ConfigError: unknown model, invalid sizes, or ``mtp`` for a model without MTP.
    """
    cfg = get_config(model)
    if phase not in PHASES:
        raise ConfigError(f"phase must be one of {PHASES}, got {phase!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if seq_len is None:
        if phase == "prefill":
            raise ConfigError("prefill needs seq_len (tokens per sequence)")
        seq_len = 1
    if kv_len is None:
        if phase == "decode":
            raise ConfigError("decode needs kv_len (keys attended per sequence, the new token included)")
        kv_len = seq_len
    check_shape(batch, seq_len, kv_len)
    if not cfg.rope and kv_len > cfg.max_position_embeddings:
        raise ConfigError(f"{cfg.name} has learned positions for {cfg.max_position_embeddings} tokens; "
                          f"kv_len {kv_len} is longer")
    if moe_skew < 0:
        raise ConfigError(f"moe_skew must be >= 0, got {moe_skew}")
    n_layers = cfg.num_layers if layers is None else int(layers)
    if not 1 <= n_layers <= cfg.num_layers:
        raise ConfigError(f"layers must be in 1..{cfg.num_layers} for {cfg.name}, got {layers}")
    if mtp and not cfg.num_mtp_layers:
        raise ConfigError(f"{cfg.name} has no multi-token-prediction layer (mtp=True)")

    b = _Builder(cfg, precision)
    ctx = _Ctx(cfg=cfg, phase=phase, batch=int(batch), seq_len=int(seq_len), kv_len=int(kv_len),
               moe_skew=float(moe_skew), seed=int(seed))
    x = _embedding(b, ctx)
    for layer in range(n_layers):
        x = _decoder_layer(b, ctx, layer, x, prefix=f"L{layer}")
    main_out = x
    x = b.norm("final_norm", -1, ctx.tokens, cfg.hidden_size, x)
    _lm_head(b, ctx, "lm_head", -1, x, shared="embed" if cfg.tie_word_embeddings else None)
    if mtp:
        for j in range(cfg.num_mtp_layers):
            main_out = _mtp_layer(b, ctx, cfg.num_layers + j, main_out)

    meta = {
        "model": cfg.name, "source": cfg.source, "config": cfg.to_dict(), "precision": precision,
        "moe_skew": float(moe_skew), "seed": int(seed), "layers_built": n_layers, "mtp": bool(mtp),
        "qkv": "fused (c_attn)" if cfg.fused_qkv else ("MLA" if cfg.is_mla else "separate q/k/v"),
        "gate_up": "fused" if cfg.gated_ffn else "n/a",
        "mla": ("prefill: kv_b_proj up-projection (not absorbed); decode: absorbed"
                if cfg.is_mla else None),
        "lm_head_tokens": ctx.batch if phase == "prefill" else ctx.tokens,
        "quantisation": ("per token; fused into the norm or SwiGLU that produces a GEMM input, else a .quant op"
                         if precision == "a8w8" else None),
    }
    ops = _fuse_quantisations(b.ops) if precision == "a8w8" else b.ops
    return Graph(name=f"{cfg.name}-{phase}", ops=ops, phase=phase, batch=ctx.batch, seq_len=ctx.seq_len,
                 kv_len=ctx.kv_len, meta=meta)


#: (op class, fn) of a vector op -> the fused class when the quantisation of its output joins it
_FUSES_INTO = {("rmsnorm", None): "rmsnorm_quant", ("layernorm", None): "layernorm_quant",
               ("activation", "swiglu"): "swiglu_quant"}


def _fuse_quantisations(ops: list[Op]) -> list[Op]:
    """``ops`` with each ``quantize`` op folded into its producer when the producer is a norm or
    SwiGLU over the same elements (same layer) and nothing else reads the producer's bf16 output:
    the producer becomes the fused class (:data:`_FUSES_INTO`, the quantisation's rows), keeps its
    name, and the quantisation's readers read it."""
    by_name = {op.name: op for op in ops}
    readers: dict[str, list[str]] = {}
    for op in ops:
        for name in op.inputs:
            readers.setdefault(name, []).append(op.name)
    into: dict[str, str] = {}  # quantisation -> its producer
    fused: dict[str, Op] = {}  # producer -> its fused op
    for op in ops:
        if op.kind != "vector" or op.op_class != "quantize" or len(op.inputs) != 1:
            continue
        src = by_name[op.inputs[0]]
        cls = _FUSES_INTO.get((src.op_class, src.fn)) if src.kind == "vector" else None
        if cls and readers[src.name] == [op.name] and src.elements == op.elements and src.layer == op.layer:
            into[op.name] = src.name
            fused[src.name] = replace(src, op_class=cls, fn=None, row_len=op.row_len)
    out = []
    for op in ops:
        if op.name in into:
            continue
        op = fused.get(op.name, op)
        if any(name in into for name in op.inputs):
            op = replace(op, inputs=_t([into.get(name, name) for name in op.inputs]))
        out.append(op)
    return out


@dataclass(frozen=True)
class _Ctx:
    cfg: ModelConfig
    phase: str
    batch: int
    seq_len: int
    kv_len: int
    moe_skew: float
    seed: int

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len

    @property
    def causal(self) -> bool:
        return self.phase == "prefill" or self.seq_len > 1


def _embedding(b: _Builder, ctx: _Ctx) -> str:
    cfg = ctx.cfg
    x = b.add(Op("embed", "embedding", -1, "bf16", m=ctx.tokens, k=cfg.vocab_size, n=cfg.hidden_size))
    if not cfg.rope:
        pos = b.add(Op("pos_embed", "embedding", -1, "bf16", m=ctx.tokens, k=cfg.max_position_embeddings,
                       n=cfg.hidden_size))
        x = b.vector("embed_add", -1, ctx.tokens * cfg.hidden_size, "elementwise", (x, pos))
    return x


def _lm_head(b: _Builder, ctx: _Ctx, name: str, layer: int, x: str, shared: str | None) -> str:
    """The vocabulary projection, bf16 under every precision: W8A8 recipes keep it in floating
    point (msModelSlim's quantisation descriptions mark ``lm_head.weight`` FLOAT, as vllm-ascend
    reads them)."""
    m = ctx.batch if ctx.phase == "prefill" else ctx.tokens
    attrs = {"shared_weight": shared} if shared else {}
    return b.gemm(name, layer, m, ctx.cfg.hidden_size, ctx.cfg.vocab_size, x, dtype="bf16", **attrs)


def _decoder_layer(b: _Builder, ctx: _Ctx, layer: int, x: str, prefix: str) -> str:
    cfg = ctx.cfg
    t, h = ctx.tokens, cfg.hidden_size
    normed = b.norm(f"{prefix}.attn_norm", layer, t, h, x)
    attn = (_mla(b, ctx, layer, normed, prefix) if cfg.is_mla else _gqa(b, ctx, layer, normed, prefix))
    x = b.vector(f"{prefix}.attn_residual", layer, t * h, "elementwise", (attn, x))
    normed = b.norm(f"{prefix}.mlp_norm", layer, t, h, x)
    if cfg.layer_is_moe(layer):
        mlp = _moe(b, ctx, layer, normed, prefix)
    else:
        mlp = _dense_mlp(b, ctx, layer, normed, f"{prefix}.mlp", cfg.intermediate_size)
    return b.vector(f"{prefix}.mlp_residual", layer, t * h, "elementwise", (mlp, x))


def _attention_op(ctx: _Ctx, name: str, layer: int, inputs, **shape) -> Op:
    return Op(name, "attention", layer, "bf16", inputs=_t(inputs), batch=ctx.batch, q_len=ctx.seq_len,
              kv_len=ctx.kv_len, causal=ctx.causal, **shape)


def _gqa(b: _Builder, ctx: _Ctx, layer: int, x: str, prefix: str) -> str:
    """Multi-/grouped-query attention with RoPE (or GPT-2's learned positions)."""
    cfg = ctx.cfg
    t, h, hd = ctx.tokens, cfg.hidden_size, cfg.head_dim
    q_w, kv_w = cfg.num_heads * hd, cfg.num_kv_heads * hd
    p = f"{prefix}.attn"
    if cfg.fused_qkv:
        qkv = b.gemm(f"{p}.qkv_proj", layer, t, h, q_w + 2 * kv_w, x)
        q = k = v = qkv
    else:
        q = b.gemm(f"{p}.q_proj", layer, t, h, q_w, x)
        k = b.gemm(f"{p}.k_proj", layer, t, h, kv_w, x)
        v = b.gemm(f"{p}.v_proj", layer, t, h, kv_w, x)
    if cfg.qk_norm:
        q = b.vector(f"{p}.q_norm", layer, t * q_w, "rmsnorm", q, row_len=hd)
        k = b.vector(f"{p}.k_norm", layer, t * kv_w, "rmsnorm", k, row_len=hd)
    if cfg.rope:
        q = k = b.vector(f"{p}.rope", layer, t * (q_w + kv_w), "rope", (q, k))
    att = b.add(_attention_op(ctx, f"{p}.attention", layer, (q, k, v), heads=cfg.num_heads,
                              kv_heads=cfg.num_kv_heads, head_dim=hd))
    return b.gemm(f"{p}.o_proj", layer, t, q_w, h, att)


def _mla(b: _Builder, ctx: _Ctx, layer: int, x: str, prefix: str) -> str:
    """Multi-head latent attention (DeepSeek-V2/V3); see the module docstring."""
    cfg = ctx.cfg
    t, h, heads = ctx.tokens, cfg.hidden_size, cfg.num_heads
    nope, rope, vd, lora = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    latent = lora + rope
    p = f"{prefix}.attn"
    if cfg.q_lora_rank:
        q = b.gemm(f"{p}.q_a_proj", layer, t, h, cfg.q_lora_rank, x)
        q = b.norm(f"{p}.q_a_norm", layer, t, cfg.q_lora_rank, q)
        q = b.gemm(f"{p}.q_b_proj", layer, t, cfg.q_lora_rank, heads * (nope + rope), q)
    else:
        q = b.gemm(f"{p}.q_proj", layer, t, h, heads * (nope + rope), x)
    kv = b.gemm(f"{p}.kv_a_proj", layer, t, h, latent, x)
    kv = b.vector(f"{p}.kv_a_norm", layer, t * lora, "rmsnorm", kv, row_len=lora)
    qk = b.vector(f"{p}.rope", layer, t * (heads + 1) * rope, "rope", (q, kv))
    cache_bytes = latent * 2  # bf16 latent per token
    if ctx.phase == "prefill":
        kvb = b.gemm(f"{p}.kv_b_proj", layer, ctx.batch * ctx.kv_len, lora, heads * (nope + vd), kv)
        att = b.add(_attention_op(ctx, f"{p}.attention", layer, (qk, kvb), heads=heads, kv_heads=heads,
                                  head_dim=nope + rope, v_head_dim=vd, variant="mla",
                                  kv_bytes_per_token_override=cache_bytes))
    else:
        qa = b.gemm(f"{p}.uk_absorb", layer, t, nope, lora, qk, batch=heads, weight_batched=True)
        att = b.add(_attention_op(ctx, f"{p}.attention", layer, (qa, qk), heads=heads, kv_heads=1,
                                  head_dim=latent, v_head_dim=lora, variant="mla",
                                  kv_bytes_per_token_override=cache_bytes))
        att = b.gemm(f"{p}.uv_absorb", layer, t, lora, vd, att, batch=heads, weight_batched=True)
    return b.gemm(f"{p}.o_proj", layer, t, heads * vd, h, att)


def _dense_mlp(b: _Builder, ctx: _Ctx, layer: int, x: str, p: str, width: int) -> str:
    cfg = ctx.cfg
    t, h = ctx.tokens, cfg.hidden_size
    if cfg.gated_ffn:
        y = b.gemm(f"{p}.gate_up_proj", layer, t, h, 2 * width, x)
        y = b.vector(f"{p}.act", layer, t * width, "activation", y, fn="swiglu")
    else:
        y = b.gemm(f"{p}.up_proj", layer, t, h, width, x)
        y = b.vector(f"{p}.act", layer, t * width, "activation", y, fn=cfg.activation)
    return b.gemm(f"{p}.down_proj", layer, t, width, h, y)


def _moe(b: _Builder, ctx: _Ctx, layer: int, x: str, prefix: str) -> str:
    cfg = ctx.cfg
    t, h, e, k = ctx.tokens, cfg.hidden_size, cfg.num_experts, cfg.experts_per_token
    p = f"{prefix}.moe"
    logits = b.gemm(f"{p}.router", layer, t, h, e, x, dtype="bf16")
    if cfg.router_scoring == "softmax":
        route = b.vector(f"{p}.route", layer, t * e, "softmax", logits, row_len=e)
    else:
        route = b.vector(f"{p}.route", layer, t * e, "activation", logits, fn="sigmoid")
    picks = route_tokens(t, e, k, ctx.moe_skew, ctx.seed * 1_000_003 + layer)
    counts = tuple(int(c) for c in np.bincount(picks.ravel(), minlength=e))
    xq = b.quantized(f"{p}.experts", layer, t, h, x) if b.gemm_dtype == "int8" else x
    y = b.add(Op(f"{p}.experts", "moe", layer, b.gemm_dtype, inputs=(xq, route), m=t, k=h,
                 n=cfg.moe_intermediate_size, experts=e, top_k=k, gated=True, expert_tokens=counts,
                 expert_routing=tuple(picks.ravel().tolist())))
    if not cfg.num_shared_experts:
        return y
    shared = _dense_mlp(b, ctx, layer, x, f"{p}.shared", cfg.num_shared_experts * cfg.moe_intermediate_size)
    return b.vector(f"{p}.combine", layer, t * h, "elementwise", (y, shared))


def _mtp_layer(b: _Builder, ctx: _Ctx, layer: int, hidden: str) -> str:
    """DeepSeek-V3's multi-token-prediction module: embeds the next token, mixes it with
    the main model's last hidden state and runs one more decoder layer and the head."""
    cfg = ctx.cfg
    t, h = ctx.tokens, cfg.hidden_size
    p = f"L{layer}.mtp"
    emb = b.add(Op(f"{p}.embed", "embedding", layer, "bf16", m=t, k=cfg.vocab_size, n=h,
                   attrs={"shared_weight": "embed"}))
    e = b.norm(f"{p}.enorm", layer, t, h, emb)
    hn = b.norm(f"{p}.hnorm", layer, t, h, hidden)
    x = b.gemm(f"{p}.eh_proj", layer, t, 2 * h, h, (e, hn))
    x = _decoder_layer(b, ctx, layer, x, prefix=f"L{layer}")
    y = b.norm(f"{p}.norm", layer, t, h, x)
    _lm_head(b, ctx, f"{p}.lm_head", layer, y, shared="lm_head")
    return x


__all__ = ["PHASES", "PRECISIONS", "build_graph", "expert_token_counts"]  # the latter re-exported
