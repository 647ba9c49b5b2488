"""The generic store: any URL fsspec knows (memory://, sftp://, hdfs://, ...), correct if slow.

It uses only fsspec's common file-system API, so it cannot use a backend's native parallel
upload. Multipart writes are emulated: each part is written as its own hidden object, and
``complete_multipart`` concatenates them into the final object and removes them::

    up = store.begin_multipart("a/b.bin")   # writes a/.ckptstore-mpu.<id>.b.bin/meta.json
    store.put_part(up, n, offset, data)      # writes   a/.ckptstore-mpu.<id>.b.bin/p00000n
    store.complete_multipart(up, parts)      # streams the parts into a/b.bin, then deletes
    store.abort_multipart(up)                #   the hidden directory (abort only deletes)

Hidden upload directories never show in ``find``/``listdir``; ``list_multipart`` finds them
(for stale-upload aborts). The final object is written through ``fs.open(path, "wb")``:
whether a reader can see it half-written depends on the backend (object stores make it visible on
close; a plain file system does not).

``put_if_absent`` is best effort: exact between threads of one process (a lock), a
check-then-write between processes, with a ``NonAtomicCreateWarning``.
"""

from __future__ import annotations

import contextlib
import errno
import json
import time
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine.create_only import create_lock, same_bytes, warn_non_atomic
from ckptstore.engine.store import Buffer, Entry, Multipart, Part, Store, join_path
from ckptstore.errors import (
    CkptStoreError,
    CommitConflictError,
    ConfigError,
    CorruptCheckpointError,
    MissingDependencyError,
    StorageFullError,
    StoreAccessError,
    StoreNotFoundError,
    TransientStoreError,
)
from ckptstore.stores.storage_options import rejected_by_client, rejected_error

__all__ = ["FsspecStore", "MPU_MARK"]

#: Hidden upload directories are named ``<MPU_MARK><upload id>.<object name>``.
MPU_MARK = ".ckptstore-mpu."
_META = "meta.json"


@contextlib.contextmanager
def _errors(what: str) -> Iterator[None]:
    """Translate a backend's builtin exceptions into ckptstore errors."""
    try:
        yield
    except CkptStoreError:
        raise
    except FileNotFoundError as exc:
        raise StoreNotFoundError(f"{what}: not found ({exc})") from exc
    except PermissionError as exc:
        raise StoreAccessError(f"{what}: permission denied ({exc}); check credentials") from exc
    except (ConnectionError, TimeoutError) as exc:
        raise TransientStoreError(f"{what}: {type(exc).__name__}: {exc}") from exc
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        if rejected_by_client(exc):  # e.g. aiohttp: "unexpected keyword argument 'x'"
            raise rejected_error(what, exc, {}) from exc
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StorageFullError(f"{what}: out of space; free space and retry") from exc
        raise


def _url_to_fs(url: str, options: dict[str, Any]) -> tuple[Any, str]:
    """fsspec's filesystem for ``url``; a backend's missing package is a
    ``MissingDependencyError``, options it rejects a ``ConfigError``."""
    import fsspec

    try:
        return fsspec.core.url_to_fs(url, **options)  # type: ignore[no-any-return]
    except ImportError as exc:  # fsspec: 'SFTPFileSystem requires "paramiko" to be installed'
        scheme = url.partition("://")[0]
        raise MissingDependencyError(
            f"the fsspec backend for {scheme}:// needs a package that is not installed "
            f"({exc}); install it (pip install it into this environment) or use another URL"
        ) from exc
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        if options and rejected_by_client(exc):
            raise rejected_error(url, exc, options) from exc
        raise


def _hidden(rel: str) -> bool:
    return any(seg.startswith(MPU_MARK) for seg in rel.split("/"))


