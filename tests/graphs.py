"""Small hand-built operator graphs for mapper tests (independent of the model zoo)."""

from npusim.model.ir import Graph, Op


def tiny_transformer(phase="prefill", batch=1, seq=128, kv=None, hidden=256, heads=4, kv_heads=2, head_dim=64,
                     ffn=512, layers=2, dtype="bf16") -> Graph:
    q_len = seq if phase == "prefill" else 1
    kv_len = kv if kv is not None else (seq if phase == "prefill" else seq)
    m = batch * q_len
    ops, prev = [], None

    def add(op):
        nonlocal prev
        ops.append(Op(**{**op, "inputs": (prev,) if prev else (), "dtype": dtype}))
        prev = op["name"]

    add(dict(name="embed", kind="embedding", m=m, k=1000, n=hidden))
    for layer in range(layers):
        p = f"L{layer}."
        add(dict(name=p + "norm1", kind="vector", layer=layer, elements=m * hidden, op_class="rmsnorm", row_len=hidden))
        add(dict(name=p + "attn.qkv_proj", kind="gemm", layer=layer, m=m, k=hidden,
                 n=(heads + 2 * kv_heads) * head_dim, weight=True))
        add(dict(name=p + "attn.core", kind="attention", layer=layer, batch=batch, q_len=q_len, kv_len=kv_len,
                 heads=heads, kv_heads=kv_heads, head_dim=head_dim, causal=phase == "prefill"))
        add(dict(name=p + "attn.o_proj", kind="gemm", layer=layer, m=m, k=heads * head_dim, n=hidden, weight=True))
        add(dict(name=p + "add1", kind="vector", layer=layer, elements=m * hidden, op_class="elementwise"))
        add(dict(name=p + "norm2", kind="vector", layer=layer, elements=m * hidden, op_class="rmsnorm", row_len=hidden))
        add(dict(name=p + "mlp.gate_up_proj", kind="gemm", layer=layer, m=m, k=hidden, n=2 * ffn, weight=True))
        add(dict(name=p + "mlp.act", kind="vector", layer=layer, elements=m * ffn, op_class="activation", fn="silu"))
        add(dict(name=p + "mlp.down_proj", kind="gemm", layer=layer, m=m, k=ffn, n=hidden, weight=True))
        add(dict(name=p + "add2", kind="vector", layer=layer, elements=m * hidden, op_class="elementwise"))
    add(dict(name="final_norm", kind="vector", elements=m * hidden, op_class="rmsnorm", row_len=hidden))
    add(dict(name="lm_head", kind="gemm", m=batch, k=hidden, n=1000, weight=True))
    return Graph("tiny", ops, phase=phase, batch=batch, seq_len=seq, kv_len=kv_len)
