"""No server needed: the URL registry, S3 error mapping, and FsspecStore specifics."""

from __future__ import annotations

import asyncio
import sys
import warnings

import pytest
import torch
from botocore import exceptions as bx

import ckptstore
from ckptstore.engine import create_only
from ckptstore.engine.create_only import NonAtomicCreateWarning
from ckptstore.errors import (
    CommitConflictError,
    ConfigError,
    MissingDependencyError,
    StoreAccessError,
    StoreNotFoundError,
    TransientStoreError,
)
from ckptstore.stores import open_store
from ckptstore.stores.fsspec_store import FsspecStore
from ckptstore.stores.local import LocalStore
from ckptstore.stores.s3 import S3Store
from ckptstore.stores.s3.error_map import translate_s3_error

from .conftest import unique


def test_open_store_picks_the_backend() -> None:
    s3 = open_store("s3://bucket/run/step_1", {"key": "k", "secret": "s"})
    assert isinstance(s3, S3Store) and (s3.bucket, s3.prefix) == ("bucket", "run/step_1")
    assert s3.child("x").url == "s3://bucket/run/step_1/x"
    assert isinstance(open_store("memory://bucket/run"), FsspecStore)
    assert isinstance(open_store("/tmp/somewhere"), LocalStore)
    with pytest.raises(ConfigError, match="no store for URL scheme"):
        open_store("nosuchscheme://x/y")
    with pytest.raises(ConfigError):
        S3Store("s3://")


@pytest.mark.parametrize(
    ("client", "store_module", "url", "extra"),
    [
        ("s3fs", None, "s3://bucket/x", "s3"),
        ("gcsfs.core", "ckptstore.stores.gcs", "gs://bkt/x", "gcs"),
        ("azure.storage.blob", "ckptstore.stores.azure", "az://cont/x", "azure"),
    ],
)
def test_missing_client_names_the_extra(
    monkeypatch: pytest.MonkeyPatch, client: str, store_module: str | None, url: str, extra: str
) -> None:
    monkeypatch.setitem(sys.modules, client, None)  # makes importing the client fail
    if store_module:  # it imports its client at import time: import it afresh
        monkeypatch.delitem(sys.modules, store_module, raising=False)
    with pytest.raises(MissingDependencyError, match=rf"ckptstore\[{extra}\]"):
        open_store(url)


def _client_error(code: str, status: int) -> bx.ClientError:
    return bx.ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "PutObject",
    )


@pytest.mark.parametrize(
    ("exc", "kind", "text"),
    [
        (_client_error("SlowDown", 503), TransientStoreError, "SlowDown"),
        (_client_error("InternalError", 500), TransientStoreError, "InternalError"),
        (_client_error("TooManyRequests", 429), TransientStoreError, ""),
        (_client_error("BadDigest", 400), TransientStoreError, "BadDigest"),
        (_client_error("RequestTimeout", 400), TransientStoreError, ""),
        (_client_error("AccessDenied", 403), StoreAccessError, "credentials"),
        (_client_error("InvalidAccessKeyId", 403), StoreAccessError, "InvalidAccessKeyId"),
        (_client_error("SignatureDoesNotMatch", 403), StoreAccessError, "endpoint"),
        (_client_error("NoSuchBucket", 404), StoreNotFoundError, "bucket 'bkt' does not exist"),
        (_client_error("NoSuchKey", 404), StoreNotFoundError, "not found"),
        (_client_error("404", 404), StoreNotFoundError, "not found"),
        (_client_error("InvalidArgument", 400), StoreAccessError, "refused"),
        (
            bx.EndpointConnectionError(endpoint_url="http://h:1"),
            TransientStoreError,
            "endpoint_url",
        ),
        (bx.ReadTimeoutError(endpoint_url="http://h:1"), TransientStoreError, "ReadTimeout"),
        (bx.ConnectTimeoutError(endpoint_url="http://h:1"), TransientStoreError, ""),
        (ConnectionResetError("reset by peer"), TransientStoreError, "reset"),
        (asyncio.TimeoutError(), TransientStoreError, "timeout"),
        (bx.NoCredentialsError(), StoreAccessError, "AWS_ACCESS_KEY_ID"),
    ],
)
def test_s3_error_mapping(exc: BaseException, kind: type, text: str) -> None:
    out = translate_s3_error(exc, "write of s3://bkt/x", "bkt", "http://h:1")
    assert isinstance(out, kind)
    assert "s3://bkt/x" in str(out) and text in str(out)


def test_fsspec_create_only_write_warns_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(create_only, "_warned", set())
    store = FsspecStore(f"memory://ckpt/{unique()}")
    with pytest.warns(NonAtomicCreateWarning, match="best-effort"):
        store.put_if_absent("M", b"1")
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonAtomicCreateWarning)  # not a second time
        with pytest.raises(CommitConflictError):
            store.put_if_absent("M", b"2")
        store.put_if_absent("M", b"1")  # a retry of our own lost write is not a conflict


def test_fsspec_hidden_parts_and_lost_complete() -> None:
    store = FsspecStore(f"memory://ckpt/{unique()}")
    store.put("d/other", b"o")
    up = store.begin_multipart("d/obj")
    parts = [store.put_part(up, 2, 3, b"def"), store.put_part(up, 1, 0, b"abc")]
    assert store.find() == ["d/other"] and store.listdir("d") == ["other"]
    assert [(u.path, u.upload_id) for u in store.list_multipart()] == [("d/obj", up.upload_id)]
    store.complete_multipart(up, sorted(parts, key=lambda p: p.number))
    store.complete_multipart(up, parts)  # retried after a lost response: already done
    assert store.get("d/obj") == b"abcdef"
    assert store.find() == ["d/obj", "d/other"] and store.list_multipart() == []
    with pytest.raises(StoreNotFoundError, match="aborted or completed"):
        store.put_part(up, 3, 6, b"x")


def test_dcp_round_trip_on_fsspec_memory() -> None:
    url = f"memory://ckpt/{unique()}/step_000000003"
    state = {"w": torch.randn(300, 7), "b": torch.arange(10), "step": 3}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ckptstore.save(state, url)
        loaded = {"w": torch.zeros(300, 7), "b": torch.zeros(10, dtype=torch.long), "step": 0}
        ckptstore.load(loaded, url)
    assert torch.equal(loaded["w"], state["w"]) and torch.equal(loaded["b"], state["b"])
    assert loaded["step"] == 3
