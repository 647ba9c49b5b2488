"""The store contract: the one small interface every storage backend implements.

A ``Store`` is rooted at one URL; every path it takes is relative to that root and
'/'-separated. Stores translate their client's exceptions into ckptstore errors:
``TransientStoreError`` for anything worth retrying (throttling, 5xx, resets, timeouts),
``StoreAccessError`` / ``StoreNotFoundError`` / ``StorageFullError`` / ``DurabilityError``
for the rest. The transfer engine retries only ``TransientStoreError``.

Call order for a multipart write (the engine drives it)::

    up = store.begin_multipart(path)
    part = store.put_part(up, number, offset, data)   # any order, concurrently; number 1..N
    store.complete_multipart(up, parts)               # the object appears whole and durable
    # or, on any failure:
    store.abort_multipart(up)                         # nothing visible, nothing left behind

Whole-object writes (``put``) are atomic and durable when they return. ``put_if_absent``
is the commit primitive: a create-only write where exactly one of several racing writers
succeeds (the others get ``CommitConflictError``).

Containment: every path-taking method of every subclass is wrapped when the class is
defined (``Store.__init_subclass__``), so its path, prefix or ``Multipart.path`` is checked by
``ckptstore.engine.paths`` before the store's own code runs: an absolute name, a ``..``
segment, NUL or backslash raises ``UnsafePathError`` and nothing is read, written or deleted.
A new store is contained without writing a line. Stores with links of their own (volumes)
also refuse to follow a symlink below the root, and never list one as a file or directory
(``scan`` reports it as ``"link"``).
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptstore.engine.paths import check_name, check_prefix

__all__ = ["Store", "Multipart", "Part", "Entry", "Buffer", "join_path"]

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class Multipart:
    """An open multipart upload. ``upload_id`` and ``extra`` are the store's own handle."""

    path: str
    upload_id: str
    extra: dict = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class Part:
    """One uploaded part, as ``complete_multipart`` needs it."""

    number: int
    offset: int
    size: int
    etag: str = ""


@dataclass(frozen=True)
class Entry:
    """One immediate child of a prefix, as ``Store.scan`` lists it.

    ``kind``: ``"file"`` (an object), ``"dir"`` (a directory or common prefix), ``"link"``
    (a symlink: never followed) or ``"other"`` (a device, socket, FIFO). On object stores an
    object ``a`` and a prefix ``a/`` can both exist: they are two entries.
    """

    name: str
    kind: str


#: Store methods whose first argument is an object name / a prefix / a Multipart.
_NAME_METHODS = ("put", "put_if_absent", "get", "get_into", "size", "exists", "delete")
_NAME_METHODS_MP = ("begin_multipart",)
_PREFIX_METHODS = (
    "child",
    "find",
    "listdir",
    "scan",
    "delete_prefix",
    "list_multipart",
    "remove_empty_dirs",
)
_UPLOAD_METHODS = ("put_part", "complete_multipart", "abort_multipart")


