"""Attacks on the data cache's paths (issue #58 §2): every path below ``cache_dir`` is
resolved from its descriptor, so a folder of the cache swapped for a link to an outside
directory while it works takes no act outside, and a FIFO planted where the cache reads or
locks a file is refused at once, never waited on.

The swap: a child process renames ``shards/`` (or ``locks/``) away, puts a link to an
outside directory in its place and puts it back, thousands of times a second
(``swap.hammer``), while one cache view downloads, verifies, pins, reads, prefetches,
evicts (a budget of three shards of eight) and recounts its space. The outside directory
holds sentinel files at exactly the names the cache reads, writes, locks and deletes.

A FIFO: each call runs on a thread with a deadline (``test_fifo._within``), so a
regression fails the test instead of hanging the suite.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckptstore.data import DataLoader, ShardedDataset
from ckptstore.errors import UnsafePathError
from tests.adversarial.swap import SENTINEL, Escaped, Swapper, hammer, seed_outside, snapshot
from tests.adversarial.test_fifo import _plant, _within
from tests.data.datasets import make_raw

SECONDS = 3.0
SIZE = 200


def _ds(tmp_path: Path, **kw) -> ShardedDataset:
    src = tmp_path / "ds"
    if not src.exists():
        make_raw(str(src), 8, size=SIZE)
    kw.setdefault("cache_dir", str(tmp_path / "cache"))
    return ShardedDataset(str(src), format="raw", shuffle=False, buckets=1, **kw)


def _content(tmp_path: Path, ds: ShardedDataset, i: int) -> bytes:
    return (tmp_path / "ds" / ds.shards[i].path).read_bytes()


@pytest.mark.processes
@pytest.mark.parametrize("folder", ["shards", "locks"])
def test_a_cache_folder_swapped_for_a_link_takes_no_act_outside(tmp_path, folder) -> None:
    ds = _ds(tmp_path, cache_limit=3 * SIZE, cache_wait_timeout=2)
    keys = [e.key for e in ds.entries]
    names = {
        "shards": [n for k in keys for n in (f"{k}.data", f"{k}.meta")],
        "locks": [n for k in keys for n in (f"{k}.use", f"{k}.dl")],
    }[folder]
    outside = tmp_path / "outside"
    seed_outside(outside, names)
    for name in names:  # a .data sentinel of the listed size: only its bytes give it away
        if name.endswith(".data"):
            (outside / name).write_bytes(SENTINEL.ljust(SIZE, b"s"))
    before = snapshot(outside)
    want = {i: _content(tmp_path, ds, i) for i in range(len(keys))}
    cache = ds.make_cache()

    def read(i: int) -> None:
        h = cache.acquire(i, 0)
        try:
            got = os.pread(h.fd, SIZE + 1, 0)
        finally:
            h.release()
        if got != want[i]:
            raise Escaped(f"shard {i} read {got[:20]!r}, not its own bytes")

    ops = [lambda i=i: read(i) for i in range(len(keys))]
    ops += [lambda i=i: cache.prefetch(i, 0, 10**9) for i in range(len(keys))]
    ops += [lambda i=i: cache.is_cached(i) for i in range(len(keys))]
    swapper = Swapper(tmp_path / "cache" / folder, outside, SECONDS)
    try:
        calls, foreign = hammer(swapper, ops)
    finally:
        swaps = swapper.join()
    ds.close()
    assert swaps > 100 and calls > 100, (swaps, calls)
    assert snapshot(outside) == before, "the cache read, wrote or deleted outside its folder"
    assert not foreign, f"not ckptstore errors: {foreign[:5]!r}"
    # and it still works once the folder is itself again
    ds = _ds(tmp_path, cache_limit=3 * SIZE)
    cache = ds.make_cache()
    for i in range(len(keys)):
        read(i)
    ds.close()


def _fifo_at(tmp_path: Path, name: str, **kw) -> tuple[ShardedDataset, Path]:
    """A dataset whose cache holds shard 0 (downloaded and published), then a FIFO at the
    cache's file ``name`` ({key} stands for shard 0's key)."""
    ds = _ds(tmp_path, **kw)
    ds.make_cache().acquire(0, 0).release()
    fifo = _plant(tmp_path / "cache" / name.format(key=ds.entries[0].key))
    return ds, fifo


@pytest.mark.parametrize(
    "name", ["shards/{key}.data", "shards/{key}.meta", "locks/{key}.use", "locks/{key}.dl"]
)
def test_a_fifo_where_the_cache_reads_or_locks_is_refused_at_once(tmp_path, name) -> None:
    """A fresh view (nothing verified yet) acquiring shard 0: its copy, its ``.meta`` and
    its lock files are opened; a FIFO at any of them is ``UnsafePathError`` naming it, and
    is left where it is. The ``dl`` lock is opened only when the copy is not good: the
    copy is taken away first there."""
    ds, fifo = _fifo_at(tmp_path, name)
    if name.endswith(".dl"):
        os.unlink(tmp_path / "cache" / "shards" / f"{ds.entries[0].key}.data")
    cache = ds.make_cache()
    with pytest.raises(UnsafePathError, match=r"FIFO \(named pipe\), not a regular file"):
        _within([fifo], lambda: cache.acquire(0, 0))
    assert fifo.exists() and not fifo.is_file()
    if name.endswith(".data"):  # a prefetch takes the name as taken: nothing fetched over it
        assert _within([fifo], lambda: cache.prefetch(0, 0, 10)) == "cached"
    ds.close()


def test_a_fifo_at_the_budget_lock_or_pressure_is_refused_at_once(tmp_path) -> None:
    """``budget.lock`` is opened for every reservation under a limit: a FIFO there fails
    the download at once. ``pressure`` is only a hint to other processes: a FIFO there is
    skipped, nothing written into it."""
    ds, budget = _fifo_at(tmp_path, "budget.lock", cache_limit=4 * SIZE)
    pressure = _plant(tmp_path / "cache" / "pressure")
    cache = ds.make_cache()
    with pytest.raises(UnsafePathError, match="budget.lock is a FIFO"):
        _within([budget, pressure], lambda: cache.acquire(1, 0))
    _within([budget, pressure], cache.signal_pressure)
    _within([budget, pressure], cache.pressure_stamp)  # a stat: nothing opened
    ds.close()


def test_a_fifo_at_a_shard_fails_the_loader_at_once(tmp_path) -> None:
    """Through the DataLoader (a rank reading its batches): a clear error, not a hang."""
    ds, fifo = _fifo_at(tmp_path, "shards/{key}.data")
    dl = DataLoader(ds, batch_size=2, num_workers=0, rank=0, world_size=1, prefetch=False)

    def first_batch() -> None:
        next(iter(dl))

    try:
        with pytest.raises(UnsafePathError, match="FIFO"):
            _within([fifo], first_batch)
    finally:
        dl.close()
        ds.close()
