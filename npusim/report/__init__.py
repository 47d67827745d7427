"""Layer 7 (part): writing results — JSON summaries, HDF5 task tables, Perfetto timelines."""
