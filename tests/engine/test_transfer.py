"""The transfer engine over a real volume store, with faults injected by a wrapper store."""

import dataclasses
import os
import threading
import time

import numpy as np
import pytest

from ckptstore.config import RetryConfig, TransferConfig
from ckptstore.engine import transfer
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.cores import rank_cores, volume_writers
from ckptstore.engine.retry import backoff_delay
from ckptstore.engine.store import Buffer, Capabilities, Multipart, Part
from ckptstore.engine.transfer import TransferEngine, split_ranges
from ckptstore.engine.writeplan import ZERO_COPY_MIN, alignment_pad, plan_part_size
from ckptstore.errors import ConfigError, StoreAccessError, TransferError, TransientStoreError
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
    writes = [os.urandom(n) for n in (10, 3000, 1, 2048)]
    with engine() as e, e.writer(store, "f") as w:
        offsets = [w.write(p, crc32c(p) if i % 2 else None) for i, p in enumerate(writes)]
        info = w.close()
    assert offsets == [0, 10, 3010, 3011]
    assert info.crc32c == crc32c(b"".join(writes))
    assert store.get("f") == b"".join(writes)


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


@pytest.mark.parametrize(("cores", "volume", "most"), [(8, True, 4), (2, True, 1), (2, False, 4)])
def test_parts_in_flight_are_concurrency_on_a_volume_at_most_the_spare_cores(
    tmp_path, monkeypatch, cores, volume, most
) -> None:
    """On a volume (``zero_copy_parts``) each part write is a busy core: at most the rank's
    cores less one run at once; an object store's parts (mostly waits) keep ``concurrency``."""
    monkeypatch.setattr(transfer, "rank_cores", lambda: cores)
    store = ConcurrencyProbe(LocalStore(str(tmp_path)))
    if not volume:
        store.capabilities = dataclasses.replace(store.capabilities, zero_copy_parts=False)
    with engine(concurrency=4) as e:
        assert e.volume_writers == min(4, cores - 1)
        data = os.urandom(16 * 1024)
        e.put(store, "big", data)
    assert store.calls["put_part"] == 16
    assert store.peak == most
    assert store.get("big") == data


def test_volume_writers_are_the_cores_less_trainings_own() -> None:
    assert [volume_writers(8, c) for c in (1, 2, 3, 9, 64)] == [1, 1, 2, 8, 8]
    assert volume_writers(1, 64) == 1


def test_rank_cores_is_the_affinity_shared_by_the_local_ranks(monkeypatch) -> None:
    cores = len(os.sched_getaffinity(0))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    assert rank_cores() == cores
    monkeypatch.setenv("LOCAL_WORLD_SIZE", str(cores * 4))
    assert rank_cores() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "not a number")
    assert rank_cores() == cores


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
    # zeros before an item so its payload's offset agrees with its address mod 4096
    assert alignment_pad(100, 4096 * 7 + 64, 704, ZERO_COPY_MIN, 4096) == 4096 - 740
    assert (100 + alignment_pad(100, 4096 * 7 + 64, 704, ZERO_COPY_MIN, 4096) + 704) % 4096 == 64
    assert alignment_pad(0, 704, 704, ZERO_COPY_MIN, 4096) == 0  # already agrees
    assert alignment_pad(100, 64, 704, ZERO_COPY_MIN - 1, 4096) == 0  # copied anyway
    assert alignment_pad(100, 64, 704, ZERO_COPY_MIN, 0) == 0  # a store without direct I/O
    for bad in (3, -4096, True):
        with pytest.raises(ConfigError, match="direct_alignment"):
            Capabilities(direct_alignment=bad)


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


class PartAddresses(FaultyStore):
    """Records the address of every part's bytes."""

    def __init__(self, inner: LocalStore, zero_copy: bool) -> None:
        super().__init__(inner)
        self.capabilities = dataclasses.replace(inner.capabilities, zero_copy_parts=zero_copy)
        self.addresses: list[int] = []
        self.sizes: dict[int, int] = {}  # part number -> size

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        self.addresses.append(np.frombuffer(data, np.uint8).ctypes.data)
        self.sizes[number] = len(data)
        return super().put_part(upload, number, offset, data)


@pytest.mark.parametrize("zero_copy", [True, False])
def test_large_writes_reach_a_volume_without_a_copy(tmp_path, zero_copy: bool) -> None:
    store = PartAddresses(LocalStore(str(tmp_path)), zero_copy)
    part = ZERO_COPY_MIN
    big = bytearray(os.urandom(3 * part + 5))
    base = np.frombuffer(big, np.uint8).ctypes.data
    with TransferEngine(TransferConfig(part_size=part, memory_budget=2 * part)) as e:
        w = e.writer(store, "f.bin")
        w.write(b"head")
        w.write(big)
        w.write(b"x" * 100)
        w.write(memoryview(big)[: part - 1])  # under ZERO_COPY_MIN: copied
        info = w.close()
        assert e.buffers.in_use == 0  # every reservation and buffer given back
    expected = b"head" + bytes(big) + b"x" * 100 + bytes(big[: part - 1])
    assert store.inner.get("f.bin") == expected
    assert (info.size, info.crc32c) == (len(expected), crc32c(expected))
    by_reference = {base + i * part for i in range(4)} & set(store.addresses)
    assert by_reference == ({base + i * part for i in range(4)} if zero_copy else set())


@pytest.mark.parametrize("with_owner", [True, False])
def test_torch_save_records_go_by_reference_only_while_their_owner_is_held(
    tmp_path, with_owner: bool
) -> None:
    """torch.save hands over its record as a bare memoryview (no reference to the tensor):
    sent without a copy only when the writer holds the tensor, and then still intact after
    the caller dropped it and its memory could have been reused."""
    import io

    import torch

    store = PartAddresses(LocalStore(str(tmp_path)), zero_copy=True)
    expected, addresses = [], []
    with TransferEngine(TransferConfig(part_size=ZERO_COPY_MIN)) as e:
        w = e.writer(store, "f.bin")
        for i in range(3):
            t = torch.full((ZERO_COPY_MIN // 2,), float(i))  # 2 MiB, a temporary
            ref = io.BytesIO()
            torch.save(t, ref)
            expected.append(ref.getvalue())
            addresses.append(t.data_ptr())
            with w.item(owner=t if with_owner else None) as sink:
                torch.save(t, sink)
            del t
            junk = [torch.full((ZERO_COPY_MIN // 2,), -1.0) for _ in range(4)]  # reuse memory
            del junk
        w.close()
    assert store.inner.get("f.bin") == b"".join(expected)
    sizes = [store.sizes[n] for n in sorted(store.sizes)]
    if with_owner:  # each record went out from the tensor itself, after a short header part
        assert set(addresses) <= set(store.addresses)
        assert any(n < ZERO_COPY_MIN for n in sizes[:-1])
    else:  # everything was copied into full part buffers
        assert all(n == ZERO_COPY_MIN for n in sizes[:-1])


def test_abort_gives_back_every_buffer_and_reservation(tmp_path) -> None:
    slow = PartAddresses(LocalStore(str(tmp_path)), zero_copy=True)
    slow.faults = [Fault("put_part", delay=0.2)]
    part = ZERO_COPY_MIN
    with TransferEngine(TransferConfig(part_size=part, concurrency=1, memory_budget=8 * part)) as e:
        w = e.writer(slow, "f.bin")
        w.write(os.urandom(3 * part))  # pooled buffers, queued behind a slow store
        w.write(bytearray(4 * part))  # by reference, queued too
        w.abort()
        assert e.buffers.in_use == 0
    assert slow.inner.find() == []
