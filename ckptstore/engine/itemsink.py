"""A file-like sink for one item inside a file being written (``ItemSink``; ``torch.save``
writes into it), and what it writes into (``ItemTarget``: a ``FileWriter`` or a
``TeeWriter``). Build one with ``FileWriter.item``; see ``ckptstore.engine.transfer`` for
the call order.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from ckptstore.engine.checksum import crc32c, crc32c_combine
from ckptstore.engine.manifest import Span
from ckptstore.engine.store import Buffer

__all__ = ["ItemSink", "ItemTarget"]

#: Writes below it gather in the sink and go to the file writer together: ``torch.save``
#: writes an item as ~40 records (zip headers, the pickle, padding), most of a few bytes,
#: and each write costs a call into the writer and a CRC32C call (profiled: a third of
#: a 228-item save's write time went to them).
GATHER_MAX = 64 * 1024


class ItemTarget(Protocol):
    """What an ``ItemSink`` writes into: a ``FileWriter`` (or a ``TeeWriter`` of two)."""

    @property
    def size(self) -> int:
        """Bytes written to the file so far."""
        ...

    def hold(self, owner: object) -> None:
        """Keep ``owner`` alive while parts point into its memory (see ``FileWriter.hold``)."""
        ...

    def send_unhashed(self, view: memoryview, owned: bool = False) -> int | None:
        """Append ``view`` without hashing it; its CRC32C if sending computed it, else None."""
        ...

    def extend_crc(self, crc: int, length: int) -> None:
        """Extend the file's CRC32C with ``length`` bytes of CRC32C ``crc``."""
        ...


class ItemSink:
    """A file-like view of one item inside a ``FileWriter`` (``torch.save`` writes into it).

    Bytes are hashed once, into the item's own CRC32C; on ``close`` the file's CRC is
    extended with it (CRC combine), so nothing is hashed twice. A large write whose CRC
    the writer computed while sending it (for its parts' checksums, see
    ``FileWriter.send_unhashed``) is not hashed again here. Items must not interleave
    with other writes to the same file.

    ``payload=(address, nbytes)`` names memory the item's bytes are expected to contain
    whole (a tensor's storage, which ``torch.save`` writes in one call): the write of
    exactly that memory is hashed on its own and recorded as ``span`` (its offset within
    the item, length and CRC32C), so a reader can fetch it straight into place. Writes
    below ``GATHER_MAX`` are copied into one buffer, sent when it fills, before a larger
    write and on ``close`` (a payload is never smaller: ``PAYLOAD_MIN``).
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
        self._gathered = bytearray()  # small writes not sent yet

    def write(self, data: Buffer) -> int:
        """Append ``data`` to the item (checksummed as it is sent); its length."""
        view = memoryview(data).cast("B")
        if len(view) < GATHER_MAX:
            self._gathered += view
            if len(self._gathered) >= GATHER_MAX:
                self._send_gathered()
        else:
            self._send_gathered()
            self._send(view)
        self.length += len(view)
        return len(view)

    def _send_gathered(self) -> None:
        if self._gathered:
            # A new buffer each time: the writer may keep a reference to the one it got.
            gathered, self._gathered = self._gathered, bytearray()
            self._send(memoryview(gathered), owned=False)

    def _send(self, view: memoryview, owned: bool | None = None) -> None:
        """Send ``view`` to the writer and hash it into the item's CRC32C (a payload is
        sent as it is written, so ``length`` is then its offset in the item)."""
        crc = self._writer.send_unhashed(view, self._owned if owned is None else owned)
        if self._payload is not None and self.span is None and self._is_payload(view):
            crc = crc32c(view) if crc is None else crc
            self.span = Span(self.length, len(view), crc)
        if crc is None:
            self.crc32c = crc32c(view, self.crc32c)
        else:
            self.crc32c = crc32c_combine(self.crc32c, crc, len(view))

    def _is_payload(self, view: memoryview) -> bool:
        assert self._payload is not None
        address, nbytes = self._payload
        return len(view) == nbytes and np.frombuffer(view, np.uint8).ctypes.data == address

    def flush(self) -> None:
        """Nothing to flush: the item's bytes all reach the file writer by ``close``."""
        pass

    def close(self) -> None:
        """End the item: the gathered writes are sent; its checksum and length join the
        file's."""
        self._send_gathered()
        self._writer.extend_crc(self.crc32c, self.length)

    def __enter__(self) -> ItemSink:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
