"""Chip costs (npusim.system.chipcost): memoisation, the on-disk cache and its invalidation, physical
bounds and orderings of the GEMM kernel, ops and graphs through the mapper, and ``npusim gemm --chip``."""

import json

import pytest

from npusim.arch import load_arch, summarize
from npusim.cli import main
from npusim.errors import ConfigError
from npusim.model.ir import Graph, Op
from npusim.mapping import gemm_kernel
from npusim.system import chipcost
from npusim.system.chipcost import ChipCost, ChipCostResult

ARCH = "ascend-910c-die"


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    """Nothing a test does may touch the user's cache (the CLI uses the default directory)."""
    monkeypatch.setenv("NPUSIM_CACHE_DIR", str(tmp_path / "npusim-cache"))


@pytest.fixture(scope="module")
def die():
    return load_arch(ARCH)


@pytest.fixture(scope="module")
def cc(die):
    """One memory-only instance shared by the ordering tests (its memo makes repeats free)."""
    return ChipCost(die, persist=False)


# -- the preset ---------------------------------------------------------------------------------------

def test_910c_die_preset(die, capsys):
    base = load_arch("ascend-910b")
    s = summarize(die)
    assert die.num_cores == 24 and die.cores.grid == base.cores.grid  # extends ascend-910b
    macs = die.cores.systolic_array.macs_per_pe_per_cycle
    assert macs["int8"] == 2 * macs["fp16"] == 2 * macs["bf16"]
    assert s.peak_tflops["int8"] == pytest.approx(2 * s.peak_tflops["bf16"])
    assert s.hbm_gb == 64 and s.hbm_bandwidth_gbps == pytest.approx(1600.0)
    assert main(["info", ARCH]) == 0
    assert "1,600.0 GB/s" in capsys.readouterr().out


# -- memoisation and the disk cache --------------------------------------------------------------------

def test_memory_hits_and_misses(die, tmp_path):
    cc = ChipCost(die, cache_dir=tmp_path)
    a = cc.gemm(256, 512, 256, "int8")
    assert (cc.stats.misses, cc.stats.memory_hits, cc.stats.disk_hits) == (1, 0, 0)
    b = cc.gemm(256, 512, 256, "int8", name="another name")
    assert (cc.stats.misses, cc.stats.memory_hits) == (1, 1)
    assert b.name == "another name" and b.cycles == a.cycles  # names are not part of the key
    cc.gemm(256, 512, 256, "bf16")  # another dtype,
    cc.gemm(256, 512, 256, "int8", cores=12)  # another share,
    cc.gemm(256, 512, 256, "int8", hbm_fraction=0.5)  # another HBM share: all misses
    assert cc.stats.misses == 4 and cc.stats.hits == 1 and cc.stats.lookups == 5
    # an op of the same shape is the same GEMM, whatever its name or layer
    op = Op("L7.mlp.up_proj", "gemm", layer=7, dtype="int8", m=256, k=512, n=256, weight=True)
    assert cc.op(op).cycles == a.cycles and cc.stats.memory_hits == 2


def test_disk_cache_survives_a_new_instance(die, tmp_path):
    first = ChipCost(die, cache_dir=tmp_path)
    r = first.gemm(128, 1024, 512, "int8", cores=8)
    assert first.stats.disk_writes == 1
    files = list(tmp_path.rglob("*.json"))
    assert len(files) == 1 and not list(tmp_path.rglob("*.partial"))
    second = ChipCost(die, cache_dir=tmp_path)
    again = second.gemm(128, 1024, 512, "int8", cores=8)
    assert (second.stats.misses, second.stats.disk_hits, second.stats.memory_hits) == (0, 1, 0)
    assert again == r and isinstance(again, ChipCostResult)
    second.gemm(128, 1024, 512, "int8", cores=8)
    assert second.stats.memory_hits == 1
    # the same hardware under another name shares the cache; other hardware does not
    renamed = die.model_copy(update={"name": "my-die"})
    third = ChipCost(renamed, cache_dir=tmp_path)
    assert third.gemm(128, 1024, 512, "int8", cores=8).arch == die.name and third.stats.disk_hits == 1
    faster = die.model_copy(update={"clock_ghz": 2.0})
    fourth = ChipCost(faster, cache_dir=tmp_path)
    fourth.gemm(128, 1024, 512, "int8", cores=8)
    assert fourth.stats.misses == 1


