"""S3Store against real servers (SeaweedFS; moto where SeaweedFS cannot show a quirk), with
faults injected by a wrapper store (FaultyStore) or on the wire (FaultProxy)."""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import ckptstore
from ckptstore.config import MiB, RetryConfig, TransferConfig
from ckptstore.engine import create_only
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.create_only import NonAtomicCreateWarning
from ckptstore.engine.store import Buffer, Multipart, Part
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import (
    CommitConflictError,
    StoreAccessError,
    StoreNotFoundError,
    TransferError,
    TransientStoreError,
)
from ckptstore.stores.s3 import S3Store
from ckptstore.stores.s3.body import as_body
from ckptstore.testing.faults import Fault, FaultyStore
from harness.dist import free_port
from harness.proxy import FaultProxy, Rule

from .conftest import BUCKET, unique, via

pytestmark = pytest.mark.server

PART = 5 * MiB
FAST = RetryConfig(attempts=4, base_backoff_s=0.01, max_backoff_s=0.05, deadline_s=60)


def engine(retry: RetryConfig = FAST, concurrency: int = 4) -> TransferEngine:
    return TransferEngine(
        TransferConfig(part_size=PART, concurrency=concurrency, memory_budget=8 * PART, retry=retry)
    )


class Observed(FaultyStore):
    """Holds the first ``parallel`` put_part calls at a barrier until all are in flight, and
    asks the server which parts it holds just before completing."""

    def __init__(self, inner: S3Store, parallel: int) -> None:
        super().__init__(inner)
        self.barrier = threading.Barrier(parallel)
        self.server_parts: list[Part] = []

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        if number <= self.barrier.parties:
            self.barrier.wait(timeout=30)  # raises BrokenBarrierError if parts run serially
        return super().put_part(upload, number, offset, data)

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        assert isinstance(self.inner, S3Store)
        self.server_parts = self.inner.list_parts(upload)
        super().complete_multipart(upload, parts)


def test_multipart_parts_upload_in_parallel(s3: S3Store) -> None:
    data = os.urandom(4 * PART + 1000)
    observed = Observed(s3, parallel=4)
    with engine(concurrency=4) as eng:
        info = eng.put(observed, "big.bin", data)
    assert not observed.barrier.broken
    assert [(p.number, p.size) for p in observed.server_parts] == [
        (1, PART),
        (2, PART),
        (3, PART),
        (4, PART),
        (5, 1000),
    ]
    assert info.crc32c == crc32c(data)
    assert crc32c(s3.get("big.bin")) == info.crc32c


def test_wrong_endpoint_fails_fast_with_clear_error(seaweedfs: Any) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    options = dict(seaweedfs.storage_options, endpoint_url=dead)
    start = time.monotonic()
    with pytest.raises(TransientStoreError) as err:
        ckptstore.writer(f"s3://{BUCKET}/run/step_000000001", storage_options=options)
    assert dead in str(err.value) and "endpoint_url" in str(err.value)
    store = S3Store(f"s3://{BUCKET}/run", options)
    with engine() as eng, pytest.raises(TransferError, match="cannot connect"):
        eng.put(store, "f.bin", b"x" * 100)
    assert time.monotonic() - start < 10


def test_missing_bucket_names_the_bucket(seaweedfs: Any) -> None:
    torch = pytest.importorskip("torch")
    url = "s3://no-such-bucket/run/step_000000001"
    options = seaweedfs.storage_options
    with pytest.raises(StoreNotFoundError, match="bucket 'no-such-bucket' does not exist"):
        ckptstore.save({"w": torch.ones(8)}, url, storage_options=options)
    with pytest.raises(StoreNotFoundError, match="create it or fix the URL"):
        ckptstore.reader(url, storage_options=options)


@pytest.mark.parametrize(
    ("key", "secret", "code"),
    [("testing", "wrong", "SignatureDoesNotMatch"), ("nobody", "testing", "InvalidAccessKeyId")],
)
def test_bad_credentials_fail_fast_as_access_errors(
    seaweedfs: Any, key: str, secret: str, code: str
) -> None:
    prefix = f"{BUCKET}/{unique()}"
    store = seaweedfs.store(prefix, storage_options={"key": key, "secret": secret})
    with engine() as eng:
        with pytest.raises(StoreAccessError) as err:
            eng.put(store, "f.bin", os.urandom(2 * PART))
        assert eng.stats.retries == 0  # a 403 is never retried
    message = str(err.value)
    assert f"s3://{prefix}/f.bin" in message and code in message and "credentials" in message
    with pytest.raises(StoreAccessError):
        ckptstore.writer(f"s3://{prefix}/step_1", storage_options=store.storage_options)


