"""The S3 store: native multipart uploads through s3fs's (aiobotocore) client.

``S3Store("s3://bucket/prefix", storage_options)`` builds an ``s3fs.S3FileSystem`` from
fsspec-style ``storage_options`` (key, secret, token, endpoint_url, client_kwargs,
config_kwargs, profile, ...) and calls its botocore client directly, from the engine's
threads, on fsspec's I/O event loop. Call order for a multipart write (the engine drives it;
see ``ckptstore.engine.store``)::

    up = store.begin_multipart(path)            # CreateMultipartUpload (ChecksumAlgorithm)
    store.put_part(up, n, offset, data)         # UploadPart, any order, many threads at once
    store.complete_multipart(up, parts)         # CompleteMultipartUpload
    store.abort_multipart(up)                   # AbortMultipartUpload, on any failure

Integrity: every PutObject and UploadPart carries a checksum of its body (CRC32C by
default, or Content-MD5 with ``checksum="md5"``), so a server that checks it rejects bytes
damaged in transit (``BadDigest``, retried). SeaweedFS checks both; moto checks neither.

Retries: botocore's own retries are off (``total_max_attempts=1``) so the engine's
``RetryConfig`` alone decides; each request is bounded by ``RetryConfig.request_timeout_s``
(botocore connect/read timeouts plus an overall limit that also catches a stalled upload).

Create-only writes use ``PutObject`` with ``If-None-Match: *``. Whether the server honours
it is probed once per bucket (two create-only writes of a scratch object under the root:
the second must fail with 412). A server that ignores it gets a best-effort
HEAD-then-PUT instead, with a ``NonAtomicCreateWarning`` and ``atomic_create = False``.
``conditional_create=True/False`` skips the probe.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import threading
import uuid
from collections.abc import Sequence
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.store import Buffer, Multipart, Part, Store, join_path
from ckptstore.errors import (
    CommitConflictError,
    ConfigError,
    StoreNotFoundError,
    TransientStoreError,
    missing_dependency,
)
from ckptstore.stores._common import create_lock, same_bytes, warn_non_atomic
from ckptstore.stores.s3_errors import error_code, translate_s3_error

__all__ = ["S3Store", "make_s3fs"]

MiB = 1024 * 1024
_CHECKSUMS = ("crc32c", "md5", "none")


def make_s3fs(storage_options: dict[str, Any] | None, retry: RetryConfig) -> Any:
    """An ``s3fs.S3FileSystem`` for ``storage_options`` with ckptstore's client settings.

    Added to ``config_kwargs`` unless the caller set them: connect/read timeouts from
    ``retry.request_timeout_s``, no botocore retries, checksums only when required (we send
    our own), and a connection pool as large as a busy engine needs.
    """
    try:
        import s3fs
    except ImportError:
        raise missing_dependency("s3fs", "s3") from None
    options = dict(storage_options or {})
    config = dict(options.pop("config_kwargs", None) or {})
    config.setdefault("connect_timeout", retry.request_timeout_s)
    config.setdefault("read_timeout", retry.request_timeout_s)
    config.setdefault("retries", {"total_max_attempts": 1})
    config.setdefault("request_checksum_calculation", "when_required")
    config.setdefault("response_checksum_validation", "when_required")
    config.setdefault("max_pool_connections", 64)
    return s3fs.S3FileSystem(config_kwargs=config, **options)


class _Shared:
    """State shared by a store and its children: the conditional-create probe's answer."""

    def __init__(self, conditional: bool | None) -> None:
        self.conditional = conditional
        self.lock = threading.Lock()


