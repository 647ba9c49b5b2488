"""The peer tier's placement and copy plan (``tier.replicas``): pure functions."""

from __future__ import annotations

import pytest

from ckptstore.errors import ConfigError
from ckptstore.tier.replicas import (
    Copy,
    check_replicas,
    copy_rounds,
    plan_copies,
    replica_wants,
    ring_targets,
    tier_peaks,
)
from ckptstore.tier.rules import evictions


def test_ring_targets_never_the_node_itself_and_at_most_the_other_nodes() -> None:
    assert ring_targets(0, 4, 1) == [1]
    assert ring_targets(3, 4, 2) == [0, 1]
    assert ring_targets(1, 2, 3) == [0]  # only one other node
    assert ring_targets(0, 1, 1) == []
    for n in range(1, 6):
        for k in range(0, 6):
            for i in range(n):
                targets = ring_targets(i, n, k)
                assert i not in targets and len(set(targets)) == len(targets) == min(k, n - 1)


def test_wants_are_own_files_and_the_predecessors() -> None:
    own = [{"a"}, {"b"}, {"c"}]
    assert replica_wants(own, 1) == [{"a", "c"}, {"a", "b"}, {"b", "c"}]
    assert replica_wants(own, 2) == [{"a", "b", "c"}] * 3
    assert replica_wants(own, 0) == own


def test_a_replaced_node_draws_from_every_holder_evenly() -> None:
    sizes = {f"f{i}": 10 for i in range(6)}
    every = set(sizes)
    copies, missing = plan_copies(sizes, [every, set(), every], [every] * 3)
    assert not any(missing)
    assert {c.dst for c in copies} == {1} and {c.name for c in copies} == every
    sent = [sum(c.size for c in copies if c.src == s) for s in (0, 2)]
    assert sent == [30, 30]


def test_files_no_node_holds_are_missing_for_exactly_the_nodes_that_want_them() -> None:
    sizes = {"a": 1, "b": 2, "c": 3}
    holds = [{"a", "c"}, set(), set()]  # nodes 1 and 2 lost; "b" was only on them
    copies, missing = plan_copies(sizes, holds, [set(sizes)] * 3)
    assert missing == [{"b"}, {"b"}, {"b"}]
    assert sorted(copies, key=lambda c: (c.dst, c.name)) == [
        Copy("a", 1, 0, 1),
        Copy("c", 3, 0, 1),
        Copy("a", 1, 0, 2),
        Copy("c", 3, 0, 2),
    ]


def test_the_plan_is_the_same_whatever_the_order_sets_iterate_in() -> None:
    sizes = {f"f{i}": i + 1 for i in range(20)}
    holds = [set(list(sizes)[:10]), set(list(sizes)[10:]), set()]
    first = plan_copies(sizes, holds, [set(sizes)] * 3)
    again = plan_copies(dict(reversed(sizes.items())), [set(h) for h in holds], [set(sizes)] * 3)
    assert first == again


@pytest.mark.parametrize("bad", [-1, 1.5, True, "1", None])
def test_replicas_must_be_a_whole_number(bad: object) -> None:
    with pytest.raises(ConfigError, match="replicas must be a whole number"):
        check_replicas(bad)


def test_a_tiers_peak_is_its_step_with_replicas_plus_the_next_saves_own_shards() -> None:
    sizes = {"a": 100, "b": 10, "c": 1}
    own = [{"a"}, {"b"}, {"c"}]
    wants = replica_wants(own, 1)  # node 0 also holds c, node 1 a, node 2 b
    assert tier_peaks(sizes, own, wants) == [201, 120, 12]
    assert tier_peaks(sizes, own, own) == [200, 20, 2]  # no replicas: 2 x own


def test_rounds_let_each_node_send_and_receive_one_file_at_a_time() -> None:
    sizes = {f"n{i}f{j}": 1 for i in range(4) for j in range(2)}
    own = [{f"n{i}f0", f"n{i}f1"} for i in range(4)]
    copies, _ = plan_copies(sizes, own, replica_wants(own, 1))
    rounds = copy_rounds(copies)
    assert len(rounds) == 2  # a ring: every node sends its two files, one per round
    assert sorted((c for r in rounds for c in r), key=str) == sorted(copies, key=str)
    for r in rounds:
        assert len({c.src for c in r}) == len({c.dst for c in r}) == len(r)
    one = [Copy(f"f{i}", 1, i % 3, 3) for i in range(6)]  # node 3 receives all six
    assert [len(r) for r in copy_rounds(one)] == [1] * 6


def test_evictions_take_the_oldest_steps_until_the_newest_fits() -> None:
    others = {1: 30, 2: 30, 3: 30}
    assert evictions(others, need=50, limit=100) == [1, 2]
    assert evictions(others, need=40, limit=100) == [1]
    assert evictions(others, need=10, limit=100) == []
    assert evictions(others, need=200, limit=100) == [1, 2, 3]  # never more than them
    assert evictions({}, need=200, limit=100) == []
