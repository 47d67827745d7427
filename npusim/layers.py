"""The package's layer order (docs/ARCHITECTURE.md): each layer imports only from layers below it.

``LAYERS`` ranks the sub-packages, lowest first; ``SHARED`` are used by every layer and have no
rank (``arch``, ``config``, ``files``, ``errors``, ``choices``, ``argtypes``, ...). ``layer_of``
gives a dotted module name's rank, or None for shared modules and anything outside npusim.
``tests/test_layering.py`` fails on an import that goes up; ``validation/perf/layer_moves.py``
counts the calls a run makes between modules and those that go up.
"""

from __future__ import annotations

#: rank of each sub-package (equal ranks: neither imports the other)
LAYERS = {"engine": 0, "hw": 1, "sim": 2, "comm": 3, "model": 3, "mapping": 4, "serving": 5, "report": 5,
          "pool": 5, "system": 6, "scenarios": 7, "sweep": 8, "validate": 9, "cli": 10}
SHARED = ("arch", "config", "files", "errors", "choices", "argtypes", "resources", "layers", "gcpolicy",
          "_jitcache", "__main__")


def layer_of(module: str) -> int | None:
    """The rank of ``module`` (``npusim.system.serving`` -> 6), None when shared or not npusim's."""
    parts = module.split(".")
    if parts[0] != "npusim" or len(parts) < 2:
        return None
    return LAYERS.get(parts[1])
