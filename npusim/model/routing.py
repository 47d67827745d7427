"""Which experts each token of a MoE layer is routed to (deterministic, seeded).

A router scores every expert for every token and keeps the ``top_k`` best; what a simulator
needs from it is the pattern of choices: each token picks ``top_k`` *distinct* experts, and
some experts are more popular than others. :func:`route_tokens` draws that pattern per token:
expert ``e`` has popularity weight ``w_e``, and each token draws its ``top_k`` experts without
replacement in proportion to the weights (the Gumbel top-k trick: the ``top_k`` largest of
``log w_e + G_e`` with ``G_e`` i.i.d. standard Gumbel, i.e. Plackett-Luce sampling — the same
model as the multi-NPU level's ``npusim.system.moe``, drawn here by the equivalent exponential race). The weights are a Zipf-like profile
``w = 1 / (r + 1) ** skew`` over popularity ranks ``r``; which expert holds which rank is a
permutation drawn from ``numpy.random.default_rng(seed)`` (``skew = 0``: uniform). The token
draws use an independent stream, ``default_rng([seed, 1])``, in float32.

Consequences a per-expert *count* profile alone would miss: with few tokens the experts hit
are random (a decode batch of 8 tokens x top-8 of 128 experts touches ~52 distinct experts,
not 64), some experts get two tokens while others get none, and a token's experts are spread
over the cores (or dies) that hold them, which sets the dispatch traffic.

:func:`routing_from_counts` goes the other way for graphs that state only per-expert counts
(hand-built ops): a deterministic assignment of tokens to experts that meets the counts exactly
with ``top_k`` distinct experts per token.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from npusim.errors import ConfigError


def _check(tokens: int, experts: int, top_k: int, skew: float) -> None:
    if tokens < 0 or experts <= 0 or not 0 < top_k <= experts:
        raise ConfigError(f"expert routing needs tokens >= 0, experts > 0 and 0 < top_k <= experts "
                          f"(got {tokens}, {experts}, {top_k})")
    if skew < 0:
        raise ConfigError(f"moe_skew must be >= 0 (got {skew})")


def popularity(experts: int, skew: float = 0.0, seed: int = 0) -> np.ndarray:
    """Relative popularity ``w_e`` of each expert: Zipf ``1 / (r + 1) ** skew`` over ranks ``r``,
    rank ``r`` held by expert ``perm[r]`` of a seeded permutation."""
    w = np.empty(experts, dtype=np.float64)
    w[np.random.default_rng(seed).permutation(experts)] = 1.0 / np.arange(1, experts + 1, dtype=np.float64) ** skew
    return w


def route_tokens(tokens: int, experts: int, top_k: int, skew: float = 0.0, seed: int = 0) -> np.ndarray:
    """``picks[token, j]``: the ``top_k`` distinct experts each of ``tokens`` tokens is routed to
    (``int64``, shape ``(tokens, top_k)``, in decreasing key order; see the module docstring).

    Drawn as the ``top_k`` largest keys ``log(u_e) / w_e`` with ``u_e`` uniform in (0, 1] — the
    same ranking as ``log w_e + G_e`` (``-log u / w`` is exponential with rate ``w``, the
    exponential race), one uniform per (token, expert) — picked by ``top_k`` argmax passes.
    Memoised (the result is read-only): serving builds graphs of the same sizes again and again."""
    _check(tokens, experts, top_k, skew)
    return _route(int(tokens), int(experts), int(top_k), float(skew), int(seed))


@lru_cache(maxsize=512)
def _route(tokens: int, experts: int, top_k: int, skew: float, seed: int) -> np.ndarray:
    picks = np.empty((tokens, top_k), dtype=np.int64)
    if tokens:
        u = 1.0 - np.random.default_rng([seed, 1]).random((tokens, experts), dtype=np.float32)  # (0, 1]
        keys = u if skew == 0 else np.log(u) / popularity(experts, skew, seed).astype(np.float32)[None, :]
        rows = np.arange(tokens)
        for j in range(top_k):
            picks[:, j] = best = keys.argmax(axis=1)
            keys[rows, best] = -np.inf
    picks.flags.writeable = False
    return picks


def expert_token_counts(tokens: int, experts: int, top_k: int, skew: float = 0.0, seed: int = 0) -> tuple[int, ...]:
    """Tokens routed to each expert by :func:`route_tokens` (same arguments): deterministic,
    summing to ``tokens * top_k``, every entry in ``0..tokens``."""
    picks = route_tokens(tokens, experts, top_k, skew, seed)
    return tuple(int(c) for c in np.bincount(picks.ravel(), minlength=experts))


def routing_from_counts(counts, top_k: int) -> np.ndarray:
    """A token -> experts assignment (``(tokens, top_k)``) meeting per-expert ``counts`` exactly,
    ``tokens = sum(counts) / top_k``, each token's experts distinct. The ``tokens * top_k`` slots
    are filled expert by expert, token-fastest (slot ``s`` is token ``s mod tokens``), so an
    expert's run of at most ``tokens`` slots lands on distinct tokens. Deterministic."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if top_k <= 0 or total % top_k or (counts < 0).any():
        raise ConfigError(f"expert_tokens {tuple(counts.tolist())} cannot come from top-{top_k} routing: "
                          f"their sum must be a multiple of top_k and each count >= 0")
    tokens = total // top_k
    if tokens and counts.max() > tokens:
        raise ConfigError(f"expert_tokens: an expert gets {int(counts.max())} tokens of {tokens} (a token picks "
                          f"an expert at most once)")
    slots = np.repeat(np.arange(counts.size, dtype=np.int64), counts)
    return slots.reshape(top_k, tokens).T.copy()


__all__ = ["expert_token_counts", "popularity", "route_tokens", "routing_from_counts"]