def test_cache_invalidated_when_the_model_code_changes(die, tmp_path, monkeypatch):
    ChipCost(die, cache_dir=tmp_path).gemm(64, 512, 512, "bf16")
    monkeypatch.setattr(chipcost, "code_digest", lambda: "edited-model")
    cc = ChipCost(die, cache_dir=tmp_path)
    cc.gemm(64, 512, 512, "bf16")
    assert (cc.stats.misses, cc.stats.disk_hits) == (1, 0)
    assert (tmp_path / "edited-model").is_dir()  # new entries under the new digest


def test_corrupt_or_foreign_cache_file_is_a_miss(die, tmp_path):
    ChipCost(die, cache_dir=tmp_path).gemm(64, 512, 512, "bf16")
    (path,) = tmp_path.rglob("*.json")
    path.write_text("{not json")
    cc = ChipCost(die, cache_dir=tmp_path)
    r = cc.gemm(64, 512, 512, "bf16")
    assert cc.stats.misses == 1 and json.loads(path.read_text())["result"]["cycles"] == r.cycles
    data = json.loads(path.read_text())
    data["key"]["m"] = 65  # a file whose key does not match (e.g. a hash collision) is not used
    path.write_text(json.dumps(data))
    cc = ChipCost(die, cache_dir=tmp_path)
    cc.gemm(64, 512, 512, "bf16")
    assert cc.stats.misses == 1


