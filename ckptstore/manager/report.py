"""One line per committed save and per restore, on rank 0, where a user sees it.

A job that configures no logging sees nothing below WARNING (Python's last-resort handler),
so it would checkpoint silently. The manager reports each committed save and each restore
(step, tier, bytes, seconds) on the logger ``ckptstore.report`` at INFO, on rank 0 only:

- logging not configured (no handler on that logger, ``ckptstore`` or the root): the line
  goes to stderr as ``ckptstore: ...``;
- logging configured: the record goes to its handlers, like any other;
- quiet: ``logging.getLogger("ckptstore").setLevel(logging.WARNING)`` (or the same on
  ``ckptstore.report``): a level set there decides, as logging's levels always do.
"""

from __future__ import annotations

import logging
import sys

from ckptstore.redact import has_output_handlers, redact

__all__ = ["REPORT", "report"]

REPORT = logging.getLogger("ckptstore.report")

_stderr = logging.StreamHandler(sys.stderr)
_stderr.setFormatter(logging.Formatter("ckptstore: %(message)s"))


def _enabled() -> bool:
    """INFO by default; a level the user set on ``ckptstore.report`` or ``ckptstore`` wins."""
    for logger in (REPORT, logging.getLogger("ckptstore")):
        if logger.level != logging.NOTSET:
            return logger.isEnabledFor(logging.INFO)
    return not logging.getLogger().manager.disable >= logging.INFO


def report(message: str, *args: object) -> None:
    """Report ``message % args`` at INFO (see the module docstring); the caller is rank 0."""
    if not _enabled():
        return
    record = REPORT.makeRecord(REPORT.name, logging.INFO, "(report)", 0, message, args, None)
    if has_output_handlers(REPORT):
        REPORT.handle(record)  # logging configured: its handlers (and filters) decide
    else:
        record.msg, record.args = redact(record.getMessage()), None
        _stderr.handle(record)
