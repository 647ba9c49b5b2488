"""Create-only writes where a store has no native one, and telling a lost response apart.

- ``NonAtomicCreateWarning`` and ``warn_non_atomic``: a store whose server cannot do a
  create-only write falls back to check-then-write and says so, once per store URL.
- ``create_lock``: serialises the check-then-write of one path inside this process, so the
  fallback is exact between threads (it stays best effort between processes).
- ``same_bytes``: after a create-only write reports "already exists", tells a retry of our
  own write whose first response was lost (the object holds exactly our bytes) from a real
  conflict with another writer.
- ``check_then_put``: the fallback itself; ``Store.put_if_absent``'s default.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from ckptstore.errors import CkptStoreError, CommitConflictError

if TYPE_CHECKING:
    from ckptstore.engine.store import Buffer, Store

__all__ = [
    "NonAtomicCreateWarning",
    "warn_non_atomic",
    "create_lock",
    "same_bytes",
    "check_then_put",
]


class NonAtomicCreateWarning(UserWarning):
    """``put_if_absent`` is a best-effort check-then-write on this store, not atomic."""


_warned: set[str] = set()
_locks: dict[str, threading.Lock] = {}
_guard = threading.Lock()


def warn_non_atomic(url: str, why: str) -> None:
    """Warn (once per ``url`` per process) that create-only writes there are best effort."""
    with _guard:
        if url in _warned:
            return
        _warned.add(url)
    warnings.warn(
        f"{url}: {why}; create-only writes (the COMMITTED marker) fall back to a best-effort "
        "check-then-write. Two jobs saving the same step at the same moment could both "
        "believe they committed: give each job its own checkpoint prefix.",
        NonAtomicCreateWarning,
        stacklevel=3,
    )


def create_lock(key: str) -> threading.Lock:
    """The process-wide lock for create-only writes of ``key`` (a full URL)."""
    with _guard:
        lock = _locks.get(key)
        if lock is None:
            lock = _locks[key] = threading.Lock()
        return lock


def same_bytes(read: Callable[[], bytes], data: Buffer) -> bool:
    """True if ``read()`` returns exactly ``data`` (False when it cannot be read)."""
    try:
        return read() == bytes(data)
    except CkptStoreError:
        return False


def check_then_put(store: Store, path: str, data: Buffer, why: str) -> None:
    """``put`` of ``path`` unless it exists (``CommitConflictError``): exact between the
    threads of this process, best effort between processes (warned once per store URL).

    An existing object holding exactly ``data`` is a retry of our own write whose first
    response was lost: that is a success, not a conflict.
    """
    warn_non_atomic(store.url, why)
    with create_lock(store.describe(path)):
        if store.exists(path):
            if same_bytes(lambda: store.get(path), data):
                return
            raise CommitConflictError(
                f"{store.describe(path)} already exists: another writer committed first"
            )
        store.put(path, data)
