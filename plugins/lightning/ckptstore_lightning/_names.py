"""Lightning checkpoint names as ckptstore pointers: the format, and the path rules.

The file a Lightning ``ModelCheckpoint`` names (``epoch=0-step=500.ckpt``, ``last.ckpt``)
holds a small JSON pointer to a committed ckptstore step instead of a ``torch.save``
file::

    {"format": "ckptstore.lightning-pointer", "version": 1,
     "root": "." | "<root URL>", "step": 500, "follow": "step" | "newest"}

``root`` is ``"."`` when the steps live in the pointer's own directory, so the directory
can move. ``follow == "newest"`` (a "last" name) means the newest committed step under
the root, whatever ``step`` says. Pure functions; ``CkptStoreIO`` does the I/O.

A pointer is read back from storage, so it is untrusted (SECURITY.md, trust rule 1):
``parse_pointer`` accepts only the exact schema above (a file that does not start like
JSON is a stock Lightning ``.ckpt`` and not ours), and ``confine`` refuses a pointer
whose root is neither its own directory nor the configured root, so a planted name can
never steer a load or a prune into another run.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from ckptstore import Store
from ckptstore.errors import CorruptCheckpointError, UnsafePathError
from ckptstore.stores import split_url

__all__ = [
    "POINTER_FORMAT",
    "POINTER_MAX",
    "Pointer",
    "norm",
    "split",
    "is_last_name",
    "looks_like_pointer",
    "parse_pointer",
    "read_pointer",
    "confine",
    "pointer_bytes",
]

#: The ``format`` field of a pointer file.
POINTER_FORMAT = "ckptstore.lightning-pointer"
#: A larger file is never a pointer (a stock ``.ckpt``): it is not read.
POINTER_MAX = 64 * 1024
#: The largest step a pointer may name (``ckptstore.step_name``'s range).
_STEP_MAX = 999_999_999
_FOLLOW = {"step": False, "newest": True}
_KEYS = {"format", "version", "root", "step", "follow"}
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


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
    from lightning.pytorch.callbacks import ModelCheckpoint  # only CkptStoreIO needs lightning

    name = os.path.basename(str(path))
    stem, ext = os.path.splitext(name)
    return ext == ModelCheckpoint.FILE_EXTENSION and stem.startswith(
        ModelCheckpoint.CHECKPOINT_NAME_LAST
    )


def looks_like_pointer(head: bytes) -> bool:
    """Whether a file starting with ``head`` claims to be a pointer (JSON: ``{`` or ``[``).

    A stock ``torch.save`` file starts with a zip or pickle header, never with either.
    """
    return head.lstrip(b" \t\r\n")[:1] in (b"{", b"[")


def _corrupt(parent: str, why: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"a checkpoint name in {parent} is not a valid ckptstore pointer: {why}. It was not "
        "followed (nothing was loaded or deleted through it); remove that file, or load a "
        "step URL or the root itself"
    )


def parse_pointer(data: bytes, parent: str) -> Pointer | None:
    """The pointer in ``data`` (a file in directory ``parent``); None if it is not one.

    Not one: a file that does not start like JSON (a stock Lightning ``.ckpt``). Anything
    else that is not exactly a pointer (not JSON, another format, a missing or mistyped
    field, a step out of range, a root that is not a plain URL or path) raises
    ``CorruptCheckpointError``.
    """
    if not looks_like_pointer(data[:64]):
        return None
    if len(data) > POINTER_MAX:
        raise _corrupt(parent, f"{len(data)} bytes, more than a pointer's {POINTER_MAX}")
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise _corrupt(parent, "not JSON") from None
    if not isinstance(doc, dict) or doc.get("format") != POINTER_FORMAT:
        raise _corrupt(parent, f"not a {POINTER_FORMAT!r} document")
    if set(doc) != _KEYS:
        raise _corrupt(parent, f"fields {sorted(map(str, doc))}, expected {sorted(_KEYS)}")
    version, root, step, follow = doc["version"], doc["root"], doc["step"], doc["follow"]
    if version != 1 or isinstance(version, bool):
        raise _corrupt(parent, f"version {version!r}, this ckptstore reads version 1")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _STEP_MAX:
        raise _corrupt(parent, f"step {step!r} is not a whole number in [0, {_STEP_MAX}]")
    if not isinstance(follow, str) or follow not in _FOLLOW:
        raise _corrupt(parent, f"follow {follow!r} is neither 'step' nor 'newest'")
    if not isinstance(root, str) or not root or len(root) > 4096 or _CONTROL.search(root):
        raise _corrupt(parent, f"root {root!r} is not a plain URL or path")
    return Pointer(parent if root == "." else norm(root), step, _FOLLOW[follow])


def read_pointer(store: Store, name: str, parent: str) -> Pointer | None:
    """The pointer file ``name`` of ``store`` (directory ``parent``), parsed; None if absent,
    a directory or a stock ``.ckpt``. The size is checked before anything is read; a link
    is never followed (the store refuses it: ``UnsafePathError``)."""
    try:
        if not store.exists(name):
            return None
        if store.size(name) > POINTER_MAX:  # a stock .ckpt, unless it claims otherwise
            if looks_like_pointer(store.get(name, 0, 64)):
                raise _corrupt(parent, f"{name!r} starts like one but is over {POINTER_MAX} B")
            return None
        data = store.get(name, 0, POINTER_MAX + 1)
    except OSError:  # a directory, unreadable: not ours
        return None
    return parse_pointer(data, parent)


def confine(ptr: Pointer, parent: str, home: str | None) -> Pointer:
    """``ptr`` if its root is its own directory ``parent`` or the configured root ``home``.

    Otherwise ``UnsafePathError`` (a ``CorruptCheckpointError``): a name must never steer a
    load or a prune into a root the user did not give.
    """
    if ptr.root == parent or (home is not None and ptr.root == norm(home)):
        return ptr
    raise UnsafePathError(
        f"the checkpoint name in {parent} points into {ptr.root}, which is neither its own "
        f"directory nor the configured root ({home or 'none'}); it was not followed and "
        "nothing under that root was loaded or deleted. Load that run with "
        "CkptStoreIO(root=<its root>), or remove the name"
    )


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
