"""The Numba cache guard: with Numba's private caching API as expected the locators are
wrapped; if a Numba upgrade changes it, install() degrades to a per-digest cache
directory (a cold compile), never a crash or stale code."""

import numba
from numba.core import caching

from npusim import _jitcache


def test_locators_installed_with_this_numba():
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl")
    assert any(getattr(c, "_npusim", False) for c in impl._locator_classes)


def test_changed_private_api_degrades_to_a_digest_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))

    class Broken:  # a CacheImpl whose locators no longer take (py_func, py_file)
        class Locator:
            @classmethod
            def from_function(cls):
                raise TypeError("new signature")
        _locator_classes = [Locator]

    monkeypatch.setattr(caching, "CacheImpl", Broken, raising=False)
    _jitcache.install()
    assert numba.config.CACHE_DIR == str(tmp_path / f"npusim-{_jitcache._numba_sources_digest()}")
    monkeypatch.delattr(caching, "CacheImpl", raising=False)
    monkeypatch.setattr(caching, "_CacheImpl", None, raising=False)
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    _jitcache.install()  # no caching API at all: same fallback
    assert numba.config.CACHE_DIR.startswith(str(tmp_path / "npusim-"))
