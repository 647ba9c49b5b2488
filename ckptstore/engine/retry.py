"""Retries with exponential backoff and jitter, bounded by attempts and a deadline.

``call_with_retry`` runs one call under a ``RetryConfig``; ``retrying(store)`` is the view
through which every control call (GET/HEAD/LIST/delete) of a checkpoint is retried.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from ckptstore.config import RetryConfig
from ckptstore.engine.store import Buffer, Entry, Multipart, Part, Store
from ckptstore.errors import TransferError, TransientStoreError

__all__ = [
    "backoff_delay",
    "call_with_retry",
    "RetryStats",
    "Deadline",
    "RetryingStore",
    "retrying",
    "unretried",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


def backoff_delay(config: RetryConfig, attempt: int, rand: float) -> float:
    """Seconds to sleep before try ``attempt`` (2-based; try 1 has no delay).

    ``rand`` in [0, 1) picks the jitter: the delay is scaled into [1 - jitter, 1].
    """
    if attempt < 2:
        return 0.0
    base = min(config.max_backoff_s, config.base_backoff_s * 2 ** (attempt - 2))
    return base * (1.0 - config.jitter * rand)


class RetryStats:
    """Counts of retries and of calls that ran out of retries, shared by an engine's threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.retries = 0
        self.failures = 0

    def count(self, retries: int = 0, failures: int = 0) -> None:
        """Add ``retries`` retries and ``failures`` calls that gave up (thread-safe)."""
        with self._lock:
            self.retries += retries
            self.failures += failures


