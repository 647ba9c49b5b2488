"""Bad input under a running loader: schema mismatch, a shard changed mid-run, a full disk.

(An empty dataset is covered by test_dataset.py::test_empty_dataset; a shard deleted or
changed between listing and fetch, at the dataset level, by
test_cache.py::test_shard_deleted_or_changed_after_listing.)
"""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from ckptstore.data import DataLoader, DataOrderError, ShardedDataset
from ckptstore.data.cachefiles import file_crc32c
from ckptstore.errors import CacheError, DatasetChangedError, ShardFormatError

from .datasets import make_parquet


def _write(path, table, fmt="parquet") -> None:
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=4, compression="none")
    else:
        with pa.OSFile(str(path), "wb") as f, ipc.new_file(f, table.schema) as w:
            w.write_table(table)


@pytest.mark.parametrize("fmt", ["parquet", "arrow"])
def test_schema_mismatch_between_shards_is_refused_at_listing(tmp_path, fmt) -> None:
    ext = {"parquet": "parquet", "arrow": "arrow"}[fmt]
    root = tmp_path / "ds"
    root.mkdir()
    _write(root / f"a.{ext}", pa.table({"id": [0, 1], "x": [0.5, 1.5], "y": [1, 2]}), fmt)
    _write(root / f"b.{ext}", pa.table({"id": [2, 3], "x": [1, 2], "z": ["u", "v"]}), fmt)

    def ds(**kw):
        return ShardedDataset(str(root), cache_dir=str(tmp_path / "c"), format=fmt, **kw)

    with pytest.raises(ShardFormatError) as err:
        ds()
    msg = str(err.value)
    assert f"in b.{ext}" in msg and f"'x' is int64 there, double in a.{ext}" in msg
    assert "'y' is missing there" in msg and "'z' is only there" in msg
    assert "columns=[...]" in msg
    with pytest.raises(ShardFormatError, match="'x' is int64 there"):
        ds(columns=["id", "x"])
    with pytest.raises(ShardFormatError, match=f"b.{ext} has no column 'y'"):
        ds(columns=["id", "y"])
    shared = ds(columns=["id"])  # the columns both shards agree on: fine
    assert sorted(shared[i]["id"] for i in range(4)) == [0, 1, 2, 3]
    shared.close()


def _ids_and_x(batch) -> list[tuple[int, float]]:
    return list(zip(batch["id"].tolist(), batch["x"].tolist()))


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.processes
def test_shard_changed_under_a_running_loader(tmp_path, workers) -> None:
    """Batches before the change are all listed data; the change is a clear error, not mixed."""
    make_parquet(str(tmp_path / "ds"), [8, 8, 8, 8], row_group=4)
    ds = ShardedDataset(
        str(tmp_path / "ds"), cache_dir=str(tmp_path / "c"), shuffle=False, buckets=1
    )
    dl = DataLoader(ds, 4, num_workers=workers, prefetch=False)
    it = iter(dl)
    got = _ids_and_x(next(it))  # shard 0 is now cached; shard 3 is not fetched yet
    rewritten = pa.table({"id": np.arange(24, 32) + 1000, "x": np.zeros(8, np.float32)})
    pq.write_table(rewritten, tmp_path / "ds" / "part-0003.parquet", row_group_size=4)
    with pytest.raises(DatasetChangedError) as err:
        for batch in it:
            got += _ids_and_x(batch)
    assert "part-0003.parquet" in str(err.value) and "Re-create the ShardedDataset" in str(
        err.value
    )
    assert got, "some batches came before the changed shard was needed"
    assert all(i < 24 and x == pytest.approx(i / 10) for i, x in got)  # only listed content
    state = dl.state_dict()
    assert state["cursor"] == len(got)  # the failed batch was never counted
    del it
    dl.close()
    relisted = ShardedDataset(
        str(tmp_path / "ds"), cache_dir=str(tmp_path / "c"), shuffle=False, buckets=1
    )
    with pytest.raises(DataOrderError, match="allow_dataset_change"):
        DataLoader(relisted, 4, prefetch=False).load_state_dict(state)
    relisted.close()


