"""``Opened``: what rank 0 read of one step at a restore, in the form it broadcasts.

A restore's discovery (``manager.restore.StepLoader``) opens each candidate step on rank 0
alone and sends every other rank this value: the marker, manifest and ``.metadata``
bytes of a committed step, or why it could not be opened; each rank then re-checks the
bytes (``committed``) without a store read.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptstore.engine.committed import Committed, committed_from_bytes
from ckptstore.engine.manifest import Marker
from ckptstore.errors import (
    CkptStoreError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    NewerFormatError,
)

__all__ = ["Opened"]


@dataclass(frozen=True)
class Opened:
    """What rank 0 read of one step, as broadcast: the marker, manifest and ``.metadata``
    bytes of a committed step, or (``error`` set) why it could not be opened
    (``incomplete``: no marker; ``newer``: a newer ckptstore's format; anything else:
    damaged). ``local``: a local-only step, read by the rank whose local tier holds it."""

    step: int
    marker: Marker | None = None
    manifest_bytes: bytes = b""
    metadata_bytes: bytes = b""
    error: str = ""
    incomplete: bool = False
    local: bool = False
    newer: bool = False

    @classmethod
    def of(cls, step: int, committed: Committed, local: bool = False) -> Opened:
        """The broadcast form of a checkpoint ``open_committed`` opened."""
        return cls(
            step,
            committed.marker,
            committed.manifest_bytes,
            committed.metadata_bytes,
            local=local,
        )

    @classmethod
    def failed(cls, step: int, exc: CkptStoreError) -> Opened:
        """The broadcast form of a step that failed to open with ``exc``."""
        return cls(
            step,
            error=str(exc),
            incomplete=isinstance(exc, IncompleteCheckpointError),
            newer=isinstance(exc, NewerFormatError),
        )

    def committed(self, where: str) -> Committed:
        """The verified checkpoint (re-checked here, no store read), or raise
        ``CorruptCheckpointError`` (``NewerFormatError``) saying why it is not one."""
        if self.error:
            raise (NewerFormatError if self.newer else CorruptCheckpointError)(self.error)
        assert self.marker is not None
        return committed_from_bytes(self.marker, self.manifest_bytes, self.metadata_bytes, where)
