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
  the whole layer, or the ops ``after`` / ``upto`` ops whose names end so);
* ``{"type": "onnx", "path", "phase", "batch", "seq_len", "kv_len", "dtype"}``: an ONNX-exported
  model's whole forward pass (:func:`npusim.model.onnx_import.load_onnx`) on the die;
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
rank wait for another rank's compute or barrier (data crosses ranks only by communication).

``meta``: ``model`` (the model's config, our field names), ``plan``, ``phase``, ``batch``,
``seq_len``, ``kv_len``, ``tokens`` (output tokens of the step, for throughput) and
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

from npusim.errors import ConfigError
from npusim.files import read_text, write_json

FORMAT = "npusim-system-workload"
VERSION = 1
FILE_NAME = "workload.json"
NODE_KINDS = ("compute", "collective", "transfers", "barrier")
KERNEL_TYPES = ("gemm", "layer", "onnx", "fixed", "sum", "blend")
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
        """Structural checks: kinds, ranks in range, kernels known, dependencies on earlier nodes."""
        if self.ranks < 1:
            raise ConfigError(f"{where}: ranks must be at least 1")
        for i, k in enumerate(self.kernels):
            if not isinstance(k, dict) or k.get("type") not in KERNEL_TYPES:
                raise ConfigError(f"{where}: kernels[{i}]: 'type' must be one of {', '.join(KERNEL_TYPES)}")
            if k["type"] == "layer" and k.get("part") not in (*LAYER_PARTS, None):
                raise ConfigError(f"{where}: kernels[{i}]: 'part' must be one of {', '.join(LAYER_PARTS)}")
            refs = k.get("of", []) if k["type"] == "sum" else [k.get("a"), k.get("b")] if k["type"] == "blend" else []
            if any(not isinstance(j, int) or not 0 <= j < i for j in refs):
                raise ConfigError(f"{where}: kernels[{i}]: a {k['type']} kernel refers to earlier kernels only")
            if k["type"] == "fixed" and (not isinstance(k.get("us"), (int, float)) or k["us"] < 0):
                raise ConfigError(f"{where}: kernels[{i}]: a fixed kernel needs 'us' >= 0")
        for i, n in enumerate(self.nodes):
            at = f"{where}: nodes[{i}]"
            if not isinstance(n, dict) or n.get("kind") not in NODE_KINDS:
                raise ConfigError(f"{at}: 'kind' must be one of {', '.join(NODE_KINDS)}")
            deps = n.get("deps", [])
            if not isinstance(deps, list) or any(not isinstance(x, int) or not 0 <= x < i for x in deps):
                raise ConfigError(f"{at}: 'deps' must list indices of earlier nodes")
            ranks = [n["rank"]] if "rank" in n else n.get("ranks", [])
            if any(not isinstance(r, int) or not 0 <= r < self.ranks for r in ranks):
                raise ConfigError(f"{at}: rank(s) {ranks} outside 0..{self.ranks - 1}")
            if n["kind"] == "compute":
                if not isinstance(n.get("kernel"), int) or not 0 <= n["kernel"] < len(self.kernels):
                    raise ConfigError(f"{at}: 'kernel' must index the kernel table (0..{len(self.kernels) - 1})")
                if n.get("stream", "compute") not in STREAMS:
                    raise ConfigError(f"{at}: 'stream' must be one of {', '.join(STREAMS)}")
            elif n["kind"] == "collective":
                if not isinstance(n.get("bytes"), int) or n["bytes"] < 0 or len(ranks) < 2:
                    raise ConfigError(f"{at}: a collective needs 'bytes' >= 0 and two or more 'ranks'")
            elif n["kind"] == "transfers":
                b = n.get("bytes")
                if not isinstance(b, list) or len(b) != len(ranks) or any(
                        not isinstance(row, list) or len(row) != len(ranks) for row in b):
                    raise ConfigError(f"{at}: 'bytes' must be a {len(ranks)} x {len(ranks)} matrix")
        repeat = self.meta.get("repeat") or {}
        marks = [*repeat.get("marks", []), repeat.get("start", 0)]
        if repeat and any(not isinstance(m, int) or not 0 <= m < len(self.nodes) for m in marks):
            raise ConfigError(f"{where}: meta.repeat's start and marks must index nodes")
