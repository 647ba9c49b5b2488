"""Reads of small control files (marker, manifest, ``.metadata``) with a size cap.

A control file's size is whatever its writer (or an attacker with write access to the
root) made it, so it is never read whole on trust. ``get_capped`` first reads at most
``STAT_FIRST_ABOVE`` bytes (plus one): a real control file is smaller, so that one read
is the whole cost (one round trip on an object store). Only a file larger than that gets
a size check (``Store.size``), so one over its cap is refused after that first read;
then the rest is read as at most ``limit + 1`` bytes in all, and more is refused (the
file may have grown in between). A 1 GiB marker, lease or manifest costs at most 1 MiB
and a stat, not the file. Every control file is
read through it: marker, manifest (capped by its marker's ``manifest_size``), lease, root
owner, ``.metadata``, the local tier's job stamp (``tier.jobs``).
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
#: What a capped read fetches before it asks the store for the size: a real control file
#: is smaller, so it costs one read (a stat first would add a round trip on object stores).
STAT_FIRST_ABOVE = 1 << 20


#: What ``get_capped`` tells a user to do about a checkpoint's oversized control file.
RESTORE_PREVIOUS = "The checkpoint is damaged: restore the previous one."


def get_capped(store: Store, path: str, limit: int, advice: str = RESTORE_PREVIOUS) -> bytes:
    """The whole of ``path``, read as at most ``limit + 1`` bytes; ``CorruptCheckpointError``
    (ending with ``advice``) if it is bigger than ``limit`` by what a read returned or, past
    the first ``STAT_FIRST_ABOVE`` bytes, by the size the store reports
    (``StoreNotFoundError`` if it does not exist)."""
    head = min(limit, STAT_FIRST_ABOVE)
    data = store.get(path, 0, head + 1)
    if len(data) <= head:
        return data  # the whole file, in one read
    if limit == head or store.size(path) > limit:
        raise too_big(store, path, limit, advice)
    data += store.get(path, len(data), limit + 1)
    if len(data) > limit:
        raise too_big(store, path, limit, advice)
    return data


def too_big(store: Store, path: str, limit: int, advice: str = RESTORE_PREVIOUS) -> Exception:
    """The refusal of ``path``, larger than the ``limit`` bytes such a file can be."""
    return CorruptCheckpointError(
        f"{store.describe(path)} is larger than the {limit} bytes such a file can be; "
        f"it was not read whole. {advice}".rstrip()
    )
