"""Layer 1: the discrete-event engine (tasks, in-order resource queues, dependencies,
an event heap, integer time in cycles). Knows nothing about NPUs or LLMs."""

from npusim.engine.engine import Engine
from npusim.engine.tasks import DONE, KIND_FIXED, NPARAM, PENDING, RUNNING

__all__ = ["DONE", "Engine", "KIND_FIXED", "NPARAM", "PENDING", "RUNNING"]
