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

:func:`check_local_tier_dir` refuses a local tier directory that overlaps the root.
Pure functions; no I/O but ``os.path`` arithmetic.
"""

from __future__ import annotations

import os
import re

from ckptstore.errors import ConfigError, UnsafePathError

__all__ = ["check_name", "check_prefix", "is_safe_name", "check_local_tier_dir"]

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


def _local_path(url: str) -> str | None:
    scheme, sep, rest = url.partition("://")
    if sep and scheme.lower() in ("file", "local"):
        url = rest
    elif sep:
        return None  # an object store: it cannot overlap a local directory
    return os.path.realpath(os.path.abspath(os.path.expanduser(url)))


def _inside(child: str, parent: str) -> bool:
    return child == parent or child.startswith(parent.rstrip(os.sep) + os.sep)


def check_local_tier_dir(root_url: str, local_tier_dir: str | None) -> None:
    """ConfigError if the local ``local_tier_dir`` is, is inside, or holds the root ``root_url``.

    The local tier trims its own old copies; sharing a directory with the root would let
    it delete committed checkpoints (and retention would count the staged copies).
    """
    if not local_tier_dir:
        return
    root, staging = _local_path(root_url), _local_path(local_tier_dir)
    if root is None or staging is None:
        return
    if root == staging:
        why = "is the checkpoint root itself"
    elif _inside(staging, root):
        why = f"is inside the checkpoint root {root_url}"
    elif _inside(root, staging):
        why = f"holds the checkpoint root {root_url}"
    else:
        return
    raise ConfigError(
        f"local_tier_dir {local_tier_dir!r} {why}; the node-local tier must be a directory of its "
        "own (e.g. node-local NVMe such as /local_nvme/ckpt), outside the root and not "
        "above it."
    )
