"""Store backends and the URL -> store registry.

``open_store(url, storage_options)`` picks the backend from the URL: a plain path or
``file://`` is a mounted volume; object stores and any other fsspec URL are added by
their own modules and imported lazily (their client libraries are optional extras).
"""

from __future__ import annotations

from typing import Any

from ckptstore.engine.store import Store
from ckptstore.errors import ConfigError, missing_dependency

__all__ = ["open_store", "split_url"]


def split_url(url: str) -> tuple[str, str]:
    """``("s3", "bucket/key")`` for ``s3://bucket/key``; ``("file", path)`` for a path."""
    if "://" not in url:
        return "file", url
    scheme, rest = url.split("://", 1)
    return scheme.lower(), rest


def open_store(url: str | Store, storage_options: dict[str, Any] | None = None) -> Store:
    """The store rooted at ``url`` (a ``Store`` is returned unchanged)."""
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
    if scheme in ("gs", "gcs"):
        try:
            from ckptstore.stores.gcs import GCSStore
        except ImportError as exc:
            raise missing_dependency("gcsfs", "gcs") from exc
        return GCSStore(url, options)
    if scheme in ("az", "abfs", "abfss"):
        try:
            from ckptstore.stores.azure import AzureStore
        except ImportError as exc:
            raise missing_dependency("azure.storage.blob", "azure") from exc
        return AzureStore(url, options)
    raise ConfigError(
        f"no store for URL scheme {scheme!r} in {url!r}; use a path, file://, s3://, gs://, "
        "az:// or abfs://"
    )
