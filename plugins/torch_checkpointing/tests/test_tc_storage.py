"""CkptStoreStorage's operations on every store the suite starts (``tc_root``), checked
through ckptstore's own store on the same root: writes of every buffer kind, whole and
ranged reads, listings, deletes, each row of torch_checkpointing's rename table, and
paths that leave the root."""

from __future__ import annotations

import array
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from torch_checkpointing.storage.base_storage import ReadArgs

from ckptstore.errors import CorruptCheckpointError, UnsafePathError
from ckptstore_tc import CkptStoreStorageConfig

M = Path("/ckpt")


@pytest.fixture
def env(tc_root):
    url, options, store = tc_root
    storage = CkptStoreStorageConfig(url, mount=str(M), storage_options=options).create_storage()
    return storage, store


def test_writes_of_every_buffer_kind_read_back(env) -> None:
    storage, store = env
    big = torch.arange(3 * 2**20, dtype=torch.int32)  # 12 MiB: parts sent from its memory
    storage.mkdir(M / "d")
    storage.write(M / "d/whole", b"whole file")
    with storage.stream_write(M / "d/stream") as f:
        for piece in (b"a", bytearray(b"b"), np.arange(3, dtype=np.int16), array.array("i", [7])):
            f.write(piece)
    with storage.get_write_stream(M / "d/big", big) as f:
        torch.save(big, f)
    expected = b"ab" + np.arange(3, dtype=np.int16).tobytes() + array.array("i", [7]).tobytes()
    assert store.get("d/whole") == b"whole file" and store.get("d/stream") == expected
    loaded = torch.load(storage.stream_read(M / "d/big"), weights_only=True)
    assert torch.equal(loaded, big)
    assert storage.getsize(M / "d/stream") == len(expected)
    assert sorted(storage.ls(M / "d")) == ["big", "stream", "whole"]
    assert storage.exists(M / "d") and storage.isdir(M / "d")
    assert storage.exists(M / "d/whole") and not storage.isdir(M / "d/whole")
    assert storage.remap_path(M / "d/whole") == store.describe("d/whole")


def test_a_stream_writes_what_it_was_given_when_it_was_given(env) -> None:
    storage, store = env
    buf = bytearray(os.urandom(4 * 2**20))  # large enough to be sent by reference
    first = bytes(buf)
    with storage.stream_write(M / "f") as f:
        f.write(buf)
        buf[:] = bytes(len(buf))  # a caller may reuse its buffer once write returns
        f.write(buf)
    assert store.get("f") == first + bytes(len(buf))


def test_ranged_reads_land_in_the_callers_buffer(env) -> None:
    storage, store = env
    data = os.urandom(9 * 2**20 + 5)
    store.put("f", data)
    with storage.stream_read(M / "f", ReadArgs(pre_read_full_file=False)) as f:
        f.seek(1000)
        buf = bytearray(5 * 2**20)
        assert f.readinto(buf) == len(buf) and bytes(buf) == data[1000 : 1000 + len(buf)]
        assert f.read() == data[1000 + len(buf) :]
        assert f.readinto(bytearray(10)) == 0  # at the end
    assert storage.read(M / "f", ReadArgs(known_size_bytes=len(data))) == data
    with pytest.raises(CorruptCheckpointError, match="not the 7 expected"):
        storage.read(M / "f", ReadArgs(known_size_bytes=7))


def test_a_stream_left_by_an_exception_leaves_nothing(env) -> None:
    storage, store = env
    with pytest.raises(RuntimeError, match="serializer failed"):
        with storage.stream_write(M / "torn") as f:
            f.write(os.urandom(2**20))
            raise RuntimeError("serializer failed")
    assert not storage.exists(M / "torn") and store.find() == []


def test_deletes(env) -> None:
    storage, store = env
    storage.mkdir(M / "d/e")
    storage.write(M / "d/a", b"1")
    storage.write(M / "d/e/b", b"2")
    storage.delete(M / "d/a")
    with pytest.raises(FileNotFoundError):
        storage.delete(M / "d/a")
    storage.rmdir(M / "d")
    assert store.find() == [] and not storage.exists(M / "d")


