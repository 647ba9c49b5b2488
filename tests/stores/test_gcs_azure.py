"""What GCSStore and AzureStore share, each against its real server (fake-gcs-server, Azurite).

Every test runs once per backend in ``BACKENDS``: a missing bucket named in the error, a
stalled server given up on, one winner of a commit-marker race between separate clients,
and whole DCP checkpoints (a shard without its marker refused, a flipped bit named with its
object and range, a two-rank save and load). The store contract itself is
``test_conformance.py``; what only one service does is in ``test_gcs.py`` / ``test_azure.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

import ckptstore
from ckptstore import WriterOptions
from ckptstore.config import RetryConfig, TransferConfig
from ckptstore.engine.committed import open_committed
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import (
    CorruptCheckpointError,
    IncompleteCheckpointError,
    StoreNotFoundError,
    TransferError,
)
from ckptstore.stores import open_store
from harness.dist import run_distributed
from harness.objstore import Blackhole, dcp_roundtrip_rank, race_put_if_absent

from .objstore import CFG, FAST, SERVER_MARKS, new_bucket

pytestmark = SERVER_MARKS


@dataclass(frozen=True)
class Backend:
    fixture: str  # the session server fixture in tests/conftest.py
    scheme: str  # of the URLs the tests save to
    corrupt_scheme: str  # the corrupted-shard test reads through this one (an alias)
    missing: str  # a bucket that does not exist, and how the error names it
    missing_says: str
    stalled_says: str  # how giving up on a stalled server is reported
    redirect: Callable[[Any, str], dict[str, Any]]  # server options, at another endpoint


BACKENDS = {
    "gcs": Backend(
        "fake_gcs_server",
        "gs",
        "gs",
        "no-such-bucket",
        "bucket 'no-such-bucket' does not exist",
        "no answer within 0.3 s",
        lambda server, endpoint: {"endpoint_url": endpoint, "token": "anon"},
    ),
    "azure": Backend(
        "azurite_server",
        "az",
        "abfs",
        "no-such-container",
        "container 'no-such-container' does not",
        "failed after 2 attempts",
        lambda server, endpoint: {
            "connection_string": server.connection_string().replace(server.endpoint, endpoint)
        },
    ),
}


@dataclass
class Bucket:
    """A fresh bucket (Azure: container) on one backend's server, and a store at its root/."""

    backend: Backend
    server: Any
    name: str
    store: Store

    def url(self, path: str, scheme: str | None = None) -> str:
        return f"{scheme or self.backend.scheme}://{self.name}/root/{path}"


@pytest.fixture(params=list(BACKENDS))
def bucket(request: pytest.FixtureRequest) -> Bucket:
    backend = BACKENDS[request.param]
    server = request.getfixturevalue(backend.fixture)
    name = new_bucket(server)
    return Bucket(backend, server, name, server.store(f"{name}/root", retry=FAST))


# -- errors -----------------------------------------------------------------------------
def test_missing_bucket_says_so(bucket: Bucket) -> None:
    s = bucket.server.store(f"{bucket.backend.missing}/run", retry=FAST)
    for call in (lambda: s.put("a", b"x"), lambda: s.get("a"), lambda: s.size("a")):
        with pytest.raises(StoreNotFoundError, match=bucket.backend.missing_says):
            call()


def test_stalled_server_times_out_and_gives_up(bucket: Bucket) -> None:
    retry = RetryConfig(attempts=2, base_backoff_s=0.01, request_timeout_s=0.3)
    with Blackhole() as hole:
        options = bucket.backend.redirect(bucket.server, hole.endpoint)
        s = open_store(f"{bucket.backend.scheme}://bkt/run", options, retry=retry)
        t0 = time.monotonic()
        with pytest.raises(TransferError, match=bucket.backend.stalled_says):
            TransferEngine(TransferConfig(retry=retry)).put(s, "x", b"data")
        assert time.monotonic() - t0 < 5


# -- commit race between separate clients -------------------------------------------------
def test_put_if_absent_race_has_one_winner(bucket: Bucket) -> None:
    for round_ in range(5):
        stores = [bucket.server.store(f"{bucket.name}/race") for _ in range(8)]
        winners = race_put_if_absent(stores, f"m{round_}")
        assert len(winners) == 1, winners
        assert stores[0].get(f"m{round_}") == f"writer-{winners[0]}".encode()


# -- DCP ----------------------------------------------------------------------------------
def _save_single(url: str, options: dict[str, Any]) -> None:
    import torch

    state = {"w": torch.arange(50_000, dtype=torch.float32), "b": torch.ones(3, 3)}
    ckptstore.save(state, url, storage_options=options, options=WriterOptions(transfer=CFG))


def test_reader_refuses_shards_without_marker(bucket: Bucket) -> None:
    url, store = bucket.url("step_000000001"), bucket.store
    _save_single(url, bucket.server.storage_options)
    store.delete(f"step_000000001/{MARKER_NAME}")
    assert any(n.endswith(".distcp") for n in store.find("step_000000001"))
    with pytest.raises(IncompleteCheckpointError, match="COMMITTED"):
        ckptstore.reader(url, storage_options=bucket.server.storage_options)


def test_corrupted_shard_is_named_with_its_range(bucket: Bucket) -> None:
    import torch

    scheme, store = bucket.backend.corrupt_scheme, bucket.store
    url = bucket.url("step_000000002", scheme)
    _save_single(url, bucket.server.storage_options)
    [shard] = [n for n in store.find("step_000000002") if n.endswith(".distcp")]
    data = bytearray(store.get(shard))
    data[len(data) // 2] ^= 0x40
    store.put(shard, data)
    target = {"w": torch.zeros(50_000), "b": torch.zeros(3, 3)}
    with pytest.raises(CorruptCheckpointError) as info:
        ckptstore.load(target, url, storage_options=bucket.server.storage_options, transfer=CFG)
    assert f"{bucket.url(shard, scheme)} bytes [" in str(info.value)


@pytest.mark.distributed
def test_dcp_two_ranks_save_load(bucket: Bucket) -> None:
    url = bucket.url("step_000000010")
    bad = run_distributed(dcp_roundtrip_rank, 2, url, bucket.server.storage_options, 32 * 1024)
    assert bad == [[], []]
    assert open_committed(bucket.store.child("step_000000010")).manifest.world_size == 2
    assert bucket.store.list_multipart() == []  # GCS: no part object left behind
