"""``CkptStoreStorage``: torch_checkpointing's ``Storage`` on ckptstore's stores and engine.

Select it with one line, anywhere torch_checkpointing takes a ``StorageConfig``::

    CheckpointManager.Config(storage_config=CkptStoreStorageConfig("s3://bucket/run1"))

A path torch_checkpointing passes lies under ``mount`` (default ``/`` for an object store,
the root itself for a volume) and names ``url``/<the path below mount>: ``/ckpt/step_1/x``
is ``s3://bucket/run1/ckpt/step_1/x``. A path outside ``mount``, a ``..`` escape or a
symlink below a volume root is refused (``UnsafePathError``): on a volume every path is
resolved from the root's descriptor (``ckptstore.stores.Anchor``), never checked and then
used as a string, so a directory swapped for a link meanwhile is refused by the act.
Writes go through the transfer engine, reads are parallel ranged GETs (``_streams``),
renames follow torch_checkpointing's commit table (``_rename``: server-side copies on
object stores). Object stores have no directories: ``mkdir`` does nothing there, a
directory exists while it holds a file, and a write needs no parent directory; on a volume
they are real.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ckptstore import RetryConfig, TransferConfig, TransferEngine, open_store
from ckptstore.errors import (
    CorruptCheckpointError,
    StoreNotFoundError,
    UnsafePathError,
    missing_dependency,
)
from ckptstore.errors import require_version as _require_version
from ckptstore.stores import Anchor, split_url

from ._versions import EXTRA, SUPPORTED

try:
    from torch_checkpointing.storage.base_storage import ReadArgs, Storage, StorageConfig
except ImportError as exc:  # pragma: no cover - exercised in a test with it hidden
    raise missing_dependency("torch_checkpointing", EXTRA) from exc
for _name, _spec in SUPPORTED.items():
    _require_version(_name, _spec, EXTRA)

from ._rename import has_children, rename_objects, rename_volume  # noqa: E402 - after the version check
from ._streams import MemoryReader, RangedReader, WriteStream  # noqa: E402

__all__ = ["CkptStoreStorageConfig", "CkptStoreStorage", "MissingParentError"]


class MissingParentError(StoreNotFoundError, RuntimeError):
    """A write on a volume whose parent directory does not exist. A ``FileNotFoundError``,
    and a ``RuntimeError`` as torch_checkpointing's local backend raises there."""


# Not frozen: torch_checkpointing's ``StorageConfig`` is a plain dataclass, and a frozen
# dataclass cannot derive from one. Treat it as read-only.
@dataclass
class CkptStoreStorageConfig(StorageConfig):
    """Where and how ``CkptStoreStorage`` stores (picklable: its saver process gets it).

    ``url``: the root (a path, ``s3://``, ``gs://``, ``az://``, any fsspec URL).
    ``mount``: the path that stands for the root in torch_checkpointing's paths (module
    docstring). ``storage_options``: the store client's (credentials, endpoint).
    ``transfer``: part size, parallel parts, memory budget and retries.
    """

    url: str
    mount: str | None = None
    storage_options: dict[str, Any] = field(default_factory=dict)
    transfer: TransferConfig = field(default_factory=TransferConfig)

    def create_storage(self) -> CkptStoreStorage:
        """The storage (opens the store)."""
        return CkptStoreStorage(self)


