"""Store backends and the URL -> store registry.

``open_store(url, storage_options, retry=...)`` picks the store class from the URL's
scheme and builds it the one way every store is built (the constructor contract in
``ckptstore.engine.store``)::

    Class(url, storage_options, retry=retry)

Where a scheme's class comes from, first match wins:

1. ``BUILTIN_STORES``: a plain path, ``file://`` and ``local://`` (the volume store),
   ``s3://``/``s3a://``, ``gs://``/``gcs://``, ``az://``/``abfs://``/``abfss://``. A
   built-in scheme always means the built-in store: an entry point cannot replace it.
2. The ``ckptstore.stores`` entry-point group: a third-party distribution registers a
   store with one line of its own ``pyproject.toml``::

       [project.entry-points."ckptstore.stores"]
       myscheme = "mypackage.store:MyStore"

   (the name is the URL scheme, the value ``"module:Class"``, a ``Store`` subclass).
3. ``FSSPEC_STORE``, the generic store, for any other scheme fsspec knows.

Store modules are imported on first use; their client libraries are optional extras,
and a missing one raises ``MissingDependencyError`` naming the ``pip install`` to run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from ckptstore.config import RetryConfig
from ckptstore.engine.paths import is_safe_name  # the names every Store accepts
from ckptstore.engine.store import Multipart, Store
from ckptstore.errors import ConfigError, MissingDependencyError, missing_dependency
from ckptstore.stores._dirfd import Anchor  # volume paths from a root's descriptor (plugins)
from ckptstore.stores.storage_options import raised_in, rejected_by_client  # where a client failed

__all__ = [
    "Anchor",
    "StoreSpec",
    "BUILTIN_STORES",
    "FSSPEC_STORE",
    "ENTRY_POINT_GROUP",
    "open_store",
    "split_url",
    "store_spec",
    "is_safe_name",
    "Multipart",
    "raised_in",
    "rejected_by_client",
]

ENTRY_POINT_GROUP = "ckptstore.stores"


@dataclass(frozen=True)
class StoreSpec:
    """Where the store for some URL schemes lives, and what it needs installed.

    ``target`` is ``"module:Class"``, imported on first use. ``client_module`` is the
    optional client library it imports and ``extra`` the ``ckptstore[extra]`` that
    installs it (both None for a store with no optional dependency). ``distribution``
    names the installed distribution that registered it (entry points only).
    """

    schemes: tuple[str, ...]
    target: str
    extra: str | None = None
    client_module: str | None = None
    distribution: str | None = None

    def load(self) -> type[Store]:
        """The store class; ``MissingDependencyError`` / ``ConfigError`` saying what to do."""
        module, _, name = self.target.partition(":")
        source = f" (registered by distribution {self.distribution!r})" if self.distribution else ""
        try:
            cls = getattr(importlib.import_module(module), name)
        except MissingDependencyError:
            raise
        except ImportError as exc:
            if self.distribution is None:
                what = self.client_module or exc.name or "its client library"
                raise missing_dependency(what, self.extra or self.schemes[0]) from exc
            raise MissingDependencyError(
                f"the store for {self.schemes[0]}:// ({self.target}){source} cannot be "
                f"imported: {exc}. Reinstall {self.distribution!r} or its dependencies."
            ) from exc
        except AttributeError as exc:
            raise ConfigError(
                f"the store for {self.schemes[0]}:// names {self.target}{source}, which does "
                f"not exist ({exc}); fix or reinstall {self.distribution or 'ckptstore'}."
            ) from exc
        if not (isinstance(cls, type) and issubclass(cls, Store)):
            raise ConfigError(
                f"the store for {self.schemes[0]}:// is {self.target}{source}, which is not a "
                "ckptstore.engine.store.Store subclass; fix the entry point's value."
            )
        return cls


#: The built-in stores: each scheme here always means its built-in class.
BUILTIN_STORES: tuple[StoreSpec, ...] = (
    StoreSpec(("file", "local"), "ckptstore.stores.local:LocalStore"),
    StoreSpec(("s3", "s3a"), "ckptstore.stores.s3:S3Store", "s3", "s3fs"),
    StoreSpec(("gs", "gcs"), "ckptstore.stores.gcs:GCSStore", "gcs", "gcsfs"),
    StoreSpec(
        ("az", "abfs", "abfss"), "ckptstore.stores.azure:AzureStore", "azure", "azure.storage.blob"
    ),
)
#: The generic store, for any other scheme fsspec knows.
FSSPEC_STORE = StoreSpec((), "ckptstore.stores.fsspec_store:FsspecStore")

_BUILTIN: dict[str, StoreSpec] = {s: spec for spec in BUILTIN_STORES for s in spec.schemes}


def split_url(url: str) -> tuple[str, str]:
    """``("s3", "bucket/key")`` for ``s3://bucket/key``; ``("file", path)`` for a path."""
    if "://" not in url:
        return "file", url
    scheme, rest = url.split("://", 1)
    return scheme.lower(), rest


def _entry_point(scheme: str) -> StoreSpec | None:
    """The spec an installed distribution registered for ``scheme``, if any."""
    found: dict[str, StoreSpec] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.lower() != scheme:
            continue
        dist = getattr(getattr(ep, "dist", None), "name", None) or "an unnamed distribution"
        found.setdefault(ep.value, StoreSpec((scheme,), ep.value, distribution=dist))
    if len(found) > 1:
        names = ", ".join(f"{s.target} ({s.distribution})" for s in found.values())
        raise ConfigError(
            f"several installed distributions register a store for {scheme}://: {names}. "
            "Uninstall all but one."
        )
    spec = next(iter(found.values()), None)
    if spec is not None and ":" not in spec.target:
        raise ConfigError(
            f"the {ENTRY_POINT_GROUP} entry point {scheme} of distribution "
            f"{spec.distribution!r} is {spec.target!r}, not 'module:Class'; fix its pyproject."
        )
    return spec


def _fsspec_knows(scheme: str) -> bool:
    try:
        import fsspec
    except ImportError:  # pragma: no cover - fsspec is a core dependency
        return False
    return scheme in fsspec.available_protocols()


def store_spec(scheme: str) -> StoreSpec | None:
    """The spec of the store for URL ``scheme``: built-in, entry point, fsspec, or None."""
    scheme = scheme.lower()
    spec = _BUILTIN.get(scheme) or _entry_point(scheme)
    if spec is None and _fsspec_knows(scheme):
        spec = FSSPEC_STORE
    return spec


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
    spec = store_spec(scheme)
    if spec is None:
        known = ", ".join(f"{s}://" for s in _BUILTIN)
        raise ConfigError(
            f"no store for URL scheme {scheme!r} in {url!r}; use a path, {known}, another "
            f"scheme fsspec knows, or install a store registered under {ENTRY_POINT_GROUP!r}"
        )
    cls = spec.load()
    return cls(url, dict(storage_options or {}), retry=retry)  # type: ignore[call-arg]
