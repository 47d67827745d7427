"""Iteration-level scheduling: which requests run how many tokens in the next iteration.

Policies (:class:`SchedulerConfig.policy`):

* ``continuous`` — continuous batching (Orca / vLLM style): every running request that
  is decoding gets its next token (decodes first, up to ``max_batch``), then requests
  still prefilling get prompt tokens, first come first served, while the iteration's
  token budget ``max_tokens`` lasts — whole prompts, or chunks of ``chunk_tokens`` when
  chunked prefill is on (``chunk_tokens > 0``).
* ``fusion`` — PD fusion under a budget of ``budget`` units per iteration (the NpuSim
  study's policy): a decode costs 1 unit, a prefill chunk of ``chunk_tokens`` costs
  ``chunk_cost`` units (default: its tokens). When the decodes alone exceed the budget
  they go first and fill it; otherwise every decode runs and the remaining budget goes to
  prefill chunks, first come first served.

A request is *prefilling* until all ``input_len`` prompt tokens have their KV (tokens
reused from the prefix cache count as done), *decoding* until ``output_len`` tokens have
been produced. The iteration that completes a prompt produces the first output token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from npusim.errors import ConfigError


@dataclass(frozen=True)
class SchedulerConfig:
    policy: Literal["continuous", "fusion"] = "fusion"
    max_batch: int = 256
    max_tokens: int = 8192
    chunk_tokens: int = 512
    budget: int = 1024
    chunk_cost: int | None = None

    def __post_init__(self):
        if self.policy not in ("continuous", "fusion"):
            raise ConfigError(f"scheduler policy '{self.policy}': expected continuous or fusion")
        for name in ("max_batch", "max_tokens", "budget"):
            if getattr(self, name) < 1:
                raise ConfigError(f"scheduler {name} must be >= 1, got {getattr(self, name)}")
        if self.chunk_tokens < 0:
            raise ConfigError(f"chunk_tokens must be >= 0 (0 = whole prompts), got {self.chunk_tokens}")
        if self.policy == "fusion" and self.chunk_tokens == 0:
            raise ConfigError("PD fusion schedules prefill in chunks: chunk_tokens must be > 0")


@dataclass
class Live:
    """A running request's progress (tokens whose KV exists; tokens produced)."""

    req: object  # npusim.serving.requests.Request
    prefilled: int = 0
    generated: int = 0
    admitted_at: float = 0.0
    kv_to_place: int = 0  # KV tokens that arrive with the request (PD disaggregation's transfer)

    @property
    def prefilling(self) -> bool:
        return self.prefilled < self.req.input_len

    @property
    def kv_tokens(self) -> int:
        return self.prefilled + max(0, self.generated - 1)

    @property
    def done(self) -> bool:
        return self.generated >= self.req.output_len


@dataclass(frozen=True)
class Slot:
    """One request's part of an iteration: ``q`` new tokens against ``kv`` keys (new included)."""

    live: Live
    q: int
    kv: int
    samples: bool


@dataclass
class Scheduler:
    cfg: SchedulerConfig
    stats: dict = field(default_factory=lambda: {"iterations": 0, "decode_slots": 0, "prefill_slots": 0})

    def plan(self, running: list[Live]) -> list[Slot]:
        """The next iteration's slots for the running requests (in admission order)."""
        cfg = self.cfg
        decoding = [r for r in running if not r.prefilling and not r.done]
        prefilling = [r for r in running if r.prefilling]
        slots: list[Slot] = []
        if cfg.policy == "continuous":
            for r in decoding[:cfg.max_batch]:
                slots.append(Slot(r, 1, r.kv_tokens + 1, True))
            tokens = len(slots)
            for r in prefilling:
                if len(slots) >= cfg.max_batch or tokens >= cfg.max_tokens:
                    break
                left = r.req.input_len - r.prefilled
                q = min(left, cfg.chunk_tokens or left, cfg.max_tokens - tokens)
                slots.append(Slot(r, q, r.prefilled + q, r.prefilled + q == r.req.input_len))
                tokens += q
        else:
            budget = cfg.budget
            for r in decoding[:min(budget, cfg.max_batch)]:
                slots.append(Slot(r, 1, r.kv_tokens + 1, True))
            budget -= len(slots)
            for r in prefilling:
                if budget <= 0 or len(slots) >= cfg.max_batch:
                    break
                left = r.req.input_len - r.prefilled
                q = min(left, cfg.chunk_tokens)
                cost = q if cfg.chunk_cost is None else max(1, cfg.chunk_cost * q // cfg.chunk_tokens)
                if cost > budget:
                    if slots:
                        break
                    q = max(1, budget * q // cost)  # a lone chunk shrinks to fit the budget
                    cost = budget
                slots.append(Slot(r, q, r.prefilled + q, r.prefilled + q == r.req.input_len))
                budget -= max(1, cost)
        self.stats["iterations"] += bool(slots)  # a plan with nothing to run is no iteration
        self.stats["decode_slots"] += sum(1 for s in slots if s.q == 1 and not s.live.prefilling)
        self.stats["prefill_slots"] += sum(1 for s in slots if s.live.prefilling)
        return slots
