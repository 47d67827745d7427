"""The layer order of docs/ARCHITECTURE.md (``npusim/layers.py``) holds: no module imports one of a
higher layer (module-level or inside a function), sweeps run without the CLI, and a run's model
config is resolved once, where its scenario is built (``npusim.scenarios.run``)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import npusim
from npusim.layers import layer_of

ROOT = Path(npusim.__file__).parent


def _imports(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, node.lineno


def test_no_module_imports_a_higher_layer():
    """Every sub-package has a rank or is shared (else its imports would go unchecked), and no import,
    at module level or inside a function, goes up a rank."""
    from npusim.layers import LAYERS, SHARED

    names = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
             if p.name not in ("__pycache__", "data", "__init__.py") and (p.is_dir() or p.suffix == ".py")}
    assert names <= set(LAYERS) | set(SHARED), names - set(LAYERS) - set(SHARED)
    up = []
    for f in sorted(ROOT.rglob("*.py")):
        mod = ".".join(f.relative_to(ROOT.parent).with_suffix("").parts).removesuffix(".__init__")
        mine = layer_of(mod)
        if mine is None:
            continue
        for name, line in _imports(f):
            theirs = layer_of(name)
            if theirs is not None and theirs > mine:
                up.append(f"{mod}:{line} imports {name}")
    assert not up, "imports up a layer:\n" + "\n".join(up)


def test_a_sweep_point_runs_without_the_cli(tmp_path):
    """A sweep loads, parses and runs its points by npusim run's options and run path without importing
    npusim.cli (a forward pass of a 1-layer model keeps it quick)."""
    sweep = tmp_path / "s.yaml"
    sweep.write_text("name: s\nbase:\n  model: qwen3-0.6b\n  workload: {phase: decode, batch: 2, seq: 64}\n"
                     "  run: {layers: 1, memory: analytical, fidelity: analytical}\ngrid:\n  workload.batch: [2]\n")
    code = (
        "import sys\n"
        "from npusim.sweep.spec import load_sweep\n"
        "from npusim.sweep.runner import run_point\n"
        f"rec = run_point(load_sweep({str(sweep)!r}).points[0])\n"
        "assert rec['status'] == 'ok', rec['error']\n"
        "print(sorted(m for m in sys.modules if m.startswith('npusim.cli')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]", out.stdout


@pytest.mark.slow  # an end-to-end serving run under a profile hook, ~4-5 s
def test_a_system_serving_run_resolves_its_model_config_once(capsys):
    """``npusim run --system`` with a request stream: the model name is turned into its config once
    (calls of ``get_config`` with a name, from outside the model package; before the scenario builder,
    five: the CLI twice, the serving loop once, each instance once)."""
    from npusim.cli import main

    names = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_name == "get_config" \
                and frame.f_globals.get("__name__") == "npusim.model.zoo":
            caller = frame.f_back.f_globals.get("__name__", "")
            if isinstance(frame.f_locals.get("model"), str) and not caller.startswith("npusim.model"):
                names.append(caller)

    sys.setprofile(prof)
    try:
        code = main(["run", "--system", "cloudmatrix384", "--nodes", "1", "--model", "qwen3-0.6b", "--tp", "2",
                     "--npus", "1", "--prefill-instances", "1", "--requests", "4", "--rate", "50", "--input-len", "64", "--output-len", "4",
                     "--json", "--no-progress"])
    finally:
        sys.setprofile(None)
    assert code == 0, capsys.readouterr().err
    assert len(names) == 1, names
