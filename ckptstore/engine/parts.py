"""Parts sent from several buffers: a file's large writes go out from the caller's memory, its
small ones through small pooled buffers, in parts of the usual size.

Used by ``FileWriter`` on a store with ``Capabilities.gather_parts`` (S3), whose
``put_part_buffers`` sends a part given as several buffers as one request body without
joining them: a tensor's bytes are never copied by ckptstore, and each part's CRC32C is
computed as its bytes are added. The design (a part's buffers, their ownership, the memory budget,
the caller's memory, checksums in one pass) and the call order are :class:`PartBuilder`'s
docstring.
"""

from __future__ import annotations

from collections.abc import Callable

from ckptstore.engine.buffers import BufferPool, copy_into
from ckptstore.engine.checksum import crc32c, crc32c_combine

__all__ = ["PartBuilder", "Release", "Send"]

#: Gives back the memory a part held (its pooled buffers, the caller bytes it reserved).
Release = Callable[[], None]

#: Sends one part: ``send(buffers, release, crc)``, ``crc`` the CRC32C of its bytes.
Send = Callable[[list[memoryview], Release, int], None]


class PartBuilder:
    """Builds one file's parts from its writes.

    The design, and why it is the simplest the store API allows:

    - A part is a list of *buffers*, in file order: views of the caller's memory (each large
      write, cut where a part ends) and views of small pooled buffers that the small writes
      between them (item headers, small items) are copied into. So a tensor's bytes are never
      copied by ckptstore, whatever its size, and no part is shorter than it would be with
      copying: S3's rule (every part but the last >= 5 MiB) holds without special cases.
    - A small buffer belongs to one part only (later small writes of the next part go into a
      new buffer), so it is given back when that part is sent, with no reference counting.
    - The budget: a part being built holds at most ``part_size`` bytes of the engine's memory
      budget, counting its pooled buffers at their full size and the caller's bytes it points
      to (``BufferPool.reserve``), exactly as the copying path's one part buffer does; a part
      is sent as soon as adding more would exceed that. So a writer never waits for memory
      its own unsent part holds, ``TeeWriter.fits`` stays true, and parts are at least
      ``part_size - buffer_size`` bytes long (``FileWriter`` uses this path only where that
      is at least the store's ``min_part_size``).
    - The caller's memory must stay alive and unchanged until its part is sent: a view that
      does not keep its memory alive itself (``view.obj``) comes with its owner, which the part
      holds until it is sent (``refer(view, owner)``); a retried part resends the same buffers.
    - Checksums in one pass: every part's CRC32C (the store's per-part integrity header) is
      computed here, as the bytes are added: a small write's as it is copied (a continuation
      of the part's CRC), a large write's in one view per part it lands in, each hashed once
      and folded into its part's CRC with ``crc32c_combine``. ``refer`` returns the CRC32C of
      the whole view (those CRCs combined), which the item and file checksums use, so a
      tensor's bytes are read once for all three. A small write is hashed twice (here and by
      its item): a combine costs more than rehashing a few KiB.

    Call order (one thread: the ``FileWriter``'s)::

        parts = PartBuilder(part_size, buffer_size, pool, cancelled, send)
        parts.copy(view)        # a small write: copied into pooled buffers
        crc = parts.refer(view, owner)  # a large write: its memory, by reference; its CRC32C
        # send(buffers, release, crc) is called for each full part (crc: the CRC32C of its
        # bytes); release() once it is sent
        parts.flush()           # the last part goes out (at close)
        buffers, release, crc = parts.take()  # or: the unsent part itself (a one-request file)
        parts.discard()         # on abort: give back what the unsent part holds
    """

    def __init__(
        self,
        part_size: int,
        buffer_size: int,
        pool: BufferPool,
        cancelled: Callable[[], bool],
        send: Send,
    ) -> None:
        if buffer_size > part_size:
            raise ValueError("PartBuilder: buffer_size must not exceed part_size")
        self.part_size = part_size
        self.buffer_size = buffer_size
        self._pool = pool
        self._cancelled = cancelled
        self._send = send
        self._views: list[memoryview] = []  # the unsent part's buffers, in file order
        self._pooled: list[bytearray] = []  # pooled buffers the unsent part points into
        self._referenced = 0  # caller bytes the unsent part points to (reserved)
        self._owners: list[object] = []  # what owns the memory of the unsent part's views
        self._buf: memoryview | None = None  # the buffer small writes go into now
        self._mark = 0  # start of its bytes not yet made one of the part's buffers
        self._fill = 0
        self._crc = 0  # CRC32C of the unsent part's bytes

    @property
    def held(self) -> int:
        """Bytes of the memory budget the unsent part holds."""
        return len(self._pooled) * self.buffer_size + self._referenced

    def copy(self, view: memoryview) -> None:
        """Append ``view``'s bytes, copied into pooled buffers."""
        while len(view):
            if self._buf is None:
                if self.held + self.buffer_size > self.part_size:
                    self.flush()
                buf = self._pool.acquire(self.buffer_size, self._cancelled)
                self._pooled.append(buf)
                self._buf, self._mark, self._fill = memoryview(buf), 0, 0
            n = min(len(view), self.buffer_size - self._fill)
            copy_into(self._buf, self._fill, view[:n])
            self._crc = crc32c(view[:n], self._crc)
            self._fill += n
            view = view[n:]
            if self._fill == self.buffer_size:
                self._seal()
                self._buf = None

    def refer(self, view: memoryview, owner: object = None) -> int:
        """Append ``view`` by reference: its memory is sent as it is (keep it unchanged
        until the file is closed); every part it lands in holds ``owner`` (what keeps that
        memory alive, if ``view`` does not) until sent. Blocks while the memory budget is
        spent elsewhere. Returns the CRC32C of ``view`` (hashed once, see the module
        docstring)."""
        crc = 0
        while len(view):
            room = self.part_size - self.held
            if room <= 0:
                self.flush()
                continue
            head = view[:room]
            self._pool.reserve(len(head), self._cancelled)
            self._seal()
            head_crc = crc32c(head)
            crc = crc32c_combine(crc, head_crc, len(head))
            self._crc = crc32c_combine(self._crc, head_crc, len(head))
            self._views.append(head)
            self._referenced += len(head)
            if owner is not None and not (self._owners and self._owners[-1] is owner):
                self._owners.append(owner)
            view = view[len(head) :]
            if self.held >= self.part_size:
                self.flush()
        return crc

    def _seal(self) -> None:
        """Make the current buffer's bytes not yet sent the part's next view of it."""
        if self._buf is not None and self._fill > self._mark:
            self._views.append(self._buf[self._mark : self._fill])
            self._mark = self._fill

    def take(self) -> tuple[list[memoryview], Release, int]:
        """The unsent part's buffers (possibly none), what gives back its memory and the
        CRC32C of its bytes; the builder starts a new part."""
        self._seal()
        views, pooled, referenced = self._views, self._pooled, self._referenced
        owners, crc = self._owners, self._crc
        self._views, self._pooled, self._referenced, self._owners = [], [], 0, []
        self._buf, self._mark, self._fill, self._crc = None, 0, 0, 0
        pool = self._pool

        def release() -> None:
            for buf in pooled:
                pool.release(buf)
            if referenced:
                pool.unreserve(referenced)
            owners.clear()  # the memory may go now (release may outlive the part)

        return views, release, crc

    def flush(self) -> None:
        """Send the unsent part, if it holds any bytes."""
        views, release, crc = self.take()
        if views:
            self._send(views, release, crc)
        else:
            release()

    def discard(self) -> None:
        """Drop the unsent part, giving back its memory (abort)."""
        self.take()[1]()
