"""The shard cache's byte budget: reserve room for a download, evicting what is needed last.

Every space decision happens under the node's budget lock (``budget.lock``, its ledger the
count of bytes in use); the ledger decides alone until limit / 8 bytes were reserved since
the files were last counted, then a scan recounts. A shard that does not fit evicts the
unpinned shards needed farthest in the future until it fits with limit / 16 to spare; a
full disk evicts the same way. :class:`~ckptstore.data.cache.ShardCache` owns one and
gives it the data order's distances.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import time
from collections.abc import Callable, Iterator

from ckptstore.data.cachedownload import create_temp
from ckptstore.data.cachefiles import LOCKS, SHARDS, CacheEntry, CacheStats, cache_name
from ckptstore.data.cachelocks import Ledger, Lock, process_gate
from ckptstore.errors import CacheError
from ckptstore.stores import Anchor
from ckptstore.stores._dirfd_acts import unlink_quietly

__all__ = ["CacheSpace"]


class CacheSpace:
    """The byte budget of one cache directory, for one process (see the module docstring).

    ``paths`` is the cache directory (every path below it is resolved from its descriptor).
    ``distances(cursor)`` gives ``{key: samples until the shard's next use}`` (the data
    order's horizon; a key left out is needed no sooner than never), ``discard(key)``
    deletes a cached shard's files. Call order: :meth:`reserve`, holding the shard's ``dl``
    lock, returns a pre-allocated temp file (its name in ``shards/`` and an open
    descriptor) or None (no room now); the caller fills it and renames it into place (without
    the budget lock).
    """

    def __init__(
        self,
        paths: Anchor,
        limit: int | None,
        wait_timeout: float,
        stats: CacheStats,
        distances: Callable[[int], dict[str, int]],
        discard: Callable[[str], None],
    ) -> None:
        self.paths = paths
        self.limit, self.wait_timeout, self.stats = limit, wait_timeout, stats
        self._distances, self._discard = distances, discard

    def lock(self, key: str, kind: str) -> Lock:
        """The lock file ``locks/<key>.<kind>`` (``use``: readers, ``dl``: the downloader)."""
        return Lock(self.paths, f"{LOCKS}/{key}.{kind}")

    def reserve(
        self, e: CacheEntry, cursor: int, max_distance: int | None
    ) -> tuple[str, int] | None:
        """Create the pre-allocated temp file (``create_temp``: its name and descriptor),
        evicting as needed under the budget lock (without a limit, the lock only once the
        disk is full).

        ``max_distance`` None (a demand fetch) may evict any unpinned shard; otherwise only
        shards next needed later than ``max_distance`` (or not at all). None: no room.
        """
        if self.limit is None:  # no space decision to make, unless the disk is full
            try:
                return create_temp(self.paths, e)
            except CacheError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
        with self._budget() as ledger:
            if self.limit is not None and not self._fit(ledger, e, cursor, max_distance):
                return None
            tmp = None
            try:
                tmp = self._create(e, cursor, max_distance, ledger)
            finally:
                if tmp is None and self.limit is not None:
                    ledger.free(e.size)  # the reservation _fit counted
            return tmp

    def _fit(self, ledger: Ledger, e: CacheEntry, cursor: int, max_distance: int | None) -> bool:
        """Count ``e`` in the ledger if it fits the limit, evicting as needed; False: not now.

        The ledger decides alone while it says ``e`` fits and fewer than limit / 8 bytes
        were reserved since the files were last counted (a recount also catches what a
        process without this limit added). Otherwise the files are counted, and if ``e``
        does not fit, the farthest-needed shards are evicted until it does with limit / 16
        to spare: one scan of the directory, one sort, for many downloads, not each.
        """
        assert self.limit is not None
        known = ledger.read()
        if known is not None:
            used, added = known
            if used + e.size <= self.limit and added < self.limit // 8:
                ledger.write(used + e.size, added + e.size)
                return True
        used, cached = self.usage()
        if used + e.size > self.limit:
            want = used + e.size - self.limit + self.limit // 16
            used -= self._evict_farthest(cached, cursor, e.key, max_distance, want)[0]
        fits = used + e.size <= self.limit
        ledger.write(used + e.size if fits else used, e.size if fits else 0)
        return fits

    def _create(
        self, e: CacheEntry, cursor: int, max_distance: int | None, ledger: Ledger
    ) -> tuple[str, int] | None:
        """The temp file; on a full disk, evict as the budget would. None: no room now."""
        while True:
            try:
                return create_temp(self.paths, e)
            except CacheError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                used, cached = self.usage()
                freed, others = self._evict_farthest(cached, cursor, e.key, max_distance, e.size)
                if freed:
                    if self.limit is not None:
                        ledger.free(freed)
                    continue
                in_progress = used > sum(cached.values())  # live temp files hold space
                if max_distance is not None or others or in_progress:
                    # "full": a prefetch tries later; a demand read waits for a pinned
                    # shard to be let go or for a download in progress (whose space
                    # it holds) to be renamed into place and so become evictable
                    return None
                raise  # nothing of ours to evict: the disk is full of other files

    def make_room(self, keep: str, cursor: int, max_distance: int | None, nbytes: int) -> bool:
        """On a full disk, evict shards as :meth:`reserve` would (never ``keep``) until
        ``nbytes`` are free: room for the small file beside a shard whose data fitted (its
        space was allocated up front, the ``.meta`` file's was not). False: nothing was
        evictable."""
        with self._budget() as ledger:
            _, cached = self.usage()
            freed, _ = self._evict_farthest(cached, cursor, keep, max_distance, nbytes)
            if freed and self.limit is not None:
                ledger.free(freed)
            return freed > 0

    @contextlib.contextmanager
    def _budget(self) -> Iterator[Ledger]:
        """Hold the node's budget lock around every space decision: with a limit, each
        reservation; without one, only what a full disk makes necessary. It is one lock
        for the node, so it is never taken where no decision is made (a rename into place, a
        reservation under no limit): small files come hundreds a second."""
        lock = Lock(self.paths, "budget.lock")
        deadline = time.monotonic() + self.wait_timeout
        gate = process_gate(lock.path)  # this process's threads queue here, not on the flock
        if not gate.acquire(timeout=self.wait_timeout):
            raise CacheError(
                f"waited {self.wait_timeout:.0f} s for the cache budget lock held by another "
                "thread of this process"
            )
        try:
            with lock as budget:
                budget.acquire(
                    timeout=max(0.0, deadline - time.monotonic()), what="cache budget lock"
                )
                yield Ledger(budget)
        finally:
            gate.release()

    def usage(self) -> tuple[int, dict[str, int]]:
        """Bytes held by cached and in-progress shards; ``{key: size}`` of cached ones.
        Only under :meth:`_budget`.

        Downloads rename temp -> .data without the lock, so a shard may move
        between its two names during the scan: a temp file gone when stat()ed, or whose
        download is over by the time its lock is tried, is looked up under its .data
        name, so a shard is never counted as neither (at worst, for a moment, as both:
        over the budget's count, never under it).

        The scan holds a descriptor of ``shards/`` and makes every act on its entries
        relative to it: ``shards/`` swapped for a link meanwhile changes nothing here."""
        temps = 0
        cached: dict[str, int] = {}
        with self.paths.directory(SHARDS) as fd, os.scandir(fd) as it:
            for d in it:
                parsed = cache_name(d.name)
                if parsed is None or parsed[1] != "data":
                    continue  # not a shard file the cache made: never counted nor deleted
                key, _, is_temp = parsed
                is_data = not is_temp
                try:
                    st = d.stat(follow_symlinks=False)
                    size = st.st_size
                except FileNotFoundError:
                    if not is_data:  # renamed into place since it was listed (else: evicted)
                        self._count_renamed(fd, key, cached)
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue  # a link or anything else under our name: never followed
                if is_data:
                    cached[key] = size
                    continue
                lock = self.lock(key, "dl")
                try:
                    if not lock.try_acquire():
                        temps += size  # its download is in progress
                    elif _exists(fd, d.name):
                        unlink_quietly(fd, d.name)  # a crashed download's leftover
                    else:  # its download renamed it into place and ended since the stat()
                        self._count_renamed(fd, key, cached)
                finally:
                    lock.close()
        return temps + sum(cached.values()), cached

    @staticmethod
    def _count_renamed(fd: int, key: str, cached: dict[str, int]) -> None:
        """Count shard ``key`` under its .data name in ``shards/`` (open at ``fd``), if it
        is there (a temp file of it was renamed during a scan; gone as well: its download
        failed, or it was evicted)."""
        try:
            st = os.stat(key + ".data", dir_fd=fd, follow_symlinks=False)
            if stat.S_ISREG(st.st_mode):
                cached[key] = st.st_size
        except FileNotFoundError:
            pass

    def _evict_farthest(
        self,
        cached: dict[str, int],
        cursor: int,
        keep: str,
        max_distance: int | None,
        want: int,
    ) -> tuple[int, bool]:
        """Evict unpinned shards of ``cached``, farthest-needed first (and only beyond
        ``max_distance``), until ``want`` bytes are freed.

        ``(freed, others)``: the bytes freed, and whether other cached shards were there
        (pinned, or needed sooner), so that waiting for space can help.
        """
        far = self._distances(cursor)
        inf = float("inf")
        freed, others = 0, False
        for k in sorted(cached, key=lambda k: -far.get(k, inf)):
            if k == keep:
                continue
            others = True
            if max_distance is not None and far.get(k, inf) <= max_distance:
                break
            if self._evict(k):
                freed += cached[k]
                if freed >= want:
                    break
        return freed, others

    def _evict(self, key: str) -> bool:
        use = self.lock(key, "use")
        if not use.try_acquire():
            use.close()
            return False  # pinned by a reader
        try:
            self._discard(key)
        finally:
            use.close()
        self.stats.add(evictions=1)
        return True


def _exists(fd: int, name: str) -> bool:
    """Whether ``name`` is in the directory open at ``fd`` (a link counts, unfollowed)."""
    try:
        os.stat(name, dir_fd=fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True
