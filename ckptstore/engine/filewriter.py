"""One file being written as parallel parts (``FileWriter``). Build it with
``TransferEngine.writer``; ``FileWriter.item`` gives a file-like sink for one item inside it
(``ckptstore.engine.itemsink``, also importable from here). See
``ckptstore.engine.transfer`` for the call order.

How a write reaches the store depends on its ``capabilities`` (the sizes and the rules
are ``ckptstore.engine.writeplan``'s):

- ``gather_parts`` (S3): parts of the usual size sent from several buffers, large writes by
  reference and small ones copied into small pooled buffers (``ckptstore.engine.parts``,
  which explains the design), each sent with ``put_part_buffers``;
- ``zero_copy_parts`` (volumes): large writes go out as parts of their own, straight from
  the caller's memory, small ones through small buffers;
- otherwise: every byte is copied into reusable part buffers (one copy, into warm memory)
  and each part is sent as it fills.

A failed part aborts the whole upload: nothing half-made is ever left visible. A writer
is used from one thread; its parts are sent on the engine's I/O threads.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ckptstore.engine.buffers import copy_into
from ckptstore.engine.checksum import Crc32c
from ckptstore.engine.itemsink import ItemSink, ItemTarget
from ckptstore.engine.parts import PartBuilder, Release
from ckptstore.engine.retry import Deadline
from ckptstore.engine.store import Buffer, Multipart, Part, Store
from ckptstore.engine.writeplan import (
    COPY_MAX,
    GATHER_BUFFER,
    SMALL_PART,
    SMALL_QUEUED,
    ZERO_COPY_MIN,
    alignment_pad,
    plan_part_size,
)
from ckptstore.errors import CkptStoreError, TransferError

if TYPE_CHECKING:
    from ckptstore.engine.transfer import TransferEngine

__all__ = ["FileWriter", "ItemSink", "ItemTarget", "FileInfo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FileInfo:
    """A file as written: its size and the CRC32C of all its bytes."""

    path: str
    size: int
    crc32c: int


class FileWriter:
    """One file being written as parallel parts. See ``TransferEngine`` for the call order."""

    def __init__(
        self, engine: TransferEngine, store: Store, path: str, size_hint: int | None
    ) -> None:
        self.engine = engine
        self.store = store
        self.path = path
        self._failed = threading.Event()
        self.part_size = plan_part_size(
            size_hint,
            engine.config.part_size,
            store.capabilities.min_part_size,
            store.capabilities.max_parts,
        )
        caps = store.capabilities
        #: Parts sent from several buffers (``ckptstore.engine.parts``), where they stay at least
        #: the store's smallest part.
        self._parts: PartBuilder | None = None
        if (
            caps.gather_parts
            and not caps.zero_copy_parts
            and self.part_size - GATHER_BUFFER >= caps.min_part_size
        ):
            if size_hint and math.ceil(size_hint / (self.part_size - GATHER_BUFFER)) > (
                caps.max_parts
            ):
                self.part_size += GATHER_BUFFER  # parts may be that much short of it
            self._parts = PartBuilder(
                self.part_size, GATHER_BUFFER, engine.buffers, self._failed.is_set, self._send
            )
        #: Size of the buffers small writes are copied into (see ``SMALL_PART``).
        self.buffer_size = (
            GATHER_BUFFER
            if self._parts is not None
            else min(self.part_size, SMALL_PART)
            if caps.zero_copy_parts
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
        self._queued: list[Future[Part]] = []  # part buffers sent, maybe not written yet
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

    def write(self, data: Buffer, crc: int | None = None, *, copy: bool = False) -> int:
        """Append ``data``; returns its offset. ``crc``: its CRC32C, if known.

        ``data`` is copied, except a large write to a ``zero_copy_parts`` or
        ``gather_parts`` store, which is sent from ``data`` itself: leave it unchanged
        until ``close()`` (see ``_append``). ``copy=True`` copies it always, for a caller
        that may change ``data`` as soon as this returns (as a file's ``write`` allows).
        """
        self._check_open()
        view = memoryview(data).cast("B")
        offset = self._crc.length
        hashed = self._append(view, copy=copy)
        crc = hashed if crc is None else crc
        if crc is None:
            self._crc.update(view)
        else:
            self._crc.extend(crc, len(view))
        return offset

    def align(self, address: int, lead: int, nbytes: int) -> int:
        """Before an item whose ``nbytes`` of memory at ``address`` are written ``lead``
        bytes after its start: pad the file with zeros so that those bytes land where the
        store writes them from that memory, without a copy (``alignment_pad`` with the
        store's ``direct_alignment``). The pad lies between two items, at most
        ``direct_alignment - 1`` bytes; the bytes written."""
        pad = alignment_pad(
            self.size, address, lead, nbytes, self.store.capabilities.direct_alignment
        )
        if pad:
            self.write(bytes(pad))
        return pad

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

    def send_unhashed(self, view: memoryview, owned: bool = False) -> int | None:
        """Append ``view`` without hashing it for the file: for an ``ItemSink``, which
        hashes its bytes itself and accounts for them with ``extend_crc`` when the item
        ends. Returns the CRC32C of ``view`` when sending it computed one (a large write
        into parts sent from several buffers, whose per-part checksums hash each byte once), else
        None: the item hashes it then.

        A part that failed meanwhile is not raised here but by ``close()``: the caller is
        usually ``torch.save`` writing an item, which would replace the error with one of
        its own ("unexpected pos") when its zip writer ends.
        """
        self._check_state()
        return self._append(view, owned)

    def extend_crc(self, crc: int, length: int) -> None:
        """Extend the file's CRC32C with ``length`` bytes sent by ``send_unhashed`` whose
        CRC32C is ``crc``."""
        self._crc.extend(crc, length)

    def _append(self, view: memoryview, owned: bool = False, copy: bool = False) -> int | None:
        """Copy ``view`` into part buffers (of ``buffer_size``), sending each as it fills.
        Returns ``view``'s CRC32C where the parts computed it (``PartBuilder.refer``).

        A view of at least ``ZERO_COPY_MIN`` bytes is not copied on a ``gather_parts``
        store (it becomes buffers of parts, see ``ckptstore.engine.parts``) nor on a
        ``zero_copy_parts`` one (what is buffered goes out as a short part, then the view
        itself as parts of up to ``part_size``). Only a view that keeps its memory alive
        (``view.obj``) or, with ``owned``, one into memory whose owner the writer holds
        (``item(owner=)``) is taken so, unless ``copy``; its bytes must not change until
        ``close()`` returns (a state being saved is not modified meanwhile).
        """
        by_reference = not copy and len(view) >= ZERO_COPY_MIN and (owned or view.obj is not None)
        keep = self._owner if owned else None  # held by each part that points into it
        if self._parts is not None:
            if by_reference:
                return self._parts.refer(view, keep)
            self._parts.copy(view)
            return None
        if by_reference and self.store.capabilities.zero_copy_parts:
            if self._fill > COPY_MAX:
                self._submit_part()
            elif self._fill:
                self._submit_copy()
            for start in range(0, len(view), self.part_size):
                part = view[start : start + self.part_size]
                self.engine.buffers.reserve(len(part), self._failed.is_set)
                self._submit(
                    part, functools.partial(self.engine.buffers.unreserve, len(part)), keep
                )
            return None
        while len(view):
            if self._buf is None:
                self._wait_for_queued()
                self._buf = self.engine.buffers.acquire(self.buffer_size, self._failed.is_set)
                self._fill = 0
            n = min(len(view), self.buffer_size - self._fill)
            # Not a bytearray's own slice assignment: CPython first copies a value that is
            # not a bytearray into a new one, a second copy of every small write and a
            # malloc that the thread's arena keeps.
            copy_into(self._buf, self._fill, view[:n])
            self._fill += n
            view = view[n:]
            if self._fill == self.buffer_size:
                self._submit_part()
        return None

    def _submit_part(self) -> None:
        """Send the filled part buffer."""
        buf, size = self._buf, self._fill
        assert buf is not None
        self._buf, self._fill = None, 0
        self._submit(memoryview(buf)[:size], lambda: self.engine.buffers.release(buf))
        if self.store.capabilities.zero_copy_parts:
            self._queued.append(self._futures[-1])

    def _wait_for_queued(self) -> None:
        """On a ``zero_copy_parts`` store, wait until fewer of this file's part buffers
        than its cap (see ``SMALL_PART``) are waiting for a writer (a failed part is raised
        by ``close()``, see ``send_unhashed``)."""
        self._queued = [f for f in self._queued if not f.done()]
        cap = max(SMALL_QUEUED, self.engine.volume_writers)
        if len(self._queued) >= cap:
            wait(self._queued[: len(self._queued) - cap + 1])

    def _submit_copy(self) -> None:
        """Send what the part buffer holds (at most ``COPY_MAX`` bytes) as a copy of just
        those bytes, keeping the buffer for the next small writes: before a large write on
        a ``zero_copy_parts`` store, where it usually holds one item's few-KiB header, so no
        queued header part pins a whole buffer (one buffer per open file, not one per item
        in flight)."""
        assert self._buf is not None
        data = memoryview(bytes(memoryview(self._buf)[: self._fill]))
        self._fill = 0
        self.engine.buffers.reserve(len(data), self._failed.is_set)
        self._submit(data, functools.partial(self.engine.buffers.unreserve, len(data)))

    def _submit(
        self,
        data: memoryview | list[memoryview],
        release: Release,
        keep: object = None,
        crc: int | None = None,
    ) -> None:
        """Send ``data`` (one buffer, or a part's buffers) as the next part; ``release()``
        gives back its memory (a pooled buffer, the caller's bytes reserved) once sent.
        ``keep``: the owner of the caller's memory ``data`` points into, held until then
        (by ``send`` alone: the future's callbacks outlive it). ``crc``: the CRC32C of
        the part's bytes, if known (the store then need not hash them again)."""
        engine, store = self.engine, self.store
        held = [keep]
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
        self._part_offset += sum(map(len, data)) if isinstance(data, list) else len(data)
        upload = self._upload

        def put() -> Part:
            if isinstance(data, list):
                return store.put_part_buffers(upload, number, offset, data, crc32c=crc)
            return store.put_part(upload, number, offset, data)

        def send() -> Part:
            try:
                return engine.retry(put, f"{self._what} (part {number})", self._deadline)
            except BaseException:
                self._failed.set()
                raise
            finally:
                release()
                held.clear()

        pool = engine.volume_pool if store.capabilities.zero_copy_parts else engine.pool
        fut = pool.submit(send)
        # A part cancelled before it ran (abort) never reaches send()'s finally.
        fut.add_done_callback(lambda f: release() if f.cancelled() else None)
        self._futures.append(fut)

    def _send(self, buffers: list[memoryview], release: Release, crc: int) -> None:
        """A part of several buffers (``PartBuilder``'s ``send``), sent with its CRC32C."""
        self._submit(buffers, release, crc=crc)

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
            if self._upload is None and self._parts is not None:
                buffers, release, _ = self._parts.take()  # one PUT: the store hashes it
                self._put_buffers(buffers, release)
            elif self._upload is None:
                buf, size = self._buf, self._fill
                data = memoryview(buf)[:size] if buf is not None else b""
                self.engine.retry(
                    lambda: self.store.put(self.path, data), self._what, self._deadline
                )
                self._release_buffer()
            else:
                if self._parts is not None:
                    self._parts.flush()
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

    def _put_buffers(self, buffers: list[memoryview], release: Release) -> None:
        """The whole file (smaller than a part) as one object: its buffers joined."""
        try:
            data: Buffer = buffers[0] if len(buffers) == 1 else bytearray().join(buffers)
            self.engine.retry(lambda: self.store.put(self.path, data), self._what, self._deadline)
        finally:
            release()

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
        if self._parts is not None:
            self._parts.discard()
        self._owner = None
        if self._upload is not None:
            upload = self._upload
            try:
                self.engine.retry(
                    lambda: self.store.abort_multipart(upload), f"abort of {self._what}"
                )
            except Exception as exc:  # noqa: BLE001 - best effort; the sweeper cleans up later
                log.warning("could not abort %s: %s (cleanup will retry)", self._what, exc)
