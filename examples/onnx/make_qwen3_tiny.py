"""Export a tiny 2-layer Qwen3 decoder (random weights) to ONNX with torch.onnx (dynamo).

Writes, next to this script:
  qwen3_tiny_config.json      the Hugging Face config used (also read by npusim's builder)
  qwen3_tiny_opset18.onnx     attention, RMSNorm, RoPE and SiLU written out as primitive ops
  qwen3_tiny_opset23.onnx     the same model with ONNX 23's Attention, RMSNormalization and
                              RotaryEmbedding ops

Node metadata other than the module path (stack traces, FX dumps) is stripped after export
to keep each file under 2 MB; the graph itself is the exporter's, untouched.

Run in a separate environment (not npusim's):
  python3 -m venv /tmp/export-venv
  /tmp/export-venv/bin/pip install torch==2.13.0 transformers onnx onnxscript
  /tmp/export-venv/bin/python examples/onnx/make_qwen3_tiny.py
"""

import json
from pathlib import Path

import onnx
import torch
import transformers
from transformers import Qwen3Config, Qwen3ForCausalLM

HERE = Path(__file__).resolve().parent

CONFIG = dict(
    vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
    tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=1_000_000.0, use_cache=False,
)


class LogitsOnly(torch.nn.Module):
    """input_ids [batch, seq] -> logits [batch, seq, vocab] (no KV cache, no mask input)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


#: node metadata kept: the module path (npusim reads layer numbers from it); the exporter's
#: stack traces and FX-node dumps are dropped to keep the file small
KEEP_METADATA = ("namespace", "pkg.torch.onnx.name_scopes")


def strip_debug_metadata(path: Path) -> None:
    model = onnx.load(str(path))
    for node in model.graph.node:
        keep = [(p.key, p.value) for p in node.metadata_props if p.key in KEEP_METADATA]
        del node.metadata_props[:]
        for key, value in keep:
            node.metadata_props.add(key=key, value=value)
    onnx.save(model, str(path))


def main():
    torch.manual_seed(0)
    config = Qwen3Config(**CONFIG)
    model = LogitsOnly(Qwen3ForCausalLM(config)).eval()
    (HERE / "qwen3_tiny_config.json").write_text(json.dumps({"model_type": "qwen3", "name": "qwen3-tiny", **CONFIG},
                                                            indent=2) + "\n")
    ids = torch.randint(0, CONFIG["vocab_size"], (2, 16))
    batch = torch.export.Dim("batch_size", min=1, max=64)
    seq = torch.export.Dim("sequence_length", min=2, max=1024)
    for opset in (18, 23):
        out = HERE / f"qwen3_tiny_opset{opset}.onnx"
        program = torch.onnx.export(model, (ids,), dynamo=True, opset_version=opset,
                                    dynamic_shapes={"input_ids": {0: batch, 1: seq}},
                                    input_names=["input_ids"], output_names=["logits"])
        program.save(str(out))
        strip_debug_metadata(out)
        print(f"{out.name}: {out.stat().st_size:,} bytes (torch {torch.__version__}, "
              f"transformers {transformers.__version__})")


if __name__ == "__main__":
    main()
