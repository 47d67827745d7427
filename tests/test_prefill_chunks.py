"""A prompt chunk on a system (npusim.system.instance.plan_step): fewer prompt tokens than the context
are a chunk of a longer prompt, costed as those tokens attending the whole context, not as a whole
prefill of the context (which charged every 2,048-token chunk of a 32K prompt a 32K-token prefill)."""

import pytest

from npusim.system.instance import plan_step
from npusim.system.load import load_system
from npusim.system.plan import ParallelPlan


@pytest.fixture(scope="module")
def step():
    return plan_step(load_system("atlas-800i-a2"), "qwen3-0.6b", ParallelPlan(npus=1, tp=1), "prefill")


def test_a_chunk_costs_less_than_the_whole_prompt_and_its_chunks_add_up_to_about_it(step):
    whole = step(8192, 8192)
    chunks = [step(2048, y) for y in (2048, 4096, 6144, 8192)]
    assert chunks[-1] < 0.5 * whole  # before: the last chunk cost the whole 8,192-token prefill
    assert chunks == sorted(chunks)  # later chunks attend more keys
    # four chunks do the whole prompt's GEMM work and its causal attention once, plus three more
    # steps' fixed costs
    assert whole <= sum(chunks) <= 1.5 * whole


def test_whole_prompts_are_costed_as_before(step):
    assert step(4096, 2048) == pytest.approx(2 * step(2048, 2048), rel=0.3)
    assert step(2048, 2048) < step(4096, 4096)
