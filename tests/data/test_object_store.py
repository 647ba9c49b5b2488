"""The data layer on a real object store: a Parquet dataset on SeaweedFS (S3)."""

import os
import uuid

import pytest

from ckptstore.data import DataLoader, ShardedDataset
from ckptstore.stores.local import LocalStore
from tests.conftest import BUCKET
from tests.data.datasets import make_parquet

pytestmark = pytest.mark.server


def test_parquet_on_s3_is_cached_and_served_exactly_once_and_resumes(tmp_path, seaweedfs):
    sizes = [13, 7, 21, 18]
    local = tmp_path / "ds"
    make_parquet(str(local), sizes, row_group=4)
    prefix = f"{BUCKET}/data-{uuid.uuid4().hex[:8]}"
    remote = seaweedfs.store(prefix)
    for name in LocalStore(str(local)).find():
        remote.put(name, (local / name).read_bytes())
    url, opts = f"s3://{prefix}", dict(seaweedfs.storage_options)
    cache = str(tmp_path / "cache")

    ds = ShardedDataset(url, storage_options=opts, cache_dir=cache, seed=5, buckets=2)
    assert ds.num_samples == sum(sizes)
    dl = DataLoader(ds, batch_size=5, num_workers=0, rank=0, world_size=1, prefetch=True)
    it = iter(dl)
    first = [i for _ in range(4) for i in next(it)["id"].tolist()]
    state = dl.state_dict()
    dl.close()
    assert sorted(os.listdir(cache))  # shards were cached locally

    # Resume on "two ranks" with another batch size: the rest of the epoch, exactly once.
    rest = []
    for rank in range(2):
        ds2 = ShardedDataset(url, storage_options=opts, cache_dir=cache, seed=5, buckets=2)
        dl2 = DataLoader(ds2, batch_size=3, num_workers=0, rank=rank, world_size=2)
        dl2.load_state_dict(state)
        rest += [i for b in dl2 for i in ([] if isinstance(b, list) else b["id"].tolist())]
        dl2.close()
    assert sorted(first + rest) == list(range(sum(sizes)))


def test_raw_files_on_s3_are_listed_with_their_sizes(tmp_path, seaweedfs):
    prefix = f"{BUCKET}/raw-{uuid.uuid4().hex[:8]}"
    remote = seaweedfs.store(prefix)
    blobs = {f"{i:03d}.bin": bytes([i]) * (100 + 37 * i) for i in range(5)}
    blobs["sub/005.bin"] = b"x" * 3
    for name, data in blobs.items():
        remote.put(name, data)
    # One listing gives what find lists plus what size says, without a HEAD per object.
    assert remote.find_sizes("") == {p: remote.size(p) for p in remote.find("")}
    assert remote.find_sizes("") == {p: len(d) for p, d in sorted(blobs.items())}
    assert remote.find_sizes("nothing-here") is None  # the caller falls back to find + size
    assert LocalStore(str(tmp_path)).find_sizes("") is None  # the default: no sizes listed

    url, opts = f"s3://{prefix}", dict(seaweedfs.storage_options)
    ds = ShardedDataset(url, storage_options=opts, format="raw", cache_dir=str(tmp_path / "c"))
    assert [(s.path, s.size) for s in ds.shards] == [(p, len(d)) for p, d in sorted(blobs.items())]
    assert ds[5] == {"path": "sub/005.bin", "data": b"x" * 3}
    ds.close()
