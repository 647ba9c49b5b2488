"""Bad input and faults on a volume: each gives one clear exception type."""

import errno
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.config import WriterOptions
from ckptstore.engine.committed import open_committed
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME
from ckptstore.errors import (
    CheckpointExistsError,
    CorruptCheckpointError,
    DurabilityError,
    IncompleteCheckpointError,
    StoreAccessError,
)
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import Fault, FaultyStore


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(256, 64, generator=g),
        "b": torch.arange(100, dtype=torch.int64),
        "meta": {"step": 7, "name": "run"},
    }


def empty() -> dict:
    return {
        "w": torch.zeros(256, 64),
        "b": torch.zeros(100, dtype=torch.int64),
        "meta": {"step": 0, "name": ""},
    }


@pytest.fixture
def ckpt(tmp_path) -> str:
    path = str(tmp_path / "step_000000007")
    ckptstore.save(state(), path)
    return path


def shard_of(path: str) -> str:
    return next(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".distcp"))


def test_round_trip_and_manifest(ckpt) -> None:
    out = empty()
    ckptstore.load(out, ckpt)
    ref = state()
    assert torch.equal(out["w"], ref["w"]) and torch.equal(out["b"], ref["b"])
    assert out["meta"] == ref["meta"]
    committed = open_committed(LocalStore(ckpt))
    assert committed.manifest.step == 7 and committed.manifest.world_size == 1
    assert committed.manifest.torch_version == torch.__version__
    assert len(committed.manifest.ranges) == 4  # two tensors + two objects


def test_stock_filesystem_reader_loads_it(ckpt) -> None:
    out = empty()
    dcp.load(out, storage_reader=dcp.FileSystemReader(ckpt), no_dist=True)
    assert torch.equal(out["w"], state()["w"])


def test_stock_checkpoint_loads_with_a_warning(tmp_path) -> None:
    dcp.save(state(), storage_writer=dcp.FileSystemWriter(str(tmp_path)), no_dist=True)
    out = empty()
    with pytest.warns(ckptstore.dcp.reader.StockCheckpointWarning):
        ckptstore.load(out, str(tmp_path))
    assert torch.equal(out["w"], state()["w"])


def test_zstd_codec_round_trip(tmp_path) -> None:
    path = str(tmp_path / "z")
    ckptstore.save(state(), path, options=WriterOptions(codec="zstd"))
    assert open_committed(LocalStore(path)).manifest.codec == "zstd"
    out = empty()
    ckptstore.load(out, path)
    assert torch.equal(out["w"], state()["w"])


def test_a_view_stores_only_its_own_bytes(tmp_path) -> None:
    big = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB storage
    view = big[1000:1100].view(10, 10)
    path = str(tmp_path / "step_1")
    ckptstore.save({"v": view}, path)
    assert os.path.getsize(shard_of(path)) < 64 * 1024
    out = {"v": torch.zeros(10, 10)}
    ckptstore.load(out, path)
    assert torch.equal(out["v"], view)


def test_missing_marker(ckpt) -> None:
    os.unlink(os.path.join(ckpt, MARKER_NAME))
    with pytest.raises(IncompleteCheckpointError, match="no COMMITTED marker"):
        ckptstore.reader(ckpt)


def test_empty_or_missing_location(tmp_path) -> None:
    with pytest.raises(IncompleteCheckpointError, match="no checkpoint at"):
        ckptstore.reader(str(tmp_path / "nothing_here"))


def test_marker_checksum_mismatch(ckpt) -> None:
    for name in os.listdir(ckpt):
        if name.startswith("ckptstore.manifest"):
            with open(os.path.join(ckpt, name), "ab") as f:
                f.write(b" ")
    with pytest.raises(CorruptCheckpointError, match="does not match the checksum"):
        ckptstore.reader(ckpt)


def test_canonical_manifest_damage_falls_back_to_the_attempt_copy(ckpt) -> None:
    with open(os.path.join(ckpt, MANIFEST_NAME), "ab") as f:
        f.write(b" ")
    out = empty()
    ckptstore.load(out, ckpt)
    assert torch.equal(out["w"], state()["w"])


def test_missing_metadata(ckpt) -> None:
    for name in os.listdir(ckpt):
        if name.startswith(".metadata"):
            os.unlink(os.path.join(ckpt, name))
    with pytest.raises(CorruptCheckpointError, match=".metadata is missing"):
        ckptstore.reader(ckpt)


def test_truncated_shard(ckpt) -> None:
    shard = shard_of(ckpt)
    os.truncate(shard, os.path.getsize(shard) - 100)
    with pytest.raises(CorruptCheckpointError, match="truncated"):
        ckptstore.load(empty(), ckpt)


