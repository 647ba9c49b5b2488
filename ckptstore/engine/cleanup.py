"""Clean-up of what crashed writers leave behind: unfinished multipart uploads.

A process killed mid-upload leaves an upload that is invisible (no object appears) but
still holds its parts (billed storage on S3; temp files on a volume). Call
``sweep_multipart`` at startup, before the first save, on the checkpoint root::

    aborted = sweep_multipart(store, prefix="run1/", older_than_s=6 * 3600)

It works on every store through ``list_multipart`` / ``abort_multipart``. Pick
``older_than_s`` longer than any save takes, so a save still running elsewhere (another
job, a slow rank) is never cut off. An upload whose start time the store cannot tell is
left alone unless ``older_than_s <= 0``. Note that moto reports a fixed start time in 2010
for every upload, so on moto every upload looks stale.
"""

from __future__ import annotations

import logging
import time

from ckptstore.engine.store import Multipart, Store
from ckptstore.errors import CkptStoreError

__all__ = ["sweep_multipart", "stale_multipart"]

log = logging.getLogger(__name__)


def stale_multipart(
    store: Store, prefix: str = "", older_than_s: float = 24 * 3600, now: float | None = None
) -> list[Multipart]:
    """Unfinished uploads under ``prefix`` begun at least ``older_than_s`` seconds ago."""
    now = time.time() if now is None else now
    out = []
    for upload in store.list_multipart(prefix):
        initiated = upload.extra.get("initiated")
        if older_than_s <= 0 or (initiated is not None and now - initiated >= older_than_s):
            out.append(upload)
    return out


def sweep_multipart(
    store: Store, prefix: str = "", older_than_s: float = 24 * 3600, now: float | None = None
) -> list[Multipart]:
    """Abort every stale unfinished upload under ``prefix``; returns the ones aborted.

    An upload that cannot be aborted (a transient error, a permission the caller lacks)
    is logged and skipped, so one bad upload never stops a job from starting; the next
    sweep tries it again.
    """
    aborted = []
    for upload in stale_multipart(store, prefix, older_than_s, now):
        try:
            store.abort_multipart(upload)
        except CkptStoreError as exc:
            log.warning("could not abort stale upload of %s: %s", store.describe(upload.path), exc)
            continue
        log.info("aborted stale upload of %s", store.describe(upload.path))
        aborted.append(upload)
    return aborted
