"""The S3 client across a fork, as DataLoader workers get it: warm data, nothing live shared.

Against the real SeaweedFS: a rank uses its store, then forks (torch DataLoader's way); the
child builds its own client from a session nobody used before (the spare), on its own event
loop, with the botocore data its parent loaded already there, and reads correct bytes; the
parent's client still works afterwards.
"""

from __future__ import annotations

import multiprocessing as mp
import ssl
import uuid
from typing import Any

import pytest

from ckptstore.data import DataLoader, ShardedDataset
from ckptstore.stores import open_store
from ckptstore.stores.s3 import session as s3_session
from tests.conftest import BUCKET
from tests.data.datasets import make_parquet


def _verify_context(store: Any) -> ssl.SSLContext:
    """The TLS context the store's client verifies servers with (its first request made)."""
    connector = store.fs._s3._endpoint.http_session._sessions[None].connector
    context: ssl.SSLContext = connector._ssl
    return context


def _in_child(
    parent: Any, url: str, opts: dict[str, Any], spare_id: int, ctx_id: int, out: Any
) -> None:
    try:
        try:
            parent.fs.loop  # noqa: B018 - fsspec refuses the parent's loop in a child
            refused = False
        except RuntimeError:
            refused = True
        loader = s3_session.shared_loader(None)
        # Inherited warm: the S3 model is in the loader before this process makes a request.
        warm = any(key[:2] == ("load_service_model", "s3") for key in loader._cache)
        store = open_store(url, opts)
        session = store.fs.session
        row = {
            "warm_before_first_request": warm,
            "data": store.get("obj"),
            "own_fs": store.fs is not parent.fs,
            "parent_loop_refused": refused,
            "own_loop": store.fs.loop is not parent.fs._loop,
            "own_session": session is not parent.fs.session,
            "adopted_spare": id(session) == spare_id,
            "shared_loader": session.get_component("data_loader") is loader,
            "own_client": store.fs._s3 is not parent.fs._s3,
            "tls_context": id(_verify_context(store)),
        }
        out.put(dict(row, spare_id=spare_id, spare_ctx_id=ctx_id))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        out.put({"error": repr(exc)})


@pytest.mark.server
def test_a_forked_worker_builds_its_own_client_from_warm_data(seaweedfs):
    prefix = f"{BUCKET}/fork-{uuid.uuid4().hex[:8]}"
    url, opts = f"s3://{prefix}", dict(seaweedfs.storage_options)
    parent = open_store(url, opts)
    parent.put("obj", b"parent bytes")
    assert parent.get("obj") == b"parent bytes"  # the parent's client and connection live
    assert open_store(url, opts).fs is parent.fs  # one client per process and options

    ctx = mp.get_context("fork")
    out = ctx.Queue()
    procs = []
    for _ in range(2):
        # The spare is made just before the first fork, then reused by every later one.
        pid = mp.current_process().pid
        spare = s3_session._SPARES.get((pid, None))
        spare_id = id(spare) if spare is not None else -1
        spare_ctx = [c for k, c in s3_session._SPARE_CONTEXTS.items() if k[0] == pid]
        ctx_id = id(spare_ctx[0]) if spare_ctx else -1
        p = ctx.Process(target=_in_child, args=(parent, url, opts, spare_id, ctx_id, out))
        p.start()
        procs.append(p)
    rows = sorted((out.get(timeout=120) for _ in procs), key=lambda r: r.get("spare_id", 0))
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    for row in rows:
        assert "error" not in row, row["error"]
        assert row["data"] == b"parent bytes"
        assert row["warm_before_first_request"]
        assert (
            row["parent_loop_refused"]
            and row["own_fs"]
            and row["own_loop"]
            and row["own_client"]
            and row["own_session"]
        )
        assert row["shared_loader"]
    # The spare was made at the first fork (if no earlier one made it); later forks adopt it.
    assert rows[1]["spare_id"] != -1
    assert all(r["adopted_spare"] for r in rows if r["spare_id"] != -1)
    # Its TLS context too: made before the fork, never used in the parent, adopted in the child.
    assert rows[1]["spare_ctx_id"] != -1
    assert all(r["tls_context"] == r["spare_ctx_id"] for r in rows if r["spare_ctx_id"] != -1)
    assert rows[1]["spare_ctx_id"] != id(_verify_context(parent))
    assert parent.get("obj") == b"parent bytes"  # the parent's client is untouched
    # The parent never uses its spare; its own session is the one its clients came from.
    assert s3_session._SPARES[(mp.current_process().pid, None)] is not parent.fs.session


@pytest.mark.server
def test_a_caller_session_or_session_options_are_left_to_s3fs(seaweedfs):
    from aiobotocore.session import AioSession

    opts = dict(seaweedfs.storage_options)
    mine = AioSession()
    assert open_store(f"s3://{BUCKET}", dict(opts, session=mine)).fs.session is mine
    ours = open_store(f"s3://{BUCKET}", opts).fs.session
    assert ours is s3_session.process_session(None)
    # Other AioSession options go to the session s3fs makes for itself, as without ckptstore.
    theirs = open_store(f"s3://{BUCKET}", dict(opts, session_vars={}))
    assert theirs.exists("nothing-here") is False
    assert theirs.fs.session is not ours


@pytest.mark.server
def test_dataloader_workers_read_an_s3_dataset(tmp_path, seaweedfs):
    sizes = [9, 14, 6]
    local = tmp_path / "ds"
    make_parquet(str(local), sizes, row_group=4)
    prefix = f"{BUCKET}/fork-ds-{uuid.uuid4().hex[:8]}"
    remote = seaweedfs.store(prefix)
    for path in sorted(local.iterdir()):
        remote.put(path.name, path.read_bytes())
    ds = ShardedDataset(
        f"s3://{prefix}",
        storage_options=dict(seaweedfs.storage_options),
        cache_dir=str(tmp_path / "cache"),
        seed=1,
    )
    with DataLoader(ds, batch_size=4, num_workers=2, rank=0, world_size=1) as dl:
        for _ in range(2):  # torch forks fresh workers at every iter()
            ids = [i for b in dl for i in b["id"].tolist()]
            assert sorted(ids) == list(range(sum(sizes)))


def test_clients_of_a_process_share_one_verifying_tls_context(tmp_path):
    cls = s3_session.http_session_class()
    first, second = cls(verify=True)._build_verify_context(), cls()._build_verify_context()
    assert first is second  # built once per process and CA bundle (the CA load is the cost)
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname
    assert first.cert_store_stats()["x509_ca"] > 0  # the CA bundle is loaded
    # A context that gets a client certificate, or does not verify, stays the client's own.
    cert = tmp_path / "client.pem"
    cert.write_text("not read here")
    own = cls(client_cert=str(cert))._build_verify_context()
    assert own is not first
    plain = cls(verify=False)._build_verify_context()
    assert plain is not first and plain.verify_mode == ssl.CERT_NONE


def test_the_warm_loader_holds_everything_an_s3_client_loads():
    import asyncio

    session = s3_session.process_session(None)
    loader = session.get_component("data_loader")
    before = set(loader._cache)

    async def make_client() -> None:
        async with session.create_client(
            "s3",
            region_name="us-east-1",
            endpoint_url="http://127.0.0.1:9",  # never contacted: no request is made
            aws_access_key_id="k",
            aws_secret_access_key="s",
        ):
            pass

    asyncio.run(make_client())
    # Every load the client made was a cache hit: nothing new parsed, no directory scanned.
    assert set(loader._cache) - before == set()