def _blob_shards(root, shards: int, rows: int, blob: int) -> None:
    root.mkdir()
    rng = np.random.default_rng(0)
    for s in range(shards):
        ids = np.arange(s * rows, (s + 1) * rows)
        blobs = [rng.bytes(blob) for _ in ids]  # incompressible: the file is ~rows*blob
        table = pa.table({"id": ids, "blob": pa.array(blobs, pa.binary())})
        pq.write_table(table, root / f"part-{s:04d}.parquet", compression="none")


def _cache_is_whole(cache_dir) -> list[str]:
    """Every cached shard matches its .meta; returns the names, asserts no temp file."""
    shards = cache_dir / "shards"
    names = sorted(os.listdir(shards))
    assert not [n for n in names if ".tmp-" in n], names
    for n in names:
        if n.endswith(".data"):
            with open(shards / (n[: -len(".data")] + ".meta")) as f:
                meta = json.load(f)
            assert os.path.getsize(shards / n) == meta["size"]
            fd = os.open(shards / n, os.O_RDONLY)
            try:
                assert file_crc32c(fd) == meta["crc32c"]
            finally:
                os.close(fd)
    return names


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.processes
def test_cache_on_a_full_disk_evicts_and_never_tears_a_file(tmp_path, tiny_disk, prefetch):
    """No cache_limit, a disk that holds 3 of 6 shards: ENOSPC evicts like a budget would."""
    _blob_shards(tmp_path / "ds", shards=6, rows=10, blob=30_000)  # ~300 KB a shard
    cache = tiny_disk / "cache"
    ds = ShardedDataset(str(tmp_path / "ds"), cache_dir=str(cache), seed=1, buckets=2)
    dl = DataLoader(ds, 4, prefetch=prefetch)
    for _ in range(2):
        seen = [i for b in dl for i in b["id"].tolist()]
        assert sorted(seen) == list(range(60))  # every sample exactly once per epoch
    m = dl.metrics.summary()
    assert m["evictions"] >= 3 and m["downloads"] >= 9
    dl.close()
    assert len([n for n in _cache_is_whole(cache) if n.endswith(".data")]) <= 3


@pytest.mark.processes
def test_shard_larger_than_the_disk_is_a_clear_error(tmp_path, tiny_disk) -> None:
    _blob_shards(tmp_path / "ds", shards=2, rows=4, blob=400_000)  # 1.6 MB a shard
    cache = tiny_disk / "cache"
    ds = ShardedDataset(str(tmp_path / "ds"), cache_dir=str(cache), seed=1)
    dl = DataLoader(ds, 2, prefetch=False)
    with pytest.raises(CacheError, match=f"cache_dir {cache} is full"):
        next(iter(dl))
    dl.close()
    assert _cache_is_whole(cache) == []  # nothing torn, nothing half-written left


@pytest.mark.processes
def test_a_disk_full_at_the_meta_write_evicts_and_the_shard_is_cached(tmp_path, tiny_disk):
    """The disk fills between a shard's reserve (its data's space allocated up front) and
    its small .meta file: a cached shard no one holds is evicted, as the reserve would."""
    _blob_shards(tmp_path / "ds", shards=2, rows=10, blob=30_000)  # ~300 KB a shard
    cache = tiny_disk / "cache"
    ds = ShardedDataset(str(tmp_path / "ds"), cache_dir=str(cache), seed=1)
    c = ds.make_cache()
    c.acquire(0, 0).release()  # shard 0 cached, held by no one
    page = os.statvfs(tiny_disk).f_frsize
    st = os.statvfs(tiny_disk)
    room = -(-ds.entries[1].size // page) * page  # shard 1's data, not its .meta
    with open(tiny_disk / "filler", "wb") as f:
        f.write(bytes(st.f_bavail * st.f_frsize - room))
    c.acquire(1, 0).release()
    names = _cache_is_whole(cache)
    assert [n for n in names if n.endswith(".data")] == [ds.entries[1].key + ".data"], names
