"""Lightning checkpoint names as ckptstore pointers: the format, and the path rules.

The file a Lightning ``ModelCheckpoint`` names (``epoch=0-step=500.ckpt``, ``last.ckpt``)
holds a small JSON pointer to a committed ckptstore step instead of a ``torch.save``
file::

    {"format": "ckptstore.lightning-pointer", "version": 1,
     "root": "." | "<root URL>", "step": 500, "follow": "step" | "newest"}

``root`` is ``"."`` when the steps live in the pointer's own directory, so the directory
can move. ``follow == "newest"`` (a "last" name) means the newest committed step under
the root, whatever ``step`` says. Pure functions; ``CkptStoreIO`` does the I/O.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from lightning.pytorch.callbacks import ModelCheckpoint

from ckptstore.stores import split_url

__all__ = [
    "POINTER_FORMAT",
    "POINTER_MAX",
    "Pointer",
    "norm",
    "split",
    "is_last_name",
    "parse_pointer",
    "pointer_bytes",
]

#: The ``format`` field of a pointer file.
POINTER_FORMAT = "ckptstore.lightning-pointer"
#: A larger file is never a pointer (a stock ``.ckpt``): it is not read.
POINTER_MAX = 64 * 1024


@dataclass(frozen=True)
class Pointer:
    root: str  # normalised root URL
    step: int
    newest: bool  # a "last" name: means the newest committed step under root


def norm(url: str) -> str:
    """``url`` normalised: an absolute path for local paths, no trailing '/' otherwise."""
    scheme, rest = split_url(url)
    if scheme in ("file", "local"):
        return os.path.abspath(os.path.expanduser(rest))
    return url.rstrip("/")


def split(url: str) -> tuple[str, str]:
    """(directory URL, name) of a file URL or path."""
    url = norm(url)
    if "://" in url:
        parent, _, name = url.rpartition("/")
        return parent, name
    return os.path.split(url)


def is_last_name(path: str) -> bool:
    """Whether ``ModelCheckpoint`` treats ``path`` as a "last" checkpoint (its own rule)."""
    name = os.path.basename(str(path))
    stem, ext = os.path.splitext(name)
    return ext == ModelCheckpoint.FILE_EXTENSION and stem.startswith(
        ModelCheckpoint.CHECKPOINT_NAME_LAST
    )


def parse_pointer(data: bytes, parent: str) -> Pointer | None:
    """The pointer in ``data`` (a file in directory ``parent``), or None if it is not one."""
    try:
        doc = json.loads(data)
    except ValueError:  # a binary .ckpt: not ours
        return None
    if not isinstance(doc, dict) or doc.get("format") != POINTER_FORMAT:
        return None
    root = parent if doc["root"] == "." else str(doc["root"])
    return Pointer(root, int(doc["step"]), doc.get("follow") == "newest")


def pointer_bytes(ptr: Pointer, parent: str) -> bytes:
    """The file that says ``ptr``, to be written in directory ``parent``."""
    body = {
        "format": POINTER_FORMAT,
        "version": 1,
        "root": "." if ptr.root == parent else ptr.root,
        "step": ptr.step,
        "follow": "newest" if ptr.newest else "step",
    }
    return json.dumps(body).encode()
