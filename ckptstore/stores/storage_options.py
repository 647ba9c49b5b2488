"""Storage options a store's client would reject or ignore: refused up front, by name.

A misspelt option (``endpoint=`` for ``endpoint_url=``) used to reach the client as it was:
s3fs handed it to botocore's session, which raised a bare ``TypeError`` at the first
request; gcsfs and the Azure SDK dropped it silently and talked to the default public
endpoint. :func:`check_names` refuses such a name when the store is opened, with a
``ConfigError`` naming it and the option it most likely meant; only names are shown, never
values. :func:`rejected_by_client` turns what a client still raises about an option's
*value* (a wrong type) into the same ``ConfigError``, deciding by where the exception was
raised (the module of the innermost frame: the client's, not ckptstore's), never by paths.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any

from ckptstore.errors import ConfigError
from ckptstore.redact import redact_options

__all__ = [
    "FSSPEC_OPTIONS",
    "S3_ALIASES",
    "check_names",
    "check_s3_options",
    "check_gcs_options",
    "named_parameters",
    "raised_in",
    "rejected_by_client",
    "rejected_error",
    "refuse_userinfo",
]

#: Options fsspec takes for itself from any filesystem's ``**kwargs``.
FSSPEC_OPTIONS = frozenset(
    {
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "skip_instance_cache",
        "asynchronous",
        "loop",
        "batch_size",
    }
)


def named_parameters(
    func: Callable[..., Any], drop: Iterable[str] = (), *, any_kwargs: bool = False
) -> frozenset[str] | None:
    """The keyword names ``func`` takes, or None when it takes any (``**kwargs``) unless
    ``any_kwargs`` (then its named ones), or when it has no signature to read."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # a builtin without a signature: cannot tell
        return None
    variadic = [n for n, p in params.items() if p.kind in _VARIADIC_KINDS]
    if not any_kwargs and any(params[n].kind is inspect.Parameter.VAR_KEYWORD for n in variadic):
        return None
    return frozenset(params) - {"self", *variadic, *drop}


_VARIADIC_KINDS = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
_VARIADIC: frozenset[str] = frozenset()


def class_parameters(cls: type) -> frozenset[str]:
    """The keyword names the ``__init__`` of ``cls`` and of its bases name (a filesystem
    class passes its ``**kwargs`` on to its bases; fsspec's base ignores the rest)."""
    names: set[str] = set()
    for klass in cls.__mro__[:-1]:
        init = klass.__dict__.get("__init__")
        if init is not None:
            names |= named_parameters(init, _VARIADIC, any_kwargs=True) or frozenset()
    return frozenset(names)


#: Names users reach for that S3 spells otherwise (botocore's, another tool's).
S3_ALIASES = {
    "endpoint": "endpoint_url",
    "region": "client_kwargs.region_name",
    "region_name": "client_kwargs.region_name",
    "aws_access_key_id": "key",
    "access_key": "key",
    "aws_secret_access_key": "secret",
    "secret_key": "secret",
    "aws_session_token": "token",
}


def check_names(
    url: str,
    options: Mapping[str, Any],
    known: Iterable[str],
    client: str,
    prefix: str = "",
    aliases: Mapping[str, str] | None = None,
) -> None:
    """Raise ``ConfigError`` if ``options`` holds a name outside ``known`` (for ``client``),
    naming the option it most likely meant (``aliases`` first, then the closest names)."""
    pool = sorted(set(known))
    unknown = sorted(str(name) for name in options if name not in pool)
    if not unknown:
        return
    name = unknown[0]
    meant = (aliases or {}).get(name)
    close = (
        [meant] if meant else [prefix + c for c in difflib.get_close_matches(name, pool, 2, 0.6)]
    )
    hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
    more = f" (and {len(unknown) - 1} more: {', '.join(map(repr, unknown[1:]))})"
    raise ConfigError(
        f"{url}: {prefix + name!r} in storage_options is not an option of {client}{hint}"
        f"{more if len(unknown) > 1 else ''}; fix its name or remove it."
    )


def refuse_userinfo(url: str, bucket: str) -> None:
    """Refuse ``s3://user:password@bucket`` (and ``gs://``): a bucket name holds neither
    ``@`` nor ``:``, and these stores take credentials only as storage options."""
    if "@" in bucket or ":" in bucket:
        raise ConfigError(
            f"{url}: a user name or password in an object-store URL is not used (bucket "
            f"names hold no '@' or ':'); give the bucket alone and the credentials in "
            "storage_options (key/secret/token)."
        )


