"""Shared test setup.

* **Numba cache.** Compiled kernels are cached in ``$TMPDIR/npusim-test-numba-cache`` (unless
  ``NUMBA_CACHE_DIR`` is set), so only the first run after a change to npusim's sources compiles.
* **Chip-cost cache.** Every test run gets one fresh chip-cost cache directory
  (``NPUSIM_CACHE_DIR``, set by the session fixture ``_session_chipcost_cache`` before any test and
  inherited by subprocesses and Dask workers), shared by the run's xdist workers (results are
  written atomically, and a hit is the result a miss would compute): tests share its results, so a
  GEMM shape is simulated once per run, not once per worker, and no test reads or writes the user's
  ``~/.cache/npusim``. Tests of the cache itself
  (``test_chipcost.py``) and of an installed wheel (``test_packaging.py``) set their own directory.
* **Hypothesis profiles.** ``dev`` (the default): at most ``DEV_MAX_EXAMPLES`` (20) examples per
  property and no deadline, for a quick local ``pytest -q``. ``ci``: Hypothesis's built-in CI
  profile (derandomised, no deadline, no example database) with every test's full example count;
  it is loaded when ``CI`` is set (``CI=true``, as ``.ci/run`` does; empty, ``0``, ``false`` or ``no``
  count as unset) or with
  ``HYPOTHESIS_PROFILE=ci`` (``HYPOTHESIS_PROFILE`` names any registered profile;
  ``pytest --hypothesis-profile=NAME`` works too). A test that needs more examples than the
  profile's default writes ``@settings(max_examples=examples(N))`` (``from hyp import examples``,
  ``tests/hyp.py``): N under ``ci``, capped at 20 under ``dev``.
* **Slow tests.** ``@pytest.mark.slow`` marks tests of many seconds to minutes (wheel install,
  Dask cluster, the full-system serving CLI); ``pyproject.toml`` deselects them by default, and
  ``pytest -q -m slow`` runs them.
* **Garbage collector.** Collection (each worker imports every test module) runs with the cyclic
  garbage collector off; after it, one full collection, then :func:`gc.freeze` moves every object
  alive (the imported modules, the collected tests) out of the collector's sight for the rest of
  the run, and the youngest generation's threshold is raised from 700 to ``GC_GEN0_THRESHOLD``
  allocations. Measured on the fast suite (two workers, ``gc.callbacks`` timing, session 49): the
  collector took 70 s of the run's CPU (80 full collections, 0.6 s each, most of them re-scanning
  import-time objects; 11 s during collection alone) and 23 s after the change. It changes when
  cycles are freed, never what a test computes.
* **Two processes.** ``pyproject.toml``'s ``addopts`` runs both on 2 pytest-xdist workers (``-n 2``;
  ``-n 0``: one process). Each worker has its own session fixtures (the chip-cost cache directory is
  the run's, shared); the Numba cache is shared (Numba writes a cache file whole, so two workers
  compiling one kernel is safe).
"""

import gc
import os
import tempfile

os.environ.setdefault("NUMBA_CACHE_DIR", os.path.join(tempfile.gettempdir(), "npusim-test-numba-cache"))

import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

from npusim.arch import load_arch  # noqa: E402

DEV_MAX_EXAMPLES = 20
GC_GEN0_THRESHOLD = 10_000  # allocations between young collections (CPython's default 700)

settings.register_profile("dev", max_examples=DEV_MAX_EXAMPLES, deadline=None)
settings.register_profile("ci", settings.get_profile("ci"))  # Hypothesis's own: full counts


def _profile() -> str:
    if os.environ.get("HYPOTHESIS_PROFILE"):
        return os.environ["HYPOTHESIS_PROFILE"]
    return "ci" if os.environ.get("CI", "").lower() not in ("", "0", "false", "no") else "dev"


settings.load_profile(_profile())


def pytest_sessionstart(session):
    """Say up front (``-q`` too) when this run must compile simulation kernels -- a fresh clone, or
    the first run after a change to npusim's compiled sources -- and that they are cached after."""
    from npusim._jitcache import will_compile
    from npusim.sim.kernel import kernel_for
    from npusim.system.kernel import system_loop

    kernels = [kernel_for(tlm, flit) for tlm in (False, True) for flit in (False, True)] + [system_loop]
    cold = sum(will_compile(k) for k in kernels)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if cold and reporter is not None:
        reporter.write_line(
            f"npusim: {cold} of {len(kernels)} simulation kernels (the chip loop at its analytical/TLM memory x "
            f"path/flit NoC variants, the system loop) are not in the Numba cache ({os.environ['NUMBA_CACHE_DIR']}): "
            "this run compiles them once, with the hardware models' other compiled functions -- the first "
            "`pytest -q` of a fresh clone takes several minutes longer than a warm one (see the README); "
            "later runs load them from the cache")


@pytest.hookimpl(wrapper=True)
def pytest_collection(session):
    """Collect with the garbage collector off, then freeze what collection left (module docstring)."""
    gc.disable()
    try:
        return (yield)
    finally:
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_GEN0_THRESHOLD, *gc.get_threshold()[1:])
        gc.enable()


@pytest.fixture(scope="session", autouse=True)
def _session_chipcost_cache(tmp_path_factory):
    """One chip-cost cache for the whole run, shared by its xdist workers (see the module docstring)."""
    mp = pytest.MonkeyPatch()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a worker's basetemp is <the run's basetemp>/<worker id>
        path = tmp_path_factory.getbasetemp().parent / "npusim-cache"
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("npusim-cache")
    mp.setenv("NPUSIM_CACHE_DIR", str(path))
    yield
    mp.undo()


@pytest.fixture(scope="session")
def arch64():
    return load_arch("npusim-64c")


@pytest.fixture(scope="session")
def small_arch(tmp_path_factory):
    """A 2x2 chip with one HBM channel per core and short, round DRAM timings (1 GHz, tCK 1 ns)."""
    path = tmp_path_factory.mktemp("arch") / "small.yaml"
    path.write_text(SMALL_ARCH_YAML)
    return load_arch(path)


SMALL_ARCH_YAML = """
name: small
clock_ghz: 1.0
cores:
  grid: {width: 2, height: 2}
  systolic_array: {rows: 8, cols: 8, weight_injection_cycles: 8}
  vector_unit: {lanes: 16}
  sram: {capacity_mb: 1}
  dma: {engines: 2, max_outstanding: 8, transaction_bytes: 64}
hbm:
  channels: 4
  capacity_gb: 1
  attach: per_core
  tck_ns: 1.0
  bus_width_bits: 64
  burst_length: 4
  banks: 8
  row_bytes: 1024
  interleave_bytes: 256
  frontend_latency_ns: 5
  timing: {tRCD: 14, tCL: 14, tRP: 14, tRAS: 33, tCCD: 2, tWL: 4, tWR: 16, tWTR: 8, tRTW: 4}
"""


@pytest.fixture
def cli(capsys):
    """Run ``npusim ARGV...`` in this process: (exit code, stdout, stderr)."""
    def run(*argv):
        from npusim.cli import main

        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        return code, out, err
    return run
