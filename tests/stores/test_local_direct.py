"""The volume store's direct writes (``stores._direct``): a large part's page-aligned middle
goes out with O_DIRECT, the rest buffered; the file's bytes and a checkpoint's manifest are
those of buffered writes only (``CKPTSTORE_DIRECT_WRITES=0``); a file system that refuses
O_DIRECT (at open or at the first write) gets buffered writes; a full volume is a clear
error."""

from __future__ import annotations

import errno
import glob
import json
import mmap
import os
import tempfile

import pytest
import torch
import torch.distributed.checkpoint as dcp

import ckptstore
from ckptstore.errors import StorageFullError
from ckptstore.stores import _direct, local_durable
from ckptstore.stores.local import LocalStore

MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def _fresh_refusals(monkeypatch) -> None:
    monkeypatch.setattr(_direct, "_refused", set())


def _direct_ranges(monkeypatch) -> list[tuple[int, int]]:
    """Record the (lo, hi) of every ``write_aligned`` call the volume store makes."""
    seen: list[tuple[int, int]] = []
    real = local_durable.write_aligned

    def spy(*a):
        seen.append(real(*a))
        return seen[-1]

    monkeypatch.setattr(local_durable, "write_aligned", spy)
    return seen


def _direct_fds(monkeypatch, refuse_open: bool = False) -> tuple[list[str], set[int]]:
    """Track the opens with O_DIRECT: (every one tried, the descriptors open now); with
    ``refuse_open``, such an open fails with EINVAL instead."""
    real_open, real_close = os.open, os.close
    tried: list[str] = []
    open_now: set[int] = set()

    def tracking_open(path, flags, *a, **k):
        if flags & os.O_DIRECT:
            tried.append(path)
            if refuse_open:
                raise OSError(errno.EINVAL, "Invalid argument")
        fd = real_open(path, flags, *a, **k)
        if flags & os.O_DIRECT:
            open_now.add(fd)
        return fd

    def tracking_close(fd):
        open_now.discard(fd)
        real_close(fd)

    monkeypatch.setattr(os, "open", tracking_open)
    monkeypatch.setattr(os, "close", tracking_close)
    return tried, open_now


def _fail_direct_writes(monkeypatch, open_now: set[int], code: int) -> None:
    """Every ``pwrite`` to a descriptor opened with O_DIRECT fails with ``code``."""
    real_pwrite = os.pwrite

    def failing(fd, data, pos):
        if fd in open_now:
            raise OSError(code, os.strerror(code))
        return real_pwrite(fd, data, pos)

    monkeypatch.setattr(os, "pwrite", failing)


@pytest.fixture
def direct_dir(tmp_path):
    """``tmp_path``, where direct writes are made (skips on a file system that gets none)."""
    if _direct.fs_type(os.stat(tmp_path).st_dev) not in _direct.LOCAL_DISK_FS:
        pytest.skip("the temp directory is not on a local-disk file system")
    try:
        os.close(os.open(tmp_path / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o644))
    except OSError:
        pytest.skip("this file system refuses O_DIRECT")
    os.unlink(tmp_path / "probe")
    return tmp_path


def _state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {  # sizes that are no multiple of a page, so parts end mid-page
        "a": torch.randn(3_000_001, generator=g),
        "b": torch.randn(777, 1031, generator=g),
        "c": torch.arange(10),
    }


def _saved(path) -> tuple[bytes, list[dict]]:
    shard = glob.glob(str(path / "__0_0.*.distcp"))
    manifest = json.loads((path / "ckptstore.manifest.json").read_text())
    ranges = [{k: v for k, v in r.items() if k != "file"} for r in manifest["ranges"]]
    return open(shard[0], "rb").read(), ranges


