"""Reads of small control files (marker, manifest, ``.metadata``) with a size cap.

A control file's size is whatever its writer (or an attacker with write access to the
root) made it, so it is never read whole on trust. ``get_capped`` checks twice: first the
size the store reports (``Store.size``; for a cap above ``STAT_FIRST_ABOVE``), so a file
over its cap is refused without a byte read; then the read itself asks for at most
``limit + 1`` bytes and refuses more (the file may have grown in between). A 1 GiB marker,
lease or manifest costs a stat (or ``limit`` bytes), not the file. Every control file is
read through it: marker, manifest (capped by its marker's ``manifest_size``), lease, root
owner, ``.metadata``, the local tier's job stamp (``engine.tier_jobs``).
"""

from __future__ import annotations

from ckptstore.engine.manifest import MAX_MANIFEST_SIZE, MAX_MARKER_SIZE
from ckptstore.engine.store import Store
from ckptstore.errors import CorruptCheckpointError

__all__ = [
    "MAX_MARKER_SIZE",
    "MAX_MANIFEST_SIZE",
    "MAX_METADATA_SIZE",
    "EARLY_READ_LIMIT",
    "STAT_FIRST_ABOVE",
    "get_capped",
    "too_big",
]

#: A ``.metadata`` no manifest vouches for (a stock checkpoint's): as large as a manifest.
MAX_METADATA_SIZE = 1 << 30
#: What a read made before the marker is known may fetch (a real manifest or .metadata of
#: a few thousand items is far smaller); a bigger file is read again once its size is known.
EARLY_READ_LIMIT = 16 << 20
#: Caps up to this are enforced by the capped read alone: reading ``limit + 1`` bytes is
#: itself a bounded cost, and a stat first would add a round trip on object stores.
STAT_FIRST_ABOVE = 1 << 20


#: What ``get_capped`` tells a user to do about a checkpoint's oversized control file.
RESTORE_PREVIOUS = "The checkpoint is damaged: restore the previous one."


def get_capped(store: Store, path: str, limit: int, advice: str = RESTORE_PREVIOUS) -> bytes:
    """The whole of ``path``, read as at most ``limit + 1`` bytes; ``CorruptCheckpointError``
    (ending with ``advice``) if it is bigger than ``limit`` by the size the store reports
    (nothing is read) or by what the read returned (``StoreNotFoundError`` if it does not
    exist)."""
    if limit > STAT_FIRST_ABOVE and store.size(path) > limit:
        raise too_big(store, path, limit, advice)
    data = store.get(path, 0, limit + 1)
    if len(data) > limit:
        raise too_big(store, path, limit, advice)
    return data


def too_big(store: Store, path: str, limit: int, advice: str = RESTORE_PREVIOUS) -> Exception:
    """The refusal of ``path``, larger than the ``limit`` bytes such a file can be."""
    return CorruptCheckpointError(
        f"{store.describe(path)} is larger than the {limit} bytes such a file can be; "
        f"it was not read. {advice}".rstrip()
    )