@functools.cache
def _s3_names() -> tuple[frozenset[str] | None, frozenset[str] | None, frozenset[str] | None]:
    """Names s3fs takes (its own, its session's), ``client_kwargs``', ``config_kwargs``'."""
    import s3fs
    from aiobotocore.session import AioSession
    from botocore.config import Config

    session = named_parameters(AioSession.__init__)
    top = (
        None if session is None else class_parameters(s3fs.S3FileSystem) | session | FSSPEC_OPTIONS
    )
    client = named_parameters(AioSession._create_client, {"service_name"})  # noqa: SLF001
    return top, client, frozenset(Config.OPTION_DEFAULTS)


def check_s3_options(url: str, options: Mapping[str, Any]) -> None:
    """Refuse option names s3fs / botocore do not take (see the module docstring).

    A caller's own ``session`` takes no session options of ours to check against."""
    top, client, config = _s3_names()
    if top is not None and "session" not in options:
        check_names(url, options, top, "the S3 client (s3fs)", aliases=S3_ALIASES)
    for key, names in (("client_kwargs", client), ("config_kwargs", config)):
        value = options.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(
                f"{url}: {key} in storage_options must be a mapping of names to values, "
                f"not a {type(value).__name__}"
            )
        if value and names is not None:
            check_names(url, value, names, f"the S3 client's {key}", f"{key}.")


@functools.cache
def _gcs_names() -> frozenset[str] | None:
    from gcsfs import GCSFileSystem

    return class_parameters(GCSFileSystem) | FSSPEC_OPTIONS


def check_gcs_options(url: str, options: Mapping[str, Any]) -> None:
    """Refuse option names gcsfs does not take (it would ignore them silently)."""
    names = _gcs_names()
    if names is not None:
        check_names(
            url, options, names, "the GCS client (gcsfs)", aliases={"endpoint": "endpoint_url"}
        )


def _frames(tb: TracebackType | None) -> list[str]:
    names = []
    while tb is not None:
        names.append(str(tb.tb_frame.f_globals.get("__name__", "")))
        tb = tb.tb_next
    return names


def raised_in(exc: BaseException) -> tuple[str | None, str | None]:
    """``(innermost ckptstore module, innermost module)`` of ``exc``'s traceback, by the
    frames' module names (``__name__``), which do not depend on where files are."""
    frames = _frames(exc.__traceback__)
    ours = [m for m in frames if m == "ckptstore" or m.startswith("ckptstore.")]
    return (ours[-1] if ours else None), (frames[-1] if frames else None)


def _ours(module: str | None) -> bool:
    return bool(module) and (module == "ckptstore" or str(module).startswith("ckptstore."))


def rejected_by_client(exc: BaseException) -> bool:
    """Whether ``exc`` is a client rejecting what it was given: a ``TypeError`` /
    ``ValueError`` / ``AttributeError`` / ``KeyError`` raised past the innermost ckptstore
    frame, that frame being in the stores layer (which passes storage options on)."""
    if not isinstance(exc, (TypeError, ValueError, AttributeError, KeyError)):
        return False
    ours, innermost = raised_in(exc)
    return (
        ours is not None
        and ours.startswith("ckptstore.stores")
        and (not _ours(innermost) or _rejected_at_call(exc))
    )


def _rejected_at_call(exc: BaseException) -> bool:
    # "f() got an unexpected keyword argument 'x'" is raised in the caller's frame: the
    # call into the client from the stores layer itself.
    return isinstance(exc, TypeError) and "keyword argument" in str(exc)


def rejected_error(url: str, exc: BaseException, options: Mapping[str, Any]) -> ConfigError:
    """The ``ConfigError`` for a client that rejected the storage ``options`` (shown as
    ``name=value``, credential-named values masked)."""
    shown = ", ".join(f"{k}={v}" for k, v in sorted(redact_options(options).items()))
    return ConfigError(
        f"{url}: the store client rejected the storage options ({type(exc).__name__}: {exc}). "
        f"Check the names and values of the storage_options given{f' ({shown})' if shown else ''}."
    )
