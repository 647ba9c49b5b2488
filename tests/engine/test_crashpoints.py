"""Crash points: a coordinator-only point paired with another rank is refused, not silent."""

from __future__ import annotations

import pytest

from ckptstore.engine.crashpoints import COORDINATOR_POINTS, crashpoint
from ckptstore.errors import ConfigError


@pytest.mark.parametrize("point", sorted(COORDINATOR_POINTS))
def test_a_coordinator_point_on_another_rank_is_refused(monkeypatch, point) -> None:
    monkeypatch.setenv("CKPTSTORE_CRASH_AT", f"{point}:2")
    monkeypatch.setenv("CKPTSTORE_CRASH_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(ConfigError, match="coordinator .rank 0. alone"):
        crashpoint("after_shards")  # the first point any rank reaches says so


def test_other_points_and_rank_0_stay_armed_without_firing_elsewhere(monkeypatch) -> None:
    monkeypatch.setenv("CKPTSTORE_CRASH_AT", "before_marker")
    monkeypatch.setenv("CKPTSTORE_CRASH_RANK", "0")
    monkeypatch.setenv("RANK", "1")
    crashpoint("before_marker")  # rank 1 is not rank 0: returns
    monkeypatch.setenv("CKPTSTORE_CRASH_AT", "mid_upload")
    monkeypatch.setenv("CKPTSTORE_CRASH_RANK", "1")
    monkeypatch.setenv("RANK", "0")
    crashpoint("mid_upload")  # armed for rank 1 only: returns here
