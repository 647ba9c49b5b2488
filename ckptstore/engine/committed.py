"""Open a committed checkpoint: find its manifest and ``.metadata`` through ``COMMITTED``.

A checkpoint exists only if ``COMMITTED`` exists and the manifest it names matches its CRC
(``engine.commit.commit`` writes them). ``open_committed`` reads the canonical manifest
and ``.metadata`` when they match the marker, else the save attempt's own copies (a commit
cut short after its marker), and says which (``Committed.canonical``; ``finish_commit``
then completes it). ``committed_from_bytes`` re-checks bytes another process read;
``checkpoint_status`` says what a step holds. Listing never decides completeness.
"""

from __future__ import annotations

import copy
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from enum import Enum

from ckptstore.config import RetryConfig
from ckptstore.engine.bounded import (
    EARLY_READ_LIMIT,
    MAX_MARKER_SIZE,
    MAX_METADATA_SIZE,
    get_capped,
)
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, Manifest, Marker
from ckptstore.engine.retry import retrying
from ckptstore.engine.store import Store
from ckptstore.errors import (
    CkptStoreError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    NewerFormatError,
    StoreNotFoundError,
)

__all__ = [
    "METADATA_NAME",
    "CheckpointStatus",
    "Committed",
    "attempt_manifest_name",
    "attempt_metadata_name",
    "open_committed",
    "committed_from_bytes",
    "checkpoint_status",
    "committed_status",
]

METADATA_NAME = ".metadata"


def attempt_manifest_name(attempt: str) -> str:
    """The name of save attempt ``attempt``'s own manifest copy."""
    return f"ckptstore.manifest.{attempt}.json"


def attempt_metadata_name(attempt: str) -> str:
    """The name of save attempt ``attempt``'s own ``.metadata`` copy."""
    return f"{METADATA_NAME}.{attempt}"


@dataclass(frozen=True)
class Committed:
    """A committed checkpoint as opened: marker, manifest and the DCP metadata bytes."""

    marker: Marker
    manifest: Manifest
    metadata_bytes: bytes
    manifest_bytes: bytes = b""
    canonical: bool = True  # the canonical manifest and .metadata are the committed ones


def _read_marker(store: Store) -> Marker:
    try:
        data = get_capped(store, MARKER_NAME, MAX_MARKER_SIZE)
    except StoreNotFoundError:
        raise IncompleteCheckpointError(
            f"{store.url} has no {MARKER_NAME} marker: the save did not finish (or this is not "
            "a checkpoint). Restore an earlier checkpoint; CheckpointManager.restore() picks "
            "the newest committed one."
        ) from None
    return Marker.from_bytes(data, store.describe(MARKER_NAME))


def _get_first(
    store: Store,
    names: list[str],
    ok: object,
    early: dict[str, Future[bytes]] | None = None,
    size: int = 0,
) -> tuple[str, bytes] | None:
    """The first of ``names`` whose bytes are ``ok`` (which they can be only if ``size``
    bytes long: no more than ``size + 1`` bytes are read, through ``get_capped``, and one
    larger is passed over). A read started ``early`` (beside the
    marker's, capped) stands for the object unless it failed, in which case it is read again
    (not there then, too big to read early, or a transient error: the new read raises what
    is still wrong). Bytes that changed after an early read are the marker's business: a
    marker written since names its attempt's own copies, which come next in ``names``."""
    for name in names:
        started = early.pop(name, None) if early else None
        if started is not None:
            try:
                data = started.result()
            except (CkptStoreError, OSError):
                pass
            else:
                if ok(data):  # type: ignore[operator]
                    return name, data
                continue
        try:
            # Capped: a copy larger than ``size`` cannot match, and is passed over after at
            # most one ``STAT_FIRST_ABOVE`` read and a stat (a planted 1 GiB manifest).
            data = get_capped(store, name, size)
        except StoreNotFoundError:
            continue
        except CorruptCheckpointError:
            continue  # larger than the marker or manifest says: not the committed copy
        if ok(data):  # type: ignore[operator]
            return name, data
    return None


