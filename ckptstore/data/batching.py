"""Assignment of the global sample stream to ranks, batches and workers (pure functions).

With R ranks, micro-batch B, W workers and start cursor k0, ``G[k0 + j]`` goes to rank
``(j // B) % R``, that rank's batch ``j // (R*B)``, produced by worker ``batch % W``; the
contract and the call order are in :mod:`ckptstore.data.order`, which re-exports these names.
"""

from __future__ import annotations

from collections.abc import Iterable

from ckptstore.data.order_checks import DataOrderError, check_int

__all__ = [
    "agreed_cursor",
    "cursor_after",
    "epoch_batch",
    "epoch_batches",
    "next_epoch_boundary",
    "num_batches",
    "rank_batch_indices",
    "worker_for_batch",
]


def _check_layout(k0: int, world_size: int, batch_size: int) -> tuple[int, int, int]:
    return (
        check_int("k0", k0),
        check_int("world_size", world_size, minimum=1),
        check_int("batch_size", batch_size, minimum=1),
    )


def rank_batch_indices(
    k0: int, rank: int, world_size: int, batch_size: int, batch_number: int
) -> list[int]:
    """Global cursor indices of batch ``batch_number`` of rank ``rank``, starting at ``k0``.

    ``G[k0 + j]`` goes to rank ``(j // B) % R``, batch ``j // (R*B)``; so this batch is the
    ``B`` consecutive cursors from ``k0 + batch_number*R*B + rank*B``.
    """
    k0, r, b = _check_layout(k0, world_size, batch_size)
    rank = check_int("rank", rank)
    if rank >= r:
        raise DataOrderError(f"rank {rank} is not below world_size {r}")
    start = k0 + check_int("batch_number", batch_number) * r * b + rank * b
    return list(range(start, start + b))


def worker_for_batch(batch_number: int, num_workers: int) -> int:
    """The worker that produces a rank's batch ``batch_number``: ``batch_number % W``.

    ``num_workers=0`` (loading in the main process) behaves as one worker.
    """
    return check_int("batch_number", batch_number) % max(1, check_int("num_workers", num_workers))


def cursor_after(
    k0: int,
    world_size: int,
    batch_size: int,
    batches_consumed: int,
    end_cursor: int | None = None,
) -> int:
    """The cursor once every rank consumed ``batches_consumed`` batches from ``k0``.

    ``k0 + batches_consumed*R*B``, capped at ``end_cursor`` when given (the last, short
    global step of an :func:`epoch_batches` view ends exactly at its end cursor).
    """
    k0, r, b = _check_layout(k0, world_size, batch_size)
    cursor = k0 + check_int("batches_consumed", batches_consumed) * r * b
    if end_cursor is not None:
        cursor = min(cursor, check_int("end_cursor", end_cursor, minimum=k0))
    return cursor


def num_batches(
    k0: int, world_size: int, batch_size: int, epoch_end_cursor: int, drop_last: bool = False
) -> int:
    """How many batches every rank gets in the view ``[k0, epoch_end_cursor)`` (same on all)."""
    k0, r, b = _check_layout(k0, world_size, batch_size)
    span = check_int("epoch_end_cursor", epoch_end_cursor, minimum=k0) - k0
    full, tail = divmod(span, r * b)
    return full if drop_last or tail == 0 else full + 1


def epoch_batches(
    k0: int,
    rank: int,
    world_size: int,
    batch_size: int,
    epoch_end_cursor: int,
    drop_last: bool = False,
) -> list[list[int]]:
    """Rank ``rank``'s batches (global cursor index lists) for the view ``[k0, epoch_end_cursor)``.

    Full global steps follow :func:`rank_batch_indices`. A final short global step of ``T <
    R*B`` cursors is split so tail cursor ``j`` goes to rank ``j // B``: low ranks get full
    batches, one rank may get a short one and the rest an empty list. Every rank gets the
    same number of batches, so collectives stay in step; a loader may skip training on an
    empty batch but must still count it. Without ``drop_last`` the union over ranks is
    exactly ``range(k0, epoch_end_cursor)``.

    With ``drop_last`` that short global step is dropped: those ``T`` samples are not
    served this epoch, and the loader moves the cursor to ``epoch_end_cursor`` when the view
    is exhausted, so epochs stay aligned and no sample is ever served twice. (A save taken
    before exhaustion holds the cursor after the last full step; a resume with another
    ``R*B`` re-splits that tail.)
    """
    count = num_batches(k0, world_size, batch_size, epoch_end_cursor, drop_last)
    return [
        epoch_batch(k0, rank, world_size, batch_size, epoch_end_cursor, s) for s in range(count)
    ]


def epoch_batch(
    k0: int,
    rank: int,
    world_size: int,
    batch_size: int,
    epoch_end_cursor: int,
    batch_number: int,
) -> list[int]:
    """Batch ``batch_number`` of :func:`epoch_batches` (same arguments), without the others.

    A loader asks for its batches one at a time so a long epoch is never held as a list.
    ``drop_last`` only decides how many batches there are: batch numbers below
    ``num_batches(..., drop_last=True)`` are the same either way.
    """
    k0, r, b = _check_layout(k0, world_size, batch_size)
    rank = check_int("rank", rank)
    if rank >= r:
        raise DataOrderError(f"rank {rank} is not below world_size {r}")
    end = check_int("epoch_end_cursor", epoch_end_cursor, minimum=k0)
    s = check_int("batch_number", batch_number)
    if s >= num_batches(k0, r, b, end):
        raise DataOrderError(
            f"batch {s} is past the view [{k0}, {end}), which has {num_batches(k0, r, b, end)} "
            "batches per rank"
        )
    full = (end - k0) // (r * b)
    if s < full:
        return rank_batch_indices(k0, rank, r, b, s)
    lo = min(end, k0 + full * r * b + rank * b)
    return list(range(lo, min(end, lo + b)))


def next_epoch_boundary(cursor: int, num_samples: int) -> int:
    """The first cursor of the next epoch: end of the epoch ``cursor`` lies in."""
    n = check_int("num_samples", num_samples, minimum=1)
    return (check_int("cursor", cursor) // n + 1) * n


def agreed_cursor(cursors: Iterable[int]) -> int:
    """The one cursor all ranks hold (pass every rank's cursor, e.g. from all_gather)."""
    values = [check_int(f"cursors[{i}]", c) for i, c in enumerate(cursors)]
    if not values:
        raise DataOrderError("no cursors given")
    if len(set(values)) != 1:
        by_rank = ", ".join(f"rank {i}: {c}" for i, c in enumerate(values))
        raise DataOrderError(
            f"ranks disagree on the data cursor ({by_rank}); every rank must count the same "
            "batches handed to training before a save"
        )
    return values[0]
