"""Small agreements between a manager's ranks, on a gloo group of their own.

Each method is a collective over that group: every rank calls the same methods in the
same order. Without a group (one process) each returns its own argument.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Agreement"]


class Agreement:
    """``any`` / ``all`` of a flag (``any_of``: of several) and rank 0's ``broadcast``
    over ``group`` (or none)."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any."""
        if self.group is None:
            return flag
        t = torch.tensor([1 if flag else 0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return bool(t.item())

    def any_of(self, flags: list[bool]) -> list[bool]:
        """``any`` of each flag, in one collective."""
        if self.group is None:
            return list(flags)
        t = torch.tensor([1 if f else 0 for f in flags])
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [bool(v) for v in t.tolist()]

    def all(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on all."""
        return not self.any(not flag)

    def broadcast(self, value: Any) -> Any:
        """Rank 0's ``value`` (picklable), on every rank."""
        if self.group is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, group_src=0, group=self.group)
        return box[0]
