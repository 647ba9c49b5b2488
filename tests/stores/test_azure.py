"""AzureStore against a real Azurite: staged blocks + block list, faults, commit race, DCP."""

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
from ckptstore.testing.azurite import ACCOUNT
from ckptstore.testing.dist import free_port, run_distributed
from ckptstore.testing.faults import Fault, FaultyStore
from ckptstore.testing.objstore import (
    Blackhole,
    ProbeStore,
    StatusServer,
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
WRONG_KEY = "d3JvbmcK" * 11  # valid base64, not the account's key


# -- fixtures: one server per module, one container per test ---------------------------
@pytest.fixture
def server(azurite_server):
    return azurite_server


@pytest.fixture
def container(server) -> str:
    name = f"t-{uuid.uuid4().hex[:12]}"
    server.create_bucket(name)
    return name


@pytest.fixture
def store(server, container):
    from ckptstore.stores.azure import AzureStore

    s = server.store(f"{container}/root", retry=FAST)
    assert isinstance(s, AzureStore)
    return s


@pytest.fixture
def engine():
    with TransferEngine(CFG) as e:
        yield e


def block_lists(server, container: str, path: str) -> tuple[list[str], list[str]]:
    """(committed, uncommitted) block ids of ``root/<path>`` as Azurite reports them."""
    with server.service_client() as svc:
        blob = svc.get_blob_client(container, f"root/{path}")
        committed, uncommitted = blob.get_block_list("all")
        return [b.id for b in committed], [b.id for b in uncommitted]


# -- native multipart -------------------------------------------------------------------
def test_blocks_stage_in_parallel_then_commit(server, container, store, engine):
    data = os.urandom(9 * PART + 123)  # 10 parts
    staged: list[tuple[list[str], bool]] = []

    def before_commit(up) -> None:
        staged.append((block_lists(server, container, up.path)[1], store.exists(up.path)))

    probe = ProbeStore(store, before_complete=before_commit)
    info = engine.put(probe, "ckpt/shard.distcp", data)
    assert probe.max_in_flight >= 2, "blocks were not staged concurrently"
    uncommitted, visible = staged[0]
    assert len(uncommitted) == 10 and not visible  # staged, not yet a blob
    assert len({len(b) for b in uncommitted}) == 1  # Azure wants one block-id length
    committed, uncommitted = block_lists(server, container, "ckpt/shard.distcp")
    assert len(committed) == 10 and uncommitted == []
    assert committed == sorted(committed)  # committed in part order
    assert info.size == len(data) and info.crc32c == crc32c(data)
    assert bytes(engine.read(store, "ckpt/shard.distcp")) == data


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


def test_url_forms(server, container):
    from ckptstore.stores import open_store

    for url in (f"abfs://{container}/x", f"abfss://{container}/x", f"az://{container}/x"):
        s = open_store(url, server.storage_options)
        s.put("k", url.encode())
        assert s.get("k") == url.encode()
    s = open_store(f"abfs://{container}@{ACCOUNT}.dfs.core.windows.net/x", server.storage_options)
    assert s.container == container and s.root == "x"


def test_missing_client_names_the_extra(monkeypatch):
    import sys

    from ckptstore.errors import MissingDependencyError
    from ckptstore.stores import open_store

    monkeypatch.setitem(sys.modules, "azure.storage.blob", None)
    monkeypatch.delitem(sys.modules, "ckptstore.stores.azure", raising=False)
    with pytest.raises(MissingDependencyError, match=r"ckptstore\[azure\]"):
        open_store("az://cont/x")


# -- errors -----------------------------------------------------------------------------
def test_wrong_endpoint_fails_fast_and_names_it(server):
    port = free_port()
    options = {"connection_string": server.connection_string().replace(str(server.port), str(port))}
    t0 = time.monotonic()
    with pytest.raises(StoreAccessError, match=f"127.0.0.1:{port}"):
        ckptstore.writer("az://cont/run/step_000000001", storage_options=options, config=CFG)
    assert time.monotonic() - t0 < 5


def test_missing_container_says_so(server):
    s = server.store("no-such-container/run", retry=FAST)
    for call in (lambda: s.put("a", b"x"), lambda: s.get("a"), lambda: s.size("a")):
        with pytest.raises(StoreNotFoundError, match="container 'no-such-container' does not"):
            call()


def test_wrong_account_key_is_refused_without_retries(server, container):
    from ckptstore.stores.azure import AzureStore

    options = {"connection_string": server.connection_string(account_key=WRONG_KEY)}
    s = AzureStore(f"az://{container}/run", options)
    e = TransferEngine(CFG)
    t0 = time.monotonic()
    with pytest.raises(StoreAccessError, match="403") as info:
        e.put(s, "x", b"data")
    assert "account key" in str(info.value) and e.stats.retries == 0
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("status", [500, 503])
def test_server_errors_are_retried_then_fail(status):
    from ckptstore.stores.azure import AzureStore

    with StatusServer(status, b"", content_type="application/xml") as stub:
        options = {"account_name": ACCOUNT, "account_url": f"{stub.endpoint}/{ACCOUNT}"}
        s = AzureStore("az://cont/run", {**options, "anon": True})
        with pytest.raises(TransientStoreError):
            s.put("x", b"data")
        e = TransferEngine(CFG)
        with pytest.raises(TransferError, match="after 4 attempts"):
            e.put(s, "x", b"data")
        assert e.stats.retries == 3


def test_stalled_server_times_out_and_gives_up(server):
    from ckptstore.stores.azure import AzureStore

    retry = RetryConfig(attempts=2, base_backoff_s=0.01, request_timeout_s=0.3)
    with Blackhole() as hole:
        cs = server.connection_string().replace(server.endpoint, hole.endpoint)
        s = AzureStore("az://cont/run", {"connection_string": cs}, retry=retry)
        t0 = time.monotonic()
        with pytest.raises(TransferError, match="failed after 2 attempts"):
            TransferEngine(TransferConfig(retry=retry)).put(s, "x", b"data")
        assert time.monotonic() - t0 < 5


# -- faults through the engine ------------------------------------------------------------
def test_part_failing_twice_is_retried(store, engine):
    data = os.urandom(6 * PART)
    faulty = FaultyStore(store, [Fault("put_part", calls={2, 3}, error=TransientStoreError("503"))])
    info = engine.put(faulty, "f.bin", data)
    assert engine.stats.retries >= 2
    assert info.crc32c == crc32c(data) == crc32c(store.get("f.bin"))


def test_part_failing_for_good_leaves_nothing_visible(server, container, store, engine):
    data = os.urandom(6 * PART)
    always = Fault("put_part", calls=set(range(3, 10_000)), error=TransientStoreError("503"))
    with pytest.raises(TransferError):
        engine.put(FaultyStore(store, [always]), "f.bin", data)
    assert not store.exists("f.bin") and store.find() == [] and store.list_multipart() == []
    # Blocks 1-2 stay staged (invisible; Azure expires them after 7 days) ...
    committed, uncommitted = block_lists(server, container, "f.bin")
    assert committed == [] and len(uncommitted) == 2
    # ... and the next commit to that name discards them.
    engine.put(store, "f.bin", data)
    committed, uncommitted = block_lists(server, container, "f.bin")
    assert len(committed) == 6 and uncommitted == []
    assert store.get("f.bin") == data


def test_stalled_part_hits_the_deadline(store):
    stall = Fault("put_part", calls={2}, delay=1.0, error=TransientStoreError("timed out"))
    cfg = TransferConfig(part_size=PART, retry=RetryConfig(deadline_s=0.5, base_backoff_s=0.2))
    t0 = time.monotonic()
    with TransferEngine(cfg) as e, pytest.raises(TransferError, match="deadline"):
        e.put(FaultyStore(store, [stall]), "f.bin", os.urandom(4 * PART))
    assert time.monotonic() - t0 < 10
    assert store.find() == []


# -- commit race --------------------------------------------------------------------------
def test_put_if_absent_race_has_one_winner(server, container):
    for round_ in range(5):
        stores = [server.store(f"{container}/race") for _ in range(8)]
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
    assert open_committed(store).marker.attempt == winner
    assert [n for n in store.find() if n.endswith(".distcp")] == [f"__0_0.{winner}.distcp"]


# -- DCP ----------------------------------------------------------------------------------
def _save_single(url: str, options: dict) -> None:
    import torch

    state = {"w": torch.arange(50_000, dtype=torch.float32), "b": torch.ones(3, 3)}
    ckptstore.save(state, url, storage_options=options, config=CFG)


def test_reader_refuses_shards_without_marker(server, store, container):
    url = f"az://{container}/root/step_000000001"
    _save_single(url, server.storage_options)
    store.delete(f"step_000000001/{MARKER_NAME}")
    assert any(n.endswith(".distcp") for n in store.find("step_000000001"))
    with pytest.raises(IncompleteCheckpointError, match="COMMITTED"):
        ckptstore.reader(url, storage_options=server.storage_options)


def test_corrupted_shard_is_named_with_its_range(server, store, container):
    import torch

    url = f"abfs://{container}/root/step_000000002"
    _save_single(url, server.storage_options)
    [shard] = [n for n in store.find("step_000000002") if n.endswith(".distcp")]
    data = bytearray(store.get(shard))
    data[len(data) // 2] ^= 0x40
    store.put(shard, data)
    target = {"w": torch.zeros(50_000), "b": torch.zeros(3, 3)}
    with pytest.raises(CorruptCheckpointError) as info:
        ckptstore.load(target, url, storage_options=server.storage_options, config=CFG)
    assert f"abfs://{container}/root/{shard} bytes [" in str(info.value)


@pytest.mark.distributed
def test_dcp_two_ranks_save_load(server, store, container):
    url = f"az://{container}/root/step_000000010"
    bad = run_distributed(dcp_roundtrip_rank, 2, url, server.storage_options, 32 * 1024)
    assert bad == [[], []]
    assert open_committed(store.child("step_000000010")).manifest.world_size == 2
