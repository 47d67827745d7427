"""The mapper's memory plan (issue 12 section 6), on NPU-SIM's own GPT-2 and PD configurations.

1. KV per core under pipeline parallelism: GPT-2 small, 12 stages, TP 1, 10 prompts of 1,280
   tokens (GPT-2's 1,024 learned positions lifted, as NPU-SIM runs it). A core holds only its
   stage's layers' KV: 10 x 1,280 x 2 x 768 x 2 B = 37.5 MiB; the old plan charged the whole
   model's 450 MiB to every core.
2. Micro-batches with resident weights under TP-MN: a 16-core chip (npusim-64c's cores on a
   4x4 mesh), PD disaggregation 8:8, TP 2 x 4 stages each, GPT-2, 10 requests, prompt 64, 21
   output tokens, all arriving at once; SRAM 96 MB a core (the shards fit, the gathered weights
   beside them do not) and 256 MB (both fit). Micro-batches: the default, 1 and 4 (the old
   default: one per stage).
3. Weights loaded on first use, then kept (memory.weights: first_use) against preloaded (sram)
   and streamed (hbm): one GPT-2 decode step, and the same PD serving run.

    python validation/mapper_memory_study.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "perf"))
from machine import machine_line  # noqa: E402

from npusim.arch import load_arch  # noqa: E402
from npusim.mapping.mapper import map_model  # noqa: E402
from npusim.mapping.spec import spec_from_flags  # noqa: E402
from npusim.model.builder import build_graph  # noqa: E402
from npusim.model.zoo import BUILTIN  # noqa: E402
from npusim.scenarios.forward import simulate_forward  # noqa: E402

MIB = 2**20
TMP = Path(tempfile.mkdtemp(prefix="mapper-memory-"))


def gpt2(**kw):
    return build_graph(replace(BUILTIN["GPT-2"], max_position_embeddings=4096), **kw)


def chip16(sram_mb: int) -> Path:
    p = TMP / f"chip16-{sram_mb}.yaml"
    p.write_text(f"extends: npusim-64c\nname: npusim-16c-sram{sram_mb}\ncores:\n  grid: {{width: 4, height: 4}}\n"
                 f"  sram: {{capacity_mb: {sram_mb}}}\n")
    return p


def mapping(micro: int | None, weights: str = "auto") -> Path:
    p = TMP / f"map-{micro}-{weights}.yaml"
    lines = ["tensor_parallel: {degree: 2, partition: {default: tp_mn}}", f"memory: {{weights: {weights}}}"]
    if micro:
        lines.append(f"pipeline: {{stages: 4, microbatches: {micro}}}")
    p.write_text("\n".join(lines) + "\n")
    return p


def serve(arch: Path, spec: Path) -> dict:
    cmd = [sys.executable, "-m", "npusim", "run", "--arch", str(arch), "--mapping", str(spec), "--model", "gpt2",
           "--requests", "10", "--input-len", "64", "--output-len", "21", "--rate", "1e9", "--schedule", "disagg",
           "--pd-ratio", "8:8", "--pd-stages", "4:4", "--json", "--no-progress"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(p.stderr.strip().splitlines()[-1])
    return json.loads(p.stdout)


def main() -> None:
    t0 = time.perf_counter()
    arch = load_arch("npusim-64c")
    print("1. KV per core, GPT-2 small, 12 stages, TP 1, prefill of 10 x 1,280 tokens (npusim-64c, 30 MB budget)")
    print(f"{'prompts':>7} {'whole model / t (old)':>22} {'per stage (now)':>16} {'KV in HBM':>9}")
    for batch in (10, 5):
        g = gpt2(phase="prefill", batch=batch, seq_len=1280)
        spec = spec_from_flags(tp=1, stages=12).model_copy(update={"data_parallel": 1})
        m = map_model(g, arch, spec)
        print(f"{batch:>7} {g.kv_read_bytes / MIB:18.1f} MiB {m.kv_bytes_per_core / MIB:12.1f} MiB {str(m.kv_in_hbm):>9}")
    print("   (old: 450 / 225 MiB > 30 MB put both caches in HBM)")

    print("\n2. PD disaggregation on 16 cores, GPT-2, TP-MN 2 x 4 stages per instance, 10 requests 64 -> 21 tokens")
    print(f"{'SRAM MB':>7} {'micro-batches':>15} {'resident':>8} {'run ms':>8} {'TPOT ms':>8} {'TTFT ms':>8} "
          f"{'HBM GB':>10}")
    for sram in (96, 256):
        for micro in (None, 1, 4):
            s = serve(chip16(sram), mapping(micro))
            end = max(s["e2e_ms"]["max"], 0)
            print(f"{sram:>7} {('default' if micro is None else str(micro)):>15} {str(s['weights_resident']):>8} "
                  f"{end:8.2f} {s['tpot_ms']['mean']:8.3f} {s['ttft_ms']['mean']:8.3f} "
                  f"{s['hbm_bytes'] / 1e9:10.2f}", flush=True)

    print("   one forward pass on the 256 MB chip (gathered weights kept), TP-MN 2 x 4 stages, 8 sequences (ms):")
    big = load_arch(chip16(256))
    for phase, kw in (("prefill 256", dict(phase="prefill", batch=8, seq_len=256)),
                      ("decode KV 256", dict(phase="decode", batch=8, seq_len=1, kv_len=256))):
        row = []
        for micro in (None, 1, 4):
            spec = spec_from_flags(tp=2, stages=4, partition="tp_mn").model_copy(update={"data_parallel": 1})
            if micro:
                spec = spec.model_copy(update={"pipeline": spec.pipeline.model_copy(update={"microbatches": micro})})
            s = simulate_forward(gpt2(**kw), big, spec, memory_mode="analytical").summary
            row.append(f"{'default' if micro is None else micro}: {s['latency_ms']:.3f}"
                       + (f" ({s['mapping']['microbatches']})" if micro is None else ""))
        print(f"   {phase:>14}  " + ", ".join(row), flush=True)

    print("\n3. Weights: preloaded (sram), loaded on first use then kept (first_use), streamed (hbm)")
    g = gpt2(phase="decode", batch=8, seq_len=1, kv_len=64)
    big = load_arch(chip16(256))
    print(f"   one decode step, 8 sequences, TP 2 x 4 stages on {big.name} (16 cores), one micro-batch:")
    for w in ("sram", "first_use", "hbm"):
        spec = spec_from_flags(tp=2, stages=4, partition="tp_mn").model_copy(update={"data_parallel": 1})
        spec = spec.model_copy(update={"memory": spec.memory.model_copy(update={"weights": w}),
                                       "pipeline": spec.pipeline.model_copy(update={"microbatches": 1})})
        s = simulate_forward(g, big, spec, memory_mode="analytical").summary
        print(f"   {w:>10}: {s['latency_ms']:8.3f} ms, HBM {s['hbm_bytes'] / 1e6:8.1f} MB")
    print("   the PD serving run of 2. (SRAM 256 MB, default micro-batches):")
    for w in ("sram", "first_use", "hbm"):
        s = serve(chip16(256), mapping(None, w))
        print(f"   {w:>10}: run {s['e2e_ms']['max']:8.2f} ms, TTFT {s['ttft_ms']['mean']:7.3f} ms, "
              f"TPOT {s['tpot_ms']['mean']:6.3f} ms, HBM {s['hbm_bytes'] / 1e9:6.2f} GB", flush=True)
    print(f"\nwall time {time.perf_counter() - t0:.1f} s; {machine_line()}")


if __name__ == "__main__":
    main()
