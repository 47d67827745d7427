"""One GEMM lowering for the chip simulator and ChipCost (issue 39 item 2): on a die with
``kernel.base_blocks`` the mapper lowers a ``gemm`` op with the plan and tasks ``ChipCost.gemm``
times (:mod:`npusim.mapping.gemm_kernel`), so a lone GEMM op mapped onto the die and the chip-cost
GEMM take the same time; dies without the section keep the mapper's TP lowering."""

import pytest

from npusim.arch import load_arch
from npusim.config import validate
from npusim.mapping.mapper import map_model
from npusim.mapping.spec import MappingSpec, spec_from_flags
from npusim.model.ir import Graph, Op
from npusim.serving.iteration import build_groups_graph
from npusim.sim.program import clear_recorded, recorded_stats
from npusim.system.chipcost import ChipCost

#: engine (mapper) time / ChipCost time: both run the same tasks for a lone op; the tolerance covers
#: the mapper's zero-time barrier tasks and nothing else (measured: equal to the cycle)
TOLERANCE = 0.005

SHAPES = [  # (m, k, n, dtype): session 40's four bf16 shapes, decode shapes (M = 1..64), INT8
    (16, 7168, 4096, "bf16"), (128, 4096, 4096, "bf16"), (1024, 4096, 4096, "bf16"), (4096, 4096, 4096, "bf16"),
    (1, 7168, 2048, "bf16"), (8, 4096, 4096, "bf16"), (64, 7168, 4096, "bf16"),
    (16, 7168, 4096, "int8"), (512, 2048, 7168, "int8")]


def _spec(cores: int) -> MappingSpec:
    return validate(MappingSpec, {"name": "t", "tensor_parallel": {"degree": cores}, "data_parallel": 1,
                                  "memory": {"weights": "hbm", "kv_cache": "hbm"}}, "test mapping")


def _ratio(cc: ChipCost, m: int, k: int, n: int, dtype: str) -> tuple[float, object, object]:
    kernel = cc.gemm(m, k, n, dtype)
    mapped = cc.op(Op("gemm", "gemm", dtype=dtype, m=m, k=k, n=n, weight=True), spec=_spec(cc.arch.num_cores))
    return mapped.time_us / kernel.time_us, kernel, mapped


@pytest.mark.parametrize("m,k,n,dtype", SHAPES)
def test_mapper_and_chipcost_time_one_gemm_alike(m, k, n, dtype):
    cc = ChipCost("ascend-910b4", persist=False)
    ratio, kernel, mapped = _ratio(cc, m, k, n, dtype)
    assert abs(ratio - 1) <= TOLERANCE, (ratio, kernel.mapping, mapped.mapping)
    assert mapped.hbm_bytes == kernel.hbm_bytes and mapped.l2_read_bytes == kernel.l2_read_bytes
    assert mapped.cores_used == kernel.cores_used
    assert mapped.kernel_fixed_us == pytest.approx(kernel.kernel_fixed_us)  # start + prologue, once
    assert "kernel" in mapped.mapping


@pytest.mark.parametrize("memory,noc", [("analytical", "path"), pytest.param("tlm", "analytical", marks=pytest.mark.slow)])
def test_detailed_fidelities_time_the_same_tiles(memory, noc):
    """At the path NoC and at TLM memory (its L2 serving the loads at their addresses) the two
    lowerings still agree: the same tasks on the same cores."""
    cc = ChipCost("ascend-910b4", memory=memory, noc=noc, persist=False)
    ratio, kernel, mapped = _ratio(cc, 8, 4096, 4096, "bf16")
    assert abs(ratio - 1) <= TOLERANCE
    assert mapped.hbm_bytes == kernel.hbm_bytes and mapped.l2_read_bytes == kernel.l2_read_bytes


def test_kernel_gemm_in_a_forward_pass_waits_for_the_op_before():
    """In a graph, every core's kernel start waits for the op before on all of the group's cores
    (one kernel after another), and the op after waits for every core's write-back."""
    arch = load_arch("ascend-910b4")
    up = Op("l0.mlp.up_proj", "gemm", 0, "bf16", m=64, k=2048, n=4096, weight=True)
    act = Op("l0.mlp.act", "vector", 0, "bf16", elements=64 * 4096, row_len=4096, op_class="activation", fn="gelu")
    down = Op("l0.mlp.down_proj", "gemm", 0, "bf16", m=64, k=4096, n=2048, weight=True)
    graph = Graph("mlp", [up, act, down], phase="prefill", batch=1)
    prog = map_model(graph, arch, _spec(arch.num_cores)).program
    names = prog.names
    starts = [i for i, nm in enumerate(names) if nm and nm.startswith("r0.mb0.l0.mlp.down_proj") and
              nm.endswith("kernel start")]
    assert starts
    waits = next(i for i, nm in enumerate(names) if nm == "r0.mb0.l0.mlp.down_proj waits")
    for i in starts:
        assert waits in prog.deps[i]
    vector = {i for i, nm in enumerate(names) if nm == "r0.mb0.l0.mlp.act"}
    assert vector and vector <= set(prog.deps[waits])


