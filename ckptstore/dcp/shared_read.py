"""Read-once restore: a range several ranks need is read from the store by one of them and
shared with the others: through a shared-memory segment within a node, over the process
group across nodes (on N ranks a plain DCP load of replicated state reads it N times).

``read_shared`` (a collective: ``CkptReader.read_data`` calls it on every rank) gathers
each rank's ranges and node (``dcp.node_segments``), lets ``engine.read_owners`` pick one
owner per shared range and one holder per part and node, and runs the batches as a
pipeline: the owners read batch i+1 on a worker thread while batch i is read (its GETs
queue behind batch i's), moves and is delivered (the collectives stay on the caller's
thread); each reads straight into the buffer it shares (a
segment where the node maps one), each range checked against its CRC32C (a mismatch read
again once). Every rank learns whether any owner failed before a batch moves (then all
raise); the owner sends once to each other node's holder (a broadcast when every rank
receives); a node's other needers map the holder's segment, and ``deliver`` checks each
range again. Memory: two batches of ``budget`` bytes at most. A dead rank fails the
others' collectives; the segments it leaves are swept by the next load on its node.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from ckptstore.dcp import node_segments
from ckptstore.engine.read_owners import Key, NodePlan, SharePlan, plan_nodes, plan_shares
from ckptstore.errors import CkptStoreError, CorruptCheckpointError

__all__ = ["read_shared"]


@dataclass
class _Part:
    """The ranges of one batch that one owner shares with one set of ranks, in one buffer
    (``buf``: this rank's; None where it maps the holder's segment at ``path``)."""

    owner: int
    needers: tuple[int, ...]
    keys: list[Key]
    buf: torch.Tensor | None
    path: str | None
    late: bool  # a holder received it: its node maps it after the barrier that follows


@dataclass
class _Batch:
    """This rank's parts of one batch, the read filling those it owns, the segments it
    made (or the error making them) and whether a barrier follows the batch's moves."""

    parts: list[_Part] = field(default_factory=list)
    reading: Future[None] | None = None
    made: list[str] = field(default_factory=list)
    error: CkptStoreError | None = None
    barrier: bool = False


@dataclass(frozen=True)
class _Load:
    """What every rank agreed on in the gather."""

    group: Any
    rank: int
    world: int
    plan: SharePlan
    nodes: NodePlan
    token: str
    creators: list[str]


def read_shared(
    group: Any,
    keys: Sequence[Key],
    budget: int,
    read_into: Callable[[list[Key], memoryview, bool], None],
    deliver: Callable[[Key, Any], None],
) -> set[Key]:
    """Deliver this rank's ``keys`` (its ranges, in load order) that other ranks need too;
    the keys delivered. ``read_into(keys, buf, first)`` fills ``buf`` with the checked bytes
    of ``keys``, one after another (raising ``CkptStoreError`` for a range it cannot read
    or check; it runs on a worker thread; ``first``: the keys are of the first batch, which
    should land soon); ``deliver`` checks and hands one range to the load.
    A collective over ``group``: every rank calls it once per load."""
    world = dist.get_world_size(group)
    node_segments.sweep()
    mine = (
        list(keys),
        node_segments.node_key(),
        node_segments.free_bytes(),
        node_segments.creator(),
        secrets.token_hex(8),
    )
    got: list[Any] = [None] * world
    dist.all_gather_object(got, mine, group=group)
    plan = plan_shares([g[0] for g in got], budget)
    nodes = plan_nodes([g[1] for g in got], [g[2] for g in got], plan)
    load = _Load(group, dist.get_rank(group), world, plan, nodes, got[0][4], [g[3] for g in got])
    failed: CkptStoreError | None = None  # a range this rank read or received did not check
    made: list[list[str]] = []  # the segments this rank made, per batch, until unlinked
    ahead: _Batch | None = None
    with ThreadPoolExecutor(2, thread_name_prefix="ckptstore-share") as pool:
        try:
            for i in range(len(plan.batches)):
                if ahead is None:
                    ahead = _start(pool, load, i, read_into)
                    made.append(ahead.made)
                batch, ahead = ahead, None
                if i + 1 < len(plan.batches):  # read the next batch while this one is read
                    ahead = _start(pool, load, i + 1, read_into)  # (its GETs queue behind)
                    made.append(ahead.made)  # and moves
                failed = failed or batch.error
                if batch.reading is not None:
                    try:
                        batch.reading.result()
                    except CkptStoreError as exc:
                        failed = exc
                _agree(group, world, failed)
                _unlink(made[:i])  # up to batch i-1's: every needer mapped them before this
                for part in _exchange(load, batch):
                    if failed is None:
                        try:
                            mem, at = _bytes_of(part), 0
                            for key in part.keys:
                                deliver(key, mem[at : at + key[2]])
                                at += key[2]
                        except CkptStoreError as exc:
                            failed = exc
            if plan.batches:
                _agree(group, world, failed)
        finally:
            if ahead is not None and ahead.reading is not None:
                ahead.reading.cancel()  # not started: never reads; else the pool waits for it
            _unlink(made)
    return set(keys) & set(plan.owners)


