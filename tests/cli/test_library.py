"""The library pieces the CLI is built on: verify, copy and prune (no CLI involved)."""

from __future__ import annotations

import time

import pytest
import torch

from ckptstore.config import TransferConfig
from ckptstore.engine.committed import open_committed
from ckptstore.engine.copy import copy_checkpoint
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.transfer import TransferEngine
from ckptstore.engine.verify import verify_checkpoint
from ckptstore.errors import (
    CheckpointExistsError,
    CorruptCheckpointError,
    DurabilityError,
    IncompleteCheckpointError,
)
from ckptstore.manager.prune import apply_prune, plan_prune
from ckptstore.manager.retention import KeepLast
from ckptstore.testing.faults import Fault, FaultyStore
from tests.cli.conftest import Backend, sample_state, save_ckpt, tear

SMALL = TransferConfig(part_size=4096, concurrency=4, memory_budget=1 << 20)


def shard(store) -> str:
    return next(n for n in open_committed(store).manifest.files if n.endswith(".distcp"))


def flip(store, name: str, offset: int) -> None:
    data = bytearray(store.get(name))
    data[offset] ^= 0xFF
    store.put(name, bytes(data))


def test_verify_names_the_bad_range(backend: Backend, root_url: str) -> None:
    save_ckpt(backend, root_url + "/step_000000001", files_per_rank=2)
    store = backend.open(root_url + "/step_000000001")
    with TransferEngine(SMALL) as engine:
        report = verify_checkpoint(store, engine)
        assert report.ok and report.bytes_read > 8000
        committed = open_committed(store)
        victim = max(committed.manifest.ranges, key=lambda r: r.length)
        flip(store, victim.file, victim.offset + victim.length // 2)
        report = verify_checkpoint(store, engine)
    assert not report.ok
    [bad] = report.bad_files
    assert bad.name == victim.file and "checksum mismatch" in bad.problem
    assert [(r.offset, r.length) for r in bad.bad_ranges] == [(victim.offset, victim.length)]


def test_verify_truncated_and_missing_files(backend: Backend, root_url: str) -> None:
    url = save_ckpt(backend, root_url + "/s", files_per_rank=2)
    store = backend.open(url)
    names = sorted(n for n in open_committed(store).manifest.files if n.endswith(".distcp"))
    data = store.get(names[0])
    store.put(names[0], data[: len(data) // 2])
    store.delete(names[1])
    with TransferEngine(SMALL) as engine:
        report = verify_checkpoint(store, engine)
    by_name = {f.name: f for f in report.bad_files}
    assert by_name[names[0]].problem.startswith("truncated")
    assert any(r.problem == "beyond the end of the file" for r in by_name[names[0]].bad_ranges)
    assert by_name[names[1]].problem == "missing"


def test_copy_failure_leaves_nothing(backend: Backend, root_url: str) -> None:
    dst = FaultyStore(
        backend.open(root_url + "/dst"),
        [Fault("complete_multipart", error=DurabilityError("injected EIO"))],
    )
    # One file spans several parts on every store (a file smaller than the store's smallest
    # part, 5 MiB on S3, is one whole-object put, which never calls complete_multipart).
    part = max(SMALL.part_size, dst.capabilities.min_part_size)
    state = sample_state()
    state["big"] = torch.randn(part // 4 + 1024)
    url = save_ckpt(backend, root_url + "/src", state, files_per_rank=2)
    src = backend.open(url)
    config = TransferConfig(part_size=part, concurrency=4, memory_budget=4 * part)
    with TransferEngine(config) as engine:
        with pytest.raises(DurabilityError):
            copy_checkpoint(src, dst, engine)
        assert dst.calls["complete_multipart"] >= 1  # the failure injected was the one hit
        assert dst.inner.find() == []  # nothing committed, nothing left
        assert dst.inner.list_multipart() == []  # the failed upload was aborted
        result = copy_checkpoint(src, dst.inner, engine)
        assert result.files == 2
        assert verify_checkpoint(dst.inner, engine).ok
        with pytest.raises(CheckpointExistsError):
            copy_checkpoint(src, dst.inner, engine)
        copy_checkpoint(src, dst.inner, engine, overwrite=True)
        assert open_committed(dst.inner).manifest.extra["copied_from"] == src.url


def test_copy_refuses_damaged_or_torn_source(backend: Backend, root_url: str) -> None:
    url = save_ckpt(backend, root_url + "/src")
    src = backend.open(url)
    dst = backend.open(root_url + "/dst")
    flip(src, shard(src), 100)
    with TransferEngine(SMALL) as engine:
        with pytest.raises(CorruptCheckpointError, match="crc32c"):
            copy_checkpoint(src, dst, engine)
        assert not dst.exists(MARKER_NAME) and dst.find() == []
        src.delete(MARKER_NAME)
        with pytest.raises(IncompleteCheckpointError):
            copy_checkpoint(src, dst, engine)


def test_prune_plan(backend: Backend, root_url: str) -> None:
    for step in (1, 2, 3, 5):
        save_ckpt(backend, f"{root_url}/step_{step:09d}")
    root = backend.open(root_url)
    tear(backend, f"{root_url}/step_000000002")  # torn, older than the newest
    save_ckpt(backend, f"{root_url}/step_000000009")
    tear(backend, f"{root_url}/step_000000009")  # newer than the newest: in flight
    up = root.begin_multipart("step_000000009/__0_0.a1.distcp")
    plan = plan_prune(root, KeepLast(1), protected={1}, stale_after_s=3600, now=time.time())
    actions = {d.step: (d.action, d.reason) for d in plan.steps}
    assert actions[1] == ("keep", "protected")
    assert actions[2][0] == "delete" and "torn" in actions[2][1]
    assert actions[3][0] == "delete"
    assert actions[5] == ("keep", "newest committed")
    assert actions[9][0] == "keep" and "in flight" in actions[9][1]
    assert [u.action for u in plan.uploads] == ["keep"]
    apply_prune(root, plan)
    assert [n for n in root.listdir() if n.startswith("step_")] == [
        "step_000000001",
        "step_000000005",
        "step_000000009",
    ]
    plan = plan_prune(root, KeepLast(1), stale_after_s=0.0, now=time.time() + 1)
    assert [u.action for u in plan.uploads] == ["abort"]
    apply_prune(root, plan)
    assert root.list_multipart() == []
    root.abort_multipart(up)


def test_transcode_keeps_layout_and_round_trips(backend: Backend, root_url: str) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    import ckptstore
    from ckptstore.dcp.transcode import transcode

    src = backend.open(save_ckpt(backend, root_url + "/step_000000003", files_per_rank=2))
    z, plain = backend.open(root_url + "/z"), backend.open(root_url + "/plain")
    with TransferEngine(SMALL) as engine:
        transcode(src, z, engine, codec="zstd")
        transcode(z, plain, engine, codec="none")
        for store, codec in ((z, "zstd"), (plain, "none")):
            m = open_committed(store).manifest
            assert m.codec == codec and m.step == 3 and m.extra["converted_from"]
            assert len([n for n in m.files if n.endswith(".distcp")]) == 2
            assert verify_checkpoint(store, engine).ok
    ref = sample_state()
    out = {"model": {"w": torch.zeros(64, 32), "b": torch.zeros(10, dtype=torch.int64)}}
    ckptstore.load(out, z)
    assert torch.equal(out["model"]["w"], ref["model"]["w"])
    if backend.name == "volume":  # stock DCP reads the zstd -> none result
        out["model"]["w"].zero_()
        dcp.load(out, storage_reader=dcp.FileSystemReader(plain.url), no_dist=True)
        assert torch.equal(out["model"]["w"], ref["model"]["w"])
