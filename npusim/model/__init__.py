"""Layer 3: models as operator graphs — built-in builders from published configs and an
ONNX importer."""

from npusim.model.builder import build_graph
from npusim.model.ir import KINDS, Graph, Op

__all__ = ["KINDS", "Graph", "Op", "build_graph"]
