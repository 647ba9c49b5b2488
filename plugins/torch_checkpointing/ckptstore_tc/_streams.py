"""The file-like objects ``CkptStoreStorage`` hands torch_checkpointing.

``WriteStream``: one file written through ckptstore's transfer engine (parallel parts,
CRC32C per part, retries); nothing is visible until ``close()``, and leaving its ``with``
block on an exception aborts the upload instead (no half-written file). Given the object
that owns the memory written (``Storage.get_write_stream``'s ``data``, which
torch_checkpointing leaves unchanged until the stream closes), large writes go out from
that memory without a copy; otherwise every write is copied (into the engine's part
buffers), as a caller may reuse its buffer once ``write`` returns.

``MemoryReader``: a whole file read ahead by parallel ranged GETs into one buffer, read
without copying it again. ``RangedReader``: a file read on demand, each ``readinto`` a set
of parallel ranged GETs straight into the caller's buffer; a range that comes back short
(a truncated object) raises ``CorruptCheckpointError``.
"""

from __future__ import annotations

import io
from typing import Any

from ckptstore import Store, TransferEngine

__all__ = ["WriteStream", "MemoryReader", "RangedReader"]


class WriteStream(io.RawIOBase):
    """A write of ``key`` (see the module docstring); ``owner``: what owns the memory of
    the writes (kept alive, and unchanged, until ``close``)."""

    def __init__(self, engine: TransferEngine, store: Store, key: str, owner: Any = None):
        super().__init__()
        self._writer = engine.writer(store, key)
        self._sink = self._writer.item(owner=owner) if owner is not None else None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:  # type: ignore[override]
        """Append ``data`` (any buffer: bytes, numpy arrays, array.array ...)."""
        view = memoryview(data).cast("B")
        if self._sink is not None:  # the owner's memory stays as it is until close
            return self._sink.write(view)
        self._writer.write(view, copy=True)  # the caller may reuse ``data`` on return
        return len(view)

    def close(self) -> None:
        """Make the file visible, whole and durable (or raise: then nothing is)."""
        if self.closed:
            return
        try:
            if self._sink is not None:
                self._sink.close()
            self._writer.close()
        except BaseException:
            self._writer.abort()
            raise
        finally:
            super().close()

    def abort(self) -> None:
        """Discard the upload: nothing becomes visible."""
        if not self.closed:
            self._writer.abort()
            super().close()

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


class MemoryReader(io.RawIOBase):
    """A file already read into ``buf`` (a memoryview of bytes)."""

    def __init__(self, buf: memoryview) -> None:
        super().__init__()
        self._buf = buf
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def _end(self) -> int:
        """The stream's length (``SEEK_END``)."""
        return len(self._buf)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._end()}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        n = max(0, min(len(target), len(self._buf) - self._pos))
        target[:n] = self._buf[self._pos : self._pos + n]
        self._pos += n
        return n

    def readall(self) -> bytes:
        out = bytes(self._buf[self._pos :])
        self._pos = len(self._buf)
        return out


class RangedReader(MemoryReader):
    """``key`` of ``size`` bytes, read on demand by parallel ranged GETs."""

    def __init__(self, engine: TransferEngine, store: Store, key: str, size: int) -> None:
        super().__init__(memoryview(b""))
        self._engine, self._store, self._key, self._size = engine, store, key, size

    def _end(self) -> int:
        return self._size

    def readinto(self, buffer: Any) -> int:
        target = memoryview(buffer).cast("B")
        n = max(0, min(len(target), self._size - self._pos))
        if n:
            self._engine.read_into_async(self._store, self._key, self._pos, target[:n]).result()
        self._pos += n
        return n

    def readall(self) -> bytes:
        out = bytearray(max(0, self._size - self._pos))
        self.readinto(out)
        return bytes(out)
