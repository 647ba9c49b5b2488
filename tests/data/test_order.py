"""Property and unit tests for the data-order math (ckptstore.data.order / .stream)."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptstore.data.order import (
    DataOrderError,
    OrderState,
    agreed_cursor,
    check_resume,
    cursor_after,
    epoch_batch,
    epoch_batches,
    epoch_permutation,
    loader_seed,
    next_epoch_boundary,
    num_batches,
    rank_batch_indices,
    sample_seed,
    worker_for_batch,
)
from ckptstore.data.stream import DataOrder

FAST = settings(max_examples=150, deadline=None)

shard_sizes_st = st.lists(st.integers(0, 9), min_size=1, max_size=6).filter(lambda s: sum(s) > 0)
seed_st = st.integers(-(2**70), 2**70)
layout_st = st.tuples(st.integers(1, 4), st.integers(1, 5), st.integers(0, 4))  # R, B, W


@st.composite
def orders(draw: st.DrawFn) -> DataOrder:
    return DataOrder(
        draw(st.text(max_size=8)),
        draw(seed_st),
        draw(shard_sizes_st),
        buckets=draw(st.integers(1, 12)),
        shuffle=draw(st.booleans()),
        cache_epochs=draw(st.integers(1, 3)),
    )


def consume(k0: int, world_size: int, batch_size: int, steps: int) -> list[int]:
    """Cursors handed to training, in (step, rank) order, for ``steps`` global steps."""
    out: list[int] = []
    for s in range(steps):
        for r in range(world_size):
            out += rank_batch_indices(k0, r, world_size, batch_size, s)
    return out


# --- hand-computed examples ----------------------------------------------------------------


def test_cursor_arithmetic_n10_r2_b2() -> None:
    assert rank_batch_indices(0, 0, 2, 2, 0) == [0, 1]
    assert rank_batch_indices(0, 1, 2, 2, 0) == [2, 3]
    assert rank_batch_indices(0, 0, 2, 2, 1) == [4, 5]
    assert rank_batch_indices(0, 0, 2, 2, 2) == [8, 9]
    assert rank_batch_indices(0, 1, 2, 2, 2) == [10, 11]  # spans into epoch 1
    assert rank_batch_indices(3, 1, 2, 2, 0) == [5, 6]
    assert cursor_after(0, 2, 2, 2) == 8
    assert cursor_after(3, 2, 2, 3) == 15
    assert cursor_after(0, 2, 2, 3, end_cursor=10) == 10
    assert [worker_for_batch(s, 2) for s in range(5)] == [0, 1, 0, 1, 0]
    assert worker_for_batch(5, 0) == 0
    assert next_epoch_boundary(0, 10) == 10
    assert next_epoch_boundary(9, 10) == 10
    assert next_epoch_boundary(10, 10) == 20


def test_epoch_view_tail_split() -> None:
    assert epoch_batches(0, 0, 2, 2, 10) == [[0, 1], [4, 5], [8, 9]]
    assert epoch_batches(0, 1, 2, 2, 10) == [[2, 3], [6, 7], []]
    assert epoch_batches(0, 0, 2, 2, 10, drop_last=True) == [[0, 1], [4, 5]]
    assert epoch_batches(0, 1, 2, 2, 10, drop_last=True) == [[2, 3], [6, 7]]
    assert num_batches(0, 2, 2, 10) == 3 and num_batches(0, 2, 2, 10, drop_last=True) == 2
    # R=3, B=2: one full step of 6, then a tail of 4 split 2 / 2 / 0.
    assert [epoch_batches(0, r, 3, 2, 10) for r in range(3)] == [
        [[0, 1], [6, 7]],
        [[2, 3], [8, 9]],
        [[4, 5], []],
    ]
    # Resumed mid-epoch at 7 with R=2, B=3: tail of 3 goes to rank 0 only.
    assert epoch_batches(7, 0, 2, 3, 10) == [[7, 8, 9]]
    assert epoch_batches(7, 1, 2, 3, 10) == [[]]
    assert epoch_batches(10, 0, 2, 3, 10) == []


def test_epoch_batch_is_one_batch_of_the_view_and_refuses_past_its_end() -> None:
    assert epoch_batch(0, 1, 3, 2, 10, 1) == [8, 9]
    assert epoch_batch(0, 2, 3, 2, 10, 1) == []
    with pytest.raises(DataOrderError, match="batch 2 is past the view"):
        epoch_batch(0, 0, 3, 2, 10, 2)


def test_identity_order_and_global_sample() -> None:
    order = DataOrder("ds", 0, [3, 0, 4, 3], buckets=3, shuffle=False)
    assert order.permutation(5).tolist() == list(range(10))
    assert order.global_sample(23) == (2, 3, 3)
    assert order.locate(3) == (2, 0)
    assert order.locate(9) == (3, 2)
    assert order.shard_first_use(8, 5) == [3, 0]
    assert order.next_use_distances(8, 5) == {3: 0, 0: 2}


def test_golden_values_are_stable() -> None:
    """Pinned outputs: a change here breaks exact resume of existing checkpoints."""
    perm = epoch_permutation("fp", 1, 0, 10, [3, 0, 4, 3], buckets=3)
    assert perm.tolist() == [6, 7, 9, 8, 3, 5, 4, 1, 0, 2]
    assert epoch_permutation("fp", 1, 1, 10, [10], buckets=3).tolist() == [
        8, 7, 6, 9, 5, 4, 3, 1, 2, 0,
    ]  # fmt: skip
    assert sample_seed(0, 0, 0) == 7090135488894628809
    assert loader_seed(0, 0, 0) == 4465041966467398425


# --- properties of the order ---------------------------------------------------------------


@FAST
@given(orders(), st.integers(0, 50))
def test_epoch_is_a_two_level_permutation(order: DataOrder, epoch: int) -> None:
    perm = order.permutation(epoch)
    n = order.num_samples
    assert perm.dtype == np.int64
    assert sorted(perm.tolist()) == list(range(n))
    if not order.shuffle:
        assert perm.tolist() == list(range(n))
    # Each bucket's ids occupy one contiguous run of positions (shard-aware two-level shuffle).
    starts = [b * n // order.buckets for b in range(order.buckets + 1)]
    bucket_of = np.searchsorted(starts, np.arange(n), side="right") - 1
    runs = bucket_of[perm]
    changes = 1 + int(np.count_nonzero(runs[1:] != runs[:-1]))
    assert changes == len(set(runs.tolist()))


@FAST
@given(orders(), st.integers(0, 20))
def test_order_is_deterministic_and_matches_pure_function(order: DataOrder, epoch: int) -> None:
    again = DataOrder(
        order.fingerprint,
        order.seed,
        order.shard_sizes,
        buckets=order.buckets,
        shuffle=order.shuffle,
    )
    pure = epoch_permutation(
        order.fingerprint,
        order.seed,
        epoch,
        order.num_samples,
        list(order.shard_sizes),
        order.buckets,
        order.shuffle,
    )
    first = order.permutation(epoch).copy()
    for e in range(epoch + 1, epoch + 4):  # push it out of the LRU, then recompute
        order.permutation(e)
    assert np.array_equal(order.permutation(epoch), first)
    assert np.array_equal(again.permutation(epoch), first)
    assert np.array_equal(pure, first)
    assert not order.permutation(epoch).flags.writeable


def test_seed_epoch_and_fingerprint_change_the_order() -> None:
    base = epoch_permutation("a", 0, 0, 1000, [1000], 8)
    assert not np.array_equal(base, epoch_permutation("a", 1, 0, 1000, [1000], 8))
    assert not np.array_equal(base, epoch_permutation("a", 0, 1, 1000, [1000], 8))
    assert not np.array_equal(base, epoch_permutation("b", 0, 0, 1000, [1000], 8))
    assert not np.array_equal(base, epoch_permutation("a", 0, 0, 1000, [1000], 9))


@FAST
@given(orders(), layout_st, st.integers(0, 100), st.integers(0, 12))
def test_stream_is_independent_of_world_size(
    order: DataOrder, layout: tuple[int, int, int], k0: int, steps: int
) -> None:
    world_size, batch_size, num_workers = layout
    cursors = consume(k0, world_size, batch_size, steps)
    assert cursors == list(range(k0, cursor_after(k0, world_size, batch_size, steps)))
    served = order.sample_ids(cursors)
    assert served.tolist() == order.stream(k0, len(cursors)).tolist()
    assert served.tolist() == [order.global_sample(k)[2] for k in cursors]
    # Workers split each rank's batches without overlap or gaps.
    per_worker: dict[int, list[int]] = {}
    for s in range(steps):
        per_worker.setdefault(worker_for_batch(s, num_workers), []).append(s)
    assert sorted(s for ss in per_worker.values() for s in ss) == list(range(steps))
    assert all(w < max(1, num_workers) for w in per_worker)


# --- exactly-once across a stop and a resume on another layout -------------------------------


@FAST
@given(orders(), layout_st, layout_st, st.data())
def test_resume_on_any_layout_serves_each_sample_once(
    order: DataOrder,
    before: tuple[int, int, int],
    after: tuple[int, int, int],
    data: st.DataObject,
) -> None:
    n = order.num_samples
    r1, b1, _ = before
    r2, b2, _ = after
    # Start at or just before an epoch boundary often, so stops and batches straddle it.
    k0 = max(0, data.draw(st.integers(0, 3)) * n - data.draw(st.integers(0, r1 * b1)))
    s1 = data.draw(st.integers(0, 3 * n // (r1 * b1) + 2))
    s2 = data.draw(st.integers(0, 3 * n // (r2 * b2) + 2))

    first = consume(k0, r1, b1, s1)
    saved = order.state(cursor_after(k0, r1, b1, s1)).to_dict()
    restored = OrderState.from_dict(json.loads(json.dumps(saved)))
    resumed_order = DataOrder.from_state(restored, order.shard_sizes)
    start = check_resume(restored, resumed_order.state(0)).cursor
    second = consume(start, r2, b2, s2)
    end = cursor_after(start, r2, b2, s2)

    assert first + second == list(range(k0, end))
    served = order.sample_ids(first).tolist() + resumed_order.sample_ids(second).tolist()
    assert Counter(served) == Counter(order.stream(k0, end - k0).tolist())
    # Within one epoch no sample repeats.
    for e in range(k0 // n, (end - 1) // n + 1 if end > k0 else 0):
        in_epoch = [sid for k, sid in zip(first + second, served) if k // n == e]
        assert len(in_epoch) == len(set(in_epoch))


@FAST
@given(orders(), layout_st, layout_st, st.booleans(), st.booleans(), st.data())
def test_epoch_view_resume_serves_each_sample_at_most_once(
    order: DataOrder,
    before: tuple[int, int, int],
    after: tuple[int, int, int],
    drop1: bool,
    drop2: bool,
    data: st.DataObject,
) -> None:
    n = order.num_samples
    (r1, b1, _), (r2, b2, _) = before, after
    k0 = data.draw(st.integers(0, 3 * n - 1))
    end = next_epoch_boundary(k0, n)

    def view(start: int, r: int, b: int, drop: bool, steps: int | None) -> tuple[list[int], int]:
        per_rank = [epoch_batches(start, rank, r, b, end, drop) for rank in range(r)]
        total = num_batches(start, r, b, end, drop)
        assert all(len(batches) == total for batches in per_rank)
        assert all(len(batch) <= b for batches in per_rank for batch in batches)
        steps = total if steps is None else steps
        served = [k for s in range(steps) for rank in range(r) for k in per_rank[rank][s]]
        # The loader moves the cursor to the view's end once the view is exhausted.
        cursor = end if steps == total else cursor_after(start, r, b, steps, end_cursor=end)
        return served, cursor

    s1 = data.draw(st.integers(0, num_batches(k0, r1, b1, end, drop1)))
    first, cursor = view(k0, r1, b1, drop1, s1)
    second, final = view(cursor, r2, b2, drop2, None)
    assert final == end
    served = first + second
    assert len(served) == len(set(served)) and sorted(served) == served
    missing = sorted(set(range(k0, end)) - set(served))
    if not drop1 and not drop2:
        assert missing == []
    if missing:  # only the last view's short global step can be dropped
        assert missing == list(range(end - len(missing), end))
        dropped_by = (r2, b2) if cursor < end else (r1, b1)
        assert len(missing) < dropped_by[0] * dropped_by[1]


# --- augmentation seeds ----------------------------------------------------------------------


@FAST
@given(seed_st, st.integers(0, 2**40), st.integers(0, 2**40))
def test_sample_seed_is_a_stable_63_bit_function(seed: int, epoch: int, index: int) -> None:
    value = sample_seed(seed, epoch, index)
    assert 0 <= value < 2**63
    assert value == sample_seed(seed, epoch, index)


def test_sample_seed_spreads() -> None:
    values = {sample_seed(s, e, i) for s in range(3) for e in range(3) for i in range(50)}
    assert len(values) == 450


@FAST
@given(seed_st, st.integers(0, 2**40), st.integers(0, 2**20))
def test_loader_seed_is_a_stable_63_bit_function(seed: int, epoch: int, rank: int) -> None:
    value = loader_seed(seed, epoch, rank)
    assert 0 <= value < 2**63
    assert value == loader_seed(seed, epoch, rank) != sample_seed(seed, epoch, rank)


def test_loader_seed_spreads_over_seeds_epochs_and_ranks() -> None:
    values = {loader_seed(s, e, r) for s in range(3) for e in range(10) for r in range(10)}
    assert len(values) == 300


# --- loader state and resume checks ----------------------------------------------------------


@FAST
@given(
    st.integers(0, 2**62),
    seed_st,
    st.integers(1, 10**6),
    st.text(max_size=20),
    st.booleans(),
)
def test_order_state_round_trips(
    cursor: int, seed: int, buckets: int, fingerprint: str, shuffle: bool
) -> None:
    state = OrderState(cursor, seed, buckets, fingerprint, shuffle)
    text = json.dumps(state.to_dict())
    assert len(text) < 400
    assert OrderState.from_dict(json.loads(text)) == state


def test_order_state_refuses_bad_input() -> None:
    good = OrderState(5, 1, 4, "fp").to_dict()
    with pytest.raises(DataOrderError, match="version 2"):
        OrderState.from_dict({**good, "version": 2})
    with pytest.raises(DataOrderError, match="lacks cursor"):
        OrderState.from_dict({k: v for k, v in good.items() if k != "cursor"})
    with pytest.raises(DataOrderError, match="cursor must be >= 0"):
        OrderState(-1, 1, 4, "fp")
    with pytest.raises(DataOrderError, match="buckets"):
        OrderState(0, 1, 0, "fp")


def test_check_resume_refuses_each_difference_and_names_the_override() -> None:
    saved = OrderState(123, seed=1, buckets=8, fingerprint="ds-a", shuffle=True)
    same = OrderState(0, seed=1, buckets=8, fingerprint="ds-a", shuffle=True)
    assert check_resume(saved, same) == saved

    with pytest.raises(DataOrderError, match="seed differs.*allow_seed_change=True"):
        check_resume(saved, OrderState(0, 2, 8, "ds-a"))
    with pytest.raises(DataOrderError, match="fingerprint differs.*allow_dataset_change=True"):
        check_resume(saved, OrderState(0, 1, 8, "ds-b"))
    with pytest.raises(DataOrderError, match="bucket count differs.*set buckets=8"):
        check_resume(saved, OrderState(0, 1, 16, "ds-a"))
    with pytest.raises(DataOrderError, match="shuffle differs.*set shuffle=True"):
        check_resume(saved, OrderState(0, 1, 8, "ds-a", shuffle=False))
    with pytest.raises(ValueError, match="seed differs.*fingerprint|fingerprint.*seed differs"):
        check_resume(saved, OrderState(0, 2, 8, "ds-b"))
    # An allowed change of one thing still refuses the other.
    with pytest.raises(DataOrderError, match="fingerprint differs"):
        check_resume(saved, OrderState(0, 2, 8, "ds-b"), allow_seed_change=True)

    moved = check_resume(
        saved, OrderState(0, 2, 8, "ds-b"), allow_seed_change=True, allow_dataset_change=True
    )
    assert moved == OrderState(123, 2, 8, "ds-b")


def test_agreed_cursor() -> None:
    assert agreed_cursor([7, 7, 7]) == 7
    with pytest.raises(DataOrderError, match="rank 1: 9"):
        agreed_cursor([7, 9])
    with pytest.raises(DataOrderError):
        agreed_cursor([])


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(DataOrderError, match="sum to 7"):
        epoch_permutation("fp", 0, 0, 8, [3, 4], 2)
    with pytest.raises(DataOrderError, match="no samples"):
        DataOrder("fp", 0, [0, 0], buckets=2)
    with pytest.raises(DataOrderError, match="rank 2 is not below world_size 2"):
        rank_batch_indices(0, 2, 2, 4, 0)
    with pytest.raises(DataOrderError, match="k must be >= 0"):
        DataOrder("fp", 0, [4], buckets=2).global_sample(-1)
    with pytest.raises(DataOrderError, match="must be an int"):
        cursor_after(0, 2, 2.0, 1)  # type: ignore[arg-type]


# --- what the shard cache asks ---------------------------------------------------------------


@FAST
@given(orders(), st.integers(0, 200), st.integers(0, 120))
def test_shard_first_use_matches_brute_force(order: DataOrder, cursor: int, horizon: int) -> None:
    shards = [order.locate(int(i))[0] for i in order.stream(cursor, horizon)]
    expected: dict[int, int] = {}
    for d, shard in enumerate(shards):
        expected.setdefault(shard, d)
    assert order.shard_first_use(cursor, horizon) == list(expected)
    assert order.next_use_distances(cursor, horizon) == expected
    for shard, size in enumerate(order.shard_sizes):
        assert order.next_use_distance(shard, cursor, horizon) == expected.get(shard)
        if size == 0:
            assert shard not in expected
    if horizon >= 2 * order.num_samples:
        assert sorted(expected) == [s for s, size in enumerate(order.shard_sizes) if size]


def test_million_sample_lookahead_is_fast_enough() -> None:
    order = DataOrder("big", 3, [1000] * 1000, buckets=64)
    first = order.shard_first_use(999_000, 10**7)  # horizon is clipped to ~2 epochs
    assert sorted(first) == list(range(1000))
    assert order.next_use_distance(first[-1], 999_000, 10**7) == max(
        order.next_use_distances(999_000, 10**7).values()
    )
