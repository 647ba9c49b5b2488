"""Packing small files into Parquet shards (ckptstore.data.pack), read back as a dataset."""

from __future__ import annotations

import json
import os
import uuid

import pyarrow.parquet as pq
import pytest

from ckptstore.data import DataLoader, ShardedDataset, pack_files
from ckptstore.data.pack import plan_shards
from ckptstore.errors import ConfigError, EmptyDatasetError
from tests.conftest import BUCKET

from .datasets import make_raw


def test_plan_shards_closes_a_run_before_it_overflows() -> None:
    sizes = [("a", 4), ("b", 4), ("c", 3), ("d", 9), ("e", 1), ("f", 1)]
    runs = plan_shards(sizes, 8)
    assert [[p for p, _ in r] for r in runs] == [["a", "b"], ["c"], ["d"], ["e", "f"]]
    assert [x for r in runs for x in r] == sizes  # nothing lost, order kept
    assert plan_shards([], 8) == []
    with pytest.raises(ConfigError, match="shard_bytes"):
        plan_shards(sizes, 0)


def test_packed_files_read_back_as_the_raw_dataset_does(tmp_path) -> None:
    make_raw(str(tmp_path / "raw"), 23, size=100)
    (tmp_path / "raw" / ".hidden").write_bytes(b"not a sample")
    report = pack_files(
        str(tmp_path / "raw"), str(tmp_path / "packed"), shard_bytes=500, row_group_bytes=200
    )
    assert (report.files, report.nbytes) == (23, 2300)
    assert report.shards == tuple(f"part-{k:05d}.parquet" for k in range(5))  # 5 files a shard
    md = pq.read_metadata(tmp_path / "packed" / "part-00000.parquet")
    assert [md.row_group(g).num_rows for g in range(md.num_row_groups)] == [2, 2, 1]

    raw = ShardedDataset(str(tmp_path / "raw"), format="raw", cache_dir=str(tmp_path / "c1"))
    packed = ShardedDataset(str(tmp_path / "packed"), cache_dir=str(tmp_path / "c2"), seed=3)
    assert packed.format == "parquet" and packed.num_samples == raw.num_samples == 23
    want = {raw[i]["path"]: raw[i]["data"] for i in range(23)}
    dl = DataLoader(packed, 4, collate_fn=list)
    got = {s["path"]: s["data"] for b in dl for s in b}
    assert got == want  # every file once, same path and bytes
    dl.close()
    raw.close()

    with pytest.raises(ConfigError, match="already holds Parquet files"):
        pack_files(str(tmp_path / "raw"), str(tmp_path / "packed"))
    assert sorted(os.listdir(tmp_path / "packed")) == list(report.shards)  # untouched
    again = pack_files(str(tmp_path / "raw"), str(tmp_path / "p1"))
    assert again.shards == ("part-00000.parquet",)  # the 64 MiB default: one shard
    with pytest.raises(EmptyDatasetError, match="no files to pack"):
        pack_files(str(tmp_path / "raw"), str(tmp_path / "p2"), include="*.jpg")


@pytest.mark.server
def test_pack_from_s3_to_s3(tmp_path, seaweedfs) -> None:
    make_raw(str(tmp_path / "raw"), 9, size=300)
    prefix = f"{BUCKET}/pack-{uuid.uuid4().hex[:8]}"
    src = seaweedfs.store(f"{prefix}/raw")
    for root, _, names in os.walk(tmp_path / "raw"):
        for n in names:
            rel = os.path.relpath(os.path.join(root, n), tmp_path / "raw")
            src.put(rel, (tmp_path / "raw" / rel).read_bytes())
    opts = dict(seaweedfs.storage_options)
    report = pack_files(
        f"s3://{prefix}/raw", f"s3://{prefix}/packed", shard_bytes=1000, storage_options=opts
    )
    assert report.files == 9 and len(report.shards) == 3
    ds = ShardedDataset(
        f"s3://{prefix}/packed", storage_options=opts, cache_dir=str(tmp_path / "c")
    )
    assert sorted((ds[i]["path"], ds[i]["data"]) for i in range(9)) == sorted(
        (p, src.get(p)) for p in src.find("")
    )
    ds.close()


def test_pack_command_line(tmp_path, capsys) -> None:
    from ckptstore.cli.main import main

    make_raw(str(tmp_path / "raw"), 6, size=100)
    dst = str(tmp_path / "packed")
    argv = ["pack", str(tmp_path / "raw"), dst, "--shard-size", "300", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["files"], out["bytes"], len(out["shards"])) == (6, 600, 2)
    assert main(argv) == 2  # DST holds the shards now: refused, one line, nothing replaced
    err = capsys.readouterr().err
    assert "already holds Parquet files" in err and len(err.strip().splitlines()) == 1
    assert main(["pack", str(tmp_path / "raw"), str(tmp_path / "p2"), "--shard-size", "x"]) == 2
    assert "cannot read a size from 'x'" in capsys.readouterr().err
