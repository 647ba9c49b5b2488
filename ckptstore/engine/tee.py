"""One stream of bytes written to two files at once: a tier copy and its upload.

``TeeWriter`` takes the place of a ``FileWriter`` (same ``write`` / ``item`` / ``close`` /
``abort``) and forwards every byte to two of them: the *primary* (the file that must be
complete, e.g. the tier copy in a local tier) and the *secondary* (e.g. the upload to
the root). Bytes are hashed once (by ``write`` or by the ``ItemSink``) and both files'
CRC32Cs are extended with the same value; both sinks send their parts on the engine's I/O
threads, so the upload neither waits for the local write nor re-reads it.

Call order::

    tee = TeeWriter(engine.writer(tier, name), engine.writer(root, name))
    tee.write(data, crc) / with tee.item(...) as sink: ...   # both files, one hash
    tee.align(address, lead, nbytes)                      # before an item, as FileWriter
    info = tee.close()           # primary closed first, then the secondary
    tee.secondary_error          # None, or why the secondary was aborted
    tee.abort()                  # both aborted (also on leaving ``with`` while open)

A failure of the secondary never fails the primary: the secondary is aborted (nothing
half-made is left), its error kept in ``secondary_error``, and the primary written to the
end. A failure of the primary aborts both and raises. Each writer holds up to one
partly filled part buffer of the engine's pool, so the engine's ``memory_budget`` must
hold a part of each (``fits``), or the two could wait on each other for memory.
"""

from __future__ import annotations

from ckptstore.engine.checksum import crc32c
from ckptstore.engine.crashpoints import crashpoint
from ckptstore.engine.filewriter import FileInfo, FileWriter, ItemSink
from ckptstore.engine.store import Buffer
from ckptstore.engine.writeplan import alignment_pad
from ckptstore.errors import TransferError

__all__ = ["TeeWriter"]


class TeeWriter:
    """Writes one file's bytes to two ``FileWriter``s at once. See the module docstring."""

    def __init__(self, primary: FileWriter, secondary: FileWriter) -> None:
        self.primary = primary
        self.secondary = secondary
        #: Why the secondary was aborted (it is never raised by the tee), else None.
        self.secondary_error: Exception | None = None
        self._started = False

    @staticmethod
    def fits(primary: FileWriter, secondary: FileWriter) -> bool:
        """True when the engine's memory budget holds a part buffer of each writer."""
        return primary.part_size + secondary.part_size <= primary.engine.config.memory_budget

    @property
    def size(self) -> int:
        """Bytes written to the file so far."""
        return self.primary.size

    @property
    def crc32c(self) -> int:
        """CRC32C of everything written so far."""
        return self.primary.crc32c

    def __enter__(self) -> TeeWriter:
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if "open" in (self.primary.state, self.secondary.state) or exc_type is not None:
            self.abort()

    # -- the secondary: forwarded to while it is healthy --------------------------------
    def _to_secondary(self, call: str, *args: object) -> object:
        """``call`` on the secondary while it is healthy; its result (None if dropped)."""
        if self.secondary_error is not None:
            return None
        out = None
        try:
            self.secondary.raise_if_failed()
            out = getattr(self.secondary, call)(*args)
        except Exception as exc:  # noqa: BLE001 - kept for the caller, never raised here
            self._drop_secondary(exc)
        if not self._started and call in ("write", "send_unhashed"):
            self._started = True
            crashpoint("mid_upload")  # the upload has begun, the tier copy is partial
        return out

    def _drop_secondary(self, exc: Exception) -> None:
        self.secondary_error = exc
        self.secondary.abort()

    # -- FileWriter's interface ---------------------------------------------------------
    def write(self, data: Buffer, crc: int | None = None) -> int:
        """Append ``data`` to both files (hashed once); returns its offset."""
        view = memoryview(data).cast("B")
        if crc is None:
            crc = crc32c(view)
        offset = self.primary.write(view, crc)
        self._to_secondary("write", view, crc)
        return offset

    def align(self, address: int, lead: int, nbytes: int) -> int:
        """``FileWriter.align`` for both files at once (the larger store alignment: both
        are powers of two); the same pad goes to both."""
        alignment = max(
            self.primary.store.capabilities.direct_alignment,
            self.secondary.store.capabilities.direct_alignment,
        )
        pad = alignment_pad(self.size, address, lead, nbytes, alignment)
        if pad:
            self.write(bytes(pad))
        return pad

    def item(self, payload: tuple[int, int] | None = None, owner: object = None) -> ItemSink:
        """A sink for one item, as ``FileWriter.item``; its bytes go to both files."""
        self.primary.raise_if_failed()
        return ItemSink(self, payload, owner)

    def hold(self, owner: object) -> None:
        """Keep ``owner`` alive while either file's parts point into it (``FileWriter.hold``)."""
        self.primary.hold(owner)
        self._to_secondary("hold", owner)

    def send_unhashed(self, view: memoryview, owned: bool = False) -> int | None:
        """``FileWriter.send_unhashed`` on both files; the CRC32C either computed."""
        crc = self.primary.send_unhashed(view, owned)
        other = self._to_secondary("send_unhashed", view, owned)
        return crc if crc is not None else other if isinstance(other, int) else None

    def extend_crc(self, crc: int, length: int) -> None:
        """``FileWriter.extend_crc`` on both files."""
        self.primary.extend_crc(crc, length)
        self._to_secondary("extend_crc", crc, length)

    def close(self) -> FileInfo:
        """Close the primary (raising its failure, after aborting the secondary), then the
        secondary if both saw the same bytes (keeping a failure in ``secondary_error``);
        returns the primary's FileInfo."""
        try:
            info = self.primary.close()
        except BaseException:
            self.secondary.abort()
            raise
        sec = self.secondary
        if self.secondary_error is None and (sec.size, sec.crc32c) != (info.size, info.crc32c):
            self._drop_secondary(
                TransferError(
                    f"upload of {sec.path}: {sec.size} bytes, crc32c {sec.crc32c:08x}, but the "
                    f"tier copy has {info.size}, {info.crc32c:08x}; the upload was aborted"
                )
            )
        if self.secondary_error is None:
            try:
                sec.close()
            except Exception as exc:  # noqa: BLE001 - kept for the caller
                self.secondary_error = exc
        return info

    def abort(self) -> None:
        """Discard both files (but not one already closed); idempotent, never raises."""
        for writer in (self.primary, self.secondary):
            if writer.state != "closed":
                writer.abort()
