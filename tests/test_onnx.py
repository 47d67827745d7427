"""ONNX import: graphs made with onnx.helper for each conversion rule, the shipped examples,
and agreement with the builder on the same model."""

import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npusim.cli import main
from npusim.errors import ConfigError
from npusim.model.builder import build_graph
from npusim.model.onnx_import import load_onnx
from npusim.model.summary import graph_totals

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "onnx"
F = TensorProto.FLOAT


def save(tmp_path, nodes, inputs, outputs, inits=(), name="m.onnx", opset=18, extra_opsets=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
    model = helper.make_model(graph, opset_imports=opsets)
    path = tmp_path / name
    onnx.save(model, str(path))
    return path


def vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


def weight(name, *shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def const(name, values, dtype=np.int64):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def ops_of(g, kind):
    return [op for op in g.ops if op.kind == kind]


# -- GEMMs -------------------------------------------------------------------------------------
def test_matmul_weight_with_symbolic_batch_and_sequence(tmp_path):
    p = save(tmp_path, [helper.make_node("MatMul", ["x", "w"], ["y"], name="proj")],
             [vi("x", ["batch_size", "sequence_length", 64])], [vi("y", None)], [weight("w", 64, 96)])
    g = load_onnx(p, batch=3, seq_len=10)
    (op,) = g.ops
    assert (op.kind, op.m, op.k, op.n, op.batch, op.weight, op.dtype) == ("gemm", 30, 64, 96, 1, True, "fp32")
    assert op.weight_bytes == 64 * 96 * 4 and op.flops == 2 * 30 * 64 * 96
    assert g.meta["dims"] == {"batch_size": 3, "sequence_length": 10}
    assert load_onnx(p, batch=3, seq_len=10, dtype="bf16").ops[0].weight_bytes == 64 * 96 * 2


def test_quantized_weight_through_dequantize_linear(tmp_path):
    # a QDQ (A8W8-style) export: int8 weight -> DequantizeLinear -> MatMul; the dequantized
    # weight is compile-time, so the GEMM reads an int8 weight
    w8 = numpy_helper.from_array(np.ones((32, 16), np.int8), "w8")
    nodes = [helper.make_node("DequantizeLinear", ["w8", "s"], ["w"]),
             helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    p = save(tmp_path, nodes, [vi("x", [4, 32])], [vi("y", None)], [w8, const("s", 0.1, np.float32)])
    g = load_onnx(p)
    (op,) = g.ops
    assert (op.dtype, op.weight_dtype, op.weight, op.weight_bytes) == ("fp32", "int8", True, 32 * 16)
    assert g.meta["folded_nodes"] == 1


def test_matmul_activations_batched_and_batched_weight(tmp_path):
    nodes = [helper.make_node("MatMul", ["q", "k"], ["s"], name="qk"),
             helper.make_node("MatMul", ["a", "wh"], ["o"], name="per_head")]
    p = save(tmp_path, nodes, [vi("q", [2, 4, 8, 16]), vi("k", [2, 4, 16, 8]), vi("a", [2, 4, 8, 16])],
             [vi("s", None), vi("o", None)], [weight("wh", 4, 16, 32)])
    qk, ph = load_onnx(p).ops
    assert (qk.batch, qk.m, qk.k, qk.n, qk.weight) == (8, 8, 16, 8, False)
    # a per-head weight [4, 16, 32]: batch over heads, the outer batch dim folds into m
    assert (ph.batch, ph.m, ph.k, ph.n, ph.weight, ph.weight_batched) == (4, 16, 16, 32, True, True)
    assert ph.weight_bytes == 4 * 16 * 32 * 4


def test_gemm_transposed_weight(tmp_path):
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)
    p = save(tmp_path, [node], [vi("x", ["N", 128])], [vi("y", None)], [weight("w", 10, 128), weight("b", 10)])
    (op,) = load_onnx(p, batch=5).ops
    assert (op.m, op.k, op.n, op.weight) == (5, 128, 10, True)


def test_conv_im2col_and_grouped(tmp_path):
    nodes = [helper.make_node("Conv", ["x", "w1"], ["y1"], name="conv", pads=[1, 1, 1, 1], strides=[2, 2]),
             helper.make_node("Conv", ["y1", "w2"], ["y2"], name="gconv", pads=[1, 1, 1, 1], group=4)]
    p = save(tmp_path, nodes, [vi("x", ["batch_size", 8, 32, 32])], [vi("y2", None)],
             [weight("w1", 16, 8, 3, 3), weight("w2", 16, 4, 3, 3)])
    c1, c2 = load_onnx(p, batch=2).ops
    assert (c1.m, c1.k, c1.n, c1.batch) == (2 * 16 * 16, 8 * 9, 16, 1)
    assert (c2.m, c2.k, c2.n, c2.batch, c2.weight_batched) == (2 * 16 * 16, 4 * 9, 4, 4, True)
    assert c2.weight_bytes == 16 * 4 * 9 * 4  # all of w2, once
    assert c2.flops == 2 * (2 * 16 * 16) * 16 * 4 * 9


# -- attention ---------------------------------------------------------------------------------
def _attention_chain(gqa: bool):
    """Q [B,H,S,D]; K, V [B,KV,S,D] repeated to H heads as HF eager/sdpa exports do; scale,
    additive mask, softmax, PV."""
    b, h, kv, s, d = 2, 8, (2 if gqa else 8), 16, 32
    nodes, inits = [], [const("scale", 1 / math.sqrt(d), np.float32)]
    k, v = "k", "v"
    if gqa:
        inits += [const("ax", [2]), const("shape5", [b, kv, h // kv, s, d]), const("shape4", [b, h, s, d])]
        for t in ("k", "v"):
            nodes += [helper.make_node("Unsqueeze", [t, "ax"], [f"{t}_u"]),
                      helper.make_node("Expand", [f"{t}_u", "shape5"], [f"{t}_e"]),
                      helper.make_node("Reshape", [f"{t}_e", "shape4"], [f"{t}_r"])]
        k, v = "k_r", "v_r"
    nodes += [helper.make_node("Transpose", [k], ["kt"], perm=[0, 1, 3, 2]),
              helper.make_node("MatMul", ["q", "kt"], ["scores"], name="qk"),
              helper.make_node("Mul", ["scores", "scale"], ["scaled"]),
              helper.make_node("Add", ["scaled", "mask"], ["masked"]),
              helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
              helper.make_node("MatMul", ["probs", v], ["ctx"], name="pv")]
    inputs = [vi("q", [b, h, s, d]), vi("k", [b, kv, s, d]), vi("v", [b, kv, s, d]), vi("mask", [b, 1, s, s])]
    return nodes, inputs, inits, (b, h, kv, s, d)


@pytest.mark.parametrize("gqa", [False, True])
def test_matmul_softmax_matmul_chain_becomes_attention(tmp_path, gqa):
    nodes, inputs, inits, (b, h, kv, s, d) = _attention_chain(gqa)
    g = load_onnx(save(tmp_path, nodes, inputs, [vi("ctx", None)], inits))
    (att,) = g.ops
    assert att.kind == "attention" and att.name == "pv"
    assert (att.batch, att.heads, att.kv_heads, att.q_len, att.kv_len, att.head_dim, att.causal) == \
        (b, h, kv, s, s, d, True)
    assert att.flops == 4 * h * d * b * s * (s + 1) // 2
    assert "attention (MatMul-Softmax-MatMul)" in g.meta["patterns"]


def test_onnx_attention_op_with_past_sequence_length(tmp_path):
    node = helper.make_node("Attention", ["q", "k", "v", "", "past_k", "past_v"], ["y", "pk", "pv"],
                            name="attn", is_causal=1)
    shape_q = ["batch_size", 8, "sequence_length", 64]
    shape_kv = ["batch_size", 2, "sequence_length", 64]
    past = ["batch_size", 2, "past_sequence_length", 64]
    p = save(tmp_path, [node], [vi("q", shape_q), vi("k", shape_kv), vi("v", shape_kv), vi("past_k", past),
                                vi("past_v", past)], [vi("y", None)], opset=23)
    g = load_onnx(p, batch=4, seq_len=1, kv_len=300)
    (att,) = g.ops
    assert (att.batch, att.heads, att.kv_heads, att.q_len, att.kv_len) == (4, 8, 2, 1, 300)
    assert g.phase == "decode" and g.meta["dims"]["past_sequence_length"] == 299
    assert att.kv_read_bytes == 4 * 300 * 2 * 2 * 64 * 4


def test_com_microsoft_attention_ops(tmp_path):
    gqa = helper.make_node("GroupQueryAttention", ["q", "k", "v", "pk", "pv", "seqlens", "total"],
                           ["o", "pko", "pvo"], domain="com.microsoft", name="gqa", num_heads=16, kv_num_heads=4)
    mha = helper.make_node("MultiHeadAttention", ["o", "k2", "v2"], ["o2"], domain="com.microsoft", name="mha",
                           num_heads=16)
    inputs = [vi("q", ["batch_size", "sequence_length", 16 * 64]), vi("k", ["batch_size", "sequence_length", 256]),
              vi("v", ["batch_size", "sequence_length", 256]), vi("pk", ["batch_size", 4, "past_sequence_length", 64]),
              vi("pv", ["batch_size", 4, "past_sequence_length", 64]), vi("seqlens", ["batch_size"], TensorProto.INT32),
              vi("total", [], TensorProto.INT32), vi("k2", ["batch_size", 77, 1024]),
              vi("v2", ["batch_size", 77, 1024])]
    p = save(tmp_path, [gqa, mha], inputs, [vi("o2", None)], extra_opsets=[("com.microsoft", 1)])
    g = load_onnx(p, batch=2, seq_len=8, kv_len=40)
    a, m = g.ops
    assert (a.heads, a.kv_heads, a.head_dim, a.q_len, a.kv_len, a.causal) == (16, 4, 64, 8, 40, True)
    assert (m.heads, m.kv_heads, m.head_dim, m.q_len, m.kv_len, m.causal) == (16, 16, 64, 8, 77, False)
    assert m.inputs == ("gqa",)


def test_onnxruntime_contrib_ops(tmp_path):
    # what onnxruntime's transformer optimizer / GenAI builder emit: SimplifiedLayerNormalization,
    # MatMulNBits (int4 weights), the BERT/GPT-2 style fused Attention (QKV projection inside)
    # and SkipSimplifiedLayerNormalization (residual add + RMSNorm, the sum as 4th output)
    ms = "com.microsoft"
    nodes = [helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["n1"], name="ln1", axis=-1),
             helper.make_node("MatMulNBits", ["n1", "wq", "sc"], ["p"], name="proj", domain=ms, K=64, N=64, bits=4,
                              block_size=32),
             helper.make_node("Attention", ["p", "wqkv", "bqkv"], ["a"], name="attn", domain=ms, num_heads=4,
                              unidirectional=1),
             helper.make_node("SkipSimplifiedLayerNormalization", ["a", "x", "g"], ["n2", "", "", "res"],
                              name="ln2", domain=ms),
             helper.make_node("Add", ["n2", "res"], ["y"], name="out")]
    inits = [weight("g", 64), numpy_helper.from_array(np.zeros((64, 2, 16), np.uint8), "wq"), weight("sc", 64, 2),
             weight("wqkv", 64, 192), weight("bqkv", 192)]
    p = save(tmp_path, nodes, [vi("x", ["batch_size", "sequence_length", 64])], [vi("y", None)], inits,
             extra_opsets=[(ms, 1)])
    g = load_onnx(p, batch=2, seq_len=10)
    by = {op.name: op for op in g.ops}
    assert by["ln1"].op_class == "rmsnorm" and by["ln1"].row_len == 64
    q4 = by["proj"]
    assert (q4.m, q4.k, q4.n, q4.weight_dtype, q4.weight_bytes) == (20, 64, 64, "int4", 64 * 64 // 2)
    qkv, att = by["attn.qkv"], by["attn"]
    assert (qkv.m, qkv.k, qkv.n, qkv.weight) == (20, 64, 192, True)
    assert (att.heads, att.head_dim, att.q_len, att.kv_len, att.causal, att.inputs) == (4, 16, 10, 10, True,
                                                                                          ("attn.qkv",))
    assert by["ln2.skip_add"].inputs == ("attn",) and by["ln2"].inputs == ("ln2.skip_add",)
    assert by["out"].inputs == ("ln2", "ln2.skip_add")


# -- patterns and vector ops -----------------------------------------------------------------
def test_rmsnorm_and_silu_patterns_and_elementwise(tmp_path):
    nodes = [helper.make_node("Pow", ["x", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
             helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["inv"]),
             helper.make_node("Mul", ["x", "inv"], ["xn"]),
             helper.make_node("Mul", ["gamma", "xn"], ["normed"], name="norm"),
             helper.make_node("Sigmoid", ["normed"], ["sig"]),
             helper.make_node("Mul", ["normed", "sig"], ["act"], name="silu"),
             helper.make_node("Div", ["act", "x"], ["y"], name="div")]
    inits = [const("two", 2.0, np.float32), const("axes", [-1]), const("eps", 1e-6, np.float32), weight("gamma", 64)]
    g = load_onnx(save(tmp_path, nodes, [vi("x", [4, 64])], [vi("y", None)], inits))
    norm, silu, div = g.ops
    assert (norm.op_class, norm.elements, norm.row_len) == ("rmsnorm", 256, 64)
    assert (silu.op_class, silu.fn, silu.inputs) == ("activation", "silu", ("norm",))
    assert (div.op_class, div.inputs) == ("divide", ("silu",))
    assert g.meta["patterns"] == {"rmsnorm": 1, "silu": 1}


def test_norm_softmax_reduction_embedding_and_data_ops(tmp_path):
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"], name="embed"),
             helper.make_node("LayerNormalization", ["e", "g", "b"], ["ln"], axis=-1),
             helper.make_node("Softmax", ["ln"], ["sm"], axis=-1),
             helper.make_node("ReduceMax", ["sm", "axes"], ["mx"], keepdims=0),
             helper.make_node("Transpose", ["sm"], ["t"], perm=[1, 0, 2]),
             helper.make_node("Reshape", ["t", "flat"], ["r"])]
    inits = [weight("table", 1000, 32), weight("g", 32), weight("b", 32), const("axes", [-1]), const("flat", [-1])]
    g = load_onnx(save(tmp_path, nodes, [vi("ids", ["batch", "seq"], TensorProto.INT64)],
                       [vi("mx", None), vi("r", None)], inits), batch=2, seq_len=5)
    emb, ln, sm, mx, tr = g.ops  # Reshape is free
    assert (emb.kind, emb.m, emb.k, emb.n, emb.weight_bytes) == ("embedding", 10, 1000, 32, 1000 * 32 * 4)
    assert (ln.op_class, ln.row_len, sm.op_class, sm.row_len) == ("layernorm", 32, "softmax", 32)
    assert (mx.op_class, mx.row_len, mx.elements) == ("reduction", 32, 320)
    assert (tr.kind, tr.nbytes) == ("data", 320 * 4)


def test_shapes_computed_at_run_time_are_folded(tmp_path):
    # Reshape to [batch, seq, heads, -1] with the target built from Shape/Gather/Concat, and a
    # Range over the sequence length: both need constant folding before shapes are known
    nodes = [helper.make_node("Shape", ["x"], ["sh"]),
             helper.make_node("Gather", ["sh", "i0"], ["bs"], axis=0),
             helper.make_node("Gather", ["sh", "i1"], ["sl"], axis=0),
             helper.make_node("Concat", ["bs", "sl", "heads", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["xr"]),
             helper.make_node("Squeeze", ["sl"], ["sl0"]),
             helper.make_node("Range", ["zero", "sl0", "one"], ["pos"]),
             helper.make_node("Cast", ["pos"], ["posf"], to=F),
             helper.make_node("Unsqueeze", ["posf", "ax"], ["posu"]),
             helper.make_node("Mul", ["xr", "two"], ["y"], name="scale"),
             helper.make_node("Add", ["y", "posu"], ["z"], name="bias")]
    inits = [const("i0", [0]), const("i1", [1]), const("heads", [4]), const("minus1", [-1]), const("zero", 0),
             const("one", 1), const("ax", [0, 2, 3]), const("two", 2.0, np.float32)]
    g = load_onnx(save(tmp_path, nodes, [vi("x", ["batch_size", "sequence_length", 64])], [vi("z", None)], inits),
                  batch=2, seq_len=7)
    scale, bias = g.ops
    assert scale.elements == 2 * 7 * 64 and bias.elements == 2 * 7 * 4 * 16
    assert g.meta["folded_nodes"] >= 7  # Shape, Gathers, Concat, Squeeze, Range, Cast, Unsqueeze


# -- symbolic dims and errors ----------------------------------------------------------------
def test_symbolic_dims_unbound_given_and_expressions(tmp_path):
    node = helper.make_node("Relu", ["x"], ["y"])
    p = save(tmp_path, [node], [vi("x", ["batch_size", "channels", "past_sequence_length + 1"])], [vi("y", None)])
    with pytest.raises(ConfigError, match="channels"):
        load_onnx(p)
    g = load_onnx(p, batch=2, seq_len=1, kv_len=10, dims={"channels": 3})
    assert g.ops[0].elements == 2 * 3 * 10
    assert g.meta["dims"]["past_sequence_length + 1"] == 10


def test_unsupported_ops_listed_or_costed(tmp_path):
    nodes = [helper.make_node("Einsum", ["a", "b"], ["c"], name="ein1", equation="ij,jk->ik"),
             helper.make_node("Einsum", ["c", "b2"], ["d"], name="ein2", equation="ik,kl->il"),
             helper.make_node("Det", ["d"], ["e"], name="det"),
             helper.make_node("Relu", ["d"], ["f"], name="relu")]
    p = save(tmp_path, nodes, [vi("a", [8, 8]), vi("b", [8, 8]), vi("b2", [8, 8])], [vi("e", None), vi("f", None)])
    with pytest.raises(ConfigError) as exc:
        load_onnx(p)
    msg = str(exc.value)
    assert "2 unsupported ONNX op type(s)" in msg and "Einsum [ein1, ein2]" in msg and "Det [det]" in msg
    g = load_onnx(p, allow_unsupported=True)
    kinds = {op.name: (op.kind, op.nbytes) for op in g.ops}
    assert kinds["ein1"] == ("data", 8 * 8 * 4) and kinds["relu"][0] == "vector"
    assert {u["op_type"] for u in g.meta["unsupported"]} == {"Einsum", "Det"}
    assert next(op for op in g.ops if op.name == "relu").inputs == ("ein2",)


def test_external_data_inside_folder_is_not_read_and_escapes_are_refused(tmp_path):
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")], "g",
                              [vi("x", ["batch_size", 16])], [vi("y", None)], [weight("w", 16, 32)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    ok = tmp_path / "ok"
    ok.mkdir()
    onnx.save_model(model, str(ok / "m.onnx"), save_as_external_data=True, location="w.bin", size_threshold=0)
    (ok / "w.bin").write_bytes(b"")  # truncated weights: never read
    (op,) = load_onnx(ok / "m.onnx", batch=4).ops
    assert (op.m, op.weight_bytes) == (4, 16 * 32 * 4)

    for i, loc in enumerate(["../secret.bin", "/etc/passwd", "sub/../../x.bin"]):
        m = onnx.load(str(ok / "m.onnx"), load_external_data=False)
        for entry in m.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = loc
        path = tmp_path / f"bad{i}.onnx"
        onnx.save(m, str(path))
        with pytest.raises(ConfigError, match="outside the model's folder"):
            load_onnx(path)


def test_missing_and_garbage_files(tmp_path):
    with pytest.raises(ConfigError, match="no such ONNX file"):
        load_onnx(tmp_path / "nope.onnx")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x00\xffnot a protobuf" * 10)
    with pytest.raises(ConfigError, match="not a readable ONNX model"):
        load_onnx(bad)


def test_an_empty_file_or_graph_is_one_clear_error(tmp_path, capsys):
    """A 0-byte .onnx file parses as an empty model: it ran as one ("0 ms, mean over 0 cores") on a
    chip and crashed on a system; a graph with no nodes likewise."""
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(ConfigError, match="empty.onnx: an empty file"):
        load_onnx(empty)
    nodeless = save(tmp_path, [], [vi("x", [2, 4])], [vi("x", [2, 4])], name="nodeless.onnx")
    with pytest.raises(ConfigError, match="nodeless.onnx: the ONNX model's graph has no nodes"):
        load_onnx(nodeless)
    for argv in (["--arch", "ascend-910b", "--forward"],
                 ["--system", "atlas-800i-a2", "--nodes", "1", "--npus", "1", "--batch", "2", "--kv", "64"]):
        assert main(["run", *argv, "--model", str(empty)]) == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and str(empty) in err[0] and "empty file" in err[0], err


# -- shipped examples ---------------------------------------------------------------------------
TINY = json.loads((EXAMPLES / "qwen3_tiny_config.json").read_text())


@pytest.mark.parametrize("opset", [18, 23])
def test_example_decoder_imports_like_the_builder(opset):
    """Same model, two routes: the import of the torch export and the builder fed the same
    config. GEMM FLOPs and weight bytes agree exactly except for the LM head: the export
    computes logits for every position, the builder's prefill (like a server) only for each
    sequence's last token, i.e. 2 * (B*S - B) * hidden * vocab fewer FLOPs."""
    b, s = 2, 24
    imp = load_onnx(EXAMPLES / f"qwen3_tiny_opset{opset}.onnx", batch=b, seq_len=s, dtype="bf16")
    built = build_graph(TINY, "prefill", b, s)
    ti, tb = graph_totals(imp), graph_totals(built)
    head = 2 * (b * s - b) * TINY["hidden_size"] * TINY["vocab_size"]
    assert ti["by_kind"]["gemm"]["flops"] == tb["by_kind"]["gemm"]["flops"] + head
    assert ti["weight_bytes"] == tb["weight_bytes"]
    assert ti["by_kind"]["attention"]["flops"] == tb["by_kind"]["attention"]["flops"]
    assert ti["kv_bytes_per_token"] == tb["kv_bytes_per_token"]
    att = ops_of(imp, "attention")
    assert [(a.heads, a.kv_heads, a.head_dim, a.causal) for a in att] == [(4, 2, 32, True)] * 2
    assert imp.layers() == [0, 1] == built.layers()
    assert sum(op.op_class == "rmsnorm" for op in imp.ops) == 9  # 2 per layer + q/k norms + final
    assert sum(op.op_class == "rope" for op in imp.ops) == 4


def test_example_cnn_imports():
    g = load_onnx(EXAMPLES / "resnet_block.onnx", batch=8)
    convs = [op for op in ops_of(g, "gemm") if op.attrs.get("onnx_op") == "Conv"]
    assert len(convs) == 6
    stem = convs[0]
    assert (stem.m, stem.k, stem.n) == (8 * 32 * 32, 3 * 9, 16)
    shortcut = next(op for op in convs if op.k == 16)  # the 1x1 stride-2 projection
    assert (shortcut.m, shortcut.n) == (8 * 16 * 16, 32)
    fc = next(op for op in ops_of(g, "gemm") if op.n == 10)
    assert (fc.m, fc.k) == (8, 32)


def test_cli_model_on_onnx(capsys):
    assert main(["model", str(EXAMPLES / "qwen3_tiny_opset18.onnx"), "--batch", "2", "--seq", "32", "--dtype",
                 "bf16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert {"params", "flops_per_token_prefill", "kv_bytes_per_token"} <= d.keys()
    assert d["params"] == 360_448 and d["graph"]["batch"] == 2
    assert main(["model", str(EXAMPLES / "resnet_block.onnx"), "--batch", "4"]) == 0
    assert "conv (im2col) x6" in capsys.readouterr().out
