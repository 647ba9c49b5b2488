"""The transfer engine: one bounded pool that writes and reads files as parallel parts.

Call order for a streamed write::

    engine = TransferEngine(TransferConfig())
    w = engine.writer(store, "shard.bin")      # nothing visible yet
    off = w.write(data)                         # any number of times; returns data's offset
    info = w.close()                            # durable + visible; FileInfo(size, crc32c)
    # on any error before close() returns: w.abort() (the context manager does it)
    engine.close()

``write`` copies its data into reusable part buffers (one copy, into warm memory) and
sends each part as it fills (on a volume, large writes go out from the caller's memory
without the copy); ``item()`` gives a file-like sink (for ``torch.save``) that does the
same and checksums the item on the way. At most ``TransferConfig.memory_budget``
bytes of parts are in flight; writes block (back-pressure) beyond that. Every store call is
retried per ``RetryConfig`` (transient errors only), within a per-file deadline. A failed
part aborts the whole upload: nothing half-made is ever left visible.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from ckptstore.config import TransferConfig
from ckptstore.engine.checksum import Crc32c, crc32c, crc32c_combine
from ckptstore.engine.crashpoints import crashpoint
from ckptstore.engine.manifest import Span
from ckptstore.engine.retry import Deadline, RetryStats, call_with_retry, unretried
from ckptstore.engine.store import Buffer, Multipart, Part, Store
from ckptstore.errors import (
    CkptStoreError,
    CorruptCheckpointError,
    StoreNotFoundError,
    TransferError,
)

__all__ = [
    "TransferEngine",
    "FileWriter",
    "ItemSink",
    "CopyCancelled",
    "FileInfo",
    "plan_part_size",
    "split_ranges",
]

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class FileInfo:
    """A file as written: its size and the CRC32C of all its bytes."""

    path: str
    size: int
    crc32c: int


def plan_part_size(total: int | None, part_size: int, min_part: int, max_parts: int) -> int:
    """Part size for a file of ``total`` bytes: ``part_size`` grown so parts <= ``max_parts``."""
    size = max(part_size, min_part)
    if total is not None and total > 0:
        size = max(size, math.ceil(total / max_parts))
    return size


def split_ranges(offset: int, length: int, part_size: int) -> list[tuple[int, int]]:
    """Split ``[offset, offset+length)`` into ``(start, end)`` ranges of at most ``part_size``."""
    return [
        (s, min(s + part_size, offset + length)) for s in range(offset, offset + length, part_size)
    ]


#: Smallest write a store with ``zero_copy_parts`` takes by reference (see FileWriter._append).
ZERO_COPY_MIN = 1024 * 1024


class CopyCancelled(Exception):
    """A copy was cancelled (its ``cancel`` event was set); nothing was published."""


class _BufferPool:
    """Reusable part buffers; at most ``limit`` bytes of them are handed out at once.

    Reusing buffers matters: writing into fresh memory page-faults and costs several times
    a copy into a warm buffer. ``acquire`` blocks (back-pressure) while the limit is
    reached, except for a lone request larger than the limit.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._used = 0
        self._free: dict[int, list[bytearray]] = {}
        self._cond = threading.Condition()

    def acquire(self, size: int, cancelled: Callable[[], bool]) -> bytearray:
        with self._cond:
            self._wait_for_room(size, cancelled)
            free = self._free.get(size)
            if free:
                return free.pop()
        return bytearray(size)

    def reserve(self, size: int, cancelled: Callable[[], bool]) -> None:
        """Count ``size`` bytes of the caller's own memory, sent by reference, against the
        limit (blocking like ``acquire``), so such writes are back-pressured too."""
        with self._cond:
            self._wait_for_room(size, cancelled)

    def unreserve(self, size: int) -> None:
        with self._cond:
            self._used -= size
            self._cond.notify_all()

    def _wait_for_room(self, size: int, cancelled: Callable[[], bool]) -> None:
        while self._used and self._used + size > self._limit and not cancelled():
            self._cond.wait(0.1)
        self._used += size

    def release(self, buf: bytearray) -> None:
        with self._cond:
            self._used -= len(buf)
            pooled = sum(len(b) for bufs in self._free.values() for b in bufs)
            if pooled + len(buf) <= self._limit:
                self._free.setdefault(len(buf), []).append(buf)
            self._cond.notify_all()


