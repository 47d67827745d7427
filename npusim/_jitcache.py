"""Keep Numba's on-disk cache honest while the source is being edited.

Numba's ``cache=True`` stamps a cached function with a hash of *its own* source
file only, not of the files whose ``@njit`` functions it calls and compiles in:
editing ``npusim/hw/memory/hbm.py`` would silently leave the cached kernel loop
(``npusim/sim/kernel.py``) running the old memory model. We register cache
locators that, for npusim's files, add a digest of every npusim module that uses
Numba (and of every module of ``hw/`` and ``engine/``, whose constants compiled code captures)
to the stamp, so any such edit recompiles all of them once.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def _numba_sources_digest() -> str:
    digest = hashlib.blake2b(digest_size=16)
    for path in sorted(_PACKAGE.rglob("*.py")):
        data = path.read_bytes()
        # modules using Numba, and the hardware models' and engine's plain-Python modules whose
        # constants and array layouts the compiled functions capture (e.g. hw/fabric/state.py)
        rel = path.relative_to(_PACKAGE).parts
        if b"numba" in data or rel[0] in ("hw", "engine"):
            digest.update(path.relative_to(_PACKAGE).as_posix().encode())
            digest.update(data)
    return digest.hexdigest()


def install() -> None:
    try:
        from numba.core import caching
    except ImportError:  # pragma: no cover - numba is a hard dependency
        return
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    if impl is None or not hasattr(impl, "_locator_classes"):
        return
    if any(getattr(c, "_npusim", False) for c in impl._locator_classes):
        return
    digest = _numba_sources_digest()
    package = str(_PACKAGE)

    def wrap(base):
        def get_source_stamp(self):
            return (digest, base.get_source_stamp(self))

        def from_function(cls, py_func, py_file):
            if not str(Path(py_file).resolve()).startswith(package):
                return None
            return base.from_function.__func__(cls, py_func, py_file)

        return type(f"Npusim{base.__name__}", (base,), {
            "_npusim": True,
            "get_source_stamp": get_source_stamp,
            "from_function": classmethod(from_function),
        })

    impl._locator_classes = [wrap(b) for b in impl._locator_classes] + list(impl._locator_classes)
