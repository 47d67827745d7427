"""A system step as data: kernels to cost on a die, nodes that use them, dependencies.

A :class:`Workload` is what the system mapper (:mod:`npusim.system.mapper`) builds from a model
and a parallel plan, and what :func:`npusim.system.execute.time_workload` times on a system. It
names no system: ranks are the instance's dies ``0 .. ranks-1`` (placed on the system's first dies
when timed), and compute is named by *what* runs, not by how long it takes, so the same workload
can be re-timed on another system file (``npusim replay DIR --system S``) and its kernels are
costed there by that system's die.

``kernels`` (each costed once per timing, memoised by :class:`~npusim.system.chipcost.ChipCost`):

* ``{"type": "gemm", "m", "k", "n", "batch", "dtype", "cores"}``: ``batch`` GEMMs on the die
  (``cores``: on that many of its cores; default all);
* ``{"type": "layer", "part", "layer", "phase", "batch", "seq_len", "kv_len", "precision",
  "heads_split", "ffn_split", "vocab_split", "kv_dtype", "cores"}``: ops of decoder layer ``layer``
  of the workload's model (``meta.model``) built for that batch and sharded (heads, FFN width,
  vocabulary divided by the splits, :mod:`npusim.system.parts`), cut to ``part`` (see there; none:
  the whole layer, or the ops after the op named ``after`` up to the one named ``upto``: names
  without the ``L<i>.`` prefix, e.g. ``mlp_norm``);
* ``{"type": "onnx", "path", "phase", "batch", "seq_len", "kv_len", "dtype"}``: an ONNX-exported
  model's whole forward pass (:func:`npusim.model.onnx_import.load_onnx`) on the die;
* ``{"type": "vector", "op_class", "elements", "row_len", "fn", "dtype", "cores"}``: one vector
  operator (:meth:`~npusim.system.chipcost.ChipCost.vector`: its rows streamed from HBM through
  the cores' buffers and back), e.g. the experts' activation between their GEMMs;
* ``{"type": "fixed", "us", "source"}``: a time taken from a figure, not simulated (a calibrated
  constant: the step's breakdown files it under ``calibrated``);
* ``{"type": "sum", "of": [kernel indices], "times": n}``: those kernels back to back, ``n`` times;
* ``{"type": "blend", "a", "b", "weight"}``: ``a + (b - a) x weight`` (at least 0): a kernel between
  two costed shapes (a sequence group's mean context between two context lengths).

A kernel's indices refer to earlier kernels.

``nodes`` (in an order where every dependency comes first):

* ``{"kind": "compute", "rank", "kernel", "stream"}``: a kernel on one rank's stream (``compute``
  or ``moe``: the die's two in-order queues);
* ``{"kind": "collective", "op", "ranks", "bytes", "algorithm"}``: ``allreduce``, ``allgather``,
  ``reducescatter``, ``alltoall``, ``broadcast`` or ``sendrecv`` over those ranks (nccl-tests
  byte convention and algorithms of :mod:`npusim.system.collectives`; ``algorithm`` optional);
* ``{"kind": "transfers", "ranks", "bytes", "via"}``: rank ``ranks[i]`` writes ``bytes[i][j]`` to
  ``ranks[j]`` (MoE dispatch and combine with their real token counts); ``via``: ``sdma`` or
  ``aiv`` (default: the system's initiator default);
* ``{"kind": "barrier", "rank"}``: a zero-time mark; with ``rank``, it waits only for its
  dependencies' parts on that rank.

Every node has ``deps`` (earlier node indices), ``name`` and ``category`` (what the step's
breakdown files its time under). A rank of a node waits for a dependency's part *on that rank*
when the dependency has one (a compute node on the rank, the rank's share of a collective),
else for the whole dependency -- except that a collective or transfers node does not make one
rank wait for another rank's compute or barrier, nor for a collective or transfers node it takes
no part in (data crosses ranks only by communication).

``meta``: ``model`` (the model's config, our field names; an ONNX export: its name and path),
``plan`` (:class:`~npusim.system.plan.ParallelPlan` keys), ``phase``, ``batch``, ``seq_len``,
``kv_len``, ``tokens`` (output tokens of the step, for throughput), ``tokens_per_sequence``
(decode: 1 + the accepted speculative tokens), ``simulated_layers`` and
``repeat`` (optional: ``{"start": node, "marks": [nodes], "layers": L}``: the simulated layers
between the ``start`` mark and the last of the ``marks`` (each a layer's end) stand for ``L``
layers at the period between the last two marks: the step is the makespan with that stretch
replaced by ``L`` periods).

Saved as one JSON file, ``workload.json`` in a directory (``--save-workload DIR``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from npusim.arch.schema import DTYPE_BYTES
from npusim.errors import ConfigError
from npusim.files import read_text, write_json
from npusim.hw.compute.vector import ACTIVATION_FUNCTIONS, OP_CLASSES

FORMAT = "npusim-system-workload"
VERSION = 1
FILE_NAME = "workload.json"
NODE_KINDS = ("compute", "collective", "transfers", "barrier")
KERNEL_TYPES = ("gemm", "layer", "onnx", "vector", "fixed", "sum", "blend")
LAYER_PARTS = ("attention", "ffn", "router", "attention+router", "shared", "moe_tail", "head")
STREAMS = ("compute", "moe")


@dataclass
class Workload:
    ranks: int
    kernels: list[dict] = field(default_factory=list)
    nodes: list[dict] = field(default_factory=list)
    meta: dict = field(default_factory=dict)
    _kernel_index: dict = field(default_factory=dict, repr=False)

    # -- building ------------------------------------------------------------------------------
    def kernel(self, spec: dict) -> int:
        """The index of ``spec`` in the kernel table (added once)."""
        key = json.dumps(spec, sort_keys=True)
        if key not in self._kernel_index:
            self._kernel_index[key] = len(self.kernels)
            self.kernels.append(dict(spec))
        return self._kernel_index[key]

    def _add(self, node: dict, deps, name: str, category: str) -> int:
        node.update(deps=sorted({int(d) for d in deps if d is not None and d >= 0}), name=name, category=category)
        self.nodes.append(node)
        return len(self.nodes) - 1

    def compute(self, rank: int, kernel: dict | int, deps=(), name: str = "", category: str = "compute",
                stream: str = "compute") -> int:
        """A kernel (a spec, or the index :meth:`kernel` gave) on one rank's stream."""
        index = kernel if isinstance(kernel, int) else self.kernel(kernel)
        return self._add({"kind": "compute", "rank": int(rank), "kernel": index, "stream": stream}, deps, name,
                         category)

    def collective(self, op: str, ranks, nbytes: int, deps=(), name: str = "", category: str = "comm",
                   algorithm: str | None = None) -> int:
        node = {"kind": "collective", "op": op, "ranks": [int(r) for r in ranks], "bytes": int(nbytes)}
        if algorithm:
            node["algorithm"] = algorithm
        return self._add(node, deps, name, category)

    def transfers(self, ranks, nbytes, deps=(), name: str = "", category: str = "comm", via: str | None = None) -> int:
        node = {"kind": "transfers", "ranks": [int(r) for r in ranks], "bytes": [[int(b) for b in row] for row in nbytes]}
        if via:
            node["via"] = via
        return self._add(node, deps, name, category)

    def barrier(self, deps, name: str = "", category: str = "mark", rank: int | None = None) -> int:
        return self._add({"kind": "barrier"} if rank is None else {"kind": "barrier", "rank": int(rank)}, deps, name,
                         category)

    # -- files ---------------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, "ranks": self.ranks, "meta": self.meta,
                "kernels": self.kernels, "nodes": self.nodes}

    def save(self, directory: str | Path) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        return write_json(directory / FILE_NAME, self.to_dict(), indent=None)

    @classmethod
    def load(cls, path: str | Path) -> Workload:
        """Read a saved workload (a directory holding ``workload.json``, or the file), checked:
        a bad file is one ConfigError naming the file and the node or key."""
        path = Path(path)
        if path.is_dir():
            path = path / FILE_NAME
        try:
            d = json.loads(read_text(path, "a saved system workload (npusim run --system ... --save-workload DIR)"))
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(d, str(path))

    @classmethod
    def from_dict(cls, d, where: str = "workload") -> Workload:
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise ConfigError(f"{where}: not an npusim system workload (expected \"format\": \"{FORMAT}\")")
        if d.get("version") != VERSION:
            raise ConfigError(f"{where}: workload version {d.get('version')!r}; this npusim reads version {VERSION}")
        for key, kind in (("ranks", int), ("meta", dict), ("kernels", list), ("nodes", list)):
            if not isinstance(d.get(key), kind) or isinstance(d.get(key), bool):
                raise ConfigError(f"{where}: key '{key}' must be a {kind.__name__}")
        wl = cls(d["ranks"], d["kernels"], d["nodes"], d["meta"])
        wl.check(where)
        return wl

    def check(self, where: str = "workload") -> None:
        """Every field a timing reads, with its type and range (a saved file is user input): kinds,
        ranks in range, kernels' shapes within :data:`MAX_KERNEL_TOKENS` / :data:`MAX_KERNEL_MACS`,
        references to earlier kernels and nodes only, the meta the summary reads."""
        _int(self.ranks, f"{where}: 'ranks'", 1, MAX_RANKS)
        for i, k in enumerate(self.kernels):
            _check_kernel(k, i, f"{where}: kernels[{i}]")
        if not self.nodes:
            raise ConfigError(f"{where}: 'nodes' lists no work")
        for i, n in enumerate(self.nodes):
            _check_node(n, i, self.ranks, len(self.kernels), f"{where}: nodes[{i}]")
        _check_meta(self.meta, len(self.nodes), f"{where}: meta")


