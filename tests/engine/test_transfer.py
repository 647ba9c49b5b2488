"""The transfer engine over a real volume store, with faults injected by a wrapper store."""

import os
import threading
import time

import pytest

from ckptstore.config import RetryConfig, TransferConfig
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.retry import backoff_delay
from ckptstore.engine.store import Buffer, Multipart, Part
from ckptstore.engine.transfer import TransferEngine, plan_part_size, split_ranges
from ckptstore.errors import StoreAccessError, TransferError, TransientStoreError
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import Fault, FaultyStore

FAST_RETRY = RetryConfig(attempts=4, base_backoff_s=0.01, max_backoff_s=0.05, deadline_s=30)


def engine(part_size: int = 1024, **kw: object) -> TransferEngine:
    return TransferEngine(
        TransferConfig(part_size=part_size, memory_budget=8 * part_size, retry=FAST_RETRY, **kw)
    )


def test_multipart_round_trip_and_checksum(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    data = os.urandom(10 * 1024 + 17)
    with engine() as e:
        info = e.put(store, "a/b.bin", data)
        assert (info.size, info.crc32c) == (len(data), crc32c(data))
        assert store.get("a/b.bin") == data
        assert bytes(e.read(store, "a/b.bin", 1000, 5000)) == data[1000:6000]
        assert bytes(e.read(store, "a/b.bin")) == data
    assert store.find() == ["a/b.bin"]  # no temp files left behind


def test_streamed_writes_report_offsets_and_accept_precomputed_crc(tmp_path) -> None:
    store = LocalStore(str(tmp_path))
    pieces = [os.urandom(n) for n in (10, 3000, 1, 2048)]
    with engine() as e, e.writer(store, "f") as w:
        offsets = [w.write(p, crc32c(p) if i % 2 else None) for i, p in enumerate(pieces)]
        info = w.close()
    assert offsets == [0, 10, 3010, 3011]
    assert info.crc32c == crc32c(b"".join(pieces))
    assert store.get("f") == b"".join(pieces)


class ConcurrencyProbe(FaultyStore):
    """Records the most put_part calls in flight at once."""

    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner)
        self.inflight = 0
        self.peak = 0
        self._probe = threading.Lock()

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        with self._probe:
            self.inflight += 1
            self.peak = max(self.peak, self.inflight)
        time.sleep(0.02)
        try:
            return super().put_part(upload, number, offset, data)
        finally:
            with self._probe:
                self.inflight -= 1


def test_parts_are_written_in_parallel(tmp_path) -> None:
    store = ConcurrencyProbe(LocalStore(str(tmp_path)))
    with engine(concurrency=4) as e:
        e.put(store, "big", os.urandom(16 * 1024))
    assert store.calls["put_part"] == 16
    assert store.peak >= 2


def test_transient_part_failures_are_retried(tmp_path) -> None:
    store = FaultyStore(
        LocalStore(str(tmp_path)),
        [Fault("put_part", calls={2, 3, 5}, error=TransientStoreError("injected 503"))],
    )
    data = os.urandom(6 * 1024)
    with engine() as e:
        info = e.put(store, "x", data)
        assert e.stats.retries == 3
    assert info.crc32c == crc32c(data)
    assert store.inner.get("x") == data


def test_permanent_failure_aborts_and_leaves_nothing(tmp_path) -> None:
    store = FaultyStore(
        LocalStore(str(tmp_path)), [Fault("put_part", error=TransientStoreError("always 500"))]
    )
    with engine() as e, pytest.raises(TransferError, match="after 4 attempts"):
        e.put(store, "x", os.urandom(6 * 1024))
    assert store.calls["abort_multipart"] == 1
    assert store.inner.find() == []
    assert store.inner.list_multipart() == []


def test_access_errors_fail_fast_without_retry(tmp_path) -> None:
    store = FaultyStore(LocalStore(str(tmp_path)), [Fault("put", error=StoreAccessError("403"))])
    with engine() as e, pytest.raises(StoreAccessError):
        e.put(store, "x", b"small")
    assert store.calls["put"] == 1


def test_stalled_call_hits_the_deadline(tmp_path) -> None:
    store = FaultyStore(
        LocalStore(str(tmp_path)),
        [Fault("put_part", delay=0.3, error=TransientStoreError("stalled, then reset"))],
    )
    retry = RetryConfig(attempts=100, base_backoff_s=0.2, max_backoff_s=0.5, deadline_s=1.0)
    start = time.monotonic()
    with TransferEngine(TransferConfig(part_size=1024, retry=retry)) as e:
        with pytest.raises(TransferError, match="deadline"):
            e.put(store, "x", os.urandom(4096))
    assert time.monotonic() - start < 10
    assert store.inner.find() == []


def test_bit_flip_in_transit_is_caught_by_the_checksum(tmp_path) -> None:
    store = FaultyStore(LocalStore(str(tmp_path)), [Fault("put_part", calls={2}, corrupt=True)])
    data = os.urandom(4096)
    with engine() as e:
        info = e.put(store, "x", data)
    # The engine's CRC describes what was meant to be written; the stored bytes differ.
    assert info.crc32c == crc32c(data) != crc32c(store.inner.get("x"))


def test_pure_helpers() -> None:
    assert plan_part_size(None, 8, 5, 10_000) == 8
    assert plan_part_size(100_000, 8, 5, 100) == 1000
    assert split_ranges(10, 25, 10) == [(10, 20), (20, 30), (30, 35)]
    cfg = RetryConfig(base_backoff_s=1, max_backoff_s=3, jitter=0.5)
    assert backoff_delay(cfg, 1, 0.3) == 0
    assert backoff_delay(cfg, 2, 0.0) == 1
    assert backoff_delay(cfg, 5, 0.0) == 3
    assert backoff_delay(cfg, 3, 1.0) == 1.0


def test_item_sink_streams_torch_save_and_checksums_once(tmp_path) -> None:
    import io

    import torch

    store = LocalStore(str(tmp_path))
    t = torch.randn(5000)
    with engine() as e, e.writer(store, "f") as w:
        w.write(b"header")
        with w.item() as sink:
            torch.save(t, sink)
        info = w.close()
    ref = io.BytesIO()
    torch.save(t, ref)
    stored = store.get("f")
    assert stored[sink.offset : sink.offset + sink.length] == ref.getvalue()
    assert sink.crc32c == crc32c(ref.getvalue())
    assert info.crc32c == crc32c(stored)
