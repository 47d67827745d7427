"""``plan --serving``'s sizing and pruning (npusim.system.serving_search): the check served at the
concurrency each candidate's batch limit implies."""

import pytest

SEARCH = dict(system="cloudmatrix384", nodes=1, model="qwen3-0.6b", npus=2, input_len=512, output_len=32, workers=1,
              serve_top=1)


def _slots(c):
    pool = next(p for p in c["deployment"]["pools"] if p["role"] != "prefill")
    return pool["max_batch_per_npu"] * pool["plan"]["npus"] * pool["instances"]


@pytest.mark.slow
def test_each_candidate_is_served_at_the_concurrency_its_batch_limit_implies():
    """The check runs the deployment at the batch its estimate assumes (its sequence slots): a stated
    benchmark concurrency limits the candidates' slots instead of serving them below their batch."""
    from npusim.system.serving_search import search_serving

    r = search_serving(**SEARCH, slo_ttft_ms=2000, slo_tpot_ms=50, max_concurrency=16)
    served = [c for c in r["candidates"] if c.get("served")]
    assert served
    for c in served:
        assert c["max_concurrency"] == _slots(c) <= 16
        assert c["num_prompts"] == 3 * _slots(c)
    for c in r["candidates"]:
        if c.get("deployment"):
            assert _slots(c) <= 16
