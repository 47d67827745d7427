"""Scale-up fabric models (links and switches between chips), driven by the system kernel.

:mod:`.state` holds the arrays, :mod:`.flow` the flow-level model (max-min fair link sharing),
:mod:`.packet` the packet-level model (packets reserving links hop by hop).
"""
