"""Sweep files (``examples/sweeps/*.yaml``): a base configuration and the axes that vary it.

A sweep file names a ``base`` — the chip (``arch``: a preset, a file, or an inline mapping with
``extends:``), the ``model``, the ``mapping`` (a spec file or an inline spec), the ``workload``
(a forward pass: ``phase``/``batch``/``seq``/``kv``; or a request stream: ``rate``/``requests``/
``trace``/...) and ``run`` options (every other ``npusim run`` flag, spelled with underscores:
``memory``, ``fidelity``, ``schedule``, ``pd_ratio``, ...) — and axes over dotted key paths of any
of them::

    grid:                                   # every combination
      arch.cores.sram.capacity_mb: [8, 16, 32]
      model: [qwen3-4b, qwen3-32b]
    zip:                                    # varied together (equal lengths); a list of
      run.pd_ratio: ["21:42", "42:21"]      # such groups crosses them
      workload.rate: [4, 8]
    random:                                 # seeded samples
      samples: 10
      seed: 0
      axes:
        arch.hbm.tck_ns: {low: 0.5, high: 1.0}
        arch.cores.systolic_array.rows: [32, 64, 128]     # a list: uniform choice

Points are the product of the grid, the zipped rows and the random samples (each part absent
counts as one empty point), in that order; the order is deterministic. Random samples that
repeat an earlier sample are dropped; repeated grid or zip points are an error. ``arch.X`` and
``mapping.X`` are applied to the loaded file's dict (after ``extends:`` merging) before it is
validated; ``arch``, ``model`` and ``mapping`` alone replace the whole value. Workload and run
keys are ``npusim run``'s own options: a point is parsed by ``npusim run``'s parser, so it means
exactly what the command would. Every point is validated when the file is loaded (unknown keys
get a did-you-mean, errors name the file, the point and its axis values); only failures that
need a simulation (a mapping that does not fit, a deadlock) are left to the point's run, where
they are recorded and the sweep goes on.

A point's identity is the SHA-256 of its resolved configuration (the arch and mapping dicts,
the model, the options as given, and the content digest of any trace or ONNX file it reads), so
a rerun recognises finished points whatever else changed in the file.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import itertools
import json
import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, PositiveInt, create_model, model_validator

from npusim.arch.load import DEFAULT_ARCH, resolve_arch_path
from npusim.arch.schema import Arch
from npusim.config import StrictModel, deep_merge, load_with_extends, load_yaml, validate
from npusim.errors import ConfigError
from npusim.files import read_text
from npusim.mapping.spec import MAPPER_DIR, MappingSpec

SECTIONS = ("arch", "model", "mapping", "workload", "run")
WORKLOAD_KEYS = ("forward", "phase", "batch", "seq", "kv", "trace", "rate", "requests", "input_len", "output_len",
                 "duration", "time_scale", "max_input", "max_output", "seed", "prefix_cache", "slo_ttft_ms",
                 "slo_tbt_ms")
# npusim run options a sweep does not set: the point's chip/model/mapping come from their own
# sections, outputs are the sweep's, and multi-NPU steps (--system) are not swept yet.
NOT_OPTIONS = ("arch", "model", "mapping", "out", "json", "no_progress", "system", "nodes", "help", "batch_tokens",
               "mtp", "mtp_acceptance", "microbatches", "eplb", "routing")


def run_parser() -> argparse.ArgumentParser:
    """``npusim run``'s parser (:mod:`npusim.scenarios.options`), raising instead of exiting (a point's
    options are checked with it)."""
    from npusim.scenarios.options import run_parser as parser

    return parser()


def _option_actions() -> dict[str, argparse.Action]:
    return {a.dest: a for a in run_parser()._actions
            if a.dest not in NOT_OPTIONS and a.option_strings and a.dest != argparse.SUPPRESS}


def _annotation(action: argparse.Action):
    if isinstance(action, argparse._StoreTrueAction):
        return bool | None
    if action.choices:
        return Literal[tuple(action.choices)] | None
    base = getattr(action.type, "base_type", action.type)  # npusim.argtypes' range-checked numbers
    if base is int:
        return int | None
    if base is float:
        return float | None
    return str | int | float | None  # strings such as "128:512"; YAML may read "256" as a number


@lru_cache(maxsize=1)
def option_models() -> tuple[type[StrictModel], type[StrictModel]]:
    """The ``workload:`` and ``run:`` schemas, made from ``npusim run``'s flags (they stay in step)."""
    actions = _option_actions()
    work = {k: (_annotation(a), Field(None, description=a.help)) for k, a in actions.items() if k in WORKLOAD_KEYS}
    run = {k: (_annotation(a), Field(None, description=a.help)) for k, a in actions.items() if k not in WORKLOAD_KEYS}
    return (create_model("Workload", __base__=StrictModel, **work),
            create_model("RunOptions", __base__=StrictModel, **run))


