"""Sweeps: many ``npusim run`` points from one file, their results in one table, and plots.

- :mod:`~npusim.sweep.spec`: the sweep file's schema and its expansion into points;
- :mod:`~npusim.sweep.runner`: running points on a process pool or a Dask cluster, resumably;
- :mod:`~npusim.sweep.table`: the HDF5 results table (one row per point);
- :mod:`~npusim.sweep.report`: line plots, heatmaps, the Pareto front and an HTML page.

The sweep layer sits above ``npusim run``'s run paths (``npusim.scenarios.run.run_summary``, its options
``npusim.scenarios.options``) and below the CLI: it imports them, nothing below imports it.
"""
