"""npusim: a simulator of multi-core NPUs for LLM inference and serving.

Layers (each imports only from layers below it), see docs/ARCHITECTURE.md:
engine -> hw (compute, memory, noc) -> model -> mapping -> serving -> scaleup -> report/cli.
"""

__version__ = "0.1.0"