def test_flipped_byte_names_file_and_range(ckpt) -> None:
    shard = shard_of(ckpt)
    with open(shard, "r+b") as f:
        f.seek(os.path.getsize(shard) - 50)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(CorruptCheckpointError, match=r"distcp bytes \[\d+, \d+\): checksum"):
        ckptstore.load(empty(), ckpt)


def test_deleted_shard(ckpt) -> None:
    os.unlink(shard_of(ckpt))
    with pytest.raises(CorruptCheckpointError, match="is missing"):
        ckptstore.load(empty(), ckpt)


def test_refuses_to_overwrite_a_committed_checkpoint(ckpt) -> None:
    before = sorted(os.listdir(ckpt))
    with pytest.raises(CheckpointExistsError, match="overwrite=True"):
        ckptstore.save(state(), ckpt)
    # The DCP-level check too (a writer built before the commit appeared).
    w = ckptstore.dcp.writer.CkptWriter(ckpt)
    with pytest.raises(CheckpointExistsError):
        ckptstore.save(state(), w)
    assert sorted(os.listdir(ckpt)) == before


def test_a_persistent_writer_checks_the_destination_each_save_writes(ckpt, tmp_path) -> None:
    """Built on a directory holding a committed checkpoint, a writer whose saves each name
    their own ``checkpoint_id`` saves there; only a save to the committed one is refused."""
    w = ckptstore.writer(ckpt)  # no refusal at construction
    other = str(tmp_path / "step_000000008")
    dcp.save(state(), checkpoint_id=other, storage_writer=w, no_dist=True)
    out = empty()
    ckptstore.load(out, other)
    assert torch.equal(out["w"], state()["w"])
    before = sorted(os.listdir(ckpt))
    with pytest.raises(BaseException) as caught:  # DCP's CheckpointException wraps it
        dcp.save(state(), checkpoint_id=ckpt, storage_writer=w, no_dist=True)
    refused = ckptstore.unwrap_checkpoint_exception(caught.value)
    assert isinstance(refused, CheckpointExistsError), refused
    assert "already holds a committed checkpoint" in str(refused)
    assert sorted(os.listdir(ckpt)) == before


def test_overwrite_replaces_and_cleans_the_old_attempt(ckpt) -> None:
    new = state()
    new["w"] += 1
    ckptstore.save(new, ckpt, overwrite=True)
    assert len([n for n in os.listdir(ckpt) if n.endswith(".distcp")]) == 1
    out = empty()
    ckptstore.load(out, ckpt)
    assert torch.equal(out["w"], new["w"])


def test_failing_write_commits_nothing(tmp_path) -> None:
    path = tmp_path / "step_000000001"
    store = FaultyStore(LocalStore(str(path)), [Fault("put", error=OSError(errno.EIO, "boom"))])
    with pytest.raises(ckptstore.TransferError):
        ckptstore.save(state(), ckptstore.dcp.writer.CkptWriter(store))
    assert not (path / MARKER_NAME).exists()
    assert LocalStore(str(path)).find() == []


def test_fsync_error_fails_the_checkpoint(tmp_path, monkeypatch) -> None:
    import ckptstore.stores.local as local

    def failing_fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(local.os, "fsync", failing_fsync)
    path = tmp_path / "step_000000002"
    with pytest.raises(DurabilityError, match="will not be retried"):
        ckptstore.save(state(), str(path))
    monkeypatch.undo()
    assert not (path / MARKER_NAME).exists()
    with pytest.raises(IncompleteCheckpointError):
        ckptstore.reader(str(path))


@pytest.mark.processes
def test_unwritable_path(tmp_path, request) -> None:
    """A directory the process may not write to. Root ignores permissions, so as root the
    save runs in a child process stripped of the capabilities that bypass them (setpriv)."""
    import shutil
    import subprocess
    import sys

    prefix: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("setpriv") is None:
            pytest.skip("running as root without setpriv: permissions cannot be enforced")
        prefix = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]

    base = str(tmp_path)
    os.chmod(base, 0o755)
    ro = os.path.join(base, "ro")
    os.mkdir(ro, 0o555)
    request.addfinalizer(lambda: os.chmod(ro, 0o755))  # so pytest can remove tmp_path
    target = os.path.join(ro, "step_000000001")
    code = (
        "import torch, ckptstore\n"
        "try:\n"
        f"    ckptstore.save({{'x': torch.ones(4)}}, {target!r})\n"
        "except ckptstore.StoreAccessError as e:\n"
        "    print('StoreAccessError:', e)\n"
    )
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo, HOME=base)
    proc = subprocess.run(
        [*prefix, sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=base
    )
    assert "StoreAccessError:" in proc.stdout, proc.stderr[-2000:]
    assert "permission denied" in proc.stdout
    assert not os.path.exists(target)


def test_path_under_a_file(tmp_path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(StoreAccessError, match="not a directory"):
        ckptstore.save(state(), str(blocker / "step_1"))
