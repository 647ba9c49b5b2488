"""Small agreements between a manager's ranks, on a gloo group of their own.

Each method is a collective over that group: every rank calls the same methods in the
same order. Without a group (one process) each returns its own argument. ``StepView`` is
what a save's agreement merges: one rank's view of the step it is about to save.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["Agreement", "StepView"]


class Agreement:
    """``any`` / ``all`` of a flag (``any_of``: of several; ``max_of``: the largest of
    several numbers) and one rank's ``broadcast`` over ``group`` (or none)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        #: This process's rank in ``group`` (0 without one).
        self.rank = dist.get_rank(group) if group is not None else 0

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any."""
        return self.any_of([flag])[0]

    def any_of(self, flags: list[bool]) -> list[bool]:
        """``any`` of each flag, in one collective."""
        return [bool(v) for v in self.max_of([1 if f else 0 for f in flags])]

    def max_of(self, values: list[int]) -> list[int]:
        """The largest of each value over the ranks (int64), in one collective."""
        if self.group is None:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return [int(v) for v in t.tolist()]

    def all(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on all."""
        return not self.any(not flag)

    def broadcast(self, value: Any, src: int = 0) -> Any:
        """Rank ``src``'s ``value`` (picklable), on every rank."""
        if self.group is None:
            return value
        box = [value]
        dist.broadcast_object_list(box, group_src=src, group=self.group)
        return box[0]


@dataclass(frozen=True)
class StepView:
    """What one rank knows of a save before it starts; merged over the ranks by "any"."""

    busy: bool = False  # a save of this rank is still in flight
    unchecked: bool = False  # the root could not be checked for the step
    replace: bool = False  # the step is committed but must be saved again
    missing: bool = False  # the step is not committed
    restart: bool = False  # the backend (writer process) must be replaced first

    def flags(self) -> list[int]:
        """The fields as ints, in order, for one max-reduction over the ranks."""
        return [int(getattr(self, f.name)) for f in fields(self)]

    @classmethod
    def of(cls, flags: list[int]) -> StepView:
        """The view ``flags`` (as ``flags()`` made them) stand for."""
        return cls(*(bool(v) for v in flags))
