r"""Containment: names under a root are checked before any read, write or delete.

Every name a store is given (by a caller, or taken from a manifest, a marker, ``.metadata``
or a listing) is relative to the store's root and '/'-separated. :func:`check_name` accepts
only a normalised relative name that cannot leave the root::

    check_name("step_000000001/__0_0.distcp", root)   # fine
    check_name("../victim", root)                      # UnsafePathError naming both

Refused: absolute names (``/x``), ``..`` and ``.`` segments, empty segments (``a//b``),
NUL and other control characters, backslashes (``a\..\b`` is a traversal on Windows and
on some servers), and a name that is not a ``str``. A *prefix* (``find``, ``listdir``,
``child``...) may be empty (the root itself) and may end with one ``/``.

``Store`` applies it to every path-taking method of every store (see
``ckptstore.engine.store``), so a new store is contained without writing a line; the volume
store adds symlink checks of its own (a link is never followed below the root).

Pure functions; no I/O.
"""

from __future__ import annotations

import re

from ckptstore.errors import UnsafePathError

__all__ = ["check_name", "check_prefix", "is_safe_name"]

_BAD_CHARS = re.compile(r"[\x00-\x1f\x7f\\]")


def _problem(name: object, prefix: bool) -> str:
    """Why ``name`` is unsafe ('' when it is fine)."""
    if not isinstance(name, str):
        return f"a name must be a str, not {type(name).__name__}"
    if prefix and name.endswith("/"):
        name = name[:-1]
    if not name:
        return "" if prefix else "the name is empty"
    if _BAD_CHARS.search(name):
        return "it holds a NUL, control character or backslash"
    if name.startswith("/"):
        return "it is absolute"
    for seg in name.split("/"):
        if seg == "":
            return "it has an empty segment ('//' or a trailing '/')"
        if seg in (".", ".."):
            return f"it has a {seg!r} segment"
    return ""


def is_safe_name(name: object, prefix: bool = False) -> bool:
    """True if :func:`check_name` (``prefix=True``: :func:`check_prefix`) accepts ``name``."""
    return not _problem(name, prefix)


def check_name(name: str, root: str) -> str:
    """``name`` unchanged if it is a safe object name under ``root``; else UnsafePathError."""
    why = _problem(name, False)
    if why:
        raise UnsafePathError(
            f"refusing {name!r} under {root}: {why}. Names under a checkpoint root must be "
            "relative, normalised and stay inside it; the file or listing that named it is "
            "not trusted (nothing was read, written or deleted)."
        )
    return name


def check_prefix(prefix: str, root: str) -> str:
    """``prefix`` without its trailing '/' if it is safe ('' is the root); else UnsafePathError."""
    why = _problem(prefix, True)
    if why:
        raise UnsafePathError(
            f"refusing prefix {prefix!r} under {root}: {why}. Prefixes under a checkpoint root "
            "must be relative, normalised and stay inside it."
        )
    return prefix[:-1] if prefix.endswith("/") else prefix
