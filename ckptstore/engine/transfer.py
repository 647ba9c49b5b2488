"""The transfer engine: one bounded pool that writes and reads files as parallel parts.

    engine = TransferEngine(TransferConfig())
    w = engine.writer(store, "shard.bin")      # nothing visible yet
    off = w.write(data)                         # any number of times; returns data's offset
    info = w.close()                            # durable + visible; FileInfo(size, crc32c)
    # on any error before close() returns: w.abort() (the context manager does it)
    engine.close()

At most ``TransferConfig.memory_budget`` bytes of parts are in flight; writes block
(back-pressure) beyond that. Every store call is retried per ``RetryConfig`` (transient
errors only), within a per-file deadline; a failed part aborts the whole upload, so
nothing half-made is ever left visible. How writes are copied and reads spread over
threads is :class:`TransferEngine`'s docstring.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import TypeVar

import numpy as np

from ckptstore.config import TransferConfig
from ckptstore.engine.buffers import BufferPool, gather
from ckptstore.engine.cores import rank_cores, volume_writers
from ckptstore.engine.crashpoints import crashpoint
from ckptstore.engine.filewriter import FileInfo, FileWriter
from ckptstore.engine.readplan import read_streams
from ckptstore.engine.retry import Deadline, RetryStats, call_with_retry, unretried
from ckptstore.engine.store import Buffer, Store
from ckptstore.errors import CorruptCheckpointError, StoreNotFoundError

__all__ = ["TransferEngine", "CopyCancelled", "split_ranges"]

T = TypeVar("T")


def split_ranges(offset: int, length: int, part_size: int) -> list[tuple[int, int]]:
    """Split ``[offset, offset+length)`` into ``(start, end)`` ranges of at most ``part_size``."""
    return [
        (s, min(s + part_size, offset + length)) for s in range(offset, offset + length, part_size)
    ]


class CopyCancelled(Exception):
    """A copy was cancelled (its ``cancel`` event was set); nothing appeared at the destination."""


_SHARED: dict[tuple[TransferConfig, int], TransferEngine] = {}
_SHARED_LOCK = threading.Lock()


class TransferEngine:
    """Pools of I/O threads (writes, reads) plus the retry and memory policy shared by
    every transfer.

    ``write`` copies its data into reusable part buffers (one copy, into warm memory) and
    sends each part as it fills (on a volume, large writes go out from the caller's memory
    without the copy); ``item()`` gives a file-like sink (for ``torch.save``) that does the
    same and checksums the item on the way (both in ``ckptstore.engine.filewriter``). The
    memory budget is ``engine.buffers``, a ``ckptstore.engine.buffers.BufferPool``.

    Reads from an object store run on a pool of their own, ``read_streams`` threads (one
    ranged GET each; see ``ckptstore.engine.readplan.read_streams``): more, smaller GETs in
    flight than a save's parts, to fill a link whose every connection is capped. A volume's
    reads (preads, ``capabilities.zero_copy_parts``) stay on the I/O pool: more of them at
    once only share the same cores' memory copies. A volume's part writes run on a pool of
    ``volume_writers`` threads (``ckptstore.engine.cores``): no more than the rank's cores
    less the one training runs on, since each is a busy core.
    """

    def __init__(self, config: TransferConfig | None = None) -> None:
        self.config = config or TransferConfig()
        self.stats = RetryStats()
        self.buffers = BufferPool(self.config.memory_budget)
        #: Ranged GETs in flight at most (the read pool's threads).
        self.read_streams = read_streams(self.config.part_size, self.config.concurrency)
        #: Part writes in flight to a volume at most (the volume write pool's threads).
        self.volume_writers = volume_writers(self.config.concurrency, rank_cores())
        self._pools: dict[str, ThreadPoolExecutor] = {}  # thread-name prefix -> pool
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

    def _started(self, prefix: str, threads: int) -> ThreadPoolExecutor:
        """The pool of ``threads`` threads named ``prefix``, started on first use."""
        with self._lock:
            pool = self._pools.get(prefix)
            if pool is None:
                pool = self._pools[prefix] = ThreadPoolExecutor(threads, thread_name_prefix=prefix)
            return pool

    @property
    def pool(self) -> ThreadPoolExecutor:
        """The I/O thread pool (``TransferConfig.concurrency`` threads), started on first use."""
        return self._started("ckptstore-io", self.config.concurrency)

    @property
    def read_pool(self) -> ThreadPoolExecutor:
        """The ranged reads' thread pool (``read_streams`` threads), started on first use."""
        return self._started("ckptstore-read", self.read_streams)

    @property
    def volume_pool(self) -> ThreadPoolExecutor:
        """The pool a volume's part writes run on (``volume_writers`` threads), started on
        first use."""
        return self._started("ckptstore-volume", self.volume_writers)

    def close(self) -> None:
        """Shut the thread pools down, waiting for queued transfers; a later use starts new
        ones."""
        with self._lock:
            pools = list(self._pools.values())
            self._pools.clear()
        for pool in pools:
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
        """A streamed write of ``path`` in ``store``; nothing is visible until its ``close()``.

        ``size_hint`` (the file's expected size, if known) grows the part size so the file
        fits in the store's ``max_parts``. The call order: the module docstring.
        """
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
                    "verify`). Nothing appeared at the destination."
                )
            return w.close()

    # -- reads -------------------------------------------------------------------------
    def read_async(
        self,
        store: Store,
        path: str,
        offset: int = 0,
        length: int | None = None,
        *,
        part_size: int | None = None,
    ) -> Future[memoryview]:
        """Read ``length`` bytes at ``offset`` (None: to the end) as parallel ranged GETs
        of at most ``part_size`` bytes each (default ``TransferConfig.part_size``; a load
        passes the range size it planned, see ``ckptstore.engine.readplan``).

        The bytes land straight in one uninitialised buffer (no zeroing, no joining); a
        range that comes back short raises ``CorruptCheckpointError`` (truncated object),
        and so does a ``length`` no buffer can be had for: a length read from storage (a
        manifest's range) that claims more than memory holds is a lie or a checkpoint this
        host cannot load, never a ``MemoryError`` that stops a restore's fallback.
        """
        if length is None:
            what = f"read of {store.describe(path)}"
            deadline = Deadline(self.config.retry.deadline_s)
            raw = unretried(store)  # retried here, under this read's deadline
            length = self.retry(lambda: raw.size(path), what, deadline) - offset
        try:
            buf = np.empty(length, dtype=np.uint8).data
        except (MemoryError, ValueError) as exc:  # ValueError: a negative or absurd length
            raise CorruptCheckpointError(
                f"read of {store.describe(path)}: no buffer of {length} bytes can be had for "
                f"bytes [{offset}, {offset + length}) ({type(exc).__name__}); the manifest "
                "claims more than this host's memory (damaged or crafted), or this host is "
                "too small to load it"
            ) from None
        return self.read_into_async(store, path, offset, buf, part_size=part_size)

    def read_into_async(
        self,
        store: Store,
        path: str,
        offset: int,
        buf: memoryview,
        *,
        part_size: int | None = None,
    ) -> Future[memoryview]:
        """Fill ``buf`` with the bytes at ``offset`` as parallel ranged GETs of at most
        ``part_size`` bytes (default ``TransferConfig.part_size``); resolves to ``buf``.

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

        pool = self.pool if store.capabilities.zero_copy_parts else self.read_pool
        futures = [
            pool.submit(fetch, s, e)
            for s, e in split_ranges(offset, len(view), part_size or self.config.part_size)
        ]
        return gather(futures, lambda: view)

    def read(
        self, store: Store, path: str, offset: int = 0, length: int | None = None
    ) -> memoryview:
        """Read ``length`` bytes at ``offset`` (None: to the end) and wait for them.

        Blocking form of :meth:`read_async`: raises what it raises.
        """
        return self.read_async(store, path, offset, length).result()
