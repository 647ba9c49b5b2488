"""Building blocks of the shard cache: file names, counters, ranged download into a file.

Kept apart from :mod:`ckptstore.data.cache` so the policy (what to keep, what to evict)
reads on its own; the locks and the byte ledger are :mod:`ckptstore.data.cachelocks`.
Nothing here knows about the data order.

Every path below the cache directory is resolved from its descriptor
(``ckptstore.stores.Anchor``, one per cache view): ``shards/``, ``locks/`` and the files in
them are reached component by component without following a link, so a folder swapped for
a link to somewhere else while the cache works makes the act fail (``UnsafePathError``),
never land there. Files are read and written through descriptors those acts opened.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import threading
import uuid
from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, fields

from ckptstore.data.cachelocks import Lock
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine, split_ranges
from ckptstore.errors import CacheError, CacheTooSmallError, CkptStoreError, DatasetChangedError
from ckptstore.stores import Anchor
from ckptstore.stores._dirfd_acts import create_new

__all__ = [
    "CacheEntry",
    "CacheStats",
    "Handle",
    "LOCKS",
    "Mismatch",
    "SHARDS",
    "TMP",
    "VerifiedFiles",
    "cache_dir_errors",
    "cache_os_error",
    "cache_paths",
    "cache_name",
    "changed_error",
    "check_limit",
    "data_name",
    "fetch_to_file",
    "file_crc32c",
    "make_key",
    "meta_name",
    "probe_cache_dir",
    "unlink_quietly",
]

#: Every temp file in the cache has this in its name.
TMP = ".tmp-"
#: The cache's folders below its directory: cached shards and their lock files.
SHARDS, LOCKS = "shards", "locks"

# What the cache makes in ``shards/`` (``<key>`` as ``ShardedDataset`` builds it: 24 hex,
# '-', at most 48 of [A-Za-z0-9._-]): ``<key>.data``, ``<key>.meta``, and their temp files
# ``<key>.data.tmp-<pid>-<32 hex>`` (a download) and ``<key>.meta.tmp-<32 hex>``.
_CACHE_NAME = re.compile(
    r"(?P<key>[0-9a-f]{24}-[A-Za-z0-9._-]{0,48})\.(?P<kind>data|meta)"
    r"(?P<tmp>\.tmp-(?:[0-9]+-)?[0-9a-f]{32})?"
)


def make_key(ident: bytes, path: str) -> str:
    """The cache key of a shard: a hash of ``ident`` (what makes its content unique) and
    the end of its file name, readable in a listing of the cache (see :func:`cache_name`)."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", path.rsplit("/", 1)[-1])[-48:]
    return f"{hashlib.sha256(ident).hexdigest()[:24]}-{base}"


def cache_name(name: str) -> tuple[str, str, bool] | None:
    """``(key, "data" | "meta", is_temp)`` if ``name`` is one the cache makes in ``shards/``.

    The one predicate every deletion and space count of the cache goes through: a file of
    any other name (a user's ``notes.data``, another tool's file) is never deleted, evicted
    or counted.
    """
    m = _CACHE_NAME.fullmatch(name)
    if m is None:
        return None
    return m.group("key"), m.group("kind"), m.group("tmp") is not None


class Mismatch(Exception):
    """Downloaded bytes do not match the listing (truncated, or the object changed).

    ``changed``: the bytes arrived whole but differ (a footer unlike the listed one).
    """

    def __init__(self, message: str, changed: bool = False) -> None:
        super().__init__(message)
        self.changed = changed


@dataclass
class CacheStats:
    """Counters of one process's cache activity (thread-safe through :meth:`add`)."""

    hits: int = 0  # shard found cached and intact
    misses: int = 0  # shard fetched (or waited for) on demand
    downloads: int = 0  # shard files downloaded (demand + prefetch)
    bytes: int = 0  # bytes downloaded
    download_seconds: float = 0.0  # summed over downloads
    wait_seconds: float = 0.0  # demand reads waiting on a download
    evictions: int = 0
    corrupt: int = 0  # cached copies that failed verification
    refetches: int = 0  # downloads retried after a size / footer mismatch

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._taken = {f.name: 0 for f in fields(self)}

    def add(self, **counts: float) -> None:
        """Add ``counts`` to the named counters (thread-safe)."""
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict[str, float]:
        """Every counter's current value."""
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self)}

    def take_delta(self) -> dict[str, float]:
        """Counts since the previous call (what a worker ships with each batch)."""
        with self._lock:
            now = {f.name: getattr(self, f.name) for f in fields(self)}
            delta = {k: v - self._taken[k] for k, v in now.items() if v != self._taken[k]}
            self._taken = now
            return delta


