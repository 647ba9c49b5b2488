"""One shard's download into the cache: the pre-allocated temp file, the check of the copy, and
the error when every attempt failed verification. Used by :class:`~ckptstore.data.cache.ShardCache`
(which holds the ``dl`` lock and the space reservation around these)."""

from __future__ import annotations

import errno
import os
import uuid
from typing import NoReturn

from ckptstore.data.cachefiles import (
    SHARDS,
    TMP,
    CacheEntry,
    Mismatch,
    cache_os_error,
    changed_error,
)
from ckptstore.data.formats import read_index
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import StoreNotFoundError, TransferError
from ckptstore.stores import Anchor
from ckptstore.stores._dirfd_acts import create_new, unlink_quietly

__all__ = ["check_copy", "create_temp", "explain_mismatch"]


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
    reading and writing)``; the caller closes the descriptor and publishes or removes the
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
                unlink_quietly(dfd, name)
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
