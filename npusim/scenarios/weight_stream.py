"""A GEMM layer whose weights stream from HBM into every core: the default ``npusim run``.

Workload: ``Y[M x N] = act(X[M x K] . W[K x N])`` in ``dtype``, split by N over all
cores (core ``c`` computes ``N_c`` columns; TP-MN-style, no communication needed).

Per core, as a double-buffered NPU program would run it:

1. ``load_i`` (DMA engine 0): a K-tile of its weights, ``k_tile x N_c`` elements, from
   HBM. Weights are laid out tile-major (tile ``i`` of core ``c`` at
   ``(i * cores + c) * tile_bytes``), so concurrent loads of all cores sweep the HBM
   channels instead of colliding on one.
2. ``gemm_i`` (cube): ``M x k_tile x N_c``, timed by the systolic-array model, once
   its tile is loaded; partial sums stay in the array's accumulators / SRAM.
3. Two weight buffers: ``load_{i+2}`` waits for ``gemm_i`` to free its buffer.
4. ``act`` (vector unit): the activation over ``M x N_c`` outputs.
5. ``store`` (DMA engine 1): ``M x N_c`` outputs written back to HBM.

Assumptions: X is already resident in every core's SRAM (e.g. broadcast by the
previous layer); the NoC is not modelled yet (HBM requests reach the channels
directly); SRAM holds X, two weight tiles and the outputs (checked).
Defaults are Qwen3-4B's FFN up-projection for a 2,048-token prefill
(K = hidden 2,560, N = FFN 9,728).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from npusim.arch.schema import DTYPE_BYTES, Arch
from npusim.errors import ConfigError
from npusim.hw.compute.systolic import gemm_cost
from npusim.hw.compute.vector import vector_cost
from npusim.sim import KIND_DMA, Simulator

DEFAULT_M, DEFAULT_K, DEFAULT_N = 2048, 2560, 9728
TILE_TARGET_BYTES = 256 << 10


@dataclass(frozen=True)
class LayerResult:
    arch: str
    m: int
    k: int
    n: int
    dtype: str
    memory_mode: str
    cores_used: int
    k_tile: int
    tasks: int
    events: int
    cycles: int
    latency_us: float
    flops: int
    tflops_achieved: float
    tflops_peak: float
    compute_utilization: float
    hbm_bytes: int
    hbm_bandwidth_gbps: float
    hbm_peak_gbps: float
    busy_fraction: dict  # unit -> mean busy fraction over used cores
    memory_checks: dict

    def to_dict(self) -> dict:
        return asdict(self)


def _split(n: int, parts: int) -> np.ndarray:
    base, extra = divmod(n, parts)
    return np.array([base + (1 if i < extra else 0) for i in range(parts)], dtype=np.int64)


def build_weight_stream_layer(sim: Simulator, m: int = DEFAULT_M, k: int = DEFAULT_K, n: int = DEFAULT_N,
                              dtype: str = "fp16", k_tile: int | None = None) -> dict:
    """Submit the layer's tasks to ``sim``; returns a description (k_tile, cores, task ids)."""
    arch = sim.arch
    sa = arch.cores.systolic_array
    if dtype not in sa.macs_per_pe_per_cycle:
        raise ConfigError(f"dtype '{dtype}': the systolic array of {arch.name} supports {sorted(sa.macs_per_pe_per_cycle)}")
    for name, v in (("m", m), ("k", k), ("n", n)):
        if v <= 0:
            raise ConfigError(f"--{name} must be positive, got {v}")
    elem = DTYPE_BYTES[dtype]
    k_per_pe = sa.macs_per_pe_per_cycle[dtype]
    cols_per_core = _split(n, arch.num_cores)
    used = np.flatnonzero(cols_per_core)
    n_max = int(cols_per_core.max())
    depth = sa.rows * k_per_pe
    if k_tile is None:
        k_tile = max(depth, int(TILE_TARGET_BYTES // (n_max * elem)) // depth * depth)
    k_tile = min(k_tile, k)
    tiles = -(-k // k_tile)
    tile_bytes = int(k_tile * n_max * elem)
    sram_need = m * k * elem + 2 * tile_bytes + m * n_max * 4
    sram_have = arch.cores.sram.capacity_mb * 2**20
    if sram_need > sram_have:
        raise ConfigError(
            f"layer does not fit one core's SRAM: needs {sram_need / 2**20:.1f} MB (X {m}x{k}, two weight tiles, "
            f"fp32 outputs) but {arch.name} has {arch.cores.sram.capacity_mb:g} MB per core; lower --m or use more cores"
        )
    kinds, queues, params, names, deps = [], [], [], [], []
    first = sim.engine.num_tasks

    def add(kind, queue, param, name, dep_list):
        kinds.append(kind)
        queues.append(queue)
        params.append(list(param) + [0] * (6 - len(param)))
        names.append(name)
        deps.append(dep_list)
        return first + len(kinds) - 1

    k_sizes = _split_tiles(k, k_tile)
    gemm_cycles = {}
    for c in used.tolist():
        nc = int(cols_per_core[c])
        loads, gemms = [], []
        for i, kt in enumerate(k_sizes):
            addr = (i * arch.num_cores + c) * tile_bytes
            nbytes = int(kt * nc * elem)
            dep = [gemms[i - 2]] if i >= 2 else []
            loads.append(add(KIND_DMA, sim.queue(c, "dma0"), (nbytes, addr, 0, sim.initiator(c, 0)),
                             f"load W[{i}]", dep))
            key = (kt, nc)
            if key not in gemm_cycles:
                gemm_cycles[key] = gemm_cost(m, kt, nc, sa.rows, sa.cols, sa.dataflow, k_per_pe,
                                             sa.weight_injection_cycles, bytes_per_elem=int(max(elem, 1))).cycles
            gemms.append(add(0, sim.queue(c, "cube"), (gemm_cycles[key],), f"gemm {m}x{kt}x{nc}", [loads[i]]))
        vu = arch.cores.vector_unit
        act_cycles = vector_cost("activation", m * nc, vu.lanes, vu.ops_per_cycle_per_lane, fn="silu").cycles
        act = add(0, sim.queue(c, "vector"), (act_cycles,), "silu", [gemms[-1]])
        out_addr = (tiles * arch.num_cores + c) * tile_bytes
        add(KIND_DMA, sim.queue(c, f"dma{min(1, sim.dma_engines - 1)}"),
            (int(m * nc * elem), out_addr, 1, sim.initiator(c, min(1, sim.dma_engines - 1))), "store Y", [act])
    ptr = np.zeros(len(kinds) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(d) for d in deps])
    idx = np.array([x for d in deps for x in d], dtype=np.int64)
    ids = sim.submit_batch(kinds, queues, params, ptr, idx, names)
    return {"k_tile": int(k_tile), "cores_used": int(len(used)), "task_ids": ids,
            "hbm_bytes": int(k * n * elem + m * n * elem)}


def _split_tiles(k: int, k_tile: int) -> list[int]:
    full, rest = divmod(k, k_tile)
    return [k_tile] * full + ([rest] if rest else [])


def summarize_layer(sim: Simulator, layout: dict, m: int, k: int, n: int, dtype: str) -> LayerResult:
    arch: Arch = sim.arch
    cycles = sim.makespan()
    seconds = cycles / (arch.clock_ghz * 1e9)
    sa = arch.cores.systolic_array
    flops = 2 * m * k * n
    peak = arch.num_cores * sa.rows * sa.cols * sa.macs_per_pe_per_cycle[dtype] * 2 * arch.clock_ghz / 1e3
    busy = sim.busy_cycles()
    used = busy.sum(axis=1) > 0
    frac = {u: float(busy[used, j].mean() / cycles) if cycles else 0.0 for j, u in enumerate(sim.units)}
    achieved = flops / seconds / 1e12 if seconds else 0.0
    return LayerResult(
        arch=arch.name, m=m, k=k, n=n, dtype=dtype, memory_mode=sim.memory_mode, cores_used=layout["cores_used"],
        k_tile=layout["k_tile"], tasks=sim.engine.num_tasks, events=sim.events, cycles=cycles,
        latency_us=seconds * 1e6, flops=flops, tflops_achieved=achieved, tflops_peak=peak,
        compute_utilization=achieved / peak if peak else 0.0, hbm_bytes=layout["hbm_bytes"],
        hbm_bandwidth_gbps=layout["hbm_bytes"] / seconds / 1e9 if seconds else 0.0,
        hbm_peak_gbps=arch.hbm.total_bandwidth_gbps, busy_fraction=frac, memory_checks=sim.memory_checks(),
    )