def fetch_to_file(engine: TransferEngine, store: Store, path: str, size: int, fd: int) -> int:
    """Download ``size`` bytes of ``path`` into the (pre-allocated) file open at ``fd``.

    Parallel ranged GETs of ``engine.config.part_size`` on the engine's pool and retry
    policy, at most
    ``engine.config.concurrency`` in flight, each written at its offset as it arrives (memory
    stays bounded for any shard size). A shard of one part is read in the calling thread
    (with the engine's retry policy): handing one small GET to the pool and waiting for it
    cost more than the read itself (a local file of 256 KiB: ~0.5 of ~1.3 ms). Returns the
    CRC32C of the whole file. Raises :class:`Mismatch` if a range comes back short
    (truncated or replaced object).
    """
    part = engine.config.part_size
    ranges = split_ranges(0, size, part)
    if ranges:  # one byte past the listed end too: an object that grew is caught as well
        ranges[-1] = (ranges[-1][0], size + 1)
    pending: deque[tuple[int, int, Future[bytes]]] = deque()
    crc = 0
    what = f"download of {store.describe(path)}"

    def get(start: int, end: int) -> Future[bytes]:
        return engine.pool.submit(engine.retry, lambda: store.get(path, start, end), what)

    if len(ranges) == 1:
        start, end = ranges[0]
        data = engine.retry(lambda: store.get(path, start, end), what)
        _write_range(fd, start, min(end, size), data)
        return crc32c(data)
    try:
        it = iter(ranges)
        for start, end in it:
            pending.append((start, end, get(start, end)))
            if len(pending) >= engine.config.concurrency:
                break
        while pending:
            start, end, fut = pending.popleft()
            data = fut.result()
            nxt = next(it, None)
            if nxt is not None and len(data) == min(end, size) - start:
                pending.append((nxt[0], nxt[1], get(*nxt)))
            _write_range(fd, start, min(end, size), data)
            crc = crc32c(data, crc)  # ranges complete in order: continue the running CRC
    except BaseException:
        for _, _, f in pending:
            f.cancel()
        raise
    return crc


def _write_range(fd: int, start: int, end: int, data: bytes) -> None:
    """Write the GET of ``[start, end)`` at ``start``; :class:`Mismatch` if it is not whole."""
    if len(data) != end - start:
        raise Mismatch(
            f"range [{start}, {end}) returned {len(data)} bytes (a truncated "
            "download, or the object changed size)"
        )
    view = memoryview(data)
    pos = 0
    while pos < len(view):
        pos += os.pwrite(fd, view[pos:], start + pos)


def file_crc32c(fd: int, chunk: int = 8 << 20) -> int:
    """CRC32C of the whole local file open at ``fd``, read in chunks from its start (its
    file offset is left alone)."""
    value, pos = 0, 0
    buf = bytearray(chunk)
    view = memoryview(buf)
    while True:
        n = os.preadv(fd, [buf], pos)
        if not n:
            return value
        value = crc32c(view[:n], value)
        pos += n


@dataclass(frozen=True)
class CacheEntry:
    """What the cache needs to know of one shard: where it lives and what it must be."""

    key: str  # unique per (store, path, size, content digest)
    path: str  # in the store
    size: int
    fmt: str
    digest: str  # footer digest ("" for raw files)
    rows: tuple[int, ...]


Ident = tuple[int, int, int]  # a cached file's (inode, mtime_ns, size)


class VerifiedFiles:
    """Cached files whose CRC32C a process of this rank checked: ``{data path: Ident}``.

    One per dataset in a rank: its cache views (the loop's, the prefetcher's) share it, and
    a DataLoader worker starts with a copy (forked or pickled with the dataset). What a
    worker verifies or downloads reaches the rank with its batches (:meth:`take_new` there,
    :meth:`adopt` here), so the next epoch's workers do not read every cached file again to
    check it. A file rewritten or replaced since has another identity and is checked again.
    No lock: single dict and list operations are atomic in CPython, and a report lost to a
    race only costs one more check (a lock held across a worker's fork could hang it).
    """

    def __init__(self) -> None:
        self._ok: dict[str, Ident] = {}
        self._new: list[tuple[str, Ident]] = []

    def get(self, path: str) -> Ident | None:
        """The identity ``path`` had when it was verified, or None."""
        return self._ok.get(path)

    def add(self, path: str, ident: Ident) -> None:
        """Record ``path`` as verified with ``ident`` (and report it at :meth:`take_new`)."""
        self._ok[path] = ident
        self._new.append((path, ident))

    def discard(self, path: str) -> None:
        """Forget ``path`` (deleted or found corrupt)."""
        self._ok.pop(path, None)

    def take_new(self) -> list[tuple[str, Ident]]:
        """What was added since the previous call (a worker ships it with a batch)."""
        new, self._new = self._new, []
        return new

    def adopt(self, items: Sequence[tuple[str, Ident]]) -> None:
        """Record what another process of this rank verified."""
        for path, ident in items:
            self._ok[path] = ident