class Distribution(StrictModel):
    """A random axis over a range: uniform in ``[low, high]`` (log-uniform with ``log``), rounded with ``integer``."""

    low: float
    high: float
    log: bool = False
    integer: bool = False

    @model_validator(mode="after")
    def _range(self):
        if not self.high >= self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        if self.log and not self.low > 0:
            raise ValueError("log: low must be > 0")
        return self


class RandomAxes(StrictModel):
    samples: PositiveInt
    seed: int = 0
    axes: dict[str, list[Any] | Distribution]


class Base(StrictModel):
    arch: str | dict[str, Any] = DEFAULT_ARCH
    model: str = "qwen3-4b"
    mapping: str | dict[str, Any] | None = None
    workload: dict[str, Any] = Field(default_factory=dict)
    run: dict[str, Any] = Field(default_factory=dict)


class Published(StrictModel):
    """The published trend a study reproduces, printed beside its plots by ``npusim report``."""

    source: str
    trend: str


class ReportDefaults(StrictModel):
    x: str | None = None
    y: str | None = None
    hue: str | None = None


class SweepFile(StrictModel):
    name: str
    description: str = ""
    base: Base = Base()
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    zip: dict[str, list[Any]] | list[dict[str, list[Any]]] = Field(
        default_factory=dict, description="one group of lists varied together, or a list of such groups (crossed)")
    random: RandomAxes | None = None
    published: Published | None = None
    report: ReportDefaults = ReportDefaults()


@dataclass
class Point:
    """One configuration of a sweep, ready to run anywhere (plain data: it is pickled to workers)."""

    index: int
    axes: dict[str, Any]
    config: dict[str, Any]  # arch dict, model, mapping dict, options: what the hash covers
    argv: list[str]  # npusim run's arguments for the workload and run options
    config_hash: str
    seed: int


@dataclass
class Sweep:
    path: Path
    spec: SweepFile
    text: str
    axis_names: list[str]
    points: list[Point] = field(default_factory=list)


#: points a sweep file may expand to unless the caller lifts the limit (``npusim sweep --force``):
#: at a few seconds a point, about a day on a 2-core machine
MAX_POINTS = 10_000


def load_sweep(path: str | Path, max_points: int | None = MAX_POINTS) -> Sweep:
    """Read, validate and expand a sweep file; raises ConfigError naming the file and key on bad input,
    and, before expanding, when it has more than ``max_points`` points (None: no limit)."""
    path = Path(path)
    data = load_yaml(path)
    spec = validate(SweepFile, data, path)
    count = point_count(spec)
    if max_points is not None and count > max_points:
        raise ConfigError(f"{path}: {count:,} points, more than {max_points:,} (at a few seconds each, "
                          f"~{count * 3 / 3600 / 2:,.0f} hours on 2 workers); narrow the axes, or add --force")
    workload_model, run_model = option_models()
    validate(workload_model, spec.base.workload, f"{path}: base.workload")
    validate(run_model, spec.base.run, f"{path}: base.run")
    combos = expand(spec, path)
    names = list(dict.fromkeys(k for combo in combos for k in combo))
    for name in names:
        check_axis_key(name, path)
    sweep = Sweep(path=path, spec=spec, text=read_text(path, "a sweep YAML file"), axis_names=names)
    seen: dict[str, int] = {}
    for i, combo in enumerate(combos):
        point = build_point(spec, combo, i, path)
        if point.config_hash in seen:
            raise ConfigError(f"{path}: points {seen[point.config_hash]} and {i} are the same configuration "
                              f"({_describe(combo)}); every point must differ")
        seen[point.config_hash] = i
        sweep.points.append(point)
    return sweep


def point_count(spec: SweepFile) -> int:
    """How many points ``spec`` expands to, at most (duplicate random samples are dropped), computed
    without expanding it."""
    groups = [spec.zip] if isinstance(spec.zip, dict) else list(spec.zip)
    count = math.prod(len(v) for v in spec.grid.values())
    for group in (g for g in groups if g):
        count *= max((len(v) for v in group.values()), default=1)
    return count * (spec.random.samples if spec.random is not None else 1)