def test_persist_false_and_default_directory(die, tmp_path, monkeypatch):
    cc = ChipCost(die, persist=False)
    cc.gemm(64, 512, 512, "int8")
    assert cc.stats.disk_writes == 0 and not (tmp_path / "npusim-cache").exists()
    assert ChipCost(die).cache_dir == tmp_path / "npusim-cache" / "chipcost"
    monkeypatch.delenv("NPUSIM_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert chipcost.default_cache_dir() == tmp_path / "xdg" / "npusim" / "chipcost"


# -- physics of the GEMM kernel -------------------------------------------------------------------------

SHAPES = [(96, 7168, 2048), (512, 2048, 1536), (2048, 2048, 2048), (48, 1536, 4096), (4096, 512, 256)]


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
def test_utilisation_and_bandwidth_within_peaks(cc, die, dtype):
    peak_bw = summarize(die).hbm_bandwidth_gbps
    for m, k, n in SHAPES:
        for cores in (None, 8):
            r = cc.gemm(m, k, n, dtype, cores)
            assert r.flops == 2 * m * k * n and r.cycles > 0 and r.time_us == pytest.approx(r.cycles / 1850)
            assert 0 < r.compute_utilization <= r.share_compute_utilization <= 1
            assert r.tflops <= r.peak_tflops_share <= r.peak_tflops_chip
            assert 0 < r.hbm_bandwidth_gbps <= peak_bw * (1 + 1e-9) and r.hbm_peak_bandwidth_gbps == peak_bw
            # every operand byte reaches HBM at least once (to per-step rounding), the L2 serves only
            # re-reads; bytes are conserved
            assert r.hbm_bytes == r.hbm_read_bytes + r.hbm_write_bytes
            assert r.hbm_read_bytes >= (r.min_hbm_bytes - m * n * 2) * (1 - 1e-4)
            assert r.hbm_write_bytes == m * n * 2 and 0 <= r.l2_hit_rate <= 1
            assert r.l2_hit_rate == pytest.approx(r.l2_read_bytes / (r.l2_read_bytes + r.hbm_read_bytes))
            assert r.cores_used <= r.cores == (cores or 24)


@pytest.mark.parametrize("dtype", ["int8", "bf16"])
@pytest.mark.parametrize("k, n", [(7168, 2048), (2048, 7168), (1536, 1536)])
def test_a_bigger_gemm_is_never_faster(cc, dtype, k, n):
    times = [cc.gemm(m, k, n, dtype).cycles for m in (16, 64, 256, 1024, 4096)]
    assert times == sorted(times)
    assert cc.gemm(256, 2 * k, n, dtype).cycles >= cc.gemm(256, k, n, dtype).cycles
    assert cc.gemm(256, k, 2 * n, dtype).cycles >= cc.gemm(256, k, n, dtype).cycles


@pytest.mark.parametrize("m, k, n", [(96, 7168, 2048), (1024, 2048, 2048), (4096, 7168, 2048), (256, 1536, 512)])
def test_fewer_cores_are_never_faster(cc, m, k, n):
    for dtype in ("int8", "bf16"):
        t24, t12, t6 = (cc.gemm(m, k, n, dtype, cores).cycles for cores in (24, 12, 6))
        assert t6 >= t12 >= t24


def _fixed(cc, r) -> float:
    """A GEMM's start and prologue in cycles (kernel_fixed_us: the MIX start of an INT8 GEMM with a
    bf16 output, QuantBatchMatmulV3's UB dequant, included)."""
    return r.kernel_fixed_us * 1e3 * cc.arch.clock_ghz


def test_int8_is_not_slower_than_bf16(cc):
    # the work after the kernel's start: an INT8 GEMM's MIX kernel starts later (its AIVs), its work
    # never takes longer
    for shape in SHAPES:
        i8, b16 = cc.gemm(*shape, "int8"), cc.gemm(*shape, "bf16")
        assert i8.cycles - _fixed(cc, i8) <= b16.cycles - _fixed(cc, b16) + 1
    # compute-bound (a 2-core share, a long K: the L1 stages' loads hide under the MACs, HBM mostly idle):
    # INT8 about twice as fast, after the kernel's start and the cores' prologue (the arch's kernel
    # section) and the INT8 kernel's MIX start
    bf16, int8 = cc.gemm(512, 4096, 2048, "bf16", cores=2), cc.gemm(512, 4096, 2048, "int8", cores=2)
    assert bf16.share_compute_utilization > 0.7 and bf16.hbm_utilization < 0.3
    assert int8.cycles - _fixed(cc, int8) <= (bf16.cycles - _fixed(cc, bf16)) * 0.65


def test_ideal_l2_reads_each_operand_from_hbm_once(die):
    no_l2 = ChipCost(without_l2(die), persist=False).gemm(2048, 2048, 2048, "int8")
    l2 = ChipCost(without_l2(die), persist=False, l2_bytes_per_cycle=110).gemm(2048, 2048, 2048, "int8")
    assert no_l2.hbm_bytes > 3 * no_l2.min_hbm_bytes and no_l2.l2_read_bytes == no_l2.l2_hit_rate == 0
    assert l2.hbm_bytes == pytest.approx(l2.min_hbm_bytes, rel=1e-4) and l2.l2_read_bytes > 0  # per-step rounding
    # base blocks load both operands for every block: 96 B/cycle per core of the 110 the ideal L2 gives
    busy = (l2.cycles - l2.kernel_fixed_us * 1e3 * die.clock_ghz) / l2.cycles  # after the start (MIX included)
    assert l2.cycles < no_l2.cycles and l2.compute_utilization / busy > 0.45
    # compute-bound with the L2: INT8 is faster than BF16
    assert l2.cycles <= ChipCost(die, persist=False, l2_bytes_per_cycle=110).gemm(2048, 2048, 2048, "bf16").cycles


def without_l2(arch):
    return arch.model_copy(update={"l2": None})


def with_l2_mb(arch, mb):
    return arch.model_copy(update={"l2": arch.l2.model_copy(update={"capacity_mb": mb})})


def test_the_arch_l2_serves_re_reads_and_saves_hbm_bandwidth(die):
    """The preset's 192 MB L2: the compulsory reads reach HBM, the re-reads hit; a GEMM with reuse
    across cores gets faster than without an L2, and the L2 rate per core is the arch's."""
    shape = (2048, 2048, 2048, "int8")
    l2, no_l2 = ChipCost(die, persist=False).gemm(*shape), ChipCost(without_l2(die), persist=False).gemm(*shape)
    compulsory_reads = l2.min_hbm_bytes - 2048 * 2048 * 2
    assert l2.hbm_read_bytes == pytest.approx(compulsory_reads, rel=1e-3)
    assert l2.l2_read_bytes + l2.hbm_read_bytes >= 2 * compulsory_reads and l2.l2_hit_rate > 0.5
    assert l2.cycles < 0.7 * no_l2.cycles and no_l2.l2_hit_rate == 0
    assert die.l2.capacity_mb == 192 and die.l2.bandwidth_gbps == 7000


def test_a_smaller_l2_never_hits_more(die):
    """LRU reuse distances: shrinking the cache never raises the hit rate, and a cache smaller than
    a pass over B turns its re-reads into HBM reads (16384 x 7168 x 4096 INT8: 117 + 29 MB)."""
    shape = (16384, 7168, 4096, "int8")
    rates = [ChipCost(with_l2_mb(die, mb), persist=False).gemm(*shape) for mb in (192, 32, 1)]
    hit = [r.l2_hit_rate for r in rates]
    assert hit[0] >= hit[1] >= hit[2] and hit[0] > hit[2] + 0.05
    assert rates[0].hbm_read_bytes < rates[2].hbm_read_bytes and rates[0].cycles <= rates[2].cycles


def test_less_hbm_bandwidth_is_never_faster(cc, die):
    full = cc.gemm(96, 7168, 2048, "int8")
    half = cc.gemm(96, 7168, 2048, "int8", hbm_fraction=0.5)
    assert half.cycles > full.cycles
    assert half.hbm_peak_bandwidth_gbps == pytest.approx(800.0) and half.hbm_bandwidth_gbps <= 800.0 * (1 + 1e-9)


def without_base_blocks(arch):
    return arch.model_copy(update={"kernel": arch.kernel.model_copy(update={"base_blocks": {}})})


def test_split_k_for_decode_shapes_reduces_over_the_noc(die):
    """The even split (a die without base blocks) splits K for a decode shape; the die's own kernel
    (base blocks) never does, as Ascend's default GEMM kernels do not."""
    r = ChipCost(without_base_blocks(die), persist=False).gemm(16, 7168, 512, "int8")
    pb, pm, pn, pk, *_ = r.plan
    assert pk > 1 and r.hbm_write_bytes == 16 * 512 * 2  # partial sums never reach HBM
    pb, pm, pn, pk, *_, used, waves, kernel, splitk = ChipCost(die, persist=False).gemm(
        16, 7168, 512, "int8", kernel="catlass_basic").plan
    assert (pm, pn, pk, used, waves, kernel, splitk) == (1, 2, 1, 2, 1, "catlass_basic", 1)


def test_base_blocks_are_dealt_to_the_cores_in_waves():
    """CATLASS's basic matmul on a 20-AIC 910B4: C in 128 x 256 blocks (fp16; fp32 128 x 128),
    cores used = min(blocks, cores), waves = ceil(blocks / cores) (the tuning guide's cases: a
    20 x 6144 GEMM is 24 blocks on 20 AIC, 4 doing 2; a 1 x 768 fp32 one keeps 6 AIC busy); one
    block more than the cores adds a wave, so a decode GEMM's time steps up there."""
    cc = ChipCost("ascend-910b4", persist=False)
    *_, used, waves, _, _ = cc.gemm(20, 16384, 6144, "fp16", kernel="catlass_basic").plan
    assert (used, waves) == (20, 2)
    *_, used, waves, _, _ = cc.gemm(1, 5120, 768, "fp32", kernel="catlass_basic").plan
    assert (used, waves) == (6, 1)
    one_wave, two_waves = (cc.gemm(20, 4096, x * 256, "fp16", kernel="catlass_basic") for x in (20, 21))
    assert two_waves.cycles > 1.6 * one_wave.cycles


def test_base_blocks_follow_catlass_swizzle_order():
    """GemmIdentityBlockSwizzle<3, 0> over 5 x 4 blocks: strips of 3 rows walked column by column,
    the second strip (2 rows) from the last column back; <2, 1> the same with rows and columns swapped."""
    assert gemm_kernel._swizzle(5, 4, 3, 0) == [
        (0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1), (0, 2), (1, 2), (2, 2), (0, 3), (1, 3), (2, 3),
        (3, 3), (4, 3), (3, 2), (4, 2), (3, 1), (4, 1), (3, 0), (4, 0)]
    assert gemm_kernel._swizzle(2, 3, 2, 1) == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2), (0, 2)]


