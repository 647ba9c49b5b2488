"""The S3 client S3Store uses: s3fs's aiobotocore client, called synchronously.

``make_s3fs`` builds an ``s3fs.S3FileSystem`` from fsspec ``storage_options`` with
ckptstore's client settings. ``S3Client`` calls the S3 API on one bucket from any thread
(each call runs on fsspec's I/O event loop, bounded by the request timeout), translates
failures into ckptstore errors, and walks paginated listings; its request bodies are
:mod:`ckptstore.stores.s3.body`'s.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
from collections.abc import Sequence
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine.checksum import crc32c as _crc32c
from ckptstore.engine.store import Buffer
from ckptstore.errors import TransientStoreError, missing_dependency
from ckptstore.stores.s3.body import b64, buffers_body_type, no_expect_for_buffers
from ckptstore.stores.s3.error_map import error_code, translate_s3_error
from ckptstore.stores.s3.session import http_session_class, process_session
from ckptstore.stores.storage_options import rejected_error

__all__ = [
    "S3Client",
    "make_s3fs",
    "CHECKSUMS",
]

#: Integrity headers S3Client can send with each body.
CHECKSUMS = ("crc32c", "md5", "none")


def make_s3fs(
    storage_options: dict[str, Any] | None, retry: RetryConfig, *, sign_payload: bool = True
) -> Any:
    """An ``s3fs.S3FileSystem`` for ``storage_options`` with ckptstore's client settings.

    Added to ``config_kwargs`` unless the caller set them: connect/read timeouts from
    ``retry.request_timeout_s``, no botocore retries (the engine retries), checksums only
    when required (we send our own), and a connection pool as large as a busy engine needs.

    ``sign_payload=False`` sends ``UNSIGNED-PAYLOAD`` instead of the SHA-256 of every body
    in the SigV4 signature (``s3={"payload_signing_enabled": False}``). botocore only skips
    that hash by itself over https *and* with a checksum header it recognises, which
    ckptstore's own ``x-amz-checksum-crc32c`` is not, so without this every byte is hashed
    twice, once by a single event-loop thread at a few hundred MB/s. S3Store turns signing
    off only when it sends a CRC32C or MD5 of each body; the signature still covers that
    checksum header. Over plain ``http://`` (a LAN endpoint) this trades the payload hash,
    which an on-path attacker cannot forge, for a CRC32C they could: pass
    ``config_kwargs={"s3": {"payload_signing_enabled": True}}`` to keep it.

    The client's session is this process's (``session.process_session``, its botocore
    data loaded once, before any fork), unless the caller passes a ``session`` or session
    options other than ``profile``.
    """
    try:
        import s3fs
    except ImportError:
        raise missing_dependency("s3fs", "s3") from None
    options = dict(storage_options or {})
    if "session" not in options and not _session_options(s3fs.S3FileSystem, options):
        options["session"] = process_session(options.pop("profile", None))
    config = dict(options.pop("config_kwargs", None) or {})
    config.setdefault("connect_timeout", retry.request_timeout_s)
    config.setdefault("read_timeout", retry.request_timeout_s)
    config.setdefault("retries", {"total_max_attempts": 1})
    config.setdefault("request_checksum_calculation", "when_required")
    config.setdefault("response_checksum_validation", "when_required")
    config.setdefault("max_pool_connections", 64)
    config.setdefault("http_session_cls", http_session_class())
    s3_config = dict(config.get("s3") or {})
    s3_config.setdefault("payload_signing_enabled", sign_payload)
    config["s3"] = s3_config
    return s3fs.S3FileSystem(config_kwargs=config, **options)


#: Options fsspec takes for itself from S3FileSystem's ``**kwargs``.
_FSSPEC_OPTIONS = frozenset(
    {"use_listings_cache", "listings_expiry_time", "max_paths", "skip_instance_cache"}
)


@functools.cache
def _named_options(fs_class: Any) -> frozenset[str]:
    # The constructor's own signature: the class's is fsspec's caching metaclass __call__.
    return frozenset(inspect.signature(fs_class.__init__).parameters)


def _session_options(fs_class: Any, options: dict[str, Any]) -> set[str]:
    """The options s3fs would give its own ``AioSession(**kwargs)``, ``profile`` aside."""
    return set(options) - _named_options(fs_class) - _FSSPEC_OPTIONS - {"profile"}


class S3Client:
    """Calls on one bucket. ``raw`` lets botocore errors through; ``call`` translates them."""

    def __init__(
        self, fs: Any, bucket: str, endpoint: str, request_timeout_s: float, checksum: str
    ) -> None:
        self.fs = fs
        self.bucket = bucket
        self.endpoint = endpoint
        self.request_timeout_s = request_timeout_s
        self.checksum = checksum
        #: The store's URL and options, for the error when the client rejects them.
        self.where = f"s3://{bucket}"
        self.options: dict[str, Any] = {}

    async def _session(self) -> Any:
        """The client, made on first use from the options: what it rejects is theirs."""
        try:
            return await self.fs.set_session()
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            raise rejected_error(self.where, exc, self.options) from exc

    async def _request(self, method: str, kwargs: dict[str, Any], read_body: bool) -> Any:
        async def go() -> Any:
            client = await self._session()
            if isinstance(kwargs.get("Body"), buffers_body_type()):
                no_expect_for_buffers(client)
            response = await getattr(client, method)(**kwargs)
            if not read_body:
                return response
            body = response["Body"]
            try:
                return await body.read()
            finally:
                body.close()

        # The overall limit also catches a stalled upload, which no socket timeout sees.
        return await asyncio.wait_for(go(), self.request_timeout_s)

    async def _read_into(self, key: str, start: int, buf: memoryview) -> int:
        """GET ``bytes=start..start+len(buf)-1`` of ``key`` straight into ``buf``.

        Each chunk aiohttp received is copied once, into ``buf``; ``body.read()`` would
        first join the chunks into one new ``bytes``.
        """

        async def go() -> int:
            client = await self._session()
            response = await client.get_object(
                Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + len(buf) - 1}"
            )
            body = response["Body"]
            try:
                stream = getattr(getattr(body, "raw_stream", None), "content", None)
                if stream is None:  # not the aiohttp backend: no chunk access
                    data = await body.read()
                    buf[: len(data)] = data
                    return len(data)
                n = 0
                while chunk := await stream.readany():
                    if n + len(chunk) > len(buf):
                        raise TransientStoreError(f"more bytes than the {len(buf)} asked for")
                    buf[n : n + len(chunk)] = chunk
                    n += len(chunk)
                expected = int(response.get("ContentLength", n))
                if n != expected:
                    raise TransientStoreError(f"body ended after {n} of {expected} bytes")
                return n
            finally:
                body.close()

        return await asyncio.wait_for(go(), self.request_timeout_s)

    def read_into(self, key: str, start: int, buf: memoryview) -> int:
        """Read into ``buf`` from ``start`` of ``key``; botocore/aiohttp errors pass through."""
        from fsspec.asyn import sync

        return int(sync(self.fs.loop, self._read_into, key, start, buf))

    def raw(self, method: str, *, read_body: bool = False, **kwargs: Any) -> Any:
        """Call the S3 API ``method`` once; botocore/aiohttp exceptions pass through."""
        from fsspec.asyn import sync

        kwargs.setdefault("Bucket", self.bucket)
        return sync(self.fs.loop, self._request, method, kwargs, read_body)

    def call(self, method: str, what: str, *, read_body: bool = False, **kwargs: Any) -> Any:
        """Call ``method`` once, raising ckptstore errors (``what`` names the operation)."""
        try:
            return self.raw(method, read_body=read_body, **kwargs)
        except Exception as exc:  # noqa: BLE001 - translated, chained
            raise self.translate(exc, what) from exc

    def translate(self, exc: BaseException, what: str) -> Exception:
        return translate_s3_error(exc, what, self.bucket, self.endpoint)

    def integrity(
        self, body: Buffer | Sequence[Buffer], *, crc32c: int | None = None
    ) -> dict[str, Any]:
        """The checksum header for ``body`` (CRC32C or Content-MD5), per ``checksum``; a
        sequence of buffers is checksummed as their concatenation. ``crc32c``: the CRC32C
        of ``body`` if the caller computed it already (it is not hashed again)."""
        buffers = (body,) if isinstance(body, (bytes, bytearray, memoryview)) else body
        if self.checksum == "crc32c":
            crc = crc32c
            if crc is None:
                crc = 0
                for buf in buffers:
                    crc = _crc32c(buf, crc)
            return {"ChecksumCRC32C": b64(crc.to_bytes(4, "big"))}
        if self.checksum == "md5":
            md5 = hashlib.md5()
            for buf in buffers:
                md5.update(buf)
            return {"ContentMD5": b64(md5.digest())}
        return {}

    def list_sizes(self, prefix: str) -> dict[str, int]:
        """``{key: size}`` of every object under ``prefix`` (ListObjectsV2, every page)."""
        out: dict[str, int] = {}
        kwargs: dict[str, Any] = {"Prefix": prefix}
        what = f"listing of s3://{self.bucket}/{prefix}"
        while True:
            page = self.call("list_objects_v2", what, **kwargs)
            out.update((obj["Key"], int(obj["Size"])) for obj in page.get("Contents", []))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return out
            kwargs["ContinuationToken"] = token

    def list_objects(self, prefix: str, delimiter: str = "") -> tuple[list[str], list[str]]:
        """(keys, common prefixes) under ``prefix``, every page of ListObjectsV2."""
        keys: list[str] = []
        dirs: list[str] = []
        kwargs: dict[str, Any] = {"Prefix": prefix}
        if delimiter:
            kwargs["Delimiter"] = delimiter
        what = f"listing of s3://{self.bucket}/{prefix}"
        while True:
            page = self.call("list_objects_v2", what, **kwargs)
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
            dirs.extend(p["Prefix"] for p in page.get("CommonPrefixes", []))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return keys, dirs
            kwargs["ContinuationToken"] = token

    def list_uploads(self, prefix: str) -> list[dict[str, Any]]:
        """Every unfinished upload whose key starts with ``prefix`` (ListMultipartUploads)."""
        kwargs: dict[str, Any] = {"Prefix": prefix}
        out: list[dict[str, Any]] = []
        what = f"listing of uploads at s3://{self.bucket}/{prefix}"
        while True:
            page = self.call("list_multipart_uploads", what, **kwargs)
            uploads = page.get("Uploads", [])
            out.extend(uploads)
            if not page.get("IsTruncated") or not uploads:
                return out
            # SeaweedFS omits NextKeyMarker: continue from the last upload listed.
            kwargs["KeyMarker"] = page.get("NextKeyMarker") or uploads[-1]["Key"]
            kwargs["UploadIdMarker"] = page.get("NextUploadIdMarker") or uploads[-1]["UploadId"]

    def list_parts(self, key: str, upload_id: str) -> list[dict[str, Any]]:
        """Every part the server holds for an unfinished upload (ListParts)."""
        kwargs: dict[str, Any] = {"Key": key, "UploadId": upload_id}
        parts: list[dict[str, Any]] = []
        while True:
            page = self.call(
                "list_parts", f"listing of parts of s3://{self.bucket}/{key}", **kwargs
            )
            parts.extend(page.get("Parts", []))
            marker = page.get("NextPartNumberMarker")
            if not page.get("IsTruncated") or not marker:
                return parts
            kwargs["PartNumberMarker"] = marker

    def probe_conditional(self, key: str) -> bool:
        """Whether PutObject honours ``If-None-Match: *``: create ``key`` twice, expect 412.

        The scratch object is deleted afterwards.
        """
        what = f"probe of conditional writes at s3://{self.bucket}/{key}"
        try:
            try:
                self.raw("put_object", Key=key, Body=b"1", IfNoneMatch="*")
            except Exception as exc:  # noqa: BLE001
                code, status = error_code(exc)
                if code == "NotImplemented" or status == 501:
                    return False
                raise self.translate(exc, what) from exc
            try:
                self.raw("put_object", Key=key, Body=b"2", IfNoneMatch="*")
            except Exception as exc:  # noqa: BLE001
                code, status = error_code(exc)
                if status == 412 or code == "PreconditionFailed":
                    return True
                raise self.translate(exc, what) from exc
            return False
        finally:
            try:
                self.raw("delete_object", Key=key)
            except Exception:  # noqa: BLE001 - a leftover scratch object is harmless
                pass
