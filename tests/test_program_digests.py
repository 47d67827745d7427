"""Programs the mapper builds, pinned task for task: each case's program (kinds, cores, units,
parameters, cost arguments, dependencies, names, vector functions) and the mapper's L2 reads and
GEMM decisions hash to the digest computed on main 5b24b88, before program building was made
faster (session 50: flash attention recorded once per shape and relocated to other layers,
groups and cores; a cheaper ``Program._add``). A speed-up of building must not change a program.

The cases cover what the flash-attention lowering branches on: prefill and decode, mixed batches
(two attention groups), GQA (Qwen3, Llama 3), MHA (GPT-2) and MLA (DeepSeek-V3, its own lowering),
split-KV decode, head- and token-parallel (``tp_mn``) attention, KV wholly, half or not in HBM,
local cores (npusim-64c) and decoupled ones with an L2 (the Ascend dies), L2 reads addressed
(``l2_addressed``, the TLM L2) or modelled, data-parallel replicas on other cores.
"""

from __future__ import annotations

import hashlib

import pytest

from npusim.arch import load_arch
from npusim.mapping.mapper import map_model
from npusim.mapping.spec import spec_from_flags
from npusim.serving.iteration import build_groups_graph
from npusim.sim.program import clear_recorded

# id: arch, model, layers, TP degree, stages, partition, groups (requests, q_len, kv_len, prefill),
# sampled rows, KV share in HBM, L2 addressed -> (digest on 5b24b88, tasks)
CASES = {
    "64c-prefill": ("npusim-64c", "qwen3-4b", 4, 4, 2, None, [(1, 256, 512, True)], 1, 1.0, False),
    "64c-prefill-long": ("npusim-64c", "qwen3-0.6b", 2, 4, 1, None, [(1, 512, 8192, True)], 1, 1.0, False),
    "64c-decode": ("npusim-64c", "qwen3-4b", 4, 4, 2, None, [(8, 1, 1024, False)], 8, 1.0, False),
    "64c-decode-splitkv": ("npusim-64c", "llama-3-8b", 2, 16, 1, None, [(1, 1, 4096, False)], 1, 1.0, False),
    "64c-mixed-half": ("npusim-64c", "qwen3-4b", 4, 4, 2, None, [(1, 64, 64, True), (8, 1, 1024, False)], 9, 0.5,
                       False),
    "64c-mixed-sram": ("npusim-64c", "qwen3-0.6b", 3, 4, 1, None, [(1, 256, 768, True), (2, 1, 300, False)], 2, 0.0,
                       False),
    "64c-mha-gpt2": ("npusim-64c", "gpt2", 2, 4, 1, None, [(2, 128, 384, True), (4, 1, 700, False)], 6, 1.0, False),
    "64c-tp_k": ("npusim-64c", "qwen3-0.6b", 2, 4, 1, "tp_k", [(1, 256, 512, True), (4, 1, 900, False)], 5, 1.0,
                 False),
    "64c-tp_mn": ("npusim-64c", "qwen3-0.6b", 2, 4, 1, "tp_mn", [(2, 300, 1300, True)], 2, 1.0, False),
    "64c-mla": ("npusim-64c", "deepseek-v3", 1, 4, 1, None, [(1, 64, 256, True), (4, 1, 2048, False)], 5, 1.0, False),
    "910b-prefill": ("ascend-910b", "qwen3-4b", 2, 8, 1, None, [(1, 512, 1024, True)], 1, 1.0, False),
    "910b-decode": ("ascend-910b", "llama-3-8b", 2, 24, 1, None, [(4, 1, 3000, False)], 4, 1.0, False),
    "910b-mixed-l2addr": ("ascend-910b", "qwen3-0.6b", 2, 8, 1, None, [(1, 128, 640, True), (8, 1, 2000, False)], 9,
                          1.0, True),
    "910b-decode-l2addr": ("ascend-910b", "llama-3-8b", 2, 24, 1, None, [(2, 1, 8000, False)], 2, 0.5, True),
    "910c-mla": ("ascend-910c-die", "deepseek-v3", 1, 8, 1, None, [(1, 32, 96, True), (8, 1, 4096, False)], 9, 1.0,
                 False),
    "910b-tp_mn-sram": ("ascend-910b", "qwen3-0.6b", 2, 8, 1, "tp_mn", [(1, 384, 384, True), (16, 1, 500, False)], 17,
                        0.0, False),
    "64c-tp_mn-decode": ("npusim-64c", "qwen3-4b", 2, 4, 1, "tp_mn", [(8, 1, 2000, False)], 8, 1.0, False),
    "910b4-tp_k": ("ascend-910b4", "qwen3-4b", 2, 4, 1, "tp_k", [(1, 200, 600, True)], 1, 0.25, False),
}
DIGESTS = {
    "64c-prefill": ("87aa108a189e608688d7", 6030),
    "64c-prefill-long": ("67da14f6fefbea311950", 3429),
    "64c-decode": ("b57c4022afd096b3b863", 33008),
    "64c-decode-splitkv": ("67612d4ab03fa9528cf9", 14662),
    "64c-mixed-half": ("3b2e3e3548905dd4b2c0", 40048),
    "64c-mixed-sram": ("5b831cf2f0c8c89d810a", 12831),
    "64c-mha-gpt2": ("b54811b481121b24243c", 11598),
    "64c-tp_k": ("b723aa610831cc74bfac", 19820),
    "64c-tp_mn": ("2188eb8ab93ce001a406", 8486),
    "64c-mla": ("98f1fd0a07619b97b42f", 30720),
    "910b-prefill": ("7caaf7b42aac12575c82", 37850),
    "910b-decode": ("26e44c65bab91977f565", 63747),
    "910b-mixed-l2addr": ("65fad1ebf0632f835354", 71958),
    "910b-decode-l2addr": ("a55edf38aa988188c4ab", 87795),
    "910c-mla": ("17edf9d007fd296be41e", 60276),
    "910b-tp_mn-sram": ("4baf65d0ff20d2a964c2", 63586),
    "64c-tp_mn-decode": ("1d80dc68bf1b9f6707db", 53728),
    "910b4-tp_k": ("65b33aefb2098220f173", 21466),
}


