"""What the manager records of each save (``SaveRecord`` and its ``SaveStatus``), and the
line it reports of each committed save and each restore (``report``).

A job that configures no logging sees nothing below WARNING (Python's last-resort handler),
so it would checkpoint silently. The manager reports each committed save and each restore
(step, tier, bytes, seconds) on the logger ``ckptstore.report`` at INFO, on rank 0 only:

- logging not configured (no handler on that logger, ``ckptstore`` or the root): the line
  goes to stderr as ``ckptstore: ...``;
- logging configured: the record goes to its handlers, like any other;
- quiet: ``logging.getLogger("ckptstore").setLevel(logging.WARNING)`` (or the same on
  ``ckptstore.report``): a level set there decides, as logging's levels always do.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import torch

from ckptstore.redact import has_output_handlers, redact

__all__ = ["MANIFEST_TIMINGS", "REPORT", "SaveRecord", "SaveStatus", "report", "tensor_bytes"]

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


# -- the report line ---------------------------------------------------------------------
REPORT = logging.getLogger("ckptstore.report")

_stderr = logging.StreamHandler(sys.stderr)
_stderr.setFormatter(logging.Formatter("ckptstore: %(message)s"))


def _enabled() -> bool:
    """INFO by default; a level the user set on ``ckptstore.report`` or ``ckptstore`` wins."""
    for logger in (REPORT, logging.getLogger("ckptstore")):
        if logger.level != logging.NOTSET:
            return logger.isEnabledFor(logging.INFO)
    return not logging.getLogger().manager.disable >= logging.INFO


def report(message: str, *args: object) -> None:
    """Report ``message % args`` at INFO (see the module docstring); the caller is rank 0."""
    if not _enabled():
        return
    record = REPORT.makeRecord(REPORT.name, logging.INFO, "(report)", 0, message, args, None)
    if has_output_handlers(REPORT):
        REPORT.handle(record)  # logging configured: its handlers (and filters) decide
    else:
        record.msg, record.args = redact(record.getMessage()), None
        _stderr.handle(record)
