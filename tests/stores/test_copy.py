"""``Store.copy``: each object store's server-side copy, on its real server. An object in one
part and one in several (S3 copies those part for part) land byte for byte; a missing source,
an unsafe name and a store without a server-side copy are refused; nothing of the bytes
passes through the client (the store's ``get`` is never called)."""

from __future__ import annotations

import os

import pytest

from ckptstore.config import MiB, TransferConfig
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import ConfigError, StoreNotFoundError, UnsafePathError
from ckptstore.testing.faults import FaultyStore

from .conftest import STORE_FACTORIES

COPYING = ["s3", "s3-moto", "gcs", "azure", "fsspec-memory"]


@pytest.fixture(
    params=[pytest.param(n, marks=STORE_FACTORIES[n][1]) for n in COPYING],
)
def store(request: pytest.FixtureRequest, tmp_path) -> Store:
    make, _ = STORE_FACTORIES[request.param]
    return make(request, tmp_path)


def test_copy_lands_whole_and_never_reads_through_the_client(store: Store) -> None:
    small, large = os.urandom(1000), os.urandom(11 * MiB + 17)
    store.put("a/small", small)
    with TransferEngine(TransferConfig(part_size=5 * MiB)) as engine:
        engine.put(store, "a/large", large)  # several parts where the store has multipart
    store.put("b/large", b"old bytes, replaced")
    watched = FaultyStore(store)
    watched.copy("a/small", "b/small")
    watched.copy("a/large", "b/large")
    assert watched.calls["get"] == 0
    assert store.get("b/small") == small and store.get("b/large") == large
    assert store.get("a/large") == large  # the source stays


def test_copy_refuses_a_missing_source_and_unsafe_names(store: Store) -> None:
    with pytest.raises(StoreNotFoundError):
        store.copy("absent", "b")
    assert not store.exists("b")
    store.put("a", b"x")
    for src, dst in (("../a", "b"), ("a", "../b"), ("a", "/b")):
        with pytest.raises(UnsafePathError):
            store.copy(src, dst)


def test_a_store_without_a_server_side_copy_says_so(tmp_path) -> None:
    make, _ = STORE_FACTORIES["local"]
    volume = make(None, tmp_path)  # type: ignore[arg-type]
    volume.put("a", b"x")
    with pytest.raises(ConfigError, match="no server-side copy"):
        volume.copy("a", "b")
