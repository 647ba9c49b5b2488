"""One shard's download into the cache: the space it waits for, the pre-allocated temp file,
the check of the copy, its ``.meta``, the rename into place, and the error when every attempt
failed verification. :class:`~ckptstore.data.cache.ShardCache` calls :func:`download` holding
the shard's ``dl`` lock; the copy it returns is open for reading and already verified."""

from __future__ import annotations

import errno
import json
import logging
import os
import time
import uuid
from typing import TYPE_CHECKING, Any, NoReturn

from ckptstore.data.cachefiles import (
    SHARDS,
    TMP,
    CacheEntry,
    Mismatch,
    cache_os_error,
    changed_error,
    data_name,
    fetch_to_file,
    meta_name,
    unlink_quietly,
)
from ckptstore.data.formats import read_index
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import CacheError, CkptStoreError, StoreNotFoundError, TransferError
from ckptstore.stores import Anchor
from ckptstore.stores._dirfd_acts import create_new, replace
from ckptstore.stores._dirfd_acts import unlink_quietly as unlink_at

if TYPE_CHECKING:
    from ckptstore.data.cache import ShardCache

__all__ = ["check_copy", "create_temp", "download", "explain_mismatch", "write_meta"]

log = logging.getLogger(__name__)

#: What a ``.meta`` file takes on disk (one block): freed by eviction when the disk filled
#: up between a shard's reserve (its data's space allocated up front) and its ``.meta``.
_META_ROOM = 4096


def download(
    cache: ShardCache,
    e: CacheEntry,
    cursor: int,
    *,
    demand: bool,
    max_distance: int | None = None,
    wait: bool = True,
) -> int | None:
    """Reserve space, fetch, verify and rename into place ``e`` (caller holds its ``dl`` lock);
    a descriptor of the copy in place, open for reading (the caller closes it).

    None: no room now, and this is a prefetch (``demand=False``) or ``wait=False``.
    """
    deadline = time.monotonic() + cache.wait_timeout
    while True:
        reserved = cache.space.reserve(e, cursor, max_distance if not demand else None)
        if reserved is not None:
            break
        if not demand or not wait:
            return None
        if cache.on_pressure is not None:
            cache.on_pressure()  # let this process unpin what it holds idle
        cache.signal_pressure()  # and ask the node's other processes to do the same
        if time.monotonic() > deadline:
            raise CacheError(
                f"waited {cache.wait_timeout:.0f} s for {e.size} bytes of cache space in "
                f"{cache.dir} (limit {cache.limit}): every cached shard is in use. Raise "
                "cache_limit, or use fewer workers or ranks per node"
            )
        time.sleep(0.05)
    tmp, fd = reserved
    try:
        _fetch_verified(cache, e, tmp, fd, cursor, max_distance if not demand else None)
    except BaseException as exc:
        os.close(fd)
        unlink_quietly(cache.paths, f"{SHARDS}/{tmp}")  # gone already once renamed into place
        if isinstance(exc, OSError) and not isinstance(exc, CkptStoreError):
            # a local write failed: the cache disk, not the store
            raise cache_os_error(exc, cache.dir) from exc
        raise
    return fd


def write_meta(paths: Anchor, key: str, meta: dict[str, Any]) -> bool:
    """Publish ``key``'s ``.meta`` file; False if the disk had no room for it."""
    try:
        with paths.parent(meta_name(key)) as (dfd, final):
            tmp = f"{final}{TMP}{uuid.uuid4().hex}"
            try:
                with os.fdopen(create_new(dfd, tmp), "w") as f:
                    json.dump(meta, f)
                replace(dfd, tmp, final)
            except BaseException:
                unlink_at(dfd, tmp)
                raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return False
        raise
    return True