def open_committed(store: Store, retry: RetryConfig | None = None) -> Committed:
    """Open a committed checkpoint, or raise Incomplete/CorruptCheckpointError saying why.

    Every read is retried per ``retry`` (default ``RetryConfig()``) unless ``store`` is
    already a retrying view."""
    store = retrying(store, retry)
    if store.capabilities.zero_copy_parts:  # a volume: reads are syscalls, not round trips
        return _open(store, _read_marker(store), {})
    # Three small reads, each a round trip on an object store: the canonical manifest and
    # .metadata are read alongside the marker, and used only if they match it (a pool per
    # call: a module-level one would hang in a forked child).
    with ThreadPoolExecutor(2, thread_name_prefix="ckptstore-open") as pool:
        early = {
            name: pool.submit(get_capped, store, name, EARLY_READ_LIMIT)
            for name in (MANIFEST_NAME, METADATA_NAME)
        }
        return _open(store, _read_marker(store), early)


#: Manifests parsed lately, keyed by their exact bytes, oldest first: a manager's retention
#: opens every kept step after each save, and a parse costs ~0.85 ms for 228 ranges (~35 ms
#: for 10k). Only manifests up to ``_PARSED_MAX_SIZE`` bytes, at most ``_PARSED_COUNT``.
_PARSED: dict[bytes, Manifest] = {}
_PARSED_COUNT = 6
_PARSED_MAX_SIZE = 1 << 20


def _parse_manifest(data: bytes, where: str) -> Manifest:
    """``Manifest.from_bytes(data, where)``: a new object each call (callers may change
    it), parsed once for bytes seen lately. No lock (a forked child must not inherit a
    held one): each dict operation is atomic, and a lost race only parses again."""
    data = bytes(data)
    known = _PARSED.get(data)
    if known is None:
        known = Manifest.from_bytes(data, where)
        if len(data) <= _PARSED_MAX_SIZE:
            _PARSED[data] = known
            while len(_PARSED) > _PARSED_COUNT:
                try:
                    del _PARSED[next(iter(_PARSED))]
                except (KeyError, RuntimeError, StopIteration):  # another thread's change
                    break
    return replace(
        known,
        files=dict(known.files),
        ranges=list(known.ranges),
        extra=copy.deepcopy(known.extra),
    )


def _open(store: Store, marker: Marker, early: dict[str, Future[bytes]]) -> Committed:
    names = [MANIFEST_NAME] + ([attempt_manifest_name(marker.attempt)] if marker.attempt else [])
    found = _get_first(store, names, marker.matches, early, marker.manifest_size)
    if found is None:
        raise CorruptCheckpointError(
            f"{store.url}: the manifest does not match the checksum in {MARKER_NAME} (or is "
            "missing); the checkpoint is damaged. Restore the previous checkpoint."
        )
    manifest_name, manifest_bytes = found
    manifest = _parse_manifest(manifest_bytes, store.describe(MANIFEST_NAME))
    entry = manifest.files.get(METADATA_NAME)
    if entry is None or entry.size > MAX_METADATA_SIZE:
        raise CorruptCheckpointError(
            f"{store.url}: the manifest does not list {METADATA_NAME} (or at more than "
            f"{MAX_METADATA_SIZE} bytes); the checkpoint is damaged"
        )
    names = [METADATA_NAME] + ([attempt_metadata_name(marker.attempt)] if marker.attempt else [])

    def metadata_ok(data: bytes) -> bool:
        return len(data) == entry.size and crc32c(data) == entry.crc32c

    got = _get_first(store, names, metadata_ok, early, entry.size)
    if got is None:
        raise CorruptCheckpointError(
            f"{store.describe(METADATA_NAME)} is missing or does not match the manifest; the "
            "checkpoint is damaged. Restore the previous checkpoint."
        )
    metadata_name, metadata_bytes = got
    if manifest_name == MANIFEST_NAME and metadata_name != METADATA_NAME:
        if store.exists(METADATA_NAME):  # written after ours (ours goes before the manifest)
            raise CorruptCheckpointError(
                f"{store.describe(METADATA_NAME)} is not the one ckptstore committed: another "
                "writer (a stock dcp.save into this directory?) replaced it after the commit, "
                "so stock readers now load a different checkpoint than the manifest vouches "
                "for. The directory no longer holds one consistent checkpoint: restore the "
                "previous one, and give every save a directory of its own."
            )
    canonical = manifest_name == MANIFEST_NAME and metadata_name == METADATA_NAME
    return Committed(marker, manifest, metadata_bytes, manifest_bytes, canonical)