def expand(spec: SweepFile, path: Path) -> list[dict[str, Any]]:
    """The axis values of every point: grid x zip x random samples (deterministic order)."""
    groups = [spec.zip] if isinstance(spec.zip, dict) else list(spec.zip)
    for name, values in [*spec.grid.items(), *(kv for g in groups for kv in g.items())]:
        if not values:
            raise ConfigError(f"{path}: axis '{name}': needs at least one value")
    grid = [dict(zip(spec.grid, vals)) for vals in itertools.product(*spec.grid.values())] if spec.grid else [{}]
    zipped = [{}]
    for group in (g for g in groups if g):
        lengths = {k: len(v) for k, v in group.items()}
        if len(set(lengths.values())) > 1:
            raise ConfigError(f"{path}: zip: lists must have equal lengths, got "
                              + ", ".join(f"{k}: {n}" for k, n in lengths.items()))
        zipped = [{**z, **dict(zip(group, vals))} for z in zipped for vals in zip(*group.values())]
    rand = [{}]
    if spec.random is not None:
        rng = np.random.default_rng(spec.random.seed)
        drawn = [{k: _sample(rng, d) for k, d in spec.random.axes.items()} for _ in range(spec.random.samples)]
        # a sample that repeats an earlier one (choices, integers) is dropped
        first = {}
        for r in drawn:
            first.setdefault(json.dumps(r, sort_keys=True), r)
        rand = list(first.values())  # in the order first drawn
    names = [*spec.grid, *(k for g in groups for k in g), *(spec.random.axes if spec.random else ())]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"{path}: axis {repeated[0]!r} appears more than once in grid, zip and random")
    return [{**g, **z, **r} for g in grid for z in zipped for r in rand]


def _sample(rng: np.random.Generator, dist) -> Any:
    if isinstance(dist, list):
        if not dist:
            raise ConfigError("random axis: the list of choices is empty")
        return dist[int(rng.integers(len(dist)))]
    if dist.log:
        value = float(np.exp(rng.uniform(np.log(dist.low), np.log(dist.high))))
    else:
        value = float(rng.uniform(dist.low, dist.high))
    return int(round(value)) if dist.integer else round(value, 12)


def check_axis_key(name: str, path: Path) -> None:
    section, _, rest = name.partition(".")
    if section not in SECTIONS:
        hint = difflib.get_close_matches(section, SECTIONS, n=1, cutoff=0.5)
        raise ConfigError(f"{path}: axis '{name}': a key path must start with one of {', '.join(SECTIONS)}"
                          + (f"; did you mean '{hint[0]}'?" if hint else ""))
    if section == "model" and rest:
        raise ConfigError(f"{path}: axis '{name}': 'model' is a name, it has no keys inside")
    if section in ("workload", "run"):
        workload_model, run_model = option_models()
        valid = list((workload_model if section == "workload" else run_model).model_fields)
        if rest not in valid:
            hint = difflib.get_close_matches(rest, valid, n=1, cutoff=0.6)
            raise ConfigError(f"{path}: axis '{name}': unknown {section} key"
                              + (f"; did you mean '{section}.{hint[0]}'?" if hint else "")
                              + f" (valid: {', '.join(sorted(valid))})")


