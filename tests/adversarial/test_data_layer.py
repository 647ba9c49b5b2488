"""Attacks on the data layer (issue #32, items 3, 5, 6): it makes and deletes only its own
files, never writes through a planted symlink, publishes a pack at once, skips keys a store
cannot be asked for, and refuses a shard whose footer lies, with its own errors."""

from __future__ import annotations

import io
import logging
import os
import signal
import struct
import subprocess
import sys
import time
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from ckptstore.data import DataLoader, ShardedDataset, pack_files
from ckptstore.data.order import DataOrderError
from ckptstore.data.pack import PACK_PENDING
from ckptstore.errors import EmptyDatasetError, ShardFormatError, StoreAccessError, UnsafePathError
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import Fault, FaultyStore
from tests.conftest import BUCKET
from tests.data.datasets import make_parquet, make_raw

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _ds(tmp_path, **kw) -> ShardedDataset:
    root = tmp_path / "ds"
    if not root.exists():
        make_parquet(str(root), [40] * 6, row_group=8, payload=500)
    kw.setdefault("cache_dir", str(tmp_path / "cache"))
    kw.setdefault("shuffle", False)
    kw.setdefault("buckets", 1)
    return ShardedDataset(str(root), **kw)


def _epoch_ids(ds: ShardedDataset) -> list[int]:
    dl = DataLoader(ds, batch_size=16, num_workers=0, rank=0, world_size=1, prefetch=False)
    try:
        return [i for b in dl for i in b["id"].tolist()]
    finally:
        dl.close()


# --- the cache deletes and counts only the names it makes ------------------------------


def test_cache_eviction_keeps_files_it_did_not_make(tmp_path) -> None:
    probe = _ds(tmp_path)
    limit = 2 * max(s.size for s in probe.shards) + 100
    probe.close()
    shards = tmp_path / "cache" / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    theirs = {
        "notes.data": b"n" * limit,  # over the whole budget: the first recount evicted it
        "notes.data.tmp-1": b"t" * 100,  # looked like a crashed download's leftover
        "notes.meta": b"{}",
        "0123456789abcdef01234567-x.data.tmp-1-dead": b"d" * 10,  # almost our form
    }
    for name, data in theirs.items():
        (shards / name).write_bytes(data)
    ours = probe.entries[5].key + f".data.tmp-999999-{uuid.uuid4().hex}"  # a crashed download
    (shards / ours).write_bytes(b"x" * 10)

    ds = _ds(tmp_path, cache_limit=limit)
    assert sorted(_epoch_ids(ds)) == list(range(240))
    ds.close()
    for name, data in theirs.items():
        assert (shards / name).read_bytes() == data, name
    assert not (shards / ours).exists()  # the predicate still knows the cache's own leftovers


@pytest.mark.parametrize("which", ["budget.lock", "use-lock", "pressure"])
def test_cache_never_writes_through_a_planted_symlink(tmp_path, which) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_bytes(b"precious")
    old = victim.stat().st_mtime_ns - 10**9
    os.utime(victim, ns=(old, old))
    ds = _ds(tmp_path, cache_limit="10MiB", cache_wait_timeout=5)
    cache = ds.make_cache()
    link = {
        "budget.lock": os.path.join(cache.dir, "budget.lock"),
        "use-lock": os.path.join(cache.dir, "locks", f"{ds.entries[0].key}.use"),
        "pressure": os.path.join(cache.dir, "pressure"),
    }[which]
    os.symlink(victim, link)
    if which == "pressure":
        cache.signal_pressure()  # a waiter touched the link's target before
    else:
        with pytest.raises(UnsafePathError, match="is a symlink"):
            cache.acquire(0, 0)
    ds.close()
    assert victim.read_bytes() == b"precious"
    assert victim.stat().st_mtime_ns == old
    assert os.path.islink(link)  # left for its owner to remove


def test_cache_refuses_a_symlinked_shards_folder(tmp_path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "notes.data").write_bytes(b"n")
    (tmp_path / "cache").mkdir()
    os.symlink(elsewhere, tmp_path / "cache" / "shards")
    with pytest.raises(UnsafePathError, match="shards is a symlink"):
        _ds(tmp_path)
    assert os.listdir(elsewhere) == ["notes.data"]


# --- pack publishes its output at once -----------------------------------------------


def _raw_src(tmp_path) -> str:
    src = str(tmp_path / "raw")
    make_raw(src, 8, size=100)
    return src


def test_failed_pack_leaves_no_dataset_and_a_rerun_works(tmp_path) -> None:
    src, dst = _raw_src(tmp_path), tmp_path / "packed"
    dst.mkdir()
    (dst / "notes.txt").write_bytes(b"mine")
    broken = FaultyStore(
        LocalStore(src), [Fault("get", calls={6}, error=StoreAccessError("injected 403"))]
    )
    with pytest.raises(StoreAccessError):
        pack_files(broken, str(dst), shard_bytes=150, threads=1)  # a file a shard
    assert sorted(os.listdir(dst)) == ["notes.txt"]  # what it wrote is gone, the rest kept
    with pytest.raises(EmptyDatasetError):
        ShardedDataset(str(dst), format="parquet", cache_dir=str(tmp_path / "c"))
    report = pack_files(src, str(dst), shard_bytes=150)
    assert len(report.shards) == 8
    assert (dst / "notes.txt").read_bytes() == b"mine"
    ds = ShardedDataset(str(dst), cache_dir=str(tmp_path / "c"), shuffle=False)
    assert ds.num_samples == 8


