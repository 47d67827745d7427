"""Where the shipped input files live: chip and system presets (``arch/``) and mapping
specs (``mappers/``).

The top-level ``arch/`` and ``mappers/`` folders of the repository are the single
source: users read, copy and edit them there, and a source checkout (or an editable
install) reads them in place. A wheel cannot carry folders outside its package, so the
build step in ``setup.py`` copies them into the wheel as ``npusim/data/arch`` and
``npusim/data/mappers``; an installed copy reads those. Nothing is duplicated in the
repository, so the two can never disagree.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
SHIPPED_FOLDERS = ("arch", "mappers")


def data_dir(folder: str) -> Path:
    """The ``arch`` or ``mappers`` folder this copy of npusim reads presets from."""
    if folder not in SHIPPED_FOLDERS:
        raise ValueError(f"not a shipped folder: {folder!r}")
    installed = _PACKAGE / "data" / folder  # present only in a built wheel / installed copy
    return installed if installed.is_dir() else _PACKAGE.parent / folder


def preset_names() -> list[str]:
    """Every preset shipped in ``arch/``: chips and multi-NPU systems (names without ``.yaml``)."""
    return sorted(p.stem for p in data_dir("arch").glob("*.yaml"))
