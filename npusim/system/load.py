"""Find and load system files: a path or a preset name in ``arch/`` whose top level is ``system:``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from npusim.arch import load_arch
from npusim.arch.load import PRESET_DIR, resolve_arch_path
from npusim.arch.schema import Arch
from npusim.config import deep_merge, load_with_extends, load_yaml, validate
from npusim.errors import ConfigError
from npusim.system.schema import System, SystemFile
from npusim.system.topology import Topology, build_topology


@dataclass
class LoadedSystem:
    """A validated system, its die's chip description and its expanded topology."""

    system: System
    chip: Arch
    topology: Topology
    source: Path


def is_system_file(name: str | Path) -> bool:
    """True when ``name`` resolves to a file whose top level (after ``extends:``) has ``system:``."""
    try:
        return "system" in load_with_extends(resolve_arch_path(name), resolve_arch_path)
    except ConfigError:
        return False


def list_system_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if "system" in load_yaml(p))


def load_system(name: str | Path, nodes: int | None = None) -> LoadedSystem:
    """Load and validate a system file or preset; ``nodes`` overrides ``system.nodes`` (a slice).

    Raises ConfigError naming the file and key for any problem: schema errors, an unknown chip,
    a link to nowhere, a disconnected fabric graph."""
    path = resolve_arch_path(name)
    data = load_with_extends(path, resolve_arch_path)
    if "system" not in data:
        raise ConfigError(f"{path}: not a system file (expected a top-level 'system:' key; "
                          f"system presets: {', '.join(list_system_presets())})")
    if nodes is not None:
        if nodes < 1:
            raise ConfigError(f"--nodes {nodes}: expected a positive number of nodes")
        data = deep_merge(data, {"system": {"nodes": nodes}})
    system = validate(SystemFile, data, path).system
    try:
        chip = load_arch(system.npu.chip)
    except ConfigError as exc:
        raise ConfigError(f"{path}: system.npu.chip: {exc}") from None
    try:
        topology = build_topology(system)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return LoadedSystem(system, chip, topology, path)
