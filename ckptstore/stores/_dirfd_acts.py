"""Acts relative to one open directory descriptor, never following a link.

What ``_dirfd.Anchor`` builds on once it holds a directory's descriptor: the open flags of
every act (``O_NOFOLLOW`` always; reads that never block on a FIFO), the acts on one
``(directory descriptor, name)`` a caller makes within ``Anchor.parent`` (``create_new``,
``open_existing``, ``link_new``, ``replace``, ``unlink_quietly``), and the walks below a
descriptor (``entries``, ``walk_below``, ``prune_below``, ``clear_below``), which type
entries without following links and never descend into one, even one that replaced a
directory after it was listed. Every descriptor a walk opens is closed before it returns.
"""

from __future__ import annotations

import errno
import os
import stat

from ckptstore.engine.store import join_path
from ckptstore.errors import UnsafePathError

__all__ = [
    "CLOEXEC",
    "O_DIR",
    "O_READ",
    "O_RW",
    "REFUSED_OPEN",
    "clear_below",
    "create_new",
    "entries",
    "link_new",
    "open_existing",
    "prune_below",
    "replace",
    "subdir",
    "unlink_quietly",
    "walk_below",
    "what_is",
]

CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | CLOEXEC
#: A read never blocks on what it opens (a FIFO with no writer, a device), never takes a
#: terminal as the process's controlling one, never follows a link.
O_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | CLOEXEC
#: As ``O_READ``, for reading and writing, creating a missing file.
O_RW = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | CLOEXEC
O_NEW = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | CLOEXEC
#: Errors an open with ``O_READ`` or ``O_RW`` fails with where the name is a link
#: (``ELOOP``), a socket (``ENXIO``), a device without a driver (``ENXIO``, ``ENODEV``) or,
#: opened for writing, a directory (``EISDIR``).
REFUSED_OPEN = frozenset({errno.ELOOP, errno.ENXIO, errno.ENODEV, errno.EOPNOTSUPP, errno.EISDIR})
O_WRITE = os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | CLOEXEC


def what_is(mode: int) -> str:
    """What a file of ``mode`` is, in words for a message."""
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISLNK(mode):
        return "a symlink"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


# -- walks below a directory descriptor ------------------------------------------------
def _kind(entry: os.DirEntry) -> str:
    if entry.is_symlink():
        return "link"
    if entry.is_dir(follow_symlinks=False):
        return "dir"
    if entry.is_file(follow_symlinks=False):
        return "file"
    return "other"


def entries(fd: int) -> list[tuple[str, str]]:
    # ``os.scandir(fd)`` lists a duplicate of ``fd`` and closes that; ``fd`` stays ours.
    with os.scandir(fd) as it:
        return [(e.name, _kind(e)) for e in it]


def subdir(fd: int, name: str) -> int | None:
    """``name`` below ``fd`` opened as a directory, or None if it is gone or is no longer
    a directory (a link put in its place since it was listed)."""
    try:
        return os.open(name, O_DIR, dir_fd=fd)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return None
        raise


def walk_below(fd: int, rel: str, files: list[str], dirs: list[str] | None) -> None:
    for name, kind in entries(fd):
        sub = join_path(rel, name)
        if kind == "file":
            files.append(sub)
        elif kind == "dir":
            child = subdir(fd, name)
            if child is None:
                continue
            try:
                if dirs is not None:
                    dirs.append(sub)
                walk_below(child, sub, files, dirs)
            finally:
                os.close(child)


def prune_below(fd: int) -> None:
    for name, kind in entries(fd):
        if kind != "dir":
            continue
        child = subdir(fd, name)
        if child is None:
            continue
        try:
            prune_below(child)
        finally:
            os.close(child)
        try:
            os.rmdir(name, dir_fd=fd)  # a link put there meanwhile: ENOTDIR, left alone
        except OSError:
            pass  # not empty: something is left in it


def clear_below(fd: int) -> None:
    """Remove everything below directory ``fd``, never following a link."""
    for name, kind in entries(fd):
        child = subdir(fd, name) if kind == "dir" else None
        if child is None:  # a file, a link, or a directory a link replaced since
            try:
                os.unlink(name, dir_fd=fd)
            except FileNotFoundError:
                pass
            continue
        try:
            clear_below(child)
        finally:
            os.close(child)
        os.rmdir(name, dir_fd=fd)


# -- acts on (directory descriptor, name), within ``Anchor.parent`` ------------------------
def create_new(dfd: int, name: str, mode: int = 0o644, *, readable: bool = False) -> int:
    """Create ``name`` below ``dfd``, which must not exist (not even as a link), and open
    it for writing (and reading, with ``readable``)."""
    flags = (O_NEW & ~os.O_WRONLY) | os.O_RDWR if readable else O_NEW
    return os.open(name, flags, mode, dir_fd=dfd)


def open_existing(dfd: int, name: str) -> int:
    """Open existing regular file ``name`` below ``dfd`` for writing, never through a link
    (``ELOOP``) and never blocking on a FIFO; anything but a regular file is
    ``UnsafePathError``."""
    fd = os.open(name, O_WRITE, dir_fd=dfd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise UnsafePathError(
                f"{name} is {what_is(mode)}, not a regular file; ckptstore writes only "
                "regular files. Remove it (someone else put it there)."
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def link_new(dfd: int, src: str, dst: str) -> None:
    """Give ``src`` (below ``dfd``) the new name ``dst`` there: ``FileExistsError`` if
    ``dst`` is taken (by anything, a link included). Never follows ``src`` if a link."""
    os.link(src, dst, src_dir_fd=dfd, dst_dir_fd=dfd, follow_symlinks=False)


def replace(dfd: int, src: str, dst: str) -> None:
    """Rename ``src`` to ``dst``, both below ``dfd``, replacing ``dst`` (a link there is
    replaced itself, never followed)."""
    os.replace(src, dst, src_dir_fd=dfd, dst_dir_fd=dfd)


def unlink_quietly(dfd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dfd)
    except OSError:
        pass
