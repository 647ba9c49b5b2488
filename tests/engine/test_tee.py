"""TeeWriter: one stream of bytes to a local file and an upload at once, over real volumes."""

import os

import numpy as np
import pytest

from ckptstore.config import RetryConfig, TransferConfig
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.tee import TeeWriter
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import DurabilityError, StoreAccessError
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import Fault, FaultyStore

FAST = RetryConfig(attempts=2, base_backoff_s=0.01, max_backoff_s=0.02, deadline_s=10)
PART = 4096


def engine(budget_parts: int = 8) -> TransferEngine:
    return TransferEngine(
        TransferConfig(part_size=PART, memory_budget=budget_parts * PART, retry=FAST)
    )


def write_some(tee: TeeWriter) -> bytes:
    """A small blob by ``write``, then an item of a large array (sent by reference)."""
    blob = os.urandom(1000)
    array = np.random.default_rng(0).integers(0, 255, 2 * 1024 * 1024 + 5, dtype=np.uint8)
    tee.write(blob)
    with tee.item(payload=(array.ctypes.data, array.nbytes), owner=array) as sink:
        sink.write(b"head")
        sink.write(memoryview(array))
    assert sink.span is not None and sink.span.crc32c == crc32c(array)
    return blob + b"head" + array.tobytes()


def test_both_files_get_the_same_bytes_hashed_once(tmp_path) -> None:
    local, remote = LocalStore(str(tmp_path / "l")), LocalStore(str(tmp_path / "r"))
    with engine() as e:
        with TeeWriter(e.writer(local, "f.bin"), e.writer(remote, "f.bin")) as tee:
            data = write_some(tee)
            info = tee.close()
        assert tee.secondary_error is None
        assert e.buffers.in_use == 0
    assert (info.size, info.crc32c) == (len(data), crc32c(data))
    assert local.get("f.bin") == data and remote.get("f.bin") == data
    assert local.find() == ["f.bin"] and remote.find() == ["f.bin"]  # no temp files


def test_a_failed_upload_is_aborted_and_the_local_file_still_completes(tmp_path) -> None:
    local = LocalStore(str(tmp_path / "l"))
    remote = FaultyStore(
        LocalStore(str(tmp_path / "r")), [Fault("put_part", error=StoreAccessError("down"))]
    )
    with engine() as e:
        tee = TeeWriter(e.writer(local, "f.bin"), e.writer(remote, "f.bin"))
        data = write_some(tee)
        info = tee.close()
        assert e.buffers.in_use == 0
    assert isinstance(tee.secondary_error, StoreAccessError)
    assert "down" in str(tee.secondary_error)
    assert (info.size, local.get("f.bin")) == (len(data), data)
    assert remote.find() == [] and remote.list_multipart() == []  # nothing half-made


@pytest.mark.parametrize("method", ["put_part", "complete_multipart"])
def test_a_failed_local_write_raises_and_publishes_no_upload(tmp_path, method) -> None:
    local = FaultyStore(
        LocalStore(str(tmp_path / "l")), [Fault(method, error=DurabilityError("injected EIO"))]
    )
    remote = LocalStore(str(tmp_path / "r"))
    with engine() as e:
        with pytest.raises(DurabilityError, match="EIO"):
            with TeeWriter(e.writer(local, "f.bin"), e.writer(remote, "f.bin")) as tee:
                write_some(tee)
                tee.close()
        assert e.buffers.in_use == 0
    assert local.find() == [] and remote.find() == []
    assert remote.list_multipart() == []


def test_fits_needs_a_part_of_each_in_the_budget(tmp_path) -> None:
    a, b = LocalStore(str(tmp_path / "a")), LocalStore(str(tmp_path / "b"))
    with engine(budget_parts=1) as e:
        assert not TeeWriter.fits(e.writer(a, "f"), e.writer(b, "f"))
    with engine(budget_parts=2) as e:
        assert TeeWriter.fits(e.writer(a, "f"), e.writer(b, "f"))


def test_small_writes_gather_around_a_payload_and_keep_its_span(tmp_path) -> None:
    """An item written as torch.save writes one (many small records around the storage):
    the small writes are sent together, the bytes, the item's CRC32C and the payload's
    span (offset, length, CRC32C) are those of the writes in order."""
    from ckptstore.engine.itemsink import GATHER_MAX

    rng = np.random.default_rng(1)
    array = rng.integers(0, 255, 3 * GATHER_MAX + 7, dtype=np.uint8)
    small = [os.urandom(n) for n in (3, GATHER_MAX - 1, 1, GATHER_MAX // 2, GATHER_MAX)]
    store = LocalStore(str(tmp_path))
    with engine() as e:
        writer = e.writer(store, "f.bin")
        with writer.item(payload=(array.ctypes.data, array.nbytes), owner=array) as sink:
            for chunk in small[:3]:
                sink.write(chunk)
            sink.write(memoryview(array))
            for chunk in small[3:]:
                sink.write(chunk)
        info = writer.close()
    head = b"".join(small[:3])
    data = head + array.tobytes() + b"".join(small[3:])
    assert (sink.offset, sink.length, sink.crc32c) == (0, len(data), crc32c(data))
    assert sink.span is not None
    assert (sink.span.offset, sink.span.length) == (len(head), array.nbytes)
    assert sink.span.crc32c == crc32c(array)
    assert (info.size, info.crc32c) == (len(data), crc32c(data))
    assert store.get("f.bin") == data
