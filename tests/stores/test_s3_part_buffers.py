"""S3 parts sent from several buffers (``ckptstore.engine.parts``) against SeaweedFS: a large write
goes out from the caller's memory inside parts of the usual size, small writes through small
buffers, and a fault on the wire still leaves nothing visible."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from ckptstore.config import MiB, RetryConfig, TransferConfig
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.store import Buffer, Multipart, Part
from ckptstore.engine.transfer import TransferEngine
from ckptstore.engine.writeplan import GATHER_BUFFER
from ckptstore.errors import CkptStoreError, TransferError
from ckptstore.stores.s3 import S3Store
from ckptstore.testing.faults import FaultyStore
from harness.proxy import FaultProxy, Rule

from .conftest import via

pytestmark = pytest.mark.server

PART = 6 * MiB  # the smallest part size that builds parts from several buffers (5 MiB + a buffer)
FAST = RetryConfig(attempts=3, base_backoff_s=0.01, max_backoff_s=0.05, deadline_s=60)


def engine() -> TransferEngine:
    return TransferEngine(
        TransferConfig(part_size=PART, concurrency=4, memory_budget=4 * PART, retry=FAST)
    )


class Recorded(FaultyStore):
    """Passes each part's buffers to the S3 store as they are, noting where they point."""

    def __init__(self, inner: S3Store) -> None:
        super().__init__(inner)
        self.parts: dict[int, list[tuple[int, int]]] = {}  # number -> [(address, length)]
        self.crcs: dict[int, int | None] = {}  # number -> the CRC32C the engine passed

    def put_part_buffers(
        self,
        upload: Multipart,
        number: int,
        offset: int,
        buffers: Sequence[Buffer],
        *,
        crc32c: int | None = None,
    ) -> Part:
        self.parts[number] = [(np.frombuffer(p, np.uint8).ctypes.data, len(p)) for p in buffers]
        self.crcs[number] = crc32c
        return self.inner.put_part_buffers(upload, number, offset, buffers, crc32c=crc32c)


def write_items(eng: TransferEngine, store: Any, items: list[np.ndarray]) -> tuple[Any, bytes]:
    """Each item as a small header written through ``write`` and its bytes through an
    ``ItemSink`` that holds the array (as the DCP writer does); the file and its bytes."""
    expected = bytearray()
    with eng.writer(store, "f.bin") as w:
        for i, arr in enumerate(items):
            header = f"item {i}: {arr.nbytes} bytes;".encode()
            w.write(header)
            with w.item(owner=arr) as sink:
                sink.write(memoryview(arr))
            expected += header + arr.tobytes()
        info = w.close()
    return info, bytes(expected)


def part_number(target: str) -> int:
    query = dict(kv.split("=", 1) for kv in target.partition("?")[2].split("&") if "=" in kv)
    return int(query["partNumber"])


def check_parts(proxy: FaultProxy, total: int) -> None:
    uploads = sorted(
        proxy.ops("UploadPart"), key=lambda r: part_number(r.target)
    )  # sent in any order
    sizes = [r.size for r in uploads]
    assert sum(sizes) == total and all(s <= PART for s in sizes)
    assert all(s >= 5 * MiB for s in sizes[:-1])  # S3's rule; the last may be short
    assert not any("expect" in r.headers for r in proxy.ops("UploadPart"))  # no extra round trip


def array(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)


def test_a_tensor_spanning_many_parts_is_sent_from_its_own_memory(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy
) -> None:
    tensor = array(4 * PART + 12345, 1)
    recorded = Recorded(via(proxy, seaweedfs, s3, retry=FAST))
    with engine() as eng:
        info, expected = write_items(eng, recorded, [tensor])
        assert eng.buffers.in_use == 0  # every buffer and reservation given back
    assert s3.get("f.bin") == expected and info.crc32c == crc32c(expected)
    check_parts(proxy, len(expected))
    start, end = tensor.ctypes.data, tensor.ctypes.data + tensor.nbytes
    from_tensor = [n for ps in recorded.parts.values() for a, n in ps if start <= a < end]
    assert sum(from_tensor) == tensor.nbytes  # not one byte of it copied into a part buffer
    assert len(recorded.parts) == 5 and s3.list_multipart() == []
    # Every part went with the CRC32C the engine computed while building it (the store did
    # not hash it again), and SeaweedFS, which checks the header, accepted each one.
    assert len(recorded.crcs) == 5 and None not in recorded.crcs.values()


