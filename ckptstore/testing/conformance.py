"""The store contract as a test class: a store's conformance test is one subclass.

Shipped with the library so that a third-party store runs the same suite as the built-in
ones. It needs pytest (at test time only; importing this module imports pytest)::

    from ckptstore.testing.conformance import StoreConformance

    class TestMyStore(StoreConformance):
        def make_store(self, request):
            return MyStore(f"my://bucket/{uuid.uuid4().hex}")   # fresh and empty

``make_store(request)`` returns a fresh, empty store for one test (``request`` is pytest's
``FixtureRequest``: ``request.getfixturevalue("tmp_path")`` or a server fixture); the suite
closes it afterwards. Class attributes tune what is checked: ``lists_uploads = False`` for
a store whose ``list_multipart`` cannot see unfinished uploads (Azure: the service expires
them), ``ages_uploads = False`` for one that reports no true start time (moto: 2010).

Beyond the store's own calls, the suite checks what the transfer engine and the commit
protocol need of it: a part that fails is retried, an upload that fails for good or stalls
past the deadline leaves nothing, and of two attempts racing to commit one step exactly
one commits.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar

import pytest

from ckptstore.config import RetryConfig, TransferConfig
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.commit import commit
from ckptstore.engine.committed import open_committed
from ckptstore.engine.create_only import NonAtomicCreateWarning
from ckptstore.engine.deletion import abort_uploads, plan_uploads
from ckptstore.engine.manifest import FileEntry, Manifest
from ckptstore.engine.store import Entry, Part, Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import (
    CommitConflictError,
    StoreNotFoundError,
    TransferError,
    TransientStoreError,
    UnsafePathError,
)
from ckptstore.testing.faults import Fault, FaultyStore

__all__ = ["StoreConformance", "part_size"]

KiB = 1024
FAST = RetryConfig(attempts=4, base_backoff_s=0.01, max_backoff_s=0.05, request_timeout_s=10)


def part_size(store: Store) -> int:
    """A part size the store accepts that keeps the suite's objects small."""
    return max(store.capabilities.min_part_size, 256 * KiB)


