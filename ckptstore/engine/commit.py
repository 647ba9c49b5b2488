"""The commit protocol: publish a checkpoint with a create-only marker, and open one.

Call order on the coordinator, after every rank's data files are durable::

    publish(store, engine, attempt, manifest, metadata_bytes)
        1. ckptstore.manifest.<attempt>.json     (put)   the attempt's own copies: a racing
        2. .metadata.<attempt>                    (put)   writer can never clobber them
        3. COMMITTED                              (create-only; names attempt + manifest CRC)
           -> CommitConflictError if another attempt committed first (the loser's files
              are deleted; the winner's are untouched)
        4. ckptstore.manifest.json, .metadata     (put)   canonical copies, for humans and
                                                          stock DCP readers
        5. files of other attempts (torn leftovers, replaced checkpoints) are deleted

A checkpoint exists only if COMMITTED exists and the manifest it names matches its CRC.
``open_committed`` finds the manifest and ``.metadata`` through the marker: the canonical
copy when it matches, else the attempt's own copy (a crash between steps 3 and 4).
Listing never decides completeness.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ckptstore.engine.checksum import crc32c
from ckptstore.engine.crashpoints import crashpoint
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, FileEntry, Manifest, Marker
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import (
    CommitConflictError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    StoreNotFoundError,
)

__all__ = [
    "METADATA_NAME",
    "Committed",
    "attempt_manifest_name",
    "attempt_metadata_name",
    "publish",
    "open_committed",
    "checkpoint_status",
    "is_committed",
    "uncommit",
    "delete_checkpoint",
]

log = logging.getLogger(__name__)

METADATA_NAME = ".metadata"


def attempt_manifest_name(attempt: str) -> str:
    return f"ckptstore.manifest.{attempt}.json"


def attempt_metadata_name(attempt: str) -> str:
    return f"{METADATA_NAME}.{attempt}"


@dataclass(frozen=True)
class Committed:
    """A committed checkpoint as opened: marker, manifest and the DCP metadata bytes."""

    marker: Marker
    manifest: Manifest
    metadata_bytes: bytes


def publish(
    store: Store,
    engine: TransferEngine,
    attempt: str,
    manifest: Manifest,
    metadata_bytes: bytes,
) -> Marker:
    """Commit a checkpoint whose data files are durable; see the module docstring."""
    manifest.files[METADATA_NAME] = FileEntry(len(metadata_bytes), crc32c(metadata_bytes))
    manifest.extra["attempt"] = attempt
    manifest_bytes = manifest.to_bytes()
    marker = Marker.for_manifest(manifest_bytes, manifest.step, attempt)
    own = [attempt_manifest_name(attempt), attempt_metadata_name(attempt)]
    engine.put(store, own[0], manifest_bytes)
    engine.put(store, own[1], metadata_bytes)
    crashpoint("before_marker")
    try:
        engine.retry(
            lambda: store.put_if_absent(MARKER_NAME, marker.to_bytes()),
            f"commit of {store.describe(MARKER_NAME)}",
        )
    except CommitConflictError:
        for name in [*own, *(n for n in manifest.files if n != METADATA_NAME)]:
            store.delete(name)
        raise CommitConflictError(
            f"{store.url} was committed by another writer while this one was saving; this "
            "attempt's files were removed and the other checkpoint is kept."
        ) from None
    crashpoint("after_marker")
    engine.put(store, MANIFEST_NAME, manifest_bytes)
    engine.put(store, METADATA_NAME, metadata_bytes)
    keep = {MARKER_NAME, MANIFEST_NAME, METADATA_NAME, *own, *manifest.files}
    for name in store.find():
        if name not in keep:
            store.delete(name)
    return marker


def _read_marker(store: Store) -> Marker:
    try:
        data = store.get(MARKER_NAME)
    except StoreNotFoundError:
        raise IncompleteCheckpointError(
            f"{store.url} has no {MARKER_NAME} marker: the save did not finish (or this is not "
            "a checkpoint). Restore an earlier checkpoint; CheckpointManager.restore() picks "
            "the newest committed one."
        ) from None
    return Marker.from_bytes(data, store.describe(MARKER_NAME))


def _get_first(store: Store, names: list[str], ok: object) -> bytes | None:
    for name in names:
        try:
            data = store.get(name)
        except StoreNotFoundError:
            continue
        if ok(data):  # type: ignore[operator]
            return data
    return None


def open_committed(store: Store) -> Committed:
    """Open a committed checkpoint, or raise Incomplete/CorruptCheckpointError saying why."""
    marker = _read_marker(store)
    names = [MANIFEST_NAME] + ([attempt_manifest_name(marker.attempt)] if marker.attempt else [])
    manifest_bytes = _get_first(store, names, marker.matches)
    if manifest_bytes is None:
        raise CorruptCheckpointError(
            f"{store.url}: the manifest does not match the checksum in {MARKER_NAME} (or is "
            "missing); the checkpoint is damaged. Restore the previous checkpoint."
        )
    manifest = Manifest.from_bytes(manifest_bytes, store.describe(MANIFEST_NAME))
    entry = manifest.files.get(METADATA_NAME)
    if entry is None:
        raise CorruptCheckpointError(f"{store.url}: the manifest does not list {METADATA_NAME}")
    names = [METADATA_NAME] + ([attempt_metadata_name(marker.attempt)] if marker.attempt else [])

    def metadata_ok(data: bytes) -> bool:
        return len(data) == entry.size and crc32c(data) == entry.crc32c

    metadata_bytes = _get_first(store, names, metadata_ok)
    if metadata_bytes is None:
        raise CorruptCheckpointError(
            f"{store.describe(METADATA_NAME)} is missing or does not match the manifest; the "
            "checkpoint is damaged. Restore the previous checkpoint."
        )
    return Committed(marker, manifest, metadata_bytes)


def is_committed(store: Store) -> bool:
    """True if ``store`` holds a checkpoint whose marker matches its manifest."""
    return checkpoint_status(store) == "committed"


def checkpoint_status(store: Store) -> str:
    """``committed``, ``incomplete`` (no marker) or ``corrupt`` (marker/manifest mismatch)."""
    try:
        open_committed(store)
    except IncompleteCheckpointError:
        return "incomplete"
    except CorruptCheckpointError:
        return "corrupt"
    return "committed"


def uncommit(store: Store) -> None:
    """Make a committed checkpoint invisible (before overwriting it): delete its marker."""
    store.delete(MARKER_NAME)


def delete_checkpoint(store: Store) -> None:
    """Delete a checkpoint: its marker first (invisible at once), then every file, so a
    deletion cut short leaves an incomplete step, never a committed one with files missing."""
    uncommit(store)
    store.delete_prefix("")
