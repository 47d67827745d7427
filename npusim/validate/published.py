"""The published figures (``published.yaml``, shipped inside the package) and where the
validation's inputs live."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

PUBLISHED_FILE = Path(__file__).resolve().parent / "published.yaml"


@lru_cache(maxsize=1)
def published() -> dict:
    """Every published figure npusim is compared with, by section (see the file's header)."""
    return yaml.safe_load(PUBLISHED_FILE.read_text())


def study_figure(key: str) -> dict:
    """One NpuSim-study figure (``npusim_study.figures.<key>``) with the study's source."""
    sec = published()["npusim_study"]
    return {**sec["figures"][key], "source": f"{sec['source']}, {sec['figures'][key]['where']}"}