def test_a_direct_save_writes_the_bytes_and_crcs_of_a_buffered_one(direct_dir, monkeypatch) -> None:
    tmp_path = direct_dir
    state = _state()
    ranges = _direct_ranges(monkeypatch)
    ckptstore.save(state, str(tmp_path / "direct"))
    assert any(hi > lo for lo, hi in ranges)  # the large parts went out direct
    monkeypatch.setenv(_direct.ENV, "0")
    done = len(ranges)
    ckptstore.save(state, str(tmp_path / "buffered"))
    assert all(lo == hi for lo, hi in ranges[done:])  # every byte buffered
    assert _saved(tmp_path / "direct") == _saved(tmp_path / "buffered")
    out = {k: torch.empty_like(v) for k, v in state.items()}
    dcp.load(out, storage_reader=dcp.FileSystemReader(str(tmp_path / "direct")))
    assert all(torch.equal(out[k], v) for k, v in state.items())


def test_parts_at_odd_offsets_from_odd_memory_in_any_order(tmp_path) -> None:
    """Parts whose offsets, lengths and memory are not page-aligned, written last first
    (direct writes into holes, then the buffered heads and tails around them)."""
    sizes = [5, 3 * MiB + 7, MiB - 1, 9 * MiB + 4097, 13, 2 * MiB]
    raw = bytearray(os.urandom(sum(sizes) + 1))
    data = memoryview(raw)[1:]  # memory one byte past wherever the allocator put it
    store = LocalStore(str(tmp_path))
    up = store.begin_multipart("f.bin")
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    parts = [
        store.put_part(up, i + 1, off, data[off : off + n])
        for i, (off, n) in reversed(list(enumerate(zip(offsets, sizes))))
    ]
    store.complete_multipart(up, sorted(parts, key=lambda p: p.number))
    assert store.get("f.bin") == bytes(data)


@pytest.mark.parametrize("where", ["open", "write"])
def test_a_file_system_refusing_o_direct_gets_buffered_writes(
    direct_dir, monkeypatch, where
) -> None:
    """EINVAL for O_DIRECT (a device with larger blocks, a file system without it) at the
    open or the first write: the part is written buffered and the file system is not
    tried again."""
    tmp_path = direct_dir
    tried, open_now = _direct_fds(monkeypatch, refuse_open=where == "open")
    _fail_direct_writes(monkeypatch, open_now, errno.EINVAL)
    ranges = _direct_ranges(monkeypatch)
    state = _state()
    ckptstore.save(state, str(tmp_path / "ckpt"))
    assert ranges and all(lo == hi for lo, hi in ranges)
    assert _direct._refused == {os.stat(tmp_path).st_dev}
    out = {k: torch.empty_like(v) for k, v in state.items()}
    ckptstore.load(out, str(tmp_path / "ckpt"))
    assert all(torch.equal(out[k], v) for k, v in state.items())
    assert tried  # parts in flight together may each have tried once
    before = len(tried)
    ckptstore.save(state, str(tmp_path / "again"))
    assert len(tried) == before  # never tried again on that file system


def test_a_full_volume_under_a_direct_write_is_a_clear_error(direct_dir, monkeypatch) -> None:
    tmp_path = direct_dir
    _, open_now = _direct_fds(monkeypatch)
    _fail_direct_writes(monkeypatch, open_now, errno.ENOSPC)
    store = LocalStore(str(tmp_path))
    up = store.begin_multipart("f.bin")
    with pytest.raises(StorageFullError, match="no space left"):
        store.put_part(up, 1, 0, os.urandom(2 * MiB))
    store.abort_multipart(up)
    assert os.listdir(tmp_path) == []


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_a_file_system_off_the_local_disk_gets_buffered_writes(monkeypatch) -> None:
    """tmpfs (as network and FUSE file systems): not one of LOCAL_DISK_FS, so no direct
    write is even tried there, though this kernel's tmpfs would take one."""
    tried, _ = _direct_fds(monkeypatch)
    ranges = _direct_ranges(monkeypatch)
    data = os.urandom(3 * MiB + 5)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root:
        store = LocalStore(root)
        up = store.begin_multipart("f.bin")
        part = store.put_part(up, 1, 0, data)
        store.complete_multipart(up, [part])
        assert store.get("f.bin") == data
    assert ranges == [(0, 0)] and tried == []