class Deadline:
    """An absolute point in time after which no new try is started."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        """Seconds left until the deadline; negative once it has passed."""
        return self.at - time.monotonic()


def call_with_retry(
    fn: Callable[[], T],
    config: RetryConfig,
    what: str,
    *,
    deadline: Deadline | None = None,
    stats: RetryStats | None = None,
) -> T:
    """Call ``fn`` until it succeeds, retrying only ``TransientStoreError``.

    Any other exception propagates at once (fail fast on 403/404/ENOSPC ...). When the
    attempts or the deadline run out, raises ``TransferError`` naming ``what``.
    """
    deadline = deadline or Deadline(config.deadline_s)
    attempt = 1
    while True:
        try:
            return fn()
        except TransientStoreError as exc:
            if attempt >= config.attempts:
                if stats:
                    stats.count(failures=1)
                raise TransferError(
                    f"{what} failed after {attempt} attempts: {exc}. The store kept failing "
                    "with transient errors; check its health and the network, then retry."
                ) from exc
            delay = backoff_delay(config, attempt + 1, random.random())
            if deadline.remaining() < delay:
                if stats:
                    stats.count(failures=1)
                raise TransferError(
                    f"{what} did not finish within its {deadline.seconds:.0f} s deadline "
                    f"(last error: {exc}). Raise RetryConfig.deadline_s or check the link."
                ) from exc
            log.info("retrying %s in %.2fs after: %s", what, delay, exc)
            if stats:
                stats.count(retries=1)
            time.sleep(delay)
            attempt += 1


class RetryingStore(Store):
    """A view of ``inner`` whose control calls are retried per ``config``.

    The one mechanism by which ckptstore retries *control* calls (marker and manifest GETs,
    HEAD/size/exists, LIST, deletes): ``retrying(store, config)`` wraps a store once (it is
    idempotent) wherever a checkpoint is opened, committed, listed or cleaned up (the
    manager's root, ``open_committed``, ``commit``, the reader), so every call through it,
    including those of catalog listing and retention, is retried without each call site
    remembering to. A view rather than wrapping each call site: call sites in five modules
    and two layers (engine, manager) would each need the engine at hand and one missed
    site is the bug this fixes; ``child()`` keeps the view.

    *Data* calls (``get_into``, ``put``, ``put_if_absent``, multipart) pass straight
    through: the transfer engine already retries each of them under the transfer's own
    deadline (and the commit retries ``put_if_absent`` itself), so retrying them here too
    would multiply the attempts. The engine reaches the raw store with :func:`unretried`.
    Only ``TransientStoreError`` is retried; deletes are idempotent (a missing file is not
    an error), so a retried delete whose first response was lost is harmless.
    """

    def __init__(self, inner: Store, config: RetryConfig, stats: RetryStats | None = None):
        super().__init__(inner.url, inner.storage_options, retry=inner.retry)
        self.inner = inner
        self.config = config
        self.stats = stats
        self.capabilities = inner.capabilities

    def __getattr__(self, name: str) -> Any:
        # Store-specific attributes (a LocalStore's root, ...) read through the view.
        return getattr(self.__dict__["inner"], name)

    def __repr__(self) -> str:
        return repr(self.inner)

    def _retry(self, fn: Callable[[], T], what: str, path: str) -> T:
        return call_with_retry(fn, self.config, f"{what} {self.describe(path)}", stats=self.stats)

    def describe(self, path: str = "") -> str:
        """``inner``'s description of ``path`` (its full URL)."""
        return self.inner.describe(path)

    def child(self, prefix: str) -> RetryingStore:
        """``inner``'s child at ``prefix``, seen through a view with the same config and stats."""
        return RetryingStore(self.inner.child(prefix), self.config, self.stats)

    def get(self, path: str, start: int = 0, end: int | None = None) -> bytes:
        """``inner.get``, retried on ``TransientStoreError``."""
        return self._retry(lambda: self.inner.get(path, start, end), "read of", path)

    def size(self, path: str) -> int:
        """``inner.size``, retried on ``TransientStoreError``."""
        return self._retry(lambda: self.inner.size(path), "size of", path)

    def exists(self, path: str) -> bool:
        """``inner.exists``, retried on ``TransientStoreError``."""
        return self._retry(lambda: self.inner.exists(path), "existence check of", path)

    def find(self, prefix: str = "") -> list[str]:
        """``inner.find``, retried on ``TransientStoreError``."""
        return self._retry(lambda: self.inner.find(prefix), "listing of", prefix)

    def listdir(self, prefix: str = "") -> list[str]:
        """``inner.listdir``, retried on ``TransientStoreError``."""
        return self._retry(lambda: self.inner.listdir(prefix), "listing of", prefix)

    def scan(self, prefix: str = "") -> list[Entry]:
        """``inner.scan``, retried on ``TransientStoreError``."""
        return self._retry(lambda: self.inner.scan(prefix), "listing of", prefix)

    def delete(self, path: str) -> None:
        """``inner.delete``, retried on ``TransientStoreError``."""
        self._retry(lambda: self.inner.delete(path), "deletion of", path)

    def delete_many(self, paths: Iterable[str]) -> None:
        """``inner.delete_many``, retried on ``TransientStoreError``."""
        names = list(paths)  # retried as a whole: each delete is idempotent
        self._retry(lambda: self.inner.delete_many(names), "deletion of", ", ".join(names[:3]))

    def remove_empty_dirs(self, prefix: str = "") -> None:
        """``inner.remove_empty_dirs``, retried on ``TransientStoreError``."""
        self._retry(lambda: self.inner.remove_empty_dirs(prefix), "directory cleanup of", prefix)

    def delete_prefix(self, prefix: str) -> None:
        """``inner.delete_prefix``, retried on ``TransientStoreError``."""
        self._retry(lambda: self.inner.delete_prefix(prefix), "deletion of", prefix)

    def list_multipart(self, prefix: str = "") -> list[Multipart]:
        """``inner.list_multipart``, retried on ``TransientStoreError``."""
        return self._retry(lambda: self.inner.list_multipart(prefix), "upload listing of", prefix)

    # -- data calls: retried by the transfer engine --------------------------------------
    def get_into(self, path: str, start: int, buf: memoryview) -> int:
        """``inner.get_into`` as is: its callers retry it through the transfer engine."""
        return self.inner.get_into(path, start, buf)

    def put(self, path: str, data: Buffer) -> None:
        """``inner.put`` as is: its callers retry it through the transfer engine."""
        self.inner.put(path, data)

    def put_many(self, items: Sequence[tuple[str, Buffer]]) -> None:
        """``inner.put_many`` as is: its callers retry it through the transfer engine."""
        self.inner.put_many(items)

    def put_if_absent(self, path: str, data: Buffer) -> None:
        """``inner.put_if_absent`` as is: its callers retry it through the transfer engine."""
        self.inner.put_if_absent(path, data)

    def begin_multipart(self, path: str) -> Multipart:
        """``inner.begin_multipart`` as is: its callers retry it through the transfer engine."""
        return self.inner.begin_multipart(path)

    def put_part(self, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
        """``inner.put_part`` as is: its callers retry it through the transfer engine."""
        return self.inner.put_part(upload, number, offset, data)

    def put_part_buffers(
        self,
        upload: Multipart,
        number: int,
        offset: int,
        buffers: Sequence[Buffer],
        *,
        crc32c: int | None = None,
    ) -> Part:
        """``inner.put_part_buffers`` as is: its callers retry it through the transfer engine."""
        return self.inner.put_part_buffers(upload, number, offset, buffers, crc32c=crc32c)

    def complete_multipart(self, upload: Multipart, parts: Sequence[Part]) -> None:
        """``inner.complete_multipart`` as is: its callers retry it through the transfer engine."""
        self.inner.complete_multipart(upload, parts)

    def abort_multipart(self, upload: Multipart) -> None:
        """``inner.abort_multipart`` as is: its callers retry it through the transfer engine."""
        self.inner.abort_multipart(upload)

    def close(self) -> None:
        """Close ``inner``."""
        self.inner.close()


def retrying(
    store: Store, config: RetryConfig | None = None, stats: RetryStats | None = None
) -> Store:
    """``store`` with its control calls retried (see :class:`RetryingStore`); a store
    that is already such a view is returned as it is."""
    if isinstance(store, RetryingStore):
        return store
    return RetryingStore(store, config or RetryConfig(), stats)


def unretried(store: Store) -> Store:
    """The store under a :class:`RetryingStore` view (for calls retried by the caller)."""
    return store.inner if isinstance(store, RetryingStore) else store
