"""How the volume store makes a file durable and visible: ``LocalStore``'s writes.

Every durable write is write temp -> fsync(file) -> rename -> fsync(directory). A create-only
write ``link()``-s a fully written, fsynced temp file to its final name instead, which
fails with EEXIST if another writer got there first. Parts of a multipart write are
``pwrite`` at their offsets into one temp file, in parallel: a large part's page-aligned
middle with ``O_DIRECT`` (``_direct``: no page-cache pages to fill, nothing left dirty),
the rest buffered, whose writeback is started as soon as a large one is written
(``start_writeback``), so the disk works while later parts are still being copied and
the one fsync at the end has little left to wait for.

Every path here is relative to the store's root and resolved from its descriptor
(``_dirfd.Anchor.parent``): the temp file is created, written, fsynced and renamed relative
to the descriptor of the directory it lands in, and that same descriptor is fsynced, so a
directory on the way swapped for a symlink meanwhile refuses the write instead of taking it
elsewhere. ``what`` names the write in errors. An fsync error fails the write
(``DurabilityError``), never retried.

Call order: ``write_durably`` / ``write_many_durably`` / ``create`` for whole files; ``begin``, then
``write_part`` (any order, concurrently), then ``finish`` for a multipart write, whose
temp file's path (relative to the root) is the upload's handle.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Sequence
from contextlib import ExitStack

from ckptstore.engine.names import TMP_MARK
from ckptstore.engine.store import Buffer
from ckptstore.errors import StoreNotFoundError
from ckptstore.stores._direct import write_aligned
from ckptstore.stores._dirfd import Anchor
from ckptstore.stores._dirfd_acts import (
    create_new,
    link_new,
    open_existing,
    replace,
    unlink_quietly,
)
from ckptstore.stores._posix import fsync, fsync_all, start_writeback, translate

__all__ = [
    "WRITEBACK_MIN",
    "write_durably",
    "write_many_durably",
    "create",
    "begin",
    "write_part",
    "finish",
    "abort",
]

#: Parts this large have their writeback started as soon as they are written
#: (``start_writeback``): the final fsync then waits for little more than the last part.
WRITEBACK_MIN = 1024 * 1024


def _temp_name(name: str) -> str:
    return f"{name}{TMP_MARK}{uuid.uuid4().hex}"


def _open_temp(dfd: int, name: str, data: Buffer) -> tuple[str, int]:
    """Write ``data`` to a new temp file beside ``name`` (below ``dfd``), not yet
    fsynced; returns its name and open descriptor (the caller fsyncs and closes it, or
    removes it)."""
    tmp = _temp_name(name)
    fd = create_new(dfd, tmp)
    try:
        view = memoryview(data).cast("B")
        while len(view):
            n = os.write(fd, view)
            view = view[n:]
    except BaseException:
        os.close(fd)
        unlink_quietly(dfd, tmp)
        raise
    return tmp, fd


def _write_temp(dfd: int, name: str, data: Buffer) -> str:
    """Write ``data`` to a fsynced temp file beside ``name``; returns the temp's name."""
    tmp, fd = _open_temp(dfd, name, data)
    try:
        fsync(fd, tmp)
    except BaseException:
        os.close(fd)
        unlink_quietly(dfd, tmp)
        raise
    os.close(fd)
    return tmp


def write_durably(anchor: Anchor, path: str, data: Buffer, what: str) -> None:
    """``path`` holds ``data``, whole and durable, replacing what it held."""
    try:
        with anchor.parent(path, create=True) as (dfd, name):
            tmp = _write_temp(dfd, name, data)
            try:
                replace(dfd, tmp, name)
            except BaseException:
                unlink_quietly(dfd, tmp)
                raise
            fsync(dfd, f"the directory of {what}")
    except OSError as exc:
        raise translate(exc, what) from exc


