"""Hypothesis pieces the plugins' fuzz tests share (plugins/*/tests/test_*_fuzz.py)."""

from __future__ import annotations

from hypothesis import HealthCheck, example, settings
from hypothesis import strategies as st

__all__ = ["SETTINGS", "json_values", "seeded"]

SETTINGS = settings(
    max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

#: Any JSON value, nested a little.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=20,
)


def seeded(examples):
    """A decorator adding each of ``examples`` as a hypothesis ``example``."""

    def deco(fn):
        for value in examples:
            fn = example(value)(fn)
        return fn

    return deco
