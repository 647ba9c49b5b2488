"""A framework's local checkpoint folder, every path resolved from a trusted directory.

Trainer and Accelerate keep their checkpoint folders in a directory the user configured
(``output_dir``, ``project_dir``, a ``local_dir``): that directory is trusted as given (it
may be a symlink); nothing below it is. The checkpoint folders, the quarantine folder
``.ckptstore-uncommitted`` and every file in them are reached from an open descriptor of
the trusted directory, component by component, without following a link
(``ckptstore.stores.Anchor``, DESIGN.md trust rule 7), and each act -- list, read, write,
move aside, remove -- is made relative to the descriptor of its own directory. A folder
swapped for a link while a save or a restore runs makes that act fail
(``UnsafePathError``); it never reads, writes, moves or removes anything where the link
points. Only regular files are read: a FIFO, socket or device in a folder is refused at
once, never waited on.

Call order: ``LocalFolder(folder, base)``, then ``files()`` and ``read(name)`` (a save:
the folder is its own base), or ``matches(index)``, ``exists()`` and ``write(tensors,
qdir)`` (a restore), or ``folders()`` and ``quarantine(qdir)`` (folders moved aside).
"""

from __future__ import annotations

import logging
import mmap
import os
import posixpath
import stat
import uuid
from collections.abc import Mapping
from typing import Any

import crc32c
import torch

from ckptstore import open_store
from ckptstore.errors import UnsafePathError
from ckptstore.stores import Anchor, is_safe_name

__all__ = ["QUARANTINE", "LocalFolder", "crc", "name_below"]

log = logging.getLogger(__name__)

#: Where local folders that do not match a committed step are moved.
QUARANTINE = ".ckptstore-uncommitted"
_WHAT = "checkpoint directory"


def name_below(path: str, base: str) -> str:
    """The '/'-joined name of ``path`` below the directory ``base``, worked out from the
    two strings alone; ``UnsafePathError`` if it is ``base`` itself or leaves it. Nothing
    is looked up: the acts resolve the name from ``base``'s descriptor and refuse a link
    on the way."""
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(base)).replace(os.sep, "/")
    if not is_safe_name(rel):
        raise UnsafePathError(
            f"{path} is not inside {base}: {rel!r} is not a relative, normalised name that "
            "stays inside it"
        )
    return rel


def crc(t: torch.Tensor) -> int:
    """The CRC32C of a uint8 tensor's bytes."""
    return int(crc32c.crc32c(t.numpy().data)) if t.numel() else 0


def _join(*names: str) -> str:
    return "/".join(n for n in names if n)


