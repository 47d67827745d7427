"""A run's request stream from its options: a Mooncake trace, the benchmark client (``--dataset
random --input-len I --output-len O --num-prompts N [--max-concurrency C] [--request-rate R]``, as
``vllm bench serve``), or the older synthetic Poisson source (``--rate R --requests N``).

:class:`RequestSource` holds the options (the ``npusim run`` flags of the same names; built from any
object with those attributes by :meth:`RequestSource.from_options`), checks them against each other,
and makes the request list (:meth:`RequestSource.requests`) and the summary's client fields
(:meth:`RequestSource.client_fields`). The chip and the system serving paths, sweeps and the serving
plan search take their requests from here. Units: tokens, seconds, requests per second.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, fields, replace
from pathlib import Path

from npusim.argtypes import refuse_unless_forced
from npusim.choices import (BYTES_PER_REQUEST, CLIENT_FLAGS, DEFAULT_INPUT, DEFAULT_OUTPUT, DEFAULT_RATE,
                            DEFAULT_REQUESTS, MAX_REQUESTS, RANDOM_INPUT, RANDOM_OUTPUT)
from npusim.errors import ConfigError
from npusim.serving.requests import Request


@dataclass(frozen=True)
class Workload:
    """The requests of a run, and how many had a length clipped (``--max-input``/``--max-output``)
    or their prompt clipped to the model's context."""

    requests: list[Request]
    clipped: int = 0
    over_context: int = 0


