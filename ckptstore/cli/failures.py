"""What ``ckptstore-tool`` prints for a failure, and with which exit code: never a traceback.

``explain(exc, urls, options_given)`` turns any exception a command raised into
``(exit code, one-line message)``:

* a ``CorruptCheckpointError`` -> 1 (damage found); any other ``CkptStoreError`` -> 2;
* an ``OSError`` that no ckptstore layer explained (a host that does not resolve, a refused
  connection, a permission error) -> 2, naming the command's URLs;
* an error raised inside a store client while ``-o`` options were given (an unknown option
  name, a value of the wrong type) -> 2, naming the options;
* DCP's ``CheckpointException`` is unwrapped to the first rank's error first;
* anything else is a bug -> 3, one line with the exception and "please report"; setting
  ``CKPTSTORE_TOOL_TRACEBACK=1`` prints the traceback as well.

Library messages speak of the Python API (``storage_options``, ``overwrite=True``); on the
command line the same advice names the flags (``-o key=...``, ``--force``): ``cli_wording``.
"""

from __future__ import annotations

import errno
import os
import re
import socket
import traceback
from collections.abc import Sequence

from ckptstore.errors import CkptStoreError, CorruptCheckpointError

__all__ = [
    "EXIT_OK",
    "EXIT_CHECK_FAILED",
    "EXIT_USAGE",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "TRACEBACK_ENV",
    "REPORT_HINT",
    "cli_wording",
    "explain",
    "first_failure",
]

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130

_NETWORK_ERRNOS = {
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ETIMEDOUT,
}

TRACEBACK_ENV = "CKPTSTORE_TOOL_TRACEBACK"
REPORT_HINT = (
    "this is a bug in ckptstore-tool: please report it with the command line "
    f"(run it again with {TRACEBACK_ENV}=1 to print the traceback)"
)

#: Python-API advice in library messages -> the same advice in ckptstore-tool's flags.
_WORDING: tuple[tuple[str, str], ...] = (
    ("key/secret/token in storage_options", "-o key=... -o secret=... (-o token=...)"),
    ("pass key/secret in storage_options", "pass -o key=... -o secret=..."),
    ("check endpoint_url in storage_options", "check -o endpoint_url=..."),
    ("the endpoint in storage_options", "the endpoint (-o endpoint_url=...)"),
    ("storage_options['token']", "-o token=..."),
    (
        "Azure storage_options need 'connection_string' or 'account_name' (plus account_key, "
        "sas_token or credential)",
        "Azure needs -o connection_string=... or -o account_name=... (plus -o account_key=..., "
        "-o sas_token=... or -o credential=...)",
    ),
    ("credential in storage_options", "credential (-o account_key=... / -o sas_token=...)"),
    ("Check the URL (and storage_options)", "Check the URL (and the -o storage options)"),
    (" (overwrite=True from Python)", ""),
    ("pass overwrite=True to replace it", "pass --force to replace it"),
)


def cli_wording(message: str) -> str:
    """``message`` on one line, with Python-API advice replaced by ckptstore-tool's flags."""
    for python, cli in _WORDING:
        message = message.replace(python, cli)
    message = message.replace("storage_options", "-o KEY=VALUE storage options")
    return re.sub(r"\s*\n\s*", " ", message.strip())


def first_failure(exc: BaseException) -> BaseException:
    """DCP's ``CheckpointException`` (``failures``: rank -> error) -> the first rank's error."""
    failures = getattr(exc, "failures", None)
    if not isinstance(failures, dict) or not failures:
        return exc
    inner = failures[sorted(failures)[0]]
    inner = inner[0] if isinstance(inner, tuple) else inner
    return inner if isinstance(inner, BaseException) else exc


def _where(urls: Sequence[str]) -> str:
    return " / ".join(urls) if urls else "the store"


def _os_error(exc: OSError, urls: Sequence[str]) -> str:
    where = _where(urls)
    if isinstance(exc, socket.gaierror):
        return (
            f"cannot reach {where}: its host name does not resolve ({exc}). Check the host in "
            "the URL (and -o endpoint_url=... for object stores)."
        )
    if (
        isinstance(exc, (ConnectionError, TimeoutError, socket.timeout))
        or exc.errno in _NETWORK_ERRNOS
        or "connect" in str(exc).lower()
    ):
        return (
            f"cannot reach {where} ({exc}). Check the URL's host and port (and "
            "-o endpoint_url=... for object stores), and that the server is up and reachable "
            "from this machine."
        )
    what = f" ({exc.filename})" if exc.filename else ""
    if isinstance(exc, (IsADirectoryError, NotADirectoryError)):
        return (
            f"{where}{what}: a name that should be a file is a folder, or the reverse "
            f"({exc.strerror or exc}): the checkpoint is damaged or this is not one. "
            "`ckptstore-tool ls ROOT` lists the checkpoints of a root."
        )
    return (
        f"{where}{what}: {exc.strerror or exc}. Check the path or URL and its permissions "
        "(and the -o storage options for object stores)."
    )


def _from_store_layer(exc: BaseException) -> bool:
    """Whether ``exc`` came out of a store (``ckptstore/stores/``) or the client it calls:
    the innermost ckptstore frame of its traceback is in the stores layer."""
    frames = traceback.extract_tb(exc.__traceback__)
    ours = [f for f in frames if f"{os.sep}ckptstore{os.sep}" in f.filename]
    return bool(ours) and f"{os.sep}ckptstore{os.sep}stores{os.sep}" in ours[-1].filename


def explain(
    exc: BaseException, urls: Sequence[str], options_given: Sequence[str] = ()
) -> tuple[int, str]:
    """``(exit code, one-line message)`` for ``exc`` raised by a command on ``urls``."""
    exc = first_failure(exc)
    if isinstance(exc, CorruptCheckpointError):
        return EXIT_CHECK_FAILED, cli_wording(str(exc))
    if isinstance(exc, CkptStoreError):
        return EXIT_USAGE, cli_wording(str(exc))
    what = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    if isinstance(exc, (TypeError, ValueError, AttributeError, KeyError)) and options_given:
        if _from_store_layer(exc):
            shown = " ".join(f"-o {o}" for o in options_given)
            return EXIT_USAGE, cli_wording(
                f"{_where(urls)}: the store client rejected the storage options ({what}). "
                f"Check the names and values of {shown}: they go to the URL's filesystem "
                "(s3fs, gcsfs, adlfs) as its options."
            )
    if isinstance(exc, OSError):
        return EXIT_USAGE, cli_wording(_os_error(exc, urls))
    return EXIT_INTERNAL, cli_wording(f"internal error ({what}); {REPORT_HINT}")
