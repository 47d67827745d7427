"""Requests: what work arrives, when, and how long it is.

A :class:`Request` is one inference call: it arrives at ``arrival_s`` (seconds from the start
of the workload), brings ``input_len`` prompt tokens and will generate ``output_len`` tokens.
``hash_ids`` optionally names its prompt's 512-token prefix blocks with Mooncake semantics: one id
per block of :data:`BLOCK_TOKENS` prompt tokens (the last block may be partial), and equal ids at the
same position mean equal token content, so the KV cache of those blocks can be reused.

Sources are synthetic (:func:`synthetic_requests`, Poisson or gamma arrivals, lengths from a
:data:`LengthSpec`) or trace files (:mod:`npusim.serving.traces`). The options
(:func:`take_first`, :func:`time_window`, :func:`scale_arrivals`, :func:`cap_lengths`) apply to
any request list.

Conventions every function here keeps:

- Returned lists are sorted by ``(arrival_s, id)``.
- Ids are kept unchanged except where a function says it renumbers: :func:`synthetic_requests`
  numbers its requests 0..n-1 in arrival order and :func:`renumber` does so on demand. Trace
  loaders keep each request's position in the file as its id so it can be traced back to its line.
- Bad arguments raise :class:`~npusim.errors.ConfigError` saying what was expected.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Union

import numpy as np

from npusim.errors import ConfigError

BLOCK_TOKENS = 512
"""Prompt tokens per prefix-hash block (Mooncake's ``hash_ids`` granularity)."""


def _as_int(value, what: str, minimum: int) -> int:
    """``value`` as a Python int >= ``minimum`` (numpy ints accepted; bools and floats are not)."""
    if isinstance(value, bool):
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {value!r}") from None
    if number < minimum:
        raise ConfigError(f"{what} must be an integer >= {minimum}, got {number}")
    return number


def _as_float(value, what: str, minimum: float = 0.0) -> float:
    """``value`` as a finite float >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ConfigError(f"{what} must be a number >= {minimum}, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < minimum:
        raise ConfigError(f"{what} must be a finite number >= {minimum}, got {value!r}")
    return number


def blocks_for(tokens: int) -> int:
    """Number of :data:`BLOCK_TOKENS`-token prefix blocks that hold ``tokens`` tokens (ceil)."""
    return -(-tokens // BLOCK_TOKENS)


@dataclass(frozen=True)
class Request:
    """One inference request.

    Attributes:
        id: unique non-negative integer.
        arrival_s: arrival time in seconds from the start of the workload (>= 0).
        input_len: prompt tokens (>= 1).
        output_len: tokens to generate (>= 1; the first comes out of the prefill).
        hash_ids: prefix-block hashes, empty or exactly ``ceil(input_len / 512)`` of them
            (Mooncake semantics, see the module docstring).
    """

    id: int
    arrival_s: float
    input_len: int
    output_len: int
    hash_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        rid = _as_int(self.id, "request id", 0)
        who = f"request {rid}"
        object.__setattr__(self, "id", rid)
        object.__setattr__(self, "arrival_s", _as_float(self.arrival_s, f"{who}: arrival_s"))
        object.__setattr__(self, "input_len", _as_int(self.input_len, f"{who}: input_len", 1))
        object.__setattr__(self, "output_len", _as_int(self.output_len, f"{who}: output_len", 1))
        hashes = tuple(_as_int(h, f"{who}: hash_ids entries", 0) for h in self.hash_ids)
        if hashes and len(hashes) != blocks_for(self.input_len):
            raise ConfigError(f"{who}: hash_ids has {len(hashes)} entries but input_len {self.input_len} "
                              f"needs {blocks_for(self.input_len)} (one per {BLOCK_TOKENS}-token block)")
        object.__setattr__(self, "hash_ids", hashes)


def _sorted(reqs: Iterable[Request]) -> list[Request]:
    return sorted(reqs, key=lambda r: (r.arrival_s, r.id))


# ----------------------------------------------------------------------------- length specs


@dataclass(frozen=True)
class Fixed:
    """Every request has ``value`` tokens."""

    value: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "value", _as_int(self.value, "fixed length", 1))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.value, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Integer lengths drawn uniformly from ``lo..hi`` inclusive."""

    lo: int
    hi: int

    def __post_init__(self) -> None:
        lo = _as_int(self.lo, "uniform length low bound", 1)
        hi = _as_int(self.hi, "uniform length high bound", 1)
        if hi < lo:
            raise ConfigError(f"uniform length range {lo}:{hi}: the high bound must be >= the low bound")
        object.__setattr__(self, "lo", lo)
        object.__setattr__(self, "hi", hi)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.lo, self.hi, size=n, endpoint=True, dtype=np.int64)