def test_part_failing_twice_then_succeeding(s3: S3Store) -> None:
    data = os.urandom(3 * PART + 77)
    faulty = FaultyStore(s3, [Fault("put_part", calls={2, 3}, error=TransientStoreError("503"))])
    with engine() as eng:
        info = eng.put(faulty, "f.bin", data)
        assert eng.stats.retries == 2
    assert info.size == len(data) and info.crc32c == crc32c(data)
    assert crc32c(s3.get("f.bin")) == info.crc32c
    assert s3.list_multipart() == []


def test_server_throttling_is_retried(seaweedfs: Any, s3: S3Store, proxy: FaultProxy) -> None:
    proxy.add(Rule("UploadPart", "status", status=503, code="SlowDown", times=2))
    proxy.add(Rule("CompleteMultipartUpload", "status", status=500, code="InternalError", times=1))
    data = os.urandom(2 * PART + 5)
    with engine() as eng:
        eng.put(via(proxy, seaweedfs, s3), "f.bin", data)
        assert eng.stats.retries == 3
    assert len(proxy.ops("UploadPart")) == 3 + 2
    assert s3.get("f.bin") == data


@pytest.mark.parametrize("checksum", ["crc32c", "md5"])
def test_bit_flip_in_transit_is_rejected_and_retried(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy, checksum: str
) -> None:
    proxy.add(Rule("UploadPart", "flip", times=1))
    data = os.urandom(2 * PART)
    with engine() as eng:
        eng.put(via(proxy, seaweedfs, s3, checksum=checksum), "f.bin", data)
        assert eng.stats.retries == 1  # the server answered BadDigest once
    assert len(proxy.ops("UploadPart")) == 3
    assert s3.get("f.bin") == data


def test_bit_flip_without_checksum_is_stored(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy
) -> None:
    """Why checksums are on: without one the server keeps the damaged bytes."""
    proxy.add(Rule("UploadPart", "flip", times=1))
    data = os.urandom(2 * PART)
    with engine() as eng:
        eng.put(via(proxy, seaweedfs, s3, checksum="none"), "f.bin", data)
        assert eng.stats.retries == 0
    assert s3.get("f.bin") != data


@pytest.mark.parametrize("checksum", ["crc32c", "none"])
def test_bodies_are_hashed_for_the_signature_only_without_a_checksum(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy, checksum: str
) -> None:
    """SHA-256 of every body is skipped (UNSIGNED-PAYLOAD) when a CRC32C travels with it."""
    data = os.urandom(2 * PART + 10)
    with engine() as eng:
        eng.put(via(proxy, seaweedfs, s3, checksum=checksum), "f.bin", data)
    signed = {r.headers.get("x-amz-content-sha256") for r in proxy.ops("UploadPart")}
    if checksum == "none":
        assert len(signed) == 3 and all(len(h or "") == 64 for h in signed)
    else:
        assert signed == {"UNSIGNED-PAYLOAD"}
        assert all("x-amz-checksum-crc32c" in r.headers for r in proxy.ops("UploadPart"))
    assert s3.get("f.bin") == data


def test_bodies_go_to_the_client_without_a_copy() -> None:
    pooled = bytearray(os.urandom(1000))
    assert as_body(memoryview(pooled)) is pooled  # a whole pooled part: no copy
    assert as_body(pooled) is pooled
    last = as_body(memoryview(pooled)[:10])  # a short last part: copied
    assert last == pooled[:10] and last is not pooled
    assert as_body(b"abc") == bytearray(b"abc")


def test_download_cut_short_is_retried(seaweedfs: Any, s3: S3Store, proxy: FaultProxy) -> None:
    data = os.urandom(2 * PART + 10)
    s3.put("f.bin", data)
    proxy.add(Rule("GetObject", "truncate", times=1))
    with engine() as eng:
        assert bytes(eng.read(via(proxy, seaweedfs, s3), "f.bin")) == data
        assert eng.stats.retries == 1
    assert len(proxy.ops("GetObject")) == 3 + 1


def test_always_failing_part_aborts_and_leaves_nothing(s3: S3Store) -> None:
    faulty = FaultyStore(s3, [Fault("put_part", calls={2}, error=StoreAccessError("denied"))])
    with engine() as eng, pytest.raises(StoreAccessError):
        eng.put(faulty, "f.bin", os.urandom(3 * PART))
    faulty = FaultyStore(s3, [Fault("put_part", error=TransientStoreError("injected 503"))])
    with engine() as eng, pytest.raises(TransferError, match="after 4 attempts"):
        eng.put(faulty, "g.bin", os.urandom(3 * PART))
    assert faulty.calls["abort_multipart"] == 1
    assert s3.list_multipart() == []
    assert s3.find() == []