def _gather(futures: Sequence[Future], combine: Callable[[], T]) -> Future[T]:
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


_SHARED: dict[tuple[TransferConfig, int], TransferEngine] = {}
_SHARED_LOCK = threading.Lock()


class TransferEngine:
    """A pool of I/O threads plus the retry and memory policy shared by every transfer."""

    def __init__(self, config: TransferConfig | None = None) -> None:
        self.config = config or TransferConfig()
        self.stats = RetryStats()
        self._buffers = _BufferPool(self.config.memory_budget)
        self._pool: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, config: TransferConfig | None = None) -> TransferEngine:
        """One engine per (config, process), reused by every writer and reader built without
        an engine: its part buffers stay warm across saves (fresh memory page-faults, which
        costs several times the copy itself). A forked child gets its own."""
        config = config or TransferConfig()
        key = (config, os.getpid())
        with _SHARED_LOCK:
            engine = _SHARED.get(key)
            if engine is None:
                engine = _SHARED[key] = cls(config)
            return engine

    @property
    def pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.config.concurrency, thread_name_prefix="ckptstore-io"
                )
            return self._pool

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)

    def __enter__(self) -> TransferEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def retry(self, fn: Callable[[], T], what: str, deadline: Deadline | None = None) -> T:
        """Run one store call under the retry policy."""
        return call_with_retry(fn, self.config.retry, what, deadline=deadline, stats=self.stats)

    # -- writes ------------------------------------------------------------------------
    def writer(self, store: Store, path: str, size_hint: int | None = None) -> FileWriter:
        return FileWriter(self, store, path, size_hint)

    def put(self, store: Store, path: str, data: Buffer) -> FileInfo:
        """Write a whole buffer (multipart and parallel when it is larger than a part)."""
        with self.writer(store, path, size_hint=len(data)) as w:
            w.write(data)
            return w.close()

    def copy(
        self,
        src: Store,
        src_path: str,
        dst: Store,
        dst_path: str,
        *,
        expect_size: int | None = None,
        expect_crc: int | None = None,
        cancel: threading.Event | None = None,
        on_bytes: Callable[[int], None] | None = None,
    ) -> FileInfo:
        """Stream one file ``src`` -> ``dst`` as parallel parts, reading two parts ahead.

        The CRC32C of the bytes read is checked against ``expect_crc`` (and the size against
        ``expect_size``) *before* the destination file is made visible: on a mismatch the
        upload is aborted and ``CorruptCheckpointError`` names the source file. Setting
        ``cancel`` stops the copy within ~0.1 s with ``CopyCancelled`` (nothing visible).
        """
        what = src.describe(src_path)
        try:
            size = self.retry(lambda: src.size(src_path), f"stat of {what}")
        except StoreNotFoundError:
            raise CorruptCheckpointError(
                f"{what} is missing but the manifest lists it; the source checkpoint is damaged "
                "(run `ckptstore-tool verify`)."
            ) from None
        if expect_size is not None and size != expect_size:
            raise CorruptCheckpointError(
                f"{what} is {size} bytes but the manifest says {expect_size}; the source "
                "checkpoint is damaged (run `ckptstore-tool verify`)."
            )
        windows = deque(split_ranges(0, size, self.config.part_size))
        ahead: deque[Future[memoryview]] = deque()
        with self.writer(dst, dst_path, size_hint=size) as w:
            while windows or ahead:
                while windows and len(ahead) < 2:
                    start, end = windows.popleft()
                    ahead.append(self.read_async(src, src_path, start, end - start))
                fut = ahead.popleft()
                while not fut.done():  # wait, but notice a cancel within 0.1 s
                    if cancel is not None and cancel.is_set():
                        raise CopyCancelled(what)
                    wait([fut], timeout=0.1)
                if cancel is not None and cancel.is_set():
                    raise CopyCancelled(what)
                data = fut.result()
                first = w.size == 0
                w.write(data)
                if first:
                    crashpoint("mid_upload")
                if on_bytes is not None:
                    on_bytes(len(data))
            if expect_crc is not None and w.crc32c != expect_crc:
                raise CorruptCheckpointError(
                    f"{what}: crc32c {w.crc32c:08x} of the bytes read does not match the "
                    f"manifest's {expect_crc:08x}; the source is damaged (run `ckptstore-tool "
                    "verify`). Nothing was published at the destination."
                )
            return w.close()

    # -- reads -------------------------------------------------------------------------
    def read_async(
        self, store: Store, path: str, offset: int = 0, length: int | None = None
    ) -> Future[memoryview]:
        """Read ``length`` bytes at ``offset`` (None: to the end) as parallel ranged GETs.

        The bytes land straight in one uninitialised buffer (no zeroing, no joining); a
        range that comes back short raises ``CorruptCheckpointError`` (truncated object).
        """
        if length is None:
            what = f"read of {store.describe(path)}"
            deadline = Deadline(self.config.retry.deadline_s)
            raw = unretried(store)  # retried here, under this read's deadline
            length = self.retry(lambda: raw.size(path), what, deadline) - offset
        return self.read_into_async(store, path, offset, np.empty(length, dtype=np.uint8).data)

    def read_into_async(
        self, store: Store, path: str, offset: int, buf: memoryview
    ) -> Future[memoryview]:
        """Fill ``buf`` with the bytes at ``offset`` as parallel ranged GETs; resolves to it.

        A range that comes back short raises ``CorruptCheckpointError`` (truncated object).
        """
        deadline = Deadline(self.config.retry.deadline_s)
        what = f"read of {store.describe(path)}"
        view = buf.cast("B") if buf.format != "B" else buf

        def fetch(start: int, end: int) -> None:
            target = view[start - offset : end - offset]
            n = self.retry(lambda: store.get_into(path, start, target), what, deadline)
            if n != end - start:
                raise CorruptCheckpointError(
                    f"{what}: bytes [{start}, {end}) returned only {n}; the object is "
                    "truncated (or was replaced by a shorter one)"
                )

        futures = [
            self.pool.submit(fetch, s, e)
            for s, e in split_ranges(offset, len(view), self.config.part_size)
        ]
        return _gather(futures, lambda: view)

    def read(
        self, store: Store, path: str, offset: int = 0, length: int | None = None
    ) -> memoryview:
        return self.read_async(store, path, offset, length).result()