def test_headers_and_tensors_share_parts(seaweedfs: Any, s3: S3Store, proxy: FaultProxy) -> None:
    items = [array(2 * MiB + i, i) for i in range(7)]  # 2 MiB tensors, a header before each
    recorded = Recorded(via(proxy, seaweedfs, s3, retry=FAST))
    with engine() as eng:
        info, expected = write_items(eng, recorded, items)
    assert s3.get("f.bin") == expected and info.size == len(expected)
    check_parts(proxy, len(expected))
    assert max(len(ps) for ps in recorded.parts.values()) >= 4  # header, tensor, header, ...


def test_a_file_smaller_than_a_part_is_one_put(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy
) -> None:
    items = [array(2 * MiB, 3), array(GATHER_BUFFER + 1, 4)]
    with engine() as eng:
        info, expected = write_items(eng, via(proxy, seaweedfs, s3, retry=FAST), items)
        assert eng.buffers.in_use == 0
    assert s3.get("f.bin") == expected and info.crc32c == crc32c(expected)
    assert len(proxy.ops("PutObject")) == 1 and proxy.ops("UploadPart") == []


@pytest.mark.parametrize("checksum", ["crc32c", "md5"])
def test_a_part_damaged_in_transit_is_resent_from_the_same_memory(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy, checksum: str
) -> None:
    proxy.add(Rule("UploadPart", "flip", times=1))
    items = [array(3 * MiB, 5), array(2 * PART, 6)]
    with engine() as eng:
        _, expected = write_items(
            eng, via(proxy, seaweedfs, s3, retry=FAST, checksum=checksum), items
        )
        assert eng.stats.retries == 1  # the server answered BadDigest once
    assert s3.get("f.bin") == expected


def test_signed_bodies_are_read_from_their_buffers(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy
) -> None:
    """Without a checksum header botocore hashes each body for the signature (``read``)."""
    items = [array(PART + 1, 7)]
    with engine() as eng:
        _, expected = write_items(
            eng, via(proxy, seaweedfs, s3, retry=FAST, checksum="none"), items
        )
    signed = {r.headers.get("x-amz-content-sha256") for r in proxy.ops("UploadPart")}
    assert len(signed) == 2 and all(len(h or "") == 64 for h in signed)
    assert s3.get("f.bin") == expected


def test_a_connection_reset_mid_upload_leaves_nothing(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy
) -> None:
    proxy.add(Rule("UploadPart", "reset"))  # every part: its connection dies unanswered
    items = [array(300, 8), array(3 * PART, 9)]
    with engine() as eng:
        with pytest.raises(TransferError):
            write_items(eng, via(proxy, seaweedfs, s3, retry=FAST), items)
        assert eng.buffers.in_use == 0
    assert len(proxy.ops("AbortMultipartUpload")) == 1
    assert s3.find() == [] and s3.list_multipart() == []


def test_stores_without_gathering_get_the_buffers_joined(s3: S3Store) -> None:
    """The contract's default ``put_part_buffers`` joins the buffers and calls ``put_part``."""
    upload = s3.begin_multipart("j.bin")
    head, body = b"head", bytearray(os.urandom(5 * MiB))
    wrapped = FaultyStore(s3)  # a store without its own put_part_buffers
    part = wrapped.put_part_buffers(upload, 1, 0, [head, memoryview(body)])
    s3.complete_multipart(upload, [part])
    assert wrapped.calls["put_part"] == 1 and part.size == len(head) + len(body)
    assert s3.get("j.bin") == head + body


def test_the_crc_the_engine_passes_is_the_one_sent(s3: S3Store) -> None:
    """``put_part_buffers(crc32c=)`` is sent as the part's checksum header as is: a wrong
    one is refused by the server (it checks the bytes against it), the right one accepted."""
    upload = s3.begin_multipart("c.bin")
    body = bytearray(os.urandom(5 * MiB))
    with pytest.raises(CkptStoreError):
        s3.put_part_buffers(upload, 1, 0, [memoryview(body)], crc32c=crc32c(body) ^ 1)
    part = s3.put_part_buffers(upload, 1, 0, [memoryview(body)], crc32c=crc32c(body))
    s3.complete_multipart(upload, [part])
    assert s3.get("c.bin") == body
