"""Built-in models: configurations copied from their published ``config.json`` files.

Every entry cites the file its numbers come from (the Hugging Face repository's
``config.json``) and the parameter counts its model card publishes, which the tests
check our own counts against. DeepSeek-R1 has the same architecture as DeepSeek-V3
(its ``config.json`` differs only in metadata), so it is an alias.

Look a model up with :func:`get_config` (case-insensitive, ``org/`` prefix and ``_``
vs ``-`` ignored); an unknown name raises :class:`~npusim.errors.ConfigError` with the
closest known names.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from npusim.errors import ConfigError
from npusim.model.configs import ModelConfig, config_from_dict, config_from_json


@dataclass(frozen=True)
class Published:
    """Parameter counts a model's publisher states (model card), for validation.

    ``params``: total parameters; ``non_embedding``: without the embedding table (and,
    when untied, the LM head); ``active``: parameters used per token (MoE); ``mtp``:
    the multi-token-prediction module; ``where``: the source of these numbers.
    """

    params: float
    where: str
    non_embedding: float | None = None
    active: float | None = None
    mtp: float | None = None


def _qwen3(name, layers, hidden, ffn, heads, kv_heads, tied):
    return ModelConfig(
        name=name, family="qwen3", source=f"Qwen/{name} config.json (huggingface.co/Qwen/{name})",
        vocab_size=151936, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=128, intermediate_size=ffn, qk_norm=True, tie_word_embeddings=tied, max_position_embeddings=40960)


def _llama3(name, layers, hidden, ffn, heads, kv_heads):
    return ModelConfig(
        name=name, family="llama", source=f"meta-llama/Meta-{name} config.json (huggingface.co/meta-llama/Meta-{name})",
        vocab_size=128256, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
        head_dim=hidden // heads, intermediate_size=ffn, max_position_embeddings=8192)


def _gpt2(name, repo, layers, hidden, heads):
    return ModelConfig(
        name=name, family="gpt2",
        source=f"openai-community/{repo} config.json (huggingface.co/openai-community/{repo})",
        vocab_size=50257, hidden_size=hidden, num_layers=layers, num_heads=heads, num_kv_heads=heads,
        head_dim=hidden // heads, intermediate_size=4 * hidden, norm="layernorm", activation="gelu",
        gated_ffn=False, tie_word_embeddings=True, bias=True, rope=False, max_position_embeddings=1024,
        fused_qkv=True)


_DEEPSEEK_V3 = ModelConfig(
    name="DeepSeek-V3", family="deepseek_v3",
    source="deepseek-ai/DeepSeek-V3 config.json (huggingface.co/deepseek-ai/DeepSeek-V3; DeepSeek-R1 identical)",
    vocab_size=129280, hidden_size=7168, num_layers=61, num_heads=128, num_kv_heads=128, head_dim=192,
    intermediate_size=18432, num_experts=256, experts_per_token=8, moe_intermediate_size=2048,
    num_shared_experts=1, first_dense_layers=3, router_scoring="sigmoid", router_bias=True,
    q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
    num_mtp_layers=1, max_position_embeddings=163840, expert_groups=8, groups_per_token=4)

#: name -> configuration (insertion order is the --list order)
BUILTIN: dict[str, ModelConfig] = {
    "GPT-2": _gpt2("GPT-2", "gpt2", 12, 768, 12),
    "GPT-2-medium": _gpt2("GPT-2-medium", "gpt2-medium", 24, 1024, 16),
    "GPT-2-large": _gpt2("GPT-2-large", "gpt2-large", 36, 1280, 20),
    "Qwen3-0.6B": _qwen3("Qwen3-0.6B", 28, 1024, 3072, 16, 8, tied=True),
    "Qwen3-1.7B": _qwen3("Qwen3-1.7B", 28, 2048, 6144, 16, 8, tied=True),
    "Qwen3-4B": _qwen3("Qwen3-4B", 36, 2560, 9728, 32, 8, tied=True),
    "Qwen3-8B": _qwen3("Qwen3-8B", 36, 4096, 12288, 32, 8, tied=False),
    "Qwen3-14B": _qwen3("Qwen3-14B", 40, 5120, 17408, 40, 8, tied=False),
    "Qwen3-32B": _qwen3("Qwen3-32B", 64, 5120, 25600, 64, 8, tied=False),
    "Qwen3-30B-A3B": ModelConfig(
        name="Qwen3-30B-A3B", family="qwen3_moe",
        source="Qwen/Qwen3-30B-A3B config.json (huggingface.co/Qwen/Qwen3-30B-A3B)",
        vocab_size=151936, hidden_size=2048, num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128,
        intermediate_size=6144, qk_norm=True, num_experts=128, experts_per_token=8, moe_intermediate_size=768,
        max_position_embeddings=40960),
    "Llama-3-8B": _llama3("Llama-3-8B", 32, 4096, 14336, 32, 8),
    "Llama-3-70B": _llama3("Llama-3-70B", 80, 8192, 28672, 64, 8),
    "Llama-2-70B": ModelConfig(
        name="Llama-2-70B", family="llama", source="meta-llama/Llama-2-70b-hf config.json "
        "(huggingface.co/meta-llama/Llama-2-70b-hf)", vocab_size=32000, hidden_size=8192, num_layers=80,
        num_heads=64, num_kv_heads=8, head_dim=128, intermediate_size=28672, max_position_embeddings=4096),
    # Qwen2's q/k/v biases (a few MB) are left out, as the llama family has none
    "Qwen2-7B": ModelConfig(
        name="Qwen2-7B", family="llama", source="Qwen/Qwen2-7B config.json (huggingface.co/Qwen/Qwen2-7B)",
        vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
        intermediate_size=18944, max_position_embeddings=131072),
    "Qwen2-72B": ModelConfig(
        name="Qwen2-72B", family="llama", source="Qwen/Qwen2-72B config.json (huggingface.co/Qwen/Qwen2-72B)",
        vocab_size=152064, hidden_size=8192, num_layers=80, num_heads=64, num_kv_heads=8, head_dim=128,
        intermediate_size=29568, max_position_embeddings=131072),
    "Qwen3-235B-A22B": ModelConfig(
        name="Qwen3-235B-A22B", family="qwen3_moe",
        source="Qwen/Qwen3-235B-A22B config.json (huggingface.co/Qwen/Qwen3-235B-A22B)",
        vocab_size=151936, hidden_size=4096, num_layers=94, num_heads=64, num_kv_heads=4, head_dim=128,
        intermediate_size=12288, qk_norm=True, num_experts=128, experts_per_token=8, moe_intermediate_size=1536,
        max_position_embeddings=40960),
    # Mixture of Grouped Experts: 64 routed experts in 8 groups, each token takes one from every group
    "Pangu-Pro-MoE": ModelConfig(
        name="Pangu-Pro-MoE", family="qwen3_moe",
        source="Pangu Pro MoE configuration_pangu_moe.py defaults (vocab 153376, hidden 5120, 48 layers, 40 heads, "
        "8 KV heads, 64 experts, top-8, moe_intermediate 1344, shared expert 5376 = 4 x 1344); 8 expert groups, "
        "one expert per group: arXiv 2505.21411 (MoGE)", vocab_size=153376, hidden_size=5120, num_layers=48,
        num_heads=40, num_kv_heads=8, head_dim=128, intermediate_size=0, num_experts=64, experts_per_token=8,
        moe_intermediate_size=1344, num_shared_experts=4, expert_groups=8, groups_per_token=8,
        experts_per_group_balanced=True, max_position_embeddings=131072),
    "DeepSeek-V3": _DEEPSEEK_V3,
}

#: other names for the same architecture
ALIASES = {"DeepSeek-R1": "DeepSeek-V3", "GPT-2-small": "GPT-2", "gpt2": "GPT-2", "gpt2-medium": "GPT-2-medium",
           "gpt2-large": "GPT-2-large"}

#: published parameter counts (model cards), checked by tests/test_model.py
PUBLISHED: dict[str, Published] = {
    "GPT-2": Published(124e6, "openai-community/gpt2 model card (124M parameters)"),
    "GPT-2-medium": Published(355e6, "openai-community/gpt2-medium model card (355M parameters)"),
    "GPT-2-large": Published(774e6, "openai-community/gpt2-large model card (774M parameters)"),
    "Qwen3-0.6B": Published(0.6e9, "Qwen/Qwen3-0.6B model card: 0.6B, 0.44B non-embedding", non_embedding=0.44e9),
    "Qwen3-1.7B": Published(1.7e9, "Qwen/Qwen3-1.7B model card: 1.7B, 1.4B non-embedding", non_embedding=1.4e9),
    "Qwen3-4B": Published(4.02e9, "Qwen/Qwen3-4B model card: 4.0B, 3.6B non-embedding; safetensors 4.02B",
                          non_embedding=3.6e9),
    "Qwen3-8B": Published(8.2e9, "Qwen/Qwen3-8B model card: 8.2B, 6.95B non-embedding", non_embedding=6.95e9),
    "Qwen3-14B": Published(14.8e9, "Qwen/Qwen3-14B model card: 14.8B, 13.2B non-embedding", non_embedding=13.2e9),
    "Qwen3-32B": Published(32.8e9, "Qwen/Qwen3-32B model card: 32.8B, 31.2B non-embedding", non_embedding=31.2e9),
    "Qwen3-30B-A3B": Published(30.5e9, "Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated, "
                                       "29.9B non-embedding", non_embedding=29.9e9, active=3.3e9),
    "Llama-3-8B": Published(8.03e9, "meta-llama/Meta-Llama-3-8B safetensors: 8.03B"),
    "Llama-3-70B": Published(70.6e9, "meta-llama/Meta-Llama-3-70B safetensors: 70.6B"),
    "Llama-2-70B": Published(70e9, "Llama 2 paper (arXiv 2307.09288) Table 1: 70B"),
    "Qwen2-7B": Published(7.62e9, "Qwen2 technical report (arXiv 2407.10671): 7.62B, 6.53B non-embedding",
                          non_embedding=6.53e9),
    "Qwen2-72B": Published(72.71e9, "Qwen2 technical report (arXiv 2407.10671): 72.71B, 70.21B non-embedding",
                           non_embedding=70.21e9),
    "Qwen3-235B-A22B": Published(235e9, "Qwen/Qwen3-235B-A22B model card: 235B total, 22B activated, 234B "
                                        "non-embedding", non_embedding=234e9, active=22e9),
    "Pangu-Pro-MoE": Published(72e9, "Pangu Pro MoE (arXiv 2505.21411): 72B total, 16B activated"),
    "DeepSeek-V3": Published(671e9, "DeepSeek-V3 technical report / model card: 671B total, 37B activated; "
                                    "HF checkpoint 685B = 671B main model + 14B MTP module",
                             active=37e9, mtp=14e9),
}


def _key(name: str) -> str:
    return name.split("/")[-1].lower().replace("_", "-").replace("meta-", "", 1)


_INDEX = {_key(n): n for n in BUILTIN}
_INDEX.update({_key(a): target for a, target in ALIASES.items()})


def list_models() -> list[str]:
    """Names of the built-in models, in display order."""
    return list(BUILTIN)


def resolve_name(name: str) -> str:
    """The canonical built-in name for ``name`` (case-insensitive; ``org/`` prefix,
    ``Meta-`` and ``_``/``-`` differences ignored).

    Raises:
        ConfigError: unknown name, with the closest built-in names.
    """
    key = _key(str(name))
    if key in _INDEX:
        return _INDEX[key]
    choices = list(BUILTIN) + list(ALIASES)
    close = difflib.get_close_matches(key, [_key(c) for c in choices], n=3, cutoff=0.5)
    close_names = [_INDEX[c] if c in _INDEX else c for c in close]
    hint = f"; did you mean {', '.join(dict.fromkeys(close_names))}?" if close else ""
    raise ConfigError(f"unknown model {name!r}{hint} (built-ins: {', '.join(BUILTIN)}; "
                      f"or give a config .json file)")


def get_config(model: str | dict | ModelConfig) -> ModelConfig:
    """A :class:`ModelConfig` from a built-in name, a config dict, a ``.json`` path or a
    config itself.

    Raises:
        ConfigError: unknown name (with did-you-mean), unreadable or invalid config.
    """
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, dict):
        return config_from_dict(model)
    if isinstance(model, (str, Path)) and str(model).lower().endswith(".json"):
        return config_from_json(model)
    if not isinstance(model, str):
        raise ConfigError(f"model must be a name, a config dict or a .json path, got {type(model).__name__}")
    return BUILTIN[resolve_name(model)]


def published(name: str) -> Published | None:
    """Published parameter counts of a built-in model (None for custom models)."""
    try:
        return PUBLISHED.get(resolve_name(name))
    except ConfigError:
        return None


__all__ = ["ALIASES", "BUILTIN", "PUBLISHED", "Published", "get_config", "list_models", "published",
           "resolve_name"]
