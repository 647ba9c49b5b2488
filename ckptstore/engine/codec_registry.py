"""The codec registry: codecs by versioned descriptor, for writers, manifests and readers.

A writer asks for a codec by name or descriptor (``get_codec``); a reader looks the
manifest's descriptor up (``stored_codec``; a bare name such as ``zstd`` is version 1) and
refuses one it does not know (``CorruptCheckpointError``) or whose library is missing
(``MissingDependencyError``) rather than guess. Adding one (``engine.codecs.Codec``)::

    class Lz4(Codec):
        name, version, max_ratio = "lz4", 1, 255
        def encode_unchecked(self, data): ...  # Codec.encode / .decode check sizes
        def decode_unchecked(self, data, raw_length): ...

    register_codec(Lz4())  # in a module every writing and reading process imports

or name it in the ``ckptstore.codecs`` entry-point group (``lz4 = "mypkg.codecs:Lz4"``):
every process then finds it at its first lookup. No torch here.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

from ckptstore.engine.codecs import Codec, NoneCodec, ZstdCodec
from ckptstore.errors import ConfigError, CorruptCheckpointError

__all__ = [
    "register_codec",
    "get_codec",
    "stored_codec",
    "transform_codec",
    "codec_names",
    "find_codec",
    "parse_descriptor",
    "ENTRY_POINT_GROUP",
]

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_DESCRIPTOR = re.compile(r"^([a-z0-9][a-z0-9_.-]{0,63})(?:/([1-9][0-9]{0,8}))?$")
#: Installed packages add codecs here: ``[project.entry-points."ckptstore.codecs"]``
#: ``lz4 = "mypkg.codecs:Lz4"`` (a Codec subclass or instance), loaded at the first lookup.
ENTRY_POINT_GROUP = "ckptstore.codecs"

_LOCK = threading.Lock()
_PLUGINS_LOCK = threading.RLock()  # re-entrant: a plugin's import may look codecs up
_plugins_loaded = False
_CODECS: dict[tuple[str, int], Codec] = {}


def register_codec(codec: Codec, *, replace: bool = False) -> Codec:
    """Make ``codec`` known by its descriptor (and its name, for writers, if it is that
    name's newest version). Registering a taken descriptor is a ``ConfigError`` unless
    ``replace``. Returns ``codec``."""
    if not isinstance(codec, Codec):
        raise ConfigError(f"register_codec takes a Codec instance, not {codec!r:.80}")
    name, version = getattr(codec, "name", None), getattr(codec, "version", None)
    if type(name) is not str or not _NAME.match(name):
        raise ConfigError(f"codec name {name!r:.80} must match {_NAME.pattern}")
    if type(version) is not int or not 1 <= version < 10**9:
        raise ConfigError(f"codec {name} has version {version!r:.80}; use a whole number >= 1")
    if type(codec.max_ratio) is not int or codec.max_ratio < 1:
        raise ConfigError(f"codec {name} has max_ratio {codec.max_ratio!r:.80}; use an int >= 1")
    with _LOCK:
        if (name, version) in _CODECS and not replace:
            raise ConfigError(
                f"codec {codec.descriptor} is already registered; pass replace=True to "
                "replace it, or give yours another name or version"
            )
        _CODECS[(name, version)] = codec
    return codec


def _load_plugins() -> None:
    """Register the codecs of the ``ckptstore.codecs`` entry points, once per process. A
    plugin that fails to load is logged and left out (the others still load)."""
    global _plugins_loaded
    with _PLUGINS_LOCK:
        if _plugins_loaded:
            return
        _plugins_loaded = True
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP):
            try:
                obj = ep.load()
                codec = obj() if isinstance(obj, type) else obj
                with _LOCK:
                    known = _CODECS.get((codec.name, codec.version))
                if type(known) is not type(codec):  # a module may register itself on import
                    register_codec(codec)
            except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop ckptstore
                log.warning("codec plugin %r (%s) was not loaded: %s", ep.name, ep.value, exc)


def _registered() -> dict[tuple[str, int], Codec]:
    """A snapshot of the registry, plugins included."""
    _load_plugins()
    with _LOCK:
        return dict(_CODECS)


def parse_descriptor(text: str) -> tuple[str, int] | None:
    """``(name, version)`` of ``zstd/1`` or a bare ``zstd`` (version 1), or None if
    ``text`` is not of that form."""
    m = _DESCRIPTOR.match(text) if type(text) is str else None
    if m is None:
        return None
    return m.group(1), int(m.group(2) or 1)


def codec_names() -> tuple[str, ...]:
    """The names a writer accepts, sorted (``none`` first)."""
    names = {name for name, _ in _registered()}
    return tuple(sorted(names, key=lambda n: (n != "none", n)))


def _choices() -> str:
    return ", ".join(sorted(c.descriptor for c in _registered().values()))


def find_codec(name: str, version: int) -> Codec | None:
    """The registered codec ``name/version``, or None (its library is not checked)."""
    return _registered().get((name, version))


def get_codec(spec: str) -> Codec:
    """The codec a writer is asked for: a descriptor (``zstd/1``) or a name (its newest
    version). Unknown: ``ConfigError`` listing the choices; a missing library:
    ``MissingDependencyError``."""
    parsed = parse_descriptor(spec)
    codec = None
    if parsed is not None:
        name, version = parsed
        if "/" not in spec:
            version = max((v for n, v in _registered() if n == name), default=version)
        codec = find_codec(name, version)
    if codec is None:
        raise ConfigError(
            f"unknown codec {spec!r:.80}; choose one of {', '.join(codec_names())} "
            f"(or a versioned descriptor: {_choices()})"
        )
    codec.require()
    return codec


def stored_codec(descriptor: str, where: str) -> Codec:
    """The codec a manifest at ``where`` records (a bare name is version 1). Unknown:
    ``CorruptCheckpointError`` naming it; a missing library: ``MissingDependencyError``."""
    parsed = parse_descriptor(descriptor)
    codec = find_codec(*parsed) if parsed is not None else None
    if codec is None:
        raise CorruptCheckpointError(
            f"{where} records codec {descriptor!r:.80}, which this ckptstore does not know "
            f"(it knows {_choices()}). If a newer ckptstore or a codec plugin wrote it, "
            "upgrade ckptstore or install the plugin (or register_codec it) before loading; "
            "otherwise the manifest is damaged: restore the previous checkpoint."
        )
    codec.require()
    return codec


def transform_codec(descriptors: Any, where: str) -> Codec | None:
    """The codec named by an item's DCP ``transform_descriptors`` (one entry, matched on
    its name and major version as DCP does), None when there are none. Any other list
    is ``CorruptCheckpointError`` naming ``where`` and the transforms ckptstore reads."""
    if not descriptors:
        return None
    codecs = list(_registered().values())
    if len(descriptors) == 1:
        name, _, version = str(descriptors[0]).partition("/")
        major = version.partition(".")[0]
        for codec in codecs:
            transform = codec.dcp_transform
            if transform is not None and transform.partition("/")[::2] == (name, major):
                codec.require()
                return codec
    known = sorted(t for c in codecs if (t := c.dcp_transform) is not None)
    raise CorruptCheckpointError(
        f"{where} uses DCP stream transforms {list(descriptors)}; ckptstore reads only "
        f"{', '.join(known)}. Load it with torch's FileSystemReader and the extension that "
        "wrote it."
    )


register_codec(NoneCodec())
register_codec(ZstdCodec())
