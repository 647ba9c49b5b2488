"""``engine.read_owners.plan_nodes``: which rank holds a shared part on each node, whether
a node moves parts through shared memory, and whom the owner sends to (pure)."""

from __future__ import annotations

from ckptstore.engine.read_owners import Key, plan_nodes, plan_shares

SHARED: list[Key] = [("a", i * 100, 100) for i in range(8)]
BUDGET = 200  # four batches of two ranges
ROOM = 2 * BUDGET  # two batches in flight


def test_one_node_with_room_shares_every_part_through_its_owners_segment() -> None:
    plan = plan_shares([SHARED] * 4, BUDGET)
    nodes = plan_nodes(["host"] * 4, [ROOM] * 4, plan)
    assert nodes.node == (0, 0, 0, 0) and nodes.shm == (True,)
    for key, owner in plan.owners.items():
        needers = plan.needers[key]
        assert nodes.holder(owner, needers, 0) == owner and nodes.segment(needers, 0)
        assert nodes.receivers(owner, needers) == []  # nothing over the process group


def test_a_node_without_room_for_two_batches_moves_parts_over_the_group() -> None:
    plan = plan_shares([SHARED] * 3, BUDGET)
    nodes = plan_nodes(["host"] * 3, [ROOM, ROOM - 1, ROOM], plan)  # 64 MiB /dev/shm, say
    assert nodes.shm == (False,)
    for key, owner in plan.owners.items():
        assert nodes.receivers(owner, plan.needers[key]) == [r for r in range(3) if r != owner]


def test_a_range_larger_than_the_budget_needs_room_for_itself_and_the_next_batch() -> None:
    needs = [[("big", 0, 1000), *SHARED[:2]]] * 2
    plan = plan_shares(needs, BUDGET)
    assert not plan_nodes(["h", "h"], [ROOM] * 2, plan).shm[0]
    assert plan_nodes(["h", "h"], [1200] * 2, plan).shm[0]


def test_two_nodes_the_owner_sends_once_to_the_other_nodes_lowest_needer() -> None:
    plan = plan_shares([SHARED] * 4, BUDGET)
    nodes = plan_nodes(["n0", "n0", "n1", "n1"], [ROOM] * 4, plan)
    assert nodes.node == (0, 0, 1, 1) and nodes.shm == (True, True)
    for key, owner in plan.owners.items():
        needers = plan.needers[key]
        other = 1 - nodes.node[owner]
        holder = nodes.holder(owner, needers, other)
        assert holder == 2 * other  # the lowest needing rank there
        assert nodes.holder(owner, needers, nodes.node[owner]) == owner
        assert nodes.receivers(owner, needers) == [holder]


def test_one_needer_on_a_node_or_no_shared_memory_gets_the_bytes_itself() -> None:
    # ranks 0, 1 on n0 need everything; rank 2 alone on n1 needs it too; rank 3 has no /dev/shm
    plan = plan_shares([SHARED] * 4, BUDGET)
    nodes = plan_nodes(["n0", "n0", "n1", None], [ROOM] * 4, plan)
    assert nodes.node == (0, 0, 1, 2) and nodes.shm == (True, False, False)
    key = next(k for k, r in plan.owners.items() if r == 0)
    assert nodes.receivers(0, plan.needers[key]) == [2, 3]
    key = next(k for k, r in plan.owners.items() if r == 2)
    assert nodes.holder(2, plan.needers[key], 0) == 0
    assert nodes.receivers(2, plan.needers[key]) == [0, 3]  # 1 maps what 0 received


def test_ranges_one_rank_needs_make_no_node_use_shared_memory() -> None:
    plan = plan_shares([[("own0", 0, 10)], [("own1", 0, 10)]], BUDGET)
    assert plan_nodes(["h", "h"], [ROOM] * 2, plan).shm == (False,)
