"""Retention policies: pure selection, property-tested."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.errors import ConfigError
from ckptstore.manager.retention import AnyOf, KeepAll, KeepEvery, KeepLast, select_deletions

STEPS = [100, 200, 300, 400, 500]


def test_keep_last() -> None:
    assert select_deletions(STEPS, KeepLast(2)) == [100, 200, 300]
    assert select_deletions(STEPS, KeepLast(10)) == []


def test_keep_every_keeps_first_of_each_window() -> None:
    # saves every 300 steps never hit a multiple of 1000 after 0; one per window is kept
    steps = [300, 600, 900, 1200, 1500, 1800, 2100, 2400]
    assert KeepEvery(1000).keep(steps) == {300, 1200, 2100}
    assert KeepEvery(100).keep(STEPS) == set(STEPS)


def test_combined_policies() -> None:
    policy = KeepLast(1) | KeepEvery(200)
    assert isinstance(policy, AnyOf)
    # keep-last 1 keeps 500; keep-every 200 keeps the first of [0,200) [200,400) [400,600)
    assert select_deletions(STEPS, policy) == [300]
    assert (KeepLast(1) | KeepEvery(2) | KeepAll()).policies[2] == KeepAll()
    assert policy.describe() == "keep-last 1 | keep-every 200 steps"


def test_newest_and_protected_are_never_deleted() -> None:
    class KeepNothing(KeepLast):
        def keep(self, steps: list[int]) -> set[int]:
            return set()

    assert select_deletions(STEPS, KeepNothing(1)) == [100, 200, 300, 400]
    assert select_deletions(STEPS, KeepNothing(1), protected={200}) == [100, 300, 400]
    assert select_deletions([], KeepLast(1)) == []


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_bad_counts_are_refused(bad: object) -> None:
    with pytest.raises(ConfigError):
        KeepLast(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        KeepEvery(bad)  # type: ignore[arg-type]


@settings(max_examples=200, deadline=None)
@given(
    steps=st.sets(st.integers(0, 10_000), max_size=40),
    n=st.integers(1, 8),
    every=st.one_of(st.none(), st.integers(1, 3000)),
    protected=st.sets(st.integers(0, 10_000), max_size=5),
)
def test_selection_properties(steps: set, n: int, every: int | None, protected: set) -> None:
    policy = KeepLast(n) if every is None else KeepLast(n) | KeepEvery(every)
    doomed = select_deletions(steps, policy, protected)
    assert doomed == sorted(doomed) and set(doomed) <= steps
    if steps:
        assert max(steps) not in doomed
    assert not set(doomed) & protected
    kept = sorted(steps - set(doomed))
    assert set(sorted(steps)[-n:]) <= set(kept)  # the n newest always survive
    # stable: deleting what was selected and asking again selects nothing more
    assert select_deletions(kept, policy, protected) == []
