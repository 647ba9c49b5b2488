"""One file being written as parallel parts (``FileWriter``), and a file-like sink for one
item inside it (``ItemSink``). Build them with ``TransferEngine.writer`` and
``FileWriter.item``; see ``ckptstore.engine.transfer`` for the call order.

``write`` copies its data into reusable part buffers (one copy, into warm memory) and
sends each part as it fills (on a store with ``zero_copy_parts``, large writes go out from
the caller's memory without the copy). A failed part aborts the whole upload: nothing
half-made is ever left visible. A writer is used from one thread; its parts are sent on
the engine's I/O threads.
"""

from __future__ import annotations

import logging
import math
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from ckptstore.engine.checksum import Crc32c, crc32c, crc32c_combine
from ckptstore.engine.manifest import Span
from ckptstore.engine.retry import Deadline
from ckptstore.engine.store import Buffer, Multipart, Part, Store
from ckptstore.errors import CkptStoreError, TransferError

if TYPE_CHECKING:
    from ckptstore.engine.transfer import TransferEngine

__all__ = ["FileWriter", "ItemSink", "ItemTarget", "FileInfo", "plan_part_size", "ZERO_COPY_MIN"]

log = logging.getLogger(__name__)


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


#: Smallest write a store with ``zero_copy_parts`` takes by reference (see FileWriter._append).
ZERO_COPY_MIN = 1024 * 1024

#: Part buffer size on a ``zero_copy_parts`` store: only writes below ``ZERO_COPY_MIN`` (item
#: headers, small items) are copied there, so a full ``part_size`` buffer would be mostly
#: untouched memory that ``bytearray`` still zero-fills (page faults) on every acquire.
SMALL_PART = 4 * ZERO_COPY_MIN


