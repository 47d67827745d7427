"""Write result files atomically: a file appears complete or not at all (used by every layer)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from npusim.errors import ConfigError


def read_text(path: str | Path, expected: str, missing: str = "file not found") -> str:
    """The text of a user's input file (UTF-8; a leading BOM is not data). Anything else -- missing,
    a directory, unreadable, binary -- is one ConfigError naming the file and ``expected`` (what it
    should be, e.g. "a YAML file")."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise ConfigError(f"{path}: {missing}; expected {expected}") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory; expected {expected}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}); expected {expected}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read ({exc.strerror or exc}); expected {expected}") from None


def check_output_dir(path: str | Path, flag: str = "--out") -> None:
    """Create the output directory ``path`` now, before a long simulation, so that a path
    that cannot be a directory fails at once with one clear error naming ``flag``."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"{flag} {path}: cannot create the directory ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {path}: the directory is not writable")


def remove_partials(folder: str | Path) -> None:
    """Remove the hidden ``.NAME.*.partial`` files that a killed run (SIGKILL, a power cut) left in ``folder``."""
    for stale in Path(folder).glob(".*.partial"):
        stale.unlink(missing_ok=True)


@contextmanager
def result_files(files: dict[str, Path]):
    """Write one run's result ``files`` as a set, ``summary`` last (the caller's duty: it marks the set
    complete). An earlier run's files of the same names are removed first, so old and new results
    never stand side by side; if writing fails or is interrupted, the files written so far are
    removed too, so no incomplete set is left behind."""
    for path in files.values():
        Path(path).unlink(missing_ok=True)
    try:
        yield files
    except BaseException:
        for path in files.values():
            Path(path).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_path(path: str | Path):
    """Yield a temporary path next to ``path``; rename it over ``path`` only on success."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    except OSError as exc:
        raise ConfigError(f"cannot write {path}: the directory {path.parent} cannot be created or written "
                          f"({exc.strerror or exc})") from None
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; results are ordinary files
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _finite(obj):
    """``obj`` with every non-finite float (inf, NaN) replaced by None: JSON has no such numbers."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def json_text(obj, indent: int | None = 2) -> str:
    """Strict JSON (no Infinity or NaN: those become null; other objects by ``str``)."""
    return json.dumps(_finite(obj), indent=indent, default=str, allow_nan=False)


def write_json(path: str | Path, obj, indent: int | None = 2) -> Path:
    with atomic_path(path) as tmp:
        with open(tmp, "w") as f:
            f.write(json_text(obj, indent))
            f.write("\n")
    return Path(path)


def write_with(path: str | Path, writer: Callable[[Path], None]) -> Path:
    with atomic_path(path) as tmp:
        writer(tmp)
    return Path(path)