#: the largest rank count a workload names (the system schema's endpoint limit)
MAX_RANKS = 65_536
#: a kernel's tokens (batch x seq_len) and context: beyond them one kernel's chip simulation would not end
MAX_KERNEL_TOKENS = 2**22
#: a GEMM kernel's multiply-accumulates (batch x m x k x n)
MAX_KERNEL_MACS = 2**50
COLLECTIVE_OPS = ("allreduce", "allgather", "reducescatter", "alltoall", "broadcast", "sendrecv")


def _int(value, what: str, lo: int = 0, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi:,}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{what} must be an integer {rng}, got {value!r}")
    return value


def _number(value, what: str, lo: float = 0.0) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= lo or value == float("inf"):
        raise ConfigError(f"{what} must be a finite number >= {lo:g}, got {value!r}")
    return float(value)


def _str(value, what: str, choices=None) -> str:
    if not isinstance(value, str) or (choices is not None and value not in choices):
        expected = f"one of {', '.join(choices)}" if choices else "a string"
        raise ConfigError(f"{what} must be {expected}, got {value!r}")
    return value


def _check_kernel(k, i: int, at: str) -> None:
    if not isinstance(k, dict):
        raise ConfigError(f"{at}: expected a mapping with a 'type'")
    kind = _str(k.get("type"), f"{at}: 'type'", KERNEL_TYPES)
    if k.get("cores") is not None:
        _int(k["cores"], f"{at}: 'cores'", 1, 1 << 20)
    if kind == "gemm":
        dims = [_int(k.get(d, 1 if d == "batch" else None), f"{at}: '{d}'", 1, MAX_KERNEL_TOKENS)
                for d in ("m", "k", "n", "batch")]
        if dims[0] * dims[1] * dims[2] * dims[3] > MAX_KERNEL_MACS:
            raise ConfigError(f"{at}: a GEMM of {dims[3]} x {dims[0]} x {dims[1]} x {dims[2]} multiply-accumulates, "
                              f"more than {MAX_KERNEL_MACS:.1e}")
        _str(k.get("dtype", "bf16"), f"{at}: 'dtype'")
    elif kind in ("layer", "onnx"):
        _str(k.get("phase"), f"{at}: 'phase'", ("decode", "prefill"))
        batch, seq = (_int(k.get(d), f"{at}: '{d}'", 1, MAX_KERNEL_TOKENS) for d in ("batch", "seq_len"))
        _int(k.get("kv_len"), f"{at}: 'kv_len'", 1, MAX_KERNEL_TOKENS)
        if batch * seq > MAX_KERNEL_TOKENS:
            raise ConfigError(f"{at}: {batch} x {seq} tokens, more than {MAX_KERNEL_TOKENS:,} in one kernel")
        if kind == "onnx":
            _str(k.get("path"), f"{at}: 'path'")
        else:
            _int(k.get("layer"), f"{at}: 'layer'", -1, 1 << 16)
            if k.get("part") is not None:
                _str(k["part"], f"{at}: 'part'", LAYER_PARTS)
            for cut in ("after", "upto"):
                if k.get(cut) is not None:
                    _str(k[cut], f"{at}: '{cut}'")
            for split in ("heads_split", "ffn_split", "vocab_split"):
                _int(k.get(split, 1), f"{at}: '{split}'", 1, 1 << 20)
            _str(k.get("precision", "bf16"), f"{at}: 'precision'")
            _str(k.get("kv_dtype", "bf16"), f"{at}: 'kv_dtype'", ("bf16", "int8"))
    elif kind == "vector":
        op_class = _str(k.get("op_class"), f"{at}: 'op_class'", OP_CLASSES)
        if op_class == "activation":  # other classes ignore 'fn' (e.g. an elementwise add)
            _str(k.get("fn"), f"{at}: 'fn'", sorted(ACTIVATION_FUNCTIONS))
        _int(k.get("elements"), f"{at}: 'elements'", 1, MAX_KERNEL_TOKENS << 16)
        _int(k.get("row_len", 1), f"{at}: 'row_len'", 1, 1 << 24)
        _str(k.get("dtype", "bf16"), f"{at}: 'dtype'", sorted(DTYPE_BYTES))
    elif kind == "fixed":
        _number(k.get("us"), f"{at}: 'us'")
    elif kind == "sum":
        refs = k.get("of")
        if not isinstance(refs, list):
            raise ConfigError(f"{at}: 'of' must list earlier kernels")
        for j in refs:
            _int(j, f"{at}: 'of' (a sum kernel refers to earlier kernels only)", 0, i - 1)
        _int(k.get("times", 1), f"{at}: 'times'", 1, 1 << 20)
    else:  # blend
        for ref in ("a", "b"):
            _int(k.get(ref), f"{at}: '{ref}' (a blend kernel refers to earlier kernels only)", 0, i - 1)
        _number(k.get("weight"), f"{at}: 'weight'", float("-inf"))


