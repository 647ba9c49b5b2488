"""What ``ckptstore-tool`` prints for a failure, and with which exit code: never a traceback.

``explain(exc, urls, options_given)`` turns any exception a command raised into
``(exit code, one-line message)``: 1 for damage found, 2 for what the user can fix (a
ckptstore error, a network or permission error, a store client's refusal, a missing
package), 3 for a bug (``CKPTSTORE_TOOL_TRACEBACK=1`` prints its traceback too); the cases
are :func:`explain`'s docstring. Every message is redacted (``ckptstore.redact``) before it
is printed. Library messages speak of the Python API (``storage_options``,
``overwrite=True``); on the command line the same advice names the flags (``-o key=...``,
``--force``): ``cli_wording``.
"""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Sequence

from ckptstore.errors import CkptStoreError, CorruptCheckpointError
from ckptstore.redact import redact
from ckptstore.stores import raised_in, rejected_by_client

__all__ = [
    "CLIENT_PACKAGES",
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


#: Top-level packages of store clients: an exception of a type defined in one of them is
#: the store's or its client's (a request refused, a connection lost), not a bug here.
CLIENT_PACKAGES = frozenset(
    {
        "aiobotocore", "aiohttp", "adlfs", "azure", "botocore", "boto3", "dropbox",
        "dropboxdrivefs", "fsspec", "gcsfs", "google", "h11", "httpcore", "httpx",
        "huggingface_hub", "msal", "ocifs", "ossfs", "paramiko", "requests",
        "s3fs", "smbclient", "smbprotocol", "sshfs", "urllib3", "webdav4",
    }
)  # fmt: skip


def _package(module: str | None) -> str:
    return (module or "").partition(".")[0]


def _from_store_client(exc: BaseException) -> bool:
    """Whether ``exc`` is a store client's: its type is a client package's, or a
    third-party module raised it below a frame of ckptstore's stores layer."""
    if _package(type(exc).__module__) in CLIENT_PACKAGES:
        return True
    ours, innermost = raised_in(exc)
    return (
        ours is not None
        and ours.startswith("ckptstore.stores")
        and _package(innermost) not in ("ckptstore", "")
    )


def _own_cause(exc: BaseException) -> BaseException:
    """DCP's ``CheckpointException`` -> the first rank's error; an exception raised
    ``from`` a ckptstore error (a library wrapping ours) -> that error."""
    for _ in range(8):
        exc = first_failure(exc)
        cause = exc.__cause__
        if isinstance(exc, CkptStoreError) or not isinstance(cause, CkptStoreError):
            return exc
        exc = cause
    return exc


def _out_of_memory(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, MemoryError) or (
        isinstance(exc, RuntimeError)
        and ("can't allocate memory" in text or "not enough memory" in text)
    )


def explain(
    exc: BaseException, urls: Sequence[str], options_given: Sequence[str] = ()
) -> tuple[int, str]:
    """``(exit code, one-line message)`` for ``exc`` raised by a command on ``urls``.

    * a ``CorruptCheckpointError`` -> 1 (damage found); any other ``CkptStoreError`` -> 2;
    * an ``OSError`` that no ckptstore layer explained (a host that does not resolve, a refused
      connection, a permission error) -> 2, naming the command's URLs;
    * an error raised inside a store client while ``-o`` options were given (an unknown option
      name, a value of the wrong type) -> 2, naming the options;
    * an exception of a store client's own type (botocore, aiohttp, httpx, the Azure and Google
      SDKs, fsspec backends), or one a third-party module raised under the stores layer -> 2;
    * a missing package (``ImportError`` of a module that is not ckptstore's) -> 2, as a missing
      optional dependency; running out of memory for what a checkpoint claims -> 2;
    * DCP's ``CheckpointException`` is unwrapped to the first rank's error first, and an error
      that only wraps a ckptstore error (``raise ... from``) to that error;
    * anything else is a bug -> 3, one line with the exception and "please report"; setting
      ``CKPTSTORE_TOOL_TRACEBACK=1`` prints the traceback as well.

    Where an exception comes from is decided by its type's module and its frames' module names
    (``ckptstore.stores.s3.client``, ``botocore.client``), never by file paths: a checkout
    named ``ckptstore`` with its virtualenv inside puts ``/ckptstore/`` in every path.
    """
    code, message = _explain(_own_cause(exc), urls, options_given)
    return code, redact(message)


def _explain(
    exc: BaseException, urls: Sequence[str], options_given: Sequence[str]
) -> tuple[int, str]:
    if isinstance(exc, CorruptCheckpointError):
        return EXIT_CHECK_FAILED, cli_wording(str(exc))
    if isinstance(exc, CkptStoreError):
        return EXIT_USAGE, cli_wording(str(exc))
    what = f"{type(exc).__name__}: {exc}".strip().rstrip(":")
    if options_given and rejected_by_client(exc):
        shown = " ".join(f"-o {o}" for o in options_given)
        return EXIT_USAGE, cli_wording(
            f"{_where(urls)}: the store client rejected the storage options ({what}). "
            f"Check the names and values of {shown}: they go to the URL's filesystem "
            "(s3fs, gcsfs, adlfs) as its options."
        )
    if isinstance(exc, ImportError) and _package(exc.name) != "ckptstore":
        return EXIT_USAGE, cli_wording(
            f"{_where(urls)}: a package this needs is not installed ({what}). Install it "
            "(pip install 'ckptstore[s3]', 'ckptstore[gcs]', 'ckptstore[azure]', "
            "'ckptstore[cli]', or the package the message names)."
        )
    if _out_of_memory(exc):
        return EXIT_USAGE, cli_wording(
            f"{_where(urls)}: not enough memory for what the checkpoint holds ({what}). "
            "Run it on a machine with more memory, or, if the checkpoint cannot be that "
            "large, its .metadata is damaged (`ckptstore-tool inspect` shows the sizes it claims)."
        )
    if isinstance(exc, OSError):
        return EXIT_USAGE, cli_wording(_os_error(exc, urls))
    if _from_store_client(exc):
        return EXIT_USAGE, cli_wording(
            f"{_where(urls)}: the store's client failed ({what}). Check the URL, the -o "
            "storage options and that the store is reachable from this machine."
        )
    return EXIT_INTERNAL, cli_wording(f"internal error ({what}); {REPORT_HINT}")