def test_tlm_fidelity_times_the_same_kernel(die):
    analytical = ChipCost(die, persist=False).gemm(256, 1024, 512, "int8")
    tlm = ChipCost(die, memory="tlm", persist=False).gemm(256, 1024, 512, "int8")
    assert tlm.plan == analytical.plan
    # the TLM L2 decides the hits of the same loads: here it finds the reuse model's (which rounds
    # its per-step HBM/L2 split to bytes)
    assert tlm.hbm_bytes == pytest.approx(analytical.hbm_bytes, rel=1e-4)
    assert tlm.l2_hit_rate == pytest.approx(analytical.l2_hit_rate, abs=1e-4)
    assert tlm.memory_fidelity == "tlm" and tlm.cycles > 0


# -- ops and graphs --------------------------------------------------------------------------------------

def test_ops_and_graphs_on_a_share(die):
    cc = ChipCost(die, persist=False)
    norm = Op("L0.norm", "vector", layer=0, elements=64 * 7168, op_class="reduction", fn="rmsnorm", row_len=7168)
    r = cc.op(norm, cores=16)
    assert r.kind == "vector" and r.cores == 16 and 0 < r.cores_used <= 16 and r.cycles > 0
    attn = Op("L0.attn", "attention", layer=0, q_len=1, kv_len=1024, batch=8, heads=16, kv_heads=16,
              head_dim=128)
    ra = cc.op(attn, cores=16)
    cached = 8 * (1024 - 1) * attn.kv_bytes_per_token  # the new token's keys are not read back
    assert ra.hbm_read_bytes >= cached and ra.min_hbm_bytes == cached and ra.cycles > 0
    batched = Op("L0.uk", "gemm", layer=0, dtype="int8", m=48, k=128, n=512, batch=16, weight=True,
                 weight_batched=True)
    assert cc.op(batched, cores=8).flops == batched.flops
    g = Graph("pair", [norm, Op("L0.up", "gemm", layer=0, dtype="int8", m=64, k=7168, n=2048, weight=True,
                                  inputs=("L0.norm",))])
    rg = cc.graph(g, cores=8)
    assert rg.kind == "graph" and rg.flops == g.flops and rg.hbm_bytes >= g.weight_bytes
    before = cc.stats.misses
    cc.op(Op("L5.norm", "vector", layer=5, elements=64 * 7168, op_class="reduction", fn="rmsnorm",
             row_len=7168), cores=16)
    assert cc.stats.misses == before  # same shape, another layer: a hit
    assert cc.op(norm, cores=8).cores == 8  # another share is another entry
    assert cc.stats.misses == before + 1


