"""The folder index of an uploaded checkpoint folder, read back as untrusted bytes.

``FolderCheckpoints.save`` stores, with each folder, a JSON index::

    {"format": "ckptstore.folder", "version": 1,
     "name": "checkpoint-500",            # the folder's own name; ends with the step
     "path": "/abs/out/checkpoint-500",   # where it was saved from (absolute, normalised)
     "files": {"<rel/name>": {"size": <int>, "crc32c": <int>}, ...},
     "extra": {...}}

Whoever can write the root can write an index, so a restore trusts none of it (SECURITY.md,
trust rule 1): ``parse_index`` caps its size, checks every field's type, accepts only file
names a ``Store`` accepts (``ckptstore.stores.is_safe_name``; no file inside another) and
a folder name that is one plain segment ending in the step, else ``CorruptCheckpointError``
(the restore falls back to the previous step). A local path taken from an index is kept
below a directory the user configured by ``_local.name_below``, and resolved from that
directory's descriptor. Pure functions.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ckptstore.errors import CorruptCheckpointError
from ckptstore.stores import is_safe_name

__all__ = ["INDEX_FORMAT", "INDEX_MAX", "bad_index", "parse_index", "trailing_int"]

INDEX_FORMAT = "ckptstore.folder"
#: The largest index read back (about 100 bytes a file: a million files fit).
INDEX_MAX = 128 * 1024 * 1024
_SIZE_MAX = 1 << 50  # a file larger than a PiB is not one a framework wrote


def trailing_int(name: str) -> int | None:
    """The number a name ends with (``checkpoint-500`` -> 500, ``step_7`` -> 7), if any."""
    digits = ""
    for ch in reversed(os.path.basename(name.rstrip("/"))):
        if not ch.isdigit():
            break
        digits = ch + digits
    return int(digits) if digits else None


def bad_index(step: int, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"the folder index of step {step} is not valid: {why}; the step is skipped (nothing "
        "was written or moved for it) and a restore falls back to the previous one"
    )


def _whole(v: object, top: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= top


def parse_index(data: bytes, step: int) -> dict[str, Any]:
    """The folder index in ``data`` for ``step``, checked field by field (module docstring).

    Raises ``CorruptCheckpointError`` for anything ``FolderCheckpoints.save`` cannot write.
    """
    if len(data) > INDEX_MAX:
        raise bad_index(step, f"{len(data)} bytes, over {INDEX_MAX}")
    try:
        index = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise bad_index(step, "not JSON") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
        raise bad_index(step, f"not a {INDEX_FORMAT!r} document")
    if index.get("version") != 1 or isinstance(index.get("version"), bool):
        raise bad_index(step, f"version {index.get('version')!r}, this ckptstore reads 1")
    name, path, files = index.get("name"), index.get("path"), index.get("files")
    if not (isinstance(name, str) and is_safe_name(name)) or "/" in name or name[0] == ".":
        raise bad_index(step, f"folder name {name!r} is not one plain path segment")
    if trailing_int(name) != step:
        raise bad_index(step, f"folder name {name!r} does not end with the step")
    if not (
        isinstance(path, str)
        and os.path.isabs(path)
        and os.path.normpath(path) == path
        and os.path.basename(path) == name
    ):
        raise bad_index(step, f"path {path!r} is not an absolute, normalised path to {name!r}")
    if not isinstance(index.get("extra", {}), dict) or not isinstance(files, dict):
        raise bad_index(step, "'files' or 'extra' is not an object")
    for rel, want in files.items():
        if not is_safe_name(rel):
            raise bad_index(step, f"file name {rel!r} would leave the folder")
        if not (
            isinstance(want, dict)
            and _whole(want.get("size"), _SIZE_MAX)
            and _whole(want.get("crc32c"), 0xFFFFFFFF)
        ):
            raise bad_index(step, f"file {rel!r} has no whole size and crc32c")
        parts = rel.split("/")
        for i in range(1, len(parts)):
            if "/".join(parts[:i]) in files:
                raise bad_index(step, f"{rel!r} is inside {'/'.join(parts[:i])!r}, a file")
    return index