@dataclass(frozen=True)
class Lognormal:
    """Log-normal lengths with the given ``mean`` (tokens, of the distribution itself, not of its
    log) and log-space standard deviation ``sigma``; rounded to integers and clipped to
    ``[min, max]`` (``max=None``: no upper bound). Clipping moves the realised mean slightly below
    ``mean`` when ``max`` cuts the tail."""

    mean: float
    sigma: float
    max: int | None = None
    min: int = 1

    def __post_init__(self) -> None:
        mean = _as_float(self.mean, "lognormal mean")
        if mean < 1:
            raise ConfigError(f"lognormal mean must be >= 1 token, got {self.mean!r}")
        object.__setattr__(self, "mean", mean)
        object.__setattr__(self, "sigma", _as_float(self.sigma, "lognormal sigma"))
        object.__setattr__(self, "min", _as_int(self.min, "lognormal min", 1))
        if self.max is not None:
            object.__setattr__(self, "max", _as_int(self.max, "lognormal max", self.min))

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        mu = math.log(self.mean) - self.sigma**2 / 2  # E[X] = exp(mu + sigma^2/2) = mean
        x = np.rint(rng.lognormal(mu, self.sigma, size=n))
        return np.clip(x, self.min, self.max if self.max is not None else np.inf).astype(np.int64)


@dataclass(frozen=True)
class Empirical:
    """Lengths drawn uniformly with replacement from ``values`` (e.g. the input lengths of a
    trace: ``Empirical(tuple(r.input_len for r in load_trace(path)))``)."""

    values: tuple[int, ...]

    def __post_init__(self) -> None:
        values = tuple(_as_int(v, "empirical length", 1) for v in self.values)
        if not values:
            raise ConfigError("an empirical length distribution needs at least one value")
        object.__setattr__(self, "values", values)

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.choice(np.asarray(self.values, dtype=np.int64), size=n, replace=True)


Length = Union[Fixed, Uniform, Lognormal, Empirical]
LengthSpec = Union[int, tuple[int, int], dict, Length]
"""A token-length specification: an ``int`` (fixed), a ``(lo, hi)`` tuple (uniform, inclusive), a
:class:`Fixed`/:class:`Uniform`/:class:`Lognormal`/:class:`Empirical`, or a dict as written in a
config file: ``{"dist": "lognormal", "mean": 2048, "sigma": 1.0, "max": 16384}`` or
``{"dist": "empirical", "values": [...]}`` (also ``"fixed"``/``value`` and ``"uniform"``/``lo``,``hi``)."""

_DISTS = {"fixed": Fixed, "uniform": Uniform, "lognormal": Lognormal, "empirical": Empirical}


def as_length(spec: LengthSpec, what: str = "length") -> Length:
    """Turn any :data:`LengthSpec` into a distribution object with ``sample(rng, n)``."""
    if isinstance(spec, (Fixed, Uniform, Lognormal, Empirical)):
        return spec
    if isinstance(spec, tuple) and len(spec) == 2:
        return Uniform(*spec)
    if isinstance(spec, dict):
        fields = dict(spec)
        kind = fields.pop("dist", None)
        if kind not in _DISTS:
            raise ConfigError(f"{what}: 'dist' must be one of {sorted(_DISTS)}, got {kind!r}")
        if kind == "empirical" and "values" in fields:
            fields["values"] = tuple(fields["values"])
        try:
            return _DISTS[kind](**fields)
        except TypeError as exc:
            raise ConfigError(f"{what}: bad fields for a {kind} distribution: {exc}") from None
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return Fixed(int(spec))
    raise ConfigError(f"{what}: expected an int, a (lo, hi) tuple, a distribution or a dict with 'dist', "
                      f"got {spec!r}")


