"""Volume paths resolved from an open descriptor of a trusted base, never used as strings.

The rule (DESIGN.md, trust rule 7): a root on a volume is shared, untrusted ground, so a
path below it is never checked and then handed to the kernel as a string -- a directory
swapped for a symlink between the check and the use would take the act outside the root.
Instead the act itself refuses the link: the base is opened once (``Anchor``), every
component below it is opened relative to its parent's descriptor with
``O_DIRECTORY | O_NOFOLLOW`` (``dir_fd=``), and the act on the last component (open,
create, link, rename, unlink, rmdir, stat, list) is made relative to its parent's
descriptor without following a link. Whatever is renamed where, meanwhile, the act lands
in a directory that was reached without passing through a link, or fails.

- The base is trusted as given (the user's root, which may itself be a symlink); the
  components a child store's root adds below it (``below``) and every component of a path
  are not: a symlink met there is ``UnsafePathError``.
- Only regular files are opened for reading: ``open_read`` (and ``open_rw``, which
  creates a missing one) opens with ``O_NONBLOCK`` (a FIFO then opens at once instead of
  waiting for a writer) and ``fstat``s what it got; a FIFO, socket, device or directory is
  ``UnsafePathError`` (damage, or planted: never "missing", which would make a step whose
  marker is a directory look merely unfinished).
- Listings (``scan``, ``walk``) type entries without following links and never descend
  into a link, even one that replaced a directory after it was listed.
- Every descriptor opened here is closed before the call returns or raises.

Call order: ``Anchor(base, below, what)`` once per store (or per trusted directory: a
data cache, a framework's output folder; ``what`` names it in messages); then, per
operation, either one of its acts (``open_read``, ``open_rw``, ``stat``, ``unlink``,
``rmdir``, ``scan``, ``walk``, ``remove_empty_dirs``, ``mkdir``, ``rmtree``, ``rename``),
or ``with anchor.parent(path, create=...) as (dir_fd, name):`` followed by the acts on
``(dir_fd, name)`` of ``_dirfd_acts`` (``create_new``, ``open_existing``, ``link_new``,
``replace``, ``unlink_quietly``), all within the ``with``, or ``with anchor.directory(path) as
dir_fd:`` for several acts on the entries of one directory, each relative to ``dir_fd``.

OSErrors other than these refusals are raised as they are; the caller maps them
(``_posix.translate``) with the words that name its operation.

Written by hand on ``os`` with ``dir_fd``: no well-kept library resolves paths from a
descriptor for all of these acts (``shutil.rmtree`` does it for removal only, privately;
Linux's ``openat2(RESOLVE_BENEATH)`` has no Python binding in the standard library).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager

from ckptstore.errors import UnsafePathError
from ckptstore.stores._dirfd_acts import (
    CLOEXEC,
    O_DIR,
    O_READ,
    O_RW,
    REFUSED_OPEN,
    clear_below,
    entries,
    prune_below,
    walk_below,
    what_is,
)
from ckptstore.stores._posix import fsync, makedirs

__all__ = ["Anchor"]


def _check_part(seg: str, where: str) -> None:
    # The store guard refuses such names before any store runs; this is the act's own
    # refusal, so no caller can walk out of the base with a name it forgot to check.
    if not seg or seg in (".", "..") or "/" in seg or "\0" in seg:
        raise UnsafePathError(
            f"refusing path component {seg!r} of {where}: it would leave its directory"
        )


def _link_refused(shown: str, where: str) -> UnsafePathError:
    return UnsafePathError(
        f"{shown} is a symlink; ckptstore never follows links under a {where}. Remove it "
        "or point ckptstore at the real directory."
    )


def _classify(fd: int, seg: str, shown: str, where: str, exc: OSError) -> BaseException:
    """Why opening ``seg`` (below ``fd``) with ``O_NOFOLLOW`` failed with ELOOP/ENOTDIR:
    a link (``UnsafePathError``), else ``exc`` itself (a file where a directory was)."""
    try:
        st = os.stat(seg, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return exc
    if stat.S_ISLNK(st.st_mode):
        return _link_refused(shown, where)
    return exc


def _close(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


class Anchor:
    """A trusted base directory, and the components a store's root adds below it.

    ``base`` is an absolute path, trusted as given (it may be a symlink); ``below`` are
    the components between it and the store's root, resolved like any path below it.
    ``what`` names the base in messages (a link refused "under a checkpoint root").
    Holds no descriptor between calls (stores are pickled, and processes fork).
    """

    __slots__ = ("base", "below", "what")

    def __init__(
        self, base: str, below: tuple[str, ...] = (), what: str = "checkpoint root"
    ) -> None:
        self.base = base
        self.below = below
        self.what = what

    @property
    def _where(self) -> str:
        return f"{self.what} ({self.base})"

    def shown(self, parts: list[str] | tuple[str, ...]) -> str:
        """The path of ``parts`` below the base, for messages."""
        return os.path.join(self.base, *parts) if parts else self.base

    def _parts(self, path: str) -> list[str]:
        parts = [*self.below, *(path.split("/") if path else ())]
        for seg in parts:
            _check_part(seg, self.shown(parts))
        return parts

    def _open_base(self, create: bool) -> int:
        try:
            return os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)
        except FileNotFoundError:
            if not create:
                raise
        makedirs(self.base)  # the trusted base itself, as the user named it
        return os.open(self.base, os.O_RDONLY | os.O_DIRECTORY | CLOEXEC)

    def _descend(self, fd: int, parts: list[str], upto: int, create: bool) -> int:
        """The descriptor of ``parts[:upto]`` below ``fd`` (which it closes; on error too)."""
        try:
            for i in range(upto):
                seg = parts[i]
                try:
                    nxt = os.open(seg, O_DIR, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise
                    nxt = self._mkdir(fd, seg)
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                        raise
                    why = _classify(fd, seg, self.shown(parts[: i + 1]), self._where, exc)
                    if why is exc:
                        raise
                    raise why from exc
                os.close(fd)
                fd = nxt
        except BaseException:
            _close(fd)
            raise
        return fd

    def _mkdir(self, fd: int, seg: str) -> int:
        """Create directory ``seg`` below ``fd`` (fsyncing ``fd`` so the entry persists)
        and open it; one made meanwhile by another writer is opened as it is."""
        try:
            os.mkdir(seg, 0o777, dir_fd=fd)
        except FileExistsError:
            pass
        else:
            fsync(fd, f"directory of {seg}")
        return os.open(seg, O_DIR, dir_fd=fd)

    @contextmanager
    def directory(self, path: str, *, create: bool = False) -> Iterator[int]:
        """The descriptor of directory ``path`` (``""``: the store's root), for the block."""
        parts = self._parts(path)
        fd = self._descend(self._open_base(create), parts, len(parts), create)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def parent(self, path: str, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """``(descriptor of path's directory, path's last component)`` for the block;
        with ``create``, missing directories on the way are made (and their parents
        fsynced). ``path`` must name something below the base."""
        parts = self._parts(path)
        if not parts:
            raise UnsafePathError(f"{self.base}: an empty path names no file below the root")
        fd = self._descend(self._open_base(create), parts, len(parts) - 1, create)
        try:
            yield fd, parts[-1]
        finally:
            os.close(fd)

    # -- acts on one path ---------------------------------------------------------------
    def open_read(self, path: str) -> int:
        """An open descriptor of regular file ``path`` for reading (the caller closes it).

        A symlink, FIFO, socket, device or directory is ``UnsafePathError`` (nothing waits
        on it); missing: ``FileNotFoundError``."""
        return self._open_regular(path, O_READ)

    def open_rw(self, path: str, mode: int = 0o644) -> int:
        """An open descriptor of regular file ``path`` for reading and writing, created
        empty (with ``mode``) if missing; the caller closes it. A symlink, FIFO, socket,
        device or directory there is ``UnsafePathError`` (nothing waits on it, nothing is
        written through it); its directory missing: ``FileNotFoundError``."""
        return self._open_regular(path, O_RW, mode)

    def _open_regular(self, path: str, flags: int, perm: int = 0o644) -> int:
        with self.parent(path) as (dfd, name):
            try:
                fd = os.open(name, flags, perm, dir_fd=dfd)
            except OSError as exc:
                if exc.errno not in REFUSED_OPEN:
                    raise
                try:  # why the open failed, for the message: the open did the refusing
                    mode = os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mode
                except OSError:
                    raise exc from None
                if stat.S_ISREG(mode):
                    raise
                raise self._not_regular(path, mode) from exc
            try:
                mode = os.fstat(fd).st_mode
                if not stat.S_ISREG(mode):
                    raise self._not_regular(path, mode)
            except BaseException:
                os.close(fd)
                raise
            return fd

    def _not_regular(self, path: str, mode: int) -> Exception:
        shown = self.shown(self._parts(path))
        if stat.S_ISLNK(mode):
            return _link_refused(shown, self._where)
        return UnsafePathError(
            f"{shown} is {what_is(mode)}, not a regular file; ckptstore reads only regular "
            f"files under a {self.what}. Remove it (someone else put it there)."
        )

    def stat(self, path: str) -> os.stat_result:
        """``lstat`` of ``path``: a link is described, never followed."""
        with self.parent(path) as (dfd, name):
            return os.stat(name, dir_fd=dfd, follow_symlinks=False)

    def unlink(self, path: str) -> None:
        """Remove the name ``path`` (a link itself, never what it points to); a missing
        one, or a missing directory on the way, is not an error."""
        try:
            with self.parent(path) as (dfd, name):
                os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            return

    def rmdir(self, path: str) -> None:
        """Remove the empty directory ``path`` (``""``: the store's root). ``OSError`` if
        it is not empty, is a link (``ENOTDIR``), or is missing."""
        if self._parts(path):
            with self.parent(path) as (dfd, name):
                os.rmdir(name, dir_fd=dfd)
        else:
            os.rmdir(self.base)  # the trusted base itself

    def scan(self, path: str) -> list[tuple[str, str]]:
        """``(name, kind)`` of each entry of directory ``path``: kind ``"file"``,
        ``"dir"``, ``"link"`` or ``"other"``, never following a link."""
        with self.directory(path) as fd:
            return entries(fd)

    def walk(self, path: str, files: list[str], dirs: list[str] | None = None) -> None:
        """Regular files below directory ``path`` into ``files`` (names relative to it)
        and, with ``dirs``, its directories; a link is never descended into, even one
        that replaced a directory after the listing. Missing: nothing."""
        try:
            with self.directory(path) as fd:
                walk_below(fd, "", files, dirs)
        except (FileNotFoundError, NotADirectoryError):
            return

    def mkdir(self, path: str, *, parents: bool = False) -> None:
        """Make directory ``path``: with ``parents``, and every missing one on the way (an
        existing one is no error); without, ``FileExistsError`` if the name is taken and
        ``FileNotFoundError`` if its parent is missing."""
        if parents:
            with self.directory(path, create=True):
                return
        with self.parent(path) as (dfd, name):
            os.mkdir(name, 0o777, dir_fd=dfd)
            fsync(dfd, f"the directory of {self.shown(self._parts(path))}")

    def rmtree(self, path: str) -> None:
        """Remove directory ``path`` and everything in it, each entry relative to its
        directory's descriptor: a link is removed itself, never entered (even one put in
        place of a directory while the removal runs). ``""``: the store's root."""
        if not self._parts(path):
            with self.directory(path) as fd:
                clear_below(fd)
            self.rmdir(path)
            return
        with self.parent(path) as (dfd, name):
            try:
                fd = os.open(name, O_DIR, dir_fd=dfd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                why = _classify(dfd, name, self.shown(self._parts(path)), self._where, exc)
                if why is exc:
                    raise
                raise why from exc
            try:
                clear_below(fd)
            finally:
                os.close(fd)
            os.rmdir(name, dir_fd=dfd)

    def rename(self, src: str, dst: str) -> None:
        """Rename ``src`` to ``dst`` (``rename(2)``: a file replaces a file, a directory
        takes an absent or empty one), each resolved from the base; both directories are
        fsynced, so the rename is durable on return. A link at either name is moved or
        replaced itself, never followed."""
        with self.parent(src) as (sfd, sname), self.parent(dst) as (dfd, dname):
            # A link as the source is refused by name; moving one would be harmless (the
            # rename takes the link itself, so one swapped in after this look is only
            # moved within the root), but a caller renaming a link meant its target.
            if stat.S_ISLNK(os.stat(sname, dir_fd=sfd, follow_symlinks=False).st_mode):
                raise _link_refused(self.shown(self._parts(src)), self._where)
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
            fsync(sfd, f"the directory of {self.shown(self._parts(src))}")
            fsync(dfd, f"the directory of {self.shown(self._parts(dst))}")

    def remove_empty_dirs(self, path: str) -> None:
        """Remove directory ``path`` and every directory below it that holds nothing,
        deepest first, each relative to its parent's descriptor; a link is never entered
        or removed, and a directory that is not empty is left."""
        try:
            with self.directory(path) as fd:
                prune_below(fd)
        except (FileNotFoundError, NotADirectoryError):
            return
        try:
            self.rmdir(path)
        except OSError:
            pass  # not empty: something is left in it (or it is gone already)