class LocalFolder:
    """The folder ``folder``, below the trusted directory ``base`` (default: the folder's
    parent, as given) or ``base`` itself (a save's folder), every path below ``base``
    resolved from its descriptor. See the module docstring."""

    def __init__(self, folder: str, base: str | None = None) -> None:
        self.path = os.path.abspath(folder)
        base = os.path.abspath(base) if base is not None else os.path.dirname(self.path)
        self.paths = Anchor(base, what=_WHAT)
        self.name = "" if self.path == base else name_below(self.path, base)

    # -- reading -----------------------------------------------------------------------
    def folders(self) -> list[str]:
        """The names of the folders in this one (never a link to one); none if it is not
        there."""
        try:
            return [n for n, kind in self.paths.scan(self.name) if kind == "dir"]
        except (FileNotFoundError, NotADirectoryError):
            return []

    def files(self) -> dict[str, int]:
        """``{'/'-joined name below the folder: size}`` of every file in it; nothing if it
        is not there. A symlink, FIFO, socket or device in it is ``UnsafePathError``: only
        regular files are a framework's checkpoint, and none is followed or waited on."""
        try:
            top = self.paths.scan(self.name)
        except (FileNotFoundError, NotADirectoryError):
            return {}  # no folder there
        out: dict[str, int] = {}
        self._list("", top, out)
        return out

    def _list(self, rel: str, entries: list[tuple[str, str]], out: dict[str, int]) -> None:
        for name, kind in entries:
            sub = _join(rel, name)
            if kind == "dir":
                self._list(sub, self.paths.scan(_join(self.name, sub)), out)
                continue
            st = self.paths.stat(_join(self.name, sub)) if kind == "file" else None
            if st is None or not stat.S_ISREG(st.st_mode):
                what = "a symlink" if kind == "link" else "not a regular file or a folder"
                raise UnsafePathError(
                    f"{os.path.join(self.path, sub)} is {what}; ckptstore uploads and reads "
                    "only the regular files of a checkpoint folder, never through a link. "
                    "Replace it with the file itself, or remove it"
                )
            out[sub] = st.st_size

    def read(self, rel: str) -> torch.Tensor:
        """File ``rel`` of the folder as a uint8 tensor mapping it privately (no copy until
        it is written to): a regular file, opened from the base's descriptor."""
        fd = self.paths.open_read(_join(self.name, rel))
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                return torch.empty(0, dtype=torch.uint8)
            return torch.frombuffer(mmap.mmap(fd, size, access=mmap.ACCESS_COPY), dtype=torch.uint8)
        finally:
            os.close(fd)  # the map holds its own reference to the file

    def exists(self) -> bool:
        """Whether anything is at the folder's name (a link too: never followed)."""
        return self._mode() is not None

    def _mode(self) -> int | None:
        try:
            return self.paths.stat(self.name).st_mode
        except FileNotFoundError:
            return None

    def matches(self, index: Mapping[str, Any]) -> bool:
        """Whether the folder holds exactly the files of ``index`` (names, sizes, CRC32C).

        A link, FIFO or other non-regular file in it (or put in it meanwhile) is a
        mismatch: the folder is then moved aside whole, never read through."""
        mode = self._mode()
        if mode is None or not stat.S_ISDIR(mode):
            return False
        try:
            local = self.files()
            if set(local) != set(index["files"]):
                return False
            for rel, want in index["files"].items():
                if local[rel] != want["size"]:
                    return False
                t = self.read(rel)
                if t.numel() != want["size"] or crc(t) != want["crc32c"]:
                    return False
        except (FileNotFoundError, NotADirectoryError, UnsafePathError):
            return False  # changed, or a link put in it, while it was read
        return True

    # -- writing -----------------------------------------------------------------------
    def write(self, tensors: Mapping[str, torch.Tensor], qdir: str | None) -> None:
        """Make the folder hold exactly ``tensors`` (``{'/'-joined name: uint8 tensor}``):
        written into a new temp folder beside it (each file durable), then whatever is at
        the folder's name moved aside (:meth:`quarantine`), then the temp folder renamed
        in (both directories fsynced). On any failure the temp folder is removed."""
        parent = posixpath.dirname(self.name)
        tmp = _join(parent, f".{posixpath.basename(self.name)}.ckptstore-tmp-{uuid.uuid4().hex}")
        try:
            store = open_store(self.paths.base)
            try:
                for rel, t in tensors.items():
                    store.put(f"{tmp}/{rel}", t.numpy().data)
            finally:
                store.close()
            self.paths.mkdir(tmp, parents=True)  # an empty checkpoint is still a folder
            if self.exists():
                self.quarantine(qdir)
            self.paths.rename(tmp, self.name)
        except BaseException:
            try:
                self.paths.rmtree(tmp)
            except (OSError, UnsafePathError):
                pass  # not made, or a link put in its way: nothing of ours to remove there
            raise

    def quarantine(self, qdir: str | None) -> str:
        """Move the folder into ``qdir`` (an absolute path below the base; default:
        ``QUARANTINE`` beside the folder), replacing an older quarantined copy; its new
        path. A link at the folder's name is refused (``UnsafePathError``), never moved
        for what it points to."""
        qname = name_below(qdir, self.paths.base) if qdir is not None else None
        if qname is None:
            qname = _join(posixpath.dirname(self.name), QUARANTINE)
        target = _join(qname, posixpath.basename(self.name))
        self.paths.mkdir(qname, parents=True)
        try:
            kind = self.paths.stat(target).st_mode
        except FileNotFoundError:
            pass
        else:
            if stat.S_ISDIR(kind):
                self.paths.rmtree(target)
            else:  # a file or a link in the way: the name itself goes
                self.paths.unlink(target)
        self.paths.rename(self.name, target)
        shown = self.paths.shown(target.split("/"))
        log.warning(
            "moved %s aside to %s: it does not match a committed checkpoint", self.path, shown
        )
        return shown
