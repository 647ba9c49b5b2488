"""The store contract: the one small interface every storage backend implements.

A ``Store`` is rooted at one URL; every path it takes is relative to that root and
'/'-separated. A new store needs five primitives (``put``, ``get``, ``size``, ``find``,
``delete``); everything else has a correct default here that a store overrides with its
native path (conditional create, parallel multipart, bulk delete, listings). The contract
(construction, who calls what in which order, threads, idempotency, pickling, ranges,
errors, path containment) is :class:`Store`'s docstring.

It lives in ``engine/``, not ``stores/``: the engine calls it and depends on the contract
alone, never on a store (the layer rule puts ``stores`` above ``engine``).
"""

from __future__ import annotations

import abc
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine import create_only, emulated
from ckptstore.engine.paths import guard_class
from ckptstore.errors import ConfigError, StoreNotFoundError
from ckptstore.redact import remember

__all__ = ["Store", "Capabilities", "Multipart", "Part", "Entry", "Buffer", "join_path"]

Buffer = bytes | bytearray | memoryview


@dataclass(frozen=True)
class Capabilities:
    """What the transfer engine plans a store's writes by.

    ``max_parts``: most parts one multipart upload may have. ``min_part_size``: smallest
    size of any part but the last. ``zero_copy_parts``: parts of any size, many of them,
    cost nothing extra (a file's ``pwrite``s, not requests), so the engine sends large
    writes as parts of their own, straight from the caller's memory, instead of copying
    them into part buffers. ``gather_parts``: ``put_part_buffers`` sends a part given as
    several buffers without joining them, so the engine builds parts of the usual size
    from the caller's memory and small buffers (``ckptstore.engine.parts``) instead of
    copying every byte into part buffers. ``direct_alignment``: a part whose memory
    address agrees with its file offset modulo this is written straight from that memory
    (a volume's direct I/O), otherwise copied first; 0 where nothing is written so (the
    engine then never pads a file for it: ``FileWriter.align``).
    """

    max_parts: int = 10_000
    min_part_size: int = 1
    zero_copy_parts: bool = False
    gather_parts: bool = False
    direct_alignment: int = 0

    def __post_init__(self) -> None:
        for name in ("max_parts", "min_part_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"Capabilities.{name} must be a whole number >= 1, got {value!r}")
        a = self.direct_alignment
        if isinstance(a, bool) or not isinstance(a, int) or a < 0 or a & (a - 1):
            raise ConfigError(
                f"Capabilities.direct_alignment must be 0 or a power of two, got {a!r}"
            )


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


def join_path(*parts: str) -> str:
    """Join relative store paths with '/', ignoring empty ones."""
    return "/".join(p.strip("/") for p in parts if p and p.strip("/"))


#: Store methods that were renamed: old name -> new name. A store that still overrides the
#: old name has it taken as the new one, with a ``DeprecationWarning`` (until ckptstore 0.2).
RENAMED_METHODS = {"put_part_pieces": "put_part_buffers"}


def _adopt_renamed(cls: type) -> None:
    """A subclass's override of a renamed method serves under the new name (deprecated)."""
    for old, new in RENAMED_METHODS.items():
        if old in vars(cls) and new not in vars(cls):
            warnings.warn(
                f"{cls.__qualname__}.{old} is deprecated and goes in ckptstore 0.2: "
                f"rename it {new} (same arguments)",
                DeprecationWarning,
                stacklevel=3,
            )
            setattr(cls, new, vars(cls)[old])


class Store(abc.ABC):
    """A storage backend rooted at ``url``: the contract every store implements.

    Construction (``ckptstore.stores.open_store`` builds every store the same way)::

        Class(url: str, storage_options: dict | None = None, *, retry: RetryConfig | None = None)

    ``url`` is the full URL of the root (``s3://bucket/prefix``, ``/mnt/ckpt``); ``store.url``
    afterwards is its canonical form. ``storage_options`` are the client's (fsspec-style:
    credentials, endpoint); ``retry.request_timeout_s`` bounds each request. Bad URLs or
    options raise ``ConfigError``, a missing client library ``MissingDependencyError``. Extra
    keyword arguments of a store's own (S3's ``checksum``) must have defaults.

    Who calls what, in which order:

    - Data (``ckptstore.engine.transfer``, from its thread pool, many calls at once on one
      instance and its children): ``put`` for small files; for large ones::

          up = store.begin_multipart(path)
          part = store.put_part(up, number, offset, data)  # any order, concurrently; 1..N
          store.complete_multipart(up, parts)              # the object appears whole, durable
          # or, on any failure:
          store.abort_multipart(up)                        # nothing visible, nothing left

      and ``get_into`` / ``get`` for reads. Part sizes follow ``capabilities``; on a store
      with ``capabilities.gather_parts`` a part comes as several buffers
      (``put_part_buffers``) instead of one.
    - Commit (``ckptstore.engine.commit``, the coordinator): ``put`` of the manifest and
      ``.metadata``, then ``put_if_absent`` of ``COMMITTED``; ``get`` / ``exists`` to open one.
    - Server-side ``copy`` (a rename on an object store: ``ckptstore_tc``), from any thread.
    - Listing, verification and deletion (``engine.catalog``, ``engine.verify``,
      ``engine.deletion``, through ``engine.retry.RetryingStore``): ``scan``, ``find``,
      ``listdir``, ``size``, ``delete``, ``delete_many``, ``remove_empty_dirs``,
      ``list_multipart``, ``abort_multipart``; ``child`` roots a store at one step directory.
    - ``close`` once, by whoever opened the store, when it is done.

    Threads: every method may run on many threads at once, on one instance and on its
    children (which may share a client): a store must be thread-safe.

    Idempotency: the engine retries ``TransientStoreError``, and a request whose response
    was lost may have been applied. So repeating a call must be harmless: ``put`` and
    ``put_part`` replace what the first try wrote; ``complete_multipart`` of an upload the
    server already completed succeeds when the object is whole; ``abort_multipart`` of an
    aborted or completed upload and ``delete`` of a missing name are not errors;
    ``put_if_absent`` that finds exactly its own bytes is a success, not a conflict.

    Pickling: stores cross into other processes (``dcp.async_save``'s process executor). A
    store opened from a URL travels as ``store.url`` and is re-made there with
    ``open_store(store.url, storage_options, retry=...)``, so ``store.url`` must name the same
    root. A ``Store`` object a caller built travels as itself: it must pickle, sending its
    settings and rebuilding clients, locks and pools on the other side (``__getstate__``).

    Ranges: ``get(path, start, end)`` returns bytes ``[start, end)`` clipped to the object:
    an ``end`` past its size reads to its end; ``start`` at or past the end, or
    ``end <= start``, gives ``b""``. ``get_into(path, start, buf)`` reads
    ``min(len(buf), size - start)`` bytes (0 past the end) and never writes beyond them. A
    missing object raises ``StoreNotFoundError`` even for an empty range.

    Raises (ckptstore errors only; anything else escaping is a bug in the store):
    ``StoreNotFoundError`` (no such object, bucket or upload), ``StoreAccessError``
    (credentials, permissions, a refused request: not retried), ``TransientStoreError``
    (throttling, 5xx, resets, timeouts: the engine retries only this), ``StorageFullError``
    (no space, quota), ``DurabilityError`` (an fsync failed: never retried),
    ``CommitConflictError`` (``put_if_absent`` lost), ``UnsafePathError`` (containment).

    Containment: every path-taking method of every subclass is wrapped when the class is
    defined (``engine.paths.guard_class``), so its path, prefix or ``Multipart.path`` is checked by
    ``ckptstore.engine.paths`` before the store's own code runs: an absolute name, a ``..``
    segment, NUL or backslash raises ``UnsafePathError`` and nothing is read, written or
    deleted. Stores with links of their own (volumes) also refuse to follow a symlink below
    the root, and never list one as a file or directory (``scan`` reports it as ``"link"``).
    """

    #: How the engine plans this store's writes; a store sets its own (a class attribute,
    #: or built in ``__init__`` when it depends on the instance).
    capabilities: Capabilities = Capabilities()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _adopt_renamed(cls)
        guard_class(cls)  # containment for every store: see the class docstring

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryConfig | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.storage_options = dict(storage_options or {})
        remember(self.storage_options)  # no message shows its credentials, named or not
        self.retry = retry or RetryConfig()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def describe(self, path: str = "") -> str:
        """The full URL of ``path``, for messages."""
        return f"{self.url}/{path}" if path else self.url

    def child(self, prefix: str) -> Store:
        """A store of the same kind rooted at ``prefix`` below this one.

        Default: built with the constructor contract from this store's URL, options and
        retry settings. Stores whose children should share a client override it.
        """
        url = f"{self.url}/{prefix}" if prefix else self.url
        return type(self)(url, self.storage_options, retry=self.retry)  # type: ignore[call-arg]

    # -- whole objects -----------------------------------------------------------------
    @abc.abstractmethod
    def put(self, path: str, data: Buffer) -> None:
        """Write a whole object atomically (replacing any old one); durable on return.

        A reader never sees part of it. Repeating it (after a lost response) is harmless.
        """

    def put_many(self, items: Sequence[tuple[str, Buffer]]) -> None:
        """``put`` each ``(path, data)`` of ``items``, in order; all durable on return.

        Each object is whole whenever it is visible; if this raises, any of them may or may
        not have been written. Stores may batch the work (a volume fsyncs each directory
        once for all of them). Repeating it is harmless. Default: one ``put`` after another.
        """
        for path, data in items:
            self.put(path, data)

    def put_if_absent(self, path: str, data: Buffer) -> None:
        """Create ``path`` only if it does not exist; else raise ``CommitConflictError``.

        The commit primitive: of several racing writers exactly one succeeds. A retry that
        finds exactly its own bytes there succeeds. Default: a check-then-write, exact
        between threads of one process and best effort between processes, with a
        ``NonAtomicCreateWarning``; a store with a server-side create-only write overrides it.
        """
        create_only.check_then_put(
            self, path, data, f"{type(self).__name__} has no create-only write"
        )

    @abc.abstractmethod
    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of an object (``end=None``: to its end), clipped to it
        (class docstring); ``StoreNotFoundError`` if it does not exist."""

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        """Read up to ``len(buf)`` bytes at ``start`` into ``buf``; returns how many were read.

        Clipped like ``get``. Stores that can read straight into caller memory (``preadv``
        on volumes) override this default, which copies one ``get``.
        """
        data = self.get(path, start, start + len(buf))
        buf[: len(data)] = data
        return len(data)

    @abc.abstractmethod
    def size(self, path: str) -> int:
        """Size in bytes; ``StoreNotFoundError`` if it does not exist (or is not an object)."""

    def exists(self, path: str) -> bool:
        """Whether ``path`` is an object (a 'directory' is not)."""
        try:
            self.size(path)
        except StoreNotFoundError:
            return False
        return True

    # -- listings ----------------------------------------------------------------------
    @abc.abstractmethod
    def find(self, prefix: str = "") -> list[str]:
        """Every object path under ``prefix`` (recursive), relative to the root, sorted.

        ``prefix`` is a directory: ``find("step_1")`` lists ``step_1/x``, not ``step_10/y``;
        a prefix naming an object lists that object. A missing prefix lists nothing.
        Listing is for discovery only; completeness is never decided by it.
        """

    def find_sizes(self, prefix: str = "") -> dict[str, int] | None:
        """``{path: size}`` of what ``find(prefix)`` lists, where the listing carries sizes.

        For callers that need every size (the data layer's shard listing): one listing
        instead of a ``size`` call per object. Default None: this store's listing has no
        sizes; call ``find`` and ``size``.
        """
        return None

    def listdir(self, prefix: str = "") -> list[str]:
        """Names of the immediate children (objects and 'directories') of ``prefix``, sorted.

        Default: the names ``scan`` reports.
        """
        return sorted({e.name for e in self.scan(prefix)})

    def scan(self, prefix: str = "") -> list[Entry]:
        """The immediate children of ``prefix`` with their kind, sorted by (name, kind).

        Never follows a symlink. Default: derived from ``find`` (so an empty directory is
        not listed); stores override it with what their listing already says.
        """
        head = f"{prefix}/" if prefix else ""
        out: set[Entry] = set()
        for path in self.find(prefix):
            if not path.startswith(head):
                continue  # ``prefix`` names an object: it has no children
            name, sep, _ = path[len(head) :].partition("/")
            out.add(Entry(name, "dir" if sep else "file"))
        return sorted(out, key=lambda e: (e.name, e.kind))

    def copy(self, src: str, dst: str) -> None:
        """Copy object ``src`` to ``dst`` on the server: its bytes never pass through this
        process. Replaces any ``dst``; a reader sees the old ``dst`` or the whole copy.

        Checked before it returns: the size that landed, and the checksum the server reports
        for the copied bytes where it reports one (each store's ``copy`` says which); a
        mismatch raises ``CorruptCheckpointError`` and leaves no copy at ``dst``. A missing
        ``src`` raises ``StoreNotFoundError``. Repeating it is harmless. Default:
        ``ConfigError`` (this store has no server-side copy; a caller that must not move the
        bytes through the client, a rename on an object store, stops there).
        """
        raise ConfigError(
            f"{type(self).__name__} ({self.url}) has no server-side copy, so {src!r} cannot "
            f"be copied to {dst!r} without downloading it; use s3://, gs://, az:// "
            "or an fsspec URL whose file system copies on the server"
        )

    # -- deletion ----------------------------------------------------------------------
    @abc.abstractmethod
    def delete(self, path: str) -> None:
        """Delete one object; a missing one is not an error. Never follows a link."""

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
        stores without directories have nothing to do (this default).
        """

    # -- multipart (default: emulated on the primitives, see ``engine.emulated``) --------
    def begin_multipart(self, path: str) -> Multipart:
        """Start a multipart upload of ``path``; nothing is visible under ``path`` until
        complete. Default: a begin marker beside it, named with ``names.TMP_MARK``."""
        return emulated.begin(self, path)

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        """Upload part ``number`` (1-based) holding the bytes at ``offset`` of the object.

        Parts arrive in any order, concurrently. Repeating one replaces it. An aborted or
        completed upload raises ``StoreNotFoundError``. Default: one temp object per part.
        """
        return emulated.put_part(self, upload, number, offset, data)

    def put_part_buffers(
        self,
        upload: Multipart,
        number: int,
        offset: int,
        buffers: Sequence[Buffer],
        *,
        crc32c: int | None = None,
    ) -> Part:
        """``put_part`` of the concatenation of ``buffers`` (the engine calls it on a store
        with ``capabilities.gather_parts``). ``crc32c``: their CRC32C, computed by the
        engine as it built the part, for a store that sends a checksum of every part (so
        it need not hash the bytes again). Default: the buffers joined (one copy), then
        ``put_part``; a store whose client can send several buffers as one body overrides
        it and sends them as they are. Repeating it resends the same bytes."""
        return self.put_part(upload, number, offset, bytearray().join(buffers))

    def put_part_pieces(
        self,
        upload: Multipart,
        number: int,
        offset: int,
        pieces: Sequence[Buffer],
        *,
        crc32c: int | None = None,
    ) -> Part:
        """Deprecated (ckptstore 0.2 removes it): ``put_part_buffers``."""
        warnings.warn(
            "Store.put_part_pieces is deprecated and goes in ckptstore 0.2: call put_part_buffers",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.put_part_buffers(upload, number, offset, pieces, crc32c=crc32c)

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        """Make the object visible, whole and durable, from ``parts`` (sorted by number).

        A retry after a lost response, the upload gone and the object whole, succeeds.
        Default: one ``put`` of the parts' concatenation, then their temp objects go.
        """
        emulated.complete(self, upload, parts)

    def abort_multipart(self, upload: Multipart) -> None:
        """Discard an upload and everything it stored; idempotent."""
        emulated.abort(self, upload)

    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        """Uploads begun under ``prefix`` and neither completed nor aborted (for cleanup).

        Where the store knows it, ``extra["initiated"]`` is when the upload began (or was
        last written to), in seconds since the epoch; ``engine.deletion`` ages uploads by it.
        """
        return emulated.list_uploads(self, prefix)

    def close(self) -> None:  # noqa: B027 - most stores hold nothing to release
        """Release clients and connections."""


guard_class(Store)  # the base class's own default methods (exists, delete_prefix, ...)
