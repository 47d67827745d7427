"""The multi-NPU MoE step (npusim.system.moe_step): it runs on a small instance, conserves tokens,
responds to the knobs the right way, and rejects impossible deployments with clear errors."""

from pathlib import Path

import numpy as np
import pytest

from npusim.errors import ConfigError
from npusim.mapping.deployment import Deployment
from npusim.mapping.spec import load_deployment
from npusim.system.load import load_system
from npusim.system.moe_step import _expert_placement, _traffic, simulate_step
from npusim.model.zoo import get_config


ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cm1():
    return load_system("cloudmatrix384", nodes=1)  # 8 NPUs = 16 dies


@pytest.fixture(autouse=True)
def _private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NPUSIM_CACHE_DIR", str(tmp_path / "npusim-cache"))


def _dep(**kw):
    base = dict(phase="decode", npus=8, routed_experts={"per_die": 16}, shared_expert={"mode": "dp"})
    base.update(kw)
    return Deployment.model_validate(base)


def test_small_decode_step_runs_and_adds_up(cm1):
    r = simulate_step(cm1, _dep(), batch=8, kv=1024)
    assert r.dies == 16 and r.batch_per_die == 4
    assert r.step_ms > 0 and r.tpot_ms == pytest.approx(r.step_ms)
    assert r.tokens_per_s_per_npu == pytest.approx(8 / (r.step_ms / 1e3))
    b = r.breakdown_us
    assert b["attention"] > 0 and b["moe_compute"] > 0 and b["dispatch"] > 0 and b["combine"] > 0
    assert r.layer_us <= sum(b[k] for k in ("attention", "moe_compute", "dispatch", "combine", "other")) + 1e-6
    mtp = simulate_step(cm1, _dep(), batch=8, kv=1024, mtp=1, mtp_acceptance=0.8)
    assert mtp.tokens_per_step == pytest.approx(1.8)
    assert mtp.step_ms > r.step_ms  # more tokens and the MTP layer
    assert mtp.tpot_ms == pytest.approx(mtp.step_ms / 1.8)


def test_longer_context_is_slower(cm1):
    short = simulate_step(cm1, _dep(), batch=8, kv=512)
    long = simulate_step(cm1, _dep(), batch=8, kv=8192)
    assert long.breakdown_us["attention"] > short.breakdown_us["attention"]
    assert long.step_ms > short.step_ms


def test_routing_conserves_tokens():
    cfg = get_config("deepseek-r1")
    dep = _dep(routed_experts={"per_die": 16, "redundant": 0})
    rng = np.random.default_rng(0)
    picks = np.stack([[rng.choice(256, 8, replace=False) for _ in range(12)] for _ in range(16)])
    homes = _expert_placement(cfg, dep, 16, np.bincount(picks.ravel(), minlength=256))
    tokens, per_die = _traffic(picks, homes, [], 16, "none")
    assert per_die.sum() == picks.size  # every (token, expert) pair computed once
    assert np.all(tokens.sum(axis=1) >= 12) and np.all(tokens.sum(axis=1) <= 12 * 8)  # deduplicated per rank
    perfect, per_die_p = _traffic(picks, homes, [], 16, "perfect")
    assert per_die_p.sum() == picks.size and per_die_p.max() - per_die_p.min() <= 1


def test_impossible_deployments_are_clear_errors(cm1):
    with pytest.raises(ConfigError, match="NPUs"):
        simulate_step(cm1, _dep(npus=160), batch=8, kv=1024)
    with pytest.raises(ConfigError, match="slots"):
        simulate_step(cm1, _dep(routed_experts={"per_die": 4}), batch=8, kv=1024)
    with pytest.raises(ConfigError, match="does not fit"):
        simulate_step(cm1, _dep(), batch=512, kv=131072)
    with pytest.raises(ValueError, match="core_split"):  # pydantic's error; files get a ConfigError
        _dep(microbatches=2)


def test_presets_load():
    for name in ("cm384-deepseek-decode", "cm384-deepseek-prefill", "a2-deepseek-decode", "a2-deepseek-prefill"):
        dep = load_deployment(ROOT / "mappers" / f"{name}.yaml")
        assert dep.phase in name
    ep64 = load_deployment(ROOT / "examples" / "mappings" / "cm384-deepseek-decode-ep64.yaml")
    assert (ep64.npus * 2, ep64.routed_experts.per_die * ep64.npus * 2) == (64, 256)  # EP64: 4 experts a die
    assert ep64.microbatches == 2  # the rest from the decode preset it extends
