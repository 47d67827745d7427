"""Count the moves between npusim's modules that one ``npusim run`` makes, and those that go back up
a layer (the layer order of docs/ARCHITECTURE.md, ``npusim/layers.py``).

Traced with ``sys.setprofile``: every Python call whose caller and callee are npusim modules of
different names is a *move*; it goes *up* when the caller's layer ranks below the callee's (shared
modules -- arch, config, files, errors, choices ... -- have no rank and are never up). A call into a
function passed down as an argument (a progress callback) counts as the caller's module calling
the callee's, so callbacks show as up-moves and are listed with their names. Imports executed during
the run are recorded too (``builtins.__import__``), as are the calls of ``get_config`` with a model
name (the model config resolved; a call with a config already resolved is not counted), and the
functions of the chip's serving CLI (``cli/serve.py``) that the --system path calls. The layer table is read from this checkout's ``npusim/layers.py`` by path, so the
same script measures an older tree: ``PYTHONPATH=/work/wt-before python validation/perf/layer_moves.py``.

    python validation/perf/layer_moves.py [-- npusim run flags]   (default: the issue's run --system)
"""

from __future__ import annotations

import builtins
import collections
import importlib.util
import sys
from pathlib import Path

DEFAULT = ["run", "--system", "atlas-800i-a2", "--model", "llama-3-70b", "--tp", "8", "--requests", "20",
           "--rate", "2", "--json", "--no-progress"]


def _layers():
    spec = importlib.util.spec_from_file_location("_layers", Path(__file__).resolve().parents[2] / "npusim/layers.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.layer_of


def main(argv: list[str]) -> None:
    layer_of = _layers()
    argv = argv or DEFAULT
    calls = collections.Counter()  # (caller module, callee module, callee function) -> calls
    imports = collections.Counter()  # (importer, imported)
    configs = collections.Counter()  # get_config calls with a model name (a resolution), by caller module

    def prof(frame, event, arg):
        if event != "call":
            return
        callee = frame.f_globals.get("__name__", "")
        back = frame.f_back
        if back is None or not callee.startswith("npusim"):
            return
        caller = back.f_globals.get("__name__", "")
        if not caller.startswith("npusim"):
            return
        name = frame.f_code.co_name
        if name == "get_config" and callee == "npusim.model.zoo" and isinstance(frame.f_locals.get("model"), str):
            configs[caller] += 1
        if caller != callee:
            calls[(caller, callee, name)] += 1

    real_import = builtins.__import__

    def traced_import(name, globals=None, locals=None, fromlist=(), level=0):
        importer = (globals or {}).get("__name__", "")
        if level == 0 and importer.startswith("npusim") and name.startswith("npusim") and importer != name:
            imports[(importer, name)] += 1
        return real_import(name, globals, locals, fromlist, level)

    from npusim.cli import main as npusim_main

    builtins.__import__ = traced_import
    sys.setprofile(prof)
    try:
        code = npusim_main(argv)
    finally:
        sys.setprofile(None)
        builtins.__import__ = real_import
    sys.stdout.flush()

    def up(a, b):
        la, lb = layer_of(a), layer_of(b)
        return la is not None and lb is not None and la < lb

    edges = collections.Counter()
    for (a, b, _), n in calls.items():
        edges[(a, b)] += n
    up_edges = {e: n for e, n in edges.items() if up(*e)}
    up_imports = {e: n for e, n in imports.items() if up(*e)}
    print(f"\nnpusim {' '.join(argv)}  (exit {code})", file=sys.stderr)
    print(f"module-to-module moves (distinct caller->callee modules): {len(edges)}, up a layer: {len(up_edges)}",
          file=sys.stderr)
    print(f"calls across modules: {sum(edges.values()):,}, up a layer: {sum(up_edges.values()):,}", file=sys.stderr)
    print(f"imports executed between npusim modules: {len(imports)} distinct, up a layer: {len(up_imports)}",
          file=sys.stderr)
    print(f"model config resolved from its name (get_config(str)): {sum(configs.values())} "
          f"({', '.join(f'{m} {n}' for m, n in sorted(configs.items()))})", file=sys.stderr)
    borrowed = sorted({f for (a, b, f) in calls if a == "npusim.cli.run_system" and b == "npusim.cli.serve"})
    print(f"functions of the chip's serving CLI (cli.serve) the --system path calls: {len(borrowed)} "
          f"({', '.join(borrowed)})", file=sys.stderr)
    for (a, b), n in sorted(up_edges.items()):
        fns = sorted({f for (x, y, f) in calls if (x, y) == (a, b)})
        print(f"  up  {a} -> {b}: {n} calls ({', '.join(fns)})", file=sys.stderr)
    for (a, b), n in sorted(up_imports.items()):
        print(f"  up import  {a} -> {b}", file=sys.stderr)


if __name__ == "__main__":
    main([a for a in sys.argv[1:] if a != "--"])