def parse_length(text: str) -> Length:
    """Parse a command-line length flag.

    ``"128"`` -> fixed 128; ``"64:512"`` -> uniform 64..512 inclusive;
    ``"lognormal:MEAN:SIGMA"`` or ``"lognormal:MEAN:SIGMA:MAX"`` -> :class:`Lognormal`.
    """
    expected = "expected N, LO:HI or lognormal:MEAN:SIGMA[:MAX] (token counts)"
    parts = [p.strip() for p in str(text).split(":")]
    try:
        if parts[0] == "lognormal" and len(parts) in (3, 4):
            max_len = int(parts[3]) if len(parts) == 4 else None
            return Lognormal(float(parts[1]), float(parts[2]), max=max_len)
        if len(parts) == 1:
            return Fixed(int(parts[0]))
        if len(parts) == 2:
            return Uniform(int(parts[0]), int(parts[1]))
    except ValueError:
        pass
    except ConfigError as exc:
        raise ConfigError(f"length {text!r}: {exc}") from None
    raise ConfigError(f"length {text!r}: {expected}")


# ----------------------------------------------------------------------------- presets


@dataclass(frozen=True)
class Preset:
    """A named workload shape: input and output length distributions plus where they come from."""

    input_len: Length
    output_len: Length
    description: str


PRESETS: dict[str, Preset] = {
    "prefill-dominated": Preset(
        input_len=Lognormal(mean=2048, sigma=1.2, max=16384),
        output_len=Lognormal(mean=205, sigma=1.36, max=2048),
        description=(
            "Mooncake-like long prompts and short outputs, input:output mean ratio ~10:1 (the NpuSim "
            "study's prefill-heavy P:D = 10:1, arXiv 2510.05632). The log-space spreads (1.2 input, "
            "1.36 output) are those of the Mooncake conversation trace (kvcache-ai/Mooncake "
            "FAST25-release, 12,031 requests); its means (12,035 in / 343 out) are scaled down and "
            "capped (16K in, 2K out) so single-chip runs stay tractable. Realised means after "
            "clipping: ~1,950 in / ~190 out."),
    ),
    "decode-dominated": Preset(
        input_len=Lognormal(mean=128, sigma=1.0, max=2048),
        output_len=Lognormal(mean=640, sigma=1.0, max=4096),
        description=(
            "ShareGPT-like short prompts and long generated replies, input:output mean ratio 1:5 "
            "(the NpuSim study's decode-heavy P:D = 1:5, arXiv 2510.05632). The log-space spread "
            "1.0 is an estimate, not fitted to ShareGPT. Realised means after clipping: ~127 in / "
            "~620 out."),
    ),
}
"""Built-in workload shapes for :func:`synthetic_requests` (``preset=NAME``)."""


# ----------------------------------------------------------------------------- synthetic source


def arrival_times(n: int, rate_per_s: float, arrival: str, cv: float, rng: np.random.Generator,
                  start_s: float = 0.0) -> np.ndarray:
    """``n`` arrival times in seconds: ``start_s`` plus the cumulative sum of i.i.d. gaps.

    ``"poisson"``: exponential gaps with mean ``1/rate_per_s``. ``"gamma"``: gamma gaps with the
    same mean and coefficient of variation ``cv`` (shape ``1/cv**2``; cv=1 is Poisson, cv>1
    bursty, cv<1 regular). The first request arrives one gap after ``start_s``.
    ``rate_per_s = inf`` puts every arrival at ``start_s`` (an offline batch).
    """
    if math.isinf(rate_per_s):
        return np.full(n, start_s, dtype=np.float64)
    mean_gap = 1.0 / rate_per_s
    if arrival == "poisson":
        gaps = rng.exponential(mean_gap, size=n)
    else:
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, mean_gap / shape, size=n)
    return start_s + np.cumsum(gaps)


