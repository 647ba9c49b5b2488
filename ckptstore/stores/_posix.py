"""POSIX helpers of the volume store: fsync (one file, or several at once), early
writeback, error translation, and making a trusted base directory.

Nothing here takes a path below a root: those are resolved from the root's descriptor
(``_dirfd``).

An fsync error fails the write (``DurabilityError``) and is never retried; OSErrors map to
the ckptstore error a caller can act on (``translate``).
"""

from __future__ import annotations

import ctypes
import errno
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from ckptstore.errors import (
    CkptStoreError,
    DurabilityError,
    StorageFullError,
    StoreAccessError,
    StoreNotFoundError,
    TransientStoreError,
    UnsafePathError,
)

__all__ = [
    "NOFOLLOW",
    "fsync",
    "fsync_all",
    "fsync_dir",
    "start_writeback",
    "translate",
    "makedirs",
]

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def fsync(fd: int, what: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise DurabilityError(
            f"fsync of {what} failed ({exc}); the data may not be on disk. This write has "
            "failed and will not be retried: check the volume, then save again."
        ) from exc


#: ``sync_file_range(2)``'s ``SYNC_FILE_RANGE_WRITE``: start writeback, wait for nothing.
_SYNC_FILE_RANGE_WRITE = 2
_sync_file_range: Callable[[int, int, int, int], int] | None = None
_looked_up = False


def _lookup_sync_file_range() -> Callable[[int, int, int, int], int] | None:
    global _sync_file_range, _looked_up
    if not _looked_up:
        _looked_up = True
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).sync_file_range
                fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                fn.restype = ctypes.c_int
                _sync_file_range = fn
            except (OSError, AttributeError):
                _sync_file_range = None
    return _sync_file_range


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing ``[offset, offset+length)`` of ``fd`` to disk now
    (Linux ``sync_file_range(SYNC_FILE_RANGE_WRITE)``), so the file's fsync later finds
    little left to flush: a part's writeback overlaps the writing of the next ones.

    A hint only, never a durability step: it waits for nothing, promises nothing, and is
    a no-op where the call does not exist; its errors are ignored because the fsync that
    must follow reports any write error itself.
    """
    fn = _lookup_sync_file_range()
    if fn is not None and length > 0:
        fn(fd, offset, length, _SYNC_FILE_RANGE_WRITE)


_SYNC_THREADS = 8
_sync_pool: ThreadPoolExecutor | None = None
_sync_lock = threading.Lock()


def _reset_sync_pool() -> None:  # a forked child has none of its parent's threads
    global _sync_pool, _sync_lock
    _sync_pool, _sync_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_sync_pool)


def fsync_all(files: Sequence[tuple[int, str]]) -> None:
    """``fsync`` every ``(fd, what)`` of ``files`` at once, each file still synced on its
    own (the file system's journal commits concurrent fsyncs together, so N small files
    cost about one commit, not N in a row). Waits for all of them; then raises the first
    failure (``DurabilityError``), if any."""
    global _sync_pool
    if len(files) <= 1:
        for fd, what in files:
            fsync(fd, what)
        return
    with _sync_lock:
        if _sync_pool is None:
            _sync_pool = ThreadPoolExecutor(_SYNC_THREADS, thread_name_prefix="ckptstore-fsync")
        pool = _sync_pool
    futures = [pool.submit(fsync, fd, what) for fd, what in files[1:]]
    errors: list[BaseException] = []
    try:
        fsync(*files[0])
    except BaseException as exc:  # noqa: BLE001 - raised below, after the others finish
        errors.append(exc)
    for f in futures:
        failed = f.exception()
        if failed is not None:
            errors.append(failed)
    if errors:
        raise errors[0]


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fsync(fd, f"directory {path}")
    finally:
        os.close(fd)


def translate(exc: OSError, what: str) -> Exception:
    """Map an OSError to the ckptstore error a caller can act on (one that is already a
    ckptstore error, as ``_dirfd``'s refusals are, is kept as it is)."""
    if isinstance(exc, CkptStoreError):
        return exc
    if isinstance(exc, FileNotFoundError):
        return StoreNotFoundError(f"{what}: not found ({exc.strerror}); check the path")
    if isinstance(exc, IsADirectoryError):
        return StoreAccessError(f"{what}: a directory is in the way of this file")
    if isinstance(exc, NotADirectoryError):
        return StoreAccessError(f"{what}: a parent of this path is a file, not a directory")
    if isinstance(exc, PermissionError) or exc.errno in (errno.EROFS,):
        return StoreAccessError(
            f"{what}: permission denied ({exc.strerror}); check the path is writable"
        )
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return StorageFullError(f"{what}: no space left on the volume; free space and retry")
    if exc.errno in (errno.EAGAIN, errno.EINTR, errno.ETIMEDOUT, errno.ESTALE):
        return TransientStoreError(f"{what}: {exc}")
    if exc.errno == errno.ELOOP:
        return UnsafePathError(f"{what}: it is a symlink, which ckptstore never follows")
    return exc


def makedirs(directory: str) -> None:
    """Create ``directory`` and parents, fsyncing each parent so the entries persist.

    For a trusted base only (a root as the user named it), never a path below a root."""
    missing = []
    d = directory
    while not os.path.isdir(d):
        missing.append(d)
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    for d in reversed(missing):
        try:
            os.mkdir(d)
        except FileExistsError:
            continue
        fsync_dir(os.path.dirname(d))
