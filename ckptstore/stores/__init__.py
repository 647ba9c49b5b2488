"""Store backends and the URL -> store registry.

``open_store(url, storage_options)`` picks the backend from the URL: a plain path or
``file://`` is a mounted volume; object stores and any other fsspec URL are added by
their own modules and imported lazily (their client libraries are optional extras).
"""

from __future__ import annotations

import importlib
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine.store import Store
from ckptstore.errors import ConfigError, MissingDependencyError, missing_dependency

__all__ = ["open_store", "split_url", "STORE_CLASSES"]

#: URL scheme -> "module:Class" of its native store, imported on first use. Each class is
#: built as ``Class(url, storage_options, retry=retry)``. A scheme not listed here that
#: fsspec knows gets the generic ``FsspecStore``.
STORE_CLASSES: dict[str, str] = {
    "s3": "ckptstore.stores.s3:S3Store",
    "s3a": "ckptstore.stores.s3:S3Store",
    "gs": "ckptstore.stores.gcs:GCSStore",
    "gcs": "ckptstore.stores.gcs:GCSStore",
    "az": "ckptstore.stores.azure:AzureStore",
    "abfs": "ckptstore.stores.azure:AzureStore",
    "abfss": "ckptstore.stores.azure:AzureStore",
}
#: The client library and extra that a scheme's store needs, for the install hint.
_EXTRAS: dict[str, tuple[str, str]] = {
    "s3": ("s3fs", "s3"),
    "s3a": ("s3fs", "s3"),
    "gs": ("gcsfs", "gcs"),
    "gcs": ("gcsfs", "gcs"),
    "az": ("azure.storage.blob", "azure"),
    "abfs": ("azure.storage.blob", "azure"),
    "abfss": ("azure.storage.blob", "azure"),
}
_FSSPEC = "ckptstore.stores.fsspec_store:FsspecStore"


def split_url(url: str) -> tuple[str, str]:
    """``("s3", "bucket/key")`` for ``s3://bucket/key``; ``("file", path)`` for a path."""
    if "://" not in url:
        return "file", url
    scheme, rest = url.split("://", 1)
    return scheme.lower(), rest


def _load(spec: str) -> type[Store]:
    module, _, name = spec.partition(":")
    cls: type[Store] = getattr(importlib.import_module(module), name)
    return cls


def _fsspec_knows(scheme: str) -> bool:
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec is a core dependency
        return False
    return scheme in fsspec.available_protocols()


def open_store(
    url: str | Store,
    storage_options: dict[str, Any] | None = None,
    *,
    retry: RetryConfig | None = None,
) -> Store:
    """The store rooted at ``url`` (a ``Store`` is returned unchanged).

    ``retry`` gives object stores their per-request timeout (``request_timeout_s``).
    """
    if isinstance(url, Store):
        return url
    if not isinstance(url, str) or not url:
        raise ConfigError(f"expected a checkpoint URL or path, got {url!r}")
    scheme, _ = split_url(url)
    options = dict(storage_options or {})
    if scheme in ("file", "local"):
        from ckptstore.stores.local import LocalStore

        if options:
            raise ConfigError(f"storage_options {sorted(options)} do not apply to a local path")
        return LocalStore(url)
    spec = STORE_CLASSES.get(scheme) or (_FSSPEC if _fsspec_knows(scheme) else None)
    if spec is None:
        raise ConfigError(
            f"no store for URL scheme {scheme!r} in {url!r}; use a path, file://, s3://, "
            "gs://, az://, abfs:// or another scheme fsspec knows"
        )
    try:
        cls = _load(spec)
    except MissingDependencyError:
        raise
    except ImportError as exc:
        module, extra = _EXTRAS.get(scheme, (exc.name or "its client library", scheme))
        raise missing_dependency(module, extra) from exc
    return cls(url, options, retry=retry)  # type: ignore[call-arg]
