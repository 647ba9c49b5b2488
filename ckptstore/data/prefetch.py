"""Background prefetch: download upcoming shards in order of first future use.

One :class:`Prefetcher` runs in the main process of each rank, beside the training loop. It
knows the consumption cursor (the loader calls :meth:`advance` for every batch handed to
training) and so the whole future of the global stream G. It fetches the shards used next,
soonest first, at most ``concurrency`` at a time, through the node's shared cache: a shard
another process is already fetching is skipped, and a prefetch never evicts a shard needed
sooner than the one it fetches (``ShardCache.prefetch``). DataLoader workers only read;
they find the shards prefetched, or fetch them on demand.

Call order::

    p = Prefetcher(dataset, concurrency=2)   # None: prefetch_depth of the shard sizes
    p.start(cursor)
    p.advance(cursor)      # after each batch is handed to training (a plain store)
    p.stop()               # at loader shutdown (a daemon thread: never blocks exit)
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from typing import TYPE_CHECKING

from ckptstore.data.cache import ShardCache

if TYPE_CHECKING:
    from ckptstore.data.dataset import ShardedDataset

__all__ = ["Prefetcher", "prefetch_depth"]

log = logging.getLogger(__name__)

#: Bytes the prefetcher keeps in flight when no concurrency is given (see prefetch_depth).
PREFETCH_BYTES = 32 << 20


def _in_flight(cache_dir: str, limit: int | None) -> int:
    """Bytes to keep in flight: PREFETCH_BYTES, or a quarter of the room the cache has.

    Every download pre-allocates its whole shard: on a nearly full disk or a small budget,
    many at once would take the space a demand read (or its small .meta file) needs.
    """
    room = limit if limit is not None else PREFETCH_BYTES * 4
    try:
        room = min(room, shutil.disk_usage(cache_dir).free)
    except OSError:
        pass
    return min(PREFETCH_BYTES, room // 4)


def prefetch_depth(shard_sizes: list[int], in_flight: int = PREFETCH_BYTES) -> int:
    """Shards fetched at once: about ``in_flight`` bytes' worth of the mean shard, 4 to 32.

    Small shards (raw files: one GET each, paced by the round trip) need many in flight to
    keep up with the loop; large ones are already split into parallel ranged GETs.
    """
    mean = sum(shard_sizes) / max(1, len(shard_sizes))
    return int(min(32, max(4, in_flight // max(1.0, mean))))


class Prefetcher:
    """A daemon thread keeping the next shards of the stream in the node-local cache."""

    def __init__(
        self, dataset: ShardedDataset, concurrency: int | None = 2, idle_s: float = 0.2
    ) -> None:
        self.cache: ShardCache = dataset.make_cache(dataset.make_order(), dataset.verified)
        if concurrency is None:
            concurrency = prefetch_depth(
                [s.size for s in dataset.shards], _in_flight(dataset.cache_dir, dataset.cache_limit)
            )
        self.concurrency = max(1, concurrency)
        self.idle_s = idle_s
        self.errors = 0
        self._cursor = 0
        self._cond = threading.Condition()
        self._stop = False
        self._inflight: set[int] = set()
        self._thread: threading.Thread | None = None
        self._failed: dict[int, float] = {}  # shard -> when it may be tried again
        self._full_at: int | None = None  # cursor at which the cache was full
        self._full_retry = 0.0

    @property
    def stats(self) -> dict[str, float]:
        """The cache counters of this process's prefetch cache."""
        return self.cache.stats.snapshot()

    def start(self, cursor: int) -> None:
        """Start the thread (once) and point it at ``cursor``."""
        with self._cond:
            self._cursor = cursor
            if self._thread is None:
                self._stop = False
                self._thread = threading.Thread(
                    target=self._run, name="ckptstore-prefetch", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def advance(self, cursor: int) -> None:
        """Record the consumption cursor (no wake-up: the thread looks every ``idle_s``)."""
        self._cursor = cursor  # a plain store: cheap on the training loop's path

    def stop(self) -> None:
        """Stop the thread and wait for it (up to 5 s); ``start`` may run it again."""
        with self._cond:
            self._stop = True
            thread, self._thread = self._thread, None
            self._cond.notify_all()
        if thread is not None:
            thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._stop:
                    return
                cursor = self._cursor
            try:
                self._schedule(cursor)
            except Exception as exc:  # noqa: BLE001 - keep prefetching; demand reads report
                self.errors += 1
                log.warning("prefetch scheduling failed: %s", exc)
            with self._cond:
                if not self._stop:
                    self._cond.wait(self.idle_s)  # a finished download wakes it early

    def _schedule(self, cursor: int) -> None:
        """Start downloads for the next uncached shards, soonest needed first."""
        now = time.monotonic()
        if self._full_at == cursor and now < self._full_retry:
            return  # the cache is full of shards needed sooner; wait for the stream to move
        for shard, distance in sorted(self.cache.distances(cursor).items(), key=lambda t: t[1]):
            with self._cond:
                if len(self._inflight) >= self.concurrency or self._stop:
                    return
                if shard in self._inflight:
                    continue
            if self._failed.get(shard, 0.0) > now or self.cache.is_cached(shard):
                continue
            with self._cond:
                self._inflight.add(shard)
            threading.Thread(
                target=self._fetch,
                args=(shard, cursor, distance),
                name=f"ckptstore-prefetch-{shard}",
                daemon=True,
            ).start()

    def _fetch(self, shard: int, cursor: int, distance: int) -> None:
        try:
            if self.cache.prefetch(shard, cursor, distance) == "full":
                with self._cond:
                    self._full_at, self._full_retry = cursor, time.monotonic() + 1.0
        except Exception as exc:  # noqa: BLE001 - the demand read reports it to the loop
            self.errors += 1
            self._failed[shard] = time.monotonic() + 5.0
            log.warning("prefetch of shard %s failed: %s", self.cache.entries[shard].path, exc)
        finally:
            with self._cond:
                self._inflight.discard(shard)
                self._cond.notify_all()
