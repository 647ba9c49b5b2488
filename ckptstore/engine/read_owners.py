"""Which rank reads each stored range that several ranks need, and in what batches.

Pure functions (no I/O, no process group): ``ckptstore.dcp.shared_read`` gathers every
rank's ranges and runs the reads and sends these return, the same on every rank.

A range one rank needs alone is read by that rank. A range several ranks need (the
replicated state of DDP, HSDP's replicated dimensions) gets one owner among them, chosen
greedily by bytes (largest range first, to the needing rank with the fewest bytes to read
so far, counting its ranges of its own) so that the store serves each byte once and every
rank reads about as much. The shared ranges are cut into batches of at most ``budget``
bytes, in the order the ranks listed them (the load's own order), so that a rank holds at
most one batch in memory and the first items arrive first; the first batch is small
(``first_batch``), so that the first items are not held back until a whole budget's worth
is read.

``plan_nodes`` groups the ranks into nodes (those that share one shared-memory directory)
and says, per shared part and node, which rank *holds* it there (the owner on its own
node, else the node's lowest needing rank), whether the holder's buffer is a segment the
node's other needers map (the node has room for two batches of them and >1 needer of the
part), and so which ranks the owner sends to over the process group.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

__all__ = ["Key", "NodePlan", "SharePlan", "first_batch", "plan_nodes", "plan_shares"]

#: A stored range: (file, offset, length), as DCP's ``.metadata`` names an item.
Key = tuple[str, int, int]


@dataclass(frozen=True)
class SharePlan:
    """The ranges several ranks need: each with its owner (a rank) and the ranks that need
    it, in batches of at most the budget's bytes (a range larger than it is a batch alone)."""

    owners: dict[Key, int]
    needers: dict[Key, tuple[int, ...]]
    batches: tuple[tuple[Key, ...], ...]

    def owned_by(self, rank: int) -> list[Key]:
        """The shared ranges ``rank`` reads."""
        return [k for k, r in self.owners.items() if r == rank]

    def read_bytes(self, needs: Sequence[Sequence[Key]]) -> list[int]:
        """The bytes each rank reads from the store under this plan (``needs``: what each
        rank needs)."""
        out = [sum(k[2] for k in set(keys) if k not in self.owners) for keys in needs]
        for key, rank in self.owners.items():
            out[rank] += key[2]
        return out


#: The first batch holds about this share of the shared bytes (``first_batch``).
FIRST_BATCH_SHARE = 16

#: ... but never less than this (a few GETs' worth), nor more than the budget.
MIN_FIRST_BATCH = 4 * 1024 * 1024


def first_batch(total: int, budget: int, min_first: int = MIN_FIRST_BATCH) -> int:
    """The bytes of the first batch of ``total`` shared bytes: 1/``FIRST_BATCH_SHARE`` of
    them, within ``[min_first, budget]``; the batches after it hold up to ``budget``. A
    batch is delivered once it is wholly read, so a first batch of the whole budget would
    hold every item back until the last of them is read: a small one lands early, and is
    moved while the owners read the next. Measured on the shaped link (256 MiB, 16 ranges,
    1-4 ranks): a ramp doubling each batch instead cost 0.4 s at 2 ranks (each small batch
    used few of the connections, one batch read at a time)."""
    return max(1, min(budget, max(min_first, -(-total // FIRST_BATCH_SHARE))))


def plan_shares(needs: Sequence[Sequence[Key]], budget: int) -> SharePlan:
    """The owners and batches of the ranges that two ranks or more of ``needs`` (each
    rank's ranges, in its load order) ask for; ``budget``: the most bytes of one batch
    (the first holds ``first_batch``'s)."""
    needers: dict[Key, list[int]] = {}
    order: list[Key] = []
    for rank, keys in enumerate(needs):
        for key in keys:
            if key not in needers:
                needers[key] = []
                order.append(key)
            if not needers[key] or needers[key][-1] != rank:
                needers[key].append(rank)
    shared = [k for k in order if len(needers[k]) > 1]
    load = [0] * len(needs)
    for key in order:
        if len(needers[key]) == 1:
            load[needers[key][0]] += key[2]
    owners: dict[Key, int] = {}
    for key in sorted(shared, key=lambda k: (-k[2], k)):
        rank = min(needers[key], key=lambda r: (load[r], r))
        owners[key] = rank
        load[rank] += key[2]
    batches: list[tuple[Key, ...]] = []
    batch: list[Key] = []
    held = 0
    cap = first_batch(sum(k[2] for k in shared), budget)
    for key in shared:
        if batch and held + key[2] > cap:
            batches.append(tuple(batch))
            batch, held, cap = [], 0, budget
        batch.append(key)
        held += key[2]
    if batch:
        batches.append(tuple(batch))
    return SharePlan(owners, {k: tuple(needers[k]) for k in shared}, tuple(batches))


@dataclass(frozen=True)
class NodePlan:
    """Which node each rank is on (``node``: an index per rank) and whether a node's parts
    with several needers there move through shared memory (``shm``: one flag per node)."""

    node: tuple[int, ...]
    shm: tuple[bool, ...]

    def holder(self, owner: int, needers: Sequence[int], node: int) -> int:
        """The rank of ``node`` that holds the part ``owner`` sends to ``needers``."""
        if self.node[owner] == node:
            return owner
        return min(r for r in needers if self.node[r] == node)

    def segment(self, needers: Sequence[int], node: int) -> bool:
        """Whether the part's holder on ``node`` keeps it in a segment its node maps."""
        return self.shm[node] and sum(self.node[r] == node for r in needers) > 1

    def receivers(self, owner: int, needers: Sequence[int]) -> list[int]:
        """The ranks the owner sends the part to over the process group: each other
        node's holder where that node maps a segment, else every needer but the owner."""
        out = []
        for r in needers:
            node = self.node[r]
            if r == owner or (
                self.segment(needers, node) and r != self.holder(owner, needers, node)
            ):
                continue
            out.append(r)
        return out


def plan_nodes(
    node_keys: Sequence[Hashable | None],
    free: Sequence[int],
    plan: SharePlan,
) -> NodePlan:
    """The nodes of the ranks (``node_keys``: one per rank, equal on one node; None: a rank
    alone) and whether each moves parts through shared memory: only when it has >1 needer
    of some part and each of its ranks sees ``free`` bytes (of its shared-memory directory)
    for the two largest consecutive batches of segments (a batch moves while the next is read)."""
    index: dict[Hashable, int] = {}
    node = []
    for rank, key in enumerate(node_keys):
        node.append(index.setdefault(("rank", rank) if key is None else ("node", key), len(index)))
    every = NodePlan(tuple(node), (True,) * len(index))
    held = [[0] * len(plan.batches) for _ in index]  # segment bytes per node and batch
    for i, batch in enumerate(plan.batches):
        for key in batch:
            needers = plan.needers[key]
            for n in {node[r] for r in needers}:
                if every.segment(needers, n):
                    held[n][i] += key[2]
    room = [min(f for r, f in enumerate(free) if node[r] == n) for n in range(len(index))]
    shm = tuple(
        any(held[n]) and room[n] >= max(a + b for a, b in zip(held[n], held[n][1:] + [0]))
        for n in range(len(index))
    )
    return NodePlan(tuple(node), shm)
