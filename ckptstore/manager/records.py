"""What the manager records of each save: ``SaveRecord`` and its ``SaveStatus``."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

__all__ = ["MANIFEST_TIMINGS", "SaveRecord", "SaveStatus", "tensor_bytes"]

#: The SaveRecord fields written into each manifest: those known before the marker.
MANIFEST_TIMINGS = ("waited_s", "staging_s", "blocking_s", "bytes")


class SaveStatus(str, Enum):
    """Where a save stands. A ``str``: ``record.status == "committed"`` and JSON keep
    working with the plain names."""

    STAGING = "staging"  # copying the state into the staging buffer
    WRITING = "writing"  # serialise + write/upload + commit, in the background
    COMMITTED = "committed"
    FAILED = "failed"  # ``record.error`` says why; the previous checkpoint is the newest
    SKIPPED = "skipped"  # busy with ``on_busy="skip"``, or the step was committed already

    def __str__(self) -> str:
        return self.value


@dataclass
class SaveRecord:
    """Timings of one save, in seconds (``blocking_s`` is what training paid).

    ``mgr.records`` holds one per ``save()`` call, complete once the save has ended. The
    manifest (``extra["timings"]``) holds the fields known before the commit marker is
    written: ``waited_s``, ``staging_s``, ``blocking_s`` and ``bytes`` (rank 0's values);
    ``background_s`` and ``total_s`` end after the marker, so only the record and the
    ``step N committed`` log line have them.
    """

    step: int
    status: SaveStatus = SaveStatus.STAGING
    waited_s: float = 0.0  # waiting for the previous save (part of blocking_s)
    staging_s: float = 0.0  # copying the state into the staging buffer
    blocking_s: float = 0.0  # save() call until training may modify the state again
    background_s: float = 0.0  # serialise + write/upload + commit
    total_s: float = 0.0  # save() call until committed
    bytes: int = 0
    #: Bytes copied after save() returned, while the next step ran (``defer_staging``),
    #: and what the optimizer's step (or ``wait_staged``) then waited for that copy
    #: (part of ``blocking_s``; not in the manifest, which is written before).
    deferred_bytes: int = 0
    step_waited_s: float = 0.0
    error: str = ""
    #: Where the save went: "root" or "local" (the local tier alone; see
    #: ``ManagerOptions.local_every``).
    tier: str = "root"
    #: Problems after the commit (canonical copies, cleanup, retention): the save is
    #: committed all the same; ``ckptstore-tool gc`` or the next restore tidies up.
    warnings: list[str] = field(default_factory=list)

    def manifest_timings(self) -> dict[str, float]:
        """The fields of ``MANIFEST_TIMINGS``, for the manifest's ``extra["timings"]``."""
        return {k: getattr(self, k) for k in MANIFEST_TIMINGS}


def tensor_bytes(obj: Any) -> int:
    """The bytes of every tensor in ``obj`` (nested dicts, lists, tuples; DTensor's local
    shard)."""
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    if torch.is_tensor(obj):
        local = obj.to_local() if hasattr(obj, "to_local") else obj
        return int(local.numel() * local.element_size())
    return 0
