"""The mapper's memory plan: KV per pipeline stage, gathered weights across micro-batches,
first-use weight loads, the notes it prints, and the linear layouts' origins."""

import re
from dataclasses import replace

import pytest

from npusim.arch import load_arch
from npusim.errors import ConfigError
from npusim.mapping.layout import place_groups
from npusim.mapping.mapper import map_model
from npusim.mapping.spec import spec_from_flags
from npusim.model.builder import build_graph
from npusim.model.zoo import BUILTIN
from npusim.sim import Simulator
from npusim.sim.kernel import KIND_DMA, KIND_NOC

MIB = 2**20


def _gpt2(**kw):
    # NPU-SIM's GPT-2 runs prompts past the 1,024 learned positions; the costs do not depend on it
    cfg = replace(BUILTIN["GPT-2"], max_position_embeddings=4096)
    return build_graph(cfg, **kw)


def _spec(tp, stages, weights=None, partition=None, micro=None):
    spec = spec_from_flags(tp=tp, stages=stages, partition=partition).model_copy(update={"data_parallel": 1})
    if weights:
        spec = spec.model_copy(update={"memory": spec.memory.model_copy(update={"weights": weights})})
    if micro:
        spec = spec.model_copy(update={"pipeline": spec.pipeline.model_copy(update={"microbatches": micro})})
    return spec


def _arch(tmp_path, sram_mb):
    p = tmp_path / f"sram{sram_mb}.yaml"
    p.write_text(f"extends: npusim-64c\nname: npusim-64c-sram{sram_mb}\ncores:\n  sram: {{capacity_mb: {sram_mb}}}\n")
    return load_arch(p)


def test_kv_is_charged_per_stage(arch64):
    """GPT-2 small, 12 stages, 10 prompts of 1,280 tokens: a stage holds one layer's KV, 37.5 MiB
    (10 x 1,280 x 2 x 768 x 2 B), not the whole model's 450 MiB."""
    g = _gpt2(phase="prefill", batch=10, seq_len=1280)
    m = map_model(g, arch64, _spec(1, 12))
    assert m.kv_bytes_per_core == 10 * 1280 * 2 * 768 * 2 == 37.5 * MIB
    assert g.kv_read_bytes == 12 * m.kv_bytes_per_core
    # half the prompts: 18.75 MiB a stage fits the 30 MB budget, so the cache stays in SRAM
    half = map_model(_gpt2(phase="prefill", batch=5, seq_len=1280), arch64, _spec(1, 12))
    assert not half.kv_in_hbm and half.kv_bytes_per_core == 18.75 * MIB


def test_forced_hbm_note_says_whether_weights_would_fit(arch64):
    g = _gpt2(phase="decode", batch=1, seq_len=1, kv_len=128)
    m = map_model(g, arch64, _spec(4, 12, weights="hbm"))
    note = next(n for n in m.notes if n.startswith("weights stream"))
    assert "memory.weights: hbm" in note and "would fit" in note and "do not fit" not in note
    big = map_model(g, arch64, _spec(1, 1, weights="hbm"))
    assert "do not fit" in next(n for n in big.notes if n.startswith("weights stream"))


def test_a_reserve_larger_than_the_sram_leaves_none_and_says_so(tmp_path):
    """The default 2 MB reserve for activations on the Ascend presets' 0.5 MB cores: no SRAM left
    for weights or KV (the budget was the difference, -1.5 MB, printed as such)."""
    arch = _arch(tmp_path, 0.5)
    g = build_graph("qwen3-0.6b", phase="decode", batch=2, seq_len=1, kv_len=64, layers=1)
    m = map_model(g, arch, _spec(4, 1))
    note = next(n for n in m.notes if n.startswith("weights stream"))
    assert not re.search(r"-\d", note), note
    assert "keeps all of each core's 0.5 MB" in note and not m.weights_resident and m.kv_in_hbm
    forced = _spec(4, 1).model_copy(update={"memory": _spec(4, 1).memory.model_copy(update={"kv_cache": "sram"})})
    with pytest.raises(ConfigError, match=r"has 0\.0 MB \(capacity minus sram_reserve_mb\)"):
        map_model(g, arch, forced)


def test_linear_origin_follows_the_snake_path():
    (grp,) = place_groups(8, 8, 4, 1, 1, "linear_seq", [59])
    assert sorted(grp.cores) == [56, 57, 58, 59] and grp.cores[0] == 59
    with pytest.raises(ConfigError, match=r"valid origins for 4 cores on the 8x8 mesh: 0-55, 59-63"):
        place_groups(8, 8, 4, 1, 1, "linear_seq", [56])  # 56 is the path's last core: 3 cores left
    with pytest.raises(ConfigError, match="valid origins: 0-6, 8-14"):
        place_groups(8, 8, 4, 1, 1, "ring", [7])


def _noc_bytes(prog):
    return sum(p[2] for k, p in zip(prog.kind, prog.param) if k == KIND_NOC)


def test_gathered_weights_stay_gathered_across_microbatches(tmp_path):
    """TP-MN with resident weights: when the stage's gathered weights fit SRAM beside the shards,
    micro-batches reuse them (the default is then one per stage); the mesh carries the weights once."""
    arch = _arch(tmp_path, 256)
    g = _gpt2(phase="decode", batch=8, seq_len=1, kv_len=64)
    one = map_model(g, arch, _spec(2, 4, partition="tp_mn", micro=1))
    many = map_model(g, arch, _spec(2, 4, partition="tp_mn"))
    assert many.weights_resident and many.microbatches == 4
    # activations move the same total either way; weight gathers are not repeated
    assert _noc_bytes(many.program) == pytest.approx(_noc_bytes(one.program), rel=0.02)


def test_microbatches_default_to_one_when_gathers_would_repeat(tmp_path):
    arch = _arch(tmp_path, 96)  # the shards fit, the gathered weights beside them do not
    g = _gpt2(phase="decode", batch=8, seq_len=1, kv_len=64)
    m = map_model(g, arch, _spec(2, 4, partition="tp_mn"))
    assert m.weights_resident and m.microbatches == 1
    forced = map_model(g, arch, _spec(2, 4, partition="tp_mn", micro=4))
    assert forced.microbatches == 4 and any("all-gather the TP-MN/MNK weights again" in n for n in forced.notes)
    assert _noc_bytes(forced.program) > 1.5 * _noc_bytes(m.program)


@pytest.mark.parametrize("partition", ["tp_k", "tp_mn"])
def test_first_use_loads_each_weight_once(arch64, partition):
    """memory.weights first_use: every core loads its resident shards once, whatever the
    micro-batches; the pass costs more than with preloaded weights, less than streaming."""
    g = _gpt2(phase="decode", batch=8, seq_len=1, kv_len=64, layers=4)
    first = map_model(g, arch64, _spec(4, 2, weights="first_use", partition=partition, micro=2))
    loads = [p[0] for k, p, n in zip(first.program.kind, first.program.param, first.program.names)
             if k == KIND_DMA and "first load" in n]
    shards = sum(op.weight_bytes for op in g.ops if op.kind == "gemm" and op.weight)
    assert sum(loads) == pytest.approx(shards, rel=0.01)  # TP shards over the cores add up to the weights
    times = {}
    for w in ("sram", "first_use", "hbm"):
        m = map_model(g, arch64, _spec(4, 2, weights=w, partition=partition, micro=2))
        sim = Simulator(arch64, memory_mode="analytical", noc_mode="path")
        m.program.submit(sim)
        sim.run()
        times[w] = sim.makespan()
    assert times["sram"] < times["first_use"] < times["hbm"]
