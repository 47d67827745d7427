"""Model configurations: the architecture numbers a builder needs, and how to read them.

A :class:`ModelConfig` holds the shape of a decoder-only transformer in the units of its
published ``config.json`` (counts of layers, heads and experts; sizes in elements). The
built-in configurations live in :mod:`npusim.model.zoo`, each citing the file it was
taken from. Custom configurations come from a dict (our field names, or a Hugging Face
``config.json`` as is: its keys are translated, unknown HF keys ignored) or a JSON file.

Families and what they switch on:

* ``gpt2``: LayerNorm with bias, fused QKV projection (``c_attn``), learned absolute
  position embeddings, GELU MLP (not gated), biases on every linear layer, tied LM head.
* ``llama``, ``qwen3``: RMSNorm, separate Q/K/V projections, RoPE, SwiGLU MLP, no biases;
  Qwen3 adds ``q_norm``/``k_norm`` (RMSNorm of each head of q and k before RoPE).
* ``qwen3_moe``: ``qwen3`` attention with every MLP replaced by routed experts (softmax
  router, top-k, no shared expert).
* ``deepseek_v3``: MLA attention (low-rank q and a compressed KV latent), the first
  ``first_dense_layers`` MLPs dense and the rest MoE with sigmoid routing, shared experts
  and a per-expert score-correction bias; optional MTP layers.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from npusim.errors import ConfigError
from npusim.files import read_text

FAMILIES = ("gpt2", "llama", "qwen3", "qwen3_moe", "deepseek_v3")


@dataclass(frozen=True)
class ModelConfig:
    """Architecture of one decoder-only model (sizes in elements, counts as integers).

    Attributes mirror the Hugging Face ``config.json`` keys named in brackets.
    ``intermediate_size`` is the dense MLP width (DeepSeek-V3: of its first dense layers);
    ``moe_intermediate_size`` the width of one routed (and of one shared) expert.
    """

    name: str
    family: str
    vocab_size: int  # [vocab_size]
    hidden_size: int  # [hidden_size] / [n_embd]
    num_layers: int  # [num_hidden_layers] / [n_layer]
    num_heads: int  # [num_attention_heads] / [n_head]
    num_kv_heads: int  # [num_key_value_heads]; MLA: equal to num_heads
    head_dim: int  # [head_dim]; default hidden_size // num_heads
    intermediate_size: int  # [intermediate_size] / [n_inner]
    source: str = "custom"
    norm: str = "rmsnorm"  # rmsnorm | layernorm
    activation: str = "silu"  # silu | gelu
    gated_ffn: bool = True  # SwiGLU (gate, up, down) vs plain (up, down)
    qk_norm: bool = False
    tie_word_embeddings: bool = False
    bias: bool = False  # biases on every linear layer and norm (GPT-2)
    rope: bool = True
    max_position_embeddings: int = 0  # [max_position_embeddings]: the context in tokens (0: unknown); the
    # learned absolute position table's rows when rope is False
    fused_qkv: bool = False
    # mixture of experts
    num_experts: int = 0  # [num_experts] / [n_routed_experts]
    experts_per_token: int = 0  # [num_experts_per_tok]
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0  # [n_shared_experts]
    first_dense_layers: int = 0  # [first_k_dense_replace]
    router_scoring: str = "softmax"  # softmax | sigmoid
    router_bias: bool = False  # DeepSeek-V3 e_score_correction_bias
    expert_groups: int = 0  # [n_group]: experts in that many equal groups (0: no groups)
    groups_per_token: int = 0  # [topk_group]: a token's experts come from its best groups only
    experts_per_group_balanced: bool = False  # Mixture of Grouped Experts: the same number from each group
    # multi-head latent attention (DeepSeek)
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # multi-token prediction
    num_mtp_layers: int = 0  # [num_nextn_predict_layers]

    def __post_init__(self):
        problems = []
        if self.family not in FAMILIES:
            problems.append(f"family {self.family!r} is not one of {FAMILIES}")
        for f in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
            if int(getattr(self, f)) <= 0:
                problems.append(f"{f} must be > 0 (got {getattr(self, f)})")
        if self.num_kv_heads > 0 and self.num_heads % self.num_kv_heads:
            problems.append(f"num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}")
        if self.norm not in ("rmsnorm", "layernorm"):
            problems.append(f"norm {self.norm!r} must be rmsnorm or layernorm")
        if self.activation not in ("silu", "gelu"):
            problems.append(f"activation {self.activation!r} must be silu or gelu")
        if self.router_scoring not in ("softmax", "sigmoid"):
            problems.append(f"router_scoring {self.router_scoring!r} must be softmax or sigmoid")
        if self.num_experts:
            if not 0 < self.experts_per_token <= self.num_experts:
                problems.append(f"experts_per_token {self.experts_per_token} must be in 1..num_experts "
                                f"({self.num_experts})")
            if self.moe_intermediate_size <= 0:
                problems.append("moe_intermediate_size must be > 0 for a MoE model")
        if self.expert_groups:
            if not self.num_experts or self.num_experts % self.expert_groups:
                problems.append(f"expert_groups {self.expert_groups} must divide num_experts ({self.num_experts})")
            elif not 0 < self.groups_per_token <= self.expert_groups:
                problems.append(f"groups_per_token {self.groups_per_token} must be in 1..expert_groups "
                                f"({self.expert_groups})")
            elif self.experts_per_group_balanced and self.experts_per_token % self.groups_per_token:
                problems.append(f"balanced grouped experts: experts_per_token {self.experts_per_token} must be a "
                                f"multiple of groups_per_token {self.groups_per_token}")
        if self.intermediate_size <= 0 and (not self.num_experts or self.first_dense_layers):
            problems.append("intermediate_size must be > 0 (dense MLP layers)")
        if self.is_mla and min(self.kv_lora_rank, self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim) <= 0:
            problems.append("MLA needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim > 0")
        if not self.rope and self.max_position_embeddings <= 0:
            problems.append("a model without RoPE needs max_position_embeddings > 0 (learned positions)")
        if not 0 <= self.first_dense_layers <= self.num_layers:
            problems.append(f"first_dense_layers {self.first_dense_layers} must be in 0..num_layers")
        if problems:
            raise ConfigError(f"model config {self.name!r}: " + "; ".join(problems))

    # -- derived --------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def layer_is_moe(self, layer: int) -> bool:
        """Whether decoder layer ``layer`` (0-based; MTP layers count on from ``num_layers``)
        has routed experts."""
        return self.is_moe and layer >= self.first_dense_layers

    @property
    def qk_head_dim(self) -> int:
        """Query/key width per head (MLA: nope + rope part)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim if self.is_mla else self.head_dim

    @property
    def attn_v_head_dim(self) -> int:
        return self.v_head_dim if self.is_mla else self.head_dim

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """KV-cache elements stored per token and layer: MLA keeps the compressed latent
        (``kv_lora_rank + qk_rope_head_dim``), GQA keeps K and V of every KV head."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)


_FIELD_NAMES = {f.name for f in fields(ModelConfig)}
_FIELD_TYPES = {f.name: {"int": int, "bool": bool, "str": str}[f.type] for f in fields(ModelConfig)}

#: Hugging Face config.json keys -> our field names
_HF_ALIASES = {
    "num_hidden_layers": "num_layers", "n_layer": "num_layers",
    "num_attention_heads": "num_heads", "n_head": "num_heads",
    "num_key_value_heads": "num_kv_heads",
    "n_embd": "hidden_size", "n_inner": "intermediate_size",
    "n_positions": "max_position_embeddings",
    "n_routed_experts": "num_experts",
    "num_experts_per_tok": "experts_per_token",
    "n_shared_experts": "num_shared_experts",
    "first_k_dense_replace": "first_dense_layers",
    "n_group": "expert_groups", "topk_group": "groups_per_token",
    "num_nextn_predict_layers": "num_mtp_layers",
    "model_type": "family",
}
_HF_FAMILIES = {"gpt2": "gpt2", "llama": "llama", "qwen3": "qwen3", "qwen3_moe": "qwen3_moe",
                "deepseek_v3": "deepseek_v3", "qwen2": "llama", "mistral": "llama"}


#: the largest count or size a model config's field takes (beyond it no simulation could run)
MAX_FIELD = 2**31 - 1
#: fields that must be positive integers (the rest of the integer fields may be 0: "none" or "derive it")
_POSITIVE = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads")


def _check_field(field_name: str, key: str, value, where: str) -> None:
    """One ConfigError naming the file (``where``) and the key as written when ``value`` is not of
    the field's type (integer fields: whole numbers in range; JSON's true/false are not numbers)."""
    kind = _FIELD_TYPES[field_name]
    if kind is int:
        low = 1 if field_name in _POSITIVE else 0
        ok = isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_FIELD
        expected = f"a {'positive' if low else 'non-negative'} integer" + (
            f" of at most {MAX_FIELD:,}" if isinstance(value, int) and value > MAX_FIELD else "")
    elif kind is bool:
        ok, expected = isinstance(value, bool), "true or false"
    else:
        ok, expected = isinstance(value, str), "a string"
    if not ok:
        raise ConfigError(f"{where}: key '{key}': expected {expected}, got {json.dumps(value)}")


def config_from_dict(data: dict, name: str | None = None, where: str = "model config") -> ModelConfig:
    """A :class:`ModelConfig` from our field names or a Hugging Face ``config.json`` dict.

    A dict with ``model_type`` or ``architectures`` is read as a Hugging Face config: its
    keys are translated (``num_hidden_layers`` -> ``num_layers``, ``n_routed_experts`` ->
    ``num_experts``, ...), family defaults are filled in (GPT-2: LayerNorm, GELU, fused
    QKV, biases, tied; DeepSeek-V3: sigmoid router with bias) and keys we do not use
    (``rope_theta``, ``torch_dtype``, ...) are ignored. Any other dict must use our field
    names only; an unknown key is an error.

    Every key it uses is checked for its type: counts and sizes are integers (``hidden_size``,
    ``num_hidden_layers`` ... positive), switches are true/false, names are strings; ``null``
    is the key left out (Hugging Face writes ``"n_inner": null`` for "the default").

    Raises:
        ConfigError: unknown keys, missing sizes, values of the wrong type, inconsistent values;
            the message starts with ``where`` (the file) and names the key as written.
    """
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a model config must be a mapping, got {type(data).__name__}")
    hf = "model_type" in data or "architectures" in data
    out: dict = {}
    unknown = []
    for key, value in data.items():
        field_name = _HF_ALIASES.get(key, key) if hf else key
        if field_name in _FIELD_NAMES:
            if value is not None:
                _check_field(field_name, key, value, where)
                out[field_name] = value
        elif not hf:
            unknown.append(key)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(_FIELD_NAMES)}")
    if hf:
        family = _HF_FAMILIES.get(str(out.get("family", "")))
        if family is None:
            raise ConfigError(f"{where}: model_type {data.get('model_type')!r} is not supported; "
                              f"supported: {sorted(_HF_FAMILIES)}")
        out["family"] = family
        out.update(_family_defaults(family, out))
    out.setdefault("name", name or data.get("name") or data.get("_name_or_path") or "custom")
    if name:
        out["name"] = name
    out.setdefault("num_kv_heads", out.get("num_heads", 0))
    if out.get("kv_lora_rank"):
        out["num_kv_heads"] = out.get("num_heads", 0)
    if out.get("kv_lora_rank") and not out.get("head_dim"):
        out["head_dim"] = int(out.get("qk_nope_head_dim", 0)) + int(out.get("qk_rope_head_dim", 0))
    if "head_dim" not in out or not out["head_dim"]:
        heads = out.get("num_heads") or 0
        out["head_dim"] = out.get("hidden_size", 0) // heads if heads else 0
    missing = [f for f in ("family", "vocab_size", "hidden_size", "num_layers", "num_heads") if f not in out]
    if missing:
        raise ConfigError(f"{where}: missing key(s) {missing}")
    out.setdefault("intermediate_size", 0)
    try:
        return ModelConfig(**out)
    except ConfigError as exc:  # the sizes' consistency (ModelConfig.__post_init__), named by the file
        if where == "model config":
            raise
        raise ConfigError(f"{where}: {exc}") from None


def _family_defaults(family: str, out: dict) -> dict:
    """Fields a Hugging Face config leaves implicit, by family."""
    if family == "gpt2":
        hidden = out.get("hidden_size", 0)
        return {"norm": "layernorm", "activation": "gelu", "gated_ffn": False, "bias": True, "rope": False,
                "fused_qkv": True, "tie_word_embeddings": True,
                "intermediate_size": out.get("intermediate_size") or 4 * hidden}
    if family == "deepseek_v3":
        return {"router_scoring": "sigmoid", "router_bias": True}
    if family in ("qwen3", "qwen3_moe"):
        return {"qk_norm": True}
    return {}


def config_from_json(path: str | Path) -> ModelConfig:
    """Read a config JSON file (ours or a Hugging Face ``config.json``)."""
    p = Path(path)
    text = read_text(p, "a JSON model config (ours or a Hugging Face config.json)", missing="no such model config file")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{p}: cannot read a JSON model config: {exc}") from None
    if isinstance(data, dict):
        data.setdefault("source", str(p))
    # a Hugging Face checkout's config.json is named by its directory (e.g. Qwen2-7B/config.json)
    stem = p.resolve().parent.name if p.stem == "config" and p.resolve().parent.name else p.stem
    named = data.get("name") or data.get("_name_or_path") if isinstance(data, dict) else None
    return config_from_dict(data, name=(str(named).rstrip("/").split("/")[-1] if named else None) or stem,
                            where=str(p))


__all__ = ["FAMILIES", "ModelConfig", "config_from_dict", "config_from_json"]