class StoreConformance:
    """The store contract (``ckptstore.engine.store``) as pytest tests; subclass it."""

    #: Whether ``list_multipart`` sees unfinished uploads.
    lists_uploads: ClassVar[bool] = True
    #: Whether ``list_multipart`` reports each upload's true start (``extra["initiated"]``).
    ages_uploads: ClassVar[bool] = True

    def make_store(self, request: pytest.FixtureRequest) -> Store:
        """A fresh, empty store for one test; subclasses implement it."""
        raise NotImplementedError(f"{type(self).__name__} must implement make_store(request)")

    @pytest.fixture
    def store(self, request: pytest.FixtureRequest) -> Iterator[Store]:
        """A fresh, empty store from ``make_store``, closed after the test."""
        s = self.make_store(request)
        try:
            yield s
        finally:
            s.close()

    @pytest.fixture
    def engine(self, store: Store) -> Iterator[TransferEngine]:
        """A transfer engine sized to the store's smallest part, closed after the test."""
        size = part_size(store)
        config = TransferConfig(part_size=size, concurrency=4, memory_budget=8 * size, retry=FAST)
        with TransferEngine(config) as e:
            yield e

    def test_put_get_ranges_size_exists(self, store: Store) -> None:
        data = os.urandom(100 * KiB)
        store.put("a/obj.bin", data)
        assert store.get("a/obj.bin") == data
        assert store.get("a/obj.bin", 10, 20) == data[10:20]
        assert store.get("a/obj.bin", 5000) == data[5000:]
        assert store.get("a/obj.bin", 0, len(data) + 50) == data  # end past the end: clipped
        assert store.get("a/obj.bin", len(data)) == b""
        assert store.get("a/obj.bin", 7, 7) == b""
        assert store.size("a/obj.bin") == len(data)
        assert store.exists("a/obj.bin")
        assert not store.exists("a/other.bin")
        assert not store.exists("a")  # a 'directory' is not an object

    def test_get_into_reads_in_place(self, store: Store) -> None:
        data = os.urandom(300 * KiB)
        store.put("a/obj.bin", data)
        buf = bytearray(b"\xee" * (400 * KiB))
        view = memoryview(buf)
        assert store.get_into("a/obj.bin", 0, view[: 100 * KiB]) == 100 * KiB
        assert buf[: 100 * KiB] == data[: 100 * KiB]
        assert store.get_into("a/obj.bin", 12345, view[5 : 5 + 200 * KiB]) == 200 * KiB
        assert buf[5 : 5 + 200 * KiB] == data[12345 : 12345 + 200 * KiB]
        # past the end: what is there, nothing written beyond it
        view[:] = b"\xee" * len(view)
        assert store.get_into("a/obj.bin", 250 * KiB, view) == 50 * KiB
        assert buf[: 50 * KiB] == data[250 * KiB :] and buf[50 * KiB :] == b"\xee" * (350 * KiB)
        assert store.get_into("a/obj.bin", len(data), view[:10]) == 0
        assert store.get_into("a/obj.bin", 10, view[:0]) == 0
        with pytest.raises(StoreNotFoundError):
            store.get_into("nope", 0, view[:10])
        with pytest.raises(StoreNotFoundError):
            store.get_into("nope", 0, view[:0])

    def test_put_replaces_and_empty_objects(self, store: Store) -> None:
        store.put("x", b"first version")
        store.put("x", bytearray(b"second"))
        assert store.get("x") == b"second"
        store.put("empty", memoryview(b""))
        assert store.size("empty") == 0
        assert store.get("empty") == b""

    def test_missing_objects_raise_store_not_found(self, store: Store) -> None:
        for call in (
            lambda: store.get("nope"),
            lambda: store.get("nope", 3, 9),
            lambda: store.get("nope", 3, 3),
            lambda: store.size("nope"),
        ):
            with pytest.raises(StoreNotFoundError):
                call()
        store.delete("nope")  # deleting a missing object is fine
        assert store.find("nope") == []
        assert store.listdir("nope") == []

    def test_find_and_listdir(self, store: Store) -> None:
        for name in ("top", "a/1", "a/2", "a/b/3", "step_1/x", "step_10/y"):
            store.put(name, name.encode())
        assert store.find() == ["a/1", "a/2", "a/b/3", "step_1/x", "step_10/y", "top"]
        assert store.find("a") == ["a/1", "a/2", "a/b/3"]
        assert store.find("step_1") == ["step_1/x"]  # not step_10
        assert store.find("a/1") == ["a/1"]
        assert store.listdir() == ["a", "step_1", "step_10", "top"]
        assert store.listdir("a") == ["1", "2", "b"]
        child = store.child("a")
        assert child.find() == ["1", "2", "b/3"]
        child.put("c/4", b"4")
        assert store.get("a/c/4") == b"4"

    def test_delete_and_delete_prefix(self, store: Store) -> None:
        for name in ("keep/1", "gone/1", "gone/2", "gone/sub/3", "gone2"):
            store.put(name, b"x")
        store.delete("keep/1")
        assert not store.exists("keep/1")
        with pytest.raises(StoreNotFoundError):
            store.get("keep/1")
        store.delete("keep/1")  # gone already: fine
        store.delete_prefix("gone")
        assert store.find() == ["gone2"]
        assert "gone" not in store.listdir()  # no emptied folder is left listed
        store.child("sub").delete_prefix("")  # nothing there: a no-op
        store.put("d/1", b"x")
        store.child("d").delete_prefix("")  # a child store deletes its own root
        assert "d" not in store.listdir()

    def test_multipart_parallel_out_of_order(self, store: Store) -> None:
        size = part_size(store)
        data = os.urandom(3 * size + 1234)
        ranges = [
            (n + 1, off, min(off + size, len(data)))
            for n, off in enumerate(range(0, len(data), size))
        ]
        up = store.begin_multipart("mp/obj.bin")
        with ThreadPoolExecutor(4) as pool:
            futures = [
                pool.submit(store.put_part, up, n, s, memoryview(data)[s:e])
                for n, s, e in reversed(ranges)
            ]
            parts = [f.result() for f in futures]
        assert not store.exists("mp/obj.bin")  # nothing visible before complete
        if self.lists_uploads:
            assert any(u.upload_id == up.upload_id for u in store.list_multipart())
        assert "mp/obj.bin" not in store.find()
        store.complete_multipart(up, sorted(parts, key=lambda p: p.number))
        assert store.get("mp/obj.bin") == data
        assert store.find() == ["mp/obj.bin"]
        assert store.list_multipart() == []

    def test_abort_leaves_nothing(self, store: Store) -> None:
        size = part_size(store)
        up = store.begin_multipart("ab/obj.bin")
        store.put_part(up, 1, 0, os.urandom(size))
        if self.lists_uploads:
            assert [u.path for u in store.list_multipart("ab")] == ["ab/obj.bin"]
        store.abort_multipart(up)
        store.abort_multipart(up)  # idempotent
        assert not store.exists("ab/obj.bin")
        assert store.list_multipart() == []
        assert store.find() == []

    def test_stale_upload_aborts_take_only_stale_uploads(self, store: Store) -> None:
        """The one deletion path ages every store's uploads alike (strictly older than)."""
        if not self.lists_uploads:
            pytest.skip(f"{store} cannot list unfinished uploads (the service expires them)")
        size = part_size(store)
        names = [f"step_000000001/__{i}_0.a1.distcp" for i in range(2)]
        ups = [store.begin_multipart(n) for n in names]
        store.put_part(ups[0], 1, 0, os.urandom(size))

        def sweep(older_than_s: float) -> list[str]:
            now = time.time() + 1
            done = abort_uploads(store, plan_uploads(store, stale_after_s=older_than_s, now=now))
            return sorted(d.path for d in done)

        if self.ages_uploads:  # moto: every upload "began" in 2010
            assert sweep(3600) == []
        assert len(store.list_multipart("step_000000001")) == 2
        assert sweep(0) == names
        assert store.list_multipart() == []
        assert store.find() == []

    def test_put_if_absent_exactly_one_winner(self, store: Store) -> None:
        writers = 8
        barrier = threading.Barrier(writers)

        def attempt(i: int) -> bool:
            barrier.wait(timeout=30)
            try:
                store.put_if_absent("COMMITTED", f"writer {i}".encode())
                return True
            except CommitConflictError:
                return False

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonAtomicCreateWarning)
            with ThreadPoolExecutor(writers) as pool:
                won = list(pool.map(attempt, range(writers)))
        assert won.count(True) == 1
        assert store.get("COMMITTED") == f"writer {won.index(True)}".encode()
        with pytest.raises(CommitConflictError), warnings.catch_warnings():
            warnings.simplefilter("ignore", NonAtomicCreateWarning)
            store.put_if_absent("COMMITTED", b"late writer")

    def test_engine_round_trip_many_parts(self, store: Store) -> None:
        size = part_size(store)
        config = TransferConfig(
            part_size=size,
            concurrency=4,
            memory_budget=4 * size,
            retry=RetryConfig(base_backoff_s=0.01),
        )
        data = os.urandom(4 * size + size // 2)
        with TransferEngine(config) as engine:
            with engine.writer(store, "eng/file.bin") as w:
                for off in range(0, len(data), 100 * KiB):  # many small writes, as DCP does
                    w.write(memoryview(data)[off : off + 100 * KiB])
                info = w.close()
            assert info.size == len(data) and info.crc32c == crc32c(data)
            assert store.size("eng/file.bin") == len(data)
            assert engine.read(store, "eng/file.bin") == data
            assert (
                engine.read(store, "eng/file.bin", size - 10, 2 * size)
                == data[size - 10 : 3 * size - 10]
            )
        assert store.list_multipart() == []

    def test_complete_needs_every_part_size(self, store: Store) -> None:
        """Parts as reported by put_part are exactly what complete needs (number, size)."""
        size = part_size(store)
        up = store.begin_multipart("p/obj")
        p1 = store.put_part(up, 1, 0, b"a" * size)
        p2 = store.put_part(up, 2, size, b"b" * 10)
        assert (p1.number, p1.offset, p1.size) == (1, 0, size)
        assert (p2.number, p2.offset, p2.size) == (2, size, 10)
        assert isinstance(p2, Part)
        store.complete_multipart(up, [p1, p2])
        assert store.get("p/obj", size - 1, size + 1) == b"ab"

    # -- faults through the engine --------------------------------------------------------------
    def test_part_failing_twice_is_retried(self, store: Store, engine: TransferEngine) -> None:
        data = os.urandom(5 * part_size(store) + 123)  # 6 parts
        faulty = FaultyStore(
            store, [Fault("put_part", calls={2, 3}, error=TransientStoreError("503"))]
        )
        info = engine.put(faulty, "f.bin", data)
        assert engine.stats.retries >= 2
        assert info.crc32c == crc32c(data) == crc32c(store.get("f.bin"))
        assert store.find() == ["f.bin"] and store.list_multipart() == []  # no part left over

    def test_part_failing_for_good_leaves_nothing(
        self, store: Store, engine: TransferEngine
    ) -> None:
        data = os.urandom(5 * part_size(store) + 123)
        always = Fault("put_part", calls=set(range(3, 10_000)), error=TransientStoreError("503"))
        with pytest.raises(TransferError):
            engine.put(FaultyStore(store, [always]), "f.bin", data)
        assert not store.exists("f.bin")
        assert store.find() == [] and store.list_multipart() == []  # parts 1-2 were cleaned up

    def test_stalled_part_hits_the_deadline(self, store: Store) -> None:
        size = part_size(store)
        stall = Fault("put_part", calls={2}, delay=1.0, error=TransientStoreError("timed out"))
        cfg = TransferConfig(part_size=size, retry=RetryConfig(deadline_s=0.5, base_backoff_s=0.2))
        t0 = time.monotonic()
        with TransferEngine(cfg) as e, pytest.raises(TransferError, match="deadline"):
            e.put(FaultyStore(store, [stall]), "f.bin", os.urandom(4 * size))
        assert time.monotonic() - t0 < 10
        assert store.find() == []

    # -- commit race ----------------------------------------------------------------------------
    def test_two_attempts_racing_commit(self, store: Store, engine: TransferEngine) -> None:
        def attempt(name: str) -> str:
            data = name.encode() * 100
            engine.put(store, f"__0_0.{name}.distcp", data)
            m = Manifest(step=1, world_size=1)
            m.files[f"__0_0.{name}.distcp"] = FileEntry(len(data), crc32c(data))
            try:
                commit(store, engine, name, m, b"metadata-" + name.encode())
                return "won"
            except CommitConflictError:
                return "lost"

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonAtomicCreateWarning)
            with ThreadPoolExecutor(2) as pool:
                results = dict(zip(["a1", "b2"], pool.map(attempt, ["a1", "b2"]), strict=True))
        assert sorted(results.values()) == ["lost", "won"]
        winner = next(k for k, v in results.items() if v == "won")
        assert open_committed(store).marker.attempt == winner
        assert [n for n in store.find() if n.endswith(".distcp")] == [f"__0_0.{winner}.distcp"]

    # -- the rest of the contract ------------------------------------------------------------
    def test_scan_tells_objects_from_prefixes(self, store: Store) -> None:
        for name in ("top", "d/1", "d/e/2"):
            store.put(name, b"x")
        assert store.scan() == [Entry("d", "dir"), Entry("top", "file")]
        assert store.scan("d") == [Entry("1", "file"), Entry("e", "dir")]
        assert store.scan("nope") == []
        assert store.listdir("d") == ["1", "e"]

    def test_child_is_rooted_below(self, store: Store) -> None:
        child = store.child("c/d")
        assert child.url == f"{store.url}/c/d"
        assert child.describe("x") == f"{store.url}/c/d/x"
        child.put("x", b"1")
        assert store.find("c") == ["c/d/x"] and child.find() == ["x"]
        assert child.capabilities == store.capabilities

    def test_names_leaving_the_root_are_refused(self, store: Store) -> None:
        store.put("inside", b"1")
        for bad in ("../x", "/abs", "a/../../x", "a\\b", "a//b"):
            with pytest.raises(UnsafePathError):
                store.put(bad, b"x")
            with pytest.raises(UnsafePathError):
                store.get(bad)
            with pytest.raises(UnsafePathError):
                store.delete(bad)
        with pytest.raises(UnsafePathError):
            store.find("../")
        assert store.find() == ["inside"]

    def test_retried_calls_after_a_lost_response_are_harmless(self, store: Store) -> None:
        size = part_size(store)
        store.put("r", b"same")
        store.put("r", b"same")  # the first try landed, its response was lost
        assert store.get("r") == b"same"
        up = store.begin_multipart("m")
        p1 = store.put_part(up, 1, 0, b"a" * size)
        p1 = store.put_part(up, 1, 0, b"a" * size)  # the same part again
        p2 = store.put_part(up, 2, size, b"b" * 10)
        store.complete_multipart(up, [p1, p2])
        store.complete_multipart(up, [p1, p2])  # the object is whole: done
        assert store.get("m") == b"a" * size + b"b" * 10
        store.abort_multipart(up)  # completed: nothing left to discard
        assert store.get("m") == b"a" * size + b"b" * 10
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", NonAtomicCreateWarning)
            store.put_if_absent("C", b"mine")
            store.put_if_absent("C", b"mine")  # finds exactly its own bytes: a success
        store.delete("r")
        store.delete("r")
        assert sorted(store.find()) == ["C", "m"]

    def test_pickles_to_the_same_root(self, store: Store) -> None:
        """A store a caller built travels as itself into DCP's async_save process."""
        store.put("p", b"pickled")
        copy = pickle.loads(pickle.dumps(store))
        try:
            assert copy.url == store.url and type(copy) is type(store)
            assert copy.get("p") == b"pickled"
        finally:
            copy.close()
