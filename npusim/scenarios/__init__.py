"""Whole-program workloads run on the simulator: one forward pass of a mapped model
(``forward.py``, behind ``npusim run`` without a request stream)."""