def _tree(storage, top: Path) -> dict[str, bytes]:
    files = {"a.bin": os.urandom(11 * 2**20 + 3), "sub/b.bin": b"b", "metadata.pkl": b"m"}
    for name, data in files.items():
        storage.mkdir((top / name).parent)
        storage.write(top / name, data)
    return files


def test_rename_table(env) -> None:
    storage, store = env
    files = _tree(storage, M / "tmp_step_1")
    # directory -> absent: its files land AT the destination
    storage.rename(M / "tmp_step_1", M / "step_1", is_directory=True)
    assert {n: store.get(f"step_1/{n}") for n in files} == files
    assert not storage.exists(M / "tmp_step_1")
    # directory -> populated directory, or -> a file: refused, neither side touched
    _tree(storage, M / "tmp_step_2")
    storage.write(M / "file", b"f")
    for dst in (M / "step_1", M / "file"):
        with pytest.raises(FileExistsError):
            storage.rename(M / "tmp_step_2", dst, is_directory=True)
    assert sorted(store.find("tmp_step_2")) == sorted(f"tmp_step_2/{n}" for n in files)
    assert sorted(store.find("step_1")) == sorted(f"step_1/{n}" for n in files)
    assert store.get("file") == b"f"
    # file -> file: replaced; file -> directory: refused
    storage.write(M / "new", b"new")
    storage.rename(M / "new", M / "file")
    assert store.get("file") == b"new" and not store.exists("new")
    with pytest.raises(FileExistsError):
        storage.rename(M / "file", M / "step_1")
    assert store.get("file") == b"new"


def test_rename_of_a_missing_source_raises(env) -> None:
    storage, _ = env
    with pytest.raises(FileNotFoundError):
        storage.rename(M / "absent", M / "dst", is_directory=True)


def test_paths_outside_the_mount_are_refused(env) -> None:
    storage, store = env
    for path in (Path("/elsewhere/x"), M / "../escape", Path("/ckptfoo/x")):
        with pytest.raises(UnsafePathError):
            storage.write(path, b"x")
    with pytest.raises(UnsafePathError):
        storage.rename(M / "a", Path("/elsewhere"), is_directory=True)
    assert store.find() == []


def test_a_symlink_below_a_volume_root_is_not_followed(tmp_path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)
    storage = CkptStoreStorageConfig(str(root)).create_storage()
    for op in (
        lambda: storage.write(root / "link/x", b"x"),
        lambda: storage.mkdir(root / "link/d"),
        lambda: storage.rmdir(root / "link"),
        lambda: storage.rename(root / "link", root / "moved", is_directory=True),
    ):
        with pytest.raises(UnsafePathError):
            op()
    assert os.listdir(outside) == [] and (root / "link").is_symlink()


def test_a_volume_write_needs_its_directory(tmp_path) -> None:
    storage = CkptStoreStorageConfig(str(tmp_path)).create_storage()
    for error in (FileNotFoundError, RuntimeError):  # RuntimeError: as torch_checkpointing's
        with pytest.raises(error, match="does not exist; create it"):
            storage.write(tmp_path / "absent/x", b"x")
    assert not (tmp_path / "absent").exists()


def test_the_transfer_settings_given_once_reach_the_engine(tmp_path) -> None:
    """``transfer`` (the glossary's word for the transfer settings, as in
    ``ckptstore.WriterOptions(transfer=...)`` and ``ckptstore.reader(transfer=...)``)."""
    from ckptstore import RetryConfig, TransferConfig

    transfer = TransferConfig(part_size=1 << 20, concurrency=3, retry=RetryConfig(attempts=2))
    config = CkptStoreStorageConfig(str(tmp_path), transfer=transfer)
    storage = config.create_storage()
    assert storage.engine.config == transfer
    storage.write(tmp_path / "f", bytes(3 << 20))  # three parts of 1 MiB
    assert os.path.getsize(tmp_path / "f") == 3 << 20
