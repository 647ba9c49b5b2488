"""The Google Cloud Storage store, on gcsfs's client (session, credentials, endpoint).

Requests go through ``gcsfs.core.GCSFileSystem``'s aiohttp session and credentials, but
not through gcsfs's own retry loop: the transfer engine's ``RetryConfig`` decides what is
retried, and ``RetryConfig.request_timeout_s`` bounds each request. Multipart writes
(parts + compose) and create-only writes are :class:`GCSStore`'s docstring.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.store import Buffer, Capabilities, Entry, Multipart, Part, Store, join_path
from ckptstore.errors import (
    CommitConflictError,
    ConfigError,
    CorruptCheckpointError,
    StoreAccessError,
    StoreNotFoundError,
    TransientStoreError,
    missing_dependency,
)
from ckptstore.stores.gcs_client import GCSClient, b64crc, combined_crc, crc_of, parallel
from ckptstore.stores.storage_options import check_gcs_options, refuse_userinfo

try:
    import aiohttp
    from gcsfs.core import quote
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


class GCSStore(Store):
    """A store rooted at ``gs://bucket/prefix`` (``gcs://`` too).

    ``storage_options`` are gcsfs's: ``token``, ``project``, ``endpoint_url``,
    ``requester_pays``, ``session_kwargs`` ...; ``requests_timeout`` overrides
    ``retry.request_timeout_s``.

    Multipart writes are GCS's native parallel path, parts + compose::

        up = store.begin_multipart("a/shard")        # no request: a fresh upload id
        store.put_part(up, n, offset, data)          # any order, in parallel: each part is its
                                                     # own object a/shard.ckptstore-parts-<id>/<n>,
                                                     # its server CRC32C checked against ours
        store.complete_multipart(up, parts)          # compose (<= 32 sources per call, as a tree),
                                                     # check the composite's CRC32C, delete parts
        store.abort_multipart(up)                    # delete every part object (idempotent)

    A composite object may have at most 1024 components, so ``capabilities.max_parts`` is
    1024 (the engine grows its part size to fit). ``list_multipart`` finds leftover part
    prefixes of uploads that crashed, so a sweeper can abort them.

    ``put_if_absent`` is an upload with ``ifGenerationMatch=0``: GCS answers 412 to every
    writer but the first (fake-gcs-server honours it for ``uploadType=multipart`` uploads,
    which is what every write here uses). A 412 whose object holds exactly our bytes is a win
    (a retried request whose first try landed). Whole-object writes send their CRC32C, which GCS
    verifies, and check the CRC32C GCS reports back.
    """

    #: A composite object has at most 1024 components; parts may be of any size.
    capabilities = Capabilities(max_parts=1024)

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryConfig | None = None,
        _client: GCSClient | None = None,
    ) -> None:
        scheme, sep, rest = url.partition("://")
        if not sep or scheme.lower() not in ("gs", "gcs") or not rest.strip("/"):
            raise ConfigError(f"expected a gs://bucket/path URL, got {url!r}")
        bucket, _, root = rest.strip("/").partition("/")
        refuse_userinfo(url, bucket)
        if _client is None:
            check_gcs_options(url, storage_options or {})
        super().__init__(
            f"gs://{bucket}/{root}" if root else f"gs://{bucket}", storage_options, retry=retry
        )
        self.bucket = bucket
        self.root = root.strip("/")
        self._client = _client or GCSClient(self.storage_options, self.retry)

    def child(self, prefix: str) -> GCSStore:
        url = f"{self.url}/{prefix.strip('/')}"
        return GCSStore(url, self.storage_options, retry=self.retry, _client=self._client)

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
        writer.append_json({"name": self._key(path), "crc32c": b64crc(crc)})
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
        if meta.get("crc32c") not in (None, b64crc(crc)):
            raise TransientStoreError(
                f"{what}: GCS stored CRC32C {meta['crc32c']} but {b64crc(crc)} was sent; the "
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
        return crc_of(self._metadata(path))

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

    def copy(self, src: str, dst: str) -> None:
        """A compose of the one source (a server-side copy); the CRC32C GCS reports for what
        landed must be the source's, and its size too."""
        what = f"copy of {self.describe(src)} to {dst}"
        source = self._metadata(src)
        meta = self._compose([src], dst, what)
        if crc_of(meta) != crc_of(source) or int(meta["size"]) != int(source["size"]):
            self.delete(dst)
            raise CorruptCheckpointError(
                f"{what}: the copy ({meta.get('size')} bytes, crc32c {meta.get('crc32c')}) is "
                f"not the source ({source['size']} bytes, crc32c {source.get('crc32c')}); it "
                "was deleted"
            )

    def delete(self, path: str) -> None:
        what = f"delete of {self.describe(path)}"
        status, body = self._client.request("DELETE", self._object_url(path), what)
        if status >= 300 and status != 404:
            raise self._error(status, body, what, path)

    def delete_many(self, paths: Iterable[str]) -> None:
        parallel(self.delete, list(paths))

    def delete_prefix(self, prefix: str) -> None:
        parallel(self.delete, self.find(prefix))

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
        crc = crc_of(meta)
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
        """Compose the parts (a tree past 32), check the CRC32C, delete the parts.

        A retry after the first try completed (the parts gone, the object whole) succeeds.
        """
        try:
            self._complete(upload, sorted(parts, key=lambda p: p.number))
        except (StoreNotFoundError, TransientStoreError):  # GCS: 404; fake-gcs-server: 500
            first = f"{self._parts_dir(upload)}/{min((p.number for p in parts), default=1):05d}"
            if not self.exists(first) and self._whole(upload.path, sum(p.size for p in parts)):
                return  # the parts are gone because they were composed
            raise

    def _whole(self, path: str, total: int) -> bool:
        try:
            return self.size(path) == total
        except StoreNotFoundError:
            return False

    def _complete(self, upload: Multipart, parts: list[Part]) -> None:
        what = f"compose of {self.describe(upload.path)}"
        base = self._parts_dir(upload)
        sources = [f"{base}/{p.number:05d}" for p in parts]
        made: list[str] = []
        level = 0
        while len(sources) > COMPOSE_MAX:  # a tree: 32 parts per intermediate object
            groups = [sources[i : i + COMPOSE_MAX] for i in range(0, len(sources), COMPOSE_MAX)]
            targets = [f"{base}/c{level}-{i:05d}" for i in range(len(groups))]
            jobs = list(zip(groups, targets, strict=True))
            parallel(lambda job: self._compose(job[0], job[1], what), jobs)
            made += targets
            sources, level = targets, level + 1
        meta = self._compose(sources, upload.path, what)
        expected = combined_crc(parts)
        if expected is not None and meta.get("crc32c") not in (None, b64crc(expected)):
            self.delete(upload.path)
            raise TransientStoreError(
                f"{what}: the composed object's CRC32C {meta['crc32c']} does not match its "
                f"parts' ({b64crc(expected)}); it was deleted"
            )
        try:
            parallel(self.delete, [*(f"{base}/{p.number:05d}" for p in parts), *made])
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
