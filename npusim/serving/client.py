"""A benchmark client like ``vllm bench serve``: its random dataset, its arrival process, its
concurrency limit (a closed loop) and the rows of a concurrency sweep.

What a run of ``npusim run --dataset random --input-len I --output-len O --num-prompts N
--max-concurrency C [--request-rate R --burstiness B]`` means, rule by rule as vLLM's
``benchmarks/serve.py`` and ``benchmarks/datasets.py`` state them (no tokenizer here, so no special
tokens are subtracted from ``I``):

* **random dataset** (:func:`random_lengths`): each prompt's length is drawn uniformly from the
  integers ``floor(I*(1-R)) .. ceil(I*(1+R))`` (``--range-ratio R`` in ``[0, 1)``, default 0: every
  prompt is ``I`` tokens), each output's from ``max(1, floor(O*(1-R))) .. ceil(O*(1+R))``; the
  input and output draws use independent seeded streams.
* **arrivals** (:func:`send_times`): the client plans request ``i``'s send at ``t_i``: all at 0
  for ``--request-rate inf`` (the default); else the first at 0 and the gaps i.i.d. gamma with
  shape ``B`` and mean ``1/R`` s (``B = 1``: Poisson), or exactly ``1/R`` s for ``B = inf``
  (constant spacing).
* **concurrency limit** (:class:`ClosedLoop`): at most ``C`` requests are in flight (sent and not
  finished); request ``i`` is sent at ``max(t_i, the time a slot frees)``, in order. With
  ``--request-rate inf`` that is a closed loop: ``C`` requests at 0, and a new one the moment one
  completes. A request's latencies (TTFT, E2E) count from its *send*, as vLLM's do (its timer starts
  after the semaphore). A rejected request frees its slot when it is rejected.

The metrics (:func:`bench_row`, and :func:`npusim.serving.metrics.summarize`) are vLLM's: TTFT per
request; TPOT = (E2E - TTFT) / (output - 1) per request with more than one output token; ITL =
every gap between consecutive tokens of every request; each with mean, median, p99 (and std);
``request_throughput`` = completed requests / duration, ``output_throughput`` = their output
tokens / duration, ``total_token_throughput`` = their input + output tokens / duration, duration =
first send to last completion (seconds); ``request_goodput`` = requests within every SLO given
(``--slo-ttft-ms``, ``--slo-tpot-ms``, ``--slo-tbt-ms``) / duration.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace

import numpy as np

from npusim.errors import ConfigError
from npusim.serving.requests import Fixed, Request, Uniform

DATASETS = ("random", "sharegpt-like", "mooncake-like")
#: the workload presets (npusim.serving.requests.PRESETS) the named datasets draw their lengths from
DATASET_PRESETS = {"sharegpt-like": "decode-dominated", "mooncake-like": "prefill-dominated"}


def random_lengths(mean: int, range_ratio: float, what: str) -> Fixed | Uniform:
    """vLLM's RandomDataset length rule: uniform integers ``floor(L*(1-R)) .. ceil(L*(1+R))``
    (at least 1), or fixed ``L`` when ``R = 0``. ``what`` names the flag in errors."""
    if not 0.0 <= range_ratio < 1.0:
        raise ConfigError(f"--range-ratio {range_ratio:g}: expected a number in [0, 1)")
    if mean < 1:
        raise ConfigError(f"{what} {mean}: expected a positive number of tokens")
    lo = max(1, math.floor(mean * (1 - range_ratio)))
    hi = max(1, math.ceil(mean * (1 + range_ratio)))
    return Fixed(mean) if lo == hi else Uniform(lo, hi)


def send_times(n: int, rate_per_s: float, burstiness: float, seed: int) -> np.ndarray:
    """``n`` planned send times (s): all 0 for ``rate_per_s = inf``; else the first at 0 and gaps of
    mean ``1/rate_per_s``: gamma with shape ``burstiness`` (1: exponential, Poisson arrivals), or
    constant for ``burstiness = inf``. Seeded by ``seed`` (a stream apart from the lengths')."""
    if not rate_per_s > 0:
        raise ConfigError(f"--request-rate {rate_per_s}: expected a positive number of requests per second or inf")
    if not burstiness > 0:
        raise ConfigError(f"--burstiness {burstiness}: expected a positive number (1: Poisson) or inf (constant)")
    if math.isinf(rate_per_s) or n == 0:
        return np.zeros(n)
    mean_gap = 1.0 / rate_per_s
    if math.isinf(burstiness):
        gaps = np.full(n - 1, mean_gap)
    else:
        rng = np.random.default_rng(np.random.SeedSequence([int(seed), 0xC11E]))
        gaps = rng.gamma(burstiness, mean_gap / burstiness, size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


class ClosedLoop:
    """The client's concurrency limit, as a source of requests for a serving loop.

    ``requests`` carry their planned send times (``arrival_s``); at most ``concurrency`` of them are
    in flight. :meth:`initial` gives the first ``concurrency`` (sent at their planned times: each
    has a free slot); :meth:`on_finish` is called once per request that completes or is rejected, at
    that time ``t_s`` (seconds), and gives the next request with ``arrival_s = max(planned, t_s)``
    (or nothing when all were sent). Calls must come in time order; the requests it gives then come
    in non-decreasing ``arrival_s``, so a loop may append them to its sorted arrivals.
    ``in_flight`` and ``peak`` count sent-and-unfinished requests."""

    def __init__(self, requests, concurrency: int):
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise ConfigError(f"--max-concurrency {concurrency}: expected a positive number of requests")
        self.pending = deque(sorted(requests, key=lambda r: (r.arrival_s, r.id)))
        self.concurrency = concurrency
        self.total = len(self.pending)
        self.in_flight = 0
        self.peak = 0
        self._last_t = 0.0

    def _send(self, at_s: float) -> Request:
        req = self.pending.popleft()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return req if req.arrival_s >= at_s else replace(req, arrival_s=at_s)

    def initial(self) -> list[Request]:
        return [self._send(0.0) for _ in range(min(self.concurrency, len(self.pending)))]

    def on_finish(self, t_s: float) -> list[Request]:
        if self.in_flight < 1:
            raise AssertionError("ClosedLoop.on_finish: more requests finished than were sent")
        if t_s < self._last_t:
            raise AssertionError(f"ClosedLoop.on_finish: time went back from {self._last_t} to {t_s}")
        self._last_t = t_s
        self.in_flight -= 1
        return [self._send(t_s)] if self.pending else []


def parse_concurrencies(text: str) -> list[int]:
    """``--sweep-concurrency 1,16,32``: positive integers, in the order given (duplicates refused)."""
    try:
        values = [int(x) for x in str(text).split(",")]
    except ValueError:
        raise ConfigError(f"--sweep-concurrency '{text}': expected positive integers separated by commas, "
                          "e.g. 1,16,32,64") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise ConfigError(f"--sweep-concurrency '{text}': expected distinct positive integers, e.g. 1,16,32,64")
    return values


#: a sweep row's metrics, as the summary names them
ROW_KEYS = ("requests_completed", "duration_s", "request_throughput", "output_throughput", "total_token_throughput",
            "request_goodput", "ttft_ms", "tpot_ms", "itl_ms", "e2el_ms", "mean_concurrency")


def bench_row(summary: dict, max_concurrency: int | None) -> dict:
    """One row of a concurrency sweep: ``max_concurrency`` and the summary's benchmark metrics."""
    return {"max_concurrency": max_concurrency, **{k: summary.get(k) for k in ROW_KEYS}}


def _ms(stats: dict | None, key: str) -> str:
    v = (stats or {}).get(key)
    return "-" if v is None else f"{v:,.1f}"


def sweep_table(rows: list[dict]) -> str:
    """The rows as a benchmark table (one line per concurrency), text."""
    head = (f"{'concurrency':>11} {'req/s':>8} {'out tok/s':>10} {'TTFT mean':>10} {'median':>8} {'p99':>8} "
            f"{'TPOT mean':>10} {'median':>8} {'p99':>8} {'ITL mean':>9}")
    lines = [head, "-" * len(head)]
    for r in rows:
        rq, out = r.get("request_throughput"), r.get("output_throughput")
        lines.append(f"{r['max_concurrency']:>11} {'-' if rq is None else f'{rq:,.2f}':>8} "
                     f"{'-' if out is None else f'{out:,.1f}':>10} "
                     f"{_ms(r['ttft_ms'], 'mean'):>10} {_ms(r['ttft_ms'], 'median'):>8} {_ms(r['ttft_ms'], 'p99'):>8} "
                     f"{_ms(r['tpot_ms'], 'mean'):>10} {_ms(r['tpot_ms'], 'median'):>8} {_ms(r['tpot_ms'], 'p99'):>8} "
                     f"{_ms(r['itl_ms'], 'mean'):>9}")
    return "\n".join(lines) + "\n  (latencies in ms; TTFT/TPOT/ITL as vllm bench serve defines them)"