def build_point(spec: SweepFile, combo: dict[str, Any], index: int, path: Path) -> Point:
    """Apply one point's axis values to the base and validate the result."""
    where = f"{path}: point {index} ({_describe(combo)})"
    whole = {k: v for k, v in combo.items() if "." not in k}
    arch_data = _arch_dict(whole.get("arch", spec.base.arch), path, where)
    mapping_src = whole.get("mapping", spec.base.mapping)
    mapping_data = None if mapping_src is None else _mapping_dict(mapping_src, path, where)
    model = str(whole.get("model", spec.base.model))
    workload, run = dict(spec.base.workload), dict(spec.base.run)
    for key, value in combo.items():
        section, _, rest = key.partition(".")
        if not rest:
            continue
        if section == "arch":
            arch_data = _set_path(arch_data, rest, value, f"{where}: arch")
        elif section == "mapping":
            if mapping_data is None:
                raise ConfigError(f"{where}: axis '{key}' changes the mapping, but base.mapping is not set "
                                  "(name a spec file, or give an inline spec such as {extends: tp4-pipeline})")
            mapping_data = _set_path(mapping_data, rest, value, f"{where}: mapping")
        elif section == "workload":
            workload[rest] = value
        else:
            run[rest] = value
    validate(Arch, arch_data, f"{where}: arch")
    if mapping_data is not None:
        validate(MappingSpec, mapping_data, f"{where}: mapping")
    workload_model, run_model = option_models()
    validate(workload_model, workload, f"{where}: workload")
    validate(run_model, run, f"{where}: run")
    options = {**workload, **run}
    files = {}
    for key in ("trace",):
        if options.get(key) is not None:
            options[key] = str(_resolve_file(options[key], path, f"{where}: workload.{key}"))
            files[key] = _digest(options[key])
    if model.endswith(".onnx"):
        model = str(_resolve_file(model, path, f"{where}: model"))
        files["model"] = _digest(model)
    argv = options_argv(options)
    args = parse_options(argv, where)
    config = {"arch": arch_data, "model": model, "mapping": mapping_data, "options": dict(sorted(options.items()))}
    # the hash sees files by content, not by where they are
    hashed = {**config, "model": files.get("model", model),
              "options": {**config["options"], **({"trace": files["trace"]} if "trace" in files else {})}}
    digest = hashlib.sha256(json.dumps(hashed, sort_keys=True, default=str).encode()).hexdigest()
    return Point(index=index, axes=dict(combo), config=config, argv=argv, config_hash=digest, seed=int(args.seed))


def options_argv(options: dict[str, Any]) -> list[str]:
    """``npusim run`` arguments for workload/run options (``pd_ratio: "42:21"`` -> ``--pd-ratio 42:21``)."""
    argv: list[str] = []
    actions = _option_actions()
    for key, value in sorted(options.items()):
        if value is None:
            continue
        flag = actions[key].option_strings[-1]
        if isinstance(actions[key], argparse._StoreTrueAction):
            if value:
                argv.append(flag)
        else:
            argv += [flag, str(value)]
    return argv


def parse_options(argv: list[str], where: str = "sweep point") -> argparse.Namespace:
    try:
        args = run_parser().parse_args(argv)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    args.no_progress = True
    args.json = True
    args.out = None
    return args


def _arch_dict(source, path: Path, where: str) -> dict:
    if isinstance(source, dict):
        data = dict(source)
        parent = data.pop("extends", None)
        if parent is not None:
            base = load_with_extends(resolve_arch_path(str(parent), path.parent), resolve_arch_path)
            data = deep_merge(base, data)
    else:
        data = load_with_extends(resolve_arch_path(str(source), path.parent), resolve_arch_path)
    if "system" in data:
        raise ConfigError(f"{where}: arch '{source}' is a system of many NPUs; sweeps run on one chip")
    return data


def _resolve_mapping(name: str, relative_to: Path) -> Path:
    for cand in (relative_to / name, Path(name), MAPPER_DIR / f"{Path(name).stem}.yaml"):
        if cand.is_file():
            return cand
    raise ConfigError(f"mapping '{name}': no such file, and not a spec in {MAPPER_DIR}")


def _mapping_dict(source, path: Path, where: str) -> dict:
    if isinstance(source, dict):
        data = dict(source)
        parent = data.pop("extends", None)
        if parent is None:
            return data
        base = load_with_extends(_resolve_mapping(str(parent), path.parent), _resolve_mapping)
        return deep_merge(base, data)
    return load_with_extends(_resolve_mapping(str(source), path.parent), _resolve_mapping)


def _set_path(data: dict, dotted: str, value, where: str) -> dict:
    """A copy of ``data`` with ``a.b.c`` set (missing levels are created; the schema then checks them)."""
    keys = dotted.split(".")
    out = dict(data)
    node = out
    for i, k in enumerate(keys[:-1]):
        child = node.get(k)
        if child is None:
            child = {}
        elif not isinstance(child, dict):
            raise ConfigError(f"{where}: '{'.'.join(keys[:i + 1])}' is {child!r}, not a section with keys inside")
        node[k] = dict(child)
        node = node[k]
    node[keys[-1]] = value
    return out


def _resolve_file(name, path: Path, where: str) -> Path:
    for cand in (path.parent / str(name), Path(str(name))):
        if cand.is_file():
            return cand.resolve()
    raise ConfigError(f"{where}: '{name}': no such file (relative paths are relative to the sweep file)")


def _digest(file: str) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _describe(combo: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in combo.items()) or "the base"
