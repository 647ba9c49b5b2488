"""GCSStore against a real fake-gcs-server: parts + compose, faults, commit race, DCP."""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

import ckptstore
from ckptstore.config import RetryConfig, TransferConfig
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.commit import open_committed, publish
from ckptstore.engine.manifest import MARKER_NAME, FileEntry, Manifest
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import (
    CommitConflictError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    StoreAccessError,
    StoreNotFoundError,
    TransferError,
    TransientStoreError,
)
from ckptstore.testing.dist import free_port, run_distributed
from ckptstore.testing.faults import Fault, FaultyStore
from ckptstore.testing.objstore import (
    Blackhole,
    ProbeStore,
    StatusServer,
    dcp_reshard_load_rank,
    dcp_reshard_save_rank,
    dcp_roundtrip_rank,
    race_put_if_absent,
)

pytestmark = [
    pytest.mark.server,
    # single-process DCP saves/loads (no process group) are intended here
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

PART = 64 * 1024
FAST = RetryConfig(attempts=4, base_backoff_s=0.01, max_backoff_s=0.05, request_timeout_s=10)
CFG = TransferConfig(part_size=PART, concurrency=4, memory_budget=16 * PART, retry=FAST)


# -- fixtures: one server per module, one bucket per test ------------------------------
@pytest.fixture
def server(fake_gcs_server):
    return fake_gcs_server


@pytest.fixture
def bucket(server) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    server.create_bucket(name)
    return name


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
    assert store.max_parts == 1024  # GCS composite objects: at most 1024 components


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


def test_ranged_reads_and_listing(store):
    store.put("d/a", b"0123456789")
    store.put("d/sub/b", b"x")
    store.put("dx", b"y")
    assert store.get("d/a", 2, 5) == b"234"
    assert store.get("d/a", 7) == b"789"
    assert store.get("d/a", 10) == b""
    assert store.size("d/a") == 10
    assert store.find("d") == ["d/a", "d/sub/b"]
    assert store.listdir() == ["d", "dx"]
    assert store.listdir("d") == ["a", "sub"]
    assert store.child("d").find() == ["a", "sub/b"]
    store.delete("d/a")
    store.delete("d/a")  # missing is fine
    with pytest.raises(StoreNotFoundError):
        store.get("d/a")


def test_open_store_urls(server, bucket):
    from ckptstore.stores import open_store
    from ckptstore.stores.gcs import GCSStore

    for url in (f"gs://{bucket}/x", f"gcs://{bucket}/x/"):
        s = open_store(url, server.storage_options)
        assert isinstance(s, GCSStore) and s.url == f"gs://{bucket}/x"
        s.put("k", b"v")
        assert s.get("k") == b"v"


def test_missing_client_names_the_extra(monkeypatch):
    import sys

    from ckptstore.errors import MissingDependencyError
    from ckptstore.stores import open_store

    monkeypatch.setitem(sys.modules, "gcsfs.core", None)
    monkeypatch.delitem(sys.modules, "ckptstore.stores.gcs", raising=False)
    with pytest.raises(MissingDependencyError, match=r"ckptstore\[gcs\]"):
        open_store("gs://bkt/x")


# -- errors -----------------------------------------------------------------------------
def test_wrong_endpoint_fails_fast_and_names_it():
    from ckptstore.stores.gcs import GCSStore

    port = free_port()
    options = {"endpoint_url": f"http://127.0.0.1:{port}", "token": "anon"}
    t0 = time.monotonic()
    with pytest.raises(StoreAccessError, match=f"127.0.0.1:{port}"):
        ckptstore.writer("gs://bkt/run/step_000000001", storage_options=options, config=CFG)
    with pytest.raises(StoreAccessError, match="cannot connect"):
        TransferEngine(CFG).put(GCSStore("gs://bkt/x", options), "a", b"data")
    assert time.monotonic() - t0 < 5


def test_missing_bucket_says_so(server):
    s = server.store("no-such-bucket/run", retry=FAST)
    for call in (lambda: s.put("a", b"x"), lambda: s.get("a"), lambda: s.size("a")):
        with pytest.raises(StoreNotFoundError, match="bucket 'no-such-bucket' does not exist"):
            call()


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


def test_stalled_server_times_out_and_gives_up():
    from ckptstore.stores.gcs import GCSStore

    retry = RetryConfig(attempts=2, base_backoff_s=0.01, request_timeout_s=0.3)
    with Blackhole() as hole:
        s = GCSStore("gs://bkt/run", {"endpoint_url": hole.endpoint, "token": "anon"}, retry=retry)
        t0 = time.monotonic()
        with pytest.raises(TransferError, match="no answer within 0.3 s"):
            TransferEngine(TransferConfig(retry=retry)).put(s, "x", b"data")
        assert time.monotonic() - t0 < 5


# -- faults through the engine ------------------------------------------------------------
def test_part_failing_twice_is_retried(store, engine):
    data = os.urandom(6 * PART)
    faulty = FaultyStore(store, [Fault("put_part", calls={2, 3}, error=TransientStoreError("503"))])
    info = engine.put(faulty, "f.bin", data)
    assert engine.stats.retries >= 2
    assert info.crc32c == crc32c(data) == store.object_crc32c("f.bin")
    assert store.get("f.bin") == data and part_objects(store) == []


def test_part_failing_for_good_leaves_nothing(store, engine):
    data = os.urandom(6 * PART)
    always = Fault("put_part", calls=set(range(3, 10_000)), error=TransientStoreError("503"))
    with pytest.raises(TransferError):
        engine.put(FaultyStore(store, [always]), "f.bin", data)
    assert not store.exists("f.bin")
    assert store.find() == [] and store.list_multipart() == []  # parts 1-2 were deleted


def test_stalled_part_hits_the_deadline(store):
    stall = Fault("put_part", calls={2}, delay=1.0, error=TransientStoreError("timed out"))
    cfg = TransferConfig(part_size=PART, retry=RetryConfig(deadline_s=0.5, base_backoff_s=0.2))
    t0 = time.monotonic()
    with TransferEngine(cfg) as e, pytest.raises(TransferError, match="deadline"):
        e.put(FaultyStore(store, [stall]), "f.bin", os.urandom(4 * PART))
    assert time.monotonic() - t0 < 10
    assert store.find() == []


def test_list_multipart_finds_leftovers_and_abort_cleans(store):
    up = store.begin_multipart("ckpt/x.distcp")
    store.put_part(up, 1, 0, b"a" * 10)
    store.put_part(up, 2, 10, b"b" * 10)
    [left] = store.list_multipart("ckpt")
    assert (left.path, left.upload_id) == ("ckpt/x.distcp", up.upload_id)
    store.abort_multipart(left)
    store.abort_multipart(left)  # idempotent
    assert store.find() == [] and store.list_multipart() == []


# -- commit race --------------------------------------------------------------------------
def test_put_if_absent_race_has_one_winner(server, bucket):
    for round_ in range(5):
        stores = [server.store(f"{bucket}/race") for _ in range(8)]
        winners = race_put_if_absent(stores, f"m{round_}")
        assert len(winners) == 1, winners
        assert stores[0].get(f"m{round_}") == f"writer-{winners[0]}".encode()


def test_two_attempts_racing_publish(store, engine):
    def attempt(name: str) -> str:
        data = name.encode() * 100
        engine.put(store, f"__0_0.{name}.distcp", data)
        m = Manifest(step=1, world_size=1)
        m.files[f"__0_0.{name}.distcp"] = FileEntry(len(data), crc32c(data))
        try:
            publish(store, engine, name, m, b"metadata-" + name.encode())
            return "won"
        except CommitConflictError:
            return "lost"

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(["a1", "b2"], pool.map(attempt, ["a1", "b2"]), strict=True))
    assert sorted(results.values()) == ["lost", "won"]
    winner = next(k for k, v in results.items() if v == "won")
    committed = open_committed(store)
    assert committed.marker.attempt == winner
    assert [n for n in store.find() if n.endswith(".distcp")] == [f"__0_0.{winner}.distcp"]


