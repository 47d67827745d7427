"""``npusim model``: what a model costs per token, and its operator graph by op kind.

``npusim model NAME`` takes a built-in name (``--list``), a config ``.json`` (ours or a
Hugging Face ``config.json``) or an ``.onnx`` file.
"""

from __future__ import annotations

import argparse

from npusim.errors import ConfigError
from npusim.cli.util import non_negative_float, non_negative_int, positive_int
from npusim.files import json_text


def _dim(text: str) -> tuple[str, int]:
    name, sep, value = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        v = int(value)
        if v < 0:
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not NAME=VALUE with a non-negative integer value") from None
    return name.strip(), v


def add_parser(sub):
    p = sub.add_parser(
        "model",
        help="parameters, FLOPs, bytes and KV cache per token of a model; its graph by op kind",
        description="Summarise a model: parameters, FLOPs and bytes per token (prefill of a reference "
                    "prompt, decode at a reference context, batch 1: the output names both), KV-cache "
                    "bytes per token, and the operator graph built for --phase/--batch/--seq/--kv broken down by "
                    "op kind. NAME is a built-in model (--list), a config .json or an .onnx file.",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="built-in model, config .json or .onnx file")
    p.add_argument("--list", action="store_true", help="list the built-in models and exit")
    p.add_argument("--phase", choices=["prefill", "decode"], default="prefill")
    p.add_argument("--batch", type=positive_int, default=1, help="sequences (default 1)")
    p.add_argument("--seq", type=positive_int, default=None,
                   help="new tokens per sequence (default: prefill 2048, decode 1; .onnx 128)")
    p.add_argument("--kv", type=positive_int, default=None,
                   help="keys per sequence incl. the new tokens (default: prefill = --seq, decode 2048)")
    p.add_argument("--precision", choices=["bf16", "a8w8"], default="bf16")
    p.add_argument("--layers", type=positive_int, default=None, help="build only the first N layers")
    p.add_argument("--mtp", action="store_true", help="add the multi-token-prediction layer (DeepSeek-V3)")
    p.add_argument("--moe-skew", type=non_negative_float, default=0.0, help="Zipf exponent of expert popularity (0 = uniform)")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seed of the expert routing profile")
    p.add_argument("--dim", type=_dim, action="append", default=[], metavar="NAME=VALUE",
                   help=".onnx: value of a symbolic dimension (repeatable)")
    p.add_argument("--dtype", default=None, help=".onnx: cost floating-point tensors as this dtype (e.g. bf16)")
    p.add_argument("--allow-unsupported", action="store_true",
                   help=".onnx: cost unsupported ops as data movement instead of failing")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    return p


def run(args) -> int:
    if args.list:
        return _list(args.json)
    if not args.name:
        raise ConfigError("give a model NAME (a built-in, a config .json or an .onnx file) or --list")
    if str(args.name).lower().endswith(".onnx"):
        return _onnx(args)
    return _builtin(args)


def _list(as_json: bool) -> int:
    from npusim.model.zoo import BUILTIN, published

    rows = []
    for name, cfg in BUILTIN.items():
        pub = published(name)
        rows.append({"name": name, "family": cfg.family, "layers": cfg.num_layers, "hidden": cfg.hidden_size,
                     "published_params": pub.params if pub else None, "source": cfg.source})
    if as_json:
        print(json_text(rows))
        return 0
    print(f"{'model':<15} {'family':<12} {'layers':>6} {'hidden':>7} {'params':>9}  source")
    for r in rows:
        print(f"{r['name']:<15} {r['family']:<12} {r['layers']:>6} {r['hidden']:>7} "
              f"{_count(r['published_params']):>9}  {r['source']}")
    print("(DeepSeek-R1 = DeepSeek-V3 architecture; any Hugging Face config.json also works as NAME)")
    return 0


