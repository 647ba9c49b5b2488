"""The store contract (``ckptstore.testing.conformance``) for every built-in store, plus a
minimal store that implements only the five primitives (the base class's defaults do the
rest: multipart, create-only writes, listings, children)."""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest

from ckptstore.config import RetryConfig
from ckptstore.engine.store import Buffer, Store
from ckptstore.errors import StoreNotFoundError
from ckptstore.testing.conformance import StoreConformance

from .conftest import STORE_FACTORIES, unique


class _Builtin(StoreConformance):
    """A built-in store, made by its factory in ``conftest.STORE_FACTORIES``."""

    factory: ClassVar[str]

    def make_store(self, request: pytest.FixtureRequest) -> Store:
        make, _ = STORE_FACTORIES[self.factory]
        return make(request, request.getfixturevalue("tmp_path"))


class TestLocalStore(_Builtin):
    factory = "local"


@pytest.mark.server
class TestS3OnSeaweedFS(_Builtin):
    factory = "s3"


@pytest.mark.server
class TestS3OnMoto(_Builtin):
    factory = "s3-moto"
    ages_uploads = False  # moto: every upload "began" in 2010


class TestFsspecMemory(_Builtin):
    factory = "fsspec-memory"


@pytest.mark.server
class TestGCSOnFakeGCSServer(_Builtin):
    factory = "gcs"


@pytest.mark.server
class TestAzureOnAzurite(_Builtin):
    factory = "azure"
    lists_uploads = False  # uncommitted blocks cannot be listed; the service expires them


# -- a store of primitives only ----------------------------------------------------------------
#: name -> bytes of every MinimalStore in the process, by root URL (so children and pickled
#: copies see the same objects, as they would on a server).
_OBJECTS: dict[str, dict[str, bytes]] = {}
_LOCK = threading.Lock()


class MinimalStore(Store):
    """An in-memory store with only put, get, size, find and delete: what a third-party
    store must write at least. ``minimal://<name>`` roots share one namespace."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryConfig | None = None,
    ) -> None:
        super().__init__(url, storage_options, retry=retry)
        self._space, _, self._root = url.partition("://")[2].partition("/")

    def _key(self, path: str) -> str:
        return f"{self._root}/{path}" if self._root else path

    def _objects(self) -> dict[str, bytes]:
        return _OBJECTS.setdefault(self._space, {})

    def put(self, path: str, data: Buffer) -> None:
        with _LOCK:
            self._objects()[self._key(path)] = bytes(data)

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        with _LOCK:
            data = self._objects().get(self._key(path))
        if data is None:
            raise StoreNotFoundError(f"{self.describe(path)}: no such object")
        return data[start:end] if end is None or end > start else b""

    def size(self, path: str) -> int:
        return len(self.get(path))

    def find(self, prefix: str = "") -> list[str]:
        key = self._key(prefix).rstrip("/")
        head = len(self._root) + 1 if self._root else 0
        with _LOCK:
            names = list(self._objects())
        return sorted(n[head:] for n in names if not key or n == key or n.startswith(f"{key}/"))

    def delete(self, path: str) -> None:
        with _LOCK:
            self._objects().pop(self._key(path), None)


class TestMinimalStore(StoreConformance):
    """The base class's defaults (emulated multipart, check-then-write create, listings
    from ``find``, children from the constructor) meet the whole contract."""

    def make_store(self, request: pytest.FixtureRequest) -> Store:
        return MinimalStore(f"minimal://{unique()}/root")

    def test_parts_are_temp_objects_ckptstore_recognises(self, store: Store) -> None:
        from ckptstore.engine.deletion import upload_is_ours
        from ckptstore.engine.names import TMP_MARK, is_ckptstore_file

        up = store.begin_multipart("step_000000001/__0_0.distcp")
        store.put_part(up, 1, 0, b"abc")
        temps = store.find()
        assert len(temps) == 2 and all(TMP_MARK in t for t in temps)  # marker and part 1
        assert all(is_ckptstore_file(t.split("/", 1)[1]) for t in temps)
        assert [u.path for u in store.list_multipart()] == ["step_000000001/__0_0.distcp"]
        assert upload_is_ours(up.path)
        assert not store.exists(up.path)  # nothing under the target's name until complete
        store.abort_multipart(up)
        assert store.find() == []

    def test_a_step_with_an_unfinished_upload_is_deleted_whole(self, store: Store) -> None:
        from ckptstore.engine.deletion import delete_step

        store.put("step_000000002/COMMITTED", b"m")
        up = store.begin_multipart("step_000000002/__1_0.distcp")
        store.put_part(up, 2, 10, b"z" * 10)
        assert delete_step(store, "step_000000002").foreign == []  # every temp object is ours
        assert store.find() == [] and store.list_multipart() == []


def test_a_store_overriding_the_old_put_part_pieces_still_gathers_with_a_warning() -> None:
    """``put_part_pieces`` became ``put_part_buffers``: a third-party store that still
    overrides the old name gets it called under the new one, with a DeprecationWarning (one
    minor version), and a caller of the old name reaches the new method, warned too."""
    with pytest.warns(DeprecationWarning, match="put_part_pieces is deprecated"):

        class OldGatherer(MinimalStore):
            def put_part_pieces(
                self,
                upload: Any,
                number: int,
                offset: int,
                pieces: Any,
                *,
                crc32c: int | None = None,
            ) -> Any:
                self.gathered = [bytes(p) for p in pieces]
                return self.put_part(upload, number, offset, b"".join(self.gathered))

    store = OldGatherer(f"minimal://{unique()}")
    up = store.begin_multipart("f.bin")
    part = store.put_part_buffers(up, 1, 0, [b"ab", memoryview(b"cd")])
    assert store.gathered == [b"ab", b"cd"]
    store.complete_multipart(up, [part])
    assert store.get("f.bin") == b"abcd"

    plain = MinimalStore(f"minimal://{unique()}")
    up = plain.begin_multipart("g.bin")
    with pytest.warns(DeprecationWarning, match="call put_part_buffers"):
        part = plain.put_part_pieces(up, 1, 0, [b"x", b"yz"])
    plain.complete_multipart(up, [part])
    assert plain.get("g.bin") == b"xyz"
