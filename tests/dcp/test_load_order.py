"""A load hands items to DCP in the order its load plan lists them (the planner's: DCP's
default follows the checkpoint's metadata; a planner that puts the first layers first gets
them first), not in the order they lie in the files, and each as it lands: the first item
is handed over before the last range has been read (issue #37, "stream the load")."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

import ckptstore
from ckptstore.dcp.reader import CkptReader
from ckptstore.engine.committed import open_committed
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import FaultyStore

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


class Reversed(DefaultLoadPlanner):
    """DCP's default load planner with its plan reversed (the last stored item first),
    remembering the order items were committed in."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[str] = []

    def create_local_plan(self) -> Any:
        plan = super().create_local_plan()
        return dataclasses.replace(plan, items=list(reversed(plan.items)))

    def commit_tensor(self, read_item: Any, tensor: torch.Tensor) -> None:
        self.order.append(read_item.dest_index.fqn)
        super().commit_tensor(read_item, tensor)


def test_items_are_handed_over_in_the_plans_order(tmp_path) -> None:
    names = [f"layer{i}" for i in range(6)]
    url = str(tmp_path / "step_000000001")
    ckptstore.save({n: torch.full((1000,), float(i)) for i, n in enumerate(names)}, url)
    state = {n: torch.zeros(1000) for n in names}
    planner = Reversed()
    dcp.load(state, storage_reader=ckptstore.reader(url), planner=planner)
    assert planner.order == list(reversed(names))
    assert all(torch.equal(state[n], torch.full((1000,), float(i))) for i, n in enumerate(names))


class HoldsLast(FaultyStore):
    """A volume whose reads of one range (``last``: path, offset, length) wait until
    ``release`` is set, at most ``WAIT`` s (a reader that delivers nothing until every read
    is back would otherwise hang); ``events`` notes when such a read returns."""

    WAIT = 60.0

    def __init__(self, root: str, last: tuple[str, int, int], events: list[str]) -> None:
        super().__init__(LocalStore(root))
        self.last, self.events = last, events
        self.release = threading.Event()

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        name, offset, length = self.last
        held = path == name and offset <= start < offset + length
        if held:
            self.release.wait(self.WAIT)
        n = super().get_into(path, start, buf)
        if held:
            self.events.append("last range read")
        return n


class Noting(DefaultLoadPlanner):
    """DCP's default planner, noting each commit in ``store.events`` and releasing the
    store's held read at the first."""

    def __init__(self, store: HoldsLast) -> None:
        super().__init__()
        self.store = store

    def commit_tensor(self, read_item: Any, tensor: torch.Tensor) -> None:
        self.store.events.append(f"commit {read_item.dest_index.fqn}")
        self.store.release.set()
        super().commit_tensor(read_item, tensor)


def test_the_first_item_is_handed_over_before_the_last_range_is_read(tmp_path) -> None:
    # Default config: every range's read is issued at once (the budget holds them all); the
    # first item must reach DCP while the last range's read is still held back.
    names = [f"layer{i}" for i in range(8)]
    url = str(tmp_path / "step_000000001")
    ckptstore.save({n: torch.full((16384,), float(i)) for i, n in enumerate(names)}, url)
    entry = next(
        r for r in open_committed(LocalStore(url)).manifest.ranges if r.key.startswith("layer7@")
    )
    events: list[str] = []
    store = HoldsLast(url, (entry.file, entry.offset, entry.length), events)
    state = {n: torch.zeros(16384) for n in names}
    dcp.load(state, storage_reader=CkptReader(store), planner=Noting(store))
    assert events.index("commit layer0") < events.index("last range read")
    assert [e for e in events if e.startswith("commit")] == [f"commit {n}" for n in names]
    assert all(torch.equal(state[n], torch.full((16384,), float(i))) for i, n in enumerate(names))
