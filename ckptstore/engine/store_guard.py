"""Containment for every store: each path-taking method is checked before it runs.

``Store.__init_subclass__`` calls :func:`guard_class` on every subclass, so the first
argument of each method named below (an object name, a prefix, a ``Multipart``, an
iterable of names, or of ``(name, data)`` items) goes through ``ckptstore.engine.paths``
before the store's own code: an absolute name, a ``..`` segment, NUL or backslash
raises ``UnsafePathError`` and nothing is read, written or deleted. A new store is
contained without writing a line, including methods it takes from a mixin.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from ckptstore.engine.paths import check_name, check_prefix

__all__ = ["guard_class", "NAME_METHODS", "PREFIX_METHODS", "UPLOAD_METHODS"]

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
