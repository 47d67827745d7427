"""A plain (non-editable) install works from any directory: build the wheel, install it
into a fresh virtual environment, and run ``npusim info`` and ``npusim run --forward``
from a directory outside the repository (issue 13, section 4)."""

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd, cwd, env=None, timeout=900):
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "--quiet", "-w", str(out)], cwd=out)
    (whl,) = out.glob("npusim-*.whl")
    return whl


@pytest.mark.slow  # the wheel build, ~7 s: with the install test below, which reuses the same wheel
def test_wheel_ships_presets_and_mapping_specs(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in ("arch", "mappers"):
        shipped = {n.rsplit("/", 1)[1] for n in names if n.startswith(f"npusim/data/{folder}/") and n.endswith(".yaml")}
        in_repo = {p.name for p in (ROOT / folder).glob("*.yaml")}
        assert shipped == in_repo and in_repo, folder


@pytest.mark.slow  # minutes: a cold JIT compile of the installed copy; CI runs it
def test_wheel_install_runs_outside_the_repository(wheel, tmp_path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    bindir = venv / ("Scripts" if os.name == "nt" else "bin")
    py = bindir / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=tmp_path).strip())
    # the dependencies come from this interpreter's environment (a plain path entry: its .pth
    # files, including an editable npusim's, are not processed), npusim from the wheel only
    (site / "_deps_from_test_env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # no PYTHONPATH anywhere below: a source checkout on it would satisfy or shadow the wheel
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "NPUSIM_CACHE_DIR")}
    env["NPUSIM_CACHE_DIR"] = str(tmp_path / "cache")
    _run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--quiet", str(wheel)],
         cwd=tmp_path, env=env)
    away = tmp_path / "elsewhere"
    away.mkdir()
    where = _run([str(py), "-c", "import npusim; print(npusim.__file__)"], cwd=away, env=env).strip()
    assert Path(where).is_relative_to(site), where
    npusim = str(bindir / "npusim")
    info = _run([npusim, "info", "ascend-910b"], cwd=away, env=env)
    assert "910" in info
    out = _run([npusim, "run", "--forward", "--out", str(away / "res")], cwd=away, env=env)
    assert (away / "res" / "summary.json").is_file(), out
    # mapping specs by name, and the presets list, come from the wheel's copies
    check = ("from npusim.mapping.spec import MAPPER_DIR, load_mapping; from npusim.arch import PRESET_DIR, list_presets; "
             "load_mapping('tp4-pipeline'); print(MAPPER_DIR); print(PRESET_DIR); print(list_presets())")
    mapper_dir, preset_dir, presets = _run([str(py), "-c", check], cwd=away, env=env).strip().splitlines()
    assert Path(mapper_dir).is_relative_to(site) and Path(preset_dir).is_relative_to(site)
    assert "ascend-910b" in presets and "npusim-64c" in presets