def test_dies_without_base_blocks_keep_the_tp_lowering():
    graph = Graph("g", [Op("l0.mlp.up_proj", "gemm", 0, "bf16", m=16, k=2048, n=4096, weight=True)], batch=1)
    spec = spec_from_flags(tp=4)
    # npusim-64c has no kernel section: a TP partition (auto's pick, tp_n here: 16,654 cycles against tp_k's 18,632)
    assert map_model(graph, load_arch("npusim-64c"), spec).decisions["l0.mlp.up_proj"] in ("tp_k", "tp_n", "tp_mn", "tp_mnk")
    assert map_model(graph, load_arch("ascend-910b"), spec).decisions["l0.mlp.up_proj"] == "aclnn kernel"


def test_replayed_kernel_gemms_equal_fresh_ones():
    """Memoised lowering (``Program.recorded``) replays kernel GEMMs task for task."""
    arch = load_arch("ascend-910b")
    spec = spec_from_flags(tp=8, stages=2, layout="linear_seq")
    graphs = [build_groups_graph("qwen3-0.6b", [(8, 1, 512, False)], 8, layers=2),
              build_groups_graph("qwen3-0.6b", [(8, 1, 1536, False)], 8, layers=2)]

    def fields(prog):
        return (prog.kind, prog.core, prog.unit, prog.param, prog.cost_args, prog.deps, prog.names)

    fresh = []
    for g in graphs:
        clear_recorded()
        fresh.append(fields(map_model(g, arch, spec, kv_hbm_fraction=1.0).program))
    clear_recorded()
    memo = [fields(map_model(g, arch, spec, kv_hbm_fraction=1.0).program) for g in graphs]
    assert recorded_stats()["replayed"] > 0
    assert memo == fresh
    assert any(nm and nm.endswith("kernel start") for nm in memo[0][-1])  # the die's GEMM kernel ran


@pytest.mark.parametrize("weight_batched,hbm_fraction", [(True, 1.0), (False, 0.5)])
def test_batched_and_shared_hbm_gemms_agree_too(weight_batched, hbm_fraction):
    """A GEMM batched over heads with a weight per head (MLA's absorbed uk), and a GEMM given half
    of the die's HBM: ``ChipCost.op`` with and without a mapping spec run the same kernel."""
    cc = ChipCost("ascend-910b4", persist=False)
    op = Op("L0.attn.uk_absorb", "gemm", 0, "int8", m=48, k=128, n=512, batch=128, weight=True,
            weight_batched=weight_batched)
    alone = cc.op(op, hbm_fraction=hbm_fraction)
    mapped = cc.op(op, spec=_spec(cc.arch.num_cores), hbm_fraction=hbm_fraction)
    assert abs(mapped.time_us / alone.time_us - 1) <= TOLERANCE


def test_at_tlm_a_gemm_reads_what_the_kernel_gemm_before_wrote():
    """With the TLM L2 (``l2_addressed``) a kernel GEMM reads A from where the kernel GEMM before it
    wrote C, and its B at the weight's address: the simulated cache then serves the activation
    the previous kernel left in it."""
    from npusim.sim.kernel import KIND_DMA

    arch = load_arch("ascend-910b4")
    up = Op("l0.mlp.up_proj", "gemm", 0, "bf16", m=64, k=2048, n=4096, weight=True)
    down = Op("l0.mlp.down_proj", "gemm", 0, "bf16", m=64, k=4096, n=2048, weight=True)
    mapper_prog = map_model(Graph("mlp", [up, down], phase="prefill", batch=1), arch, _spec(arch.num_cores),
                            l2_addressed=True).program
    activations = int(arch.hbm.capacity_gb * 2**30) // 4

    def dmas(op_name: str, write: bool) -> list[tuple[int, int]]:
        return [(p[1], p[0]) for kind, p, nm in zip(mapper_prog.kind, mapper_prog.param, mapper_prog.names)
                if kind == KIND_DMA and nm.startswith(f"r0.mb0.{op_name} ") and bool(p[2]) == write]

    written = dmas("l0.mlp.up_proj", True)
    a_reads = [(at, n) for at, n in dmas("l0.mlp.down_proj", False) if at >= activations]
    b_reads = [(at, n) for at, n in dmas("l0.mlp.down_proj", False) if at < activations]
    assert written and a_reads and b_reads
    assert min(at for at, _ in a_reads) == min(at for at, _ in written)
    assert max(at + n for at, n in a_reads) <= max(at + n for at, n in written)
