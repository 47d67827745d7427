"""Built-in model graphs: parameter counts vs the published ones, FLOPs and bytes vs closed
forms, graph structure, routing profiles, summary and the ``npusim model`` command."""

import json

import pytest

from npusim.cli import main
from npusim.errors import ConfigError
from npusim.model.builder import build_graph, expert_token_counts
from npusim.model.configs import config_from_dict
from npusim.model.summary import graph_totals, model_summary, param_counts
from npusim.model.zoo import BUILTIN, PUBLISHED, get_config, resolve_name

BF16 = 2


def rel(a, b):
    return abs(a / b - 1)


# -- parameter counts vs published ----------------------------------------------------------
@pytest.mark.parametrize("name", list(BUILTIN))
def test_total_params_match_published_within_2_percent(name):
    assert rel(param_counts(name)["total"], PUBLISHED[name].params) < 0.02


@pytest.mark.parametrize("name", [n for n, p in PUBLISHED.items() if p.non_embedding])
def test_non_embedding_params_match_published(name):
    assert rel(param_counts(name)["non_embedding"], PUBLISHED[name].non_embedding) < 0.02


@pytest.mark.parametrize("name", ["Qwen3-30B-A3B", "DeepSeek-V3"])
def test_active_params_match_published(name):
    p = param_counts(name)
    assert rel(p["active"], PUBLISHED[name].active) < 0.02
    assert p["active"] < p["total"]


def test_exact_counts_where_the_checkpoint_is_known():
    assert param_counts("GPT-2")["total"] == 124_439_808  # openai-community/gpt2 safetensors
    assert param_counts("GPT-2-medium")["total"] == 354_823_168
    assert param_counts("Qwen3-0.6B")["total"] == 596_049_920  # tied embeddings counted once


def test_deepseek_mtp_module():
    p = param_counts("DeepSeek-V3")
    # model card: the 685B checkpoint = 671B main model + 14B MTP module ("14B" is rounded:
    # 685 - 671.03 = ~13.5B, which is what the module's tensors add up to)
    assert rel(p["total_with_mtp"], 685e9) < 0.02
    assert rel(p["mtp"], 14e9) < 0.05


def test_aliases_and_did_you_mean():
    assert resolve_name("deepseek-r1") == "DeepSeek-V3"
    assert resolve_name("Qwen/Qwen3-4B") == "Qwen3-4B"
    assert resolve_name("meta-llama/Meta-Llama-3-8B") == "Llama-3-8B"
    with pytest.raises(ConfigError, match="did you mean Qwen3-4B"):
        get_config("qwen3-4")


# -- FLOPs and bytes vs closed forms ----------------------------------------------------------
def _non_gemm_params(cfg, p):
    """Parameters no GEMM multiplies by: norms, biases, position table, and the token table
    unless the tied LM head reuses it."""
    router_bias = cfg.num_experts * (cfg.num_layers - cfg.first_dense_layers) if cfg.router_bias else 0
    return (p["norms"] + p["biases"] + p["position_embedding"] + router_bias
            + (0 if cfg.tie_word_embeddings else p["embedding"]))


@pytest.mark.parametrize("name", list(BUILTIN))
def test_decode_gemm_flops_are_two_per_active_parameter(name):
    cfg, p = get_config(name), param_counts(name)
    g = build_graph(name, "decode", batch=1, seq_len=1, kv_len=512)
    gemm = sum(op.gemm_flops for op in g.ops)
    assert gemm == 2 * (p["active"] - _non_gemm_params(cfg, p))


def test_prefill_gemm_flops_closed_form_and_lm_head_last_token_only():
    cfg, p = get_config("Qwen3-4B"), param_counts("Qwen3-4B")
    b, s = 3, 100
    g = build_graph("Qwen3-4B", "prefill", b, s)
    gemm = sum(op.flops for op in g.ops if op.kind == "gemm")
    head = cfg.vocab_size * cfg.hidden_size
    body = p["total"] - p["embedding"] - p["norms"]  # tied: the head is the embedding table
    assert gemm == 2 * body * b * s + 2 * head * b
    lm = next(op for op in g.ops if op.name == "lm_head")
    assert lm.m == b and lm.attrs["shared_weight"] == "embed"
    dec = build_graph("Qwen3-4B", "decode", b, 2, 300)
    assert next(op for op in dec.ops if op.name == "lm_head").m == 2 * b


