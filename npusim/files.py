"""Write result files atomically: a file appears complete or not at all (used by every layer)."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
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
    """Remove what a killed run (SIGKILL, a power cut) left half-written in ``folder``: hidden
    ``.NAME.*.partial`` files and ``.npusim-results.*.partial`` staging directories."""
    for stale in Path(folder).glob(".*.partial"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


#: the result sets swapped into place by :func:`result_files` in this process (their summary paths)
completed_sets: list[Path] = []


@contextmanager
def result_files(files: dict[str, Path]):
    """Write one run's result ``files`` as a set. Yields ``staged``: a path for each key, in a hidden
    staging directory beside the files (same file names, so writers that go by the extension
    still work); the caller writes there and records ``files`` (the final paths) in its summary.
    When the block ends normally, the set is swapped into place with signals held off: every file
    of the set's names is removed first (``summary`` first, so a set without a summary reads as
    incomplete), then the staged files are renamed in, ``summary`` last. If writing fails or is
    interrupted, the staging directory is removed and the previous run's files are untouched."""
    files = {k: Path(v) for k, v in files.items()}
    folders = {p.parent for p in files.values()}
    if len(folders) != 1:
        raise ValueError(f"result_files: one directory per set, got {sorted(map(str, folders))}")
    folder = folders.pop()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=".npusim-results.", suffix=".partial", dir=folder))
    except OSError as exc:
        raise ConfigError(f"cannot write results in {folder} ({exc.strerror or exc})") from None
    try:
        yield {k: stage / p.name for k, p in files.items()}
        _swap_in(stage, files)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _swap_in(stage: Path, files: dict[str, Path]) -> None:
    """Replace the set ``files`` by what ``stage`` holds of it (see :func:`result_files`), with
    SIGINT and SIGTERM held until it is done (a few renames in one directory)."""
    order = sorted(files, key=lambda k: k != "summary")  # summary removed first ...
    mask = getattr(signal, "pthread_sigmask", None)  # POSIX; elsewhere the renames run unguarded
    old = mask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM}) if mask else None
    try:
        for key in order:
            files[key].unlink(missing_ok=True)
        for key in reversed(order):  # ... and renamed in last
            staged = stage / files[key].name
            if staged.exists():
                os.replace(staged, files[key])
        if "summary" in files and files["summary"].exists():
            completed_sets.append(files["summary"])
    finally:
        if mask:
            mask(signal.SIG_SETMASK, old)


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
