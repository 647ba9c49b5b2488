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
        5. ckptstore files of other attempts (torn leftovers, replaced checkpoints) are
           deleted; files ckptstore did not name (a user's notes.txt) stay

A checkpoint exists only if COMMITTED exists and the manifest it names matches its CRC.
``open_committed`` finds the manifest and ``.metadata`` through the marker: the canonical
copy when it matches, else the attempt's own copy (a crash between steps 3 and 4), and says
which (``Committed.canonical``). ``finish_publish`` redoes steps 4 and 5 for such a
checkpoint (``CheckpointManager.restore`` runs it on the next start), so stock readers and
``ckptstore-tool verify`` see it whole again. Listing never decides completeness.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ckptstore.engine.checksum import crc32c
from ckptstore.engine.crashpoints import crashpoint
from ckptstore.engine.layout import is_ckptstore_file
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
    "finish_publish",
    "open_committed",
    "checkpoint_status",
    "is_committed",
    "uncommit",
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
    manifest_bytes: bytes = b""
    canonical: bool = True  # the canonical manifest and .metadata are the committed ones


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
    _publish_canonical(store, engine, attempt, manifest, manifest_bytes, metadata_bytes)
    return marker


def _publish_canonical(
    store: Store,
    engine: TransferEngine,
    attempt: str,
    manifest: Manifest,
    manifest_bytes: bytes,
    metadata_bytes: bytes,
) -> None:
    """Steps 4 and 5: canonical copies, then delete what no committed file needs."""
    engine.put(store, MANIFEST_NAME, manifest_bytes)
    engine.put(store, METADATA_NAME, metadata_bytes)
    own = [attempt_manifest_name(attempt), attempt_metadata_name(attempt)] if attempt else []
    keep = {MARKER_NAME, MANIFEST_NAME, METADATA_NAME, *own, *manifest.files}
    for name in store.find():
        if name not in keep and is_ckptstore_file(name):  # a user's file in a step stays
            store.delete(name)


def finish_publish(store: Store, engine: TransferEngine) -> bool:
    """Complete a publish cut short after its marker (steps 4 and 5); True if it was.

    Idempotent and a no-op for a checkpoint whose canonical copies are the committed ones.
    Raises Incomplete/CorruptCheckpointError as ``open_committed`` does.
    """
    committed = open_committed(store)
    if committed.canonical:
        return False
    c = committed
    _publish_canonical(
        store, engine, c.marker.attempt, c.manifest, c.manifest_bytes, c.metadata_bytes
    )
    log.info("%s: finished a commit cut short after its marker (canonical copies)", store.url)
    return True


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


def _get_first(store: Store, names: list[str], ok: object) -> tuple[str, bytes] | None:
    for name in names:
        try:
            data = store.get(name)
        except StoreNotFoundError:
            continue
        if ok(data):  # type: ignore[operator]
            return name, data
    return None


def open_committed(store: Store) -> Committed:
    """Open a committed checkpoint, or raise Incomplete/CorruptCheckpointError saying why."""
    marker = _read_marker(store)
    names = [MANIFEST_NAME] + ([attempt_manifest_name(marker.attempt)] if marker.attempt else [])
    found = _get_first(store, names, marker.matches)
    if found is None:
        raise CorruptCheckpointError(
            f"{store.url}: the manifest does not match the checksum in {MARKER_NAME} (or is "
            "missing); the checkpoint is damaged. Restore the previous checkpoint."
        )
    manifest_name, manifest_bytes = found
    manifest = Manifest.from_bytes(manifest_bytes, store.describe(MANIFEST_NAME))
    entry = manifest.files.get(METADATA_NAME)
    if entry is None:
        raise CorruptCheckpointError(f"{store.url}: the manifest does not list {METADATA_NAME}")
    names = [METADATA_NAME] + ([attempt_metadata_name(marker.attempt)] if marker.attempt else [])

    def metadata_ok(data: bytes) -> bool:
        return len(data) == entry.size and crc32c(data) == entry.crc32c

    got = _get_first(store, names, metadata_ok)
    if got is None:
        raise CorruptCheckpointError(
            f"{store.describe(METADATA_NAME)} is missing or does not match the manifest; the "
            "checkpoint is damaged. Restore the previous checkpoint."
        )
    metadata_name, metadata_bytes = got
    canonical = manifest_name == MANIFEST_NAME and metadata_name == METADATA_NAME
    return Committed(marker, manifest, metadata_bytes, manifest_bytes, canonical)


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
