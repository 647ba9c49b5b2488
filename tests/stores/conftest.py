"""Fixtures for the store tests: real servers (started once per session) and ``store``.

``store`` is parametrized over ``STORE_FACTORIES``: every backend named there runs the whole
conformance suite (``test_conformance.py``). To add a backend (GCS, Azure, ...), write a
factory ``(request, tmp_path) -> Store`` returning a fresh, empty store (use
``request.getfixturevalue("<server fixture>")`` for its server) and add one line to
``STORE_FACTORIES`` with ``pytest.mark.server`` if it needs a server.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from ckptstore.engine.store import Store
from tests.conftest import BUCKET


def unique(name: str = "t") -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


def _local(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    from ckptstore.stores.local import LocalStore

    return LocalStore(str(tmp_path / "store"))


def _s3(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    return request.getfixturevalue("seaweedfs").store(f"{BUCKET}/{unique()}")


def _s3_moto(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    return request.getfixturevalue("moto").store(f"{BUCKET}/{unique()}")


def _fsspec_memory(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    from ckptstore.stores.fsspec_store import FsspecStore

    return FsspecStore(f"memory://{BUCKET}/{unique()}")


def _gcs(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    server = request.getfixturevalue("fake_gcs_server")
    bucket = unique("conf")
    server.create_bucket(bucket)
    return server.store(f"{bucket}/root")


def _azure(request: pytest.FixtureRequest, tmp_path: Any) -> Store:
    server = request.getfixturevalue("azurite_server")
    container = unique("conf")
    server.create_bucket(container)
    return server.store(f"{container}/root")


Factory = Callable[[pytest.FixtureRequest, Any], Store]

#: name -> (factory, pytest marks). Every entry runs the conformance suite.
STORE_FACTORIES: dict[str, tuple[Factory, tuple[Any, ...]]] = {
    "local": (_local, ()),
    "s3": (_s3, (pytest.mark.server,)),
    "s3-moto": (_s3_moto, (pytest.mark.server,)),
    "fsspec-memory": (_fsspec_memory, ()),
    "gcs": (_gcs, (pytest.mark.server,)),
    "azure": (_azure, (pytest.mark.server,)),
}


@pytest.fixture(
    params=[pytest.param(name, marks=marks) for name, (_, marks) in STORE_FACTORIES.items()]
)
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Store]:
    factory, _ = STORE_FACTORIES[request.param]
    s = factory(request, tmp_path)
    try:
        yield s
    finally:
        s.close()
