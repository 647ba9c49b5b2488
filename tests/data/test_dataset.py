"""ShardedDataset: listing, fingerprint, formats, and the listing's bad inputs."""

from __future__ import annotations

import io
import os

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from ckptstore.data import ShardedDataset, parse_size
from ckptstore.data.formats import read_index
from ckptstore.errors import (
    CacheTooSmallError,
    ConfigError,
    EmptyDatasetError,
    ShardFormatError,
)

from .datasets import make_arrow, make_parquet, make_raw


def _ds(root, tmp_path, **kw) -> ShardedDataset:
    kw.setdefault("cache_dir", str(tmp_path / "cache"))
    return ShardedDataset(str(root), **kw)


def test_parquet_listing_and_samples(tmp_path) -> None:
    make_parquet(str(tmp_path / "ds"), [10, 0, 25, 7], row_group=4)
    ds = _ds(tmp_path / "ds", tmp_path)
    assert ds.format == "parquet"
    assert [s.path for s in ds.shards] == [f"part-{i:04d}.parquet" for i in range(4)]
    assert ds.shard_sizes == (10, 0, 25, 7) and ds.num_samples == len(ds) == 42
    assert ds.shards[2].rows == (4, 4, 4, 4, 4, 4, 1)
    assert [ds[i]["id"] for i in range(42)] == list(range(42))
    got = ds.fetch([41, 0, 13, 12, 40])
    assert [r["id"] for r in got] == [41, 0, 13, 12, 40]
    assert got[0]["x"] == pytest.approx(4.1)
    with pytest.raises(IndexError):
        ds[42]
    ds.close()


def test_columns_and_include(tmp_path) -> None:
    make_parquet(str(tmp_path / "ds"), [5, 5])
    make_parquet(str(tmp_path / "ds"), [3], prefix="zz-other")
    ds = _ds(tmp_path / "ds", tmp_path, columns=["id"], include="part-*")
    assert ds.num_samples == 10 and ds[7] == {"id": 7}
    ds.close()


def test_arrow_index_and_samples(tmp_path) -> None:
    make_arrow(str(tmp_path / "ds"), [9, 33], batch=8)
    ds = _ds(tmp_path / "ds", tmp_path)
    assert ds.format == "arrow" and ds.shard_sizes == (9, 33)
    assert ds.shards[1].rows == (8, 8, 8, 8, 1)
    assert [ds[i]["id"] for i in range(42)] == list(range(42))
    ds.close()


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_arrow_index_matches_pyarrow(compression) -> None:
    table = pa.table({"a": np.arange(1000), "s": [str(i) for i in range(1000)]})
    sink = io.BytesIO()
    opts = ipc.IpcWriteOptions(compression=compression)
    with ipc.new_file(sink, table.schema, options=opts) as w:
        for b in table.to_batches(max_chunksize=300):
            w.write_batch(b)
    data = sink.getvalue()
    rows, digest = read_index("arrow", len(data), lambda off, n: data[off : off + n])
    reader = ipc.open_file(pa.BufferReader(data))
    assert rows == tuple(reader.get_batch(i).num_rows for i in range(reader.num_record_batches))
    assert len(digest) == 64


def test_raw_files(tmp_path) -> None:
    paths = make_raw(str(tmp_path / "ds"), 5, size=7)
    open(tmp_path / "ds" / ".hidden", "wb").close()
    ds = _ds(tmp_path / "ds", tmp_path, format="raw")
    assert ds.num_samples == 5 and ds.shard_sizes == (1,) * 5
    for i, p in enumerate(paths):
        sample = ds[i]
        assert sample["path"] == os.path.relpath(p, tmp_path / "ds")
        assert sample["data"] == open(p, "rb").read()
    ds.close()


def test_fingerprint_is_stable_and_tracks_content(tmp_path) -> None:
    paths = make_parquet(str(tmp_path / "ds"), [10, 10])
    a = _ds(tmp_path / "ds", tmp_path).fingerprint
    assert _ds(tmp_path / "ds", tmp_path).fingerprint == a
    make_parquet(str(tmp_path / "ds"), [10, 11])  # one more row in shard 1
    assert _ds(tmp_path / "ds", tmp_path).fingerprint != a
    os.unlink(paths[1])
    assert _ds(tmp_path / "ds", tmp_path).fingerprint != a


def test_empty_dataset(tmp_path) -> None:
    os.makedirs(tmp_path / "none")
    with pytest.raises(EmptyDatasetError, match="no parquet shards"):
        _ds(tmp_path / "none", tmp_path, format="parquet")
    make_parquet(str(tmp_path / "zero"), [0, 0])
    with pytest.raises(EmptyDatasetError, match="hold no samples"):
        _ds(tmp_path / "zero", tmp_path)
    with pytest.raises(ConfigError, match="detect the format"):
        _ds(tmp_path / "none", tmp_path)


def test_not_a_parquet_file(tmp_path) -> None:
    os.makedirs(tmp_path / "ds")
    (tmp_path / "ds" / "bad.parquet").write_bytes(b"this is not parquet at all")
    with pytest.raises(ShardFormatError, match="bad.parquet.*PAR1"):
        _ds(tmp_path / "ds", tmp_path)


def test_cache_limit_below_one_shard_is_refused(tmp_path) -> None:
    make_parquet(str(tmp_path / "ds"), [10, 200], payload=50)
    with pytest.raises(CacheTooSmallError, match="part-0001.parquet"):
        _ds(tmp_path / "ds", tmp_path, cache_limit="2KB")


def test_parse_size() -> None:
    assert parse_size("200GB") == 200 * 10**9
    assert parse_size("1.5GiB") == int(1.5 * 2**30)
    assert parse_size("512 MiB") == 512 * 2**20
    assert parse_size(17) == 17 and parse_size(None) is None
    with pytest.raises(ConfigError):
        parse_size("lots")