def synthetic_requests(n: int, rate_per_s: float, arrival: str = "poisson", cv: float = 1.0,
                       input_len: LengthSpec | None = None, output_len: LengthSpec | None = None,
                       seed: int = 0, start_s: float = 0.0, preset: str | None = None) -> list[Request]:
    """``n`` synthetic requests, ids 0..n-1 in arrival order.

    Args:
        n: number of requests (>= 0).
        rate_per_s: mean arrival rate, requests per second (> 0; ``math.inf`` = all at ``start_s``).
        arrival: ``"poisson"`` or ``"gamma"`` (see :func:`arrival_times`).
        cv: coefficient of variation of the gamma inter-arrival gaps (> 0; only for ``"gamma"``).
        input_len, output_len: token lengths (:data:`LengthSpec`); each defaults to the preset's.
        seed: the same seed gives identical requests; arrivals, input lengths and output lengths
            draw from independent streams, so changing one length spec leaves the other draws alone.
        start_s: time origin of the arrivals (seconds, >= 0).
        preset: a :data:`PRESETS` name supplying the lengths not given explicitly.
    """
    n = _as_int(n, "n (number of requests)", 0)
    if (isinstance(rate_per_s, bool) or not isinstance(rate_per_s, (int, float, np.integer, np.floating))
            or not rate_per_s > 0):
        raise ConfigError(f"rate_per_s must be a positive number of requests per second, got {rate_per_s!r}")
    if arrival not in ("poisson", "gamma"):
        raise ConfigError(f"arrival must be 'poisson' or 'gamma', got {arrival!r}")
    cv = _as_float(cv, "cv (gamma coefficient of variation)")
    if cv <= 0:
        raise ConfigError(f"cv (gamma coefficient of variation) must be > 0, got {cv}")
    if arrival == "poisson" and cv != 1.0:
        raise ConfigError(f"cv={cv} applies only to arrival='gamma' (Poisson arrivals have cv 1)")
    start_s = _as_float(start_s, "start_s")
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"unknown workload preset {preset!r}; known: {sorted(PRESETS)}")
        input_len = PRESETS[preset].input_len if input_len is None else input_len
        output_len = PRESETS[preset].output_len if output_len is None else output_len
    if input_len is None or output_len is None:
        raise ConfigError("synthetic_requests needs input_len and output_len, or a preset "
                          f"({', '.join(sorted(PRESETS))})")
    in_spec = as_length(input_len, "input_len")
    out_spec = as_length(output_len, "output_len")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")

    arrival_rng, in_rng, out_rng = (np.random.default_rng(s) for s in np.random.SeedSequence(int(seed)).spawn(3))
    times = arrival_times(n, float(rate_per_s), arrival, cv, arrival_rng, start_s)
    ins = in_spec.sample(in_rng, n)
    outs = out_spec.sample(out_rng, n)
    return [Request(i, float(times[i]), int(ins[i]), int(outs[i])) for i in range(n)]


# ----------------------------------------------------------------------------- options


def take_first(reqs: Iterable[Request], n: int) -> list[Request]:
    """The ``n`` earliest requests (by arrival, then id); ids unchanged."""
    n = _as_int(n, "first (number of requests)", 0)
    return _sorted(reqs)[:n]


def time_window(reqs: Iterable[Request], start_s: float, end_s: float | None = None) -> list[Request]:
    """Requests arriving in ``[start_s, end_s)`` with arrivals re-based so ``start_s`` becomes 0;
    ``end_s=None`` means no end. Ids unchanged."""
    start_s = _as_float(start_s, "window start (s)")
    end = math.inf if end_s is None else _as_float(end_s, "window end (s)")
    if end <= start_s:
        raise ConfigError(f"time window [{start_s}, {end_s}) is empty: the end must be after the start")
    return [replace(r, arrival_s=r.arrival_s - start_s) for r in _sorted(reqs) if start_s <= r.arrival_s < end]


def scale_arrivals(reqs: Iterable[Request], factor: float) -> list[Request]:
    """Multiply every arrival time by ``factor`` (> 0): 0.5 doubles the request rate, 2 halves it.
    Ids unchanged."""
    factor = _as_float(factor, "arrival scale factor")
    if factor <= 0:
        raise ConfigError(f"arrival scale factor must be > 0, got {factor}")
    return _sorted(replace(r, arrival_s=r.arrival_s * factor) for r in reqs)