def test_stalled_connection_hits_the_deadline(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy
) -> None:
    s3.put("r.bin", os.urandom(1000))
    proxy.add(Rule("UploadPart", "stall"))
    proxy.add(Rule("GetObject", "stall"))
    retry = RetryConfig(attempts=50, base_backoff_s=0.05, request_timeout_s=1, deadline_s=2.5)
    store = via(proxy, seaweedfs, s3, retry=retry)
    start = time.monotonic()
    with engine(retry) as eng:
        with pytest.raises(TransferError, match="deadline"):
            eng.put(store, "f.bin", os.urandom(2 * PART))
        with pytest.raises(TransferError, match="deadline"):
            eng.read(store, "r.bin")
    assert time.monotonic() - start < 15
    assert s3.list_multipart() == []
    assert s3.find() == ["r.bin"]


def test_lost_complete_response_is_idempotent(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy
) -> None:
    proxy.add(Rule("CompleteMultipartUpload", "drop_response", times=1))
    data = os.urandom(2 * PART + 3)
    with engine() as eng:
        eng.put(via(proxy, seaweedfs, s3), "f.bin", data)
    assert len(proxy.ops("CompleteMultipartUpload")) == 2
    assert s3.get("f.bin") == data


def test_complete_of_an_upload_already_gone(s3: S3Store) -> None:
    """NoSuchUpload on complete is success when the object is whole (a lost response)."""
    up = s3.begin_multipart("f.bin")
    parts = [s3.put_part(up, 1, 0, b"a" * PART), s3.put_part(up, 2, PART, b"b" * 9)]
    s3.complete_multipart(up, parts)
    gone = Multipart("f.bin", "no-such-upload")
    s3.complete_multipart(gone, parts)  # SeaweedFS: NoSuchUpload -> object matches -> done
    with pytest.raises(StoreNotFoundError, match="no longer exists"):
        s3.complete_multipart(gone, [parts[0], Part(2, PART, 10, parts[1].etag)])


def test_lost_create_response_is_not_a_conflict(
    seaweedfs: Any, s3: S3Store, proxy: FaultProxy
) -> None:
    proxy.add(Rule("PutObject", "drop_response", times=1))
    store = via(proxy, seaweedfs, s3, conditional_create=True)
    with engine() as eng:
        eng.retry(lambda: store.put_if_absent("COMMITTED", b"attempt A"), "commit")
    assert len(proxy.ops("PutObject")) == 2  # the retry met 412 and found its own bytes
    with pytest.raises(CommitConflictError):
        s3.put_if_absent("COMMITTED", b"attempt B")
    assert s3.get("COMMITTED") == b"attempt A"


def test_conditional_create_is_native_on_seaweedfs_and_moto(s3: S3Store, moto: Any) -> None:
    other = moto.store(f"{BUCKET}/{unique()}")
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonAtomicCreateWarning)
        for store in (s3, other):
            store.put_if_absent("M", b"1")
            with pytest.raises(CommitConflictError):
                store.put_if_absent("M", b"2")
            assert store.conditional_create is True
            assert store.find() == ["M"]  # the probe cleaned up after itself


def test_server_ignoring_if_none_match_gets_a_warned_fallback(
    moto: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto behind a proxy that strips If-None-Match: a server that ignores it."""
    monkeypatch.setattr(create_only, "_warned", set())
    with FaultProxy(moto.port) as proxy:
        proxy.add(Rule("PutObject", "strip_conditions"))
        options = dict(moto.storage_options, endpoint_url=proxy.endpoint)
        store = S3Store(f"s3://{BUCKET}/{unique()}", options)
        with pytest.warns(NonAtomicCreateWarning, match="ignores If-None-Match"):
            store.put_if_absent("M", b"1")
        assert store.conditional_create is False
        with pytest.raises(CommitConflictError):
            store.put_if_absent("M", b"2")
        barrier = threading.Barrier(6)

        def attempt(i: int) -> bool:
            barrier.wait(timeout=30)
            try:
                store.put_if_absent("N", str(i).encode())
                return True
            except CommitConflictError:
                return False

        with ThreadPoolExecutor(6) as pool:
            assert list(pool.map(attempt, range(6))).count(True) == 1
