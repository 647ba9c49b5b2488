"""``WriteSchedule``: the one hook a ``CkptWriter`` gives its user over how a rank writes.

A schedule decides how this rank's items are grouped into shard files and in which order
they are written, and what to wait for around each file; it may refuse the save at set-up.
``PlainSchedule`` (the default) splits the items into ``files_per_rank`` files and waits
for nothing. The checkpoint manager's schedules (``ckptstore.manager.saving.write_order``)
write live tensors first or fetch a staged round before its file. The on-storage format
is the writer's whatever the schedule: only the files' grouping and order change.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch.distributed.checkpoint.planner import WriteItem, WriteItemType

__all__ = ["PlainSchedule", "WriteSchedule", "item_bytes", "split_items"]


class WriteSchedule(Protocol):
    """How one rank writes its part of a save.

    Call order (``CkptWriter``, every save)::

        schedule.set_up()                     # set_up_storage_writer, every rank: raising
                                              # refuses the save on every rank at once
        groups = schedule.group(items, resolve, files_per_rank)
                                              # write_data, first: the items of each shard
                                              # file, in write order (``resolve(item)`` is
                                              # the item's data, as the planner has it)
        for i, group in enumerate(groups):
            schedule.before_file(i)           # may wait (e.g. for the file's data)
            ...file i written, durable...
            schedule.after_file(i)            # may let the file's data go
        schedule.end()                        # write_data's end, however it ended

    A raise from any of them fails the save (nothing is committed).
    """

    def set_up(self) -> None:
        """Every rank, in DCP's planning step: raise to refuse the save there."""

    def group(
        self, items: list[WriteItem], resolve: Callable[[WriteItem], Any], files_per_rank: int
    ) -> list[list[WriteItem]]:
        """The non-empty groups of ``items``, one shard file each, in the order written."""
        ...

    def before_file(self, index: int) -> None:
        """Shard file ``index`` (of ``group``'s result) is about to be written."""

    def after_file(self, index: int) -> None:
        """Shard file ``index`` is written and durable."""

    def end(self) -> None:
        """``write_data`` ends (written, or failed): release whatever is still held."""


class PlainSchedule:
    """The default: ``split_items`` into ``files_per_rank`` files; nothing to wait for."""

    def set_up(self) -> None:
        """Nothing to check."""

    def group(
        self, items: list[WriteItem], resolve: Callable[[WriteItem], Any], files_per_rank: int
    ) -> list[list[WriteItem]]:
        """``split_items(items, files_per_rank)``."""
        return split_items(items, files_per_rank)

    def before_file(self, index: int) -> None:
        """Nothing to wait for."""

    def after_file(self, index: int) -> None:
        """Nothing to release."""

    def end(self) -> None:
        """Nothing held."""


def split_items(items: list[WriteItem], bins: int) -> list[list[WriteItem]]:
    """Bytes items round-robin, tensors largest-first into the lightest bin; no empty bin
    (an empty plan gives no bins: that rank writes no file)."""
    if not items:
        return []
    if bins <= 1:
        return [list(items)]
    out: list[list[WriteItem]] = [[] for _ in range(bins)]
    sizes = [0] * bins
    blobs = [i for i in items if i.type == WriteItemType.BYTE_IO]
    tensors = [i for i in items if i.type != WriteItemType.BYTE_IO]
    for n, item in enumerate(blobs):
        out[n % bins].append(item)
    for item in sorted(tensors, key=item_bytes, reverse=True):
        b = sizes.index(min(sizes))
        out[b].append(item)
        sizes[b] += item_bytes(item)
    return [b for b in out if b]


def item_bytes(item: WriteItem) -> int:
    """A tensor item's bytes (from its plan entry); 0 for a bytes item."""
    if item.tensor_data is None:
        return 0
    numel = 1
    for d in item.tensor_data.size:
        numel *= d
    return numel * item.tensor_data.properties.dtype.itemsize
