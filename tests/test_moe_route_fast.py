"""route_tokens drawn in blocks of ranks, with the grouped pick in Numba (session 46, issue 40): the same
picks as the one-draw NumPy path it replaced (kept below as the reference)."""

import numpy as np
import pytest

from npusim.system import moe


def reference(ep, tokens, top_k, experts, weights, seed=0, groups=0, keep=0, balanced=False):
    """The NumPy path before session 46: one draw of every key, then NumPy's selection."""
    rng = np.random.default_rng(seed + 1)
    with np.errstate(divide="ignore"):
        logw = np.log(weights)
    neg = -(rng.gumbel(size=(ep, tokens, experts)) + logw[None, None, :])
    if groups > 1:
        return moe._route_grouped(neg, top_k, groups, keep or groups, balanced)
    if top_k == experts:
        return np.argsort(neg, axis=2, kind="stable")
    top = np.argpartition(neg, top_k - 1, axis=2)[:, :, :top_k]
    order = np.argsort(np.take_along_axis(neg, top, axis=2), axis=2, kind="stable")
    return np.take_along_axis(top, order, axis=2)


CASES = [  # (ep, tokens, top_k, experts, groups, keep, balanced, weights)
    (320, 4, 8, 256, 8, 4, False, "uniform"),  # DeepSeek-V3/R1's router
    (7, 33, 8, 256, 8, 4, False, "zipf:1.2"),
    (5, 17, 6, 64, 8, 2, False, "uniform"),
    (4, 9, 4, 32, 32, 5, False, "uniform"),  # groups of one expert
    (4, 9, 4, 32, 4, 2, True, "uniform"),  # balanced: stays NumPy
    (6, 11, 8, 128, 0, 0, False, "zipf:0.8"),  # ungrouped
    (3, 5, 16, 16, 0, 0, False, "uniform"),  # top_k == experts
    (3, 0, 8, 256, 8, 4, False, "uniform"),  # no tokens
]


@pytest.mark.parametrize("block", [1 << 22, 37, 1])
@pytest.mark.parametrize("case", CASES)
def test_route_tokens_equals_the_one_draw_numpy_path(case, block, monkeypatch):
    ep, tokens, top_k, experts, groups, keep, balanced, routing = case
    monkeypatch.setattr(moe, "ROUTE_BLOCK_KEYS", block)  # 1: a rank per block; 37: blocks of several ranks
    w = moe.expert_weights(routing, experts, 3)
    for seed in (0, 11):
        got = moe.route_tokens(ep, tokens, top_k, experts, w, seed, groups, keep, balanced)
        want = reference(ep, tokens, top_k, experts, w, seed, groups, keep, balanced)
        assert got.shape == want.shape == (ep, tokens, top_k)
        assert got.dtype == want.dtype
        assert np.array_equal(got, want)


def test_zero_weight_experts_keep_the_numpy_path_and_are_never_picked():
    w = np.ones(256)
    w[::3] = 0.0  # +inf keys: ties the Numba kernel does not order, so NumPy picks
    got = moe.route_tokens(9, 40, 8, 256, w, 2, 8, 4)
    assert np.array_equal(got, reference(9, 40, 8, 256, w, 2, 8, 4))
    assert not np.isin(got, np.arange(0, 256, 3)).any()


def test_the_kernel_picks_distinct_experts_of_the_kept_groups_best_first():
    from npusim.system.routing_kernel import grouped_topk

    rng = np.random.default_rng(5)
    neg = rng.normal(size=(2, 50, 64))
    out = np.empty((2, 50, 6), np.int64)
    grouped_topk(neg, 6, 8, 3, out)
    for r in range(2):
        for t in range(50):
            row = neg[r, t].reshape(8, 8)
            score = np.sort(row, axis=1)[:, :2].sum(axis=1)
            kept = np.argsort(score, kind="stable")[:3]
            allowed = np.concatenate([np.arange(g * 8, g * 8 + 8) for g in kept])
            best = allowed[np.argsort(neg[r, t, allowed], kind="stable")[:6]]
            assert out[r, t].tolist() == best.tolist()
