"""The Azure Blob store, on azure-storage-blob's sync client (the client adlfs uses).

URLs: ``az://container/path``, ``abfs://container/path``, ``abfss://container/path`` (and
adlfs's ``abfs://container@account.dfs.core.windows.net/path``). ``storage_options`` are
adlfs's: ``connection_string``; or ``account_name`` with ``account_key``, ``sas_token``,
``credential``, or ``client_id``/``client_secret``/``tenant_id``; ``account_host``;
``anon``. The ``AZURE_STORAGE_*`` environment variables fill in what is not given, and
with no credential at all (and ``anon`` not true) ``DefaultAzureCredential`` is used. The
SDK's retries are off (``retry_total=0``): ``RetryConfig`` decides, and its
``request_timeout_s`` bounds each connect and read (the client: ``azure_client``).
Multipart writes: :class:`AzureStore`.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine.store import Buffer, Capabilities, Entry, Multipart, Part, Store, join_path
from ckptstore.errors import (
    CkptStoreError,
    CommitConflictError,
    CorruptCheckpointError,
    StoreAccessError,
    StoreNotFoundError,
    TransientStoreError,
    missing_dependency,
)
from ckptstore.stores.azure_client import SCHEMES, AzureClient, known_options, parse_url
from ckptstore.stores.storage_options import (
    check_names,
    rejected_by_client,
    rejected_error,
)

try:
    from azure.core.exceptions import (
        AzureError,
        ClientAuthenticationError,
        HttpResponseError,
        ResourceExistsError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )
    from azure.storage.blob import BlobBlock
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise missing_dependency("azure.storage.blob", "azure") from _exc

__all__ = ["AzureStore", "SCHEMES"]

_TRANSIENT = {408, 429, 500, 502, 503, 504}


class AzureStore(Store):
    """A store rooted at ``az://container/prefix`` (URLs and options: the module docstring).

    Multipart writes are Azure's native parallel path, stage block + commit block list::

        up = store.begin_multipart("a/shard")     # no request: a fresh upload id
        store.put_part(up, n, offset, data)       # Put Block, any order, in parallel; block
                                                  # id "<upload id>-<n:06d>": one length for all
        store.complete_multipart(up, parts)       # Put Block List in part order: the blob
                                                  # appears whole and durable, atomically
        store.abort_multipart(up)                 # no request (see below)

    Uncommitted blocks are invisible to readers and to normal listings; Azure discards them
    when any block list is next committed to that blob name, or after 7 days. There is no
    call that deletes only the uncommitted blocks of a name without touching a committed blob
    of that name, so ``abort_multipart`` sends nothing and ``list_multipart`` returns [].

    ``put_if_absent`` is Put Blob with ``If-None-Match: *``: every writer but the first gets
    409 BlobAlreadyExists (or 412) and raises ``CommitConflictError`` - unless the blob holds
    exactly our bytes (a retried request whose first try landed): that is a win.
    """

    #: At most 50,000 committed blocks per blob; blocks may be of any size.
    capabilities = Capabilities(max_parts=50_000)

    def __init__(
        self,
        url: str,
        storage_options: dict[str, Any] | None = None,
        *,
        retry: RetryConfig | None = None,
        _client: AzureClient | None = None,
    ) -> None:
        container, root, account = parse_url(url)
        if _client is None:
            check_names(url, storage_options or {}, known_options(), "the Azure client")
        scheme = url.split("://", 1)[0].lower()
        super().__init__(
            f"{scheme}://{url.split('://', 1)[1].strip('/')}", storage_options, retry=retry
        )
        self.container = container
        self.root = root
        self._owns_client = _client is None  # children share their parent's client
        try:
            self._client = _client or AzureClient(self.storage_options, self.retry, account)
        except (TypeError, ValueError, AttributeError, KeyError) as exc:  # the SDK's refusal
            if isinstance(exc, CkptStoreError) or not rejected_by_client(exc):
                raise
            raise rejected_error(self.url, exc, self.storage_options) from exc
        self._container = self._client.service.get_container_client(container)

    def child(self, prefix: str) -> AzureStore:
        url = f"{self.url}/{prefix.strip('/')}"
        return AzureStore(url, self.storage_options, retry=self.retry, _client=self._client)

    def close(self) -> None:
        """Close the client's connections (a child leaves its parent's client open)."""
        if self._owns_client:
            self._client.service.close()

    # -- requests ----------------------------------------------------------------------
    def _key(self, path: str) -> str:
        return join_path(self.root, path)

    def _blob(self, path: str) -> Any:
        return self._container.get_blob_client(self._key(path))

    def _run(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the SDK; translate its exceptions into ckptstore errors."""
        try:
            out = fn(*args, **kwargs)
        except AzureError as exc:
            raise self._error(exc, what) from exc
        self._client.reach.reached = True
        return out

    def _error(self, exc: AzureError, what: str) -> Exception:
        if isinstance(exc, ServiceRequestError):  # could not send: connect, DNS, TLS
            return self._client.reach.connection_error(exc, what)
        if isinstance(exc, ServiceResponseError):  # sent, no (complete) answer: timeout, reset
            return TransientStoreError(f"{what}: no complete answer from Azure ({exc})")
        self._client.reach.reached = True
        status = getattr(exc, "status_code", None)
        code = str(getattr(exc, "error_code", "") or "")
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
            return StoreAccessError(
                f"{what}: Azure refused the request ({status} {code}: {first}). Check the "
                "account key / SAS token / credential in storage_options and that it may "
                f"read and write blobs in container {self.container!r}."
            )
        if isinstance(exc, ResourceNotFoundError) or status == 404:
            if "ContainerNotFound" in code:
                return StoreNotFoundError(
                    f"{what}: container {self.container!r} does not exist in "
                    f"{self._client.service.url}. Create it (az storage container create "
                    f"-n {self.container}) or fix the URL."
                )
            return StoreNotFoundError(f"{what}: not found ({code or first})")
        if status in _TRANSIENT:
            return TransientStoreError(f"{what}: {status} {code}: {first}")
        if isinstance(exc, HttpResponseError):
            return StoreAccessError(f"{what}: {status} {code}: {first}; not retried")
        return TransientStoreError(f"{what}: {type(exc).__name__}: {first}")

    def _rel(self, key: str) -> str:
        return key[len(self.root) + 1 :] if self.root else key

    # -- whole objects -----------------------------------------------------------------
    def put(self, path: str, data: Buffer) -> None:
        what = f"write of {self.describe(path)}"
        body = bytes(data)  # upload_blob cannot read a memoryview
        self._run(what, self._blob(path).upload_blob, body, length=len(body), overwrite=True)

    def put_if_absent(self, path: str, data: Buffer) -> None:
        what = f"create-only write of {self.describe(path)}"
        body = bytes(data)
        try:
            # overwrite=False sends If-None-Match: *
            self._blob(path).upload_blob(body, length=len(body), overwrite=False)
        except ResourceExistsError:
            pass
        except HttpResponseError as exc:
            if exc.status_code not in (409, 412):
                raise self._error(exc, what) from exc
        except AzureError as exc:
            raise self._error(exc, what) from exc
        else:
            return
        # A retried request whose first try landed finds its own bytes: that is a win.
        if self.get(path) != body:
            raise CommitConflictError(
                f"{self.describe(path)} already exists: another writer committed first"
            )

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        what = f"read of {self.describe(path)}"
        if end is not None and end <= start:
            self.size(path)
            return b""
        length = None if end is None else end - start
        try:
            stream = self._blob(path).download_blob(
                offset=start if (start or length is not None) else None,
                length=length,
                max_concurrency=1,
            )
            return bytes(stream.readall())
        except HttpResponseError as exc:
            if exc.status_code == 416:  # the range starts at or after the end
                return b""
            raise self._error(exc, what) from exc
        except AzureError as exc:
            raise self._error(exc, what) from exc

    def size(self, path: str) -> int:
        props = self._run(f"stat of {self.describe(path)}", self._blob(path).get_blob_properties)
        return int(props.size)

    def _names(self, key_prefix: str) -> list[str]:
        what = f"listing of {self.describe()}"
        return self._run(
            what, lambda: [b.name for b in self._container.list_blobs(key_prefix or None)]
        )

    def find(self, prefix: str = "") -> list[str]:
        key = self._key(prefix)
        names = self._names(key)
        keep = [n for n in names if not key or n == key or n.startswith(key + "/")]
        return sorted(self._rel(n) for n in keep)

    def listdir(self, prefix: str = "") -> list[str]:
        key = self._key(prefix)
        base = key + "/" if key else ""

        def walk() -> list[str]:
            return [b.name for b in self._container.walk_blobs(base or None, delimiter="/")]

        names = self._run(f"listing of {self.describe(prefix)}", walk)
        return sorted({n[len(base) :].rstrip("/") for n in names} - {""})

    def scan(self, prefix: str = "") -> list[Entry]:
        key = self._key(prefix)
        base = key + "/" if key else ""

        def walk() -> list[str]:
            return [b.name for b in self._container.walk_blobs(base or None, delimiter="/")]

        names = self._run(f"listing of {self.describe(prefix)}", walk)
        out = {
            Entry(n[len(base) :].rstrip("/"), "dir" if n.endswith("/") else "file") for n in names
        }
        return sorted((e for e in out if e.name), key=lambda e: (e.name, e.kind))

    def copy(self, src: str, dst: str) -> None:
        """Copy Blob from the source's URL (in one account the store's own credentials
        authorise it), waited for; the length that landed must be the source's."""
        what = f"copy of {self.describe(src)} to {dst}"
        source, target = self._blob(src), self._blob(dst)
        size = self._run(what, source.get_blob_properties).size
        self._run(what, target.start_copy_from_url, source.url)
        deadline = time.monotonic() + self.retry.deadline_s
        props = self._run(what, target.get_blob_properties)
        while props.copy.status == "pending" and time.monotonic() < deadline:
            time.sleep(0.05)
            props = self._run(what, target.get_blob_properties)
        if props.copy.status != "success" or props.size != size:
            if props.copy.status == "pending":
                self._run(what, target.abort_copy, props.copy.id)
            self.delete(dst)
            raise CorruptCheckpointError(
                f"{what}: the copy ended {props.copy.status} with {props.size} of {size} "
                "bytes; it was deleted"
            )

    def delete(self, path: str) -> None:
        what = f"delete of {self.describe(path)}"
        try:
            self._blob(path).delete_blob()
        except ResourceNotFoundError as exc:
            if "ContainerNotFound" in str(getattr(exc, "error_code", "")):
                raise self._error(exc, what) from exc
        except AzureError as exc:
            raise self._error(exc, what) from exc

    # -- multipart: stage blocks, commit the block list ----------------------------------
    def begin_multipart(self, path: str) -> Multipart:
        return Multipart(path, uuid.uuid4().hex[:16])

    @staticmethod
    def block_id(upload: Multipart, number: int) -> str:
        """The block id of part ``number``: one length for every part of every upload.

        The SDK base64-encodes it on the wire (and decodes it in ``get_block_list``).
        """
        return f"{upload.upload_id}-{number:06d}"

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        what = f"write of {self.describe(upload.path)} (part {number})"
        view = memoryview(data).cast("B")
        block = self.block_id(upload, number)
        self._run(what, self._blob(upload.path).stage_block, block, view, length=len(view))
        return Part(number, offset, len(view), etag=block)

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        what = f"commit of {self.describe(upload.path)}"
        ordered = sorted(parts, key=lambda p: p.number)
        blocks = [BlobBlock(block_id=self.block_id(upload, p.number)) for p in ordered]
        self._run(what, self._blob(upload.path).commit_block_list, blocks)

    def abort_multipart(self, upload: Multipart) -> None:
        """Nothing to send: staged blocks are invisible and expire (class docstring)."""

    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        """Always []: uncommitted blocks are invisible to listings of committed blobs and
        Azure deletes them itself after 7 days, so there is nothing a sweeper could abort."""
        return []