_PACK_THEN_STALL = """
import sys
from ckptstore.data import pack_files
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import Fault, FaultyStore
src = FaultyStore(LocalStore(sys.argv[1]), [Fault("get", calls={5}, delay=120.0)])
pack_files(src, sys.argv[2], shard_bytes=150, threads=1)
"""


@pytest.mark.processes
def test_killed_pack_reads_as_no_dataset_and_a_rerun_replaces_it(tmp_path) -> None:
    src, dst = _raw_src(tmp_path), tmp_path / "packed"
    dst.mkdir()
    (dst / "notes.txt").write_bytes(b"mine")
    env = dict(os.environ, PYTHONPATH=ROOT)
    proc = subprocess.Popen([sys.executable, "-c", _PACK_THEN_STALL, src, str(dst)], env=env)
    try:
        deadline = time.monotonic() + 60
        while not (dst / "part-00002.parquet").exists():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with pytest.raises(EmptyDatasetError, match="pack"):
        ShardedDataset(str(dst), format="parquet", cache_dir=str(tmp_path / "c"))
    report = pack_files(src, str(dst), shard_bytes=150)
    assert len(report.shards) == 8 and not (dst / PACK_PENDING).exists()
    assert (dst / "notes.txt").read_bytes() == b"mine"
    ds = ShardedDataset(str(dst), cache_dir=str(tmp_path / "c"), shuffle=False)
    assert sorted(s["data"][0] for s in ds.fetch(range(8))) == list(range(8))


def test_a_pack_still_running_is_never_taken_for_a_killed_one(tmp_path) -> None:
    """A marker whose pack keeps its lease fresh: a second pack is refused, naming it, and
    deletes nothing; once that lease is gone the second pack cleans up and packs."""
    import dataclasses

    from ckptstore.engine.lease import Heartbeat, lease_name, parse_lease

    src, dst = _raw_src(tmp_path), tmp_path / "packed"
    dst.mkdir()
    (dst / PACK_PENDING).write_text('{"version": 1, "shards": ["part-00000.parquet"]}')
    (dst / "part-00000.parquet").write_bytes(b"being written")
    live = Heartbeat(LocalStore(str(dst)), lease_name("a1b2"), "pack:other:1").start()
    try:
        with pytest.raises(Exception, match="another pack into .* is still running .*pack:other"):
            pack_files(src, str(dst), shard_bytes=150)
        assert (dst / "part-00000.parquet").read_bytes() == b"being written"
    finally:
        live.stop(delete=False)  # the holder stops: its lease file stays behind
    left = dst / lease_name("a1b2")
    old = parse_lease(left.read_bytes(), str(left))
    left.write_bytes(dataclasses.replace(old, time=old.time - 3600).to_bytes())  # stale
    report = pack_files(src, str(dst), shard_bytes=150)
    assert len(report.shards) == 8 and not (dst / PACK_PENDING).exists()
    assert not list(dst.glob("ckptstore.lease.*"))


def test_a_pending_marker_pack_did_not_write_deletes_nothing(tmp_path) -> None:
    src, dst = _raw_src(tmp_path), tmp_path / "packed"
    dst.mkdir()
    (dst / PACK_PENDING).write_text('{"shards": ["../../etc/passwd", "mine.parquet"]}')
    (dst / "mine.parquet").write_bytes(b"x")
    with pytest.raises(Exception, match="not a marker a pack wrote"):
        pack_files(src, str(dst), shard_bytes=150)
    assert (dst / "mine.parquet").read_bytes() == b"x"


# --- listing skips keys a store cannot be asked for ---------------------------------


def test_local_names_a_store_refuses_are_skipped_at_listing(tmp_path, caplog) -> None:
    root = tmp_path / "raw"
    make_raw(str(root), 4, size=10)
    (root / "a\\b.bin").write_bytes(b"back")
    (root / "c\x01d.bin").write_bytes(b"ctrl")
    with caplog.at_level(logging.WARNING, logger="ckptstore.data.dataset"):
        ds = ShardedDataset(str(root), format="raw", cache_dir=str(tmp_path / "c"))
    assert [s.path for s in ds.shards] == [
        "f0000.bin",
        "f0002.bin",
        "sub/f0001.bin",
        "sub/f0003.bin",
    ]
    warned = [r for r in caplog.records if "skipping 2 object" in r.getMessage()]
    assert len(warned) == 1
    assert len(_epoch_ids_raw(ds)) == 4


def _epoch_ids_raw(ds: ShardedDataset) -> list[bytes]:
    return [s["data"] for s in ds.fetch(range(ds.num_samples))]


