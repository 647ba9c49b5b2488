"""Helpers shared by the object-store backends.

- ``NonAtomicCreateWarning`` and ``warn_non_atomic``: a store whose server cannot do a
  create-only write falls back to check-then-write and says so, once per store URL.
- ``create_lock``: serialises the check-then-write of one path inside this process, so the
  fallback is exact between threads (it stays best effort between processes).
- ``same_bytes``: after a create-only write reports "already exists", tells a retry of our
  own write whose first response was lost (the object holds exactly our bytes) from a real
  conflict with another writer.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable

from ckptstore.engine.store import Buffer

__all__ = ["NonAtomicCreateWarning", "warn_non_atomic", "create_lock", "same_bytes"]


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
    from ckptstore.errors import CkptStoreError

    try:
        return read() == bytes(data)
    except CkptStoreError:
        return False