class ItemSink:
    """A file-like view of one item inside a ``FileWriter`` (``torch.save`` writes into it).

    Bytes are hashed once, into the item's own CRC32C; on ``close`` the file's CRC is
    extended with it (CRC combine), so nothing is hashed twice. Items must not interleave
    with other writes to the same file.

    ``payload=(address, nbytes)`` names memory the item's bytes are expected to contain
    whole (a tensor's storage, which ``torch.save`` writes in one call): the write of
    exactly that memory is hashed on its own and recorded as ``span`` (its offset within
    the item, length and CRC32C), so a reader can fetch it straight into place.
    """

    def __init__(
        self,
        writer: FileWriter,
        payload: tuple[int, int] | None = None,
        owner: object = None,
    ) -> None:
        self._writer = writer
        self._payload = payload
        self._owned = owner is not None
        if owner is not None:
            writer._held.append(owner)
        self.offset = writer.size
        self.crc32c = 0
        self.length = 0
        self.span: Span | None = None

    def write(self, data: Buffer) -> int:
        view = memoryview(data).cast("B")
        if self._payload is not None and self.span is None and self._is_payload(view):
            crc = crc32c(view)
            self.span = Span(self.length, len(view), crc)
            self.crc32c = crc32c_combine(self.crc32c, crc, len(view))
        else:
            self.crc32c = crc32c(view, self.crc32c)
        self.length += len(view)
        self._writer._append(view, self._owned)
        return len(view)

    def _is_payload(self, view: memoryview) -> bool:
        assert self._payload is not None
        address, nbytes = self._payload
        return len(view) == nbytes and np.frombuffer(view, np.uint8).ctypes.data == address

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self._writer._crc.extend(self.crc32c, self.length)

    def __enter__(self) -> ItemSink:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()


