"""GCSStore against a real fake-gcs-server: parts + compose, URL forms, errors, leftovers, DCP.

What GCS shares with the other stores is in ``test_conformance.py``; with Azure (missing
bucket, stalled server, commit race between clients, DCP checkpoints) ``test_gcs_azure.py``.
"""

from __future__ import annotations

import os
import time

import pytest

import ckptstore
from ckptstore import WriterOptions
from ckptstore.config import TransferConfig
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import StoreAccessError, TransferError, TransientStoreError
from harness.dist import free_port, run_distributed
from harness.objstore import (
    ProbeStore,
    StatusServer,
    dcp_reshard_load_rank,
    dcp_reshard_save_rank,
)

from .objstore import CFG, FAST, PART, SERVER_MARKS, new_bucket

pytestmark = SERVER_MARKS


# -- fixtures: one server per module, one bucket per test ------------------------------
@pytest.fixture
def server(fake_gcs_server):
    return fake_gcs_server


@pytest.fixture
def bucket(server) -> str:
    return new_bucket(server)


@pytest.fixture
def store(server, bucket):
    from ckptstore.stores.gcs import GCSStore

    s = server.store(f"{bucket}/root", retry=FAST)
    assert isinstance(s, GCSStore)
    return s


@pytest.fixture
def engine():
    with TransferEngine(CFG) as e:
        yield e


def part_objects(store) -> list[str]:
    from ckptstore.stores.gcs import PARTS_MARK

    return [p for p in store.find() if PARTS_MARK in p]


# -- native multipart -------------------------------------------------------------------
def test_parts_upload_in_parallel_as_objects_then_compose(store, engine):
    data = os.urandom(9 * PART + 123)  # 10 parts
    staged: list[tuple[list[str], bool]] = []

    def before_compose(up) -> None:
        staged.append((part_objects(store), store.exists(up.path)))

    probe = ProbeStore(store, before_complete=before_compose)
    info = engine.put(probe, "ckpt/shard.distcp", data)
    assert probe.max_in_flight >= 2, "parts were not uploaded concurrently"
    parts, visible = staged[0]
    numbered = [p for p in parts if p.rsplit("/", 1)[1].isdigit()]  # beside the "begun" marker
    assert len(numbered) == 10, parts  # every part is its own object before compose ...
    assert not visible  # ... and the destination does not exist yet
    assert store.find() == ["ckpt/shard.distcp"]  # part objects deleted after compose
    assert info.size == len(data) and info.crc32c == crc32c(data)
    assert store.object_crc32c("ckpt/shard.distcp") == crc32c(data)  # server agrees
    assert bytes(engine.read(store, "ckpt/shard.distcp")) == data


def test_more_than_32_parts_compose_as_a_tree(store):
    data = os.urandom(70 * 1024 + 5)  # 71 parts of 1 KiB: two compose levels
    with TransferEngine(TransferConfig(part_size=1024, memory_budget=1 << 20, retry=FAST)) as e:
        info = e.put(store, "tree.bin", data)
    assert store.find() == ["tree.bin"]
    assert store.get("tree.bin") == data
    assert store.object_crc32c("tree.bin") == info.crc32c == crc32c(data)
    assert store.capabilities.max_parts == 1024  # GCS composite objects: at most 1024 components


def test_composite_crc_mismatch_is_caught_and_retryable(store):
    import dataclasses

    up = store.begin_multipart("c.bin")
    p1 = store.put_part(up, 1, 0, b"a" * 10)
    p2 = store.put_part(up, 2, 10, b"b" * 10)
    wrong = dataclasses.replace(p2, etag=f"{int(p2.etag, 16) ^ 1:x}")  # as if damaged
    with pytest.raises(TransientStoreError, match="does not match"):
        store.complete_multipart(up, [p1, wrong])
    assert not store.exists("c.bin")  # the bad composite was deleted
    store.complete_multipart(up, [p1, p2])  # the parts are still there for a retry
    assert store.get("c.bin") == b"a" * 10 + b"b" * 10 and store.find() == ["c.bin"]


def test_open_store_urls(server, bucket):
    from ckptstore.stores import open_store
    from ckptstore.stores.gcs import GCSStore

    for url in (f"gs://{bucket}/x", f"gcs://{bucket}/x/"):
        s = open_store(url, server.storage_options)
        assert isinstance(s, GCSStore) and s.url == f"gs://{bucket}/x"
        s.put("k", b"v")
        assert s.get("k") == b"v"


# -- errors -----------------------------------------------------------------------------
def test_wrong_endpoint_fails_fast_and_names_it():
    from ckptstore.stores.gcs import GCSStore

    port = free_port()
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "token": "anon"}
    t0 = time.monotonic()
    with pytest.raises(StoreAccessError, match=f"127.0.0.1:{port}"):
        ckptstore.writer(
            "gs://bkt/run/step_000000001", WriterOptions(transfer=CFG), storage_options=options
        )
    with pytest.raises(StoreAccessError, match="cannot connect"):
        TransferEngine(CFG).put(GCSStore("gs://bkt/x", options), "a", b"data")
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize(
    "status, error",
    [
        (401, StoreAccessError),
        (403, StoreAccessError),
        (400, StoreAccessError),
        (429, TransientStoreError),
        (503, TransientStoreError),
    ],
)
def test_http_status_mapping(status, error):
    from ckptstore.stores.gcs import GCSStore

    body = b'{"error": {"code": %d, "message": "injected"}}' % status
    with StatusServer(status, body) as stub:
        s = GCSStore("gs://bkt/run", {"endpoint_url": stub.endpoint, "token": "anon"})
        with pytest.raises(error) as info:
            s.put("x", b"data")
        if status in (401, 403):
            assert "gs://bkt/run/x" in str(info.value) and "token" in str(info.value)
        if error is TransientStoreError:  # the engine retries, then gives up cleanly
            e = TransferEngine(CFG)
            with pytest.raises(TransferError, match="after 4 attempts"):
                e.put(s, "x", b"data")
            assert e.stats.retries == 3


# -- leftovers ----------------------------------------------------------------------------
def test_list_multipart_finds_leftovers_and_abort_cleans(store):
    up = store.begin_multipart("ckpt/x.distcp")
    store.put_part(up, 1, 0, b"a" * 10)
    store.put_part(up, 2, 10, b"b" * 10)
    [left] = store.list_multipart("ckpt")
    assert (left.path, left.upload_id) == ("ckpt/x.distcp", up.upload_id)
    store.abort_multipart(left)
    store.abort_multipart(left)  # idempotent
    assert store.find() == [] and store.list_multipart() == []


# -- DCP ----------------------------------------------------------------------------------
@pytest.mark.distributed
def test_dcp_reshard_four_to_two(server, store, bucket):
    url = f"gs://{bucket}/root/step_000000020"
    rows = run_distributed(dcp_reshard_save_rank, 4, url, server.storage_options, 16 * 1024)
    assert rows == [16, 16, 16, 16]
    same = run_distributed(dcp_reshard_load_rank, 2, url, server.storage_options, 16 * 1024)
    assert same == [True, True]
