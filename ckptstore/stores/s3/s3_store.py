"""The S3 store: objects, listings and deletes through s3fs's (aiobotocore) client.

``S3Store("s3://bucket/prefix", storage_options)`` builds an ``s3fs.S3FileSystem`` from
fsspec-style ``storage_options`` (key, secret, token, endpoint_url, client_kwargs,
config_kwargs, profile, ...) and calls its botocore client directly, from the engine's
threads, on fsspec's I/O event loop. The client comes from this process's aiobotocore
session (``session``: botocore's data loaded once, fork-safe spares for DataLoader
workers). Native multipart uploads and their call order are ``multipart``'s; bulk
deletes and folder keys are ``folders``'.

Integrity checksums, retries and create-only writes are :class:`S3Store`'s docstring.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from ckptstore.config import MiB, RetryConfig
from ckptstore.engine.create_only import create_lock, same_bytes, warn_non_atomic
from ckptstore.engine.store import Buffer, Capabilities, Entry, Multipart, Part, Store, join_path
from ckptstore.errors import CommitConflictError, ConfigError, TransientStoreError
from ckptstore.stores.s3 import folders, multipart, server_copy
from ckptstore.stores.s3.body import as_body, buffers_body
from ckptstore.stores.s3.client import CHECKSUMS, S3Client, make_s3fs
from ckptstore.stores.s3.error_map import error_code
from ckptstore.stores.storage_options import check_s3_options, refuse_userinfo

__all__ = ["S3Store", "make_s3fs"]


#: (endpoint, bucket) -> whether it honours If-None-Match, as probed in this process.
_PROBED: dict[tuple[str, str], bool] = {}


class _Shared:
    """State shared by a store and its children: the conditional-create probe's answer."""

    def __init__(self, conditional: bool | None) -> None:
        self.conditional = conditional
        self.lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # picklable (DCP may ship writers to a process)
        return {"conditional": self.conditional}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["conditional"])  # type: ignore[misc]


