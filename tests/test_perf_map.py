"""``validation/perf/perf_map.py``: the kernels' names for a ``perf`` profile."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "validation" / "perf" / "perf_map.py"


def _module():
    spec = importlib.util.spec_from_file_location("perf_map_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_numba_symbols_shorten_to_module_and_function():
    short = _module().short_name
    assert short("_ZN6npusim2hw3noc7memflow14memflow_updateB4v101B54c8tJTC_2fWwGaMLSgd6CjA4xE") == \
        "npusim.hw.noc.memflow.memflow_update"
    assert short("_ZN7cpython6npusim3sim6kernel6_build12_3clocals_3e8run_loopB2v9B54c8tJTCE") == \
        "npusim.sim.kernel._build.<locals>.run_loop"
    assert short("_PyEval_EvalFrameDefault") == "_PyEval_EvalFrameDefault"


@pytest.mark.skipif(shutil.which("readelf") is None, reason="readelf (binutils) reads the kernels' symbol tables")
def test_a_kernel_compiled_under_the_wrapper_is_named_at_its_address(tmp_path):
    """A script run by the wrapper compiles a kernel; at its exit the map names that kernel at the address
    the JIT gave it, with the size its object's symbol table gives."""
    script = tmp_path / "kernel_script.py"
    script.write_text(
        "import os\n"
        "from numba import njit\n"
        "@njit(cache=False)\n"
        "def perf_map_probe(n):\n"
        "    s = 0\n"
        "    for i in range(n):\n"
        "        s += i * i\n"
        "    return s\n"
        "assert perf_map_probe(10) == 285\n"
        "lib = perf_map_probe.overloads[perf_map_probe.signatures[0]].library\n"
        "name = perf_map_probe.overloads[perf_map_probe.signatures[0]].fndesc.llvm_func_name\n"
        "print(os.getpid(), hex(lib.get_pointer_to_function(name)))\n")
    out = subprocess.run([sys.executable, str(SCRIPT), str(script)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    pid, addr = out.stdout.split()
    lines = Path(f"/tmp/perf-{pid}.map").read_text().splitlines()
    Path(f"/tmp/perf-{pid}.map").unlink()
    named = [ln.split() for ln in lines
             if "perf_map_probe" in ln and not ln.split()[2].startswith(("cfunc", "_ZN7cpython"))]
    assert named, lines[:5]
    start, size, _ = named[0]
    assert int(start, 16) == int(addr, 16) and int(size, 16) > 0
    assert "perf_map:" in out.stderr
