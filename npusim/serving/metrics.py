"""Serving metrics: per-request records, the summary (TTFT, TBT, TPOT, E2E, throughput, goodput),
time series of per-core state, the HDF5 result file and latency plots.

Times are seconds (``_s``) in records and series, milliseconds (``_ms``) in the summary's latency
statistics. Definitions (one request):

- TTFT = time of the first output token − arrival (the prefill produces the first token);
- TBT = every gap between consecutive output tokens (``output_len − 1`` gaps);
- TPOT = (finish − first token) / (output_len − 1), None for a single-token request;
- E2E = finish − arrival; queueing = first time the request was scheduled − arrival.

Latency statistics, throughput and prefix hits cover *completed* requests only (finished and not
rejected); rejected requests are counted with their reasons, unfinished ones (e.g. cut off by a
time limit) are counted as ``requests_unfinished``.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from npusim.errors import ConfigError
from npusim.files import write_with

PLOT_HINT = "install the plot extra: pip install -e '.[plot]'"


@dataclass
class RequestRecord:
    """What happened to one request (filled in by the scheduler as it runs).

    Attributes:
        id, arrival_s, input_len, output_len: as in :class:`~npusim.serving.requests.Request`.
        first_scheduled_s: when its prefill first ran (s), None if never scheduled.
        token_times_s: time each output token was produced (s); the first is the TTFT point.
        finish_s: when it completed (s; normally the last token's time), None if not finished.
        rejected_reason: why it was refused (e.g. ``"input longer than the KV capacity"``),
            None if it was accepted.
        prefix_hit_tokens: prompt tokens whose KV cache was reused instead of computed.
    """

    id: int
    arrival_s: float
    input_len: int
    output_len: int
    first_scheduled_s: float | None = None
    token_times_s: list[float] = field(default_factory=list)
    finish_s: float | None = None
    rejected_reason: str | None = None
    prefix_hit_tokens: int = 0

    @classmethod
    def from_request(cls, req) -> RequestRecord:
        """A fresh record for a :class:`~npusim.serving.requests.Request`."""
        return cls(req.id, req.arrival_s, req.input_len, req.output_len)

    @property
    def completed(self) -> bool:
        return self.rejected_reason is None and self.finish_s is not None

    @property
    def first_token_s(self) -> float | None:
        return self.token_times_s[0] if self.token_times_s else None

    @property
    def ttft_s(self) -> float | None:
        return None if not self.token_times_s else self.token_times_s[0] - self.arrival_s

    @property
    def tbt_s(self) -> list[float]:
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def max_tbt_s(self) -> float | None:
        gaps = self.tbt_s
        return max(gaps) if gaps else None

    @property
    def tpot_s(self) -> float | None:
        if self.finish_s is None or not self.token_times_s or self.output_len < 2:
            return None
        return (self.finish_s - self.token_times_s[0]) / (self.output_len - 1)

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def queueing_s(self) -> float | None:
        return None if self.first_scheduled_s is None else self.first_scheduled_s - self.arrival_s

    def problems(self) -> list[str]:
        """Inconsistencies that mean the simulator recorded this request wrongly (empty if none)."""
        out = []
        who = f"request {self.id}"
        t = self.token_times_s
        if self.rejected_reason is not None:
            if not isinstance(self.rejected_reason, str) or not self.rejected_reason:
                out.append(f"{who}: rejected_reason must be a non-empty string")
            return out
        if any(b < a for a, b in zip(t, t[1:])):
            out.append(f"{who}: token times go backwards")
        if t and t[0] < self.arrival_s:
            out.append(f"{who}: first token at {t[0]} s before arrival at {self.arrival_s} s")
        if self.first_scheduled_s is not None and self.first_scheduled_s < self.arrival_s:
            out.append(f"{who}: scheduled at {self.first_scheduled_s} s before arrival at {self.arrival_s} s")
        if self.first_scheduled_s is not None and t and t[0] < self.first_scheduled_s:
            out.append(f"{who}: first token before it was first scheduled")
        if not 0 <= self.prefix_hit_tokens <= self.input_len:
            out.append(f"{who}: prefix_hit_tokens {self.prefix_hit_tokens} outside 0..{self.input_len}")
        if len(t) > self.output_len:
            out.append(f"{who}: {len(t)} tokens produced, more than output_len {self.output_len}")
        if self.finish_s is not None:
            if len(t) != self.output_len:
                out.append(f"{who}: finished with {len(t)} of {self.output_len} tokens")
            if t and self.finish_s < t[-1]:
                out.append(f"{who}: finish {self.finish_s} s before its last token {t[-1]} s")
        return out


def latency_stats_ms(values_s: Sequence[float]) -> dict:
    """``{"mean", "median", "std", "p50", "p90", "p99", "max", "count"}`` in milliseconds of values
    in seconds (``median`` is ``p50``, under the name ``vllm bench serve`` gives it; ``std`` the
    population standard deviation, numpy's default, as vLLM's).

    Percentiles interpolate linearly between order statistics (numpy's default). With no values,
    every statistic is None and count is 0.
    """
    if len(values_s) == 0:
        return {"mean": None, "median": None, "std": None, "p50": None, "p90": None, "p99": None, "max": None,
                "count": 0}
    ms = np.asarray(values_s, dtype=np.float64) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return {"mean": float(ms.mean()), "median": float(p50), "std": float(ms.std()), "p50": float(p50),
            "p90": float(p90), "p99": float(p99), "max": float(ms.max()), "count": int(ms.size)}


def meets_slo(record: RequestRecord, slo_ttft_s: float | None, slo_tbt_s: float | None,
              slo_tpot_s: float | None = None) -> bool:
    """A completed request meets the SLOs when its TTFT <= ``slo_ttft_s``, its *largest* TBT
    gap <= ``slo_tbt_s`` (every gap, not a percentile) and its TPOT (its mean gap) <=
    ``slo_tpot_s``; a None SLO is not checked and a single-token request has no gaps. Rejected
    or unfinished requests never meet them."""
    if not record.completed:
        return False
    if slo_ttft_s is not None and (record.ttft_s is None or record.ttft_s > slo_ttft_s):
        return False
    if slo_tpot_s is not None and record.tpot_s is not None and record.tpot_s > slo_tpot_s:
        return False
    worst = record.max_tbt_s
    return slo_tbt_s is None or worst is None or worst <= slo_tbt_s


def _rate(amount: float, duration_s: float | None) -> float | None:
    return amount / duration_s if duration_s else None


def summarize(records: Iterable[RequestRecord], duration_s: float | None = None,
              slo_ttft_s: float | None = None, slo_tbt_s: float | None = None,
              slo_tpot_s: float | None = None) -> dict:
    """Summary of a serving run (a JSON-ready dict).

    Rates divide by ``duration_s`` when given, else by the makespan: last finish of a completed
    request − first arrival of any request (None when nothing completed or the span is zero).

    Keys: ``requests_total``, ``requests_completed``, ``requests_rejected``, ``rejected_reasons``
    (reason -> count), ``requests_unfinished``, ``duration_s``, ``input_tokens`` and
    ``output_tokens`` (completed requests), ``throughput_tokens_per_s`` (output tokens / duration),
    ``throughput_total_tokens_per_s`` ((input + output) / duration), ``requests_per_s``;
    ``ttft_ms``, ``tbt_ms`` (every gap of every completed request), ``tpot_ms``, ``e2e_ms``,
    ``queueing_ms`` as :func:`latency_stats_ms` dicts; ``prefix_hit_tokens`` and
    ``prefix_hit_rate`` (hit tokens / input tokens); ``slo_ttft_ms``, ``slo_tbt_ms`` (and
    ``slo_tpot_ms`` when a TPOT objective is given),
    ``slo_met_requests``, ``slo_attainment`` (met / all requests, rejected and unfinished count as
    misses), ``goodput_requests_per_s`` and ``goodput_tokens_per_s`` (output tokens of requests
    meeting the SLOs) — the SLO keys are None when neither SLO is given (see :func:`meets_slo`).

    The same under ``vllm bench serve``'s names (:mod:`npusim.serving.client`): ``itl_ms`` (every
    gap, as ``tbt_ms``), ``e2el_ms`` (as ``e2e_ms``), ``request_throughput``, ``output_throughput``,
    ``total_token_throughput``, ``request_goodput`` (as ``goodput_requests_per_s``); and
    ``mean_concurrency`` = the sum of completed requests' E2E / duration, the mean number in flight
    over the duration when every request completed (Little's law: request_throughput x mean E2E).

    Raises ValueError when a record is inconsistent (:meth:`RequestRecord.problems`): that is a
    simulator bug, not a user error.
    """
    records = list(records)
    problems = [p for r in records for p in r.problems()]
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ValueError("inconsistent request records: " + "; ".join(problems[:5]) + more)
    done = [r for r in records if r.completed]
    rejected = [r for r in records if r.rejected_reason is not None]
    if duration_s is None and done:
        span = max(r.finish_s for r in done) - min(r.arrival_s for r in records)
        duration_s = span if span > 0 else None
    input_tokens = sum(r.input_len for r in done)
    output_tokens = sum(r.output_len for r in done)
    hits = sum(r.prefix_hit_tokens for r in done)
    summary = {
        "requests_total": len(records),
        "requests_completed": len(done),
        "requests_rejected": len(rejected),
        "rejected_reasons": dict(sorted(Counter(r.rejected_reason for r in rejected).items())),
        "requests_unfinished": len(records) - len(done) - len(rejected),
        "duration_s": duration_s,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "throughput_tokens_per_s": _rate(output_tokens, duration_s),
        "throughput_total_tokens_per_s": _rate(input_tokens + output_tokens, duration_s),
        "requests_per_s": _rate(len(done), duration_s),
        "ttft_ms": latency_stats_ms([r.ttft_s for r in done]),
        "tbt_ms": latency_stats_ms([g for r in done for g in r.tbt_s]),
        "tpot_ms": latency_stats_ms([r.tpot_s for r in done if r.tpot_s is not None]),
        "e2e_ms": latency_stats_ms([r.e2e_s for r in done]),
        "queueing_ms": latency_stats_ms([r.queueing_s for r in done if r.queueing_s is not None]),
        "prefix_hit_tokens": hits,
        "prefix_hit_rate": hits / input_tokens if input_tokens else None,
    }
    summary.update(_slo_summary(records, duration_s, slo_ttft_s, slo_tbt_s, slo_tpot_s))
    summary.update({
        "itl_ms": summary["tbt_ms"], "e2el_ms": summary["e2e_ms"],
        "request_throughput": summary["requests_per_s"], "output_throughput": summary["throughput_tokens_per_s"],
        "total_token_throughput": summary["throughput_total_tokens_per_s"],
        "request_goodput": summary["goodput_requests_per_s"],
        "mean_concurrency": _rate(sum(r.e2e_s for r in done), duration_s),
    })
    return summary


def _slo_summary(records: list[RequestRecord], duration_s: float | None, slo_ttft_s: float | None,
                 slo_tbt_s: float | None, slo_tpot_s: float | None = None) -> dict:
    keys = ("slo_ttft_ms", "slo_tbt_ms", "slo_met_requests", "slo_attainment", "goodput_requests_per_s",
            "goodput_tokens_per_s")
    if slo_ttft_s is None and slo_tbt_s is None and slo_tpot_s is None:
        return dict.fromkeys(keys)
    met = [r for r in records if meets_slo(r, slo_ttft_s, slo_tbt_s, slo_tpot_s)]
    return {
        "slo_ttft_ms": None if slo_ttft_s is None else slo_ttft_s * 1e3,
        "slo_tbt_ms": None if slo_tbt_s is None else slo_tbt_s * 1e3,
        **({"slo_tpot_ms": slo_tpot_s * 1e3} if slo_tpot_s is not None else {}),
        "slo_met_requests": len(met),
        "slo_attainment": len(met) / len(records) if records else None,
        "goodput_requests_per_s": _rate(len(met), duration_s),
        "goodput_tokens_per_s": _rate(sum(r.output_len for r in met), duration_s),
    }


# ----------------------------------------------------------------------------- time series


class TimeSeries:
    """Samples ``(t, v_0, ..., v_{k-1})`` of ``k`` named quantities over time, e.g. per-core
    utilisation (columns ``core0..core63``, unit ``"fraction"``) or SRAM / HBM occupancy
    (``"bytes"``). Times are seconds and must not decrease."""

    def __init__(self, columns: Sequence[str], unit: str = ""):
        if not columns:
            raise ValueError("a TimeSeries needs at least one column")
        self.columns = [str(c) for c in columns]
        self.unit = unit
        self._t: list[float] = []
        self._rows: list[np.ndarray] = []

    def record(self, t: float, *values) -> None:
        """Add one sample: ``record(t, v0, v1, ...)`` or ``record(t, sequence_of_values)``."""
        row = np.asarray(values[0] if len(values) == 1 and np.ndim(values[0]) == 1 else values, dtype=np.float64)
        if row.shape != (len(self.columns),):
            raise ValueError(f"sample at t={t} has {row.size} values, expected {len(self.columns)} "
                             f"({', '.join(self.columns[:4])}{', ...' if len(self.columns) > 4 else ''})")
        if self._t and t < self._t[-1]:
            raise ValueError(f"sample at t={t} s is earlier than the previous one at {self._t[-1]} s")
        self._t.append(float(t))
        self._rows.append(row)

    def __len__(self) -> int:
        return len(self._t)

    def to_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(t, values)``: shapes ``[n]`` and ``[n, k]``, float64."""
        t = np.asarray(self._t, dtype=np.float64)
        values = np.vstack(self._rows) if self._rows else np.empty((0, len(self.columns)))
        return t, values

    def time_average(self) -> np.ndarray:
        """Per-column average over ``[t_0, t_last]``, each sample holding until the next one
        (step interpolation); the plain mean when all samples share one time. Shape ``[k]``."""
        t, values = self.to_arrays()
        if len(t) == 0:
            return np.full(len(self.columns), np.nan)
        widths = np.diff(t)
        if widths.sum() <= 0:
            return values.mean(axis=0)
        return (values[:-1] * widths[:, None]).sum(axis=0) / widths.sum()


# ----------------------------------------------------------------------------- HDF5


def _nan(value: float | None) -> float:
    return math.nan if value is None else float(value)


def request_columns(records: Sequence[RequestRecord]) -> dict[str, np.ndarray]:
    """Per-request columns as written to ``/requests`` (None -> NaN; ``rejected_reason`` "" when
    accepted). Token times are ragged: ``token_times_s`` is every record's list concatenated and
    request ``i``'s slice is ``token_offsets[i]:token_offsets[i + 1]``."""
    lengths = [len(r.token_times_s) for r in records]
    cols = {
        "id": np.array([r.id for r in records], dtype=np.int64),
        "arrival_s": np.array([r.arrival_s for r in records], dtype=np.float64),
        "input_len": np.array([r.input_len for r in records], dtype=np.int64),
        "output_len": np.array([r.output_len for r in records], dtype=np.int64),
        "prefix_hit_tokens": np.array([r.prefix_hit_tokens for r in records], dtype=np.int64),
        "completed": np.array([r.completed for r in records], dtype=bool),
        "rejected_reason": np.array([r.rejected_reason or "" for r in records], dtype=object),
        "token_offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        "token_times_s": np.array([t for r in records for t in r.token_times_s], dtype=np.float64),
    }
    for name in ("first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s", "e2e_s", "queueing_s"):
        cols[name] = np.array([_nan(getattr(r, name)) for r in records], dtype=np.float64)
    return cols


def iteration_columns(iterations: Sequence[Mapping]) -> dict[str, np.ndarray]:
    """Columns from per-iteration dicts that all have the same keys. Values are numbers, bools,
    strings or None (-> NaN), or equal-length sequences (-> a 2-D column)."""
    if not iterations:
        return {}
    keys = list(iterations[0])
    for i, it in enumerate(iterations):
        if set(it) != set(keys):
            diff = sorted(set(it) ^ set(keys))
            raise ValueError(f"iteration {i} has different keys from iteration 0: {diff}")
    cols = {}
    for key in keys:
        values = [it[key] for it in iterations]
        if all(isinstance(v, str) for v in values):
            cols[key] = np.array(values, dtype=object)
        elif all(v is None or isinstance(v, (int, float, np.integer, np.floating)) for v in values):
            if any(v is None for v in values):
                values = [_nan(v) for v in values]
            cols[key] = np.asarray(values)
        else:
            try:
                cols[key] = np.asarray(values, dtype=np.float64)
            except (TypeError, ValueError):
                raise ValueError(f"iteration column {key!r}: values must be numbers, strings or "
                                 "equal-length sequences of numbers") from None
    return cols


def _attr_value(value):
    if isinstance(value, (str, bool, int, float, np.integer, np.floating)):
        return value
    return json.dumps(value, default=str)


def write_serving_hdf5(path: str | Path, records: Sequence[RequestRecord], iterations: Sequence[Mapping] = (),
                       series: Mapping[str, TimeSeries] | None = None, attrs: Mapping | None = None) -> Path:
    """Write a serving run to HDF5 atomically (the file appears complete or not at all).

    Layout: ``/requests/<column>`` (see :func:`request_columns`), ``/iterations/<key>`` (see
    :func:`iteration_columns`), ``/series/<name>/t`` ``[n]`` and ``/series/<name>/values``
    ``[n, k]`` with attributes ``columns`` and ``unit``; root attributes from ``attrs``
    (non-scalar values stored as JSON strings).
    """
    import h5py  # a core dependency; imported here to keep `import npusim.serving` light

    strings = h5py.string_dtype()

    def put(group, name: str, arr: np.ndarray) -> None:
        if arr.dtype == object:
            group.create_dataset(name, data=arr.astype(str).astype(object), dtype=strings)
        else:
            group.create_dataset(name, data=arr)

    def writer(tmp: Path) -> None:
        with h5py.File(tmp, "w") as f:
            req = f.create_group("requests")
            for name, arr in request_columns(list(records)).items():
                put(req, name, arr)
            it = f.create_group("iterations")
            for name, arr in iteration_columns(list(iterations)).items():
                put(it, name, arr)
            ser = f.create_group("series")
            for name, ts in (series or {}).items():
                g = ser.create_group(name)
                t, values = ts.to_arrays()
                g.create_dataset("t", data=t)
                g.create_dataset("values", data=values)
                g.attrs["columns"] = json.dumps(ts.columns)
                g.attrs["unit"] = ts.unit
            for key, value in (attrs or {}).items():
                f.attrs[key] = _attr_value(value)

    return write_with(path, writer)


# ----------------------------------------------------------------------------- plots


def _figure(nrows: int, ncols: int, width_in: float, height_in: float):
    """A matplotlib Figure with its axes, without touching pyplot's global state."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError(f"plots need matplotlib, which is not installed: {PLOT_HINT}") from None
    fig = Figure(figsize=(width_in, height_in), layout="constrained")
    return fig, fig.subplots(nrows, ncols, squeeze=False)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    return write_with(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=120))


def plot_latency_cdfs(records: Iterable[RequestRecord], path: str | Path) -> Path:
    """Empirical CDFs of TTFT, TBT (every gap) and E2E latency (ms) of the completed requests,
    written to ``path`` (format from the extension, PNG by default). Needs matplotlib."""
    done = [r for r in records if r.completed]
    fig, axes = _figure(1, 3, 12, 3.6)
    panels = (("TTFT", [r.ttft_s for r in done]), ("TBT", [g for r in done for g in r.tbt_s]),
              ("E2E", [r.e2e_s for r in done]))
    for ax, (name, values_s) in zip(axes[0], panels):
        ms = np.sort(np.asarray(values_s, dtype=np.float64)) * 1e3
        if ms.size:
            ax.step(ms, np.arange(1, ms.size + 1) / ms.size, where="post")
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of " + ("gaps" if name == "TBT" else "requests"))
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    fig.suptitle(f"latency CDFs, {len(done)} completed requests")
    return _save(fig, path)


def plot_series(series: Mapping[str, TimeSeries], path: str | Path, max_lines: int = 8) -> Path:
    """One panel per time series against time (s), titled with its name and unit. Up to
    ``max_lines`` columns are drawn as separate lines; per-core series (columns
    ``core<i>.<class>``) as a heatmap of each core's busiest class over time; other wide
    series as the mean across columns with a min–max band. Needs matplotlib."""
    if not series:
        raise ValueError("plot_series needs at least one series")
    fig, axes = _figure(len(series), 1, 9, 2.8 * len(series))
    for ax, (name, ts) in zip(axes[:, 0], series.items()):
        t, values = ts.to_arrays()
        per_core = _per_core(ts.columns)
        if per_core and len(t):
            cores, classes = per_core
            busiest = values.reshape(len(t), cores, classes).max(axis=2)
            edges = np.concatenate([[t[0] - (t[1] - t[0] if len(t) > 1 else 1e-3)], t])
            mesh = ax.pcolormesh(edges, np.arange(cores + 1), busiest.T, vmin=0, vmax=1, shading="flat")
            fig.colorbar(mesh, ax=ax, label="busiest unit's busy fraction")
            ax.set_ylabel("core")
        elif values.shape[1] <= max_lines:
            for j, column in enumerate(ts.columns):
                ax.step(t, values[:, j], where="post", label=column)
            ax.legend(fontsize="small", loc="upper right")
        elif len(t):
            ax.fill_between(t, values.min(axis=1), values.max(axis=1), step="post", alpha=0.3, label="min–max")
            ax.step(t, values.mean(axis=1), where="post", label=f"mean of {values.shape[1]}")
            ax.legend(fontsize="small", loc="upper right")
        ax.set_title(f"{name}" + (f" ({ts.unit})" if ts.unit else ""), fontsize="medium")
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("time (s)")
    return _save(fig, path)


def _per_core(columns: Sequence[str]) -> tuple[int, int] | None:
    """``(cores, classes)`` if the columns are ``core<i>.<class>`` for every core and class."""
    if not columns or not all(c.startswith("core") and "." in c for c in columns):
        return None
    classes = len({c.split(".", 1)[1] for c in columns})
    cores = len(columns) // classes
    expected = [f"core{i}.{c.split('.', 1)[1]}" for i in range(cores) for c in columns[:classes]]
    return (cores, classes) if list(columns) == expected else None
