"""Whole checkpoints on SeaweedFS through the public API: commit races, torn and corrupted
checkpoints, and multi-rank DCP saves and loads (including 4 -> 2 resharding)."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import torch

import ckptstore
from ckptstore import WriterOptions
from ckptstore.dcp.writer import shard_prefix
from ckptstore.engine.committed import open_committed
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.store import Buffer
from ckptstore.errors import (
    CommitConflictError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
)
from ckptstore.stores.s3 import S3Store
from ckptstore.testing.faults import FaultyStore
from harness.dist import run_distributed

from .conftest import BUCKET, unique

pytestmark = [
    pytest.mark.server,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

ROWS, COLS = 64, 6


def expected_tensor() -> torch.Tensor:
    return torch.arange(ROWS * COLS, dtype=torch.float32).reshape(ROWS, COLS)


@pytest.fixture
def step_url(seaweedfs: Any) -> str:
    return f"s3://{BUCKET}/{unique('run')}/step_000000005"


class RacingStore(FaultyStore):
    """Holds the marker's ``put_if_absent`` until both writers reach it. Only the marker:
    fences are created with ``put_if_absent`` too, and the winner's removal of the loser's
    attempt creates one after the loser has gone."""

    def __init__(self, inner: S3Store, barrier: threading.Barrier) -> None:
        super().__init__(inner)
        self.barrier = barrier

    def put_if_absent(self, path: str, data: Buffer) -> None:
        if path == MARKER_NAME:
            self.barrier.wait(timeout=60)
        super().put_if_absent(path, data)


def test_two_writers_racing_for_one_step(seaweedfs: Any, step_url: str) -> None:
    options = seaweedfs.storage_options
    barrier = threading.Barrier(2)

    def save(i: int) -> bool:
        store = RacingStore(S3Store(step_url, options), barrier)
        try:
            ckptstore.save({"w": torch.full((5000,), float(i)), "who": i}, store)
            return True
        except CommitConflictError:
            return False

    with ThreadPoolExecutor(2) as pool:
        won = list(pool.map(save, range(2)))
    assert won.count(True) == 1
    winner = won.index(True)
    state = {"w": torch.zeros(5000), "who": -1}
    ckptstore.load(state, step_url, storage_options=options)  # verifies every range
    assert torch.equal(state["w"], torch.full((5000,), float(winner))) and state["who"] == winner
    store = S3Store(step_url, options)
    manifest = open_committed(store).manifest
    shards = [name for name in store.find() if name.endswith(".distcp")]
    assert shards and all(name in manifest.files for name in shards)  # loser's shards gone


def test_shards_without_marker_are_incomplete(seaweedfs: Any, step_url: str) -> None:
    options = seaweedfs.storage_options
    ckptstore.save({"w": torch.ones(100)}, step_url, storage_options=options)
    store = S3Store(step_url, options)
    store.delete(MARKER_NAME)
    assert any(name.endswith(".distcp") for name in store.find())
    with pytest.raises(IncompleteCheckpointError, match=MARKER_NAME):
        ckptstore.reader(step_url, storage_options=options)
    with pytest.raises(IncompleteCheckpointError):
        ckptstore.load({"w": torch.zeros(100)}, step_url, storage_options=options)


def test_corrupted_shard_names_object_and_range(seaweedfs: Any, step_url: str) -> None:
    options = seaweedfs.storage_options
    ckptstore.save({"w": torch.randn(64 * 1024)}, step_url, storage_options=options)
    store = S3Store(step_url, options)
    (shard,) = [name for name in store.find() if name.endswith(".distcp")]
    damaged = bytearray(store.get(shard))
    damaged[len(damaged) // 2] ^= 0x10
    store.put(shard, damaged)
    with pytest.raises(CorruptCheckpointError) as err:
        ckptstore.load({"w": torch.zeros(64 * 1024)}, step_url, storage_options=options)
    message = str(err.value)
    assert store.describe(shard) in message and "bytes [" in message and "checksum" in message


# -- several ranks (bodies are module-level: they run in spawned processes) -------------
def _mesh_tensor(world: int, full: torch.Tensor, dim: int) -> Any:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    return distribute_tensor(full, mesh, [Shard(dim)])


def _save_body(rank: int, world: int, url: str, options: dict) -> int:
    state = {"w": _mesh_tensor(world, expected_tensor(), 0), "step": 5}
    ckptstore.save(state, url, storage_options=options)
    return int(state["w"].to_local().numel())


def _load_body(rank: int, world: int, url: str, options: dict, dim: int) -> tuple[bool, Any]:
    state = {"w": _mesh_tensor(world, torch.zeros(ROWS, COLS), dim), "step": 0}
    ckptstore.load(state, url, storage_options=options)
    return bool(torch.equal(state["w"].full_tensor(), expected_tensor())), state["step"]


def _round_trip_body(rank: int, world: int, url: str, options: dict) -> tuple[bool, Any]:
    _save_body(rank, world, url, options)
    return _load_body(rank, world, url, options, dim=1)


@pytest.mark.distributed
def test_two_rank_round_trip(seaweedfs: Any, step_url: str) -> None:
    options = seaweedfs.storage_options
    results = run_distributed(_round_trip_body, 2, step_url, options)
    assert results == [(True, 5), (True, 5)]
    manifest = open_committed(S3Store(step_url, options)).manifest
    assert manifest.world_size == 2 and manifest.step == 5


@pytest.mark.distributed
def test_reshard_four_ranks_to_two(seaweedfs: Any, step_url: str) -> None:
    options = seaweedfs.storage_options
    sizes = run_distributed(_save_body, 4, step_url, options)
    assert sizes == [ROWS * COLS // 4] * 4  # each rank held (and wrote) a quarter
    assert open_committed(S3Store(step_url, options)).manifest.world_size == 4
    assert run_distributed(_load_body, 2, step_url, options, 0) == [(True, 5), (True, 5)]


def _spread_body(rank: int, world: int, url: str, options: dict) -> tuple[bool, Any]:
    state = {"w": _mesh_tensor(world, expected_tensor(), 0), "step": 5}
    ckptstore.save(
        state, ckptstore.writer(url, WriterOptions(key_layout="spread"), storage_options=options)
    )
    return _load_body(rank, world, url, options, dim=1)


@pytest.mark.distributed
def test_two_rank_spread_key_layout(seaweedfs: Any, step_url: str) -> None:
    options = seaweedfs.storage_options
    assert run_distributed(_spread_body, 2, step_url, options) == [(True, 5), (True, 5)]
    shards = [n for n in S3Store(step_url, options).find() if n.endswith(".distcp")]
    assert sorted(n.rpartition("/")[0] + "/" for n in shards) == sorted(
        shard_prefix(r, "spread").partition("__")[0] for r in range(2)
    )
