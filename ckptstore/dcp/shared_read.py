"""Read-once restore: a range several ranks need is read from the store by one of them and
sent to the others over the process group (on N ranks a plain DCP load of replicated
state has the store serve it N times).

``read_shared`` (a collective: ``CkptReader.read_data`` calls it on every rank) gathers
each rank's ranges, lets ``engine.read_owners`` pick one owner per shared range, and runs
the batches as a pipeline: while batch i is exchanged and delivered, its owners read batch
i+1 on a worker thread (the collectives stay on the caller's), straight into the buffer
they send (one per owner and set of needing ranks: no packed copy), each range checked
against its CRC32C (a mismatch read again once). Every rank learns whether any owner
failed before a batch moves (then all raise); a buffer goes out as one broadcast when
every rank needs it, else as sends, and ``deliver`` checks each range again. Memory: two
batches of ``budget`` bytes at most (half batches would halve each read's GETs in flight,
undoing the overlap: measured). A rank that dies fails the others' collectives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ckptstore.engine.read_owners import Key, SharePlan, plan_shares
from ckptstore.errors import CkptStoreError, CorruptCheckpointError

__all__ = ["read_shared"]


@dataclass
class _Part:
    """The ranges of one batch that one owner sends to one set of ranks, in one buffer."""

    owner: int
    needers: tuple[int, ...]
    keys: list[Key]
    buf: torch.Tensor


def read_shared(
    group: Any,
    keys: Sequence[Key],
    budget: int,
    read_into: Callable[[list[Key], memoryview], None],
    deliver: Callable[[Key, Any], None],
) -> set[Key]:
    """Deliver this rank's ``keys`` (its ranges, in load order) that other ranks need too;
    the keys delivered. ``read_into(keys, buf)`` fills ``buf`` with the checked bytes of
    ``keys``, one after another (raising ``CkptStoreError`` for a range it cannot read or
    check; it runs on a worker thread); ``deliver`` checks and hands one range to the load.
    A collective over ``group``: every rank calls it once per load."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    needs: list[Any] = [None] * world
    dist.all_gather_object(needs, list(keys), group=group)
    plan = plan_shares(needs, budget)
    failed: CkptStoreError | None = None  # a range this rank read or received did not check
    ahead: tuple[list[_Part], Future[None] | None] | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="ckptstore-share") as pool:
        try:
            for i in range(len(plan.batches)):
                parts, reading = ahead or _start(pool, plan, i, rank, read_into)
                ahead = None
                if reading is not None:
                    try:
                        reading.result()
                    except CkptStoreError as exc:
                        failed = exc
                _agree(group, world, failed)
                if i + 1 < len(plan.batches):  # read the next batch while this one moves
                    ahead = _start(pool, plan, i + 1, rank, read_into)
                for key, got in _exchange(group, parts, rank, world):
                    if failed is None:
                        try:
                            deliver(key, got)
                        except CkptStoreError as exc:
                            failed = exc
            if plan.batches:
                _agree(group, world, failed)
        finally:
            if ahead is not None and ahead[1] is not None:
                ahead[1].cancel()  # not started: never reads; else the pool waits for it
    return set(keys) & set(plan.owners)


def _start(
    pool: ThreadPoolExecutor,
    plan: SharePlan,
    index: int,
    rank: int,
    read_into: Callable[[list[Key], memoryview], None],
) -> tuple[list[_Part], Future[None] | None]:
    """The buffers of batch ``index`` this rank sends or receives, and the read (on
    ``pool``) filling those it owns (None if it owns none)."""
    groups: dict[tuple[int, tuple[int, ...]], list[Key]] = {}
    for key in plan.batches[index]:
        groups.setdefault((plan.owners[key], plan.needers[key]), []).append(key)
    parts = [
        _Part(owner, needers, keys, torch.empty(sum(k[2] for k in keys), dtype=torch.uint8))
        for (owner, needers), keys in groups.items()
        if rank in needers  # the owner is one of the ranks that need the range
    ]
    owned = [p for p in parts if p.owner == rank]
    if not owned:
        return parts, None

    def read() -> None:
        for part in owned:
            read_into(part.keys, part.buf.numpy().data.cast("B"))

    return parts, pool.submit(read)


def _agree(group: Any, world: int, error: CkptStoreError | None) -> None:
    """Raise on every rank if any rank met an error (``error``: this rank's, raised
    here as it is; the others raise one naming the rank)."""
    errors: list[Any] = [None] * world
    dist.all_gather_object(errors, str(error) if error else None, group=group)
    if error is not None:
        raise error
    for other, message in enumerate(errors):
        if message:
            raise CorruptCheckpointError(
                f"rank {other} could not read or check a range it shares with this rank: {message}"
            )


def _exchange(
    group: Any, parts: list[_Part], rank: int, world: int
) -> Iterator[tuple[Key, memoryview]]:
    """Move each part's buffer from its owner to the ranks that need it (every rank of
    the group runs the same broadcasts; the others are sends); each range with its bytes."""
    for part in parts:
        if len(part.needers) == world:
            dist.broadcast(part.buf, group_src=part.owner, group=group)
        elif rank == part.owner:
            works = [
                dist.isend(part.buf, group_dst=r, group=group) for r in part.needers if r != rank
            ]
            for w in works:
                if w is not None:
                    w.wait()
        else:
            dist.recv(part.buf, group_src=part.owner, group=group)
        mem = part.buf.numpy().data.cast("B")
        at = 0
        for key in part.keys:
            yield key, mem[at : at + key[2]]
            at += key[2]
