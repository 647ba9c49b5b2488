"""Memory for transfers: a pool of reusable part buffers under a byte budget, the copy
into them, and the future that joins the parallel parts of one transfer.

Call order::

    pool = BufferPool(limit)
    buf = pool.acquire(size, cancelled)   # blocks while ``limit`` bytes are handed out
    pool.release(buf)                     # once the part is sent (or dropped)
    pool.reserve(n, cancelled)            # the caller's own memory sent by reference...
    pool.unreserve(n)                     # ...counted against the same budget

Both are used from many threads at once (the caller's and the engine's I/O threads).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import TypeVar

import numpy as np

__all__ = ["BufferPool", "copy_into", "gather"]

T = TypeVar("T")

#: Smallest copy ``copy_into`` makes without the GIL (numpy's): below it the call costs
#: more than the copy.
UNLOCKED_COPY_MIN = 16 * 1024


def copy_into(dst: bytearray | memoryview, offset: int, src: memoryview) -> None:
    """Copy ``src`` (bytes) into ``dst`` at ``offset``; a large copy releases the GIL.

    A save copies its smaller writes into part buffers on the save thread; CPython's own
    buffer copy (slice assignment) holds the GIL, which the training loop in the same
    process needs (a thread copying 64 MiB buffers without pause slowed a Python loop in
    another thread by 56 %; with numpy's copy, which releases the GIL, by 18 %; measured).
    """
    n = len(src)
    if n < UNLOCKED_COPY_MIN:
        memoryview(dst)[offset : offset + n] = src
        return
    np.frombuffer(dst, np.uint8, n, offset)[:] = np.frombuffer(src, np.uint8)


class BufferPool:
    """Reusable part buffers; at most ``limit`` bytes of them are handed out at once.

    Reusing buffers matters: writing into fresh memory page-faults and costs several times
    a copy into a warm buffer. ``acquire`` blocks (back-pressure) while the limit is
    reached, except for a lone request larger than the limit.

    Counters (for tests and profiles; bytes): ``in_use`` (handed out + reserved now),
    ``buffers_out`` / ``peak_buffers_out`` (buffers handed out now / at most since
    ``reset_peaks``), ``created`` (buffer bytes ever allocated: what was not reused).
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._out = 0
        self._peak_out = 0
        self._peak_used = 0
        self._created = 0
        self._free: dict[int, list[bytearray]] = {}
        self._cond = threading.Condition()

    @property
    def in_use(self) -> int:
        """Bytes handed out or reserved and not yet given back."""
        with self._cond:
            return self._used

    @property
    def peak_in_use(self) -> int:
        """Most bytes handed out or reserved at once since ``reset_peaks``."""
        with self._cond:
            return self._peak_used

    @property
    def buffers_out(self) -> int:
        """Bytes of buffers handed out now (reservations of the caller's memory excluded)."""
        with self._cond:
            return self._out

    @property
    def peak_buffers_out(self) -> int:
        """Most bytes of buffers handed out at once since ``reset_peaks``."""
        with self._cond:
            return self._peak_out

    @property
    def created(self) -> int:
        """Bytes of buffers allocated so far (acquires the free buffers could not serve)."""
        with self._cond:
            return self._created

    def reset_peaks(self) -> None:
        """Start ``peak_in_use`` and ``peak_buffers_out`` again from what is out now."""
        with self._cond:
            self._peak_used, self._peak_out = self._used, self._out

    def acquire(self, size: int, cancelled: Callable[[], bool]) -> bytearray:
        """A buffer of ``size`` bytes (a pooled one when there is one); blocks while the
        limit is reached, until room is made or ``cancelled()`` is true."""
        with self._cond:
            self._wait_for_room(size, cancelled)
            self._out += size
            self._peak_out = max(self._peak_out, self._out)
            free = self._free.get(size)
            if free:
                return free.pop()
            self._created += size
        return bytearray(size)

    def reserve(self, size: int, cancelled: Callable[[], bool]) -> None:
        """Count ``size`` bytes of the caller's own memory, sent by reference, against the
        limit (blocking like ``acquire``), so such writes are back-pressured too."""
        with self._cond:
            self._wait_for_room(size, cancelled)

    def unreserve(self, size: int) -> None:
        """Give back a ``reserve``."""
        with self._cond:
            self._used -= size
            self._cond.notify_all()

    def _wait_for_room(self, size: int, cancelled: Callable[[], bool]) -> None:
        while self._used and self._used + size > self._limit and not cancelled():
            self._cond.wait(0.1)
        self._used += size
        self._peak_used = max(self._peak_used, self._used)

    def release(self, buf: bytearray) -> None:
        """Give back an ``acquire``d buffer; it is kept for reuse while the pool holds
        less than ``limit`` bytes of free buffers."""
        with self._cond:
            self._used -= len(buf)
            self._out -= len(buf)
            pooled = sum(len(b) for bufs in self._free.values() for b in bufs)
            if pooled + len(buf) <= self._limit:
                self._free.setdefault(len(buf), []).append(buf)
            self._cond.notify_all()


def gather(futures: Sequence[Future], combine: Callable[[], T]) -> Future[T]:
    """A future done when all ``futures`` are: ``combine()``'s value, or the first error.

    Even on an error it waits for every future: a read that fails must not leave other
    parts still writing into the caller's memory (reads can target the caller's tensors).
    """
    out: Future[T] = Future()
    remaining = [len(futures)]
    errors: list[BaseException] = []
    lock = threading.Lock()

    def done(f: Future) -> None:
        exc = f.exception()
        with lock:
            remaining[0] -= 1
            last = remaining[0] == 0
            if exc is not None:
                errors.append(exc)
        if not last:
            return
        if errors:
            out.set_exception(errors[0])
            return
        try:
            out.set_result(combine())
        except BaseException as e:  # noqa: BLE001
            out.set_exception(e)

    if not futures:
        out.set_result(combine())
    for f in futures:
        f.add_done_callback(done)
    return out