class FileWriter:
    """One file being written as parallel parts. See ``TransferEngine`` for the call order."""

    def __init__(
        self, engine: TransferEngine, store: Store, path: str, size_hint: int | None
    ) -> None:
        self.engine = engine
        self.store = store
        self.path = path
        self.part_size = plan_part_size(
            size_hint,
            engine.config.part_size,
            store.capabilities.min_part_size,
            store.capabilities.max_parts,
        )
        self._what = f"upload of {store.describe(path)}"
        self._deadline = Deadline(engine.config.retry.deadline_s)
        self._crc = Crc32c()
        self._buf: bytearray | None = None
        self._fill = 0
        self._part_offset = 0
        self._upload: Multipart | None = None
        self._futures: list[Future[Part]] = []
        self._failed = threading.Event()
        self._held: list[object] = []  # owners of memory that parts point into
        self._state = "open"

    @property
    def size(self) -> int:
        return self._crc.length

    @property
    def crc32c(self) -> int:
        """CRC32C of everything written so far."""
        return self._crc.value

    def __enter__(self) -> FileWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if self._state == "open":
            self.abort()

    def _check_open(self) -> None:
        if self._state != "open":
            raise TransferError(f"{self._what}: write after {self._state}")
        if self._failed.is_set():
            self._raise_failed()

    def write(self, data: Buffer, crc: int | None = None) -> int:
        """Append ``data``; returns its offset. ``crc``: its CRC32C, if known.

        ``data`` is copied, except a large write to a ``zero_copy_parts`` store, which is
        sent from ``data`` itself: leave it unchanged until ``close()`` (see ``_append``).
        """
        self._check_open()
        view = memoryview(data).cast("B")
        offset = self._crc.length
        if crc is None:
            self._crc.update(view)
        else:
            self._crc.extend(crc, len(view))
        self._append(view)
        return offset

    def item(self, payload: tuple[int, int] | None = None, owner: object = None) -> ItemSink:
        """A file-like sink for one item (see ``ItemSink``); close it when the item ends.

        ``owner``: what owns the memory the item's writes point into (the tensor
        ``torch.save`` writes, whose record arrives as a bare memoryview); held until the
        file is closed or aborted, so large writes can be sent without a copy.
        """
        self._check_open()
        return ItemSink(self, payload, owner)

    def _append(self, view: memoryview, owned: bool = False) -> None:
        """Copy ``view`` into part buffers, sending each part as it fills.

        On a store with ``zero_copy_parts``, a view of at least ``ZERO_COPY_MIN`` bytes is
        not copied: what is buffered goes out as a (short) part, then the view itself as
        parts of up to ``part_size``. Only a view that keeps its memory alive (``view.obj``)
        or, with ``owned``, one into memory whose owner the writer holds (``item(owner=)``)
        is taken so; its bytes must not change until ``close()`` returns (a state being
        saved is not modified meanwhile).
        """
        if (
            len(view) >= ZERO_COPY_MIN
            and self.store.capabilities.zero_copy_parts
            and (owned or view.obj is not None)
        ):
            if self._fill:
                self._submit_part()
            for start in range(0, len(view), self.part_size):
                piece = view[start : start + self.part_size]
                self.engine._buffers.reserve(len(piece), self._failed.is_set)
                self._submit(piece, None)
            return
        while len(view):
            if self._buf is None:
                self._buf = self.engine._buffers.acquire(self.part_size, self._failed.is_set)
                self._fill = 0
            n = min(len(view), self.part_size - self._fill)
            self._buf[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == self.part_size:
                self._submit_part()

    def _submit_part(self) -> None:
        """Send the filled part buffer."""
        buf, size = self._buf, self._fill
        assert buf is not None
        self._buf, self._fill = None, 0
        self._submit(memoryview(buf)[:size], buf)

    def _submit(self, data: memoryview, buf: bytearray | None) -> None:
        """Send ``data`` as the next part. ``buf``: its pooled buffer, released when sent;
        None: ``data`` is the caller's memory, reserved in the pool and unreserved then."""
        engine, store = self.engine, self.store

        def release() -> None:
            if buf is not None:
                engine._buffers.release(buf)
            else:
                engine._buffers.unreserve(len(data))

        try:
            if self._upload is None:
                self._upload = engine.retry(
                    lambda: store.begin_multipart(self.path), self._what, self._deadline
                )
            if len(self._futures) >= store.capabilities.max_parts:
                raise TransferError(
                    f"{self._what}: more than {store.capabilities.max_parts} parts; raise part_size"
                )
        except BaseException:
            release()
            raise
        number, offset = len(self._futures) + 1, self._part_offset
        self._part_offset += len(data)
        upload = self._upload

        def send() -> Part:
            try:
                return engine.retry(
                    lambda: store.put_part(upload, number, offset, data),
                    f"{self._what} (part {number})",
                    self._deadline,
                )
            except BaseException:
                self._failed.set()
                raise
            finally:
                release()

        fut = engine.pool.submit(send)
        # A part cancelled before it ran (abort) never reaches send()'s finally.
        fut.add_done_callback(lambda f: release() if f.cancelled() else None)
        self._futures.append(fut)

    def _raise_failed(self) -> None:
        for f in self._futures:
            if f.done() and f.exception() is not None:
                exc = f.exception()
                self.abort()
                if isinstance(exc, CkptStoreError):
                    raise exc
                raise TransferError(f"{self._what} failed: {exc}") from exc

    def close(self) -> FileInfo:
        """Finish the upload; the file is durable and visible when this returns."""
        if self._state != "open":
            raise TransferError(f"{self._what}: close after {self._state}")
        try:
            if self._upload is None:
                buf, size = self._buf, self._fill
                data = memoryview(buf)[:size] if buf is not None else b""
                self.engine.retry(
                    lambda: self.store.put(self.path, data), self._what, self._deadline
                )
                self._release_buffer()
            else:
                if self._fill:
                    self._submit_part()
                self._release_buffer()
                parts = [f.result() for f in self._futures]
                upload = self._upload
                self.engine.retry(
                    lambda: self.store.complete_multipart(upload, parts),
                    self._what,
                    self._deadline,
                )
        except BaseException as exc:
            self.abort()
            if isinstance(exc, CkptStoreError) or not isinstance(exc, Exception):
                raise
            raise TransferError(f"{self._what} failed: {exc}") from exc
        self._state = "closed"
        self._held.clear()
        return FileInfo(self.path, self._crc.length, self._crc.value)

    def _release_buffer(self) -> None:
        if self._buf is not None:
            self.engine._buffers.release(self._buf)
            self._buf, self._fill = None, 0

    def abort(self) -> None:
        """Discard everything written; idempotent, never raises."""
        if self._state == "aborted":
            return
        self._state = "aborted"
        self._failed.set()
        for f in self._futures:
            f.cancel()
        for f in self._futures:
            try:
                f.exception()
            except BaseException:  # noqa: BLE001 - cancelled
                pass
        self._release_buffer()
        self._held.clear()
        if self._upload is not None:
            upload = self._upload
            try:
                self.engine.retry(
                    lambda: self.store.abort_multipart(upload), f"abort of {self._what}"
                )
            except Exception as exc:  # noqa: BLE001 - best effort; the sweeper cleans up later
                log.warning("could not abort %s: %s (cleanup will retry)", self._what, exc)
