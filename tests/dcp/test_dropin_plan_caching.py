"""``DefaultSavePlanner(enable_plan_caching=True)`` (torchtitan's setup) reuses its cached
global plan across saves: no per-save id may live in it. Several saves into different
steps, an overwrite of one, and a kill -9 after the shards of an overwrite, on 2 gloo
ranks: every committed checkpoint stays loadable and bitwise what was saved."""

from __future__ import annotations

import os

import pytest
import torch

import ckptstore
from ckptstore.engine.committed import open_committed
from ckptstore.engine.verify import verify_checkpoint
from ckptstore.stores.local import LocalStore
from harness.dist import DistributedRunError, run_distributed

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]


def _state(rank: int, version: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * version + rank)
    return {f"r{rank}": torch.randn(200, 30, generator=g), "v": torch.full((4,), version)}


def _save(state: dict, url: str, planner: object, overwrite: bool = False) -> None:
    import torch.distributed.checkpoint as dcp

    dcp.save(state, storage_writer=ckptstore.writer(url, overwrite=overwrite), planner=planner)


def _expected(world: int, version: int) -> dict[str, torch.Tensor]:
    out = {f"r{r}": _state(r, version)[f"r{r}"] for r in range(world)}
    out["v"] = torch.full((4,), version)
    return out


def _loads_bitwise(url: str, world: int, version: int) -> bool:
    expected = _expected(world, version)
    got = {k: torch.empty_like(v) for k, v in expected.items()}
    ckptstore.load(got, url)
    return all(torch.equal(got[k], v) for k, v in expected.items())


def _saves_with_plan_caching(rank: int, world: int, root: str) -> list[bool]:
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    planner = DefaultSavePlanner(enable_plan_caching=True)
    for step in (1, 2, 3):
        _save(_state(rank, step), f"{root}/step_00000000{step}", planner)
    _save(_state(rank, 9), f"{root}/step_000000002", planner, overwrite=True)
    return [
        _loads_bitwise(f"{root}/step_00000000{s}", world, v) for s, v in [(1, 1), (2, 9), (3, 3)]
    ]


def test_plan_caching_gives_every_save_its_own_attempt(tmp_path) -> None:
    root = str(tmp_path)
    assert run_distributed(_saves_with_plan_caching, 2, root) == [[True] * 3] * 2
    markers = [open_committed(LocalStore(f"{root}/step_00000000{s}")).marker for s in (1, 2, 3)]
    assert len({m.attempt for m in markers}) == 3
    names = [
        sorted(open_committed(LocalStore(f"{root}/step_00000000{s}")).manifest.files)
        for s in (1, 2, 3)
    ]
    shards = [n for files in names for n in files if n.endswith(".distcp")]
    assert len(shards) == len(set(n.split(".")[1] for n in shards)) == 6  # 2 ranks x 3 steps


def _save_then_overwrite(rank: int, world: int, url: str) -> None:
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

    planner = DefaultSavePlanner(enable_plan_caching=True)
    _save(_state(rank, 1), url, planner)
    _save(_state(rank, 2), url, planner, overwrite=True)  # killed after its shards


def test_overwrite_killed_after_its_shards_keeps_the_committed_checkpoint(tmp_path) -> None:
    url = str(tmp_path / "step_000000004")
    env = {"CKPTSTORE_CRASH_AT": "after_shards:2"}  # each rank's second save, shards durable
    with pytest.raises(DistributedRunError, match="exited without a result"):
        run_distributed(_save_then_overwrite, 2, url, env=env)
    assert len([n for n in os.listdir(url) if n.endswith(".distcp")]) == 4  # old 2 + new 2
    assert _loads_bitwise(url, 2, 1)  # one process
    assert verify_checkpoint(LocalStore(url)).ok
