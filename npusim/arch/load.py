"""Find and load arch files: a path, or a preset name from ``arch/`` (the repository's, or the
copy an installed wheel ships; see :mod:`npusim.resources`)."""

from __future__ import annotations

from pathlib import Path

from npusim.arch.schema import Arch, merge_arch_data
from npusim.choices import DEFAULT_ARCH
from npusim.config import load_with_extends, load_yaml, validate
from npusim.errors import ConfigError
from npusim.resources import data_dir

PRESET_DIR = data_dir("arch")


def _is_system(path: Path) -> bool:
    """System files (many NPUs, :mod:`npusim.system`) share ``arch/`` and have a top-level ``system:``."""
    try:
        return "system" in load_yaml(path)
    except ConfigError:
        return False


def list_presets() -> list[str]:
    """Chip presets (system presets in the same folder are listed by ``npusim.system.load``)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if not _is_system(p))


def resolve_arch_path(name: str | Path, relative_to: Path | None = None) -> Path:
    """A file path as given (or relative to ``relative_to``), else a preset name."""
    candidates = [Path(name)]
    if relative_to is not None:
        candidates.insert(0, relative_to / name)
    stem = Path(name).name.removesuffix(".yaml")
    candidates.append(PRESET_DIR / f"{stem}.yaml")
    for cand in candidates:
        if cand.is_file():
            return cand
    presets = ", ".join(sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))) or "(none found)"
    raise ConfigError(f"'{name}': no such file, and not a preset name (presets: {presets})")


def load_arch(name: str | Path = DEFAULT_ARCH) -> Arch:
    """Load and validate an arch file (or preset); raises ConfigError on any problem."""
    path = resolve_arch_path(name)
    data = load_with_extends(path, resolve_arch_path, merge=merge_arch_data)
    if "system" in data:
        raise ConfigError(f"{path}: a system of many NPUs, not one chip: use it with --system "
                          f"(chip presets: {', '.join(list_presets())})")
    return validate(Arch, data, path)