@pytest.mark.parametrize("phase,seq,kv", [("prefill", 128, 128), ("prefill", 64, 192), ("decode", 1, 777)])
def test_attention_flops_closed_form(phase, seq, kv):
    cfg = get_config("Qwen3-8B")
    b = 2
    g = build_graph("Qwen3-8B", phase, b, seq, kv)
    att = [op for op in g.ops if op.kind == "attention"]
    assert len(att) == cfg.num_layers
    prefix = kv - seq
    pairs = b * (seq * prefix + seq * (seq + 1) // 2) if phase == "prefill" else b * kv
    assert all(op.flops == 4 * cfg.num_heads * cfg.head_dim * pairs for op in att)
    assert all(op.kv_read_bytes == b * kv * 2 * cfg.num_kv_heads * cfg.head_dim * BF16 for op in att)


def test_kv_bytes_per_token():
    assert model_summary("Qwen3-4B")["kv_bytes_per_token"] == 36 * 2 * 8 * 128 * BF16
    assert model_summary("Llama-3-70B")["kv_bytes_per_token"] == 80 * 2 * 8 * 128 * BF16
    # MLA caches the 512 + 64 latent: 70,272 B per token; 72 requests x 4K tokens ~ 20 GB (Huawei DeepSeek-V3/R1 on Ascend best-practice report, A2 decode)
    ds = model_summary("DeepSeek-V3")["kv_bytes_per_token"]
    assert ds == 61 * 576 * BF16
    assert rel(72 * 4096 * ds, 20e9) < 0.05


@pytest.mark.parametrize("name", list(BUILTIN))
def test_bf16_weight_bytes_are_two_per_parameter(name):
    s = model_summary(name)
    assert s["weight_bytes"] == BF16 * s["params"]


def test_a8w8_dtypes_and_weight_bytes():
    g = build_graph("Qwen3-30B-A3B", "decode", 4, 1, 1024, precision="a8w8", layers=2)
    for op in g.ops:
        if op.kind in ("gemm", "moe") and not op.name.endswith(("router", "lm_head")):
            assert op.dtype == "int8", op.name
        if op.name.endswith(("router", "lm_head")):
            assert op.dtype == "bf16", op.name  # kept in floating point by W8A8 recipes
        if op.kind in ("attention", "vector", "embedding"):
            assert op.dtype == "bf16", op.name
    bf = model_summary("Qwen3-4B")["weight_bytes"]
    i8 = model_summary("Qwen3-4B", precision="a8w8")["weight_bytes"]
    assert 0.5 * bf < i8 < 0.6 * bf  # linear weights halve; embedding and norms stay bf16
    assert model_summary("Qwen3-4B", precision="a8w8")["kv_bytes_per_token"] == 36 * 2 * 8 * 128 * BF16


def test_a8w8_quantisation_is_fused_into_norms_and_swiglu():
    """As Ascend W8A8 stacks run it: a norm or SwiGLU whose output only INT8 GEMMs read quantises
    it in the same operator (CANN's AddRmsNormQuant, LayerNormQuant, SwiGluQuant); a dense layer
    keeps one separate quantisation, the attention output's before o_proj. Each separate one cost a
    whole operator launch on a system (W8A8 decode was slower than BF16)."""
    bf = build_graph("Llama-3-8B", "decode", 4, 1, 512, layers=2)
    i8 = build_graph("Llama-3-8B", "decode", 4, 1, 512, precision="a8w8", layers=2)
    assert {op.name for op in i8.ops} - {op.name for op in bf.ops} == {"L0.attn.o_proj.quant", "L1.attn.o_proj.quant"}
    by = {op.name: op for op in i8.ops}
    assert (by["L0.attn_norm"].op_class, by["L0.mlp_norm"].op_class, by["L0.mlp.act"].op_class) == (
        "rmsnorm_quant", "rmsnorm_quant", "swiglu_quant")
    assert by["L0.mlp.act"].row_len == get_config("Llama-3-8B").intermediate_size
    assert all(by[f"L0.attn.{p}_proj"].inputs == ("L0.attn_norm",) for p in "qkv")
    assert by["L0.mlp.down_proj"].inputs == ("L0.mlp.act",) and by["final_norm"].op_class == "rmsnorm"
    assert by["L0.attn.o_proj"].inputs == ("L0.attn.o_proj.quant",)
    gpt2 = {op.name: op for op in build_graph("GPT-2", "decode", 2, 1, 64, precision="a8w8", layers=1).ops}
    assert gpt2["L0.attn_norm"].op_class == "layernorm_quant" and "L0.mlp.down_proj.quant" in gpt2  # no GELU kernel
    # a MoE layer's normed input feeds the bf16 router too: the experts' quantisation stays its own op
    moe = {op.name: op for op in build_graph("Qwen3-30B-A3B", "decode", 4, 1, 512, precision="a8w8", layers=1).ops}
    assert moe["L0.mlp_norm"].op_class == "rmsnorm" and moe["L0.moe.experts.quant"].op_class == "quantize"


def test_decode_bytes_per_token_dense_and_moe():
    s = model_summary("Llama-3-8B")
    cfg = get_config("Llama-3-8B")
    p = param_counts("Llama-3-8B")
    # every GEMM weight once, one embedding row, the KV cache of 2048 keys
    weights = BF16 * (p["total"] - p["embedding"] - p["norms"]) + BF16 * cfg.hidden_size
    assert s["weight_read_bytes_decode"] == weights
    assert s["kv_read_bytes_decode"] == 2048 * s["kv_bytes_per_token"]
    moe = model_summary("Qwen3-30B-A3B")
    assert moe["weight_read_bytes_decode"] < 0.2 * moe["weight_bytes"]  # 8 of 128 experts


# -- graph structure --------------------------------------------------------------------------
def test_op_names_layers_and_dependencies():
    g = build_graph("Qwen3-4B", "prefill", 1, 32, layers=2)
    names = [op.name for op in g.ops]
    for n in ("embed", "L0.attn_norm", "L0.attn.q_proj", "L0.attn.k_proj", "L0.attn.v_proj", "L0.attn.q_norm",
              "L0.attn.k_norm", "L0.attn.rope", "L0.attn.attention", "L0.attn.o_proj", "L0.attn_residual",
              "L0.mlp_norm", "L0.mlp.gate_up_proj", "L0.mlp.act", "L0.mlp.down_proj", "L1.mlp_residual",
              "final_norm", "lm_head"):
        assert n in names
    assert g.layers() == [0, 1]
    by = {op.name: op for op in g.ops}
    assert by["L1.attn.q_proj"].layer == 1 and by["lm_head"].layer == -1
    assert by["L0.attn.attention"].inputs == ("L0.attn.rope", "L0.attn.v_proj")
    assert by["L0.attn_residual"].inputs == ("L0.attn.o_proj", "embed")
    assert by["L1.attn_norm"].inputs == ("L0.mlp_residual",)
    assert all(op.inputs for op in g.ops if op.name != "embed")
    assert by["L0.mlp.gate_up_proj"].n == 2 * 9728 and by["L0.mlp.act"].fn == "swiglu"
    att = by["L0.attn.attention"]
    assert (att.heads, att.kv_heads, att.head_dim, att.causal) == (32, 8, 128, True)


def test_gpt2_structure():
    g = build_graph("GPT-2", "prefill", 2, 16, layers=1)
    by = {op.name: op for op in g.ops}
    assert by["L0.attn.qkv_proj"].n == 3 * 768 and by["L0.attn_norm"].op_class == "layernorm"
    assert by["pos_embed"].k == 1024 and by["L0.mlp.act"].fn == "gelu"
    assert "L0.attn.rope" not in by


def test_deepseek_mla_prefill_and_absorbed_decode():
    cfg = get_config("DeepSeek-V3")
    pre = build_graph("DeepSeek-V3", "prefill", 2, 64, kv_len=96, layers=4)
    dec = build_graph("DeepSeek-V3", "decode", 2, 1, kv_len=96, layers=4)
    bp, bd = {o.name: o for o in pre.ops}, {o.name: o for o in dec.ops}
    a = bp["L0.attn.attention"]
    assert (a.heads, a.kv_heads, a.head_dim, a.v_head_dim, a.variant) == (128, 128, 192, 128, "mla")
    assert bp["L0.attn.kv_b_proj"].m == 2 * 96  # latents of the whole context up-projected
    assert bp["L0.attn.kv_a_proj"].n == 576
    d = bd["L0.attn.attention"]
    assert (d.heads, d.kv_heads, d.head_dim, d.v_head_dim) == (128, 1, 576, 512)
    assert d.kv_read_bytes == 2 * 96 * 576 * BF16 == a.kv_read_bytes
    uk, uv = bd["L0.attn.uk_absorb"], bd["L0.attn.uv_absorb"]
    assert uk.weight_batched and uk.batch == 128 and (uk.k, uk.n) == (128, 512)
    assert uk.weight_bytes + uv.weight_bytes == bp["L0.attn.kv_b_proj"].weight_bytes
    assert "L2.mlp.gate_up_proj" in bp and "L3.moe.experts" in bp and "L2.moe.experts" not in bp
    moe = bp["L3.moe.experts"]
    assert moe.experts == 256 and moe.top_k == 8 and sum(moe.expert_tokens) == 2 * 64 * 8
    assert moe.weight_bytes == 256 * 3 * cfg.hidden_size * 2048 * BF16
    assert "L3.moe.shared.gate_up_proj" in bp and bp["L3.moe.route"].fn == "sigmoid"


def test_mtp_layer():
    g = build_graph("DeepSeek-V3", "decode", 1, 1, 128, layers=3, mtp=True)
    names = {op.name for op in g.ops}
    assert {"L61.mtp.embed", "L61.mtp.eh_proj", "L61.attn.attention", "L61.moe.experts",
            "L61.mtp.lm_head"} <= names
    assert g.layers() == [0, 1, 2, 61]
    eh = next(op for op in g.ops if op.name == "L61.mtp.eh_proj")
    assert eh.k == 2 * 7168 and eh.inputs == ("L61.mtp.enorm", "L61.mtp.hnorm")
    with pytest.raises(ConfigError, match="no multi-token"):
        build_graph("Qwen3-4B", "decode", 1, 1, 10, mtp=True)


def test_layers_argument_and_errors():
    assert build_graph("Llama-3-70B", "prefill", 1, 8, layers=3).layers() == [0, 1, 2]
    with pytest.raises(ConfigError, match="layers"):
        build_graph("Qwen3-4B", "prefill", 1, 8, layers=37)
    with pytest.raises(ConfigError, match="decode needs kv_len"):
        build_graph("Qwen3-4B", "decode", 1, 1)
    with pytest.raises(ConfigError, match="kv_len"):
        build_graph("Qwen3-4B", "prefill", 1, 8, kv_len=4)
    with pytest.raises(ConfigError, match="phase"):
        build_graph("Qwen3-4B", "train", 1, 8)
    with pytest.raises(ConfigError, match="precision"):
        build_graph("Qwen3-4B", "prefill", 1, 8, precision="fp4")
    with pytest.raises(ConfigError, match="batch"):
        build_graph("Qwen3-4B", "prefill", 0, 8)
    with pytest.raises(ConfigError, match="learned positions for 1024"):
        build_graph("GPT-2", "decode", 1, 1, 1025)
    assert model_summary("GPT-2")["reference"]["prefill_seq_len"] == 1024  # clamped to the position table


# -- routing profile ----------------------------------------------------------------------------
def test_expert_token_counts_uniform_and_skewed():
    u = expert_token_counts(100, 16, 4)
    assert sum(u) == 400 and max(u) <= 100
    s = expert_token_counts(100, 16, 4, skew=1.5, seed=3)
    assert sum(s) == 400 and max(s) <= 100 and max(s) > max(u)
    assert s == expert_token_counts(100, 16, 4, skew=1.5, seed=3)  # deterministic
    assert s != expert_token_counts(100, 16, 4, skew=1.5, seed=4)  # another hot expert
    hard = expert_token_counts(10, 8, 8, skew=5.0)  # every token must use every expert
    assert hard == (10,) * 8
    one = expert_token_counts(1, 256, 8, skew=2.0)  # decode batch 1: 8 experts, one token each
    assert sum(one) == 8 and max(one) == 1
    with pytest.raises(ConfigError):
        expert_token_counts(10, 4, 5)


def test_moe_skew_reaches_graph_and_layers_differ():
    g = build_graph("Qwen3-30B-A3B", "prefill", 4, 256, moe_skew=1.2, seed=7, layers=2)
    e0, e1 = (op.expert_tokens for op in g.ops if op.kind == "moe")
    assert sum(e0) == sum(e1) == 4 * 256 * 8
    assert e0 != e1 and max(e0) > 3 * 4 * 256 * 8 / 128 and max(e1) > 3 * 4 * 256 * 8 / 128  # hot experts
    assert e0.index(max(e0)) != e1.index(max(e1))  # each layer has its own hot expert


# -- custom configs ----------------------------------------------------------------------------
def test_custom_config_dict_hf_and_ours():
    hf = {"model_type": "qwen3", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
          "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "tie_word_embeddings": True, "rope_theta": 1e6}
    g = build_graph(hf, "prefill", 1, 8)
    assert g.layers() == [0, 1] and any(op.name == "L0.attn.q_norm" for op in g.ops)
    ours = {"name": "toy", "family": "llama", "vocab_size": 100, "hidden_size": 32, "num_layers": 1,
            "num_heads": 4, "num_kv_heads": 4, "head_dim": 8, "intermediate_size": 64}
    assert config_from_dict(ours).name == "toy"
    with pytest.raises(ConfigError, match="unknown key"):
        config_from_dict({**ours, "hiden_size": 3})
    with pytest.raises(ConfigError, match="multiple of num_kv_heads"):
        config_from_dict({**ours, "num_kv_heads": 3})
    with pytest.raises(ConfigError, match="model_type"):
        config_from_dict({"model_type": "mamba", "hidden_size": 4})


# -- summary and CLI ----------------------------------------------------------------------------
def test_model_summary_fields():
    s = model_summary("Qwen3-32B")
    assert s["reference"] == {"batch": 1, "prefill_seq_len": 2048, "decode_kv_len": 2048}
    for key in ("params", "params_active", "weight_bytes", "kv_bytes_per_token", "flops_per_token_prefill",
                "flops_per_token_decode", "bytes_per_token_decode"):
        assert s[key] > 0
    assert rel(s["gemm_flops_per_token_decode"], 2 * s["params"]) < 0.05


def test_cli_model_json_list_and_errors(capsys, tmp_path):
    assert main(["model", "Qwen3-4B", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"params", "flops_per_token_prefill", "kv_bytes_per_token", "graph"} <= d.keys()
    assert d["graph"]["phase"] == "prefill" and d["graph"]["seq_len"] == 2048

    assert main(["model", "qwen3-30b-a3b", "--phase", "decode", "--batch", "4", "--kv", "512", "--layers", "2",
                 "--moe-skew", "1.0"]) == 0
    out = capsys.readouterr().out
    assert "active per token" in out and "moe" in out and "decode, batch 4" in out

    assert main(["model", "--list"]) == 0
    out = capsys.readouterr().out
    assert "DeepSeek-V3" in out and "Qwen3-30B-A3B" in out

    assert main(["model", "qwen3-4"]) == 2
    err = capsys.readouterr().err
    assert "did you mean Qwen3-4B" in err and "Traceback" not in err

    cfg = tmp_path / "toy.json"
    cfg.write_text(json.dumps({"model_type": "llama", "vocab_size": 500, "hidden_size": 64, "num_hidden_layers": 2,
                               "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}))
    assert main(["model", str(cfg), "--seq", "64", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["name"] == "toy" and d["graph"]["layers"] == 2


def test_graph_totals_by_kind_sum():
    g = build_graph("Qwen3-30B-A3B", "decode", 8, 1, 256, layers=3)
    t = graph_totals(g)
    assert t["flops"] == g.flops and t["weight_bytes"] == g.weight_bytes and t["kv_read_bytes"] == g.kv_read_bytes
    assert sum(r["ops"] for r in t["by_kind"].values()) == len(g.ops)
