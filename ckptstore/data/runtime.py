"""One process's working parts for a :class:`~ckptstore.data.dataset.ShardedDataset`.

A rank and each of its DataLoader workers hold their own: store client, transfer engine,
cache view, decoded-group cache and the shards they have open (pinned in the cache). The
dataset re-makes it when it finds itself in another process (after a fork or unpickling),
so nothing with threads or locks is ever shared across a fork.

Call order: ``rt = ProcessRuntime(ds)``; ``rt.fetch(ids, cursor)`` any number of times;
``rt.release_idle()`` when the cache asks; ``rt.close()``.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np

from ckptstore.data.cache import Handle, ShardCache
from ckptstore.data.shardreader import GroupCache, ShardReader, open_reader
from ckptstore.data.stream import DataOrder
from ckptstore.engine.transfer import TransferEngine
from ckptstore.stores import open_store

if TYPE_CHECKING:
    from ckptstore.data.dataset import ShardedDataset

__all__ = ["ProcessRuntime", "ACQUIRE_THREADS"]

#: Shards one process pins (and downloads) side by side for one batch.
ACQUIRE_THREADS = 16
#: How often an idle process looks whether another waits for cache space (with a limit).
PRESSURE_POLL_S = 0.1


class ProcessRuntime:
    """One process's working parts for a dataset: never shared across a fork."""

    def __init__(self, ds: ShardedDataset) -> None:
        self.pid = os.getpid()
        self.ds = ds
        self.store = ds._store_arg or open_store(ds.url, ds.storage_options)
        self.engine = TransferEngine(ds.transfer_config)
        self.groups = GroupCache(ds.decode_cache)
        self.order_cache: DataOrder | None = None
        self._cache: ShardCache | None = None
        self._open: OrderedDict[int, tuple[Handle, ShardReader]] = OrderedDict()
        self._lock = threading.RLock()
        self._pressure_seen = 0
        self._acquirers: ThreadPoolExecutor | None = None
        self._closed = threading.Event()
        self._watcher: threading.Thread | None = None

    def order(self) -> DataOrder:
        """The dataset's data order, made on first use."""
        if self.order_cache is None:
            self.order_cache = self.ds.make_order()
        return self.order_cache

    @property
    def cache(self) -> ShardCache:
        """The shard cache for the current order, made on first use."""
        if self._cache is None or self._cache.order is not self.order():
            self._cache = self.ds.make_cache(self.order(), self.ds.verified)
            self._watch()
        return self._cache

    def _watch(self) -> None:
        """Start (once) the thread that unpins idle shards when another process waits.

        A DataLoader worker that made its batches ahead sits idle in torch's queue, its
        last shards pinned, while the loop waits for another worker's batch in order; if
        that one waits for cache space those pins hold, neither moves (until the wait
        times out). ``fetch`` checks the node's pressure stamp only when it runs, so this
        thread checks it every ``PRESSURE_POLL_S`` in between (one ``stat``).
        """
        if self._watcher is None and self.ds.cache_limit is not None:
            self._watcher = threading.Thread(
                target=self._watch_pressure, name="ckptstore-unpin", daemon=True
            )
            self._watcher.start()

    def _watch_pressure(self) -> None:
        while not self._closed.wait(PRESSURE_POLL_S):
            cache = self._cache
            if cache is None or not self._lock.acquire(blocking=False):
                continue  # a fetch in progress checks (and waits for room) by itself
            try:
                stamp = cache.pressure_stamp()
                if stamp != self._pressure_seen:
                    self._pressure_seen = stamp
                    self.release_idle()
            finally:
                self._lock.release()

    def _reader(self, shard: int, cursor: int, handle: Handle | None = None) -> ShardReader:
        """The open reader of ``shard``, opened (from ``handle``, else acquired) if needed."""
        hit = self._open.get(shard)
        if hit is not None:
            if handle is not None:
                handle.release()  # pinned twice: the open reader's pin is enough
            self._open.move_to_end(shard)
            return hit[1]
        if handle is None:
            handle = self.cache.acquire(shard, cursor)
        try:
            e = self.ds.entries[shard]
            reader = open_reader(
                e.fmt, handle.fd, e.path, e.rows, self.ds.columns, self.groups, e.key
            )
        except BaseException:
            handle.release()
            raise
        self._open[shard] = (handle, reader)
        while len(self._open) > self.ds.max_open_shards:
            self._close_one(next(iter(self._open)))
        return reader

    def _close_one(self, shard: int) -> None:
        handle, reader = self._open.pop(shard)
        reader.close()  # its decoded groups are copies: they may stay in the group cache
        handle.release()

    def release_idle(self) -> None:
        """Unpin every open shard (the cache calls this when it needs room or waits)."""
        with self._lock:
            for shard in list(self._open):
                self._close_one(shard)

    def fetch(self, ids: np.ndarray, cursor: int) -> list[Any]:
        """The samples ``ids`` (in that order), reading their shards through the cache.

        The shards of ``ids`` not open yet are pinned at once (``ShardCache.acquire_many``:
        one round trip for a batch of small files, not one per file), outside the lock, so
        a pool thread that waits may still unpin idle shards. Shards so pinned are read
        first; one that found no room, or that another process is downloading, is acquired
        after them, one at a time (a wait there unpins the shards just read).
        """
        stamp = self.cache.pressure_stamp()
        if stamp != self._pressure_seen:  # another process waits for space: unpin
            self._pressure_seen = stamp
            self.release_idle()
        order = self.order()
        shards = order.shard_of(ids)
        local = ids - order.shard_offsets[shards]
        out: list[Any] = [None] * len(ids)
        _, first = np.unique(shards, return_index=True)
        wanted = shards[np.sort(first)].tolist()
        with self._lock:
            need = [s for s in wanted if s not in self._open]
        pinned = self.cache.acquire_many(need, cursor, self._pool()) if len(need) > 1 else {}
        try:
            with self._lock:
                for s in sorted(wanted, key=lambda s: s not in pinned):  # pinned first
                    where = np.flatnonzero(shards == s)
                    rows = self._reader(s, cursor, pinned.pop(s, None)).take(local[where].tolist())
                    for pos, row in zip(where.tolist(), rows):
                        out[pos] = row
        finally:
            for handle in pinned.values():  # left over after an error
                handle.release()
        return out

    def _pool(self) -> ThreadPoolExecutor:
        """Threads that pin shards side by side (apart from the engine's I/O threads)."""
        with self._lock:
            if self._acquirers is None:
                self._acquirers = ThreadPoolExecutor(ACQUIRE_THREADS, "ckptstore-acquire")
            return self._acquirers

    def close(self) -> None:
        """Unpin every shard and close the engine (and the store, if this runtime opened it)."""
        self._closed.set()
        self.release_idle()
        pool, self._acquirers = self._acquirers, None
        if pool is not None:
            pool.shutdown(wait=True)
        self.engine.close()
        if self.ds._store_arg is None:
            self.store.close()
