"""Names for the Numba kernels in a Linux ``perf`` profile: where the compiled loop spends its time.

``cProfile`` (``profile_serving.py``) stops at the Numba kernel's edge, and ``perf`` shows the kernel's
code as bare addresses: Numba's JIT registers no symbols. This wrapper runs a script with the object code
of every kernel it loads kept aside (from the cache or a fresh compile) and, at its exit, writes
``/tmp/perf-<pid>.map`` (perf's map of JIT code: address, size, name) from those objects' symbol tables
(``readelf``); ``--report`` then sums a recorded profile by function, names shortened to
``module.function``. Functions LLVM inlined count in their caller.

Kernels not in the Numba cache compile inside the profiled process, and their compile shows as LLVM's
functions: run the script once before to leave them out. Use the normal build: ``NUMBA_ENABLE_PROFILING=1``
compiles slower code (session 54: ten Mooncake requests at the path flows took 249 s from such a cache
against 168 s from the normal one) and leaves that code in the cache for later runs.

    perf record -F 199 -o run.data python validation/perf/perf_map.py validation/perf/bench_serving.py \\
        --requests 3 --noc path --streams flow
    python validation/perf/perf_map.py --report run.data [--top 20]

Needs ``perf`` and ``readelf`` (binutils) on the PATH; says so if either is missing.
"""

from __future__ import annotations

import argparse
import atexit
import os
import re
import runpy
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict

_STASH: list = []  # (code library, its object code) of every kernel loaded since install()


def install() -> None:
    """Keep the object code of every Numba library loaded from now on (call before the kernels load)."""
    from numba.core import codegen

    lib_cls = codegen.CPUCodeLibrary
    if getattr(lib_cls, "_perf_map_installed", False):
        return
    set_object = lib_cls._set_compiled_object
    compiled_hook = lib_cls._object_compiled_hook.__func__

    def kept_set(self, value):  # loaded from the cache
        _STASH.append((self, value))
        return set_object(self, value)

    def kept_compiled(cls, ll_module, buf):  # compiled now
        lib = getattr(ll_module, "_CPUCodeLibrary__library", None)
        if lib is not None:
            _STASH.append((lib, buf))
        return compiled_hook(cls, ll_module, buf)

    lib_cls._set_compiled_object = kept_set
    lib_cls._object_compiled_hook = classmethod(kept_compiled)
    lib_cls._perf_map_installed = True


def _symbols(obj: bytes) -> list[tuple[int, int, int, str]]:
    """(section, offset in it, size, name) of the functions an object file defines."""
    with tempfile.NamedTemporaryFile(suffix=".o") as tf:
        tf.write(obj)
        tf.flush()
        out = subprocess.run(["readelf", "-sW", tf.name], capture_output=True, text=True).stdout
    rows = []
    for line in out.splitlines():  # Num: Value Size Type Bind Vis Ndx Name
        p = line.split()
        if len(p) == 8 and p[3] == "FUNC" and p[6].isdigit():
            rows.append((int(p[6]), int(p[1], 16), int(p[2], 0), p[7]))
    return rows


def write_map(pid: int | None = None) -> str:
    """Write ``/tmp/perf-<pid>.map`` for the kept kernels; returns its path. A library's functions are
    placed, section by section, by the address the JIT gives one function of that section."""
    pid = os.getpid() if pid is None else pid
    entries = {}
    for lib, obj in _STASH:
        if not obj:
            continue
        rows = _symbols(obj)
        base = {}  # per text section: where the JIT loaded it, from one function of it it can place
        for sec, off, _, name in rows:
            if sec not in base:
                try:
                    addr = lib.get_pointer_to_function(name)
                except Exception:  # noqa: BLE001 - a symbol the JIT does not export: try the next
                    addr = 0
                if addr:
                    base[sec] = addr - off
        for sec, off, size, name in rows:
            if sec in base:
                entries[base[sec] + off] = (size, name)
    path = f"/tmp/perf-{pid}.map"
    with open(path, "w") as fh:
        for addr in sorted(entries):
            size, name = entries[addr]
            fh.write(f"{addr:x} {size:x} {name}\n")
    print(f"perf_map: {len(entries)} functions of {len(_STASH)} kernel libraries -> {path}", file=sys.stderr)
    return path


def short_name(symbol: str) -> str:
    """``module.function`` from a Numba symbol (``_ZN6npusim2hw3noc7memflow14memflow_updateB4v101B...``:
    length-prefixed parts up to the first ``B`` tag); other names as they are."""
    s = symbol.removeprefix("cfunc.")
    m = re.match(r"_ZN(?:7cpython)?(\d.*)", s)
    if not m:
        return symbol
    parts, rest = [], m.group(1)
    while (n := re.match(r"\d+", rest)) is not None:
        k = len(n.group(0))
        parts.append(rest[k:k + int(n.group(0))])
        rest = rest[k + int(n.group(0)):]
    name = ".".join(p.replace("_3clocals_3e", "<locals>") for p in parts)
    return name or symbol


def report(data: str, top: int) -> None:
    """Sum ``perf report``'s per-symbol shares of ``data`` by function and print the ``top`` ones."""
    out = subprocess.run(["perf", "report", "-i", data, "--no-children", "--sort", "symbol", "--stdio"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"perf report -i {data} failed: {out.stderr.strip()[:300]}")
    share = defaultdict(float)
    for line in out.stdout.splitlines():
        m = re.match(r"\s*([\d.]+)%\s+\[[.k]\]\s+(.+?)(?:\s{2,}.*)?$", line)
        if m:
            share[short_name(m.group(2))] += float(m.group(1))
    print(f"{'share %':>8}  function")
    for name, s in sorted(share.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{s:8.2f}  {name}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--report":
        ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
        ap.add_argument("--report", metavar="PERF_DATA", required=True, help="a profile perf record wrote")
        ap.add_argument("--top", type=int, default=20, help="functions to print (default 20)")
        args = ap.parse_args()
        if shutil.which("perf") is None:
            raise SystemExit("perf_map: 'perf' is not on the PATH (Linux perf tools, e.g. the linux-perf package)")
        report(args.report, args.top)
        return
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if len(sys.argv) > 1 else 2)
    if shutil.which("readelf") is None:
        raise SystemExit("perf_map: 'readelf' is not on the PATH (binutils): it reads the kernels' symbol tables")
    script = sys.argv[1]
    if not os.path.isfile(script):
        raise SystemExit(f"perf_map: {script}: no such script")
    install()
    atexit.register(write_map)
    sys.argv = sys.argv[1:]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
