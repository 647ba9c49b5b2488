"""The durable save on a volume: which fsyncs it makes, batched directory fsyncs
(``Store.put_many``), small part buffers, and that a write torn mid-file or a failed
fsync never leaves anything that looks committed."""

from __future__ import annotations

import errno
import os
import stat

import pytest
import torch

import ckptstore
from ckptstore.config import TransferConfig, WriterOptions
from ckptstore.dcp.writer import CkptWriter
from ckptstore.engine import transfer
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.committed import CheckpointStatus, checkpoint_status
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.names import TMP_MARK
from ckptstore.engine.transfer import TransferEngine
from ckptstore.engine.writeplan import COPY_MAX, SMALL_PART, SMALL_QUEUED, ZERO_COPY_MIN
from ckptstore.errors import DurabilityError, TransferError, UnsafePathError
from ckptstore.stores._posix import start_writeback
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import Fault, FaultyStore


class FsyncLog:
    """Every ``os.fsync`` of this process: ("dir" | "file", path it was open on)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[str, str]] = []
        real = os.fsync

        def logged(fd: int) -> None:
            mode = os.fstat(fd).st_mode
            self.calls.append(
                ("dir" if stat.S_ISDIR(mode) else "file", os.readlink(f"/proc/self/fd/{fd}"))
            )
            real(fd)

        monkeypatch.setattr(os, "fsync", logged)

    def count(self, kind: str) -> int:
        return sum(1 for k, _ in self.calls if k == kind)


def state() -> dict:
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(512, 1024, generator=g), "b": torch.arange(10)}


def test_put_many_fsyncs_each_file_and_each_directory_once(tmp_path, monkeypatch) -> None:
    store = LocalStore(str(tmp_path))
    os.mkdir(tmp_path / "sub")
    log = FsyncLog(monkeypatch)
    items = [("a.json", b"a" * 10), ("sub/b", b"b" * 20), ("sub/c", b"c"), ("d", b"")]
    store.put_many(items)
    for name, data in items:
        assert store.get(name) == data
    assert sorted(store.find()) == ["a.json", "d", "sub/b", "sub/c"]  # no temp file left
    assert log.count("file") == 4
    assert sorted(p for k, p in log.calls if k == "dir") == [str(tmp_path), str(tmp_path / "sub")]
    # every file was fsynced under its temp name, before any rename made one visible
    assert all(TMP_MARK in p for k, p in log.calls if k == "file")


def test_put_many_that_fails_leaves_no_file_and_no_temp(tmp_path, monkeypatch) -> None:
    store = LocalStore(str(tmp_path))
    real, seen = os.fsync, []

    def second_fails(fd: int) -> None:
        seen.append(fd)
        if len(seen) == 2:
            raise OSError(errno.EIO, "Input/output error")
        real(fd)

    monkeypatch.setattr(os, "fsync", second_fails)
    with pytest.raises(DurabilityError, match="will not be retried"):
        store.put_many([("a", b"1"), ("b", b"2"), ("c", b"3")])
    monkeypatch.undo()
    assert os.listdir(tmp_path) == []  # nothing renamed, every temp removed


def test_put_many_refuses_an_unsafe_name_before_writing(tmp_path) -> None:
    store = LocalStore(str(tmp_path / "root"))
    with pytest.raises(UnsafePathError):
        store.put_many([("ok", b"1"), ("../escape", b"2")])
    assert not (tmp_path / "escape").exists()
    assert not (tmp_path / "root").exists() or os.listdir(tmp_path / "root") == []


def test_a_save_makes_these_fsyncs_and_no_others(tmp_path, monkeypatch) -> None:
    """One rank, one shard file: 8 files each fsynced once (the save's step lease, shard,
    the attempt's manifest and .metadata, its commit fence, COMMITTED, the canonical
    .metadata and manifest) and 7 directory fsyncs (the new step directory's parent and
    the step directory after the lease, after the shard's rename, after the attempt
    copies, after the fence, after the marker, after the canonical copies)."""
    path = tmp_path / "step_000000001"
    log = FsyncLog(monkeypatch)
    ckptstore.save(state(), str(path))
    files = [os.path.basename(p).split(TMP_MARK)[0] for k, p in log.calls if k == "file"]
    assert len(files) == 8 and len(set(files)) == 8
    assert files[0].startswith("ckptstore.lease.")
    assert files[1].endswith(".distcp") and files[4].startswith("ckptstore.fence.")
    assert files[5] == MARKER_NAME
    assert log.count("dir") == 7
    out = {"w": torch.zeros(512, 1024), "b": torch.zeros(10, dtype=torch.int64)}
    ckptstore.load(out, str(path))
    assert torch.equal(out["w"], state()["w"])


def test_a_write_torn_mid_file_never_looks_committed(tmp_path) -> None:
    """The second of the shard's four parts fails for good: the save fails, no marker,
    no data file and no temp file remain, the step reads as incomplete."""
    path = tmp_path / "step_000000003"
    store = FaultyStore(
        LocalStore(str(path)), [Fault("put_part", calls={2}, error=OSError(errno.EIO, "torn"))]
    )
    cfg = TransferConfig(part_size=1 << 19, memory_budget=1 << 21)
    with pytest.raises((TransferError, OSError)):
        ckptstore.save(state(), CkptWriter(store, WriterOptions(transfer=cfg)))
    assert store.calls["put_part"] >= 2
    assert not (path / MARKER_NAME).exists()
    assert LocalStore(str(path)).find() == []
    assert checkpoint_status(LocalStore(str(path))) == CheckpointStatus.INCOMPLETE


def test_a_corrupted_byte_in_a_multipart_shard_is_caught(tmp_path) -> None:
    path = tmp_path / "step_000000004"
    cfg = TransferConfig(part_size=1 << 20)
    ckptstore.save(
        state(), CkptWriter(str(path), WriterOptions(transfer=cfg))
    )  # two parts of 1 MiB
    shard = next(p for p in path.iterdir() if p.name.endswith(".distcp"))
    with open(shard, "r+b") as f:
        f.seek(shard.stat().st_size // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x01]))
    out = {"w": torch.zeros(512, 1024), "b": torch.zeros(10, dtype=torch.int64)}
    with pytest.raises(ckptstore.CorruptCheckpointError, match=shard.name):
        ckptstore.load(out, str(path))


def test_small_writes_go_through_small_buffers_on_a_volume(tmp_path) -> None:
    """On a volume only writes under 1 MiB are copied, into SMALL_PART buffers (not a
    whole 32 MiB part_size); a stream of them still makes the same file and CRC32C."""
    chunks = [os.urandom(n) for n in (10, 300_000, 700_000, 5, 999_999) * 6]
    with TransferEngine(TransferConfig()) as e:
        w = e.writer(LocalStore(str(tmp_path)), "f.bin")
        assert w.buffer_size == SMALL_PART < e.config.part_size
        for c in chunks:
            w.write(c)
        info = w.close()
        assert e.buffers.in_use == 0
    data = b"".join(chunks)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert (info.size, info.crc32c) == (len(data), crc32c(data))


def test_a_volume_file_queues_at_most_small_queued_part_buffers(tmp_path, monkeypatch) -> None:
    """Small writes faster than the volume's writers (each part write held 50 ms) wait
    for a queued part buffer to be written rather than fill new ones: the file never has
    more than SMALL_QUEUED buffers queued (2 cores: 1 writer) plus the one being filled,
    and is whole."""
    monkeypatch.setattr(transfer, "rank_cores", lambda: 2)
    chunks = [os.urandom(n) for n in (300_000, 700_000, 10) * 8]  # ~8 MiB of small writes
    store = FaultyStore(LocalStore(str(tmp_path)), [Fault("put_part", delay=0.05)])
    with TransferEngine(TransferConfig()) as e:
        w = e.writer(store, "f.bin")
        for c in chunks:
            w.write(c)
        info = w.close()
        assert e.buffers.peak_buffers_out <= (SMALL_QUEUED + 1) * SMALL_PART
        assert e.buffers.in_use == 0
    data = b"".join(chunks)
    assert (tmp_path / "f.bin").read_bytes() == data
    assert (info.size, info.crc32c) == (len(data), crc32c(data))


@pytest.mark.parametrize("small", [COPY_MAX, COPY_MAX + 1, SMALL_PART - 1])
def test_small_writes_before_a_large_one_go_out_copied_or_as_their_buffer(
    tmp_path, small: int
) -> None:
    """Before a large write (sent from the caller's memory) the buffered small writes go
    out as a copy of their bytes (up to COPY_MAX) or as the buffer itself; either way the
    file holds every byte in order."""
    big = bytearray(os.urandom(2 * ZERO_COPY_MIN))
    head, tail = os.urandom(small), os.urandom(100)
    with TransferEngine(TransferConfig()) as e:
        w = e.writer(LocalStore(str(tmp_path)), "f.bin")
        w.write(head)
        w.write(big)
        w.write(tail)
        info = w.close()
    data = head + bytes(big) + tail
    assert (tmp_path / "f.bin").read_bytes() == data
    assert (info.size, info.crc32c) == (len(data), crc32c(data))


def test_start_writeback_is_only_a_hint(tmp_path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 4096)
    fd = os.open(p, os.O_RDONLY)
    try:
        start_writeback(fd, 0, 4096)  # a read-only fd: the kernel refuses, nothing raises
    finally:
        os.close(fd)
    start_writeback(fd, 0, 4096)  # a closed fd: the same
    assert p.read_bytes() == b"x" * 4096