def test_bad_requests_are_config_errors(die):
    cc = ChipCost(die, persist=False)
    for call in (lambda: cc.gemm(0, 1, 1), lambda: cc.gemm(1, 1, 1, "fp64"), lambda: cc.gemm(1, 1, 1, "fp8"),
                 lambda: cc.gemm(1, 1, 1, cores=0), lambda: cc.gemm(1, 1, 1, cores=25),
                 lambda: cc.gemm(1, 1, 1, cores=[1, 1]), lambda: cc.gemm(1, 1, 1, cores=[24]),
                 lambda: cc.gemm(1, 1, 1, hbm_fraction=0), lambda: cc.op("not an op"),
                 lambda: ChipCost(die, memory="exact"), lambda: ChipCost(die, noc="wormhole"),
                 lambda: ChipCost(die, l2_bytes_per_cycle=-1), lambda: ChipCost("no-such-chip")):
        with pytest.raises(ConfigError):
            call()


# -- the command line --------------------------------------------------------------------------------------

SINGLE_CORE_KEYS = {
    "m", "k", "n", "batch", "dtype", "array", "k_per_pe", "dataflow", "cycles", "time_ns", "macs", "utilization",
    "tflops", "folds", "t_tile", "n_tile", "t_inj", "fill_drain", "formula", "sram_read_bytes",
    "sram_write_bytes", "sram_bound_cycles", "sram_bound",
    "memory_fidelity", "stall_free_cycles", "sram_stall_cycles", "sram_port_width_bits", "sram_feeds_compute",
    "sram_port_utilization",
}


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_gemm_without_chip_is_unchanged(capsys):
    code, out, _ = run_cli(capsys, "gemm", "--arch", ARCH, "--m", "2048", "--n", "2048", "--k", "2048",
                           "--dtype", "int8", "--json")
    d = json.loads(out)
    assert code == 0 and set(d) == SINGLE_CORE_KEYS and d["k_per_pe"] == 32 and d["array"] == "16x16"