def _sizes(args, onnx_file=False, reference=None) -> tuple[int, int]:
    """(seq, kv) from the flags; defaults: the summary's reference sizes (``reference``)."""
    from npusim.model.summary import REF_DECODE_KV_LEN, REF_PREFILL_SEQ_LEN

    ref = reference or {"prefill_seq_len": REF_PREFILL_SEQ_LEN, "decode_kv_len": REF_DECODE_KV_LEN}
    if args.phase == "decode":
        seq = args.seq or 1
        kv = args.kv if args.kv is not None else (ref["decode_kv_len"] if not onnx_file else seq)
    else:
        seq = args.seq or (128 if onnx_file else ref["prefill_seq_len"])
        kv = args.kv if args.kv is not None else seq
    return seq, kv


def _builtin(args) -> int:
    from npusim.model.builder import build_graph
    from npusim.model.summary import graph_totals, model_summary
    from npusim.model.zoo import get_config

    cfg = get_config(args.name)
    summary = model_summary(args.name if not str(args.name).endswith(".json") else cfg, precision=args.precision)
    seq, kv = _sizes(args, reference=summary["reference"])
    graph = build_graph(cfg, args.phase, args.batch, seq, kv, precision=args.precision, moe_skew=args.moe_skew,
                        seed=args.seed, layers=args.layers, mtp=args.mtp)
    totals = graph_totals(graph)
    gsum = _graph_json(graph, totals, args.precision)
    if args.json:
        print(json_text({**summary, "graph": gsum}))
        return 0
    s = summary
    print(f"{cfg.name} ({cfg.family}) - {cfg.source}")
    print(f"  {_shape_line(cfg)}")
    pub = s["published"]
    pub_txt = f"; published {_count(pub['params'])}" if pub else ""
    print(f"  parameters   {_count(s['params'])} (non-embedding {_count(s['params_non_embedding'])}{pub_txt})")
    if cfg.is_moe:
        pa = f"; published {_count(pub['active'])}" if pub and pub.get("active") else ""
        print(f"               {_count(s['params_active'])} active per token{pa}")
    if s["params_mtp"]:
        print(f"               + {_count(s['params_mtp'])} in the MTP module (as stored)")
    print(f"  weights      {_bytes(s['weight_bytes'])} at {args.precision}")
    print(f"  KV cache     {s['kv_bytes_per_token']:,} B per token ({s['kv_bytes_per_token'] / 1024:.1f} KiB, "
          f"all {cfg.num_layers} layers, bf16)")
    print(f"  per token    prefill (seq {s['reference']['prefill_seq_len']}): "
          f"{s['flops_per_token_prefill'] / 1e9:,.3f} GFLOP (GEMM {s['gemm_flops_per_token_prefill'] / 1e9:,.3f}), "
          f"{_bytes(s['bytes_per_token_prefill'])} read")
    print(f"               decode (kv {s['reference']['decode_kv_len']}, batch 1): "
          f"{s['flops_per_token_decode'] / 1e9:,.3f} GFLOP (GEMM {s['gemm_flops_per_token_decode'] / 1e9:,.3f}), "
          f"{_bytes(s['bytes_per_token_decode'])} read (weights {_bytes(s['weight_read_bytes_decode'])}, "
          f"KV {_bytes(s['kv_read_bytes_decode'])})")
    print()
    _print_graph(graph, totals, args.precision)
    return 0


