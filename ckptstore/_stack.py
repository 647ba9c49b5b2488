"""The ``stacklevel`` that makes a warning name the user's line, not ckptstore's own.

A warning raised deep inside ckptstore (a reader opened by ``ckptstore.load``, by DCP's
``set_up_storage_reader``, or by the user directly) sits at a different depth on each
path; a fixed ``stacklevel`` names the wrong line on all but one. This walks the stack and
counts the frames of ckptstore's and torch's own modules, by module name (never by file
path: a checkout folder may well be called ``ckptstore``). ``warnings.warn`` gained
``skip_file_prefixes`` in Python 3.12 only, and it matches paths.
"""

from __future__ import annotations

import sys

__all__ = ["user_stacklevel"]

_INTERNAL = ("ckptstore", "torch")


def user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` made by this function's caller that names
    the first frame outside ckptstore and torch (the caller's own frame if none is)."""
    frame = sys._getframe(1)  # the caller, which calls warnings.warn: stacklevel 1
    level = 1
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.partition(".")[0] not in _INTERNAL:
            return level
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return 1