def test_cli_gemm_chip_json(capsys):
    code, out, _ = run_cli(capsys, "gemm", "--arch", ARCH, "--chip", "--m", "2048", "--n", "2048", "--k", "2048",
                           "--dtype", "int8", "--json")
    d = json.loads(out)
    assert code == 0
    assert {"compute_utilization", "hbm_bandwidth_gbps", "time_us", "cycles", "tflops", "hbm_bytes",
            "cores"} <= set(d)
    assert d["cores"] == 24 and d["chip"] is True and d["flops"] == 2 * 2048**3
    assert 0 < d["compute_utilization"] <= 1 and d["tflops"] == pytest.approx(d["compute_utilization"] * 727.4496)
    assert 0 < d["hbm_bandwidth_gbps"] <= d["hbm_peak_bandwidth_gbps"] == pytest.approx(1600.0)
    assert d["hbm_bytes"] >= d["min_hbm_bytes"] == 2 * 2048**2 + 2048**2 * 2
    # the second run answers from the disk cache with the same figures
    code, out2, _ = run_cli(capsys, "gemm", "--arch", ARCH, "--chip", "--m", "2048", "--n", "2048", "--k", "2048",
                            "--dtype", "int8", "--json")
    assert out2 == out
    code, out, _ = run_cli(capsys, "gemm", "--arch", ARCH, "--chip", "--cores", "12", "--m", "512", "--n", "512",
                           "--k", "512", "--json", "--no-cache")
    d = json.loads(out)
    assert code == 0 and d["cores"] == 12 and d["compute_utilization"] <= d["share_compute_utilization"]


