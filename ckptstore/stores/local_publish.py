"""How the volume store makes a file durable and visible: ``LocalStore``'s writes.

Every publish is write temp -> fsync(file) -> rename -> fsync(directory). A create-only
write ``link()``-s a fully written, fsynced temp file to its final name instead, which
fails with EEXIST if another writer got there first. Parts of a multipart write are
``pwrite`` at their offsets into one temp file, in parallel: a large part's page-aligned
middle with ``O_DIRECT`` (``_direct``: no page-cache pages to fill, nothing left dirty),
the rest buffered, whose writeback is started as soon as a large one is written
(``start_writeback``), so the disk works while later parts are still being copied and
the one fsync at the end has little left to wait for.

Paths here are absolute and already checked for links by the store; ``what`` names the
write in errors. An fsync error fails the write (``DurabilityError``), never retried.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence

from ckptstore.engine.names import TMP_MARK
from ckptstore.engine.store import Buffer
from ckptstore.errors import StoreNotFoundError
from ckptstore.stores._direct import write_aligned
from ckptstore.stores._posix import (
    NOFOLLOW,
    fsync,
    fsync_all,
    fsync_dir,
    makedirs,
    start_writeback,
    translate,
    unlink_quietly,
)

__all__ = ["WRITEBACK_MIN", "publish", "publish_many", "create", "begin", "write_part", "finish"]

#: Parts this large have their writeback started as soon as they are written
#: (``start_writeback``): the final fsync then waits for little more than the last part.
WRITEBACK_MIN = 1024 * 1024


def _new_temp(final: str) -> str:
    makedirs(os.path.dirname(final))
    return f"{final}{TMP_MARK}{uuid.uuid4().hex}"


def _open_temp(final: str, data: Buffer) -> tuple[str, int]:
    """Write ``data`` to a new temp file beside ``final``, not yet fsynced; returns its
    path and open descriptor (the caller fsyncs and closes it, or removes it)."""
    tmp = _new_temp(final)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, 0o644)
    try:
        view = memoryview(data).cast("B")
        while len(view):
            n = os.write(fd, view)
            view = view[n:]
    except BaseException:
        os.close(fd)
        unlink_quietly(tmp)
        raise
    return tmp, fd


def _write_temp(final: str, data: Buffer) -> str:
    """Write ``data`` to a fsynced temp file beside ``final``; returns the temp path."""
    tmp, fd = _open_temp(final, data)
    try:
        fsync(fd, tmp)
    except BaseException:
        os.close(fd)
        unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp


def publish(final: str, data: Buffer, what: str) -> None:
    """``final`` holds ``data``, whole and durable, replacing what it held."""
    try:
        tmp = _write_temp(final, data)
        try:
            os.replace(tmp, final)
        except BaseException:
            unlink_quietly(tmp)
            raise
        fsync_dir(os.path.dirname(final))
    except OSError as exc:
        raise translate(exc, what) from exc


def publish_many(items: Sequence[tuple[str, Buffer]], what: str) -> None:
    """Every temp file written, then all of them fsynced at once (``fsync_all``: each
    file synced, in parallel), then all renamed in the order given, then each directory
    fsynced once (not once per file). A crash before it returns may keep any of them,
    each whole (fsynced before its rename) or not at all; journaling file systems (ext4,
    xfs) persist renames within one directory in the order made."""
    temps: list[tuple[str, str]] = []
    try:
        try:
            fds: list[tuple[int, str]] = []
            try:
                for final, data in items:
                    tmp, fd = _open_temp(final, data)
                    temps.append((tmp, final))
                    fds.append((fd, tmp))
                fsync_all(fds)
            finally:
                for fd, _ in fds:
                    os.close(fd)
            for tmp, final in temps:
                os.replace(tmp, final)
        except BaseException:
            for tmp, _ in temps:
                unlink_quietly(tmp)  # a no-op for each one already renamed
            raise
        for directory in dict.fromkeys(os.path.dirname(f) for _, f in temps):
            fsync_dir(directory)
    except OSError as exc:
        raise translate(exc, what) from exc


def create(final: str, data: Buffer, what: str) -> bool:
    """Create ``final`` holding ``data``, whole and durable; False, leaving it alone, if
    it exists already (the caller decides whether that is a conflict)."""
    try:
        tmp = _write_temp(final, data)
        try:
            os.link(tmp, final)  # atomic, fails with EEXIST if taken
        except FileExistsError:
            return False
        finally:
            unlink_quietly(tmp)
        fsync_dir(os.path.dirname(final))
        return True
    except OSError as exc:
        raise translate(exc, what) from exc


def begin(final: str, what: str) -> str:
    """An empty temp file beside ``final`` for a multipart write; returns its path."""
    try:
        tmp = _new_temp(final)
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
    except OSError as exc:
        raise translate(exc, what) from exc
    return tmp


def write_part(tmp: str, offset: int, data: Buffer, what: str) -> None:
    """``pwrite`` ``data`` at ``offset`` of the upload's temp file ``tmp``."""
    try:
        fd = os.open(tmp, os.O_WRONLY | NOFOLLOW)
    except FileNotFoundError as exc:
        raise StoreNotFoundError(f"{what}: the upload was aborted") from exc
    try:
        view = memoryview(data).cast("B")
        lo, hi = write_aligned(tmp, fd, offset, view)  # the direct middle, if any
        _pwrite_all(fd, view[: lo - offset], offset)
        _pwrite_all(fd, view[hi - offset :], hi)
    except OSError as exc:
        raise translate(exc, what) from exc
    finally:
        os.close(fd)


def _pwrite_all(fd: int, view: memoryview, pos: int) -> None:
    """``pwrite`` all of ``view`` at ``pos`` (buffered), starting the writeback of a large
    one (``start_writeback``)."""
    start = pos
    while len(view):
        n = os.pwrite(fd, view, pos)
        view = view[n:]
        pos += n
    if pos - start >= WRITEBACK_MIN:
        start_writeback(fd, start, pos - start)


def finish(tmp: str, final: str, size: int, what: str, done: Callable[[], bool]) -> None:
    """Truncate ``tmp`` to ``size``, fsync it, rename it to ``final``, fsync the directory.

    ``tmp`` gone: a retry whose first try renamed it; ``done()`` says if the file is whole.
    """
    try:
        try:
            fd = os.open(tmp, os.O_WRONLY | NOFOLLOW)
        except FileNotFoundError:
            if done():
                return
            raise
        try:
            if os.fstat(fd).st_size != size:
                os.ftruncate(fd, size)
            fsync(fd, tmp)
        finally:
            os.close(fd)
        os.replace(tmp, final)
        fsync_dir(os.path.dirname(final))
    except OSError as exc:
        raise translate(exc, what) from exc
