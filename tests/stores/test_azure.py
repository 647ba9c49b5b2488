"""AzureStore against a real Azurite: staged blocks + block list, URL forms, errors, faults.

What Azure shares with the other stores is in ``test_conformance.py``; with GCS (missing
container, stalled server, commit race between clients, DCP checkpoints) ``test_gcs_azure.py``.
"""

from __future__ import annotations

import os
import time

import pytest

import ckptstore
from ckptstore import WriterOptions
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import StoreAccessError, TransferError, TransientStoreError
from ckptstore.testing.faults import Fault, FaultyStore
from harness.azurite import ACCOUNT
from harness.dist import free_port
from harness.objstore import ProbeStore, StatusServer

from .objstore import CFG, FAST, PART, SERVER_MARKS, new_bucket

pytestmark = SERVER_MARKS
WRONG_KEY = "d3JvbmcK" * 11  # valid base64, not the account's key


# -- fixtures: one server per module, one container per test ---------------------------
@pytest.fixture
def server(azurite_server):
    return azurite_server


@pytest.fixture
def container(server) -> str:
    return new_bucket(server)


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


def test_url_forms(server, container):
    from ckptstore.stores import open_store

    for url in (f"abfs://{container}/x", f"abfss://{container}/x", f"az://{container}/x"):
        s = open_store(url, server.storage_options)
        s.put("k", url.encode())
        assert s.get("k") == url.encode()
    s = open_store(f"abfs://{container}@{ACCOUNT}.dfs.core.windows.net/x", server.storage_options)
    assert s.container == container and s.root == "x"


# -- errors -----------------------------------------------------------------------------
def test_wrong_endpoint_fails_fast_and_names_it(server):
    port = free_port()
    options = {"connection_string": server.connection_string().replace(str(server.port), str(port))}
    t0 = time.monotonic()
    with pytest.raises(StoreAccessError, match=f"127.0.0.1:{port}"):
        ckptstore.writer(
            "az://cont/run/step_000000001", WriterOptions(transfer=CFG), storage_options=options
        )
    assert time.monotonic() - t0 < 5


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


# -- faults through the engine ------------------------------------------------------------
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