class ItemTarget(Protocol):
    """What an ``ItemSink`` writes into: a ``FileWriter`` (or a ``TeeWriter`` of two)."""

    @property
    def size(self) -> int:
        """Bytes written to the file so far."""
        ...

    def hold(self, owner: object) -> None:
        """Keep ``owner`` alive while parts point into its memory (see ``FileWriter.hold``)."""
        ...

    def send_unhashed(self, view: memoryview, owned: bool = False) -> None:
        """Append ``view`` without hashing it."""
        ...

    def extend_crc(self, crc: int, length: int) -> None:
        """Extend the file's CRC32C with ``length`` bytes of CRC32C ``crc``."""
        ...


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
        writer: ItemTarget,
        payload: tuple[int, int] | None = None,
        owner: object = None,
    ) -> None:
        self._writer = writer
        self._payload = payload
        self._owned = owner is not None
        if owner is not None:
            writer.hold(owner)
        self.offset = writer.size
        self.crc32c = 0
        self.length = 0
        self.span: Span | None = None

    def write(self, data: Buffer) -> int:
        """Append ``data`` to the item (checksummed as it passes); its length."""
        view = memoryview(data).cast("B")
        if self._payload is not None and self.span is None and self._is_payload(view):
            crc = crc32c(view)
            self.span = Span(self.length, len(view), crc)
            self.crc32c = crc32c_combine(self.crc32c, crc, len(view))
        else:
            self.crc32c = crc32c(view, self.crc32c)
        self.length += len(view)
        self._writer.send_unhashed(view, self._owned)
        return len(view)

    def _is_payload(self, view: memoryview) -> bool:
        assert self._payload is not None
        address, nbytes = self._payload
        return len(view) == nbytes and np.frombuffer(view, np.uint8).ctypes.data == address

    def flush(self) -> None:
        """Nothing to flush: bytes go to the file writer as they are written."""
        pass

    def close(self) -> None:
        """End the item: its checksum and length join the file's."""
        self._writer.extend_crc(self.crc32c, self.length)

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
        #: Size of the buffers small writes are copied into (see ``SMALL_PART``).
        self.buffer_size = (
            min(self.part_size, SMALL_PART)
            if store.capabilities.zero_copy_parts
            else self.part_size
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
        self._owner: object = None  # the current item's owner (``hold``)
        self._state = "open"

    @property
    def size(self) -> int:
        """Bytes written to the file so far."""
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

    @property
    def state(self) -> str:
        """``open``, ``closed`` or ``aborted``."""
        return self._state

    def raise_if_failed(self) -> None:
        """Raise (after aborting) if a part failed, or if the writer is no longer open."""
        self._check_open()

    def _check_state(self) -> None:
        if self._state != "open":
            raise TransferError(f"{self._what}: write after {self._state}")

    def _check_open(self) -> None:
        self._check_state()
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
        ``torch.save`` writes, whose record arrives as a bare memoryview); held while parts
        point into it (``hold``), so large writes can be sent without a copy.
        """
        self._check_open()
        return ItemSink(self, payload, owner)

    def hold(self, owner: object) -> None:
        """Keep ``owner`` (what owns the memory the current item's writes point into)
        alive while parts point into it: each part sent from that memory holds it until the
        part is written (so a copy made for the save is freed as soon as it is on its way,
        not when the file closes); the writer itself holds only the latest owner."""
        self._owner = owner

    def send_unhashed(self, view: memoryview, owned: bool = False) -> None:
        """Append ``view`` without hashing it: for an ``ItemSink``, which hashes its bytes
        itself and accounts for them with ``extend_crc`` when the item ends.

        A part that failed meanwhile is not raised here but by ``close()``: the caller is
        usually ``torch.save`` writing an item, which would replace the error with one of
        its own ("unexpected pos") when its zip writer ends.
        """
        self._check_state()
        self._append(view, owned)

    def extend_crc(self, crc: int, length: int) -> None:
        """Extend the file's CRC32C with ``length`` bytes sent by ``send_unhashed`` whose
        CRC32C is ``crc``."""
        self._crc.extend(crc, length)

    def _append(self, view: memoryview, owned: bool = False) -> None:
        """Copy ``view`` into part buffers (of ``buffer_size``), sending each as it fills.

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
                self._submit_copy()
            keep = self._owner if owned else None
            for start in range(0, len(view), self.part_size):
                piece = view[start : start + self.part_size]
                self.engine.buffers.reserve(len(piece), self._failed.is_set)
                self._submit(piece, None, keep)
            return
        while len(view):
            if self._buf is None:
                self._buf = self.engine.buffers.acquire(self.buffer_size, self._failed.is_set)
                self._fill = 0
            n = min(len(view), self.buffer_size - self._fill)
            self._buf[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == self.buffer_size:
                self._submit_part()

    def _submit_part(self) -> None:
        """Send the filled part buffer."""
        buf, size = self._buf, self._fill
        assert buf is not None
        self._buf, self._fill = None, 0
        self._submit(memoryview(buf)[:size], buf)

    def _submit_copy(self) -> None:
        """Send what the part buffer holds as a copy of just those bytes, keeping the
        buffer for the next small writes: before a large write on a ``zero_copy_parts``
        store, where it usually holds one item's few-KiB header, so no queued header part
        pins a whole buffer (one buffer per open file, not one per item in flight)."""
        assert self._buf is not None
        data = memoryview(bytes(memoryview(self._buf)[: self._fill]))
        self._fill = 0
        self.engine.buffers.reserve(len(data), self._failed.is_set)
        self._submit(data, None)

    def _submit(self, data: memoryview, buf: bytearray | None, keep: object = None) -> None:
        """Send ``data`` as the next part. ``buf``: its pooled buffer, released when sent;
        None: ``data`` is the caller's memory, reserved in the pool and unreserved then.
        ``keep``: the owner of that memory, held until the part is sent."""
        engine, store = self.engine, self.store

        def release() -> None:
            if buf is not None:
                engine.buffers.release(buf)
            else:
                engine.buffers.unreserve(len(data))

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

        def send(keep: object = keep) -> Part:  # ``keep`` lives as long as this function
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
        self._owner = None
        return FileInfo(self.path, self._crc.length, self._crc.value)

    def _release_buffer(self) -> None:
        if self._buf is not None:
            self.engine.buffers.release(self._buf)
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
        self._owner = None
        if self._upload is not None:
            upload = self._upload
            try:
                self.engine.retry(
                    lambda: self.store.abort_multipart(upload), f"abort of {self._what}"
                )
            except Exception as exc:  # noqa: BLE001 - best effort; the sweeper cleans up later
                log.warning("could not abort %s: %s (cleanup will retry)", self._what, exc)
