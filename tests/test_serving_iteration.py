"""Iteration graphs: equal signatures mean equal graphs; padding keeps the requests' attention work."""

from hypothesis import given, settings
from hypothesis import strategies as st

from hyp import examples
from npusim.serving.iteration import Work, build_iteration_graph, iteration_signature, padded_count

works = st.lists(st.one_of(
    st.builds(Work, q=st.just(1), kv=st.integers(1, 4000), samples=st.just(True)),
    st.builds(Work, q=st.integers(2, 300), kv=st.integers(300, 2000), samples=st.booleans())),
    min_size=1, max_size=40)


def _shape(graph):
    return (graph.batch, graph.seq_len, graph.kv_len,
            [(o.name, o.kind, o.m, o.k, o.n, o.batch, o.q_len, o.kv_len) for o in graph.ops])


@settings(max_examples=examples(40), deadline=None)
@given(works, works)
def test_equal_signatures_build_equal_graphs(a, b):
    if iteration_signature(a) == iteration_signature(b):
        assert _shape(build_iteration_graph("qwen3-0.6b", a, layers=1)) == \
            _shape(build_iteration_graph("qwen3-0.6b", b, layers=1))
    # with decodes only, 6 and 7 requests share a shape (padded to 8)
    six, seven = [Work(1, 500, True)] * 6, [Work(1, 500, True)] * 7
    assert iteration_signature(six) == iteration_signature(seven)


@settings(max_examples=examples(40), deadline=None)
@given(works)
def test_padding_keeps_attention_work_and_token_rows(work):
    padded = build_iteration_graph("qwen3-0.6b", work, layers=1, kv_quantum=1)
    exact = build_iteration_graph("qwen3-0.6b", work, layers=1, kv_quantum=1, pad=False)

    def attention(graph):
        ops = [o for o in graph.ops if o.kind == "attention"]
        return sum(o.batch * (o.kv_len - o.q_len) for o in ops), sum(o.batch * o.q_len for o in ops)

    (cached_p, rows_p), (cached_e, rows_e) = attention(padded), attention(exact)
    assert rows_e <= rows_p <= rows_e + 15 * len(work) + 7 * 2
    spread = sum(o.batch for o in padded.ops if o.kind == "attention" and o.q_len == 1)
    assert abs(cached_p - cached_e) <= spread  # each padded decode row's keys rounded to a whole token
    head = [o for o in padded.ops if o.name.endswith("lm_head")]
    assert all(o.m <= padded.seq_len for o in head)
    assert padded_count(5) == 8 and padded_count(3) == 4 and padded_count(17) == 24