@pytest.mark.server
def test_s3_key_with_an_empty_segment_is_skipped_never_fails_mid_epoch(tmp_path, moto, caplog):
    """moto keeps ``x//y.bin`` as it is (SeaweedFS's filer makes it ``x/y.bin``)."""
    import boto3

    prefix = f"raw-{uuid.uuid4().hex[:8]}"
    opts = moto.storage_options
    s3 = boto3.client(
        "s3",
        endpoint_url=opts["endpoint_url"],
        aws_access_key_id=opts["key"],
        aws_secret_access_key=opts["secret"],
        region_name="us-east-1",
    )
    for key in ("a.bin", "x//y.bin", "z.bin"):
        s3.put_object(Bucket=BUCKET, Key=f"{prefix}/{key}", Body=key.encode())
    url = f"s3://{BUCKET}/{prefix}"
    with caplog.at_level(logging.WARNING, logger="ckptstore.data.dataset"):
        ds = ShardedDataset(
            url, storage_options=dict(opts), format="raw", cache_dir=str(tmp_path / "c")
        )
    listed = [s.path for s in ds.shards]
    assert "a.bin" in listed and "z.bin" in listed and all("//" not in p for p in listed)
    assert any("skipping" in r.getMessage() for r in caplog.records)
    assert sorted(_epoch_ids_raw(ds)) == [b"a.bin", b"z.bin"]
    ds.close()


# --- shard footers: sizes checked against the file, errors of the data layer ---------


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        low, v = v & 0x7F, v >> 7
        out.append(low | (0x80 if v else 0))
        if not v:
            return bytes(out)


def _parquet_claiming(rows: int, real: int = 4242) -> bytes:
    """A Parquet file of ``real`` rows whose footer (re-framed) claims ``rows``."""
    buf = io.BytesIO()
    pq.write_table(pa.table({"id": np.arange(real, dtype=np.int64)}), buf, row_group_size=10**6)
    data = buf.getvalue()
    flen = int.from_bytes(data[-8:-4], "little")
    body, footer = data[: -8 - flen], data[-8 - flen : -8]
    old = b"\x16" + _varint(2 * real)  # compact thrift: field +1, i64, zigzag varint
    assert footer.count(old) >= 2
    zigzag = ((rows << 1) ^ (rows >> 63)) & ((1 << 64) - 1)  # negative counts too
    footer = footer.replace(old, b"\x16" + _varint(zigzag))
    return body + footer + len(footer).to_bytes(4, "little") + b"PAR1"


def _arrow_claiming(rows: int, real: int = 4242) -> bytes:
    buf = io.BytesIO()
    table = pa.table({"id": np.arange(real, dtype=np.int64)})
    with ipc.new_file(buf, table.schema) as w:
        w.write_table(table)
    return buf.getvalue().replace(struct.pack("<q", real), struct.pack("<q", rows))


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_footer_claiming_a_huge_row_count_is_refused_at_listing(tmp_path, fmt) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    make = _parquet_claiming if fmt == "parquet" else _arrow_claiming
    (root / f"bomb.{fmt}").write_bytes(make(1 << 50))
    t0 = time.monotonic()
    with pytest.raises(ShardFormatError, match="rows"):
        ShardedDataset(str(root), format=fmt, cache_dir=str(tmp_path / "c"))
    assert time.monotonic() - t0 < 10


def test_truncated_parquet_is_a_shard_format_error(tmp_path) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    data = _parquet_claiming(4242)  # an honest file, re-framed
    flen = int.from_bytes(data[-8:-4], "little")
    body, tail = data[: -8 - flen], data[-8 - flen :]
    (root / "cut.parquet").write_bytes(body[: len(body) // 2] + tail)  # pages cut, footer kept
    ds = ShardedDataset(str(root), cache_dir=str(tmp_path / "c"), shuffle=False)
    with pytest.raises(ShardFormatError, match="cut.parquet"):
        ds.fetch([0])
    ds.close()


def test_footer_claiming_more_rows_than_a_group_holds_is_a_shard_format_error(tmp_path):
    root = tmp_path / "ds"
    root.mkdir()
    (root / "lie.parquet").write_bytes(_parquet_claiming(4300))
    ds = ShardedDataset(str(root), cache_dir=str(tmp_path / "c"), shuffle=False)
    assert ds.num_samples == 4300
    with pytest.raises(ShardFormatError, match="4242 rows where its footer says 4300"):
        ds.fetch([4299])
    ds.close()


# --- loader positions beyond any epoch ------------------------------------------------


@pytest.mark.parametrize("cursor", [(1 << 62) + 1, (1 << 63) - 1, 1 << 63, 1 << 70])
def test_cursor_beyond_any_epoch_is_a_data_order_error(tmp_path, cursor) -> None:
    ds = _ds(tmp_path)
    dl = DataLoader(ds, batch_size=4, num_workers=0, rank=0, world_size=1, prefetch=False)
    state = dl.state_dict()
    state["cursor"] = cursor
    with pytest.raises(DataOrderError, match="beyond any epoch"):
        dl.load_state_dict(state)
        next(iter(dl))
    dl.close()
    with pytest.raises(DataOrderError):
        ds.order.sample_ids([cursor])
    ds.close()
