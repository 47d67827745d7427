"""A7's figures as the study's artefact computes them (npusim/validate/serving_pd.py)."""

import math

import pytest

from npusim.serving.metrics import RequestRecord
from npusim.validate.serving_pd import A7_SETUP, artefact_metrics


def record(i, arrival, tokens):
    r = RequestRecord(i, arrival, 100, len(tokens))
    r.token_times_s = list(tokens)
    r.finish_s = tokens[-1]
    return r


def test_ttft_is_measured_from_the_earliest_first_token_not_from_arrival():
    recs = [record(0, 0.0, [1.0, 1.5, 2.0]), record(1, 0.0, [3.0, 3.25, 3.5])]
    m = artefact_metrics(recs)
    assert m["ttft_ms"] == pytest.approx(1e3 * (0.0 + 2.0) / 2)  # first tokens 1.0 and 3.0, earliest 1.0
    assert m["ttft_from_arrival_ms"] == pytest.approx(1e3 * (1.0 + 3.0) / 2)
    assert m["tbt_ms"] == pytest.approx(1e3 * (0.5 + 0.25) / 2)  # each request's mean gap, then the mean
    assert m["decode_ms"] == pytest.approx(1e3 * (1.0 + 0.5) / 2)  # last token minus first
    assert m["e2e_ms"] == pytest.approx(1e3 * (2.0 + 3.5) / 2)


def test_unfinished_requests_are_left_out_and_none_finished_is_an_error():
    unfinished = RequestRecord(2, 0.0, 100, 3)
    unfinished.token_times_s = [0.5]
    m = artefact_metrics([record(0, 0.0, [1.0, 2.0]), unfinished])
    assert m["ttft_ms"] == 0.0
    with pytest.raises(ValueError, match="no request completed"):
        artefact_metrics([unfinished])


def test_a7_runs_the_artefacts_workload():
    assert A7_SETUP.requests == 200 and math.isinf(A7_SETUP.rate)
    assert "all at t = 0" in A7_SETUP.describe()
