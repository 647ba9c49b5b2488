"""The volume store: POSIX, NFS, FUSE mounts.

Reads, listings and deletes are here; how a write is made durable (temp -> fsync ->
rename -> fsync(directory), create-only by ``link()``, multipart parts ``pwrite`` into
one temp file) is ``local_durable``'s.

Symlinks are never followed below the root (the root itself, as given, may be one), and
that is enforced by each act, never by a check before it: every path is resolved from a
descriptor of the root, component by component with ``O_NOFOLLOW`` (``_dirfd.Anchor``),
so a link there -- even one swapped in for a directory while the call runs -- raises
``UnsafePathError``. A child store (``child("step_000000001")``) resolves from the root it
came from, so a step directory replaced by a link is refused too. ``find`` lists regular
files only and never descends into a linked directory; ``scan`` reports links as
``"link"``. Only regular files are read: a FIFO, socket or device is ``UnsafePathError``
at once, never a read that waits.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine.create_only import same_bytes
from ckptstore.engine.names import TMP_MARK
from ckptstore.engine.store import Buffer, Capabilities, Entry, Multipart, Part, Store, join_path
from ckptstore.errors import CommitConflictError, ConfigError, StoreNotFoundError, UnsafePathError
from ckptstore.stores import _direct, local_durable
from ckptstore.stores._dirfd import Anchor
from ckptstore.stores._posix import translate

__all__ = ["LocalStore", "TMP_MARK", "local_path"]

_TMP_ID = re.compile(r"^[0-9a-f]{32}$")
#: URL schemes that name a local path (``file:///mnt/x``, ``local:///mnt/x``).
_SCHEMES = ("file://", "local://")


def local_path(url: str) -> str:
    """The absolute path ``url`` names: a path, ``file://path`` or ``local://path``."""
    for scheme in _SCHEMES:
        if url[: len(scheme)].lower() == scheme:
            url = url[len(scheme) :]
            break
    return os.path.abspath(os.path.expanduser(url))


