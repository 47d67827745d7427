"""Find and load arch files: a path, or a preset name from the repository's ``arch/``."""

from __future__ import annotations

from pathlib import Path

from npusim.arch.schema import Arch
from npusim.config import load_with_extends, validate
from npusim.errors import ConfigError

PRESET_DIR = Path(__file__).resolve().parents[2] / "arch"
DEFAULT_ARCH = "npusim-64c"


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


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
    presets = ", ".join(list_presets()) or "(none found)"
    raise ConfigError(f"arch '{name}': no such file, and not a preset name (presets: {presets})")


def load_arch(name: str | Path = DEFAULT_ARCH) -> Arch:
    """Load and validate an arch file (or preset); raises ConfigError on any problem."""
    path = resolve_arch_path(name)
    data = load_with_extends(path, resolve_arch_path)
    return validate(Arch, data, path)
