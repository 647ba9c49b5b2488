"""Read-once restore: a range several ranks need is read from the store by one of them and
sent to the others over the process group.

On N ranks a DCP load of replicated state (DDP, HSDP's replicated dimensions, their
optimizer state) has every rank read every byte: the store serves the model N times.
``read_shared`` (called by ``CkptReader.read_data`` on every rank of the group: a
collective) gathers each rank's ranges, lets ``engine.read_owners`` pick one owner per
shared range (spread by bytes over the ranks that need it), and runs the batches: each
owner reads its ranges of the batch and checks them against the manifest's CRC32C (a
mismatch is read again once), every rank learns whether any owner failed (then every rank
raises, naming the owner and the range), and each owner's bytes go to the ranks that need
them (one broadcast when every rank does, else sends to each), packed per owner. A
receiver hands what it got to ``deliver``, which checks the CRC32C again before anything
reaches a tensor. At most one batch (``budget`` bytes) is held per rank; ranges one rank
needs alone are left to the caller. A rank that dies mid-exchange fails the group's
collectives on the others (gloo raises when the peer's connection closes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from ckptstore.engine.read_owners import Key, SharePlan, plan_shares
from ckptstore.errors import CkptStoreError, CorruptCheckpointError

__all__ = ["read_shared"]


def read_shared(
    group: Any,
    keys: Sequence[Key],
    budget: int,
    read: Callable[[list[Key]], dict[Key, Any]],
    deliver: Callable[[Key, Any], None],
) -> set[Key]:
    """Deliver this rank's ``keys`` (its ranges, in load order) that other ranks need too;
    the keys delivered. ``read`` returns the checked bytes of the ranges given (raising
    ``CkptStoreError`` for one it cannot); ``deliver`` checks and hands one range to the
    load. A collective over ``group``: every rank calls it once per load."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    needs: list[Any] = [None] * world
    dist.all_gather_object(needs, list(keys), group=group)
    plan = plan_shares(needs, budget)
    mine = set(keys)
    failed: CkptStoreError | None = None  # a range this rank received did not check
    for batch in plan.batches:
        owned = [k for k in batch if plan.owners[k] == rank]
        data: dict[Key, Any] = {}
        if failed is None and owned:
            try:
                data = read(owned)
            except CkptStoreError as exc:
                failed = exc
        _agree(group, world, failed)
        for key, got in _exchange(group, plan, batch, data, rank, world):
            if failed is None:
                try:
                    deliver(key, got)
                except CkptStoreError as exc:
                    failed = exc
    if plan.batches:
        _agree(group, world, failed)
    return mine & set(plan.owners)


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
    group: Any,
    plan: SharePlan,
    batch: tuple[Key, ...],
    data: dict[Key, Any],
    rank: int,
    world: int,
) -> list[tuple[Key, Any]]:
    """Send ``batch``'s ranges from their owners to the ranks that need them, packed per
    (owner, needing ranks); the ranges this rank needs, with their bytes."""
    groups: dict[tuple[int, tuple[int, ...]], list[Key]] = {}
    for key in batch:
        groups.setdefault((plan.owners[key], plan.needers[key]), []).append(key)
    out: list[tuple[Key, Any]] = []
    for (owner, needers), keys in groups.items():
        if rank != owner and rank not in needers and len(needers) != world:
            continue
        size = sum(k[2] for k in keys)
        if rank == owner:
            buf = torch.empty(size, dtype=torch.uint8)
            view = buf.numpy()
            at = 0
            for key in keys:
                view[at : at + key[2]] = memoryview(data[key]).cast("B")
                at += key[2]
        else:
            buf = torch.empty(size, dtype=torch.uint8)
        if len(needers) == world:
            dist.broadcast(buf, group_src=owner, group=group)
        elif rank == owner:
            works = [dist.isend(buf, group_dst=r, group=group) for r in needers if r != owner]
            for w in works:
                if w is not None:
                    w.wait()
        else:
            dist.recv(buf, group_src=owner, group=group)
        if rank in needers:
            mem = buf.numpy().data.cast("B")
            at = 0
            for key in keys:
                out.append((key, mem[at : at + key[2]]))
                at += key[2]
    return out