def test_a_file_put_in_place_of_the_part_file_gets_no_direct_write(direct_dir) -> None:
    """The direct write opens the part file's name again: a file renamed onto that name
    since the caller opened it is another inode, so it gets nothing; the caller's buffered
    writes through its own descriptor then carry the whole part."""
    path, other = str(direct_dir / "part.tmp"), str(direct_dir / "planted")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        with open(other, "wb") as f:
            f.write(b"planted")
        os.rename(other, path)  # the name now points at another file
        data = os.urandom(4 * MiB)
        dfd = os.open(direct_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            assert _direct.write_aligned(dfd, "part.tmp", fd, 0, memoryview(data)) == (0, 0)
        finally:
            os.close(dfd)
        with open(path, "rb") as f:
            assert f.read() == b"planted"
    finally:
        os.close(fd)


def _no_copy(monkeypatch) -> None:
    """A direct write that copies into the thread's chunk buffer fails the test."""

    def copied() -> memoryview:
        raise AssertionError("a direct write copied its part")

    monkeypatch.setattr(_direct, "_buffer", copied)


def test_a_part_whose_memory_agrees_with_its_offset_is_written_from_that_memory(
    direct_dir, monkeypatch
) -> None:
    """Memory and file offset at the same place within a page: the aligned middle goes
    out direct straight from the part's memory (the chunk buffer is never touched)."""
    ranges = _direct_ranges(monkeypatch)
    _no_copy(monkeypatch)
    offset, n = 3 * _direct.ALIGN + 100, 5 * MiB + 3
    pages = mmap.mmap(-1, 6 * MiB)  # page-aligned
    pages[:] = os.urandom(6 * MiB)
    part = memoryview(pages)[offset % _direct.ALIGN :][:n]
    store = LocalStore(str(direct_dir))
    up = store.begin_multipart("f.bin")
    head = os.urandom(offset)
    parts = [store.put_part(up, 1, 0, head), store.put_part(up, 2, offset, part)]
    store.complete_multipart(up, parts)
    assert store.get("f.bin") == head + bytes(part)
    assert ranges[-1] == (4 * _direct.ALIGN, (offset + n) // _direct.ALIGN * _direct.ALIGN)


def test_a_save_puts_a_large_tensor_where_it_is_written_from_its_memory(
    direct_dir, monkeypatch
) -> None:
    """The writer pads the shard file before a large tensor (zeros between items) so that
    its bytes' file offset agrees with their address modulo a page: written without a
    copy; stock DCP and ckptstore load it, the manifest's ranges and CRCs check."""
    state = {"small": torch.arange(10), "a": torch.randn(1_000_003), "b": torch.randn(3, MiB)}
    _no_copy(monkeypatch)
    ckptstore.save(state, str(direct_dir / "ckpt"))
    shard, ranges = _saved(direct_dir / "ckpt")
    by_key = {r["key"].partition("@")[0]: r for r in ranges}
    for key in ("a", "b"):
        at = by_key[key]["offset"] + by_key[key]["span"]["offset"]
        assert (at - state[key].data_ptr()) % _direct.ALIGN == 0
        assert shard[at : at + state[key].nbytes] == state[key].numpy().tobytes()
    ends = sorted((r["offset"], r["offset"] + r["length"]) for r in ranges)
    assert any(a < b for (_, a), (b, _) in zip(ends, ends[1:]))  # a pad between two items
    out = {k: torch.empty_like(v) for k, v in state.items()}
    dcp.load(out, storage_reader=dcp.FileSystemReader(str(direct_dir / "ckpt")))
    assert all(torch.equal(out[k], v) for k, v in state.items())
    out = {k: torch.empty_like(v) for k, v in state.items()}
    ckptstore.load(out, str(direct_dir / "ckpt"))
    assert all(torch.equal(out[k], v) for k, v in state.items())
    assert ckptstore.verify_checkpoint(LocalStore(str(direct_dir / "ckpt"))).ok