def _clip(r: Request, max_input: int | None, max_output: int | None) -> Request:
    input_len = r.input_len if max_input is None else min(r.input_len, max_input)
    output_len = r.output_len if max_output is None else min(r.output_len, max_output)
    return replace(r, input_len=input_len, output_len=output_len,
                   hash_ids=r.hash_ids[:blocks_for(input_len)] if r.hash_ids else ())


def cap_lengths(reqs: Iterable[Request], max_input: int | None = None, max_output: int | None = None,
                policy: str = "clip") -> tuple[list[Request], int]:
    """Limit lengths to what a chip can hold; returns ``(requests, affected)``.

    ``policy="clip"`` shortens an over-long request to the maximum (its ``hash_ids`` are cut to
    the blocks that remain; a now-partial last block keeps its hash, an approximation);
    ``policy="drop"`` removes it. ``affected`` counts requests clipped or dropped. ``None`` means
    no limit. Ids unchanged.
    """
    if policy not in ("clip", "drop"):
        raise ConfigError(f"cap policy must be 'clip' or 'drop', got {policy!r}")
    max_input = None if max_input is None else _as_int(max_input, "max_input", 1)
    max_output = None if max_output is None else _as_int(max_output, "max_output", 1)
    kept: list[Request] = []
    affected = 0
    for r in _sorted(reqs):
        too_long = ((max_input is not None and r.input_len > max_input)
                    or (max_output is not None and r.output_len > max_output))
        if not too_long:
            kept.append(r)
            continue
        affected += 1
        if policy == "clip":
            kept.append(_clip(r, max_input, max_output))
    return kept, affected


def fit_context(reqs: Iterable[Request], context_tokens: int) -> tuple[list[Request], int]:
    """Clip each request so that its prompt and output fit a model's context (``context_tokens``,
    its ``max_position_embeddings``): the output keeps at most ``context - 1`` tokens, then the
    prompt is cut to what is left (as a serving engine truncating prompts would; vLLM rejects
    them instead). Returns ``(requests, clipped)``; ids unchanged."""
    context = _as_int(context_tokens, "context_tokens", 2)
    out: list[Request] = []
    clipped = 0
    for r in _sorted(reqs):
        if r.input_len + r.output_len <= context:
            out.append(r)
            continue
        clipped += 1
        output_len = min(r.output_len, context - 1)
        out.append(_clip(r, context - output_len, output_len))
    return out, clipped


def check_context(reqs: Iterable[Request], context_tokens: int, model: str) -> None:
    """A ConfigError when a request's prompt and output do not fit ``model``'s context
    (``context_tokens``; 0: unknown, nothing checked): :func:`fit_context` clips them."""
    if context_tokens <= 0:
        return
    over = [r for r in reqs if r.input_len + r.output_len > context_tokens]
    if over:
        longest = max(r.input_len + r.output_len for r in over)
        raise ConfigError(f"{len(over)} request(s) longer than {model}'s context of {context_tokens:,} tokens (prompt + "
                          f"output; the longest {longest:,}): clip them first (npusim.serving.requests.fit_context; "
                          "npusim run does, with a warning)")


def renumber(reqs: Iterable[Request]) -> list[Request]:
    """The requests in arrival order with ids 0..n-1."""
    return [replace(r, id=i) for i, r in enumerate(_sorted(reqs))]


def offered_load(reqs: Sequence[Request]) -> dict:
    """Summary of a request list: count, span of arrivals (s), mean rate (requests/s, over the
    span between first and last arrival; None for fewer than 2 requests or a zero span), mean
    input and output tokens."""
    if not reqs:
        return {"requests": 0, "span_s": 0.0, "rate_per_s": None, "mean_input": None, "mean_output": None}
    arrivals = np.array([r.arrival_s for r in reqs])
    span = float(arrivals.max() - arrivals.min())
    return {
        "requests": len(reqs),
        "span_s": span,
        "rate_per_s": (len(reqs) - 1) / span if len(reqs) > 1 and span > 0 else None,
        "mean_input": float(np.mean([r.input_len for r in reqs])),
        "mean_output": float(np.mean([r.output_len for r in reqs])),
    }
