"""``background="auto"``: the writer process where the node's share per rank leaves room
for it and the first save's state can go to it, on every rank; the thread otherwise."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

import ckptstore.manager.saving.backend as backend_module
from ckptstore.manager import CheckpointManager
from ckptstore.manager.saving.auto_backend import MIN_CORES, MIN_MEMORY, choose, node_share
from harness.dist import run_distributed

GIB = 1 << 30


@pytest.mark.parametrize(
    "cores, memory, room",
    [
        (1.0, 64 * GIB, False),  # no core of its own for the writer
        (1.9, 64 * GIB, False),
        (MIN_CORES, MIN_MEMORY, True),
        (12.0, 3 * GIB, False),  # no room in memory
        (12.0, 128 * GIB, True),
    ],
)
def test_the_rule(cores: float, memory: int, room: bool) -> None:
    ok, why = choose(cores, memory)
    assert ok is room
    assert f"{cores:.1f} cores and {memory / GIB:.1f} GiB available per rank" in why


def test_synchronous_saves_take_the_thread() -> None:
    ok, why = choose(64.0, 512 * GIB, asynchronous=False)
    assert not ok and "async_save=False" in why


def test_a_store_object_takes_the_thread() -> None:
    ok, why = choose(64.0, 512 * GIB, url=False)
    assert not ok and "the root is a Store object of this process" in why


def test_a_store_object_root_is_saved_on_the_thread_with_the_reason(tmp_path, monkeypatch) -> None:
    """A Store the caller built (its hooks and counters in this process) is never copied
    into a writer process by the default, however much room the node has."""
    from ckptstore import open_store

    monkeypatch.setattr(backend_module, "node_share", lambda ranks: (8.0, 64 * GIB))
    with CheckpointManager(open_store(str(tmp_path / "root"))) as mgr:
        assert mgr.options.background == "auto"  # the default
        assert mgr.background[0] == "thread" and mgr._bg is None
        assert "Store object" in mgr.background[1]
        assert _saved_and_restored(mgr)


def test_the_nodes_share_is_split_between_its_ranks() -> None:
    one, two = node_share(1), node_share(2)
    assert one[0] >= 1 and one[1] > 0
    assert two[0] == pytest.approx(one[0] / 2)
    assert two[1] == pytest.approx(one[1] / 2, rel=0.2)  # memory moves between the reads


def _state() -> dict[str, Any]:
    return {"w": torch.arange(64 * 1024, dtype=torch.float32), "n": 3}


def _saved_and_restored(mgr: CheckpointManager) -> bool:
    mgr.save(1, _state())
    mgr.wait()
    out = {"w": torch.zeros(64 * 1024), "n": 0}
    return mgr.restore(out, step=1) == 1 and torch.equal(out["w"], _state()["w"])


def test_no_room_on_the_node_is_the_thread(tmp_path, monkeypatch, caplog) -> None:
    monkeypatch.setattr(backend_module, "node_share", lambda ranks: (1.0, 64 * GIB))
    caplog.set_level(logging.INFO, logger="ckptstore.report")
    with CheckpointManager(str(tmp_path / "root"), background="auto") as mgr:
        assert mgr.background[0] == "thread" and mgr._bg is None  # no writer started
        assert "needs a core of its own" in mgr.background[1]
        assert _saved_and_restored(mgr)
    assert any(
        "saves run on the thread backend (background='auto'" in r.message for r in caplog.records
    )


@pytest.mark.processes
def test_room_on_the_node_is_the_writer_process(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(backend_module, "node_share", lambda ranks: (8.0, 64 * GIB))
    with CheckpointManager(str(tmp_path / "root"), background="auto") as mgr:
        assert mgr.background == (
            "process",
            "background='auto': 8.0 cores and 64.0 GiB available per rank",
        )
        assert _saved_and_restored(mgr)
        assert mgr._bg is not None and mgr.background[0] == "process"


@pytest.mark.processes
def test_a_writer_never_sent_a_save_is_stopped_at_once_one_that_saved_exits(tmp_path) -> None:
    """close() kills a writer process that never got a job (nothing of a save is in it)
    instead of waiting for it to finish starting; one that saved is asked to exit."""
    root = str(tmp_path / "root")
    idle = CheckpointManager(root, background="process")
    child = idle._bg.writer  # type: ignore[union-attr]
    idle.close()
    assert child.proc.returncode == -9
    with CheckpointManager(root, background="process") as mgr:
        assert _saved_and_restored(mgr)
        child = mgr._bg.writer  # type: ignore[union-attr]
    assert child.proc.returncode == 0


@pytest.mark.processes
def test_a_state_the_writer_cannot_take_is_saved_on_the_thread(tmp_path, monkeypatch) -> None:
    """A tensor larger than ``max_staging_bytes`` cannot go to a writer process (its
    arena holds a round at most that large); the thread backend writes it straight from
    training's memory."""
    monkeypatch.setattr(backend_module, "node_share", lambda ranks: (8.0, 64 * GIB))
    root = str(tmp_path / "root")
    with CheckpointManager(root, background="auto", max_staging_bytes=4096) as mgr:
        assert _saved_and_restored(mgr)
        name, why = mgr.background
        assert name == "thread" and mgr._bg is None
        assert "the state cannot go to a writer process" in why and "max_staging_bytes" in why


def _two_ranks(rank: int, world: int, root: str) -> tuple[str, str]:
    share = (8.0, 64 * GIB) if rank == 0 else (1.0, 64 * GIB)  # rank 1's node is full
    backend_module.node_share = lambda ranks: share  # type: ignore[assignment]
    with CheckpointManager(root, background="auto") as mgr:
        assert _saved_and_restored(mgr)
        return mgr.background


@pytest.mark.distributed
def test_every_rank_takes_the_same_backend(tmp_path) -> None:
    results = run_distributed(_two_ranks, 2, str(tmp_path / "root"))
    assert [name for name, _ in results] == ["thread", "thread"]
    assert results[0][1].endswith(
        "8.0 cores and 64.0 GiB available per rank, but another rank has not"
    )


class _Broken:
    """A Stateful whose state_dict() fails on one rank only."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def state_dict(self) -> dict[str, Any]:
        if self.rank == 1:
            raise RuntimeError("rank 1 cannot make its state")
        return {"x": torch.ones(2)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def _first_save_fails_on_one_rank(rank: int, world: int, root: str) -> tuple[str, str, str]:
    backend_module.node_share = lambda ranks: (8.0, 64 * GIB)  # type: ignore[assignment]
    with CheckpointManager(root, background="auto") as mgr:
        try:
            mgr.save(1, {"s": _Broken(rank)})
        except Exception as exc:  # noqa: BLE001 - every rank raises it, none hangs
            raised = type(exc).__name__
        else:
            raised = "nothing"
        assert _saved_and_restored(mgr)  # the next save runs on the backend settled
        return raised, *mgr.background


@pytest.mark.distributed
def test_a_rank_that_cannot_flatten_its_first_state_settles_with_the_others(tmp_path) -> None:
    results = run_distributed(_first_save_fails_on_one_rank, 2, str(tmp_path / "root"))
    # rank 1 its own error, rank 0 the same error naming it (the save's agreement)
    assert [r[0] for r in results] == ["CkptStoreError", "RuntimeError"], results
    assert [r[1] for r in results] == ["thread", "thread"]
    assert "on another rank" in results[0][2]