def _check_node(n, i: int, ranks: int, kernels: int, at: str) -> None:
    if not isinstance(n, dict):
        raise ConfigError(f"{at}: expected a mapping with a 'kind'")
    kind = _str(n.get("kind"), f"{at}: 'kind'", NODE_KINDS)
    for key, default in (("deps", []), ("name", ""), ("category", "other")):
        n.setdefault(key, default)
    deps = n["deps"]
    if not isinstance(deps, list):
        raise ConfigError(f"{at}: 'deps' must list indices of earlier nodes")
    for d in deps:
        _int(d, f"{at}: 'deps' (indices of earlier nodes)", 0, i - 1)
    _str(n.get("name", ""), f"{at}: 'name'")
    _str(n.get("category", ""), f"{at}: 'category'")
    if kind == "compute" or (kind == "barrier" and "rank" in n):
        _int(n.get("rank"), f"{at}: 'rank'", 0, ranks - 1)
    if kind == "compute":
        _int(n.get("kernel"), f"{at}: 'kernel' (an index of the kernel table)", 0, kernels - 1)
        _str(n.get("stream", "compute"), f"{at}: 'stream'", STREAMS)
    if kind in ("collective", "transfers"):
        members = n.get("ranks")
        if not isinstance(members, list) or len(members) < 2:
            raise ConfigError(f"{at}: 'ranks' must list two or more ranks")
        for r in members:
            _int(r, f"{at}: 'ranks'", 0, ranks - 1)
        if n.get("via") is not None:
            _str(n["via"], f"{at}: 'via'", ("sdma", "aiv"))
    if kind == "collective":
        _str(n.get("op"), f"{at}: 'op'", COLLECTIVE_OPS)
        _int(n.get("bytes"), f"{at}: 'bytes'", 0)
        if n.get("algorithm") is not None:
            _str(n["algorithm"], f"{at}: 'algorithm'")
    elif kind == "transfers":
        b, size = n.get("bytes"), len(n["ranks"])
        if not isinstance(b, list) or len(b) != size or any(not isinstance(row, list) or len(row) != size for row in b):
            raise ConfigError(f"{at}: 'bytes' must be a {size} x {size} matrix of byte counts")
        for row in b:
            for v in row:
                _int(v, f"{at}: 'bytes'", 0)


