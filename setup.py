"""Build hook: copy the top-level ``arch/`` presets and ``mappers/`` specs into the wheel
as ``npusim/data/arch`` and ``npusim/data/mappers`` (see ``npusim/resources.py``); all
other metadata is in ``pyproject.toml``."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
SHIPPED_FOLDERS = ("arch", "mappers")  # same as npusim.resources.SHIPPED_FOLDERS


class BuildPyWithPresets(build_py):
    def run(self):
        super().run()
        for folder in SHIPPED_FOLDERS:
            files = sorted((ROOT / folder).glob("*.yaml"))
            if not files:
                raise RuntimeError(f"{ROOT / folder}: no presets to ship (building outside the source tree?)")
            dest = Path(self.build_lib) / "npusim" / "data" / folder
            dest.mkdir(parents=True, exist_ok=True)
            for f in files:
                shutil.copy2(f, dest / f.name)


setup(cmdclass={"build_py": BuildPyWithPresets})