def _onnx(args) -> int:
    from npusim.model.onnx_import import load_onnx
    from npusim.model.summary import graph_totals

    seq, kv = _sizes(args, onnx_file=True)
    graph = load_onnx(args.name, batch=args.batch, seq_len=seq, kv_len=kv, dims=dict(args.dim),
                      allow_unsupported=args.allow_unsupported, dtype=args.dtype)
    totals = graph_totals(graph)
    tokens = graph.batch * graph.seq_len
    params = sum(int(op.weight_bytes / op.weight_elem_bytes) for op in graph.ops
                 if op.weight_bytes and not op.attrs.get("shared_weight"))
    gsum = _graph_json(graph, totals, args.dtype or "as exported")
    out = {"name": graph.name, "source": graph.meta["source"], "params": params,
           f"flops_per_token_{graph.phase}": totals["flops"] / tokens,
           "kv_bytes_per_token": totals["kv_bytes_per_token"], "meta": graph.meta, "graph": gsum}
    if args.json:
        print(json_text(out))
        return 0
    m = graph.meta
    opsets = ", ".join(f"{k} {v}" for k, v in m["opsets"].items())
    print(f"{graph.name} - {m['source']} ({m['producer'] or 'unknown producer'}; opsets {opsets})")
    print(f"  {m['nodes']} nodes: {m['folded_nodes']} folded at compile time, {len(graph.ops)} IR ops")
    print(f"  dims         {', '.join(f'{k}={v}' for k, v in m['dims'].items()) or 'none (static shapes)'}")
    print(f"  patterns     {', '.join(f'{k} x{v}' for k, v in m['patterns'].items()) or 'none'}")
    if m["unsupported"]:
        print(f"  unsupported  {len(m['unsupported'])} node(s) costed as data movement: "
              f"{', '.join(sorted({u['op_type'] for u in m['unsupported']}))}")
    print(f"  parameters   {_count(params)} (weight operands)")
    print(f"  KV cache     {totals['kv_bytes_per_token']:,} B per token (attention ops)")
    print(f"  per token    {totals['flops'] / tokens / 1e9:,.4f} GFLOP ({graph.phase})")
    print()
    _print_graph(graph, totals, args.dtype or "as exported")
    return 0


def _graph_json(graph, totals, precision) -> dict:
    return {"phase": graph.phase, "batch": graph.batch, "seq_len": graph.seq_len, "kv_len": graph.kv_len,
            "precision": precision, "layers": len(graph.layers()), **totals}


def _print_graph(graph, totals, precision) -> None:
    print(f"graph {graph.name}: {graph.phase}, batch {graph.batch}, seq {graph.seq_len}, kv {graph.kv_len}, "
          f"{precision}: {totals['ops']:,} ops, {len(graph.layers())} layers")
    head = (f"  {'kind':<10} {'ops':>6} {'GFLOP':>12} {'weights MB':>11} {'wt read MB':>11} {'KV read MB':>11} "
            f"{'act MB':>10}")
    print(head)
    rows = list(totals["by_kind"].items()) + [("total", totals)]
    for kind, r in rows:
        print(f"  {kind:<10} {r['ops']:>6,} {r['flops'] / 1e9:>12,.3f} {r['weight_bytes'] / 2**20:>11,.1f} "
              f"{r['weight_read_bytes'] / 2**20:>11,.1f} {r['kv_read_bytes'] / 2**20:>11,.1f} "
              f"{r['activation_bytes'] / 2**20:>10,.1f}")


def _shape_line(cfg) -> str:
    if cfg.is_mla:
        attn = (f"MLA {cfg.num_heads} heads (q_lora {cfg.q_lora_rank}, kv_lora {cfg.kv_lora_rank}, "
                f"qk {cfg.qk_nope_head_dim}+{cfg.qk_rope_head_dim}, v {cfg.v_head_dim})")
    else:
        attn = f"{cfg.num_heads} query / {cfg.num_kv_heads} KV heads x {cfg.head_dim}"
    if cfg.is_moe:
        ffn = (f"{cfg.num_experts} experts top-{cfg.experts_per_token} x {cfg.moe_intermediate_size}"
               + (f" + {cfg.num_shared_experts} shared" if cfg.num_shared_experts else "")
               + (f", first {cfg.first_dense_layers} layers dense FFN {cfg.intermediate_size}"
                  if cfg.first_dense_layers else ""))
    else:
        ffn = f"FFN {cfg.intermediate_size}"
    tied = ", tied embeddings" if cfg.tie_word_embeddings else ""
    mtp = f", {cfg.num_mtp_layers} MTP layer" if cfg.num_mtp_layers else ""
    return (f"{cfg.num_layers} layers, hidden {cfg.hidden_size}, {attn}, {ffn}, vocab {cfg.vocab_size:,}"
            f"{tied}{mtp}")


def _count(n) -> str:
    if n is None:
        return "-"
    for div, unit in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(n) >= div:
            return f"{n / div:.3f} {unit}"
    return str(int(n))


def _bytes(n) -> str:
    for div, unit in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if abs(n) >= div:
            return f"{n / div:,.2f} {unit}"
    return f"{int(n)} B"
