"""The shard cache's locks: ``flock`` locks on lock files, the per-process gate in front of
them, and the node's byte ledger kept inside the budget lock file.

An ``flock`` belongs to the open file, so it excludes threads as well as processes and a
crashed process releases it; a forked child (a DataLoader worker) closes the lock fds it
inherits at once, so it never keeps its parent's locks held. A lock file is opened from the
cache directory's descriptor (``ckptstore.stores.Anchor.open_rw``): a link on the way or at
the name, or anything but a regular file there, is refused (``UnsafePathError``), never
written through or waited on.
"""

from __future__ import annotations

import fcntl
import os
import re
import threading
import time

from ckptstore.errors import CacheError
from ckptstore.stores import Anchor

__all__ = ["Ledger", "Lock", "process_gate"]

# Every lock fd this process holds open. A forked child (a DataLoader worker) closes its
# inherited copies at once: an flock belongs to the open file, so an inherited fd would keep
# the parent's lock held for as long as the child lives, even after the parent released it.
_OPEN_FDS: set[int] = set()
_FDS_LOCK = threading.Lock()


# Threads of one process waiting for the same exclusive flock queue on a threading.Lock
# first (see ``process_gate``); a forked child starts with fresh ones.
_GATES: dict[str, threading.Lock] = {}


def process_gate(path: str) -> threading.Lock:
    """The one threading.Lock of this process for the lock file ``path``.

    An flock is waited for by polling (a timeout must be possible), so threads that poll
    for it leave it free between their sleeps; behind this gate only one thread of the
    process polls, and the next one takes over the moment it is done.
    """
    with _FDS_LOCK:
        return _GATES.setdefault(path, threading.Lock())


def _close_inherited() -> None:
    global _FDS_LOCK
    _FDS_LOCK = threading.Lock()
    _GATES.clear()
    for fd in list(_OPEN_FDS):
        try:
            os.close(fd)
        except OSError:
            pass
    _OPEN_FDS.clear()


# Holding _FDS_LOCK across the fork means no thread is between opening a lock fd and
# registering it (or unregistering and closing it) when the child is made.
os.register_at_fork(
    before=lambda: _FDS_LOCK.acquire(),
    after_in_parent=lambda: _FDS_LOCK.release(),
    after_in_child=_close_inherited,
)


class Lock:
    """An ``flock`` on the lock file ``name`` below the cache directory ``paths``: per open
    file, so it also excludes threads. ``path`` is its full path, for messages.

    A crashed holder's lock is released by the kernel; a forked child never inherits one.
    Lock files are never deleted (a deleted-and-recreated lock file would let two holders
    lock different inodes).
    """

    def __init__(self, paths: Anchor, name: str) -> None:
        self.paths, self.name = paths, name
        self.path = paths.shown(name.split("/"))
        self._fd: int | None = None
        self._pid = 0

    def _open(self) -> int:
        if self._fd is None or self._pid != os.getpid():
            with _FDS_LOCK:
                try:
                    fd = self.paths.open_rw(self.name)
                except OSError as exc:
                    raise CacheError(
                        exc.errno or 0,
                        f"cannot create lock file {self.path} ({exc.strerror}); the cache_dir "
                        "must be writable",
                    ) from exc
                _OPEN_FDS.add(fd)
            self._fd, self._pid = fd, os.getpid()
        return self._fd

    def try_acquire(self, shared: bool = False) -> bool:
        """Take the lock (shared or exclusive) if it is free now; False if it is not."""
        mode = (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB
        try:
            fcntl.flock(self._open(), mode)
        except BlockingIOError:
            return False
        return True

    def acquire(
        self,
        shared: bool = False,
        timeout: float | None = None,
        what: str = "",
        on_wait: float | None = None,
        waiting: object = None,
    ) -> None:
        """Take the lock; with ``timeout``, poll and raise ``CacheError`` when it passes.

        ``waiting`` (a callable) is called once after ``on_wait`` s of waiting: a holder of
        other locks releases them there, so two processes never wait on each other.
        """
        if timeout is None:
            fcntl.flock(self._open(), fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            return
        start = time.monotonic()
        delay = 0.001
        called = False
        while not self.try_acquire(shared):
            waited = time.monotonic() - start
            if waited > timeout:
                raise CacheError(
                    f"waited {timeout:.0f} s for the {what or self.path} lock held by another "
                    "process; if that process hangs, stop it (a dead process releases its locks)"
                )
            if callable(waiting) and not called and on_wait is not None and waited > on_wait:
                waiting()
                called = True
            time.sleep(delay)
            delay = min(0.02, delay * 2)

    def fileno(self) -> int:
        """The lock file's descriptor (what :class:`Ledger` reads and writes)."""
        return self._open()

    def close(self) -> None:
        """Release the lock (closing the file releases the flock)."""
        fd, self._fd = self._fd, None
        if fd is not None and self._pid == os.getpid():  # a parent's fd is not ours to close
            with _FDS_LOCK:
                _OPEN_FDS.discard(fd)
                os.close(fd)

    def __enter__(self) -> Lock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_LEDGER = re.compile(rb" *([0-9]{1,19}) ([0-9]{1,19}) *\n?")


class Ledger:
    """The node's count of cache bytes, kept as text in the budget lock file itself.

    ``used``: bytes of cached and in-progress shards, an upper bound as long as every
    reservation adds to it. Bytes freed without the lock (a failed download's temp file, a
    corrupt copy discarded, a crashed process's leftovers) stay counted until the next
    recount, which writes the files' own sum. ``added``: bytes reserved since that recount.
    Read and written only while the lock is held. None when unreadable (a new cache, one an
    older version kept, anything else in the file): the caller recounts.
    """

    WIDTH = 48  # "used added", space-padded: a rewrite never leaves a longer one's tail

    def __init__(self, lock: Lock) -> None:
        self._fd = lock.fileno()

    @classmethod
    def parse(cls, data: bytes) -> tuple[int, int] | None:
        """``(used, added)`` from the file's first bytes, or None if they hold no valid count
        (only ``<digits> <digits>`` and padding count: the file is anyone's to write)."""
        m = _LEDGER.fullmatch(data[: cls.WIDTH])
        if m is None:
            return None
        return int(m.group(1)), int(m.group(2))

    def read(self) -> tuple[int, int] | None:
        """``(used, added)``, or None if the file holds no valid count."""
        try:
            return self.parse(os.pread(self._fd, self.WIDTH, 0))
        except OSError:
            return None

    def write(self, used: int, added: int) -> None:
        """Record ``used`` bytes in use and ``added`` bytes reserved since the last recount."""
        os.pwrite(self._fd, f"{used} {added}".ljust(self.WIDTH - 1).encode() + b"\n", 0)

    def free(self, size: int) -> None:
        """Count ``size`` bytes as freed (an eviction, a reservation given back)."""
        known = self.read()
        if known is not None:
            self.write(max(0, known[0] - size), known[1])