def _guarded(fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """``fn`` with its first argument checked by ``ckptstore.engine.paths``."""
    if getattr(fn, "_ckptstore_guarded", False):
        return fn

    if kind == "name":

        @functools.wraps(fn)
        def wrapper(self: Store, path: str, *args: Any, **kwargs: Any) -> Any:
            return fn(self, check_name(path, self.url), *args, **kwargs)

    elif kind == "prefix":

        @functools.wraps(fn)
        def wrapper(self: Store, prefix: str = "", *args: Any, **kwargs: Any) -> Any:
            return fn(self, check_prefix(prefix, self.url), *args, **kwargs)

    elif kind == "names":

        @functools.wraps(fn)
        def wrapper(self: Store, paths: Iterable[str], *args: Any, **kwargs: Any) -> Any:
            return fn(self, [check_name(p, self.url) for p in paths], *args, **kwargs)

    else:

        @functools.wraps(fn)
        def wrapper(self: Store, upload: Multipart, *args: Any, **kwargs: Any) -> Any:
            check_name(upload.path, self.url)
            return fn(self, upload, *args, **kwargs)

    wrapper._ckptstore_guarded = True  # type: ignore[attr-defined]
    return wrapper


def _guard_class(cls: type) -> None:
    groups = (
        (_NAME_METHODS + _NAME_METHODS_MP, "name"),
        (_PREFIX_METHODS, "prefix"),
        (_UPLOAD_METHODS, "upload"),
        (("delete_many",), "names"),
    )
    for names, kind in groups:
        for name in names:
            fn = cls.__dict__.get(name)
            if fn is not None and callable(fn):
                setattr(cls, name, _guarded(fn, kind))


def join_path(*parts: str) -> str:
    """Join relative store paths with '/', ignoring empty pieces."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


class Store(abc.ABC):
    """A storage backend rooted at ``url``. See the module docstring for the call order."""

    #: Most parts one multipart upload may have.
    max_parts: int = 10_000
    #: Smallest size of any part but the last.
    min_part_size: int = 1
    #: Whether ``put_if_absent`` is a true server-side create-only write.
    atomic_create: bool = True
    #: Whether ``list_multipart`` can see unfinished uploads (Azure's uncommitted blocks
    #: cannot be listed; the service expires them itself).
    lists_uploads: bool = True
    #: Whether parts of any size, many of them, cost nothing extra (a file's ``pwrite``s,
    #: not requests): the engine then sends large writes as parts of their own, straight
    #: from the caller's memory, instead of copying them into part buffers.
    zero_copy_parts: bool = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _guard_class(cls)  # containment for every store: see the module docstring

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def describe(self, path: str = "") -> str:
        """The full URL of ``path``, for messages."""
        return f"{self.url}/{path}" if path else self.url

    @abc.abstractmethod
    def child(self, prefix: str) -> Store:
        """A store of the same kind rooted at ``prefix`` below this one."""

    # -- whole objects -----------------------------------------------------------------
    @abc.abstractmethod
    def put(self, path: str, data: Buffer) -> None:
        """Write a whole object atomically (replacing any old one); durable on return."""

    @abc.abstractmethod
    def put_if_absent(self, path: str, data: Buffer) -> None:
        """Create ``path`` only if it does not exist; else raise ``CommitConflictError``."""

    @abc.abstractmethod
    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of an object (``end=None``: to its end)."""

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        """Read up to ``len(buf)`` bytes at ``start`` into ``buf``; returns how many were read.

        Stores that can read straight into caller memory (``preadv`` on volumes) override it.
        """
        data = self.get(path, start, start + len(buf))
        buf[: len(data)] = data
        return len(data)

    @abc.abstractmethod
    def size(self, path: str) -> int:
        """Size in bytes; ``StoreNotFoundError`` if it does not exist."""

    def exists(self, path: str) -> bool:
        from ckptstore.errors import StoreNotFoundError

        try:
            self.size(path)
        except StoreNotFoundError:
            return False
        return True

    @abc.abstractmethod
    def find(self, prefix: str = "") -> list[str]:
        """Every object path under ``prefix`` (recursive), relative to the root, sorted.

        Listing is for discovery only; completeness is never decided by it.
        """

    @abc.abstractmethod
    def listdir(self, prefix: str = "") -> list[str]:
        """Names of the immediate children (objects and 'directories') of ``prefix``, sorted."""

    def scan(self, prefix: str = "") -> list[Entry]:
        """The immediate children of ``prefix`` with their kind, sorted by name.

        Never follows a symlink. This default tells objects from prefixes with one
        ``exists`` per name; stores override it with what their listing already says.
        """
        out = []
        for name in self.listdir(prefix):
            path = join_path(prefix, name)
            is_file = self.exists(path)
            out.append(Entry(name, "file" if is_file else "dir"))
            if is_file and self.find(path) != [path]:
                out.append(Entry(name, "dir"))  # an object and a prefix of the same name
        return sorted(out, key=lambda e: (e.name, e.kind))

    @abc.abstractmethod
    def delete(self, path: str) -> None:
        """Delete one object; a missing one is not an error."""

    def delete_many(self, paths: Iterable[str]) -> None:
        """Delete each of ``paths`` (stores may do it in bulk); missing ones are no error."""
        for path in paths:
            self.delete(path)

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under ``prefix`` (stores may do it in bulk).

        A primitive for the store's own use and for directories ckptstore owns entirely;
        checkpoint roots are pruned by ``ckptstore.engine.deletion``, which deletes only
        ckptstore's files.
        """
        self.delete_many(self.find(prefix))

    def remove_empty_dirs(self, prefix: str = "") -> None:  # noqa: B027 - most stores: none
        """Remove ``prefix`` and the directories below it that hold nothing (deepest first).

        Never deletes an object, and never a directory that still holds anything. Object
        stores without directories have nothing to do.
        """

    # -- multipart ---------------------------------------------------------------------
    @abc.abstractmethod
    def begin_multipart(self, path: str) -> Multipart:
        """Start a multipart upload of ``path``; nothing is visible until complete."""

    @abc.abstractmethod
    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        """Upload part ``number`` (1-based) holding the bytes at ``offset`` of the object."""

    @abc.abstractmethod
    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        """Make the object visible, whole and durable, from ``parts`` (sorted by number)."""

    @abc.abstractmethod
    def abort_multipart(self, upload: Multipart) -> None:
        """Discard an upload and everything it stored; idempotent."""

    @abc.abstractmethod
    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        """Uploads begun under ``prefix`` and neither completed nor aborted (for cleanup).

        Where the store knows it, ``extra["initiated"]`` is when the upload began (or was
        last written to), in seconds since the epoch; ``engine.deletion`` ages uploads by it.
        """

    def close(self) -> None:  # noqa: B027 - most stores hold nothing to release
        """Release clients and connections."""


_guard_class(Store)  # the base class's own default methods (exists, delete_prefix, ...)