class Handle:
    """A pinned local shard file: not evicted until :meth:`release`.

    ``fd``: a descriptor of the copy that was verified, open for reading until
    :meth:`release` (read it, never the name: ``path`` is for messages).
    """

    def __init__(self, path: str, lock: Lock, fd: int) -> None:
        self.path, self.fd = path, fd
        self._lock: Lock | None = lock

    def release(self) -> None:
        """Unpin the shard and close ``fd`` (idempotent): it may be evicted again."""
        if self._lock is not None:
            os.close(self.fd)
            self._lock.close()
            self._lock = None

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def cache_paths(cache_dir: str) -> Anchor:
    """The cache directory ``cache_dir`` (absolute; trusted as given, a link included): every
    path below it is resolved from its descriptor, never through a link."""
    return Anchor(cache_dir, what="cache directory")


def probe_cache_dir(paths: Anchor) -> None:
    """Create the cache layout below ``paths`` and prove it writable; ``CacheError`` says
    what to fix, ``UnsafePathError`` names a link where a folder of it should be."""
    try:
        paths.mkdir("", parents=True)  # the cache directory itself, as the user named it
        for sub in (SHARDS, LOCKS):
            try:
                paths.mkdir(sub, parents=True)
            except NotADirectoryError as exc:
                raise CacheError(
                    errno.ENOTDIR,
                    f"{paths.shown([sub])} is not a directory; the cache keeps its files in "
                    "one. Remove it (the cache re-creates it) or pick another cache_dir",
                ) from exc
        probe = f".probe{TMP}{os.getpid()}-{uuid.uuid4().hex}"
        with paths.parent(f"{SHARDS}/{probe}") as (dfd, name):
            os.close(create_new(dfd, name))
            os.unlink(name, dir_fd=dfd)
    except CacheError:
        raise
    except OSError as exc:
        raise cache_os_error(exc, paths.base) from exc


def check_limit(limit: int | None, entries: Sequence[CacheEntry]) -> None:
    """Refuse a byte budget that cannot hold the largest shard (it could never make progress)."""
    if limit is None or not entries:
        return
    big = max(entries, key=lambda e: e.size)
    if big.size > limit:
        raise CacheTooSmallError(
            f"cache_limit of {limit} bytes cannot hold shard {big.path} ({big.size} bytes); "
            f"set cache_limit to at least a few times the largest shard (>= {big.size})"
        )


def changed_error(e: CacheEntry, what: str) -> DatasetChangedError:
    """The error for shard ``e`` having changed on the store since it was listed."""
    return DatasetChangedError(
        f"shard {e.path} {what}: the dataset changed after it was listed, so this run's data "
        "order no longer holds. Re-create the ShardedDataset (it lists again) and resume from "
        "the last checkpoint with allow_dataset_change=True, or restore the shard"
    )


def cache_os_error(exc: OSError, directory: str) -> CacheError:
    """A ``CacheError`` for a local write that failed in ``directory`` (full disk said so)."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return CacheError(
            exc.errno,
            f"cache_dir {directory} is full ({exc.strerror}); free space there or set a "
            "cache_limit below the free space",
        )
    where = f": {exc.filename}" if exc.filename is not None else ""
    return CacheError(
        exc.errno or errno.EIO,
        f"cannot use cache_dir {directory} ({exc.strerror or exc}{where}); pass a writable "
        "local directory whose folders nothing else moves",
    )


@contextlib.contextmanager
def cache_dir_errors(directory: str) -> Iterator[None]:
    """Raise an ``OSError`` of the block -- an act on the cache directory that failed (a
    folder of it gone, or swapped for a link meanwhile) -- as :func:`cache_os_error`;
    ckptstore's own errors pass as they are."""
    try:
        yield
    except CkptStoreError:
        raise
    except OSError as exc:
        raise cache_os_error(exc, directory) from exc


def unlink_quietly(paths: Anchor, name: str) -> None:
    """Remove ``name`` below the cache directory ``paths``, ignoring any error (cleanup on
    a failure path; a refusal too: a link on the way leaves the file where it is)."""
    try:
        paths.unlink(name)
    except (OSError, CkptStoreError):
        pass


def data_name(key: str) -> str:
    """The name of shard ``key``'s cached copy below the cache directory."""
    return f"{SHARDS}/{key}.data"


def meta_name(key: str) -> str:
    """The name of its ``.meta`` file (size, CRC32C, footer digest)."""
    return f"{SHARDS}/{key}.meta"
