"""How the store tests make a fresh, empty store of each built-in kind, and the S3 tests'
fresh prefix (``s3``) and its view through the fault proxy (``via``).

``STORE_FACTORIES`` maps a name to ``(factory, marks)``; a factory ``(request, tmp_path) ->
Store`` uses ``request.getfixturevalue("<server fixture>")`` for its server. The conformance
suite (``test_conformance.py``) runs one ``StoreConformance`` subclass per entry; the
containment tests (``tests/adversarial``) use some of them too.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from ckptstore.engine.store import Store
from ckptstore.stores.s3 import S3Store
from harness.proxy import FaultProxy
from tests.conftest import BUCKET


def unique(name: str = "t") -> str:
    return f"{name}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def s3(seaweedfs: Any) -> S3Store:
    """A fresh prefix on SeaweedFS, talked to directly (the ground truth)."""
    store: S3Store = seaweedfs.store(f"{BUCKET}/{unique()}")
    return store


def via(proxy: FaultProxy, server: Any, store: S3Store, **kwargs: Any) -> S3Store:
    """The same prefix as ``store``, reached through ``proxy`` (``kwargs`` go to S3Store)."""
    options = dict(server.storage_options, endpoint_url=proxy.endpoint)
    return S3Store(store.url, options, **kwargs)


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

#: name -> (factory, pytest marks).
STORE_FACTORIES: dict[str, tuple[Factory, tuple[Any, ...]]] = {
    "local": (_local, ()),
    "s3": (_s3, (pytest.mark.server,)),
    "s3-moto": (_s3_moto, (pytest.mark.server,)),
    "fsspec-memory": (_fsspec_memory, ()),
    "gcs": (_gcs, (pytest.mark.server,)),
    "azure": (_azure, (pytest.mark.server,)),
}
