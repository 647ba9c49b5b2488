"""The node-local shard cache: verify, re-fetch, budget, eviction, pins, locks, bad inputs."""

from __future__ import annotations

import errno
import multiprocessing as mp
import os
import threading
import time
import uuid

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ckptstore.config import TransferConfig
from ckptstore.data import ShardedDataset
from ckptstore.data.cache import ShardCache
from ckptstore.engine.store import Store
from ckptstore.errors import CacheError, DatasetChangedError, TransferError
from ckptstore.stores.local import LocalStore
from ckptstore.testing.faults import FaultyStore

from .datasets import make_parquet

SIZES = [10, 12, 14, 16]  # N = 52, identity order with shuffle=False


class TruncatingStore(FaultyStore):
    """Returns the first ``cut`` bytes short on the GET calls numbered in ``calls``."""

    def __init__(self, inner: Store, calls: set[int] | None, cut: int = 10) -> None:
        super().__init__(inner)
        self.truncate = calls
        self.cut = cut

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        data = super().get(path, start, end)
        if self.truncate is None or self.calls["get"] in self.truncate:
            return data[: max(0, len(data) - self.cut)]
        return data


def _ds(tmp_path, store=None, sizes=SIZES, **kw) -> ShardedDataset:
    root = tmp_path / "ds"
    if not root.exists():
        make_parquet(str(root), sizes, row_group=4, payload=64)
    kw.setdefault("cache_dir", str(tmp_path / "cache"))
    kw.setdefault("shuffle", False)
    kw.setdefault("buckets", 1)
    return ShardedDataset(store or str(root), **kw)


def _cached(cache: ShardCache) -> set[int]:
    return {i for i in range(len(cache.entries)) if cache.is_cached(i)}


def test_download_verify_and_hit(tmp_path) -> None:
    ds = _ds(tmp_path)
    cache = ds.make_cache()
    with cache.acquire(1, 0) as h:
        assert open(h.path, "rb").read() == open(tmp_path / "ds" / "part-0001.parquet", "rb").read()
    with cache.acquire(1, 0):
        pass
    s = cache.stats.snapshot()
    assert (s["downloads"], s["misses"], s["hits"]) == (1, 1, 1)
    assert s["bytes"] == ds.shards[1].size
    other = ds.make_cache()  # another process's view: verifies, then hits
    with other.acquire(1, 0):
        pass
    assert other.stats.snapshot()["hits"] == 1 and other.stats.snapshot()["downloads"] == 0


