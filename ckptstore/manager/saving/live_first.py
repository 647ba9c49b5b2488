"""Writers that write a save's *live* tensors first and say when they are done.

A state larger than the manager's staging budget (``ckptstore.manager.saving.host_arena``) is
saved with part of its tensors not copied: training waits while those are written. These
writers order this rank's shard files so that the live items go first, in a file of their
own, and call ``release`` once that file is durable (or once ``write_data`` ends, which
way ever it ends); the staged items follow while training goes on. ``release`` returns
the seconds training waited for it, which the manifest's ``blocking_s`` then includes.
Everything else, the on-storage format included, is the base writer's (``CkptWriter`` or
``StagedWriter``).

Call order: the base writer's. ``write_data`` decides which items are live (their tensor's
bytes are not in the staging arena), then calls the base ``write_data``, which calls
``shard_names`` and ``_write_file`` per file in order.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from ckptstore.dcp.staged import StagedWriter
from ckptstore.dcp.writer import CkptWriter
from ckptstore.engine.store import Store

__all__ = ["LiveFirstStagedWriter", "LiveFirstWriter", "live_first_writer"]


class _LiveFirst:
    """The mixin: see the module docstring. Set ``is_live`` and ``release`` before saving."""

    is_live: Callable[[torch.Tensor], bool]
    release: Callable[[], float]
    _released: bool
    _live_index: set[Any]
    _live_file: str | None

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        """The base ``write_data``, the live items in the first file; releases them after."""
        self._live_index = {
            item.index
            for item in plan.items
            if item.type != WriteItemType.BYTE_IO and self._live(planner.resolve_data(item))
        }
        self._live_file = None
        if not self._live_index:
            self._release()
        try:
            return super().write_data(plan, planner)  # type: ignore[misc]
        finally:
            self._release()

    def _release(self) -> None:
        """``release``, once; the manifest's ``blocking_s`` grows by the wait it returns
        (as the manager's record does), so both say what training paid."""
        if self._released:
            return
        self._released = True
        waited = self.release()
        timings = self.manifest_extra.get("timings")  # type: ignore[attr-defined]
        if isinstance(timings, dict) and "blocking_s" in timings:
            timings["blocking_s"] += waited

    def _live(self, data: object) -> bool:
        return isinstance(data, torch.Tensor) and self.is_live(data)

    def shard_names(self, plan: SavePlan) -> list[tuple[str, list]]:
        """The live items in one file, then the base writer's files of the others."""
        live = [i for i in plan.items if i.index in self._live_index]
        if not live:
            return super().shard_names(plan)  # type: ignore[misc]
        rest = [i for i in plan.items if i.index not in self._live_index]
        groups = [live] + [
            items
            for _, items in super().shard_names(dataclasses.replace(plan, items=rest))  # type: ignore[misc]
        ]
        named: list[tuple[str, list]] = self.name_shards(plan, groups)  # type: ignore[attr-defined]
        self._live_file = named[0][0]
        return named

    def _write_file(
        self, name: str, items: list, planner: SavePlanner, store: Store | None = None
    ) -> list[WriteResult]:
        results = super()._write_file(name, items, planner, store)  # type: ignore[misc]
        if name == self._live_file:
            self._release()  # the live tensors' bytes are durable: training may go on
        return results


class LiveFirstWriter(_LiveFirst, CkptWriter):
    """``CkptWriter`` writing the live items first (``ckptstore.manager.saving.live_first``)."""


class LiveFirstStagedWriter(_LiveFirst, StagedWriter):
    """``StagedWriter`` writing the live items first (``ckptstore.manager.saving.live_first``)."""


def live_first_writer(
    staged: bool,
    *args: Any,
    is_live: Callable[[torch.Tensor], bool],
    release: Callable[[], float],
    **kwargs: Any,
) -> CkptWriter:
    """A ``LiveFirstStagedWriter`` (``staged``) or ``LiveFirstWriter`` of ``args``/``kwargs``."""
    cls = LiveFirstStagedWriter if staged else LiveFirstWriter
    writer = cls(*args, **kwargs)
    writer.is_live, writer.release = is_live, release
    writer._live_index, writer._live_file, writer._released = set(), None, False
    return writer
