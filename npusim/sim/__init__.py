"""The simulation kernel: the engine driving the hardware models (compute timing is
precomputed into tasks; memory and, later, NoC models react to events)."""

from npusim.sim.kernel import KIND_DMA, KIND_NOC
from npusim.sim.simulator import RunOutcome, Simulator

__all__ = ["KIND_DMA", "KIND_NOC", "RunOutcome", "Simulator"]