@dataclass(frozen=True)
class RequestSource:
    """The request options of a run (None: not given; see the module docstring)."""

    trace: Path | None = None
    rate: float | None = None
    requests: int | None = None
    input_len: str | int | None = None
    output_len: str | int | None = None
    dataset: str | None = None
    range_ratio: float | None = None
    num_prompts: int | None = None
    max_concurrency: int | None = None
    request_rate: float | None = None
    burstiness: float | None = None
    sweep_concurrency: str | None = None
    duration: float | None = None
    time_scale: float = 1.0
    max_input: int | None = None
    max_output: int | None = None
    seed: int = 0
    force: bool = False

    @classmethod
    def from_options(cls, opts) -> "RequestSource":
        """The source an options object gives (``npusim run``'s parsed flags, a sweep point's)."""
        kw = {f.name: getattr(opts, f.name) for f in fields(cls) if getattr(opts, f.name, None) is not None}
        return cls(**kw)

    @property
    def is_client(self) -> bool:
        """Whether a benchmark client flag (:data:`npusim.choices.CLIENT_FLAGS`) was given."""
        return any(getattr(self, f) is not None for f in CLIENT_FLAGS)

    def check(self) -> None:
        """The client's flags checked against each other and the older serving flags (one-line errors
        naming the flag)."""
        for new, old in (("num_prompts", "requests"), ("request_rate", "rate")):
            if getattr(self, new) is not None and getattr(self, old) is not None:
                raise ConfigError(f"--{new.replace('_', '-')} and --{old}: the same setting by two names; give one")
        if self.max_concurrency is not None and self.sweep_concurrency is not None:
            raise ConfigError("--max-concurrency and --sweep-concurrency: a sweep sets the concurrency of each run; "
                              "give one")
        if self.trace is not None:
            for flag in ("dataset", "request_rate", "burstiness", "range_ratio"):
                if getattr(self, flag) is not None:
                    raise ConfigError(f"--{flag.replace('_', '-')}: --trace FILE brings its own prompts and arrival "
                                      "times; drop one of them")
        if self.range_ratio is not None and self.dataset != "random":
            raise ConfigError("--range-ratio: the spread of --dataset random's lengths; add --dataset random")
        if self.burstiness is not None and self.request_rate is None:
            raise ConfigError("--burstiness: the shape of --request-rate's gaps; add --request-rate R")
        if self.dataset not in (None, "random"):
            for flag in ("input_len", "output_len"):
                if getattr(self, flag) is not None:
                    raise ConfigError(f"--{flag.replace('_', '-')}: --dataset {self.dataset} draws its own lengths "
                                      "(use --dataset random, or no --dataset, to set them)")

    def lengths(self):
        """The input and output length distributions the options give."""
        from npusim.serving.client import DATASET_PRESETS, random_lengths
        from npusim.serving.requests import PRESETS

        if self.dataset == "random":
            ratio = 0.0 if self.range_ratio is None else self.range_ratio
            return (random_lengths(_client_int(self.input_len, "--input-len", RANDOM_INPUT), ratio, "--input-len"),
                    random_lengths(_client_int(self.output_len, "--output-len", RANDOM_OUTPUT), ratio, "--output-len"))
        if self.dataset in DATASET_PRESETS:
            preset = PRESETS[DATASET_PRESETS[self.dataset]]
            return preset.input_len, preset.output_len
        return (_length(DEFAULT_INPUT if self.input_len is None else self.input_len, "--input-len"),
                _length(DEFAULT_OUTPUT if self.output_len is None else self.output_len, "--output-len"))

    def requests_for(self, cfg) -> Workload:
        """The requests (``cfg``: the model's config, whose context clips prompts). With a benchmark
        client flag the arrival times are the client's planned sends
        (:func:`npusim.serving.client.send_times`: all at 0 unless --request-rate); without, the older
        Poisson source at --rate."""
        from npusim.serving.client import send_times
        from npusim.serving.requests import cap_lengths, synthetic_requests
        from npusim.serving.traces import load_trace

        self.check()
        n_given = self.requests if self.requests is not None else self.num_prompts
        if self.trace is not None:
            window = (0.0, self.duration) if self.duration else None
            reqs = load_trace(self.trace, first=n_given, window=window, scale=self.time_scale)
        else:
            n = DEFAULT_REQUESTS if n_given is None else n_given
            refuse_unless_forced(self, n, MAX_REQUESTS, "--num-prompts" if self.requests is None else "--requests",
                                 f"~{n * BYTES_PER_REQUEST / 1e9:,.1f} GB of request records and days of simulation")
            input_len, output_len = self.lengths()
            if self.is_client:
                rate = self.request_rate if self.request_rate is not None else self.rate
                rate = math.inf if rate is None else rate
                times = send_times(n, rate, 1.0 if self.burstiness is None else self.burstiness, self.seed)
                reqs = synthetic_requests(n, math.inf, input_len=input_len, output_len=output_len, seed=self.seed)
                reqs = [replace(r, arrival_s=float(t)) for r, t in zip(reqs, times)]
            else:
                rate = DEFAULT_RATE if self.rate is None else self.rate
                reqs = synthetic_requests(n, rate, input_len=input_len, output_len=output_len, seed=self.seed)
        clipped = 0
        if self.max_input or self.max_output:
            reqs, clipped = cap_lengths(reqs, self.max_input, self.max_output, policy="clip")
        reqs, over = fit_model_context(cfg, reqs)
        return Workload(reqs, clipped, over)

    def client_fields(self, max_concurrency: int | None) -> dict:
        """The benchmark client's settings, as the summary records them ({}: not a client run)."""
        if not self.is_client:
            return {}
        rate = self.request_rate if self.request_rate is not None else self.rate
        return {"dataset": self.dataset, "max_concurrency": max_concurrency,
                "request_rate": "trace" if self.trace is not None else "inf" if rate is None or math.isinf(rate)
                else rate,
                "burstiness": None if rate is None else ("inf" if self.burstiness is not None
                                                         and math.isinf(self.burstiness) else self.burstiness or 1.0)}


def fit_model_context(cfg, reqs):
    """Requests clipped to the model's context (said once on stderr), and how many were."""
    from npusim.serving.requests import fit_context

    if cfg.max_position_embeddings <= 0:  # a config that does not say
        return reqs, 0
    reqs, over = fit_context(reqs, cfg.max_position_embeddings)
    if over:
        print(f"npusim run: warning: {over} of {len(reqs)} requests are longer than {cfg.name}'s context of "
              f"{cfg.max_position_embeddings:,} tokens (prompt + output); their prompts are clipped to fit",
              file=sys.stderr)
    return reqs, over


def _client_int(text, flag: str, default: int) -> int:
    if text is None:
        return default
    try:
        value = int(str(text))
    except ValueError:
        raise ConfigError(f"{flag} '{text}': --dataset random takes one number of tokens, the centre of the "
                          "--range-ratio spread (I1:I2 ranges and lognormal:... are for the source without "
                          "--dataset)") from None
    if value < 1:
        raise ConfigError(f"{flag} {value}: expected a positive number of tokens")
    return value


def _length(text, flag):
    from npusim.serving.requests import parse_length

    try:
        return parse_length(text)
    except (ValueError, ConfigError) as exc:
        raise ConfigError(f"{flag}: {exc}") from None
