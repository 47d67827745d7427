"""Example counts for Hypothesis tests that ask for more than the active profile's default
(the profiles are registered in ``conftest.py``)."""

from hypothesis import settings


def examples(n: int) -> int:
    """``n`` examples, except under the ``dev`` profile (the local default): at most its
    ``max_examples`` (20). Use as ``@settings(max_examples=examples(200), ...)``."""
    if settings.get_current_profile_name() == "dev":
        return min(n, settings.get_profile("dev").max_examples)
    return n