def committed_from_bytes(
    marker: Marker, manifest_bytes: bytes, metadata_bytes: bytes, where: str
) -> Committed:
    """A committed checkpoint rebuilt from what another process read of it (its marker,
    manifest and ``.metadata`` bytes), checked as ``open_committed`` checks them, without
    any store read: the marker must commit exactly these manifest bytes and the manifest
    must record exactly these ``.metadata`` bytes. Raises ``CorruptCheckpointError``
    naming ``where`` (the checkpoint's URL) otherwise. ``canonical`` is left True: the
    rebuilt copy is for reading, never for finishing a commit."""
    if not isinstance(marker, Marker) or not marker.matches(bytes(manifest_bytes)):
        raise CorruptCheckpointError(
            f"{where}: the manifest handed over does not match the checksum in its "
            f"{MARKER_NAME}; it was not verified, so it is not used. Restore the checkpoint "
            "again (or the previous one)."
        )
    manifest = _parse_manifest(bytes(manifest_bytes), f"{where}/{MANIFEST_NAME}")
    entry = manifest.files.get(METADATA_NAME)
    if entry is None:
        raise CorruptCheckpointError(f"{where}: the manifest does not list {METADATA_NAME}")
    if len(metadata_bytes) != entry.size or crc32c(metadata_bytes) != entry.crc32c:
        raise CorruptCheckpointError(
            f"{where}/{METADATA_NAME} handed over does not match the manifest; it was not "
            "verified, so it is not used. Restore the checkpoint again (or the previous one)."
        )
    return Committed(marker, manifest, bytes(metadata_bytes), bytes(manifest_bytes))


class CheckpointStatus(str, Enum):
    """What a step directory holds. A ``str``: comparisons with the plain names and JSON
    keep working. ``checkpoint_status`` returns the first three and ``NEWER``; the others
    are what the catalog and the CLI conclude from more than the marker."""

    COMMITTED = "committed"  # COMMITTED matches a manifest copy
    INCOMPLETE = "incomplete"  # no marker: a save that did not finish (or one in flight)
    CORRUPT = "corrupt"  # a marker that matches no manifest copy
    DAMAGED = "damaged"  # committed, but its files or .metadata do not match the manifest
    NEWER = "newer"  # committed by a newer ckptstore: a format this one cannot read
    STOCK = "stock"  # a stock DCP checkpoint: .metadata, no ckptstore manifest or marker
    UNKNOWN = "unknown"  # not looked at (a listing without statuses)

    def __str__(self) -> str:
        return self.value


def checkpoint_status(store: Store, retry: RetryConfig | None = None) -> CheckpointStatus:
    """``COMMITTED``, ``INCOMPLETE`` (no marker), ``CORRUPT`` (marker/manifest mismatch) or
    ``NEWER`` (a manifest format from a newer ckptstore: not damage, left alone)."""
    return committed_status(store, retry)[0]


def committed_status(
    store: Store, retry: RetryConfig | None = None
) -> tuple[CheckpointStatus, Committed | None]:
    """``checkpoint_status`` and, when ``COMMITTED``, the opened checkpoint. A symlinked
    marker or manifest (``UnsafePathError``) is ``CORRUPT``: left for inspection."""
    try:
        committed = open_committed(store, retry)
    except IncompleteCheckpointError:
        return CheckpointStatus.INCOMPLETE, None
    except CorruptCheckpointError:
        return CheckpointStatus.CORRUPT, None
    except NewerFormatError:
        return CheckpointStatus.NEWER, None
    return CheckpointStatus.COMMITTED, committed
