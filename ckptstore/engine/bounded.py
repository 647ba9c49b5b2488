"""Reads of small control files (marker, manifest, ``.metadata``) with a size cap.

A control file's size is whatever its writer (or an attacker with write access to the
root) made it, so it is never read whole on trust: ``get_capped`` asks the store for at
most ``limit + 1`` bytes and refuses more (``CorruptCheckpointError``), so a 1 GiB marker
or a manifest many times the size its marker commits costs ``limit`` bytes, not the file.
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
    "get_capped",
]

#: A ``.metadata`` no manifest vouches for (a stock checkpoint's): as large as a manifest.
MAX_METADATA_SIZE = 1 << 30
#: What a read made before the marker is known may fetch (a real manifest or .metadata of
#: a few thousand items is far smaller); a bigger file is read again once its size is known.
EARLY_READ_LIMIT = 16 << 20


#: What ``get_capped`` tells a user to do about a checkpoint's oversized control file.
RESTORE_PREVIOUS = "The checkpoint is damaged: restore the previous one."


def get_capped(store: Store, path: str, limit: int, advice: str = RESTORE_PREVIOUS) -> bytes:
    """The whole of ``path``, read as at most ``limit + 1`` bytes; ``CorruptCheckpointError``
    (ending with ``advice``) if it is bigger than ``limit`` (``StoreNotFoundError`` if it
    does not exist)."""
    data = store.get(path, 0, limit + 1)
    if len(data) > limit:
        raise CorruptCheckpointError(
            f"{store.describe(path)} is larger than the {limit} bytes such a file can be; "
            f"it was not read. {advice}".rstrip()
        )
    return data