def _start(
    pool: ThreadPoolExecutor,
    load: _Load,
    index: int,
    read_into: Callable[[list[Key], memoryview, bool], None],
) -> _Batch:
    """The parts of batch ``index`` this rank shares: their buffers (segments it holds
    made here) and the read (on ``pool``) filling those it owns."""
    groups: dict[tuple[int, tuple[int, ...]], list[Key]] = {}
    for key in load.plan.batches[index]:
        groups.setdefault((load.plan.owners[key], load.plan.needers[key]), []).append(key)
    nodes, node, out = load.nodes, load.nodes.node[load.rank], _Batch()
    for j, ((owner, needers), keys) in enumerate(groups.items()):
        other_holders = [
            n
            for n in {nodes.node[r] for r in needers}
            if nodes.node[owner] != n and nodes.segment(needers, n)
        ]
        out.barrier = out.barrier or bool(other_holders)
        if load.rank not in needers:  # the owner is one of the ranks that need the range
            continue
        size = sum(k[2] for k in keys)
        holder = nodes.holder(owner, needers, node)
        path = None
        buf: torch.Tensor | None = torch.empty(size, dtype=torch.uint8)
        if nodes.segment(needers, node):
            path = node_segments.segment_name(load.token, load.creators[holder], index, j)
            buf = None
            if holder == load.rank and out.error is None:
                try:
                    buf = node_segments.create(path, size)
                    out.made.append(path)
                except CkptStoreError as exc:
                    out.error = exc  # reported in the batch's agreement, on every rank
        out.parts.append(
            _Part(owner, needers, keys, buf, path, path is not None and holder != owner)
        )
    owned = [p for p in out.parts if p.owner == load.rank]
    if owned and out.error is None:

        def read() -> None:
            for part in owned:
                assert part.buf is not None  # an owner holds its part on its node
                read_into(part.keys, part.buf.numpy().data.cast("B"), index == 0)

        out.reading = pool.submit(read)
    return out


def _agree(group: Any, world: int, error: CkptStoreError | None) -> None:
    """Raise on every rank if any rank met an error (``error``: this rank's, raised
    here as it is; the others raise one naming the rank: ``CorruptCheckpointError`` if it
    is one, else ``CkptStoreError``)."""
    errors: list[Any] = [None] * world
    mine = (isinstance(error, CorruptCheckpointError), str(error)) if error else None
    dist.all_gather_object(errors, mine, group=group)
    if error is not None:
        raise error
    for other, got in enumerate(errors):
        if got and got[0]:
            raise CorruptCheckpointError(
                f"rank {other} could not read or check a range it shares with this rank: {got[1]}"
            )
        if got:  # e.g. no room for a segment in its /dev/shm: not the checkpoint's fault
            raise CkptStoreError(f"rank {other} could not share its part of the load: {got[1]}")


def _exchange(load: _Load, batch: _Batch) -> Iterator[_Part]:
    """Move each part's buffer from its owner to the ranks it sends to (every rank of the
    group runs the same broadcasts and barrier; the rest are sends); each part once this
    rank can read it: at once, or for a segment a holder received, after the barrier."""
    group, rank = load.group, load.rank
    later: list[_Part] = []
    for part in batch.parts:
        receivers = load.nodes.receivers(part.owner, part.needers)
        if part.buf is None and part.late:  # the node's holder is receiving it
            later.append(part)
            continue
        if part.buf is None:  # the node's holder read it: mapped now
            yield part
            continue
        if len(receivers) + 1 == load.world:
            dist.broadcast(part.buf, group_src=part.owner, group=group)
        elif rank == part.owner:
            works = [dist.isend(part.buf, group_dst=r, group=group) for r in receivers]
            for w in works:
                if w is not None:
                    w.wait()
        elif rank in receivers:
            dist.recv(part.buf, group_src=part.owner, group=group)
        yield part
    if batch.barrier:
        dist.barrier(group=group)
        yield from later


def _bytes_of(part: _Part) -> memoryview:
    """The part's bytes: this rank's buffer, or the holder's segment mapped read-only. The
    mapping is never closed here: it goes when the last reference to it does (a range
    ``deliver`` kept would otherwise point at unmapped memory; closing with views alive
    raises ``BufferError``)."""
    if part.buf is not None:
        return part.buf.numpy().data.cast("B")
    assert part.path is not None
    return memoryview(node_segments.open_view(part.path, sum(k[2] for k in part.keys)))


def _unlink(batches: list[list[str]]) -> None:
    """Unlink the segments of ``batches`` (this rank's; their mappings stay valid)."""
    for paths in batches:
        for path in paths:
            node_segments.unlink(path)
        paths.clear()
