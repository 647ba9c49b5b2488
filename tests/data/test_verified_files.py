"""What a rank's processes verified in the cache is checked once per file identity, and a
one-part shard is read in the calling thread (``cachefiles.fetch_to_file``)."""

from __future__ import annotations

import os
import threading

import pytest

from ckptstore.config import TransferConfig
from ckptstore.data import DataLoader, ShardedDataset
from ckptstore.data.cachefiles import Mismatch, fetch_to_file, file_crc32c
from ckptstore.engine.transfer import TransferEngine
from ckptstore.stores.local import LocalStore

from .datasets import make_raw


class _ThreadRecordingStore(LocalStore):
    """A local store that records the threads its GETs ran on."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.threads: set[int] = set()

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        self.threads.add(threading.get_ident())
        return super().get(path, start, end)


def test_one_part_shard_is_read_in_the_calling_thread(tmp_path) -> None:
    make_raw(str(tmp_path / "src"), 1, size=5000)
    store = _ThreadRecordingStore(str(tmp_path / "src"))
    dest = os.open(tmp_path / "copy", os.O_RDWR | os.O_CREAT, 0o644)
    with TransferEngine(TransferConfig(part_size=8192)) as engine:
        try:
            crc = fetch_to_file(engine, store, "f0000.bin", 5000, dest)
            assert store.threads == {threading.get_ident()}
            assert crc == file_crc32c(dest) and os.pread(dest, 6000, 0) == b"\0" * 5000
            with open(tmp_path / "src" / "f0000.bin", "ab") as f:
                f.write(b"grown")  # an object that grew since it was listed is caught too
            with pytest.raises(Mismatch, match="returned 5001 bytes"):
                fetch_to_file(engine, store, "f0000.bin", 5000, dest)
        finally:
            os.close(dest)


@pytest.mark.processes
def test_next_epochs_workers_trust_what_the_rank_verified_not_a_changed_file(tmp_path) -> None:
    make_raw(str(tmp_path / "src"), 12, size=300)
    ds = ShardedDataset(
        str(tmp_path / "src"), format="raw", cache_dir=str(tmp_path / "cache"), seed=3
    )
    dl = DataLoader(ds, batch_size=4, num_workers=2, prefetch=False)
    first = sorted(p for b in dl for p in b["path"])
    paths = [ds.make_cache().data_path(i) for i in range(len(ds.shards))]
    assert all(ds.verified.get(p) is not None for p in paths)  # the workers reported them
    with open(paths[5], "r+b") as f:  # corrupt one in place; its identity changes (mtime)
        f.write(b"\xff")
    st = os.stat(paths[5])
    os.utime(paths[5], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    second = [b for b in dl]
    assert sorted(p for b in second for p in b["path"]) == first
    assert dl.metrics.worker["corrupt"] == 1 and dl.metrics.worker["downloads"] == 12 + 1
    assert all(set(d) == {i % 256} for b in second for d, i in zip(b["data"], _ids(b)))
    dl.close()


def _ids(batch) -> list[int]:
    return [int(os.path.basename(p)[1:5]) for p in batch["path"]]
