"""The cache's ledger: space decisions without scanning a directory of many small shards."""

from __future__ import annotations

import multiprocessing as mp
import os
from concurrent.futures import ThreadPoolExecutor

import pytest

from ckptstore.data import ShardedDataset
from ckptstore.data.cachefiles import cache_paths
from ckptstore.data.cachelocks import Ledger, Lock, process_gate
from ckptstore.data.cachespace import CacheSpace

from .datasets import make_raw

SIZE = 200  # bytes a file


def _files_bytes(cache_dir: str) -> int:
    """What the cache's shards take now: complete and in-progress files."""
    shards = os.path.join(cache_dir, "shards")
    return sum(
        os.path.getsize(os.path.join(shards, n))
        for n in os.listdir(shards)
        if n.endswith(".data") or ".data.tmp-" in n
    )


def _ledger(cache_dir: str) -> tuple[int, int] | None:
    with Lock(cache_paths(cache_dir), "budget.lock") as lock:
        return Ledger(lock).read()


def _many(tmp_path, count: int, limit_files: int) -> ShardedDataset:
    make_raw(str(tmp_path / "ds"), count, size=SIZE)
    return ShardedDataset(
        str(tmp_path / "ds"),
        format="raw",
        seed=5,
        cache_dir=str(tmp_path / "cache"),
        cache_limit=limit_files * SIZE,
    )


@pytest.mark.parametrize(
    "content", [b"", b"garbage", b"-5 0", b"1 2 3", b"12", b"1.5 2", b"\xff\xfe"]
)
def test_anything_but_two_counts_reads_as_unknown(tmp_path, content) -> None:
    path = tmp_path / "budget.lock"
    path.write_bytes(content)
    with Lock(cache_paths(str(tmp_path)), "budget.lock") as lock:
        assert Ledger(lock).read() is None


def test_a_count_reads_back_after_a_longer_one_and_frees_down_to_zero(tmp_path) -> None:
    with Lock(cache_paths(str(tmp_path)), "budget.lock") as lock:
        ledger = Ledger(lock)
        ledger.write(123456789012, 987654321)
        ledger.write(10, 3)  # shorter: no tail of the longer one left behind
        assert ledger.read() == (10, 3)
        ledger.free(4)
        assert ledger.read() == (6, 3)
        ledger.free(100)
        assert ledger.read() == (0, 3)


def test_many_small_shards_are_budgeted_with_few_scans(tmp_path, monkeypatch) -> None:
    """400 files through a 100-file budget: once full, every download evicts. The files
    are counted (a scan of the directory) once per several downloads, not for each, and
    the budget holds throughout; the ledger never counts less than the files take."""
    ds = _many(tmp_path, 400, limit_files=100)
    scans = []
    usage = CacheSpace.usage

    def counted(self):
        scans.append(1)
        return usage(self)

    monkeypatch.setattr(CacheSpace, "usage", counted)
    order = ds.order
    seen = []
    for cursor in range(0, ds.num_samples, 16):
        seen += [s["path"] for s in ds.fetch(order.stream(cursor, 16), cursor)]
        took = _files_bytes(ds.cache_dir)
        assert took <= ds.cache_limit
        assert _ledger(ds.cache_dir)[0] >= took
    assert sorted(seen) == sorted(s.path for s in ds.shards)
    stats = ds.cache_stats()
    assert stats["downloads"] == 400 and stats["evictions"] >= 300
    # limit / 16 to spare is 6 files an eviction; limit / 8 is 12 files between recounts
    assert len(scans) <= 400 // 4, len(scans)
    ds.close()


def test_a_wrong_count_is_corrected_by_the_next_recount(tmp_path) -> None:
    """Another tool (or an older version, or a process without the limit) wrote a count
    below what the files take: the cache goes over its limit by at most limit / 8 before
    it recounts, then evicts back under it."""
    ds = _many(tmp_path, 200, limit_files=100)
    order = ds.order
    ds.fetch(order.stream(0, 100), 0)  # full
    assert _files_bytes(ds.cache_dir) == ds.cache_limit
    with Lock(cache_paths(ds.cache_dir), "budget.lock") as lock:
        lock.acquire()
        Ledger(lock).write(0, 0)
    most = 0
    for cursor in range(100, 200, 4):
        ds.fetch(order.stream(cursor, 4), cursor)
        most = max(most, _files_bytes(ds.cache_dir))
    assert most <= ds.cache_limit + ds.cache_limit // 8 + 4 * SIZE
    assert _files_bytes(ds.cache_dir) <= ds.cache_limit
    assert _ledger(ds.cache_dir)[0] >= _files_bytes(ds.cache_dir)
    ds.close()


def test_a_reservation_that_finds_no_room_is_not_counted(tmp_path) -> None:
    ds = _many(tmp_path, 4, limit_files=2)
    cache = ds.make_cache()
    pins = [cache.acquire(i, 0) for i in (0, 1)]  # the whole budget, pinned
    before = _ledger(ds.cache_dir)
    assert cache.space.reserve(ds.entries[2], 0, None) is None
    assert _ledger(ds.cache_dir)[0] == before[0] == 2 * SIZE
    for h in pins:
        h.release()
    ds.close()


def _gate_in_child(path: str, queue) -> None:
    gate = process_gate(path)
    queue.put(gate.acquire(timeout=5))


@pytest.mark.processes
def test_the_gate_is_one_per_lock_file_and_a_forked_child_starts_with_a_free_one(tmp_path):
    a, b = str(tmp_path / "a.lock"), str(tmp_path / "b.lock")
    assert process_gate(a) is process_gate(a)
    assert process_gate(a) is not process_gate(b)
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    with process_gate(a):  # held by this process when it forks
        child = ctx.Process(target=_gate_in_child, args=(a, queue))
        child.start()
        assert queue.get(timeout=10) is True
        child.join(10)
    assert child.exitcode == 0


def test_threads_of_one_process_share_the_budget_without_losing_a_byte(tmp_path) -> None:
    """Many threads reserving at once through the gate: each reservation counted once."""
    ds = _many(tmp_path, 64, limit_files=64)
    cache = ds.make_cache()
    with ThreadPoolExecutor(16) as pool:
        handles = cache.acquire_many(list(range(64)), 0, pool)
    assert len(handles) == 64
    for h in handles.values():
        h.release()
    assert _ledger(ds.cache_dir)[0] == 64 * SIZE == _files_bytes(ds.cache_dir)
    ds.close()
