"""Keep Numba's on-disk cache honest while the source is being edited.

Numba's ``cache=True`` stamps a cached function with a hash of *its own* source
file only, not of the files whose ``@njit`` functions it calls and compiles in:
editing ``npusim/hw/memory/hbm.py`` would silently leave the cached kernel loop
(``npusim/sim/kernel.py``) running the old memory model. We register cache
locators that, for npusim's files, add a digest of every npusim module that uses
Numba (and of every module of ``hw/`` and ``engine/``, whose constants compiled code captures)
to the stamp, so any such edit recompiles all of them once.

That uses Numba's private ``numba.core.caching.CacheImpl._locator_classes``. A Numba
release may change it, so :func:`install` first builds the wrapped locators and probes
them on a function of this file; if anything is missing or raises, it leaves Numba's
locators untouched and instead points Numba's cache at a directory named by the same
digest (``numba.config.CACHE_DIR``, the documented ``NUMBA_CACHE_DIR`` setting): every
source change then starts from an empty cache -- a cold compile, never a crash and
never stale code.
"""

from __future__ import annotations

import hashlib
import os
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
    """Stamp npusim's cached kernels with the sources digest (see the module docstring)."""
    digest = _numba_sources_digest()
    try:
        installed = _install_locators(digest)
    except Exception:  # a Numba whose private caching API differs: degrade, never crash
        installed = False
    if not installed:
        _digest_cache_dir(digest)


def _digest_cache_dir(digest: str) -> None:
    """Fallback: a cache directory per sources digest, so no stale kernel is ever loaded."""
    import numba

    base = numba.config.CACHE_DIR or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "npusim", "numba")
    numba.config.CACHE_DIR = os.path.join(base, f"npusim-{digest}")


def _probe() -> int:  # a function of this file: the wrapped locators must handle it
    return 1


def _install_locators(digest: str) -> bool:
    """Wrap Numba's cache locators; False (nothing changed) if the private API is not as
    expected or the wrapped locators fail on a probe function."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    classes = getattr(impl, "_locator_classes", None)
    if impl is None or not isinstance(classes, list) or not classes:
        return False
    if any(getattr(c, "_npusim", False) for c in classes):
        return True
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

    wrapped = [wrap(b) for b in classes]
    located = None
    for cls in wrapped:
        located = cls.from_function(_probe, __file__)
        if located is not None:
            break
    if located is None or located.get_source_stamp()[0] != digest:
        return False
    impl._locator_classes = wrapped + list(classes)
    return True


def will_compile(dispatcher) -> bool:
    """Whether calling ``dispatcher`` (a ``cache=True`` ``@njit`` function) will compile it: nothing
    compiled for it in this process, and no entry for it in its on-disk cache for the current sources
    (whose stamp :func:`install` set). A closure's entries are told apart by its constants, as Numba's
    cache key does (the chip kernel's fidelity variants share one index file). False when unsure, or
    for anything but a dispatcher: it reads Numba's private cache index, and a Numba whose API
    differs only loses the notice this answers for."""
    try:
        if dispatcher.overloads:
            return False
        cache = dispatcher._cache
        index = cache._cache_file._load_index()
        if dispatcher.py_func.__closure__ is None:
            return not index
        ours = cache._index_key(None, _NoCodegen())[2]  # (bytecode hash, closure constants hash)
        return not any(key[2] == ours for key in index)
    except Exception:
        return False


class _NoCodegen:
    """Stands in for a codegen in ``Cache._index_key``: only the key's hashes are compared."""

    def magic_tuple(self):
        return None


#: called with a kernel's name when it is about to compile (:func:`set_compile_notice`)
_notice = None
#: the dispatchers already announced in this process
_announced: set = set()


def set_compile_notice(callback) -> None:
    """Have ``callback(name)`` called when a simulation kernel is about to be compiled (the command
    line prints a line on stderr, before the wait); ``None``: say nothing (the default, for library
    use)."""
    global _notice
    _notice = callback


def announce_compile(dispatcher, name: str) -> None:
    """Tell the compile-notice callback, if one is set, that ``dispatcher`` (``name``) is about to be
    compiled; once per dispatcher and process."""
    if _notice is not None and dispatcher not in _announced and will_compile(dispatcher):
        _announced.add(dispatcher)
        _notice(name)


install()  # on first import, before any module of npusim that uses Numba decorates a function
