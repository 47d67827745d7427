"""Start-up and compile structure (issue 25): what a command imports and what a run compiles.

No wall-clock assertions: these check the causes of a slow start (a heavy import for ``--help``, a
model compiled into a kernel that cannot use it), not times."""

from __future__ import annotations

import subprocess
import sys

import pytest

from npusim.sim import kernel

HEAVY = ("numpy", "numba", "networkx", "h5py", "pydantic", "scipy", "yaml")


@pytest.mark.parametrize("argv", [["--help"], ["run", "--help"], ["fabric", "--help"]])
def test_help_imports_no_simulator(argv):
    code = ("import sys\nfrom npusim.cli import main\nmain(%r)\n"
            "print(','.join(m for m in %r if m in sys.modules))" % (argv, HEAVY))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "", f"npusim {' '.join(argv)} imported {out.splitlines()[-1]}"


def test_chip_run_imports_no_graph_library():
    """A run on a chip's mesh builds its topology as arrays: networkx (~80 ms to import) stays out."""
    code = ("import sys\nfrom npusim.cli import main\n"
            "main(['run', '--forward', '--layers', '1', '--no-progress', '--json'])\n"
            "print('networkx' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "False"


def _models_called(tlm: bool, flit: bool) -> set[str]:
    """Names of the model functions the (tlm, flit) loop still calls once Numba has pruned the
    branches its constants rule out: what typing would compile (Numba's untyped front end only)."""
    from numba.core import ir, types
    from numba.core.analysis import dead_branch_prune
    from numba.core.compiler import run_frontend

    func = kernel._build(tlm, flit).py_func
    fir = run_frontend(func)
    dead_branch_prune(fir, (types.unknown,) * func.__code__.co_argcount)
    return {getattr(stmt.value.value, "__name__", "") for block in fir.blocks.values() for stmt in block.body
            if isinstance(stmt, ir.Assign) and isinstance(stmt.value, (ir.Global, ir.FreeVar))}


@pytest.mark.parametrize("tlm", [False, True])
@pytest.mark.parametrize("flit", [False, True])
def test_kernel_compiles_only_its_fidelity(tlm, flit):
    called = _models_called(tlm, flit)
    assert {"path_start", "path_handle", "mem_start"} <= called  # path/analytical NoC, memory streams: always
    for name in ("hbm_handle", "hbm_start_dma", "sram_task_cycles"):
        assert (name in called) == tlm, name
    assert ("analytical_finish" in called) == (not tlm)
    for name in ("flit_tick", "flit_start"):
        assert (name in called) == flit, name


def test_simulator_picks_the_variant_of_its_fidelity():
    from npusim.arch import load_arch
    from npusim.sim import Simulator

    arch = load_arch("npusim-64c")
    for memory, noc, key in (("analytical", "path", (False, False)), ("tlm", "analytical", (True, False)),
                             ("analytical", "flit", (False, True)), ("tlm", "flit", (True, True))):
        sim = Simulator(arch, memory_mode=memory, noc_mode=noc)
        assert sim._run_loop is kernel.kernel_for(*key)


def test_compile_notice_only_when_asked(monkeypatch):
    from npusim import _jitcache

    said = []
    monkeypatch.setattr(_jitcache, "_announced", set())
    monkeypatch.setattr(_jitcache, "will_compile", lambda d: True)
    _jitcache.set_compile_notice(None)
    _jitcache.announce_compile(kernel.kernel_for(False, False), "k")
    assert said == []
    try:
        _jitcache.set_compile_notice(said.append)
        _jitcache.announce_compile(kernel.kernel_for(False, False), "k")
        _jitcache.announce_compile(kernel.kernel_for(False, False), "k")  # once per kernel and process
    finally:
        _jitcache.set_compile_notice(None)
    assert said == ["k"]
