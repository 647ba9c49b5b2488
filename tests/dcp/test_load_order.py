"""A load hands items to DCP in the order its load plan lists them (the planner's: DCP's
default follows the checkpoint's metadata; a planner that puts the first layers first gets
them first), not in the order they lie in the files."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

import ckptstore

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