def write_many_durably(anchor: Anchor, items: Sequence[tuple[str, Buffer]], what: str) -> None:
    """Every temp file written, then all of them fsynced at once (``fsync_all``: each
    file synced, in parallel), then all renamed in the order given, then each directory
    fsynced once (not once per file). A crash before it returns may keep any of them,
    each whole (fsynced before its rename) or not at all; journaling file systems (ext4,
    xfs) persist renames within one directory in the order made."""
    try:
        with ExitStack() as held:
            dirs: dict[str, int] = {}  # each directory resolved once, held to the end
            temps: list[tuple[int, str, str]] = []  # (directory, temp, final name)
            try:
                fds: list[tuple[int, str]] = []
                try:
                    for path, data in items:
                        head, _, name = path.rpartition("/")
                        if head in dirs:
                            dfd = dirs[head]
                        else:
                            dfd, name = held.enter_context(anchor.parent(path, create=True))
                            dirs[head] = dfd
                        tmp, fd = _open_temp(dfd, name, data)
                        temps.append((dfd, tmp, name))
                        fds.append((fd, tmp))
                    fsync_all(fds)
                finally:
                    for fd, _ in fds:
                        os.close(fd)
                for dfd, tmp, name in temps:
                    replace(dfd, tmp, name)
            except BaseException:
                for dfd, tmp, _ in temps:
                    unlink_quietly(dfd, tmp)  # a no-op for each one already renamed
                raise
            for dfd in dirs.values():
                fsync(dfd, f"the directory of {what}")
    except OSError as exc:
        raise translate(exc, what) from exc


def create(anchor: Anchor, path: str, data: Buffer, what: str) -> bool:
    """Create ``path`` holding ``data``, whole and durable; False, leaving it alone, if
    it exists already (the caller decides whether that is a conflict)."""
    try:
        with anchor.parent(path, create=True) as (dfd, name):
            tmp = _write_temp(dfd, name, data)
            try:
                link_new(dfd, tmp, name)  # atomic, fails with EEXIST if taken
            except FileExistsError:
                return False
            finally:
                unlink_quietly(dfd, tmp)
            fsync(dfd, f"the directory of {what}")
            return True
    except OSError as exc:
        raise translate(exc, what) from exc


def begin(anchor: Anchor, path: str, what: str) -> str:
    """An empty temp file beside ``path`` for a multipart write; returns its path."""
    try:
        with anchor.parent(path, create=True) as (dfd, name):
            tmp = _temp_name(name)
            os.close(create_new(dfd, tmp))
    except OSError as exc:
        raise translate(exc, what) from exc
    return f"{path}{tmp[len(name) :]}"


def write_part(anchor: Anchor, tmp: str, offset: int, data: Buffer, what: str) -> None:
    """``pwrite`` ``data`` at ``offset`` of the upload's temp file ``tmp``."""
    try:
        with anchor.parent(tmp) as (dfd, name):
            try:
                fd = open_existing(dfd, name)
            except FileNotFoundError as exc:
                raise StoreNotFoundError(f"{what}: the upload was aborted") from exc
            try:
                view = memoryview(data).cast("B")
                lo, hi = write_aligned(dfd, name, fd, offset, view)  # the direct middle
                _pwrite_all(fd, view[: lo - offset], offset)
                _pwrite_all(fd, view[hi - offset :], hi)
            finally:
                os.close(fd)
    except FileNotFoundError as exc:  # its directory is gone: aborted, and swept
        raise StoreNotFoundError(f"{what}: the upload was aborted") from exc
    except OSError as exc:
        raise translate(exc, what) from exc


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


def finish(
    anchor: Anchor, tmp: str, path: str, size: int, what: str, done: Callable[[], bool]
) -> None:
    """Truncate ``tmp`` to ``size``, fsync it, rename it to ``path`` (its sibling), fsync
    the directory.

    ``tmp`` gone: a retry whose first try renamed it; ``done()`` says if the file is whole.
    """
    tmp_name = tmp.rpartition("/")[2]
    try:
        with anchor.parent(path, create=True) as (dfd, name):
            try:
                fd = open_existing(dfd, tmp_name)
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
            replace(dfd, tmp_name, name)
            fsync(dfd, f"the directory of {what}")
    except OSError as exc:
        raise translate(exc, what) from exc


def abort(anchor: Anchor, tmp: str) -> None:
    """Remove the upload's temp file ``tmp``; gone already is no error."""
    try:
        anchor.unlink(tmp)
    except OSError:
        pass
