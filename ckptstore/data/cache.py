"""The node-local shard cache: one directory shared by every process of a node.

Layout under ``cache_dir``: ``budget.lock`` (flock'ed around every space decision; holds the
ledger), ``pressure`` (touched by a process waiting for space: others unpin),
``shards/<key>.data`` (a complete, verified shard), ``shards/<key>.meta`` (its size, CRC32C
and footer digest, written first), ``shards/<key>.data.tmp-*`` (a download in progress,
pre-allocated), ``locks/<key>.use`` (shared-locked by every reader) and ``locks/<key>.dl``
(held by the one downloader). Only these names are the cache's (``cachefiles.cache_name``);
nothing else is counted, evicted or followed. Every path below ``cache_dir`` is resolved
from its descriptor (``ckptstore.stores.Anchor``): a link on the way or at the name, or
anything but a regular file where a file is read or locked, is ``UnsafePathError``, never
followed or waited on (a FIFO planted at a shard's name fails the read at once).

A download goes to a temp file, is verified and renamed into place; the budget (what fits,
what to evict: :mod:`~ckptstore.data.cachespace`) never evicts a pinned shard. Locks are
``flock`` locks, so a crashed process releases them; its temp files go at the next recount.
A rank checks a cached file's CRC32C the first time one of its processes (the rank, its
prefetcher, its DataLoader workers) opens it: :class:`~ckptstore.data.cachefiles.VerifiedFiles`.
A pinned shard is read through the descriptor its check opened (``Handle.fd``), so the
bytes read are those of the file that was verified.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future

from ckptstore.data.cachedownload import download
from ckptstore.data.cachefiles import (
    CacheEntry,
    CacheStats,
    Handle,
    VerifiedFiles,
    cache_dir_errors,
    cache_paths,
    check_limit,
    data_name,
    file_crc32c,
    meta_name,
    probe_cache_dir,
)
from ckptstore.data.cachespace import CacheSpace
from ckptstore.data.stream import DataOrder
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import CacheError, UnsafePathError

__all__ = ["CacheEntry", "Handle", "ShardCache", "cache_paths", "check_limit", "probe_cache_dir"]

log = logging.getLogger(__name__)

#: Touched by a process waiting for cache space: the others unpin their idle shards.
_PRESSURE = "pressure"


def _release_result(fut: Future[Handle | None]) -> None:
    """Release the pin a finished :meth:`ShardCache.acquire_many` task took, if it took one."""
    if not fut.cancelled() and fut.exception() is None:
        h = fut.result()
        if h is not None:
            h.release()


class ShardCache:
    """One process's view of a node-local cache directory. See the module docstring.

    Readers keep shards pinned between batches; a process waiting for space touches
    ``pressure`` and every process unpins its idle shards at its next batch (or while it
    waits itself), so pins never starve a waiter. A full disk evicts as a full budget does;
    only when nothing is left to evict does a demand read fail with ``CacheError``. A
    prefetch may only evict shards needed later than the one it fetches. Call order (per
    process)::

        cache = ShardCache(cache_dir, limit, store, engine, entries, order)
        h = cache.acquire(i, cursor)          # blocks until shard i is local and verified
        hs = cache.acquire_many(ids, cursor, pool)  # several at once; some may be left out
        ... read h.fd ...
        h.release()                           # evictable again (h.fd closed)
        cache.prefetch(i, cursor, distance)   # background: fetch if it fits, never waits
    """

    def __init__(
        self,
        cache_dir: str,
        limit: int | None,
        store: Store,
        engine: TransferEngine,
        entries: Sequence[CacheEntry],
        order: DataOrder,
        *,
        horizon: int | None = None,
        verify: bool = True,
        wait_timeout: float = 600.0,
        attempts: int = 3,
        on_pressure: Callable[[], None] | None = None,
        verified: VerifiedFiles | None = None,
    ) -> None:
        self.dir = os.path.abspath(os.path.expanduser(cache_dir))
        self.limit, self.store, self.engine = limit, store, engine
        self.entries, self.order = list(entries), order
        self.verify, self.wait_timeout, self.attempts = verify, wait_timeout, attempts
        self.on_pressure = on_pressure
        self.stats = CacheStats()
        n, c = order.num_samples, order.buckets
        # Look about 16 buckets ahead (at least 64k samples, at most the next epoch's end);
        # distances are recomputed when the cursor crosses 1/512 of that (cheap per batch).
        self.horizon = horizon or min(2 * n, max(16 * n // c, 1 << 16))
        self._quantum = max(1, self.horizon // 512)
        self.verified = verified or VerifiedFiles()  # shared with this rank's other views
        check_limit(limit, self.entries)
        self.paths = cache_paths(self.dir)
        probe_cache_dir(self.paths)
        space = (self.paths, limit, wait_timeout, self.stats)
        self.space = CacheSpace(*space, self._key_distances, self._discard)

    # -- pressure: a demand read waiting for space asks every process to unpin --------
    def signal_pressure(self) -> None:
        """Tell the node's other processes that one waits for space (they unpin idle shards).

        Best effort: where ``pressure`` cannot be touched (a link or a FIFO planted there,
        refused), the waiters' timeouts still hold."""
        try:
            fd = self.paths.open_rw(_PRESSURE)
        except (OSError, UnsafePathError):
            return
        try:
            os.utime(fd)  # through the fd the act opened: never a link's target
        except OSError:
            pass
        finally:
            os.close(fd)

    def pressure_stamp(self) -> int:
        """Changes whenever a process of the node waits for cache space (checked per batch)."""
        try:
            return self.paths.stat(_PRESSURE).st_mtime_ns
        except (OSError, UnsafePathError):
            return 0

    # -- paths and locks -------------------------------------------------------------
    def data_path(self, i: int) -> str:
        """Where shard ``i``'s cached copy lives (it may not exist yet): for messages and
        :class:`VerifiedFiles`, never opened by this name."""
        return self._shown(self.entries[i].key)

    def _shown(self, key: str) -> str:
        return self.paths.shown(data_name(key).split("/"))

    def _key_distances(self, cursor: int) -> dict[str, int]:
        return {self.entries[s].key: d for s, d in self.distances(cursor).items()}

    def distances(self, cursor: int) -> dict[int, int]:
        """``{shard: samples from cursor until its next use}`` within the horizon."""
        base = cursor - cursor % self._quantum
        uses = self.order.next_use_distances(base, self.horizon)
        return {s: d - (cursor - base) for s, d in uses.items()}

    # -- reading -------------------------------------------------------------------------
    def is_cached(self, i: int) -> bool:
        """Whether shard ``i`` has a complete copy (not yet verified by this process;
        anything else under its name is refused when it is read, never replaced)."""
        with cache_dir_errors(self.dir):
            try:
                self.paths.stat(data_name(self.entries[i].key))
            except FileNotFoundError:
                return False
            return True

    def acquire(self, i: int, cursor: int) -> Handle:
        """Pin shard ``i`` locally (downloading it if needed) and return its handle.

        Blocks while another process downloads it or while the budget is full of pinned
        shards; raises ``CacheError`` after ``wait_timeout`` s.
        """
        handle = self._acquire(i, cursor, wait=True)
        if handle is None:  # pragma: no cover - waiting for room ends in room or an error
            raise CacheError(f"no cache space was found for {self.entries[i].path}")
        return handle

    def acquire_many(self, shards: Sequence[int], cursor: int, pool: Executor) -> dict[int, Handle]:
        """Pin several shards at once: the missing ones download side by side on ``pool``.

        Nothing here waits on another process. A shard that finds no cache space *now*,
        and one another process is downloading (the prefetcher, another worker or rank),
        is left out of the result (nothing of it pinned): acquire it with :meth:`acquire`
        after using the others, so that waiting can unpin them. Waiting here for another
        process's download while holding this batch's other pins could deadlock: that
        download may itself wait for the room those pins hold. A shard is never fetched
        twice. On any error every pin taken here is released and the first failing shard's
        error (in ``shards`` order) is raised. ``pool``'s tasks must not share threads with
        ``self.engine.pool`` (each task waits on the engine's ranged GETs).
        """
        futures = [(i, pool.submit(self._acquire, i, cursor, wait=False)) for i in shards]
        got: dict[int, Handle] = {}
        error: BaseException | None = None
        try:
            for i, fut in futures:
                try:
                    h = fut.result()
                except Exception as exc:  # noqa: BLE001 - the first one is raised below
                    error = error or exc
                    continue
                if h is not None:
                    got[i] = h
        except BaseException:  # interrupted while waiting: pins taken later are dropped too
            for _, fut in futures:
                fut.add_done_callback(_release_result)
            for h in got.values():
                h.release()
            raise
        if error is not None:
            for h in got.values():
                h.release()
            raise error
        return got

    def _acquire(self, i: int, cursor: int, *, wait: bool) -> Handle | None:
        """:meth:`acquire`; with ``wait=False``, None where it would have to wait: for
        cache space, or for another process's download of the shard. An act on the cache
        directory that failed is a ``CacheError`` (``cache_dir_errors``)."""
        with cache_dir_errors(self.dir):
            return self._pin(i, cursor, wait=wait)

    def _pin(self, i: int, cursor: int, *, wait: bool) -> Handle | None:
        e = self.entries[i]
        path = self.data_path(i)
        use = self.space.lock(e.key, "use")
        use.acquire(shared=True)  # from here on nobody evicts the file
        try:
            state, fd = self._check(e)
            if fd is not None:
                self.stats.add(hits=1)
                return Handle(path, use, fd)
            t0 = time.monotonic()
            dl = self.space.lock(e.key, "dl")
            if not wait:
                if not dl.try_acquire():  # another process fetches it: acquire() waits
                    dl.close()
                    use.close()
                    return None
            else:
                dl.acquire(
                    timeout=self.wait_timeout,
                    what=f"download of {e.path}",
                    on_wait=0.05,
                    waiting=self.on_pressure,  # unpin idle shards while another one fetches
                )
            try:
                state, fd = self._check(e)  # another process may have fetched it meanwhile
                if fd is not None:
                    self.stats.add(hits=1, wait_seconds=time.monotonic() - t0)
                    return Handle(path, use, fd)
                if state == "corrupt":
                    log.warning(
                        "cached copy of %s is corrupt (size or checksum); re-fetching", e.path
                    )
                    self.stats.add(corrupt=1)
                    self._discard(e.key)
                fd = download(self, e, cursor, demand=True, wait=wait)
                if fd is None:
                    use.close()
                    return None
            finally:
                dl.close()
            self.stats.add(misses=1, wait_seconds=time.monotonic() - t0)
            return Handle(path, use, fd)
        except BaseException:
            use.close()
            raise

    def _check(self, e: CacheEntry) -> tuple[str, int | None]:
        """``("ok", descriptor of the verified copy)`` (the caller closes it),
        ``("missing", None)`` or ``("corrupt", None)``; the CRC is checked once per process.

        The copy and its ``.meta`` are opened from the cache directory's descriptor: a link
        or anything but a regular file under their names is ``UnsafePathError`` (left for
        whoever put it there), never followed or waited on."""
        try:
            fd = self.paths.open_read(data_name(e.key))
        except FileNotFoundError:
            return "missing", None
        try:
            st = os.fstat(fd)
            ident = (st.st_ino, st.st_mtime_ns, st.st_size)
            path = self._shown(e.key)
            if self.verified.get(path) != ident:
                if not self._verify(e, fd, st.st_size):
                    os.close(fd)
                    return "corrupt", None
                self.verified.add(path, ident)
        except BaseException:
            os.close(fd)
            raise
        return "ok", fd

    def _verify(self, e: CacheEntry, fd: int, size: int) -> bool:
        """Whether the copy open at ``fd`` (of ``size`` bytes) is ``e``'s, by its size and,
        with ``verify``, its ``.meta`` file's size and CRC32C."""
        if size != e.size:
            return False
        if not self.verify:
            return True
        try:
            with os.fdopen(self.paths.open_read(meta_name(e.key)), "rb") as f:
                meta = json.loads(f.read(4096))
            return (
                isinstance(meta, dict)
                and meta.get("size") == e.size
                and meta.get("crc32c") == file_crc32c(fd)
            )
        except UnsafePathError:
            raise  # planted (a ValueError too): refused, not re-fetched over
        except (OSError, ValueError):
            return False

    def _discard(self, key: str) -> None:
        self.paths.unlink(data_name(key))
        self.paths.unlink(meta_name(key))
        self.verified.discard(self._shown(key))

    # -- prefetch ------------------------------------------------------------------------
    def prefetch(self, i: int, cursor: int, distance: int) -> str:
        """Fetch shard ``i`` (next needed ``distance`` samples after ``cursor``) if it fits.

        Never waits: returns ``"cached"``, ``"busy"`` (another process is fetching it),
        ``"full"`` (only shards needed sooner could be evicted) or ``"fetched"``.
        """
        e = self.entries[i]
        if self.is_cached(i):
            return "cached"
        dl = self.space.lock(e.key, "dl")
        if not dl.try_acquire():
            dl.close()  # its lock file's fd
            return "busy"
        try:
            if self.is_cached(i):
                return "cached"
            with cache_dir_errors(self.dir):
                fd = download(self, e, cursor, demand=False, max_distance=distance)
        finally:
            dl.close()
        if fd is None:
            return "full"
        os.close(fd)  # not pinned: the copy is read, and checked, when it is acquired
        return "fetched"