def _check_meta(meta, nodes: int, at: str) -> None:
    if not isinstance(meta, dict):
        raise ConfigError(f"{at}: expected a mapping")
    from npusim.model.zoo import get_config
    from npusim.system.plan import ParallelPlan

    model = meta.get("model")
    if not isinstance(model, dict) or not isinstance(model.get("name"), str):
        raise ConfigError(f"{at}.model must be the model's config (a mapping with a 'name')")
    if "onnx" in model:
        _str(model["onnx"], f"{at}.model.onnx")
    else:
        try:
            get_config(model)
        except ConfigError as exc:
            raise ConfigError(f"{at}.model: {exc}") from None
    ParallelPlan.from_dict(meta.get("plan"), f"{at}.plan")
    _str(meta.get("phase"), f"{at}.phase", ("decode", "prefill"))
    _number(meta.get("batch"), f"{at}.batch")
    _number(meta.get("tokens"), f"{at}.tokens")
    for key in ("seq_len", "kv_len"):
        _int(meta.get(key), f"{at}.{key}", 1)
    _number(meta.get("tokens_per_sequence", 1.0), f"{at}.tokens_per_sequence", 1e-9)
    repeat = meta.get("repeat")
    if repeat is None:
        return
    if not isinstance(repeat, dict) or not isinstance(repeat.get("marks"), list) or len(repeat["marks"]) < 2:
        raise ConfigError(f"{at}.repeat must be a mapping with 'start', 'marks' (two or more) and 'layers'")
    points = [repeat.get("start"), *repeat["marks"]]
    for m in points:
        _int(m, f"{at}.repeat's start and marks (node indices)", 0, nodes - 1)
    if any(b <= a for a, b in zip(points, points[1:])):
        raise ConfigError(f"{at}.repeat: the start, then the marks, in increasing node order")
    _int(repeat.get("layers"), f"{at}.repeat.layers", 1, 1 << 20)