def test_big_shard_uses_parallel_ranged_gets(tmp_path) -> None:
    store = FaultyStore(LocalStore(str(tmp_path / "ds0")))
    make_parquet(str(tmp_path / "ds0"), [200], row_group=50, payload=256)
    cfg = TransferConfig(part_size=4096, concurrency=4, memory_budget=16384)
    ds = ShardedDataset(store, cache_dir=str(tmp_path / "cache"), transfer_config=cfg)
    before = store.calls["get"]
    assert [r["id"] for r in ds.fetch([0, 199, 57])] == [0, 199, 57]
    assert store.calls["get"] - before == -(-ds.shards[0].size // 4096)


def test_corrupt_cached_file_is_refetched(tmp_path) -> None:
    ds = _ds(tmp_path)
    first = ds.make_cache()
    first.acquire(0, 0).release()
    path = first.data_path(0)
    with open(path, "r+b") as f:  # flip one bit in the middle, keep the size
        f.seek(ds.shards[0].size // 2)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 1]))
    fresh = ds.make_cache()  # a process that never saw the file: checks its CRC
    fresh.acquire(0, 0).release()
    assert fresh.stats.snapshot()["corrupt"] == 1 and fresh.stats.snapshot()["downloads"] == 1
    assert open(path, "rb").read() == open(tmp_path / "ds" / "part-0000.parquet", "rb").read()
    with open(path, "r+b") as f:  # corrupt it again under the first view (mtime changes)
        f.seek(100)
        f.write(b"\0\0\0\0")
    first.acquire(0, 0).release()
    assert first.stats.snapshot()["corrupt"] == 1
    assert [r["id"] for r in ds.fetch(range(10))] == list(range(10))


def test_truncated_download_is_retried(tmp_path) -> None:
    make_parquet(str(tmp_path / "ds"), SIZES, row_group=4, payload=64)
    store = TruncatingStore(LocalStore(str(tmp_path / "ds")), calls=set())
    ds = _ds(tmp_path, store=store)
    store.truncate = {store.calls["get"] + 1}  # the next GET comes back short
    cache = ds.make_cache()
    cache.acquire(2, 0).release()
    s = cache.stats.snapshot()
    assert s["refetches"] == 1 and s["downloads"] == 1
    assert not [n for n in os.listdir(tmp_path / "cache" / "shards") if ".tmp-" in n]


def test_always_truncated_download_fails_clearly(tmp_path) -> None:
    make_parquet(str(tmp_path / "ds"), SIZES, row_group=4, payload=64)
    store = TruncatingStore(LocalStore(str(tmp_path / "ds")), calls=set())
    ds = _ds(tmp_path, store=store)
    store.truncate = None
    with pytest.raises(TransferError, match="failed verification 3 times"):
        ds.make_cache().acquire(0, 0)
    assert not [n for n in os.listdir(tmp_path / "cache" / "shards") if ".tmp-" in n]


def test_shard_deleted_or_changed_after_listing(tmp_path) -> None:
    ds = _ds(tmp_path)
    os.unlink(tmp_path / "ds" / "part-0001.parquet")
    with pytest.raises(DatasetChangedError, match="part-0001.parquet no longer exists"):
        ds.fetch([15])
    make_parquet(str(tmp_path / "ds"), [10, 12, 15, 16], row_group=4, payload=64)  # shard 2 grew
    with pytest.raises(DatasetChangedError, match="part-0002.parquet is now"):
        ds.fetch([30])
    # Same size, other content: the footer (statistics) differs from the listed one.
    old = ds.shards[3]
    table = pq.read_table(tmp_path / "ds" / "part-0003.parquet")
    table = table.set_column(0, "id", pa.array([v + 1000 for v in table["id"].to_pylist()]))
    pq.write_table(table, tmp_path / "ds" / "part-0003.parquet", row_group_size=4)
    assert os.path.getsize(tmp_path / "ds" / "part-0003.parquet") == old.size
    with pytest.raises(DatasetChangedError, match="different footer"):
        ds.fetch([40])


def test_evicts_the_shard_needed_farthest_never_a_pinned_one(tmp_path) -> None:
    probe = _ds(tmp_path)
    limit = sorted(s.size for s in probe.shards)[-1] * 2 + 10  # any two shards fit
    ds = _ds(tmp_path, cache_limit=limit)
    cache = ds.make_cache()
    off = [0, 10, 22, 36, 52]
    cache.acquire(0, off[0]).release()
    cache.acquire(1, off[1]).release()
    assert _cached(cache) == {0, 1}
    cache.acquire(2, off[2]).release()  # shard 1 is next used after shard 0 (next epoch)
    assert _cached(cache) == {0, 2}
    pin = cache.acquire(2, off[3])  # now shard 2 is the farthest, but pinned
    cache.acquire(3, off[3]).release()
    assert _cached(cache) == {2, 3}
    pin.release()
    # A prefetch may only evict shards needed later than the one it fetches.
    assert cache.prefetch(0, off[3], 52 - 36) == "fetched"  # evicts 2 (needed last)
    assert _cached(cache) == {0, 3}
    assert cache.prefetch(1, off[3], 52 - 36 + 10) == "full"  # 0 and 3 are needed sooner
    assert cache.stats.snapshot()["evictions"] == 3


def test_all_pinned_waits_then_errors_not_deadlocks(tmp_path) -> None:
    probe = _ds(tmp_path)
    ds = _ds(tmp_path, cache_limit=max(s.size for s in probe.shards), cache_wait_timeout=0.5)
    holder, waiter = ds.make_cache(), ds.make_cache()
    waiter.on_pressure = None
    pin = holder.acquire(0, 0)
    t0 = time.monotonic()
    with pytest.raises(CacheError, match="every cached shard is in use"):
        waiter.acquire(1, 0)
    assert time.monotonic() - t0 < 5
    threading.Timer(0.2, pin.release).start()
    waiter.acquire(1, 0).release()  # succeeds once the pin goes
    assert _cached(waiter) == {1}


def test_stale_temp_of_a_dead_process_is_reclaimed(tmp_path) -> None:
    probe = _ds(tmp_path)
    ds = _ds(tmp_path, cache_limit=max(s.size for s in probe.shards) + 10)
    cache = ds.make_cache()
    stale = os.path.join(
        cache.dir, "shards", f"{ds.entries[2].key}.data.tmp-999999-{uuid.uuid4().hex}"
    )
    with open(stale, "wb") as f:
        f.truncate(ds.shards[3].size)
    cache.acquire(0, 0).release()
    assert not os.path.exists(stale)


def test_unwritable_or_full_cache_dir(tmp_path, monkeypatch) -> None:
    (tmp_path / "afile").write_bytes(b"x")
    with pytest.raises(CacheError, match="cannot use cache_dir"):
        _ds(tmp_path, cache_dir=str(tmp_path / "afile" / "cache"))
    ds = _ds(tmp_path)

    def no_space(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", no_space)
    with pytest.raises(CacheError, match="is full"):
        ds.fetch([0])
    assert not [n for n in os.listdir(tmp_path / "cache" / "shards") if ".tmp-" in n]


def _acquire_in_child(ds: ShardedDataset, queue) -> None:
    cache = ds.make_cache()
    cache.acquire(3, 0).release()
    queue.put(cache.stats.snapshot())


@pytest.mark.processes
def test_processes_of_a_node_share_one_download(tmp_path) -> None:
    make_parquet(str(tmp_path / "ds"), SIZES, row_group=4, payload=64)
    from ckptstore.testing.faults import Fault

    slow = FaultyStore(LocalStore(str(tmp_path / "ds")), [Fault("get", delay=0.3)])
    ds = _ds(tmp_path, store=slow)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_acquire_in_child, args=(ds, queue)) for _ in range(3)]
    for p in procs:
        p.start()
    stats = [queue.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(10)
    assert sum(s["downloads"] for s in stats) == 1
    assert sum(s["hits"] for s in stats) == 2


def test_prefetch_depth_is_sized_by_bytes() -> None:
    from ckptstore.data.prefetch import prefetch_depth

    assert prefetch_depth([32 << 10] * 768) == 32  # small raw files: many GETs in flight
    assert prefetch_depth([4 << 20] * 16) == 8  # 32 MiB of 4 MiB shards
    assert prefetch_depth([8 << 20] * 4) == 4
    assert prefetch_depth([1 << 30]) == 4  # never fewer than 4
    assert prefetch_depth([]) == 32