class LocalStore(Store):
    """A store on a mounted file system, rooted at a directory.

    ``url``: a path, ``file://path`` or ``local://path``. ``storage_options`` must be empty
    (a volume has no client to configure); ``retry`` is accepted for the common constructor
    and unused (local calls have no request timeout).
    """

    #: Parts are pwrites into one file: any size, no limit worth planning for, no copy;
    #: a large part's page-aligned middle is written with direct I/O (``_direct``).
    capabilities = Capabilities(
        max_parts=2**31 - 1, zero_copy_parts=True, direct_alignment=_direct.alignment()
    )

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryConfig | None = None,
        _below: int = 0,
    ) -> None:
        if storage_options:
            raise ConfigError(
                f"storage_options {sorted(storage_options)} do not apply to a local path "
                f"({url}); pass them only with object-store URLs"
            )
        root = local_path(url)
        super().__init__(root, retry=retry)
        self.root = root
        #: How many trailing components of ``root`` a parent store added (``child``): they
        #: are resolved from the parent's root, never through a link either.
        self._below = _below
        parts = root.split(os.sep)
        cut = len(parts) - _below
        self._anchor = Anchor(os.sep.join(parts[:cut]) or os.sep, tuple(parts[cut:]))

    def child(self, prefix: str) -> LocalStore:
        below = self._below + (len(prefix.split("/")) if prefix else 0)
        root = os.path.join(self.root, prefix) if prefix else self.root
        return LocalStore(root, retry=self.retry, _below=below)

    def _abs(self, path: str) -> str:
        """The absolute path of ``path``, for upload ids and messages only: never opened."""
        return os.path.join(self.root, path) if path else self.root

    def _open_read(self, path: str, what: str) -> int:
        try:
            return self._anchor.open_read(path)
        except OSError as exc:
            raise translate(exc, what) from exc

    def _check_upload(self, upload: Multipart) -> str:
        """The temp file of ``upload`` (relative to the root); refuses an upload id that is
        not one of ours."""
        tmp = upload.upload_id
        head = f"{self._abs(upload.path)}{TMP_MARK}"
        if not (tmp.startswith(head) and _TMP_ID.match(tmp[len(head) :])):
            raise UnsafePathError(
                f"upload id {tmp!r} is not a temp file of {self.describe(upload.path)}"
            )
        return f"{upload.path}{TMP_MARK}{tmp[len(head) :]}"

    # -- whole objects (see ``local_durable``) ----------------------------------------
    def put(self, path: str, data: Buffer) -> None:
        local_durable.write_durably(self._anchor, path, data, f"write of {self.describe(path)}")

    def put_many(self, items: Sequence[tuple[str, Buffer]]) -> None:
        """All written, then fsynced at once, then renamed in order (``write_many_durably``)."""
        what = f"write of {', '.join(self.describe(p) for p, _ in items[:3])}"
        local_durable.write_many_durably(self._anchor, items, what)

    def put_if_absent(self, path: str, data: Buffer) -> None:
        what = f"create-only write of {self.describe(path)}"
        if local_durable.create(self._anchor, path, data, what):
            return
        # A retry of our own write whose first response was lost holds our bytes.
        if same_bytes(lambda: self.get(path), data):
            return
        raise CommitConflictError(
            f"{self.describe(path)} already exists: another writer committed first"
        )

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        what = f"read of {self.describe(path)}"
        fd = self._open_read(path, what)
        try:
            if end is None:
                end = os.fstat(fd).st_size
            chunks = []
            pos = start
            while pos < end:
                chunk = os.pread(fd, end - pos, pos)
                if not chunk:
                    break
                chunks.append(chunk)
                pos += len(chunk)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        except OSError as exc:
            raise translate(exc, what) from exc
        finally:
            os.close(fd)

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        what = f"read of {self.describe(path)}"
        fd = self._open_read(path, what)
        try:
            done = 0
            while done < len(buf):
                n = os.preadv(fd, [buf[done:]], start + done)
                if n == 0:
                    break
                done += n
            return done
        except OSError as exc:
            raise translate(exc, what) from exc
        finally:
            os.close(fd)

    def size(self, path: str) -> int:
        try:
            st = self._anchor.stat(path)
        except OSError as exc:
            raise translate(exc, f"stat of {self.describe(path)}") from exc
        if stat.S_ISLNK(st.st_mode):
            raise UnsafePathError(
                f"{self.describe(path)} is a symlink, which ckptstore never follows"
            )
        if not stat.S_ISREG(st.st_mode):
            raise StoreNotFoundError(f"{self.describe(path)} is not a file")
        return st.st_size

    def find(self, prefix: str = "") -> list[str]:
        what = f"listing of {self.describe(prefix)}"
        if prefix:
            try:
                st = self._anchor.stat(prefix)
            except (FileNotFoundError, NotADirectoryError):
                return []
            except OSError as exc:
                raise translate(exc, what) from exc
            if stat.S_ISLNK(st.st_mode):
                raise UnsafePathError(
                    f"{self.describe(prefix)} is a symlink; ckptstore never follows links "
                    "under a checkpoint root. Remove it or point ckptstore at the real "
                    "directory."
                )
            if stat.S_ISREG(st.st_mode):
                return [prefix]
            if not stat.S_ISDIR(st.st_mode):
                return []
        out: list[str] = []
        try:  # a root that is a file, or missing, holds nothing
            self._anchor.walk(prefix, out)
        except OSError as exc:
            raise translate(exc, what) from exc
        return sorted(join_path(prefix, name) for name in out)

    def listdir(self, prefix: str = "") -> list[str]:
        return [e.name for e in self.scan(prefix)]

    def scan(self, prefix: str = "") -> list[Entry]:
        try:
            found = self._anchor.scan(prefix)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise translate(exc, f"listing of {self.describe(prefix)}") from exc
        return sorted((Entry(name, kind) for name, kind in found), key=lambda e: e.name)

    def delete(self, path: str) -> None:
        try:
            self._anchor.unlink(path)  # a link itself is removed, never what it points to
        except OSError as exc:
            raise translate(exc, f"delete of {self.describe(path)}") from exc

    def delete_prefix(self, prefix: str) -> None:
        super().delete_prefix(prefix)
        self.remove_empty_dirs(prefix)

    def remove_empty_dirs(self, prefix: str = "") -> None:
        try:
            self._anchor.remove_empty_dirs(prefix)
        except OSError as exc:
            what = f"removal of the empty folders of {self.describe(prefix)}"
            raise translate(exc, what) from exc

    # -- multipart: parallel pwrite into one temp file (see ``local_durable``) -----------
    def begin_multipart(self, path: str) -> Multipart:
        what = f"write of {self.describe(path)}"
        return Multipart(path, self._abs(local_durable.begin(self._anchor, path, what)))

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        what = f"write of {self.describe(upload.path)} (part {number})"
        local_durable.write_part(self._anchor, self._check_upload(upload), offset, data, what)
        return Part(number, offset, len(data))

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        path, expected = upload.path, sum(p.size for p in parts)
        tmp = self._check_upload(upload)

        def whole() -> bool:
            return self.exists(path) and self.size(path) == expected

        what = f"write of {self.describe(path)}"
        local_durable.finish(self._anchor, tmp, path, expected, what, whole)

    def abort_multipart(self, upload: Multipart) -> None:
        local_durable.abort(self._anchor, self._check_upload(upload))

    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        """Temp files of unfinished writes.

        ``extra["initiated"]`` is the temp file's last write time, so an upload still being
        written never looks stale to a sweeper.
        """
        out = []
        for rel in self.find(prefix):
            name, mark, _ = rel.rpartition(TMP_MARK)
            if mark:
                try:  # the last write to the temp file: how long it has been idle
                    extra = {"initiated": self._anchor.stat(rel).st_mtime}
                except (OSError, UnsafePathError):
                    continue  # completed or aborted meanwhile
                out.append(Multipart(name, self._abs(rel), extra=extra))
        return out