class FsspecStore(Store):
    """A store rooted at any fsspec URL. See the module docstring."""

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryConfig | None = None,
        fs: Any = None,
        root: str | None = None,
    ) -> None:
        super().__init__(url, storage_options, retry=retry)
        if fs is None:
            fs, root = _url_to_fs(url, self.storage_options)
        self.fs = fs
        self.root = (root or "").rstrip("/")

    def child(self, prefix: str) -> FsspecStore:
        return FsspecStore(
            f"{self.url}/{prefix.strip('/')}",
            self.storage_options,
            retry=self.retry,
            fs=self.fs,
            root=self._full(prefix),
        )

    def _full(self, path: str) -> str:
        path = path.strip("/")
        return f"{self.root}/{path}" if path else self.root or "/"

    def _rel(self, full: str) -> str:
        full = self.fs._strip_protocol(full).rstrip("/")
        if self.root and full.startswith(self.root):
            full = full[len(self.root) :]
        return full.strip("/")

    def _upload_dir(self, upload: Multipart) -> str:
        head, _, name = upload.path.strip("/").rpartition("/")
        return self._full(join_path(head, f"{MPU_MARK}{upload.upload_id}.{name}"))

    def _write(self, full: str, data: Buffer, create: bool = False) -> None:
        parent = full.rpartition("/")[0]
        if parent:
            with contextlib.suppress(OSError, NotImplementedError):
                self.fs.makedirs(parent, exist_ok=True)
        body = bytes(data)
        if create:
            try:
                self.fs.pipe_file(full, body, mode="create")
                return
            except TypeError:  # an older backend without create mode
                pass
        self.fs.pipe_file(full, body)

    # -- whole objects -----------------------------------------------------------------
    def put(self, path: str, data: Buffer) -> None:
        with _errors(f"write of {self.describe(path)}"):
            self._write(self._full(path), data)

    def put_if_absent(self, path: str, data: Buffer) -> None:
        warn_non_atomic(f"{self.url.split('://')[0]}://", "fsspec has no create-only write")
        conflict = CommitConflictError(
            f"{self.describe(path)} already exists: another writer committed first"
        )
        with create_lock(self.describe(path)), _errors(f"create of {self.describe(path)}"):
            if self.exists(path):
                # A retry of our own write whose first response was lost holds our bytes.
                if same_bytes(lambda: self.get(path), data):
                    return
                raise conflict
            try:
                self._write(self._full(path), data, create=True)
            except FileExistsError:
                raise conflict from None

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        with _errors(f"read of {self.describe(path)}"):
            if end is not None and end <= start:
                self.size(path)
                return b""
            return bytes(self.fs.cat_file(self._full(path), start=start, end=end))

    def size(self, path: str) -> int:
        with _errors(f"stat of {self.describe(path)}"):
            info = self.fs.info(self._full(path))
        if info.get("type") != "file":
            raise StoreNotFoundError(f"{self.describe(path)} is not a file")
        return int(info["size"])

    def _find_all(self, prefix: str) -> list[str]:
        """Every file under ``prefix``, hidden upload parts included, relative to the root."""
        with _errors(f"listing of {self.describe(prefix)}"):
            try:
                found = self.fs.find(self._full(prefix))
            except FileNotFoundError:
                return []
        return sorted(self._rel(p) for p in found)

    def find(self, prefix: str = "") -> list[str]:
        return [p for p in self._find_all(prefix) if not _hidden(p)]

    def listdir(self, prefix: str = "") -> list[str]:
        with _errors(f"listing of {self.describe(prefix)}"):
            try:
                entries = self.fs.ls(self._full(prefix), detail=False)
            except FileNotFoundError:
                return []
        names = {self._rel(e).rpartition("/")[2] for e in entries}
        return sorted(n for n in names if n and not n.startswith(MPU_MARK))

    def scan(self, prefix: str = "") -> list[Entry]:
        with _errors(f"listing of {self.describe(prefix)}"):
            try:
                entries = self.fs.ls(self._full(prefix), detail=True)
            except FileNotFoundError:
                return []
        out = set()
        for info in entries:
            name = self._rel(info["name"]).rpartition("/")[2]
            if not name or name.startswith(MPU_MARK):
                continue
            kind = {"file": "file", "directory": "dir"}.get(info.get("type"), "other")
            out.add(Entry(name, "link" if info.get("islink") else kind))
        return sorted(out, key=lambda e: (e.name, e.kind))

    def copy(self, src: str, dst: str) -> None:
        """The file system's own ``copy`` (server-side where its backend has one: s3fs,
        gcsfs, adlfs ...); the size that landed must be the source's."""
        what = f"copy of {self.describe(src)} to {dst}"
        size = self.size(src)
        with _errors(what):
            try:
                self.fs.copy(self._full(src), self._full(dst))
            except NotImplementedError as exc:
                raise ConfigError(f"{what}: {type(self.fs).__name__} cannot copy") from exc
        if self.size(dst) != size:
            self.delete(dst)
            raise CorruptCheckpointError(f"{what}: the copy is not {size} bytes; it was deleted")

    def delete(self, path: str) -> None:
        with _errors(f"delete of {self.describe(path)}"):
            try:
                self.fs.rm_file(self._full(path))
            except FileNotFoundError:
                return

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under ``prefix``, then the directories it leaves empty."""
        super().delete_prefix(prefix)
        self.remove_empty_dirs(prefix)

    def remove_empty_dirs(self, prefix: str = "") -> None:
        """Backends with (pseudo-)directories (memory://, sftp://, hdfs://) keep an emptied
        directory listed until it is removed. ``rmdir`` refuses one that still holds
        anything (an upload in flight); a top-level bucket or container is never removed.
        """
        top = self.fs._strip_protocol(self._full(prefix)).rstrip("/")
        if "/" not in top.strip("/"):
            return
        try:
            found = self.fs.find(top, withdirs=True, detail=True)
        except Exception:  # noqa: BLE001 - nothing left to list, or no directories at all
            found = {}
        dirs = {p.rstrip("/") for p, info in found.items() if info.get("type") == "directory"}
        dirs.add(top)
        for d in sorted(dirs, key=lambda p: p.count("/"), reverse=True):
            try:
                self.fs.rmdir(d)
            except Exception:  # noqa: BLE001 - not empty, already gone, or not supported
                pass

    # -- multipart: hidden part objects, concatenated on complete -----------------------
    def begin_multipart(self, path: str) -> Multipart:
        initiated = time.time()
        upload = Multipart(path.strip("/"), uuid.uuid4().hex, extra={"initiated": initiated})
        meta = json.dumps({"path": upload.path, "initiated": initiated}).encode()
        with _errors(f"upload of {self.describe(path)}"):
            self._write(f"{self._upload_dir(upload)}/{_META}", meta)
        return upload

    def _part_path(self, upload: Multipart, number: int) -> str:
        return f"{self._upload_dir(upload)}/p{number:06d}"

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        what = f"upload of {self.describe(upload.path)} (part {number})"
        with _errors(what):
            if not self.fs.exists(f"{self._upload_dir(upload)}/{_META}"):
                raise StoreNotFoundError(f"{what}: the upload was aborted or completed")
            self._write(self._part_path(upload, number), data)
        return Part(number, offset, len(data))

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        what = f"upload of {self.describe(upload.path)}"
        total = sum(p.size for p in parts)
        ordered = sorted(parts, key=lambda p: p.number)
        with _errors(what):
            if not self.fs.exists(f"{self._upload_dir(upload)}/{_META}"):
                # A retry after a lost response: done if the object is whole.
                if self.exists(upload.path) and self.size(upload.path) == total:
                    return
                raise StoreNotFoundError(f"{what}: the upload was aborted or completed")
            for p in ordered:
                got = self.fs.size(self._part_path(upload, p.number))
                if got != p.size:
                    raise StoreNotFoundError(
                        f"{what}: part {p.number} holds {got} bytes, not {p.size}"
                    )
            final = self._full(upload.path)
            with self.fs.open(final, "wb") as out:
                for p in ordered:
                    out.write(self.fs.cat_file(self._part_path(upload, p.number)))
        self.abort_multipart(upload)

    def abort_multipart(self, upload: Multipart) -> None:
        with _errors(f"abort of upload of {self.describe(upload.path)}"):
            try:
                self.fs.rm(self._upload_dir(upload), recursive=True)
            except FileNotFoundError:
                return

    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        out = []
        for rel in self._find_all(prefix):
            head, _, name = rel.rpartition("/")
            parent, _, updir = head.rpartition("/")
            if name != _META or not updir.startswith(MPU_MARK):
                continue
            upload_id, _, obj = updir[len(MPU_MARK) :].partition(".")
            extra: dict[str, Any] = {}
            try:
                meta = json.loads(self.get(rel))
                extra["initiated"] = float(meta["initiated"])
            except (CkptStoreError, ValueError, KeyError):
                pass  # completed or aborted meanwhile, or damaged: age unknown
            out.append(Multipart(join_path(parent, obj), upload_id, extra=extra))
        return out
