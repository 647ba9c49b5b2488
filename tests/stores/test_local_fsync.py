"""The volume's fsyncs: the small files of a commit are synced at once (``fsync_all``),
each still on its own; how many a 2-rank save makes on each rank; and a save killed at
each crash point loses nothing (the earlier checkpoint stays whole, the killed one is
either not committed or committed whole)."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import re
import stat
import threading
from typing import Any

import pytest
import torch

import ckptstore
from ckptstore.engine.committed import CheckpointStatus, checkpoint_status
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.names import TMP_MARK
from ckptstore.errors import DurabilityError
from ckptstore.stores._posix import fsync_all
from ckptstore.stores.local import LocalStore
from harness.dist import run_distributed


def _log_fsyncs() -> tuple[list[tuple[str, str]], Any]:
    """Patch ``os.fsync`` to record ("dir" | "file", name) of each call (names without
    their temp suffix); returns the log and the function that undoes the patch."""
    calls: list[tuple[str, str]] = []
    real = os.fsync

    def logged(fd: int) -> None:
        kind = "dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}")).split(TMP_MARK)[0]
        calls.append((kind, name))
        real(fd)

    os.fsync = logged

    def undo() -> None:
        os.fsync = real

    return calls, undo


def test_put_many_fsyncs_its_files_at_once(tmp_path, monkeypatch) -> None:
    """Every temp file's fsync is in flight together: each waits at a barrier the others
    must reach too (serial fsyncs would break it), and only then are they renamed."""
    items = [(f"f{i}", bytes([i]) * (i + 1)) for i in range(3)]
    together = threading.Barrier(len(items), timeout=30)
    real = os.fsync
    seen: list[str] = []

    def at_once(fd: int) -> None:
        name = os.readlink(f"/proc/self/fd/{fd}")
        if not stat.S_ISDIR(os.fstat(fd).st_mode):
            together.wait()
            assert TMP_MARK in name  # still its temp name: nothing renamed yet
        seen.append(name)
        real(fd)

    monkeypatch.setattr(os, "fsync", at_once)
    store = LocalStore(str(tmp_path))
    store.put_many(items)
    monkeypatch.undo()
    assert len(seen) == 4 and seen[-1] == str(tmp_path)  # 3 files, then the directory once
    assert [store.get(n) for n, _ in items] == [d for _, d in items]
    assert sorted(os.listdir(tmp_path)) == ["f0", "f1", "f2"]


def test_fsync_all_syncs_every_file_and_then_raises_the_first_error(tmp_path, monkeypatch) -> None:
    fds = [os.open(tmp_path / f"f{i}", os.O_WRONLY | os.O_CREAT) for i in range(4)]
    real, synced = os.fsync, []
    bad = fds[1]

    def flaky(fd: int) -> None:
        if fd == bad:
            raise OSError(errno.EIO, "Input/output error")
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", flaky)
    try:
        with pytest.raises(DurabilityError, match="f1.*will not be retried"):
            fsync_all([(fd, str(tmp_path / f"f{i}")) for i, fd in enumerate(fds)])
        assert sorted(synced) == sorted(fd for fd in fds if fd != bad)  # the others all done
    finally:
        for fd in fds:
            os.close(fd)


def _save_counting(rank: int, world: int, path: str) -> list[tuple[str, str]]:
    state = {f"r{rank}": torch.full((64, 1024), float(rank)), "shared": torch.arange(10.0)}
    calls, undo = _log_fsyncs()
    try:
        ckptstore.save(state, path)
    finally:
        undo()
    out = {k: torch.zeros_like(v) for k, v in state.items()}
    ckptstore.load(out, path)
    assert all(torch.equal(out[k], v) for k, v in state.items())
    return calls


@pytest.mark.distributed
def test_a_two_rank_save_makes_these_fsyncs(tmp_path) -> None:
    """Each rank: its shard, and the step directory it is renamed into; one of them (the
    first to make it) the step directory's parent. The coordinator (rank 0) then commits:
    the attempt's manifest and .metadata (synced at once) and their directory, the
    attempt's commit fence (``engine.fence``) and its directory, COMMITTED and its
    directory, the canonical .metadata and manifest (at once) and their directory. Before
    all that, the coordinator's step lease (``engine.lease``), published like any file
    (the file, then the step directory). 17 in all."""
    path = str(tmp_path / "step_000000005")
    ranks = run_distributed(_save_counting, 2, path)
    parent = ("dir", tmp_path.name)
    assert sum(calls.count(parent) for calls in ranks) == 1
    coord, other = ([c for c in calls if c != parent] for calls in ranks)
    step = ("dir", os.path.basename(path))
    (lease_at,) = [i for i, (_, n) in enumerate(coord) if n.startswith("ckptstore.lease.")]
    assert coord[lease_at][0] == "file" and coord[lease_at + 1] == step
    coord = coord[:lease_at] + coord[lease_at + 2 :]  # the save's own, as before the lease
    assert other[0][0] == "file" and other[0][1].startswith("__1_") and other[1:] == [step]
    assert coord[0][0] == "file" and coord[0][1].startswith("__0_")
    attempt = sorted(n for _, n in coord[2:4])
    assert re.fullmatch(r"\.metadata\.[0-9a-f]{12}", attempt[0])
    assert re.fullmatch(r"ckptstore\.manifest\.[0-9a-f]{12}\.json", attempt[1])
    assert coord[1] == coord[4] == coord[6] == coord[8] == coord[11] == step
    assert coord[5][0] == "file" and coord[5][1].startswith("ckptstore.fence.")
    assert coord[7] == ("file", MARKER_NAME)
    assert sorted(coord[9:11]) == [("file", ".metadata"), ("file", "ckptstore.manifest.json")]
    assert len(coord) == 12 and [k for k, _ in coord[2:4]] == ["file", "file"]


def _crash_saving(root: str, point: str) -> None:
    os.environ["CKPTSTORE_CRASH_AT"] = point
    os.environ.pop("CKPTSTORE_CRASH_RANK", None)  # this process is the one to kill
    ckptstore.save({"w": torch.full((256, 1024), 2.0), "n": 2}, os.path.join(root, "step_2"))


@pytest.mark.processes
def test_a_save_killed_at_each_point_loses_nothing(tmp_path) -> None:
    """Killed with its shard durable, with the attempt's manifest and .metadata durable,
    and just after its marker: the earlier step loads whole every time; the killed step is
    not committed and saves again, or (after the marker) is committed and loads whole."""
    points = {"after_shards": False, "before_marker": False, "after_marker": True}
    first = {"w": torch.full((256, 1024), 1.0), "n": 1}
    procs = {}
    for point in points:
        root = str(tmp_path / point)
        ckptstore.save(first, os.path.join(root, "step_1"))
        procs[point] = mp.get_context("spawn").Process(target=_crash_saving, args=(root, point))
        procs[point].start()
    for point, committed in points.items():
        root = str(tmp_path / point)
        procs[point].join(120)
        assert procs[point].exitcode == -9, point  # killed at the point
        out: dict[str, Any] = {"w": torch.zeros(256, 1024), "n": 0}
        ckptstore.load(out, os.path.join(root, "step_1"))
        assert torch.equal(out["w"], first["w"]) and out["n"] == 1
        step2 = LocalStore(os.path.join(root, "step_2"))
        status = checkpoint_status(step2)
        if committed:  # it loads whole (through the attempt's own copies)
            assert status == CheckpointStatus.COMMITTED, point
            ckptstore.load(out, step2.root)
            assert torch.equal(out["w"], torch.full((256, 1024), 2.0)) and out["n"] == 2
        else:  # nothing committed, nothing in the way: the same step saves again
            assert status == CheckpointStatus.INCOMPLETE and not step2.exists(MARKER_NAME)
            ckptstore.save({"w": torch.full((256, 1024), 3.0), "n": 3}, step2.root)
            ckptstore.load(out, step2.root)
            assert torch.equal(out["w"], torch.full((256, 1024), 3.0)) and out["n"] == 3