def _fetch_verified(
    cache: ShardCache, e: CacheEntry, tmp: str, fd: int, cursor: int, max_distance: int | None
) -> None:
    """Download ``e`` into the temp file ``tmp`` of ``shards/`` (open at ``fd``), check
    it, write its ``.meta`` and rename it into place under its own name."""
    for attempt in range(1, cache.attempts + 1):
        t0 = time.monotonic()
        try:
            crc = fetch_to_file(cache.engine, cache.store, e.path, e.size, fd)
            check_copy(e, fd)
        except Mismatch as exc:
            cache.stats.add(refetches=1)
            log.warning("download of %s: %s (attempt %d)", e.path, exc, attempt)
            if attempt == cache.attempts:
                explain_mismatch(cache.engine, cache.store, e, exc, cache.attempts)
                raise
            continue
        except StoreNotFoundError as exc:
            raise changed_error(e, "no longer exists on the store") from exc
        cache.stats.add(downloads=1, bytes=e.size, download_seconds=time.monotonic() - t0)
        meta = {"path": e.path, "size": e.size, "crc32c": crc, "digest": e.digest}
        deadline = time.monotonic() + cache.wait_timeout
        while not write_meta(cache.paths, e.key, meta):  # the disk filled up since the reserve
            if cache.space.make_room(e.key, cursor, max_distance, _META_ROOM):
                continue
            if time.monotonic() > deadline:  # nothing evictable came free
                shards = cache.paths.shown([SHARDS])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), shards)
            if cache.on_pressure is not None:
                cache.on_pressure()  # as a reserve waits: unpin, ask the others to
            cache.signal_pressure()
            time.sleep(0.05)
        with cache.paths.parent(data_name(e.key)) as (dfd, final):
            replace(dfd, tmp, final)  # a space scan racing it counts it once (``usage``)
        st = os.fstat(fd)  # the file written and checked, whatever its name holds now
        cache.verified.add(cache._shown(e.key), (st.st_ino, st.st_mtime_ns, st.st_size))
        return


def check_copy(e: CacheEntry, fd: int) -> None:
    """Raise :class:`Mismatch` unless the file open at ``fd`` has ``e``'s size and (for
    indexed formats) footer."""
    size = os.fstat(fd).st_size
    if size != e.size:
        raise Mismatch(f"{size} bytes on disk, {e.size} listed")
    if e.fmt != "raw":
        try:
            rows, digest = read_index(e.fmt, e.size, lambda off, n: os.pread(fd, n, off))
        except Exception as exc:  # noqa: BLE001 - any unreadable footer is a mismatch
            raise Mismatch(f"footer unreadable ({exc})", changed=True) from exc
        if digest != e.digest or rows != e.rows:
            raise Mismatch("footer differs from the listing", changed=True)


def explain_mismatch(
    engine: TransferEngine, store: Store, e: CacheEntry, exc: Mismatch, attempts: int
) -> NoReturn:
    """Raise the error for a shard whose every download failed verification: the listing is
    stale (``DatasetChangedError``) or the transfer is broken (``TransferError``)."""
    try:
        size = engine.retry(lambda: store.size(e.path), f"stat of {e.path}")
    except StoreNotFoundError as err:
        raise changed_error(e, "no longer exists on the store") from err
    if size != e.size:
        raise changed_error(e, f"is now {size} bytes (listed: {e.size})") from exc
    if exc.changed:
        raise changed_error(e, "has a different footer than when listed") from exc
    raise TransferError(
        f"download of {store.describe(e.path)} failed verification "
        f"{attempts} times ({exc}); check the store and the network"
    ) from exc


def create_temp(paths: Anchor, e: CacheEntry) -> tuple[str, int]:
    """A new temp file for ``e`` in ``shards/`` of the cache directory ``paths``,
    pre-allocated to its full size: ``(its name in shards/, a descriptor of it open for
    reading and writing)``; the caller closes the descriptor and renames into place or removes the
    file. A full disk fails here, at once, as a ``CacheError`` naming the cache directory."""
    tmp = f"{e.key}.data{TMP}{os.getpid()}-{uuid.uuid4().hex}"
    try:
        with paths.parent(f"{SHARDS}/{tmp}") as (dfd, name):
            fd = create_new(dfd, name, readable=True)
            try:
                if e.size:
                    _allocate(fd, e.size)
            except BaseException:
                os.close(fd)
                unlink_at(dfd, name)
                raise
    except OSError as exc:
        raise cache_os_error(exc, paths.base) from exc
    return tmp, fd


def _allocate(fd: int, size: int) -> None:
    """Give the file at ``fd`` ``size`` bytes of disk now (truncate where the file system
    cannot allocate: the space is then only claimed as it is written)."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        os.ftruncate(fd, size)
