"""One shard's download into the cache: the pre-allocated temp file, the check of the copy, and
the error when every attempt failed verification. Used by :class:`~ckptstore.data.cache.ShardCache`
(which holds the ``dl`` lock and the space reservation around these)."""

from __future__ import annotations

import errno
import os
import uuid
from typing import NoReturn

from ckptstore.data.cachefiles import (
    TMP,
    CacheEntry,
    Mismatch,
    cache_os_error,
    changed_error,
    unlink_quietly,
)
from ckptstore.data.formats import read_index
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import StoreNotFoundError, TransferError

__all__ = ["check_copy", "create_temp", "explain_mismatch"]


def check_copy(e: CacheEntry, tmp: str) -> None:
    """Raise :class:`Mismatch` unless ``tmp`` has ``e``'s size and (for indexed formats) footer."""
    size = os.stat(tmp).st_size
    if size != e.size:
        raise Mismatch(f"{size} bytes on disk, {e.size} listed")
    if e.fmt != "raw":
        fd = os.open(tmp, os.O_RDONLY)
        try:
            rows, digest = read_index(e.fmt, e.size, lambda off, n: os.pread(fd, n, off))
        except Exception as exc:  # noqa: BLE001 - any unreadable footer is a mismatch
            raise Mismatch(f"footer unreadable ({exc})", changed=True) from exc
        finally:
            os.close(fd)
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


def create_temp(shards_dir: str, e: CacheEntry, cache_dir: str) -> str:
    """A new temp file for ``e`` in ``shards_dir``, pre-allocated to its full size (a full
    disk fails here, at once, as a ``CacheError`` naming ``cache_dir``)."""
    tmp = os.path.join(shards_dir, f"{e.key}.data{TMP}{os.getpid()}-{uuid.uuid4().hex}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        raise cache_os_error(exc, cache_dir) from exc
    try:
        if e.size:
            try:
                os.posix_fallocate(fd, 0, e.size)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                os.ftruncate(fd, e.size)
    except OSError as exc:
        os.close(fd)
        unlink_quietly(tmp)
        raise cache_os_error(exc, cache_dir) from exc
    os.close(fd)
    return tmp
