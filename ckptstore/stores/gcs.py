"""The Google Cloud Storage store, on gcsfs's client (session, credentials, endpoint).

Requests go through ``gcsfs.core.GCSFileSystem``'s aiohttp session and credentials, but
not through gcsfs's own retry loop: the transfer engine's ``RetryConfig`` decides what is
retried, and ``RetryConfig.request_timeout_s`` bounds each request.

Multipart writes are GCS's native parallel path, parts + compose::

    up = store.begin_multipart("a/shard")        # no request: a fresh upload id
    store.put_part(up, n, offset, data)          # any order, in parallel: each part is its
                                                 # own object a/shard.ckptstore-parts-<id>/<n>,
                                                 # its server CRC32C checked against ours
    store.complete_multipart(up, parts)          # compose (<= 32 sources per call, as a tree),
                                                 # check the composite's CRC32C, delete parts
    store.abort_multipart(up)                    # delete every part object (idempotent)

A composite object may have at most 1024 components, so ``max_parts`` is 1024 (the engine
grows its part size to fit). ``list_multipart`` finds leftover part prefixes of uploads
that crashed, so a sweeper can abort them.

``put_if_absent`` is an upload with ``ifGenerationMatch=0``: GCS answers 412 to every
writer but the first (fake-gcs-server honours it for ``uploadType=multipart`` uploads,
which is what every write here uses). A 412 whose object holds exactly our bytes is a win
(a retried request whose first try landed). Whole-object writes send their CRC32C, which GCS
verifies, and check the CRC32C GCS reports back.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import struct
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine.checksum import crc32c, crc32c_combine
from ckptstore.engine.store import Buffer, Entry, Multipart, Part, Store, join_path
from ckptstore.errors import (
    CommitConflictError,
    ConfigError,
    StoreAccessError,
    StoreNotFoundError,
    TransientStoreError,
    missing_dependency,
)
from ckptstore.stores._cloud import Reachability

try:
    import aiohttp
    from fsspec.asyn import sync
    from gcsfs.core import GCSFileSystem, quote
    from google.auth.exceptions import RefreshError
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise missing_dependency("gcsfs", "gcs") from _exc

__all__ = ["GCSStore", "PARTS_MARK", "COMPOSE_MAX"]

_BEGUN = "begun"

log = logging.getLogger(__name__)

#: Part objects of upload <id> of <path> are named ``<path>.ckptstore-parts-<id>/<n>``.
PARTS_MARK = ".ckptstore-parts-"
#: Most source objects one compose request may name.
COMPOSE_MAX = 32
_TRANSIENT = {408, 429, 500, 502, 503, 504}


def _b64crc(value: int) -> str:
    return base64.b64encode(struct.pack(">I", value)).decode()


class _Client:
    """One gcsfs file system plus the state every store on it shares."""

    def __init__(self, options: dict[str, Any], retry: RetryConfig) -> None:
        options = dict(options)
        timeout = options.pop("requests_timeout", None) or retry.request_timeout_s
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self.timeout_s = float(timeout)
        self.fs = GCSFileSystem(**options)
        self.reach = Reachability(self.fs._location)
        self.buckets_seen: set[str] = set()

    async def _send(self, method: str, url: str, params: dict, headers: dict | None, body: Any):
        fs = self.fs
        await fs._set_session()
        if isinstance(body, dict):
            kw: dict[str, Any] = {"json": body}
        else:
            kw = {"data": body}
        async with fs.session.request(
            method,
            url,
            params=fs._get_params(params),
            headers=fs._get_headers(headers),
            timeout=self.timeout,
            **kw,
        ) as r:
            return r.status, await r.read()

    def request(
        self,
        method: str,
        url: str,
        what: str,
        *,
        params: dict | None = None,
        headers: dict | None = None,
        body: Any = None,
    ) -> tuple[int, bytes]:
        """Send one request; connection failures and timeouts become ckptstore errors."""
        if not url.startswith("http"):
            url = self.fs.base + url
        try:
            out = sync(
                self.fs.loop,
                self._send,
                method,
                url,
                params or {},
                headers,
                body,
                timeout=self.timeout_s + 5,
            )
        except (asyncio.TimeoutError, TimeoutError) as exc:
            raise TransientStoreError(
                f"{what}: no answer within {self.timeout_s:g} s (RetryConfig.request_timeout_s)"
            ) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise self.reach.connection_error(exc, what) from exc
        except RefreshError as exc:  # google.auth could not refresh the token (yet)
            raise TransientStoreError(f"{what}: credential refresh failed ({exc})") from exc
        self.reach.reached = True
        return out


class GCSStore(Store):
    """A store rooted at ``gs://bucket/prefix`` (``gcs://`` too).

    ``storage_options`` are gcsfs's: ``token``, ``project``, ``endpoint_url``,
    ``requester_pays``, ``session_kwargs`` ...; ``requests_timeout`` overrides
    ``retry.request_timeout_s``.
    """

    max_parts = 1024  # a composite object has at most 1024 components
    min_part_size = 1

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryConfig | None = None,
        _client: _Client | None = None,
    ) -> None:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in ("gs", "gcs") or not rest.strip("/"):
            raise ConfigError(f"expected a gs://bucket/path URL, got {url!r}")
        bucket, _, root = rest.strip("/").partition("/")
        super().__init__(f"gs://{bucket}/{root}" if root else f"gs://{bucket}")
        self.bucket = bucket
        self.root = root.strip("/")
        self._client = _client or _Client(storage_options or {}, retry or RetryConfig())

    def child(self, prefix: str) -> GCSStore:
        return GCSStore(f"{self.url}/{prefix.strip('/')}", _client=self._client)

    def close(self) -> None:
        """Nothing to do: the gcsfs session is shared with other stores of the process."""

    # -- requests ----------------------------------------------------------------------
    def _key(self, path: str) -> str:
        return join_path(self.root, path)

    def _object_url(self, path: str, suffix: str = "") -> str:
        return f"b/{quote(self.bucket)}/o/{quote(self._key(path))}{suffix}"

    def _call(self, method: str, url: str, what: str, *, path: str = "", **kw: Any) -> bytes:
        status, body = self._client.request(method, url, what, **kw)
        if status < 300:
            return body
        raise self._error(status, body, what, path)

    def _error(self, status: int, body: bytes, what: str, path: str) -> Exception:
        try:
            message = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = body[:200].decode(errors="replace")
        detail = f"{what}: HTTP {status} {message}".rstrip()
        if status in _TRANSIENT:
            return TransientStoreError(detail)
        if status in (401, 403):
            return StoreAccessError(
                f"{detail}. GCS refused the credentials for {self.describe(path)}: check "
                "storage_options['token'] (or GOOGLE_APPLICATION_CREDENTIALS) and that the "
                f"account may read and write objects in bucket {self.bucket!r}."
            )
        if status == 404:
            if not self._bucket_exists(what):
                return StoreNotFoundError(
                    f"{what}: bucket {self.bucket!r} does not exist at "
                    f"{self._client.fs._location}. Create it (gcloud storage buckets create "
                    f"gs://{self.bucket}) or fix the URL / endpoint_url."
                )
            return StoreNotFoundError(f"{what}: no such object")
        return StoreAccessError(f"{detail}; the request was refused and will not be retried")

    def _bucket_exists(self, what: str) -> bool:
        if self.bucket in self._client.buckets_seen:
            return True
        status, _ = self._client.request("GET", f"b/{quote(self.bucket)}", what)
        if status == 200:
            self._client.buckets_seen.add(self.bucket)
        return status != 404

    def _upload(self, path: str, data: Buffer, what: str, **params: Any) -> dict:
        """One ``uploadType=multipart`` upload; checks the CRC32C GCS reports."""
        view = memoryview(data).cast("B")
        crc = crc32c(view)
        writer = aiohttp.MultipartWriter("related")
        writer.append_json({"name": self._key(path), "crc32c": _b64crc(crc)})
        writer.append(view, {"Content-Type": "application/octet-stream"})
        url = f"{self._client.fs._location}/upload/storage/v1/b/{quote(self.bucket)}/o"
        params = {"uploadType": "multipart", **params}
        status, body = self._client.request("POST", url, what, params=params, body=writer)
        if status == 412:  # only sent with ifGenerationMatch=0: the object exists
            raise CommitConflictError(
                f"{self.describe(path)} already exists: another writer committed first"
            )
        if status >= 300:
            raise self._error(status, body, what, path)
        meta = json.loads(body)
        self._client.buckets_seen.add(self.bucket)
        if meta.get("crc32c") not in (None, _b64crc(crc)):
            raise TransientStoreError(
                f"{what}: GCS stored CRC32C {meta['crc32c']} but {_b64crc(crc)} was sent; the "
                "bytes were damaged in transit"
            )
        return meta

    def _list(self, prefix: str, delimiter: str = "") -> tuple[list[str], list[str]]:
        """Object names and (with a delimiter) common prefixes under bucket key ``prefix``."""
        names: list[str] = []
        prefixes: list[str] = []
        params: dict[str, Any] = {"prefix": prefix, "maxResults": 1000}
        if delimiter:
            params["delimiter"] = delimiter
        what = f"listing of {self.describe()}"
        while True:
            doc = json.loads(self._call("GET", f"b/{quote(self.bucket)}/o", what, params=params))
            names.extend(item["name"] for item in doc.get("items", []))
            prefixes.extend(doc.get("prefixes", []))
            if not doc.get("nextPageToken"):
                return names, prefixes
            params["pageToken"] = doc["nextPageToken"]

    def _rel(self, key: str) -> str:
        return key[len(self.root) + 1 :] if self.root else key

    # -- whole objects -----------------------------------------------------------------
    def put(self, path: str, data: Buffer) -> None:
        self._upload(path, data, f"write of {self.describe(path)}")

    def put_if_absent(self, path: str, data: Buffer) -> None:
        what = f"create-only write of {self.describe(path)}"
        try:
            self._upload(path, data, what, ifGenerationMatch="0")
        except CommitConflictError:
            # A retried request whose first try landed finds its own bytes: that is a win.
            if self.get(path) != bytes(data):
                raise

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        what = f"read of {self.describe(path)}"
        if end is not None and end <= start:
            self.size(path)
            return b""
        headers = None
        if start or end is not None:
            headers = {"Range": f"bytes={start}-{'' if end is None else end - 1}"}
        url = self._object_url(path)
        status, body = self._client.request(
            "GET", url, what, params={"alt": "media"}, headers=headers
        )
        if status == 416:  # the range starts at or after the end of the object
            return b""
        if status >= 300:
            raise self._error(status, body, what, path)
        if status == 200 and start and headers:  # a server that ignored Range
            body = body[start:end]
        return body

    def _metadata(self, path: str) -> dict:
        what = f"stat of {self.describe(path)}"
        return json.loads(self._call("GET", self._object_url(path), what, path=path))

    def size(self, path: str) -> int:
        return int(self._metadata(path)["size"])

    def object_crc32c(self, path: str) -> int | None:
        """The CRC32C GCS holds for ``path`` (None if it reports none)."""
        return _crc_of(self._metadata(path))

    def find(self, prefix: str = "") -> list[str]:
        key = self._key(prefix)
        names, _ = self._list(key)
        keep = [n for n in names if not key or n == key or n.startswith(key + "/")]
        return sorted(self._rel(n) for n in keep)

    def listdir(self, prefix: str = "") -> list[str]:
        key = self._key(prefix)
        base = key + "/" if key else ""
        names, prefixes = self._list(base, delimiter="/")
        out = {n[len(base) :] for n in names} | {p[len(base) :].rstrip("/") for p in prefixes}
        return sorted(n for n in out if n)

    def scan(self, prefix: str = "") -> list[Entry]:
        key = self._key(prefix)
        base = key + "/" if key else ""
        names, prefixes = self._list(base, delimiter="/")
        out = {Entry(n[len(base) :], "file") for n in names if not n.endswith("/")}
        out |= {Entry(p[len(base) :].rstrip("/"), "dir") for p in prefixes}
        return sorted((e for e in out if e.name), key=lambda e: (e.name, e.kind))

    def delete(self, path: str) -> None:
        what = f"delete of {self.describe(path)}"
        status, body = self._client.request("DELETE", self._object_url(path), what)
        if status >= 300 and status != 404:
            raise self._error(status, body, what, path)

    def delete_many(self, paths: Iterable[str]) -> None:
        _parallel(self.delete, list(paths))

    def delete_prefix(self, prefix: str) -> None:
        _parallel(self.delete, self.find(prefix))

    # -- multipart: parts as objects, then compose ---------------------------------------
    @staticmethod
    def _parts_dir(upload: Multipart) -> str:
        return f"{upload.path}{PARTS_MARK}{upload.upload_id}"

    def begin_multipart(self, path: str) -> Multipart:
        # A tiny "begun" object makes the upload visible to list_multipart (and its age
        # known to the sweeper) before any part has landed.
        upload = Multipart(path, uuid.uuid4().hex[:16], {"initiated": time.time()})
        begun = f"{self._parts_dir(upload)}/{_BEGUN}.{int(upload.extra['initiated'])}"
        self._upload(begun, b"", f"write of {self.describe(path)} (begin)")
        return upload

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        name = f"{self._parts_dir(upload)}/{number:05d}"
        what = f"write of {self.describe(upload.path)} (part {number})"
        meta = self._upload(name, data, what)
        crc = _crc_of(meta)
        return Part(number, offset, len(memoryview(data).cast("B")), etag=f"{crc:x}" if crc else "")

    def _compose(self, sources: Sequence[str], target: str, what: str) -> dict:
        body = {
            "kind": "storage#composeRequest",
            "sourceObjects": [{"name": self._key(s)} for s in sources],
            "destination": {"contentType": "application/octet-stream"},
        }
        out = self._call("POST", self._object_url(target, "/compose"), what, path=target, body=body)
        return json.loads(out)

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        what = f"compose of {self.describe(upload.path)}"
        parts = sorted(parts, key=lambda p: p.number)
        base = self._parts_dir(upload)
        sources = [f"{base}/{p.number:05d}" for p in parts]
        made: list[str] = []
        level = 0
        while len(sources) > COMPOSE_MAX:  # a tree: 32 parts per intermediate object
            groups = [sources[i : i + COMPOSE_MAX] for i in range(0, len(sources), COMPOSE_MAX)]
            targets = [f"{base}/c{level}-{i:05d}" for i in range(len(groups))]
            jobs = list(zip(groups, targets, strict=True))
            _parallel(lambda job: self._compose(job[0], job[1], what), jobs)
            made += targets
            sources, level = targets, level + 1
        meta = self._compose(sources, upload.path, what)
        expected = _combined_crc(parts)
        if expected is not None and meta.get("crc32c") not in (None, _b64crc(expected)):
            self.delete(upload.path)
            raise TransientStoreError(
                f"{what}: the composed object's CRC32C {meta['crc32c']} does not match its "
                f"parts' ({_b64crc(expected)}); it was deleted"
            )
        try:
            _parallel(self.delete, [*(f"{base}/{p.number:05d}" for p in parts), *made])
            self.delete_prefix(base)  # the "begun" object
        except Exception as exc:  # noqa: BLE001 - the object is complete; leftovers are swept
            log.warning("could not delete the part objects of %s: %s", what, exc)

    def abort_multipart(self, upload: Multipart) -> None:
        self.delete_prefix(self._parts_dir(upload))

    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        found: dict[tuple[str, str], Multipart] = {}
        for rel in self.find(prefix):
            head, mark, tail = rel.partition(PARTS_MARK)
            if mark and "/" in tail:
                upload_id, _, leaf = tail.partition("/")
                up = found.setdefault((head, upload_id), Multipart(head, upload_id))
                if leaf.startswith(f"{_BEGUN}."):
                    up.extra["initiated"] = float(leaf.split(".", 1)[1])
        return [found[k] for k in sorted(found)]


def _crc_of(meta: dict) -> int | None:
    """The CRC32C in GCS object metadata (base64 of 4 big-endian bytes), if any."""
    value = meta.get("crc32c")
    return int.from_bytes(base64.b64decode(value), "big") if value else None


def _combined_crc(parts: Sequence[Part]) -> int | None:
    """CRC32C of the parts' concatenation, from the CRCs GCS reported for each part."""
    if not parts or not all(p.etag for p in parts):
        return None
    value = int(parts[0].etag, 16)
    for p in parts[1:]:
        value = crc32c_combine(value, int(p.etag, 16), p.size)
    return value


def _parallel(fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
    """``[fn(x) for x in items]``, up to 16 at a time (deletes, compose tree levels)."""
    if len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(min(16, len(items)), thread_name_prefix="ckptstore-gcs") as pool:
        return list(pool.map(fn, items))
