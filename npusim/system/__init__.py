"""The system level (scale-up): many NPUs on a switched fabric.

A *system* file (``arch/cloudmatrix384.yaml``, ``arch/atlas-800i-a2.yaml``) names chips (arch
presets) and a fabric graph; the fabric is simulated at flow or packet fidelity by the same
engine as the chip, and each die's work is costed by the chip simulator below through the
chip-cost interface (:mod:`npusim.system.chipcost`).
"""