# -- DCP ----------------------------------------------------------------------------------
def _save_single(url: str, options: dict) -> None:
    import torch

    state = {"w": torch.arange(50_000, dtype=torch.float32), "b": torch.ones(3, 3)}
    ckptstore.save(state, url, storage_options=options, config=CFG)


def test_reader_refuses_shards_without_marker(server, store, bucket):
    url = f"gs://{bucket}/root/step_000000001"
    _save_single(url, server.storage_options)
    store.delete(f"step_000000001/{MARKER_NAME}")
    assert any(n.endswith(".distcp") for n in store.find("step_000000001"))
    with pytest.raises(IncompleteCheckpointError, match="COMMITTED"):
        ckptstore.reader(url, storage_options=server.storage_options)


def test_corrupted_shard_is_named_with_its_range(server, store, bucket):
    import torch

    url = f"gs://{bucket}/root/step_000000002"
    _save_single(url, server.storage_options)
    [shard] = [n for n in store.find("step_000000002") if n.endswith(".distcp")]
    data = bytearray(store.get(shard))
    data[len(data) // 2] ^= 0x40
    store.put(shard, data)
    target = {"w": torch.zeros(50_000), "b": torch.zeros(3, 3)}
    with pytest.raises(CorruptCheckpointError) as info:
        ckptstore.load(target, url, storage_options=server.storage_options, config=CFG)
    assert f"gs://{bucket}/root/{shard} bytes [" in str(info.value)


@pytest.mark.distributed
def test_dcp_two_ranks_save_load(server, store, bucket):
    url = f"gs://{bucket}/root/step_000000010"
    bad = run_distributed(dcp_roundtrip_rank, 2, url, server.storage_options, 32 * 1024)
    assert bad == [[], []]
    committed = open_committed(store.child("step_000000010"))
    assert committed.manifest.world_size == 2
    assert part_objects(store) == []


@pytest.mark.distributed
def test_dcp_reshard_four_to_two(server, store, bucket):
    url = f"gs://{bucket}/root/step_000000020"
    rows = run_distributed(dcp_reshard_save_rank, 4, url, server.storage_options, 16 * 1024)
    assert rows == [16, 16, 16, 16]
    same = run_distributed(dcp_reshard_load_rank, 2, url, server.storage_options, 16 * 1024)
    assert same == [True, True]
