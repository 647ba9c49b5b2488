"""Keep credentials out of every message: the one place errors and log lines pass through.

``redact(text)`` replaces what looks like a credential with ``***``:

* the user-info of a URL in any scheme (``s3://user:pw@host``, ``https://token@host``),
  and a ``user:password@host`` authority on its own;
* the value of a credential-named option, parameter or header, however it is written:
  ``secret=...``, ``-o key=...``, ``'account_key': '...'``, ``"token": "..."``,
  ``AccountKey=...;`` in an Azure connection string, ``?sig=...`` / ``&X-Amz-Signature=``
  in a signed URL's query string, ``Authorization: Bearer ...``. A name is
  credential-named when its last dotted segment, lower-cased without ``_``/``-``, ends in
  one of :data:`SECRET_NAME_ENDINGS` (``secret``, ``key``, ``token``, ``password``, ``sas``,
  ``credential``, ``signature``, ``connectionstring``, ...);
* any value :func:`remember` was given: every store remembers the credential-named values
  of its ``storage_options`` (``Store.__init__``), so a client message that echoes one
  without its name (``Invalid header value 'AKIA...'``) is redacted too.

Who calls it: ``CkptStoreError.__str__`` / ``__repr__`` (every ckptstore error's message),
the :class:`RedactingHandler` on the ``ckptstore`` logger (every log line of the library's
loggers, before any handler of the application formats it) and ``ckptstore-tool``'s output
(its error printer and its stdout / stderr). It is idempotent and never raises.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "MASK",
    "SECRET_NAME_ENDINGS",
    "RedactingHandler",
    "is_secret_name",
    "redact",
    "redact_options",
    "remember",
]

MASK = "***"

#: A name whose normalised form ends in one of these holds a credential.
SECRET_NAME_ENDINGS = (
    "secret",
    "key",
    "keyid",
    "token",
    "password",
    "passwd",
    "pwd",
    "sas",
    "credential",
    "credentials",
    "signature",
    "sig",
    "connectionstring",
    "auth",
    "authorization",
    "cookie",
)

#: Values left as they are: placeholders in advice (``-o key=...``), masks, and the modes
#: a ``token`` option names instead of holding one (gcsfs).
_PLACEHOLDERS = frozenset(
    {"", "...", MASK, "value", "VALUE", "none", "None", "null", "anon", "google_default"}
    | {"cache", "cloud", "browser", "true", "false", "True", "False"}
)

_URL_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/?#@'\"<>]+@")
#: ``user:password@host`` without a scheme (a client echoing a URL's authority).
_BARE_USERINFO = re.compile(r"(?<![\w/:.@\-])[\w.%+\-]+:[^\s/@'\"<>]+@(?=[\w\[])")
_AUTH_HEADER = re.compile(
    r"(?i)(?P<head>\bauthorization['\"]?\s*[:=]\s*['\"]?)(?P<value>[^'\"\n,;}\]]+)"
)
_BEARER = re.compile(r"(?i)\b(?P<kind>bearer)\s+[A-Za-z0-9._~+/=\-]{16,}")
_PAIR = re.compile(
    r"['\"]?(?P<name>(?<![\w.])[A-Za-z_][\w.\-]*)['\"]?"
    r"(?P<sep>\s*[:=]\s*)"
    r"(?=(?P<value>b?'(?:[^'\\\n]|\\.)*'|b?\"(?:[^\"\\\n]|\\.)*\""
    r"|b?['\"][^\s,;&)}\]'\"]+"  # a quoted value cut short
    r"|(?![\[{(])[^\s,;&)}\]'\"]+))"
)  # the value is looked at, not consumed: "args: --token=x" holds two pairs

_known: set[str] = set()
_known_lock = threading.Lock()
_MAX_KNOWN = 512
_MIN_KNOWN_LEN = 8  # shorter values would mask ordinary words (names name them anyway)


def _normal(name: str) -> str:
    return re.sub(r"[_\-]", "", name.rsplit(".", 1)[-1].lower())


def is_secret_name(name: str) -> bool:
    """Whether option / parameter ``name`` (``secret``, ``client_kwargs.aws_secret_access_key``,
    ``AccountKey``, ``X-Amz-Signature``) holds a credential."""
    normal = _normal(str(name))
    return bool(normal) and normal.endswith(SECRET_NAME_ENDINGS)


def _secret_spans(text: str) -> list[tuple[int, int, str]]:
    """``(start, end, mask)`` for each value of a credential-named pair in ``text``: quotes
    kept; a bare value after a JSON key (``"key": 123``) becomes ``"***"``, still JSON."""
    spans = []
    for match in _PAIR.finditer(text):
        value = match.group("value")
        if not is_secret_name(match.group("name")):
            continue
        quoted = 2 if value[:2] in ("b'", 'b"') else 1 if value[:1] in "'\"" else 0
        closed = 1 if quoted and len(value) > quoted and value[-1] == value[quoted - 1] else 0
        bare = value[quoted : len(value) - closed]
        if bare in _PLACEHOLDERS or bare.startswith(("<", "$", "*")):
            continue
        start, end = match.start("value") + quoted, match.end("value") - closed
        json_key = text[match.start()] == '"' and text[match.end("name")] == '"'
        spans.append((start, end, f'"{MASK}"' if json_key and not quoted else MASK))
    return spans


def _mask_pairs(text: str) -> str:
    out, at = [], 0
    for start, end, mask in _secret_spans(text):
        if end <= at:
            continue
        out += [text[at : max(start, at)], mask]
        at = end
    return "".join(out) + text[at:]


def _mask_header(match: re.Match[str]) -> str:
    value = match.group("value").strip()
    return match.group(0) if value in _PLACEHOLDERS else f"{match.group('head')}{MASK}"


def redact(text: Any) -> str:
    """``str(text)`` with every credential replaced by ``***`` (see the module docstring)."""
    try:
        out = str(text)
        with _known_lock:
            known = sorted(_known, key=len, reverse=True)
        for value in known:
            if value in out:
                out = out.replace(value, MASK)
        out = _URL_USERINFO.sub(lambda m: f"{m.group('scheme')}{MASK}@", out)
        out = _BARE_USERINFO.sub(f"{MASK}@", out)
        out = _AUTH_HEADER.sub(_mask_header, out)
        out = _BEARER.sub(lambda m: f"{m.group('kind')} {MASK}", out)
        return _mask_pairs(out)
    except Exception:  # noqa: BLE001 - a message must always come out, if only a mask
        return MASK


def _secret_values(options: Any, secret: bool = False) -> Iterable[str]:
    if isinstance(options, Mapping):
        for key, value in options.items():
            yield from _secret_values(value, secret or is_secret_name(str(key)))
    elif isinstance(options, (list, tuple)):
        for value in options:
            yield from _secret_values(value, secret)
    elif secret and isinstance(options, (str, bytes)):
        text = options.decode("utf-8", "replace") if isinstance(options, bytes) else options
        if len(text) >= _MIN_KNOWN_LEN and text not in _PLACEHOLDERS:
            yield text


def remember(options: Any) -> None:
    """Redact from now on, in this process, every credential-named value in ``options``
    (a ``storage_options`` dict, nested dicts and lists included) wherever it appears."""
    try:
        found = set(_secret_values(options))
    except Exception:  # noqa: BLE001 - an odd mapping: its names still redact its values
        return
    if found:
        with _known_lock:
            if len(_known) + len(found) > _MAX_KNOWN:
                _known.clear()
            _known.update(found)


def redact_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``options`` with every credential-named value (at any depth) masked."""
    out: dict[str, Any] = {}
    for key, value in options.items():
        if is_secret_name(str(key)) and value not in (None, ""):
            out[key] = MASK
        elif isinstance(value, Mapping):
            out[key] = redact_options(value)
        else:
            out[key] = value
    return out


class RedactingHandler(logging.NullHandler):
    """Redacts each record that reaches it, in place, for the handlers that format it next.

    Installed once on the ``ckptstore`` logger: records of every ``ckptstore.*`` logger
    pass through it on their way up to the application's handlers (the root logger's or
    its own), which then format the redacted message. It outputs nothing itself.
    """

    def handle(self, record: logging.LogRecord) -> bool:
        """Redact ``record``'s message (and traceback text) in place; emit nothing."""
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a broken format: logging reports it later
            return True
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = redact(logging.Formatter().formatException(record.exc_info))
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def _install() -> None:
    logger = logging.getLogger("ckptstore")
    if not any(isinstance(h, RedactingHandler) for h in logger.handlers):
        logger.addHandler(RedactingHandler())


_install()