class CkptStoreStorage(Storage):
    """torch_checkpointing's ``Storage`` on a ckptstore store (module docstring).

    Thread-safe: torch_checkpointing writes files from several threads at once.
    """

    def __init__(self, config: CkptStoreStorageConfig) -> None:
        self.config = config
        retry: RetryConfig = config.transfer.retry
        self.store = open_store(config.url, config.storage_options, retry=retry)
        self.engine = TransferEngine.shared(config.transfer)
        scheme, rest = split_url(config.url)
        self._volume = os.path.abspath(rest) if scheme in ("file", "local") else None
        #: Every directory act on a volume goes through it (module docstring).
        self._paths = Anchor(self._volume) if self._volume is not None else None
        mount = config.mount or self._volume or "/"
        self._mount = posixpath.normpath(mount)

    # -- paths -------------------------------------------------------------------------
    def key(self, path: Path | str) -> str:
        """The store name of ``path`` ("" for the root); ``UnsafePathError`` outside it."""
        text = posixpath.normpath(posixpath.join(self._mount, os.fspath(path)))
        if text == self._mount:
            return ""
        head = self._mount.rstrip("/") + "/"
        if not text.startswith(head):
            raise UnsafePathError(
                f"{os.fspath(path)!r} is not under {self._mount!r}, the path that stands for "
                f"{self.store.url}; set CkptStoreStorageConfig(mount=...) to the directory "
                "torch_checkpointing's paths start with"
            )
        return text[len(head) :]

    def _anchor(self) -> Anchor:
        assert self._paths is not None
        return self._paths

    def _lstat(self, key: str) -> os.stat_result | None:
        """What store name ``key`` is on a volume (None: nothing there); a link at any
        component below the root is ``UnsafePathError``, ``key`` itself included."""
        try:
            st = self._anchor().stat(key) if key else os.stat(self._anchor().base)
        except (FileNotFoundError, NotADirectoryError):
            return None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(
                f"{self.store.describe(key)} is a symlink below the root {self._volume}; it "
                "is not followed"
            )
        return st

    def _check_parent(self, path: Path | str) -> None:
        """A write on a volume needs its directory (as torch_checkpointing's local backend
        does). Only a look for the error's sake: the write itself resolves from the root."""
        if self._volume is not None:
            parent = posixpath.dirname(self.key(path))
            st = self._lstat(parent)
            if st is None or not stat.S_ISDIR(st.st_mode):
                raise MissingParentError(
                    errno.ENOENT,
                    f"the directory {self.store.describe(parent)} does not exist; create it "
                    "(mkdir) first",
                )

    def remap_path(self, path: Path) -> str:
        """The full URL of ``path``."""
        return self.store.describe(self.key(path))

    # -- files -------------------------------------------------------------------------
    def stream_write(self, path: Path) -> WriteStream:
        """A streamed write (nothing visible until it closes; an exception aborts it)."""
        return self.get_write_stream(path, None)

    def get_write_stream(self, path: Path, data: object) -> WriteStream:
        """``stream_write`` whose large writes are sent from ``data``'s memory, uncopied
        (leave it unchanged until the stream closes)."""
        self._check_parent(path)
        return WriteStream(self.engine, self.store, self.key(path), owner=data)

    def write(self, path: Path, data: Any) -> None:
        """Write the whole buffer (parallel parts when it is larger than one)."""
        self._check_parent(path)
        self.engine.put(self.store, self.key(path), memoryview(data).cast("B"))

    def stream_read(self, path: Path, read_args: ReadArgs | None = None) -> MemoryReader:
        """The file, read ahead whole (``pre_read_full_file``, the default) or on demand."""
        read_args = read_args or ReadArgs()
        key = self.key(path)
        size = self.engine.retry(lambda: self.store.size(key), f"stat of {self.remap_path(path)}")
        known = read_args.known_size_bytes
        if known is not None and known != size:
            raise CorruptCheckpointError(
                f"{self.remap_path(path)} is {size} bytes, not the {known} expected"
            )
        if not read_args.pre_read_full_file:
            return RangedReader(self.engine, self.store, key, size)
        return MemoryReader(self.engine.read(self.store, key, 0, size))

    def delete(self, path: Path) -> None:
        """Delete a file (``FileNotFoundError`` if there is none)."""
        key = self.key(path)
        if not self.store.exists(key):
            raise StoreNotFoundError(errno.ENOENT, f"{self.remap_path(path)} does not exist")
        self.engine.retry(lambda: self.store.delete(key), f"delete of {self.remap_path(path)}")

    def getsize(self, path: Path) -> int:
        """Size in bytes (``FileNotFoundError`` if there is no such file)."""
        return self.store.size(self.key(path))

    # -- directories -------------------------------------------------------------------
    def mkdir(self, path: Path, recursive: bool = True) -> None:
        """A directory on a volume; nothing on an object store (module docstring)."""
        key = self.key(path)
        if self._volume is not None:
            self._anchor().mkdir(key, parents=recursive)

    def rmdir(self, path: Path) -> None:
        """Remove a directory and everything in it."""
        if self._volume is None:
            self.store.delete_prefix(self.key(path))
            return
        self._anchor().rmtree(self.key(path))

    def ls(self, path: Path) -> list[str]:
        """Names of a directory's children."""
        if self._volume is not None:
            return [name for name, _ in self._anchor().scan(self.key(path))]
        return self.store.listdir(self.key(path))

    def exists(self, path: Path) -> bool:
        """Whether ``path`` is a file or a directory."""
        if self._volume is not None:
            return self._lstat(self.key(path)) is not None
        key = self.key(path)
        return key == "" or self.store.exists(key) or has_children(self.store, key)

    def isdir(self, path: Path) -> bool:
        """Whether ``path`` is a directory (on an object store: holds a file)."""
        if self._volume is not None:
            st = self._lstat(self.key(path))
            return st is not None and stat.S_ISDIR(st.st_mode)
        key = self.key(path)
        return key == "" or has_children(self.store, key)

    def rename(
        self,
        src_path: Path,
        dst_path: Path,
        is_directory: bool = False,
        background_cleanup: bool = False,
    ) -> None:
        """torch_checkpointing's commit table (``ckptstore_tc._rename``)."""
        if self._volume is not None:
            rename_volume(
                self._anchor(), self.key(src_path), self.key(dst_path), self.store.describe
            )
            return
        rename_objects(
            self.store,
            self.engine,
            self.key(src_path),
            self.key(dst_path),
            describe=self.store.describe,
            background_cleanup=background_cleanup,
        )
