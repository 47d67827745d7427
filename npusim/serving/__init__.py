"""Serving layer: request sources and trace files, serving metrics and the chip area model.

- :mod:`~npusim.serving.requests`: :class:`Request`, synthetic Poisson/gamma sources with length
  distributions and presets, and options on request lists (first n, time window, arrival scaling,
  length caps);
- :mod:`~npusim.serving.traces`: Mooncake JSONL and CSV trace files;
- :mod:`~npusim.serving.metrics`: per-request records, the run summary (TTFT, TBT, TPOT, E2E,
  throughput, goodput), time series, the HDF5 result file and latency plots;
- the 7 nm area model for throughput per mm² is :mod:`npusim.arch.area` (re-exported here).
"""

from npusim.arch.area import arch_area_mm2, chip_area_mm2, core_area_mm2, hbm_area_mm2, per_mm2
from npusim.serving.metrics import (RequestRecord, TimeSeries, latency_stats_ms, meets_slo, plot_latency_cdfs,
                                    plot_series, summarize, write_serving_hdf5)
from npusim.serving.requests import (BLOCK_TOKENS, PRESETS, Empirical, Fixed, LengthSpec, Lognormal, Preset, Request,
                                     Uniform, as_length, cap_lengths, offered_load, parse_length, renumber,
                                     scale_arrivals, synthetic_requests, take_first, time_window)
from npusim.serving.traces import load_trace, parse_csv, parse_mooncake, write_trace

__all__ = [
    "BLOCK_TOKENS", "PRESETS", "Empirical", "Fixed", "LengthSpec", "Lognormal", "Preset", "Request", "RequestRecord",
    "TimeSeries", "Uniform", "arch_area_mm2", "as_length", "cap_lengths", "chip_area_mm2", "core_area_mm2",
    "hbm_area_mm2", "latency_stats_ms", "load_trace", "meets_slo", "offered_load", "parse_csv", "parse_length",
    "parse_mooncake", "per_mm2", "plot_latency_cdfs", "plot_series", "renumber", "scale_arrivals", "summarize",
    "synthetic_requests", "take_first", "time_window", "write_serving_hdf5", "write_trace",
]
