"""Keep Numba's on-disk cache honest while the source is being edited.

Numba's ``cache=True`` checks only the timestamp of the file that defines a
function, not of the files whose ``@njit`` functions it calls; editing
``npusim/hw/memory/hbm.py`` would silently leave the cached kernel loop (in
``npusim/sim/kernel.py``) running the old memory model. At import we hash every
npusim source file; when the hash differs from the one recorded last time, we
touch all of them so Numba recompiles everything once.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _stamp_file() -> Path:
    root = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(tempfile.gettempdir(), "npusim-numba")
    return Path(root) / f"npusim-source-{hashlib.blake2b(str(_PACKAGE).encode(), digest_size=8).hexdigest()}.hash"


def refresh_if_source_changed() -> None:
    sources = sorted(_PACKAGE.rglob("*.py"))
    digest = hashlib.blake2b(digest_size=16)
    for path in sources:
        digest.update(path.read_bytes())
    current = digest.hexdigest()
    stamp = _stamp_file()
    try:
        if stamp.is_file() and stamp.read_text() == current:
            return
        for path in sources:
            os.utime(path)
        stamp.parent.mkdir(parents=True, exist_ok=True)
        stamp.write_text(current)
    except OSError:
        pass  # read-only install or cache dir: nothing can be stale there either
