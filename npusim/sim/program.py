"""A compiled program: engine tasks whose compute costs are kept symbolic.

The mapper records tasks here instead of submitting them directly: GEMM and vector
tasks keep their shapes (``cost_kind``, ``cost_args``) and are timed only when the
program is submitted to a simulator of a given chip (:meth:`Program.submit`), so the
same program replays on any arch with the same number of cores (``npusim replay``).

Recording API (shared with :class:`npusim.sim.Simulator`, so collectives and other
builders can target either): ``add_gemm``, ``add_vector``, ``add_compute`` (fixed
cycles), ``add_dma``, ``add_send``, ``add_barrier``, ``check_core``.

File format (HDF5, written by :meth:`save`, read by :func:`load_program`): group
``/program`` with datasets ``kind, core, unit, param[n,6], cost_kind, cost_args[n,6],
dep_ptr, dep_idx, name`` and attributes ``num_cores``, ``units``, ``format_version``
plus whatever ``meta`` the mapper recorded (model, phase, spec...).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from itertools import chain
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npusim.arch.schema import DTYPE_BYTES, Arch
from npusim.engine.tasks import KIND_FIXED, NPARAM
from npusim.errors import ConfigError
from npusim.hw.compute.systolic import dataflow_code, gemm_cycles_array
from npusim.hw.compute.vector import OP_CLASSES, vector_cost
from npusim.hw.memory.sram_timing import (UNLIMITED, elem_bits, gemm_sram_array, out_bits, sram_supply_bits,
                                          vector_sram_timing)
from npusim.files import write_with
from npusim.sim.kernel import KIND_DMA, KIND_NOC
from npusim.sim.sramport import P_SRAM_BITS, P_SRAM_STALL

COST_FIXED, COST_GEMM, COST_VECTOR = 0, 1, 2
DTYPES = tuple(DTYPE_BYTES)
FORMAT_VERSION = 1
BARRIER_UNIT = "none"
_ZEROS = (0,) * max(NPARAM, 6)
_NO_PARAM, _NO_ARGS = _ZEROS[:NPARAM], _ZEROS[:6]  # a task's parameters / cost arguments, all 0


@dataclass
class Program:
    """Recorded tasks (see module docstring). Units: ``cube``, ``vector``, ``dma<i>``, ``noc``,
    ``none`` (a barrier without a queue)."""

    num_cores: int
    kind: list[int] = field(default_factory=list)
    core: list[int] = field(default_factory=list)
    unit: list[str] = field(default_factory=list)
    param: list[tuple] = field(default_factory=list)
    cost_kind: list[int] = field(default_factory=list)
    cost_args: list[tuple] = field(default_factory=list)
    dep_idx: list[int] = field(default_factory=list)  # every task's dependencies, flat, in task order
    dep_end: list[int] = field(default_factory=list)  # task i's are dep_idx[dep_end[i - 1]:dep_end[i]]
    names: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    vector_fns: list[str] = field(default_factory=lambda: [""])
    fn_tasks: int = field(default=0, repr=False, compare=False)  # tasks recorded with a vector function (id > 0)

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def deps(self) -> list[tuple[int, ...]]:
        """Each task's dependencies as a tuple (a view for inspection; recorded flat)."""
        ptr, idx = self._deps_csr()
        flat = idx.tolist()
        return [tuple(flat[a:e]) for a, e in zip(ptr[:-1].tolist(), ptr[1:].tolist())]

    def _deps_csr(self, first: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Tasks ``first..``'s dependencies as ``(ptr, idx)``: task ``first + i``'s are
        ``idx[ptr[i]:ptr[i + 1]]`` (task ids, not shifted)."""
        start = self.dep_end[first - 1] if first > 0 else 0
        ptr = np.empty(len(self.dep_end) - first + 1, dtype=np.int64)
        ptr[0] = start
        ptr[1:] = self.dep_end[first:]
        return ptr - start, np.array(self.dep_idx[start:], dtype=np.int64)

    # -- recording ----------------------------------------------------------------------
    def check_core(self, core: int) -> None:
        if not 0 <= core < self.num_cores:
            raise ConfigError(f"core {core} out of range (0..{self.num_cores - 1})")

    def _add(self, kind, core, unit, param, cost_kind, cost_args, deps, name) -> int:
        """Append one task; ``param`` (NPARAM long) and ``cost_args`` (6 long) come padded."""
        n = len(self.kind)
        if deps:
            deps = [d for d in deps if d is not None and d >= 0]
            if deps:
                if max(deps) >= n:
                    raise ConfigError(f"task {name}: depends on a task not recorded yet")
                self.dep_idx.extend(deps)
        self.kind.append(kind)
        self.core.append(core)
        self.unit.append(unit)
        self.param.append(param)
        self.cost_kind.append(cost_kind)
        self.cost_args.append(cost_args)
        self.dep_end.append(len(self.dep_idx))
        self.names.append(name or "")
        return n

    def add_gemm(self, core: int, m: int, k: int, n: int, dtype: str = "bf16", batch: int = 1,
                 deps: Sequence[int] = (), name: str | None = None) -> int:
        """``batch`` GEMMs ``[m x k] . [k x n]`` on the cube (timed by the systolic model)."""
        self.check_core(core)
        if min(m, k, n, batch) <= 0:
            return self.add_barrier(deps, name)
        return self._add(KIND_FIXED, core, "cube", _NO_PARAM, COST_GEMM, (m, k, n, batch, DTYPES.index(dtype), 0),
                         deps, name)

    def add_vector(self, core: int, op_class: str, elements: int, dtype: str = "bf16", deps: Sequence[int] = (),
                   name: str | None = None, fn: str | None = None, row_len: int | None = None) -> int:
        """A vector-unit op over ``elements`` elements (timed by the vector model)."""
        self.check_core(core)
        if elements <= 0:
            return self.add_barrier(deps, name)
        fn_id = self._fn_id(fn or "")
        self.fn_tasks += fn_id != 0
        args = (OP_CLASSES.index(op_class), int(elements), fn_id, int(row_len or 0), DTYPES.index(dtype), 0)
        return self._add(KIND_FIXED, core, "vector", _NO_PARAM, COST_VECTOR, args, deps, name)

    def add_compute(self, core: int, unit: str, cycles: int, deps: Sequence[int] = (), name: str | None = None) -> int:
        self.check_core(core)
        return self._add(KIND_FIXED, core, unit, (int(cycles),) + _ZEROS[1:NPARAM], COST_FIXED, _NO_ARGS, deps, name)

    def add_dma(self, core: int, nbytes: int, address: int = 0, write: bool = False, deps: Sequence[int] = (),
                dma_engine: int = 0, name: str | None = None) -> int:
        self.check_core(core)
        return self._add(KIND_DMA, core, f"dma{dma_engine}", (int(nbytes), int(address), int(write)) + _ZEROS[3:NPARAM],
                         COST_FIXED, _NO_ARGS, deps, name)

    def add_send(self, src_core: int, dst_core: int, nbytes: int, deps: Sequence[int] = (),
                 name: str | None = None) -> int:
        self.check_core(src_core)
        self.check_core(dst_core)
        return self._add(2, src_core, "noc", (src_core, dst_core, int(nbytes)) + _ZEROS[3:NPARAM], COST_FIXED,
                         _NO_ARGS, deps, name)

    def add_barrier(self, deps: Sequence[int] = (), name: str | None = None) -> int:
        return self._add(KIND_FIXED, -1, BARRIER_UNIT, _NO_PARAM, COST_FIXED, _NO_ARGS, deps, name)

    # -- recorded blocks ------------------------------------------------------------------
    def recorded(self, key, ext, build, fn_table: bool = False,
                 relocate: "Relocation | None" = None) -> tuple[list[int], object]:
        """Append the tasks ``build()`` records, or replay them when a block of the same ``key`` was
        recorded before (by any program of as many cores) with external tasks ``ext`` equal in the
        same pattern (the same entries negative, the same entries equal to each other).

        ``build()`` returns ``(outs, extra)``: ``outs`` task ids (of its own tasks, of ``ext``'s or
        -1), ``extra`` anything else the caller needs back (``None``: do not keep this block).
        Replayed, ``outs`` come back as the ids the replayed tasks got. Every task of the block may
        depend only on tasks of the block and on ``ext``'s; the caller's ``key`` must hold
        everything else the tasks depend on (the replay is then exactly what ``build`` would record:
        same kinds, queues, parameters, names and dependencies). Memoised across programs because
        mappers lower the same op on the same cores again and again (serving iterations that share
        token counts, layers whose collectives move the same bytes). ``fn_table``: the block may use
        vector functions (their ids index the program's function table, so it is part of the key).

        ``relocate`` (a :class:`Relocation`): the block is kept free of its cores, its names' common
        start and its DMA tasks' address bases, and replays onto the caller's (another layer's
        attention on another stage's cores); ``key`` then holds everything else, not those."""
        ext = list(ext)
        first: dict[int, int] = {}
        pattern = tuple(-1 if v < 0 else first.setdefault(v, i) for i, v in enumerate(ext))
        full = (key, self.num_cores, pattern, tuple(self.vector_fns) if fn_table else None,
                None if relocate is None else ("relocated", len(relocate.cores)))
        with _BLOCK_LOCK:  # sweeps may map in several threads
            block = _BLOCKS.get(full)
            if block is not None:
                _BLOCKS.move_to_end(full)
                _BLOCK_STATS["replayed"] += 1
        if block is not None:
            return self._replay(block, ext, relocate), block.extra
        base = len(self.kind)
        fns, fn_tasks = len(self.vector_fns), self.fn_tasks
        outs, extra = build()
        # without the function table in the key, a block may not use vector functions (their ids
        # index the program's table)
        if extra is not None and len(self.vector_fns) == fns and (fn_table or self.fn_tasks == fn_tasks):
            block = _Block.capture(self, base, first, outs, extra, fn_tasks, relocate)
            if block is not None:
                _remember(full, block)
        return outs, extra

    def _replay(self, block: "_Block", ext: list[int], relocate: "Relocation | None") -> list[int]:
        base = len(self.kind)
        self.fn_tasks += block.fn_tasks
        self.kind.extend(block.kind)
        self.unit.extend(block.unit)
        self.cost_kind.extend(block.cost_kind)
        self.cost_args.extend(block.cost_args)
        if relocate is None:
            self.core.extend(block.core)
            self.param.extend(block.param)
            self.names.extend(block.names)
        else:  # block.core: indices into the cores (-1: none); names: what follows the prefix
            cores = (*relocate.cores, -1)
            self.core.extend([cores[k] for k in block.core])
            self.names.extend([relocate.prefix + s for s in block.names])
            param = list(block.param)
            bases = relocate.bases
            for at, k in zip(block.dma_at, block.dma_core):
                p = param[at]
                param[at] = (p[0], p[1] + bases[k]) + p[2:]
            self.param.extend(param)
        dep = block.rel + base
        if block.ext_at.size:
            dep[block.ext_at] = np.asarray(ext, dtype=np.int64)[block.ext_slot]
        self.dep_end.extend((block.ends + len(self.dep_idx)).tolist())
        self.dep_idx.extend(dep.tolist())
        return [base + r if r >= 0 else -1 if r == -1 else ext[-r - 2] for r in block.outs]

    def _fn_id(self, fn: str) -> int:
        if fn not in self.vector_fns:
            self.vector_fns.append(fn)
        return self.vector_fns.index(fn)

    # -- timing and submission ------------------------------------------------------------
    def durations(self, arch: Arch) -> np.ndarray:
        """Cycles of every compute task on ``arch`` (0 for tasks timed by other models), the
        stall-free closed forms: the analytical memory fidelity."""
        return self.timings(arch, sram=False)[0]

    def timings(self, arch: Arch, sram: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(cycles, sram_bits, stall_cycles)`` of every task (0 for tasks timed by other models).
        ``sram=False``: the stall-free closed forms (analytical memory fidelity; bits and stalls
        0). ``sram=True`` (TLM fidelity): GEMMs and vector ops on cores whose SRAM feeds compute
        are timed with their operands served by the SRAM's ports
        (:mod:`npusim.hw.memory.sram_timing`): ``cycles`` include ``stall_cycles``, and
        ``sram_bits`` is the demand the kernel weighs against DMA traffic (:mod:`npusim.sim.sramport`)."""
        return self._timings(arch, sram, self._param_array()[:, 0].copy())

    def _param_array(self) -> np.ndarray:
        n = len(self)
        return np.fromiter(chain.from_iterable(self.param), dtype=np.int64, count=n * NPARAM).reshape(n, NPARAM)

    def _timings(self, arch: Arch, sram: bool, out: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`timings` with ``out`` holding every task's ``param[0]`` (overwritten for compute)."""
        ck = np.asarray(self.cost_kind, dtype=np.int64)
        args = np.fromiter(chain.from_iterable(self.cost_args), dtype=np.int64, count=6 * len(self)).reshape(len(self), 6)
        bits = np.zeros(len(self), dtype=np.int64)
        stall = np.zeros(len(self), dtype=np.int64)
        gemm = np.flatnonzero(ck == COST_GEMM)
        cores = np.asarray(self.core, dtype=np.int64)
        for sa, sram_cfg, members in _core_groups(arch):  # core classes may have their own arrays / SRAM
            in_group = gemm[np.isin(cores[gemm], members)]
            for d in np.unique(args[in_group, 4]):
                dtype = DTYPES[int(d)]
                if dtype not in sa.macs_per_pe_per_cycle:
                    raise ConfigError(f"the program uses {dtype} GEMMs; {arch.name}'s array supports "
                                      f"{sorted(sa.macs_per_pe_per_cycle)}")
                sel = in_group[args[in_group, 4] == d]
                kpe = sa.macs_per_pe_per_cycle[dtype]
                base = gemm_cycles_array(args[sel, 0], args[sel, 1], args[sel, 2], sa.rows, sa.cols,
                                         sa.dataflow, kpe, sa.t_inj, batch=args[sel, 3],
                                         double_buffer=sa.double_buffered_weights)
                out[sel] = base
                if sram and sram_cfg.feeds_compute:
                    shapes, inv = _unique_rows(args[sel, :4])
                    eb = elem_bits(dtype)
                    cyc, b = gemm_sram_array(shapes[:, 0], shapes[:, 1], shapes[:, 2], shapes[:, 3], sa.rows,
                                             sa.cols, dataflow_code(sa.dataflow), kpe, sa.t_inj,
                                             sa.double_buffered_weights, eb, out_bits(dtype),
                                             sram_supply_bits(sram_cfg, max(1, sa.rows * kpe * eb // 8)))
                    out[sel] = cyc[inv]
                    bits[sel] = b[inv]
                    stall[sel] = cyc[inv] - base
        vu = arch.cores.vector_unit
        vec = np.flatnonzero(ck == COST_VECTOR)
        if vec.size:
            # each distinct (op class, elements, fn, row length, dtype, SRAM supply) is timed once
            sup = np.full(vec.size, UNLIMITED, dtype=np.int64)
            if sram:
                supply = {}
                per_core = np.full(self.num_cores, UNLIMITED, dtype=np.int64)
                for c in range(self.num_cores):
                    sram_cfg = arch.sram_for(c)
                    if sram_cfg.feeds_compute:
                        if id(sram_cfg) not in supply:
                            supply[id(sram_cfg)] = sram_supply_bits(sram_cfg)
                        per_core[c] = supply[id(sram_cfg)]
                sup = per_core[cores[vec]]
            keys, inv = _unique_rows(np.column_stack([args[vec, :5], sup]))
            res = np.zeros((len(keys), 3), dtype=np.int64)
            for j, (op_class, elements, fn_id, row_len, d, s) in enumerate(keys.tolist()):
                fn = self.vector_fns[fn_id] or None
                if s >= UNLIMITED:
                    res[j, 0] = vector_cost(OP_CLASSES[op_class], elements, vu.lanes, vu.ops_per_cycle_per_lane,
                                            fn=fn, row_len=row_len or None).cycles
                else:
                    t = vector_sram_timing(OP_CLASSES[op_class], elements, vu.lanes, vu.ops_per_cycle_per_lane,
                                           s, elem_bits_=elem_bits(DTYPES[d]), fn=fn, row_len=row_len or None)
                    res[j] = (t.cycles, int(t.sram_bytes * 8), t.stall_cycles)
            out[vec], bits[vec], stall[vec] = res[inv, 0], res[inv, 1], res[inv, 2]
        return out, bits, stall

    def submit(self, sim) -> np.ndarray:
        """Time the compute tasks on ``sim.arch`` and submit everything; returns task ids."""
        return submit_materialized(sim, self.materialize(sim), self.names)

    def materialize(self, sim) -> tuple:
        """``(kind, queue, param, dep_ptr, dep_idx)`` arrays for ``sim``'s chip, dependencies
        relative to the first task (see :func:`submit_materialized`); reusable, so a program
        submitted many times (serving iterations) is timed once."""
        if sim.arch.num_cores != self.num_cores:
            raise ConfigError(f"the program was compiled for {self.num_cores} cores; {sim.arch.name} has "
                              f"{sim.arch.num_cores}")
        n = len(self)
        param = self._param_array()
        dur, bits, stall = self._timings(sim.arch, getattr(sim, "sram_timing", False), param[:, 0].copy())
        kinds = np.fromiter(self.kind, dtype=np.int64, count=n)
        fixed = kinds == KIND_FIXED
        param[fixed, 0] = dur[fixed]
        param[fixed, P_SRAM_BITS] = bits[fixed]
        param[fixed, P_SRAM_STALL] = stall[fixed]
        names = sorted(set(self.unit))
        code = {u: i for i, u in enumerate(names)}
        unit = np.fromiter(map(code.__getitem__, self.unit), dtype=np.int64, count=n)
        units = {u: i for i, u in enumerate(sim.units)}
        bad = [self.unit.index(u) for u in names if u != BARRIER_UNIT and u not in units]
        if bad:
            i = min(bad)
            u = self.unit[i]
            raise ConfigError(f"task {self.names[i] or i} uses unit '{u}', which {sim.arch.name}'s cores lack "
                              f"(units: {sim.units})")
        slot = np.array([-1 if u == BARRIER_UNIT else units[u] for u in names], dtype=np.int64)[unit]
        core = np.fromiter(self.core, dtype=np.int64, count=n)
        queue = np.where(slot < 0, -1, core * sim.queues_per_core + slot)
        dma = kinds == KIND_DMA
        if dma.any():  # the DMA engine's initiator id depends on the chip's engine count
            engine = np.array([int(u[3:]) if u.startswith("dma") else 0 for u in names], dtype=np.int64)[unit]
            param[dma, 3] = core[dma] * sim.dma_engines + engine[dma]
        ptr, idx = self._deps_csr()
        return kinds, queue, param, ptr, idx

    def dma_bytes_by_core(self) -> np.ndarray:
        """Bytes each core's DMA tasks move to or from HBM (reads and writes), indexed by core."""
        out = np.zeros(self.num_cores)
        for kind, core, param in zip(self.kind, self.core, self.param):
            if kind == KIND_DMA:
                out[core] += param[0]
        return out

    # -- files ----------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        import h5py  # a core dependency, imported when used: a run that saves nothing starts faster

        n = len(self)

        def writer(tmp: Path) -> None:
            with h5py.File(tmp, "w") as f:
                g = f.create_group("program")
                ptr, idx = self._deps_csr()
                data = {
                    "kind": np.asarray(self.kind, np.int64), "core": np.asarray(self.core, np.int64),
                    "param": np.asarray(self.param, np.int64).reshape(n, NPARAM),
                    "cost_kind": np.asarray(self.cost_kind, np.int64),
                    "cost_args": np.asarray(self.cost_args, np.int64).reshape(n, 6),
                    "dep_ptr": ptr, "dep_idx": idx,
                }
                for key, arr in data.items():
                    g.create_dataset(key, data=arr, compression="gzip", compression_opts=1)
                units = sorted(set(self.unit))
                g.create_dataset("unit", data=np.asarray([units.index(u) for u in self.unit], np.int64),
                                 compression="gzip", compression_opts=1)
                g.create_dataset("name", data=np.array(self.names, dtype=h5py.string_dtype()),
                                 compression="gzip", compression_opts=1)
                g.attrs["units"] = json.dumps(units)
                g.attrs["vector_fns"] = json.dumps(self.vector_fns)
                g.attrs["num_cores"] = self.num_cores
                g.attrs["format_version"] = FORMAT_VERSION
                g.attrs["meta"] = json.dumps(self.meta)

        return write_with(path, writer)


def _unique_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of an integer matrix and each row's index among them (``np.unique(axis=0)``
    without its slow sort of raw bytes; the distinct rows come in lexicographic order too)."""
    order = np.lexsort(rows.T[::-1])
    ordered = rows[order]
    new = np.ones(len(rows), dtype=bool)
    new[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    inv = np.empty(len(rows), dtype=np.int64)
    inv[order] = np.cumsum(new) - 1
    return ordered[new], inv


class _Block:
    """A recorded run of tasks (see :meth:`Program.recorded`): the task fields as recorded; the
    dependencies flat (``rel``: relative to the block's first task; at ``ext_at`` external tasks
    ``ext_slot`` instead), task ``i``'s from ``starts[i]`` to ``ends[i]``; outputs encoded ``r >= 0``: the block's
    task ``r``; ``-k - 2``: external task ``k``; ``-1``: none."""

    __slots__ = ("kind", "core", "unit", "param", "cost_kind", "cost_args", "names", "rel", "ext_at", "ext_slot",
                 "starts", "ends", "outs", "extra", "dma_at", "dma_core", "fn_tasks")

    @staticmethod
    def capture(prog: Program, base: int, first: dict[int, int], outs, extra, fn_tasks: int,
                relocate: "Relocation | None" = None) -> "_Block | None":
        """The block of ``prog``'s tasks from ``base`` (``fn_tasks``: the program's
        :attr:`Program.fn_tasks` at ``base``), or None when it cannot be replayed."""
        b = _Block()
        for f in ("kind", "core", "unit", "param", "cost_kind", "cost_args", "names"):
            setattr(b, f, getattr(prog, f)[base:])
        b.fn_tasks = prog.fn_tasks - fn_tasks
        if relocate is not None and not b._relocatable(relocate):
            return None

        def enc(v: int) -> int | None:
            if v >= base:
                return v - base
            if v < 0:
                return -1
            k = first.get(v)
            return None if k is None else -k - 2

        ptr, flat = prog._deps_csr(base)
        outside = np.flatnonzero(flat < base)
        slots = [first.get(v, -1) for v in flat[outside].tolist()]
        if -1 in slots:
            return None  # depends on a task that is neither the block's nor external
        b.rel = flat - base
        b.ext_at, b.ext_slot = outside, np.asarray(slots, dtype=np.int64)
        b.starts, b.ends = ptr[:-1], ptr[1:]  # arrays: compact, and nothing for the garbage collector to scan
        b.outs = [enc(v) for v in outs]
        if None in b.outs:
            return None
        b.extra = extra
        return b

    def _relocatable(self, where: "Relocation") -> bool:
        """Keep the block free of ``where``: cores as indices into ``where.cores``, names as what
        follows ``where.prefix``, DMA addresses less their core's base. False when it cannot be:
        a task on a core outside ``where.cores`` (or on one listed twice), a name without the
        prefix, a NoC transfer (its parameters name cores)."""
        index = {c: i for i, c in enumerate(where.cores)}
        if len(index) != len(where.cores) or len(where.bases) != len(where.cores):
            return False
        if any(k != KIND_FIXED and k != KIND_DMA for k in self.kind):
            return False
        core = [index.get(c) if c >= 0 else -1 for c in self.core]
        n = len(where.prefix)
        if None in core or not all(name.startswith(where.prefix) for name in self.names):
            return False
        self.core = core
        self.names = [name[n:] for name in self.names]
        self.dma_at = [i for i, k in enumerate(self.kind) if k == KIND_DMA]
        self.dma_core = [core[i] for i in self.dma_at]
        param = self.param = list(self.param)
        for at, k in zip(self.dma_at, self.dma_core):
            p = param[at]
            param[at] = (p[0], p[1] - where.bases[k]) + p[2:]
        return True


@dataclass(frozen=True)
class Relocation:
    """Where a block recorded by :meth:`Program.recorded` runs: ``cores`` (distinct; a replay puts
    the recorded ``cores[i]``'s tasks on the replaying caller's ``cores[i]``), ``prefix`` (every
    task name starts with it; a replay puts the caller's instead) and ``bases`` (per core of
    ``cores``, the address every DMA task of that core's is relative to: a replay moves it from
    the recorded core's base to its new core's). The caller guarantees that nothing else its block
    records depends on them: then a replay is what building it there would record."""

    cores: tuple[int, ...]
    prefix: str
    bases: tuple[int, ...]


_BLOCKS: OrderedDict = OrderedDict()  # (key, cores, pattern, fn table) -> _Block, least recently used first
_BLOCK_STATS = {"tasks": 0, "replayed": 0}
_BLOCK_LOCK = threading.Lock()
BLOCK_TASK_LIMIT = 1_500_000  # tasks kept over all blocks (about 100 bytes each)


def _remember(full, block: _Block) -> None:
    with _BLOCK_LOCK:
        if full in _BLOCKS:  # recorded meanwhile by another thread
            return
        _BLOCKS[full] = block
        _BLOCK_STATS["tasks"] += len(block.kind)
        while _BLOCK_STATS["tasks"] > BLOCK_TASK_LIMIT and len(_BLOCKS) > 1:
            _, old = _BLOCKS.popitem(last=False)
            _BLOCK_STATS["tasks"] -= len(old.kind)


def recorded_stats() -> dict:
    """Recorded blocks kept (``blocks``), their ``tasks``, and blocks ``replayed`` so far."""
    return {"blocks": len(_BLOCKS), **_BLOCK_STATS}


def clear_recorded() -> None:
    """Forget every recorded block (the next lowering of anything records it afresh)."""
    with _BLOCK_LOCK:
        _BLOCKS.clear()
        _BLOCK_STATS.update(tasks=0, replayed=0)


def _core_groups(arch: Arch) -> list:
    """(systolic array, SRAM, core ids) for the default cores and each core class with its own
    array or SRAM."""
    special = {c for cls in arch.core_classes.values() if cls.systolic_array or cls.sram for c in cls.cores}
    groups = [(arch.cores.systolic_array, arch.cores.sram,
               np.array(sorted(set(range(arch.num_cores)) - special), np.int64))]
    groups += [(arch.systolic_for(cls.cores[0]), arch.sram_for(cls.cores[0]), np.array(cls.cores, np.int64))
               for cls in arch.core_classes.values() if (cls.systolic_array or cls.sram) and cls.cores]
    return groups


def submit_materialized(sim, arrays: tuple, names=None, check: bool = True, rows=None) -> np.ndarray:
    """Submit materialised program arrays after the tasks ``sim`` already has (``check=False``:
    arrays submitted before, whose queues and dependencies were checked then; ``rows``: where each
    task lies in memory, e.g. :func:`run_order`'s -- the results are the same)."""
    kinds, queue, param, ptr, idx = arrays
    return sim.submit_batch(kinds, queue, param, ptr, idx + sim.engine.num_tasks, names, check=check, rows=rows)


def run_order(sim, arrays: tuple) -> np.ndarray:
    """Rows for :func:`submit_materialized` that lay the program's tasks out in the order they
    start when it runs alone on ``sim`` (a fresh simulator of the run's chip and fidelity; the
    program is run on it). In a serving pipeline with an iteration per stage in flight, a program
    laid out so is walked by the loop in one region per iteration instead of one per core of each:
    ~15% less kernel time for Qwen3-4B's 16 stages (``validation/perf/bench_serving.py``), the
    same results (rows change only where tasks lie, :meth:`npusim.engine.Engine.submit_batch`).
    The order a program runs in alone is within a few dozen places of the order it runs in beside
    others (Spearman's rank correlation 0.99999 in that pipeline), so one lone run serves every
    submission of it."""
    ids = submit_materialized(sim, arrays, check=False)
    sim.run()
    start = sim.engine.tt.start[ids]
    order = np.lexsort((np.arange(ids.shape[0]), start))
    rows = np.empty_like(order)
    rows[order] = np.arange(order.shape[0])
    return rows


def load_program(path: str | Path) -> Program:
    import h5py  # see Program.save

    path = Path(path)
    expected = "expected the program.h5 that `npusim run --forward --out DIR` writes"
    if not path.is_file():
        raise ConfigError(f"{path}: {'is a directory' if path.is_dir() else 'no such file'}; {expected}")
    try:
        f = h5py.File(path, "r")
    except OSError:  # h5py's message spans lines and names its C call, not the problem
        raise ConfigError(f"{path}: not an HDF5 file (or unreadable); {expected}") from None
    with f:
        if "program" not in f:
            raise ConfigError(f"{path}: no /program group; is this a program.h5 written by `npusim run --forward --out DIR`?")
        g = f["program"]
        version = int(g.attrs.get("format_version", -1))
        if version != FORMAT_VERSION:
            raise ConfigError(f"{path}: program format version {version}, this npusim reads {FORMAT_VERSION}")
        units = json.loads(g.attrs["units"])
        ptr, idx = g["dep_ptr"][:], g["dep_idx"][:]
        prog = Program(num_cores=int(g.attrs["num_cores"]), meta=json.loads(g.attrs["meta"]),
                       vector_fns=json.loads(g.attrs["vector_fns"]))
        prog.kind = g["kind"][:].tolist()
        prog.core = g["core"][:].tolist()
        prog.unit = [units[i] for i in g["unit"][:]]
        prog.param = [tuple(r) for r in g["param"][:].tolist()]
        prog.cost_kind = g["cost_kind"][:].tolist()
        prog.cost_args = [tuple(r) for r in g["cost_args"][:].tolist()]
        prog.dep_idx, prog.dep_end = idx.tolist(), ptr[1:].tolist()
        prog.names = [s.decode() if isinstance(s, bytes) else s for s in g["name"][:]]
    return prog


__all__ = ["COST_FIXED", "COST_GEMM", "COST_VECTOR", "KIND_NOC", "Program", "Relocation", "clear_recorded",
           "load_program", "recorded_stats", "run_order", "submit_materialized"]
