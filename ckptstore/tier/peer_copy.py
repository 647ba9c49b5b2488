"""One file of the peer tier on the wire: the sending end and the receiving end.

``tier.peers`` pairs them round by round. A file travels as ``chunks(copy)``
messages of at most ``CHUNK`` bytes (the memory each end holds). Both ends are this job's
directory of their node's local tier (``tier.local_tier``: its stamp checked when the
copy starts, the receiver's made with its stamp if absent). The sender always sends
exactly the size the plan says, zeros past what it can read; the receiver writes into a
temp file of its step directory (the local store's own multipart upload, resolved from
the tier's descriptor, never through a link), checks the size and CRC32C against the
step's manifest, and renames it into place only then: a damaged source, a full disk, a
refused directory or a dead sender never leaves a file that looks like a replica.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ckptstore.engine.checksum import crc32c
from ckptstore.engine.manifest import Manifest
from ckptstore.engine.store import Multipart, Part, Store
from ckptstore.errors import CkptStoreError
from ckptstore.tier.replicas import Copy

__all__ = ["CHUNK", "Incoming", "Outgoing", "chunks"]

log = logging.getLogger(__name__)

#: Bytes per message of a copy.
CHUNK = 16 << 20


def chunks(copy: Copy | None) -> int:
    """How many ``CHUNK`` messages carry ``copy``'s file (0 for none)."""
    return 0 if copy is None else -(-copy.size // CHUNK)


class Outgoing:
    """A file being sent: chunk ``i`` read from this node's step directory (``step_dir``'s,
    found once). Exactly ``copy.size`` bytes go out, zeros past what can be read (the
    receiver's checksum then refuses the copy)."""

    def __init__(self, step_dir: Callable[[int], Store], step: int, copy: Copy) -> None:
        self.step, self.copy = step, copy
        self.buf = bytearray(min(CHUNK, copy.size))
        self.local: Store | None = None
        try:
            self.local = step_dir(step)
        except (OSError, CkptStoreError) as exc:
            log.warning("cannot send %s of step %d to a peer: %s", copy.name, step, exc)

    def chunk(self, i: int) -> torch.Tensor:
        """Chunk ``i`` of the file, read now (the buffer is reused for the next one)."""
        offset = i * CHUNK
        view = memoryview(self.buf)[: min(CHUNK, self.copy.size - offset)]
        got = 0
        if self.local is not None:
            try:
                got = self.local.get_into(self.copy.name, offset, view)
            except (OSError, CkptStoreError) as exc:
                log.warning("could not read %s to send it to a peer: %s", self.copy.name, exc)
                self.local = None  # the rest goes out as zeros, with one warning
        view[got:] = bytes(len(view) - got)
        return torch.frombuffer(view, dtype=torch.uint8)


class Incoming:
    """A file being received into a temp file of this node's step directory, kept
    (renamed into place) only if its size and CRC32C are the manifest's. Every chunk is
    received whatever happens to the temp file, so the exchange stays in step."""

    def __init__(
        self, step_dir: Callable[[int], Store], step: int, copy: Copy, manifest: Manifest
    ) -> None:
        self.copy, self.step = copy, step
        self.expected = manifest.files[copy.name].crc32c
        self.crc = 0
        self.parts: list[Part] = []
        self.buf = torch.empty(min(CHUNK, copy.size), dtype=torch.uint8)
        self.upload: Multipart | None = None
        try:
            self.local = step_dir(step)  # its directories are made by the upload's begin
            self.upload = self.local.begin_multipart(copy.name)
        except (OSError, CkptStoreError) as exc:
            log.warning("cannot write a peer's copy of %s in step %d: %s", copy.name, step, exc)

    def buffer(self, i: int) -> torch.Tensor:
        """Where chunk ``i`` is received (reused: ``landed`` takes it before the next)."""
        return self.buf[: min(CHUNK, self.copy.size - i * CHUNK)]

    def landed(self, i: int) -> None:
        """Chunk ``i`` arrived: add it to the checksum and write it to the temp file."""
        data = memoryview(self.buffer(i).numpy())  # type: ignore[arg-type]
        self.crc = crc32c(data, self.crc)
        if self.upload is not None:
            try:
                self.parts.append(self.local.put_part(self.upload, i + 1, i * CHUNK, data))
            except (OSError, CkptStoreError) as exc:
                log.warning("cannot write %s: %s", self.local.describe(self.copy.name), exc)
                self.abort()

    def abort(self) -> None:
        """Remove the temp file (the copy is not kept)."""
        if self.upload is not None:
            self.local.abort_multipart(self.upload)
            self.upload = None

    def finish(self) -> bool:
        """Keep the file if whole and as the manifest records it; True if kept."""
        if self.upload is None:
            return False
        if self.crc != self.expected:
            log.warning(
                "the copy of %s a peer sent does not match step %d's manifest; not kept",
                self.local.describe(self.copy.name), self.step,
            )  # fmt: skip
            self.abort()
            return False
        try:
            self.local.complete_multipart(self.upload, self.parts)
        except (OSError, CkptStoreError) as exc:
            log.warning("cannot keep %s: %s", self.local.describe(self.copy.name), exc)
            self.abort()
            return False
        return True
