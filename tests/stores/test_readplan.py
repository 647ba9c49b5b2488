"""The load's read planning (``ckptstore.engine.readplan``): pure functions, tested directly."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptstore.config import MiB
from ckptstore.engine.readplan import MIN_RANGE, Window, coalesce, range_size


def test_range_size_spreads_a_load_over_every_connection() -> None:
    assert range_size(256 * MiB, 32 * MiB, 16) == 16 * MiB
    assert range_size(1024 * MiB, 32 * MiB, 16) == 32 * MiB  # never above the part size
    assert range_size(8 * MiB, 32 * MiB, 16) == MIN_RANGE  # never a sliver of a GET
    assert range_size(8 * MiB, 1 * MiB, 16) == 1 * MiB  # a smaller part size wins
    assert range_size(0, 32 * MiB, 8) == MIN_RANGE
    with pytest.raises(ValueError):
        range_size(1, 0, 8)


def test_adjacent_small_ranges_merge_up_to_the_window() -> None:
    ranges = [("a", 0, 10), ("a", 10, 10), ("a", 20, 10), ("a", 30, 10)]
    assert coalesce(ranges, max_window=25) == [
        Window("a", 0, 20, (0, 1)),
        Window("a", 20, 20, (2, 3)),
    ]
    assert coalesce(ranges, max_window=40) == [Window("a", 0, 40, (0, 1, 2, 3))]


def test_files_gaps_and_large_ranges_break_windows() -> None:
    ranges = [
        ("b", 0, 10),
        ("a", 50, 10),  # not adjacent to the next one: a gap of 5
        ("a", 65, 10),
        ("a", 75, 100),  # large: a window of its own
        ("a", 175, 10),
    ]
    assert coalesce(ranges, max_window=100) == [
        Window("a", 50, 10, (1,)),
        Window("a", 65, 10, (2,)),
        Window("a", 75, 100, (3,)),
        Window("a", 175, 10, (4,)),
        Window("b", 0, 10, (0,)),
    ]
    # a gap within max_gap is read across
    assert coalesce(ranges[1:3], max_window=100, max_gap=5) == [Window("a", 50, 25, (0, 1))]


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError):
        coalesce([("a", 0, 1)], max_window=0)
    with pytest.raises(ValueError):
        coalesce([("a", -1, 1)], max_window=8)


ranges_st = st.lists(
    st.tuples(st.sampled_from("ab"), st.integers(0, 400), st.integers(0, 120)), max_size=40
)


@given(ranges_st, st.integers(1, 200), st.integers(0, 20))
def test_every_range_is_in_exactly_one_window_that_covers_it(ranges, max_window, max_gap):
    windows = coalesce(ranges, max_window=max_window, max_gap=max_gap)
    members = sorted(i for w in windows for i in w.members)
    assert members == list(range(len(ranges)))
    for w in windows:
        for i in w.members:
            path, off, length = ranges[i]
            assert path == w.path and w.offset <= off and off + length <= w.end
        # a merged window stays within the limit; only a lone range may exceed it
        assert len(w.members) == 1 or w.length <= max_window
        starts = [ranges[i][1] for i in w.members]
        assert starts == sorted(starts) and w.offset == starts[0]
        assert w.end == max(ranges[i][1] + ranges[i][2] for i in w.members)
    assert [(w.path, w.offset) for w in windows] == sorted((w.path, w.offset) for w in windows)