def build(case: str):
    arch, model, layers, tp, stages, partition, groups, sampled, frac, l2 = CASES[case]
    graph = build_groups_graph(model, groups, sampled, layers=layers)
    spec = spec_from_flags(tp=tp, stages=stages, partition=partition,
                           layout="ring" if arch.startswith("npusim") else "linear_seq")
    return map_model(graph, load_arch(arch), spec, kv_hbm_fraction=frac, l2_addressed=l2)


def digest(mapped) -> str:
    """A hash of every recorded field (as Python values: a numpy integer would change it too)."""
    p = mapped.program
    h = hashlib.sha256()
    for f in (p.kind, p.core, p.unit, p.param, p.cost_kind, p.cost_args, p.dep_idx, p.dep_end, p.names, p.vector_fns):
        h.update(repr([tuple(x) if isinstance(x, tuple) else x for x in f]).encode())
    h.update(repr((round(mapped.l2_read_bytes), sorted(mapped.decisions.items()))).encode())
    return h.hexdigest()[:20]


@pytest.mark.parametrize("case", sorted(CASES))
def test_programs_are_those_of_5b24b88(case):
    clear_recorded()  # built from scratch (blocks it records are replayed inside the program only)
    mapped = build(case)
    assert (digest(mapped), len(mapped.program)) == DIGESTS[case]


def _fields(prog) -> tuple:
    return (prog.kind, prog.core, prog.unit, prog.param, prog.cost_kind, prog.cost_args, prog.deps, prog.names)


def _block(prog, cores, prefix, bases, ready):
    """A small pipeline on ``cores``: per core a DMA at its base + 4096 i, a GEMM, a vector op, and a
    barrier over the cores' last tasks."""
    last = []
    for i, c in enumerate(cores):
        d = prog.add_dma(c, 1000 + i, address=bases[i] + 4096 * i, deps=[ready[i]], dma_engine=i % 2,
                         name=f"{prefix} read")
        g = prog.add_gemm(c, 16, 32, 64 + i, deps=[d], name=f"{prefix} QK")
        last.append(prog.add_vector(c, "softmax", 512, deps=[g], name=f"{prefix} softmax", row_len=64))
    done = prog.add_barrier(last, prefix)
    return [done] + last, None


def _record(prog, cores, prefix, bases, ready, relocate: bool):
    from npusim.sim.program import Relocation

    where = Relocation(tuple(cores), prefix, tuple(bases)) if relocate else None
    outs, _ = prog.recorded(("test block",), ready, lambda: (_block(prog, cores, prefix, bases, ready)[0], "kept"),
                            relocate=where)
    return outs


def test_a_relocated_block_replays_as_its_build_on_other_cores_names_and_addresses():
    from npusim.sim.program import Program, recorded_stats

    places = [([0, 1, 2], "L0.attn", [1 << 20, 2 << 20, 3 << 20]), ([5, 3, 7], "r1.L7.attn", [9 << 20, 8 << 20, 7 << 20]),
              ([2, 1, 0], "x", [0, 0, 0])]
    clear_recorded()
    relocated, plain = Program(8), Program(8)
    for cores, prefix, bases in places:
        ready = [relocated.add_compute(c, "vector", 5) for c in cores]
        assert _record(relocated, cores, prefix, bases, ready, True) == \
            _block(plain, cores, prefix, bases, [plain.add_compute(c, "vector", 5) for c in cores])[0]
    assert recorded_stats()["replayed"] == 2
    assert _fields(relocated) == _fields(plain)


def test_blocks_that_cannot_be_relocated_are_not_kept():
    """A task on a core outside the relocation, a name without its prefix or a NoC transfer (its
    parameters name cores): built every time, never replayed elsewhere."""
    from npusim.sim.program import Program, Relocation, recorded_stats

    def outside(prog):
        return [prog.add_compute(3, "vector", 5, name="p x")], "kept"

    def unnamed(prog):
        return [prog.add_compute(0, "vector", 5, name="other")], "kept"

    def send(prog):
        return [prog.add_send(0, 1, 64, name="p send")], "kept"

    for build in (outside, unnamed, send):
        clear_recorded()
        prog = Program(4)
        for _ in range(2):
            prog.recorded(("refused",), [], lambda: build(prog), relocate=Relocation((0, 1), "p", (0, 0)))
        assert recorded_stats()["blocks"] == 0 and len(prog) == 2
