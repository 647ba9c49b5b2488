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

``Store.__init_subclass__`` calls :func:`guard_class` on every subclass, so the first
argument of each path-taking method (an object name, a prefix, a ``Multipart``, an
iterable of names, or of ``(name, data)`` items) is checked before the store's own code
runs: nothing unsafe is read, written or deleted, and a new store is contained without
writing a line, including methods it takes from a mixin. The volume store resolves every
path from the root's descriptor besides (a link is never followed below the root).

No I/O.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Any

from ckptstore.errors import UnsafePathError

__all__ = [
    "check_name",
    "check_prefix",
    "is_safe_name",
    "guard_class",
    "NAME_METHODS",
    "PREFIX_METHODS",
    "UPLOAD_METHODS",
]

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


# -- the guard every store gets ----------------------------------------------------------
#: Store methods whose first argument is an object name / a prefix / a Multipart.
NAME_METHODS = ("put", "put_if_absent", "get", "get_into", "size", "exists", "delete")
NAME_METHODS_MP = ("begin_multipart",)
PREFIX_METHODS = (
    "child",
    "find",
    "listdir",
    "scan",
    "delete_prefix",
    "list_multipart",
    "remove_empty_dirs",
)
UPLOAD_METHODS = ("put_part", "put_part_buffers", "complete_multipart", "abort_multipart")


def _guarded(fn: Callable[..., Any], kind: str) -> Callable[..., Any]:
    """``fn`` with its first argument checked by ``ckptstore.engine.paths``."""
    if getattr(fn, "_ckptstore_guarded", False):
        return fn

    if kind == "name":

        @functools.wraps(fn)
        def wrapper(self: Any, path: str, *args: Any, **kwargs: Any) -> Any:
            return fn(self, check_name(path, self.url), *args, **kwargs)

    elif kind == "prefix":

        @functools.wraps(fn)
        def wrapper(self: Any, prefix: str = "", *args: Any, **kwargs: Any) -> Any:
            return fn(self, check_prefix(prefix, self.url), *args, **kwargs)

    elif kind == "names":

        @functools.wraps(fn)
        def wrapper(self: Any, paths: Iterable[str], *args: Any, **kwargs: Any) -> Any:
            return fn(self, [check_name(p, self.url) for p in paths], *args, **kwargs)

    elif kind == "pair":  # copy(src, dst): both are names

        @functools.wraps(fn)
        def wrapper(self: Any, src: str, dst: str, *args: Any, **kwargs: Any) -> Any:
            return fn(self, check_name(src, self.url), check_name(dst, self.url), *args, **kwargs)

    elif kind == "items":

        @functools.wraps(fn)
        def wrapper(self: Any, items: Iterable[Any], *args: Any, **kwargs: Any) -> Any:
            checked = [(check_name(p, self.url), data) for p, data in items]
            return fn(self, checked, *args, **kwargs)

    else:

        @functools.wraps(fn)
        def wrapper(self: Any, upload: Any, *args: Any, **kwargs: Any) -> Any:
            check_name(upload.path, self.url)
            return fn(self, upload, *args, **kwargs)

    wrapper._ckptstore_guarded = True  # type: ignore[attr-defined]
    return wrapper


def guard_class(cls: type) -> None:
    """Wrap every path-taking method of ``cls`` not wrapped yet: its own, and ones it
    inherits from a class that is not a store (a mixin), found along the MRO."""
    groups = (
        (NAME_METHODS + NAME_METHODS_MP, "name"),
        (PREFIX_METHODS, "prefix"),
        (UPLOAD_METHODS, "upload"),
        (("delete_many",), "names"),
        (("put_many",), "items"),
        (("copy",), "pair"),
    )
    for names, kind in groups:
        for name in names:
            fn = next((k.__dict__[name] for k in cls.__mro__ if name in k.__dict__), None)
            if callable(fn) and not getattr(fn, "_ckptstore_guarded", False):
                setattr(cls, name, _guarded(fn, kind))