def test_cli_gemm_chip_reports_the_l2(capsys):
    """The contract's ``l2_hit_rate``; ``--l2-mb`` resizes the arch's L2 (0: none)."""
    argv = ["gemm", "--arch", "ascend-910b", "--chip", "--m", "1024", "--n", "1024", "--k", "1024", "--dtype", "fp16",
            "--json", "--no-cache"]
    with_l2 = json.loads(run_cli(capsys, *argv)[1])
    none = json.loads(run_cli(capsys, *argv, "--l2-mb", "0")[1])
    assert with_l2["l2_mb"] == 192 and 0 < with_l2["l2_hit_rate"] <= 1
    assert none["l2_mb"] is None and none["l2_hit_rate"] == 0 and none["hbm_read_bytes"] > with_l2["hbm_read_bytes"]
    code, out, _ = run_cli(capsys, *argv[:-2])
    assert code == 0 and "% of the loads hit" in out
    code, _, err = run_cli(capsys, *argv[:2], "npusim-64c", *argv[3:], "--l2-mb", "8")
    assert code == 2 and "no l2 section" in err


def test_cli_gemm_chip_text(capsys):
    code, out, _ = run_cli(capsys, "gemm", "--arch", ARCH, "--chip", "--m", "96", "--n", "2048", "--k", "7168",
                           "--dtype", "int8", "--l2-bytes-per-cycle", "110")
    assert code == 0 and "of the chip's" in out and "compulsory" in out and "ideal L2" in out


@pytest.mark.parametrize("argv, message", [
    (["--cores", "4"], "need --chip"),
    (["--no-cache"], "need --chip"),  # --memory applies to the single core too (its SRAM ports)
    (["--chip", "--array", "32x32"], "single-core model"),
    (["--chip", "--cores", "25"], "has 24 cores"),
    (["--chip", "--dtype", "fp8"], "supports"),
    (["--chip", "--out-dtype", "fp64"], "expected one of"),
    (["--chip", "--l2-bytes-per-cycle", "0"], "positive"),
    (["--chip", "--l2-bytes-per-cycle", "1e-300"], "at least 0.001"),
    (["--chip", "--l2-mb", "-1"], "non-negative"),
    (["--chip", "--l2-mb", "8", "--l2-bytes-per-cycle", "110"], "give one"),
    (["--l2-mb", "8"], "need --chip"),
])
def test_cli_gemm_chip_errors(capsys, argv, message):
    code, _, err = run_cli(capsys, "gemm", "--arch", ARCH, "--m", "64", "--n", "64", "--k", "64", *argv)
    assert code == 2 and message in err and "Traceback" not in err
    code, _, err = run_cli(capsys, "gemm", "--arch", ARCH, "--chip", "--m", "0", "--n", "1", "--k", "1")
    assert code == 2 and "--m" in err and "not a positive integer" in err


# -- vector operators -------------------------------------------------------------------------------

@pytest.mark.parametrize("op_class, out_bytes", [("rmsnorm", 2), ("quantize", 1), ("rmsnorm_quant", 1)])
def test_a_vector_operator_streams_its_rows_through_hbm(die, op_class, out_bytes):
    """Rows split over the cores, read once from HBM and written once (INT8 + a scale per row for
    quantize); more cores never slower; the work is the vector model's."""
    rows, width = 96, 7168
    op = Op("v", "vector", 0, "bf16", elements=rows * width, op_class=op_class, row_len=width)
    cc = ChipCost(die, persist=False)
    full, few = cc.op(op), cc.op(op, 4)
    assert full.hbm_read_bytes == rows * width * 2
    assert full.hbm_write_bytes == rows * width * out_bytes + (4 * rows if out_bytes == 1 else 0)
    assert full.cores_used == 24 and few.cores_used == 4 and full.cycles <= few.cycles
    assert 0 < full.hbm_bandwidth_gbps <= summarize(die).hbm_bandwidth_gbps * (1 + 1e-9)
    assert full.mapping.startswith("vector: 96 rows of 7168 over 24 cores")