class S3Store(Store):
    """A store rooted at ``s3://bucket/prefix``. See the module docstring."""

    min_part_size = 5 * MiB
    max_parts = 10_000

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
        bucket, _, prefix = rest.strip("/").partition("/")
        if checksum not in _CHECKSUMS:
            raise ConfigError(f"checksum must be one of {_CHECKSUMS}, got {checksum!r}")
        super().__init__(
            f"s3://{bucket}/{prefix.strip('/')}" if prefix.strip("/") else f"s3://{bucket}"
        )
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.storage_options = dict(storage_options or {})
        self.retry = retry or RetryConfig()
        self.checksum = checksum
        self.fs = fs if fs is not None else make_s3fs(self.storage_options, self.retry)
        self._shared = _shared or _Shared(conditional_create)
        if self._shared.conditional is False:
            self.atomic_create = False
        client_kwargs = self.storage_options.get("client_kwargs") or {}
        self.endpoint = (
            self.storage_options.get("endpoint_url")
            or client_kwargs.get("endpoint_url")
            or "AWS S3"
        )

    def child(self, prefix: str) -> S3Store:
        return S3Store(
            f"s3://{join_path(self.bucket, self.prefix, prefix)}",
            self.storage_options,
            retry=self.retry,
            checksum=self.checksum,
            fs=self.fs,
            _shared=self._shared,
        )

    # -- the client ----------------------------------------------------------------------
    def _key(self, path: str) -> str:
        return join_path(self.prefix, path)

    def _rel(self, key: str) -> str:
        return key[len(self.prefix) + 1 :] if self.prefix else key

    async def _request(self, method: str, kwargs: dict[str, Any], read_body: bool) -> Any:
        async def go() -> Any:
            client = await self.fs.set_session()
            response = await getattr(client, method)(**kwargs)
            if not read_body:
                return response
            body = response["Body"]
            try:
                return await body.read()
            finally:
                body.close()

        return await asyncio.wait_for(go(), self.retry.request_timeout_s)

    def _raw(self, method: str, *, read_body: bool = False, **kwargs: Any) -> Any:
        """Call the S3 API ``method`` once; botocore/aiohttp exceptions pass through."""
        from fsspec.asyn import sync

        kwargs.setdefault("Bucket", self.bucket)
        return sync(self.fs.loop, self._request, method, kwargs, read_body)

    def _call(self, method: str, what: str, *, read_body: bool = False, **kwargs: Any) -> Any:
        """Call ``method`` once, raising ckptstore errors (``what`` names the operation)."""
        try:
            return self._raw(method, read_body=read_body, **kwargs)
        except Exception as exc:  # noqa: BLE001 - translated, chained
            raise self._translate(exc, what) from exc

    def _translate(self, exc: BaseException, what: str) -> Exception:
        return translate_s3_error(exc, what, self.bucket, self.endpoint)

    def _integrity(self, body: bytes | bytearray) -> dict[str, Any]:
        if self.checksum == "crc32c":
            return {"ChecksumCRC32C": _b64(crc32c(body).to_bytes(4, "big"))}
        if self.checksum == "md5":
            return {"ContentMD5": _b64(hashlib.md5(body).digest())}
        return {}

    # -- whole objects -----------------------------------------------------------------
    def put(self, path: str, data: Buffer, **extra: Any) -> None:
        body = _body(data)
        self._call(
            "put_object",
            f"write of {self.describe(path)}",
            Key=self._key(path),
            Body=body,
            **self._integrity(body),
            **extra,
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
        body = _body(data)
        try:
            self._raw(
                "put_object",
                Key=self._key(path),
                Body=body,
                IfNoneMatch="*",
                **self._integrity(body),
            )
        except Exception as exc:  # noqa: BLE001 - translated below
            code, status = error_code(exc)
            if status != 412 and code != "PreconditionFailed":
                raise self._translate(exc, what) from exc
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
                shared.conditional = self._probe_conditional()
        if not shared.conditional:
            self.atomic_create = False
        return shared.conditional

    def _probe_conditional(self) -> bool:
        key = self._key(f".ckptstore-probe-{uuid.uuid4().hex}")
        what = f"probe of conditional writes at {self.url}"
        try:
            try:
                self._raw("put_object", Key=key, Body=b"1", IfNoneMatch="*")
            except Exception as exc:  # noqa: BLE001
                code, status = error_code(exc)
                if code == "NotImplemented" or status == 501:
                    return False
                raise self._translate(exc, what) from exc
            try:
                self._raw("put_object", Key=key, Body=b"2", IfNoneMatch="*")
            except Exception as exc:  # noqa: BLE001
                code, status = error_code(exc)
                if status == 412 or code == "PreconditionFailed":
                    return True
                raise self._translate(exc, what) from exc
            return False
        finally:
            try:
                self._raw("delete_object", Key=key)
            except Exception:  # noqa: BLE001 - a leftover scratch object is harmless
                pass

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        what = f"read of {self.describe(path)}"
        if end is not None and end <= start:
            self.size(path)  # a missing object is still an error
            return b""
        kwargs: dict[str, Any] = {}
        if start or end is not None:
            kwargs["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        try:
            return self._raw("get_object", read_body=True, Key=self._key(path), **kwargs)
        except Exception as exc:  # noqa: BLE001 - translated below
            code, status = error_code(exc)
            if status == 416 or code == "InvalidRange":  # start at or past the end
                self.size(path)
                return b""
            raise self._translate(exc, what) from exc

    def size(self, path: str) -> int:
        head = self._call("head_object", f"stat of {self.describe(path)}", Key=self._key(path))
        return int(head["ContentLength"])

    def _list(self, prefix_key: str, delimiter: str = "") -> tuple[list[str], list[str]]:
        """(keys, common prefixes) under ``prefix_key``, all pages."""
        keys: list[str] = []
        dirs: list[str] = []
        kwargs: dict[str, Any] = {"Prefix": prefix_key}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        while True:
            page = self._call("list_objects_v2", f"listing of {self.url}/{prefix_key}", **kwargs)
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
            dirs.extend(p["Prefix"] for p in page.get("CommonPrefixes", []))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return keys, dirs
            kwargs["ContinuationToken"] = token

    def _keys_under(self, prefix: str) -> list[str]:
        base = self._key(prefix)
        keys, _ = self._list(f"{base}/" if base else "")
        keys = [k for k in keys if not k.endswith("/")]
        if not keys and prefix and self.exists(prefix):
            return [base]
        return keys

    def find(self, prefix: str = "") -> list[str]:
        return sorted(self._rel(k) for k in self._keys_under(prefix))

    def listdir(self, prefix: str = "") -> list[str]:
        base = self._key(prefix)
        list_prefix = f"{base}/" if base else ""
        keys, dirs = self._list(list_prefix, delimiter="/")
        names = {k[len(list_prefix) :] for k in keys} | {
            d[len(list_prefix) :].rstrip("/") for d in dirs
        }
        names.discard("")
        return sorted(names)

    def delete(self, path: str) -> None:
        self._call("delete_object", f"delete of {self.describe(path)}", Key=self._key(path))

    def delete_prefix(self, prefix: str) -> None:
        """Delete every object under ``prefix`` with DeleteObjects, 1000 keys a request."""
        keys = self._keys_under(prefix)
        for i in range(0, len(keys), 1000):
            batch = keys[i : i + 1000]
            what = f"delete of {len(batch)} objects under {self.describe(prefix)}"
            out = self._call(
                "delete_objects",
                what,
                Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
            )
            errors = [e for e in out.get("Errors", []) if e.get("Code") != "NoSuchKey"]
            if errors:
                first = errors[0]
                detail = f"{first.get('Key')}: {first.get('Code')} {first.get('Message', '')}"
                if all(e.get("Code") in ("SlowDown", "InternalError") for e in errors):
                    raise TransientStoreError(f"{what}: {len(errors)} failed ({detail})")
                raise self._translate(
                    _client_error(first.get("Code", ""), first.get("Message", "")), what
                )

    # -- multipart -----------------------------------------------------------------------
    def begin_multipart(self, path: str) -> Multipart:
        kwargs: dict[str, Any] = (
            {"ChecksumAlgorithm": "CRC32C"} if self.checksum == "crc32c" else {}
        )
        out = self._call(
            "create_multipart_upload",
            f"upload of {self.describe(path)}",
            Key=self._key(path),
            **kwargs,
        )
        return Multipart(path, out["UploadId"], extra={"checksums": {}})

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        body = _body(data)
        integrity = self._integrity(body)
        out = self._call(
            "upload_part",
            f"upload of {self.describe(upload.path)} (part {number})",
            Key=self._key(upload.path),
            UploadId=upload.upload_id,
            PartNumber=number,
            Body=body,
            **integrity,
        )
        if "ChecksumCRC32C" in integrity:
            upload.extra.setdefault("checksums", {})[number] = integrity["ChecksumCRC32C"]
        return Part(number, offset, len(body), out["ETag"])

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        """CompleteMultipartUpload; idempotent when a retry follows a lost response.

        If the server no longer knows the upload but the object exists with the size (and,
        where the ETags allow, the multipart ETag) these parts make, it is already done.
        """
        what = f"upload of {self.describe(upload.path)}"
        checksums = upload.extra.get("checksums") or {}
        listed = []
        for p in sorted(parts, key=lambda p: p.number):
            entry = {"PartNumber": p.number, "ETag": p.etag}
            if p.number in checksums:
                entry["ChecksumCRC32C"] = checksums[p.number]
            listed.append(entry)
        try:
            self._raw(
                "complete_multipart_upload",
                Key=self._key(upload.path),
                UploadId=upload.upload_id,
                MultipartUpload={"Parts": listed},
            )
        except Exception as exc:  # noqa: BLE001 - translated below
            if error_code(exc)[0] == "NoSuchUpload" and self._already_complete(upload, parts):
                return
            raise self._translate(exc, what) from exc

    def _already_complete(self, upload: Multipart, parts: Sequence[Part]) -> bool:
        try:
            head = self._call(
                "head_object", f"stat of {self.describe(upload.path)}", Key=self._key(upload.path)
            )
        except StoreNotFoundError:
            return False
        if int(head["ContentLength"]) != sum(p.size for p in parts):
            return False
        expected = _multipart_etag(parts)
        actual = str(head.get("ETag", "")).strip('"')
        return expected is None or "-" not in actual or actual == expected

    def abort_multipart(self, upload: Multipart) -> None:
        try:
            self._raw(
                "abort_multipart_upload", Key=self._key(upload.path), UploadId=upload.upload_id
            )
        except Exception as exc:  # noqa: BLE001 - translated below
            code, status = error_code(exc)
            if code == "NoSuchUpload" or status == 404:
                return  # already aborted or completed: nothing left to discard
            raise self._translate(exc, f"abort of upload of {self.describe(upload.path)}") from exc

    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        base = self._key(prefix)
        kwargs: dict[str, Any] = {"Prefix": base}
        out: list[Multipart] = []
        while True:
            page = self._call(
                "list_multipart_uploads", f"listing of uploads at {self.url}", **kwargs
            )
            uploads = page.get("Uploads", [])
            for u in uploads:
                key = u["Key"]
                if base and key != base and not key.startswith(f"{base}/"):
                    continue
                initiated = u.get("Initiated")
                extra = {"initiated": initiated.timestamp()} if initiated is not None else {}
                out.append(Multipart(self._rel(key), u["UploadId"], extra=extra))
            if not page.get("IsTruncated") or not uploads:
                return out
            kwargs["KeyMarker"] = page.get("NextKeyMarker") or uploads[-1]["Key"]
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker") or uploads[-1]["UploadId"]

    def list_parts(self, upload: Multipart) -> list[Part]:
        """The parts the server holds for an unfinished upload (offsets unknown: 0)."""
        kwargs: dict[str, Any] = {"Key": self._key(upload.path), "UploadId": upload.upload_id}
        parts: list[Part] = []
        while True:
            page = self._call("list_parts", f"listing of parts of {upload.path}", **kwargs)
            parts.extend(
                Part(p["PartNumber"], 0, int(p["Size"]), p["ETag"]) for p in page.get("Parts", [])
            )
            marker = page.get("NextPartNumberMarker")
            if not page.get("IsTruncated") or not marker:
                return parts
            kwargs["PartNumberMarker"] = marker


def _body(data: Buffer) -> bytes | bytearray:
    """botocore takes bytes or bytearray (not memoryview): copy only a memoryview."""
    return data if isinstance(data, (bytes, bytearray)) else bytes(data)


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def _multipart_etag(parts: Sequence[Part]) -> str | None:
    """S3's ETag of a completed multipart object: md5(part md5s)-N, when ETags are md5s."""
    digests = []
    for p in sorted(parts, key=lambda p: p.number):
        etag = p.etag.strip('"')
        if len(etag) != 32:
            return None
        try:
            digests.append(bytes.fromhex(etag))
        except ValueError:
            return None
    return f"{hashlib.md5(b''.join(digests)).hexdigest()}-{len(parts)}"


def _client_error(code: str, message: str) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": {"Code": code, "Message": message}}, "DeleteObjects")