class S3Store(Store):
    """A store rooted at ``s3://bucket/prefix`` (the module docstring: its client).

    ``checksum`` (``"crc32c"``, ``"md5"``, ``"none"``) and ``conditional_create`` are
    keyword arguments of its own, beyond the common constructor.

    Integrity: every PutObject and UploadPart carries a checksum of its body (CRC32C by
    default, or Content-MD5 with ``checksum="md5"``), so a server that checks it rejects bytes
    damaged in transit (``BadDigest``, retried). SeaweedFS checks both; moto checks neither.
    With a checksum on every body, the SigV4 signature says ``UNSIGNED-PAYLOAD`` rather than
    hashing each body with SHA-256 (see ``make_s3fs``); ``checksum="none"`` keeps the hash.

    Retries: botocore's own retries are off (``total_max_attempts=1``) so the engine's
    ``RetryConfig`` alone decides; each request is bounded by ``RetryConfig.request_timeout_s``
    (botocore connect/read timeouts plus an overall limit that also catches a stalled upload).

    Create-only writes use ``PutObject`` with ``If-None-Match: *``. Whether the server honours
    it is probed once per endpoint and bucket in a process (two create-only writes of a
    scratch object under the store's root: the second must fail with 412). A server that
    ignores it gets a best-effort HEAD-then-PUT instead, with a ``NonAtomicCreateWarning``
    (``S3Store.conditional_create`` says which). ``conditional_create=True/False`` skips the
    probe.
    """

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryConfig | None = None,
        checksum: str = "crc32c",
        conditional_create: bool | None = None,
        fs: Any = None,
        _shared: _Shared | None = None,
    ) -> None:
        scheme, _, rest = url.partition("://")
        if scheme.lower() not in ("s3", "s3a") or not rest.strip("/"):
            raise ConfigError(f"expected an s3://bucket[/prefix] URL, got {url!r}")
        if checksum not in CHECKSUMS:
            raise ConfigError(f"checksum must be one of {CHECKSUMS}, got {checksum!r}")
        bucket, _, prefix = rest.strip("/").partition("/")
        refuse_userinfo(url, bucket)
        self.bucket, self.prefix = bucket, prefix.strip("/")
        if fs is None:
            check_s3_options(url, storage_options or {})
        super().__init__(
            f"s3://{join_path(self.bucket, self.prefix)}", storage_options, retry=retry
        )
        #: S3 multipart: parts of at least 5 MiB but the last, at most 10,000 of them; a
        #: part may be sent from several buffers (``put_part_buffers``).
        self.capabilities = Capabilities(max_parts=10_000, min_part_size=5 * MiB, gather_parts=True)
        self.checksum = checksum
        client_kwargs = self.storage_options.get("client_kwargs") or {}
        self.endpoint = str(
            self.storage_options.get("endpoint_url")
            or client_kwargs.get("endpoint_url")
            or "AWS S3"
        )
        self._connect(fs)
        self._shared = _shared or _Shared(conditional_create)

    def __getstate__(self) -> dict[str, Any]:
        # The settings travel; the client is made again on the other side (make_s3fs there
        # gives it that process's own session, which holds locks and loaded data that
        # must not be pickled).
        state = dict(self.__dict__)
        state["fs"] = state["client"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._connect(None)

    def _connect(self, fs: Any) -> None:
        """Set ``fs`` (or a new one for these settings) and the bucket's client over it."""
        self.fs = (
            fs
            if fs is not None
            else make_s3fs(self.storage_options, self.retry, sign_payload=self.checksum == "none")
        )
        self.client = S3Client(
            self.fs, self.bucket, self.endpoint, self.retry.request_timeout_s, self.checksum
        )
        self.client.where, self.client.options = self.url, self.storage_options

    @property
    def conditional_create(self) -> bool | None:
        """Whether the server honours ``If-None-Match: *`` (a true create-only write), as
        given or probed; None until the first ``put_if_absent`` probes it."""
        return self._shared.conditional

    def child(self, prefix: str) -> S3Store:
        return S3Store(
            f"s3://{join_path(self.bucket, self.prefix, prefix)}",
            self.storage_options,
            retry=self.retry,
            checksum=self.checksum,
            fs=self.fs,
            _shared=self._shared,
        )

    def _key(self, path: str) -> str:
        return join_path(self.prefix, path)

    def _rel(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    # -- whole objects -----------------------------------------------------------------
    def put(self, path: str, data: Buffer) -> None:
        body = as_body(data)
        self.client.call(
            "put_object",
            f"write of {self.describe(path)}",
            Key=self._key(path),
            Body=body,
            **self.client.integrity(body),
        )

    def put_if_absent(self, path: str, data: Buffer) -> None:
        what = f"create-only write of {self.describe(path)}"
        if not self._conditional_ok():
            warn_non_atomic(f"s3://{self.bucket}", f"{self.endpoint} ignores If-None-Match")
            with create_lock(self.describe(path)):
                if self.exists(path):
                    raise self._conflict(path)
                self.put(path, data)
            return
        body = as_body(data)
        try:
            self.client.raw(
                "put_object",
                Key=self._key(path),
                Body=body,
                IfNoneMatch="*",
                **self.client.integrity(body),
            )
        except Exception as exc:  # noqa: BLE001 - translated below
            code, status = error_code(exc)
            if status != 412 and code != "PreconditionFailed":
                raise self.client.translate(exc, what) from exc
            # Our own earlier try may have landed with its response lost: then it is ours.
            if same_bytes(lambda: self.get(path), body):
                return
            raise self._conflict(path) from None

    def _conflict(self, path: str) -> CommitConflictError:
        return CommitConflictError(
            f"{self.describe(path)} already exists: another writer committed first"
        )

    def _conditional_ok(self) -> bool:
        """Whether the server honours If-None-Match on PutObject (probed once per bucket)."""
        shared = self._shared
        with shared.lock:
            if shared.conditional is None:
                where = (self.endpoint, self.bucket)
                if where not in _PROBED:
                    probe = self._key(f".ckptstore-probe-{uuid.uuid4().hex}")
                    _PROBED[where] = self.client.probe_conditional(probe)
                shared.conditional = _PROBED[where]
        return shared.conditional

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        if end is not None and end <= start:
            self.size(path)  # a missing object is still an error
            return b""
        kwargs: dict[str, Any] = {}
        if start or end is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            data: bytes = self.client.raw(
                "get_object", read_body=True, Key=self._key(path), **kwargs
            )
            return data
        except Exception as exc:  # noqa: BLE001 - translated below
            code, status = error_code(exc)
            if status == 416 or code == "InvalidRange":  # start at or past the end
                self.size(path)
                return b""
            raise self.client.translate(exc, f"read of {self.describe(path)}") from exc

    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        """Read straight into ``buf`` (one copy per byte, from aiohttp's received chunks)."""
        if not len(buf):
            self.size(path)  # a missing object is still an error
            return 0
        what = f"read of {self.describe(path)} at {start}+{len(buf)}"
        try:
            return self.client.read_into(self._key(path), start, buf)
        except TransientStoreError as exc:  # a short or overlong body
            raise TransientStoreError(f"{what}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - translated below
            code, status = error_code(exc)
            if status == 416 or code == "InvalidRange":  # start at or past the end
                self.size(path)
                return 0
            raise self.client.translate(exc, what) from exc

    def size(self, path: str) -> int:
        what = f"stat of {self.describe(path)}"
        return int(self.client.call("head_object", what, Key=self._key(path))["ContentLength"])

    def _keys_under(self, prefix: str) -> list[str]:
        return self._list_under(prefix)[0]

    def _list_under(self, prefix: str) -> tuple[list[str], list[str]]:
        """(object keys, folder keys ending in '/') under ``prefix``; the object itself if
        ``prefix`` names one."""
        base = self._key(prefix)
        listed, _ = self.client.list_objects(f"{base}/" if base else "")
        keys = [k for k in listed if not k.endswith("/")]
        dir_keys = [k for k in listed if k.endswith("/")]
        if not keys and prefix and self.exists(prefix):
            return [base], dir_keys
        return keys, dir_keys

    def find(self, prefix: str = "") -> list[str]:
        return sorted(self._rel(k) for k in self._keys_under(prefix))

    def find_sizes(self, prefix: str = "") -> dict[str, int] | None:
        """What ``find`` lists, with the sizes the listing carries (no HEAD per object)."""
        base = self._key(prefix)
        listed = self.client.list_sizes(f"{base}/" if base else "")
        sizes = {self._rel(k): n for k, n in listed.items() if not k.endswith("/")}
        return dict(sorted(sizes.items())) if sizes else None  # None: find's own rules

    def listdir(self, prefix: str = "") -> list[str]:
        base = self._key(prefix)
        list_prefix = f"{base}/" if base else ""
        keys, dirs = self.client.list_objects(list_prefix, delimiter="/")
        names = {k[len(list_prefix) :] for k in keys}
        names |= {d[len(list_prefix) :].rstrip("/") for d in dirs}
        names.discard("")
        return sorted(names)

    def scan(self, prefix: str = "") -> list[Entry]:
        base = self._key(prefix)
        list_prefix = f"{base}/" if base else ""
        keys, dirs = self.client.list_objects(list_prefix, delimiter="/")
        out = {Entry(k[len(list_prefix) :], "file") for k in keys if not k.endswith("/")}
        out |= {Entry(d[len(list_prefix) :].rstrip("/"), "dir") for d in dirs}
        return sorted((e for e in out if e.name), key=lambda e: (e.name, e.kind))

    def copy(self, src: str, dst: str) -> None:
        """CopyObject, or UploadPartCopy part for part (checks: ``server_copy``)."""
        what = f"copy of {self.describe(src)} to {dst}"
        server_copy.copy_object(self.client, self._key(src), self._key(dst), what)

    def delete(self, path: str) -> None:
        self.client.call("delete_object", f"delete of {self.describe(path)}", Key=self._key(path))

    def delete_many(self, paths: Iterable[str]) -> None:
        """DeleteObjects, 1000 keys a request."""
        folders.delete_keys(self.client, [self._key(p) for p in paths], self.describe())

    def remove_empty_dirs(self, prefix: str = "") -> None:
        """Delete the folder keys (``a/b/``) under ``prefix`` that hold no object, deepest
        first, and ``prefix``'s own when it is empty too (see ``folders``). A folder
        still holding an object is left alone."""
        empty = folders.empty_folders(self.client, self._key(prefix))
        folders.delete_by_depth(self.client, empty, self.describe(prefix))

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under ``prefix`` with DeleteObjects, 1000 keys a request.

        Then the folder keys (``a/b/``) of ``prefix`` and of every folder the objects were
        in, deepest first, so the prefix no longer lists (as ``LocalStore`` removes emptied
        directories; see ``folders``). Deleting a folder key never deletes objects still
        in the folder.
        """
        keys, markers = self._list_under(prefix)
        folders.delete_keys(self.client, keys, self.describe(prefix))
        marked = folders.folders_of(keys, markers, self._key(prefix))
        folders.delete_by_depth(self.client, marked, self.describe(prefix))

    # -- multipart (see ``multipart``) ------------------------------------------------------
    def begin_multipart(self, path: str) -> Multipart:
        name = self.describe(path)
        upload_id = multipart.begin(self.client, self._key(path), self.checksum, name)
        return Multipart(path, upload_id, extra={"checksums": {}})

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        body = as_body(data)
        return self._upload_part(
            upload, number, offset, body, len(body), self.client.integrity(body)
        )

    def put_part_buffers(
        self,
        upload: Multipart,
        number: int,
        offset: int,
        buffers: Sequence[Buffer],
        *,
        crc32c: int | None = None,
    ) -> Part:
        """UploadPart of ``buffers`` as one body, each sent from its own memory (no join);
        the checksum header covers their concatenation (``crc32c``, when the engine
        computed it, is used as is: the bytes are not hashed again)."""
        body = buffers_body(buffers)
        integrity = self.client.integrity(buffers, crc32c=crc32c)
        return self._upload_part(upload, number, offset, body, len(body), integrity)

    def _upload_part(
        self, upload: Multipart, number: int, offset: int, body: Any, size: int, integrity: dict
    ) -> Part:
        key, name = self._key(upload.path), self.describe(upload.path)
        return multipart.upload_part(
            self.client, key, upload, number, offset, body, size, integrity, name
        )

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        """CompleteMultipartUpload; a retry after a lost response finds it done."""
        key, name = self._key(upload.path), self.describe(upload.path)
        multipart.complete(self.client, key, upload, parts, name)

    def abort_multipart(self, upload: Multipart) -> None:
        key, name = self._key(upload.path), self.describe(upload.path)
        multipart.abort(self.client, key, upload.upload_id, name)

    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        return multipart.unfinished(self.client, self._key(prefix), self._rel)

    def list_parts(self, upload: Multipart) -> list[Part]:
        """The parts the server holds for an unfinished upload (offsets unknown: 0)."""
        key = self._key(upload.path)
        return multipart.held_parts(self.client, key, upload.upload_id)
