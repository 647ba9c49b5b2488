"""Codecs: how a stored item's bytes are encoded, and the registry that names them.

A codec is named by a versioned descriptor, ``<name>/<version>`` (``zstd/1``), which the
writer records in the manifest; a reader looks the manifest's descriptor up here and refuses
one it does not know (``CorruptCheckpointError``) or whose library is missing
(``MissingDependencyError``) rather than guess. A bare name (``zstd``, ``none``: what
manifests held before descriptors were versioned) is version 1. Built in: ``none/1`` (the
bytes as they are) and ``zstd/1`` (one zstd frame per item; needs ``ckptstore[zstd]``).

Adding one::

    class Lz4(Codec):
        name, version, max_ratio = "lz4", 1, 255
        def encode_unchecked(self, data): ...  # Codec.encode / .decode check sizes
        def decode_unchecked(self, data, raw_length): ...

    register_codec(Lz4())          # in a module every writing and reading process imports
    ckptstore.save(state, url, codec="lz4")

An installed package can instead name its codec in the ``ckptstore.codecs`` entry-point
group (``lz4 = "mypkg.codecs:Lz4"``): every process (the CLI, a background writer
process, a fresh reader) then finds it at its first registry lookup.

This module imports no torch (and zstandard only when a zstd item is encoded or decoded).
"""

from __future__ import annotations

import logging
import re
import threading
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ckptstore.errors import CkptStoreError, ConfigError, CorruptCheckpointError, missing_dependency

__all__ = [
    "Codec",
    "NoneCodec",
    "ZstdCodec",
    "register_codec",
    "get_codec",
    "stored_codec",
    "transform_codec",
    "codec_names",
    "find_codec",
    "parse_descriptor",
    "ENTRY_POINT_GROUP",
]

BytesLike = bytes | bytearray | memoryview

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")
_DESCRIPTOR = re.compile(r"^([a-z0-9][a-z0-9_.-]{0,63})(?:/([1-9][0-9]{0,8}))?$")


class Codec(ABC):
    """One way of storing an item's bytes; subclass it and ``register_codec`` an instance.

    Class attributes: ``name`` (lower case, ``[a-z0-9_.-]``), ``version`` (a whole number
    >= 1; a new version is a new on-storage format, registered beside the old one so old
    checkpoints keep loading), ``max_ratio`` (the most one stored byte may decode to: a
    manifest recording a larger raw length is refused before anything is allocated).

    Call order: ``require()`` when a writer or reader is built (fails early if a library
    is missing); ``encode`` once per item written; ``decode`` once per item read, with the
    raw length the manifest records (None for a stock DCP checkpoint, which records none).
    Instances are shared by every thread: keep them stateless.
    """

    name: ClassVar[str]
    version: ClassVar[int] = 1
    max_ratio: ClassVar[int] = 1

    @property
    def descriptor(self) -> str:
        """``<name>/<version>``, as the manifest records it."""
        return f"{self.name}/{self.version}"

    @property
    def dcp_transform(self) -> str | None:
        """The entry of ``transform_descriptors`` in DCP's ``.metadata`` naming this codec
        for stock DCP readers: by default ``ckptstore.<name>/<version>``, which stock DCP
        refuses as an unknown extension (it cannot decode it) instead of misreading."""
        return f"ckptstore.{self.name}/{self.version}"

    @property
    def identity(self) -> bool:
        """True if stored bytes are the item's bytes (readers may read them in place)."""
        return False

    def require(self) -> None:
        """Raise ``MissingDependencyError`` if a library this codec needs is missing."""
        return None  # a codec of the standard library needs nothing

    @abstractmethod
    def encode_unchecked(self, data: memoryview) -> BytesLike:
        """The stored form of one item's bytes (``encode`` checks sizes around it)."""

    @abstractmethod
    def decode_unchecked(self, data: BytesLike, raw_length: int | None) -> BytesLike:
        """The item's bytes from their stored form (``decode`` checks sizes around it)."""

    def encode(self, data: memoryview) -> BytesLike:
        """``encode_unchecked(data)``, refusing (``ConfigError``) a stored form that
        ``max_ratio`` says could not be decoded back: a codec whose ratio is set too low
        would otherwise write checkpoints no reader accepts."""
        out = self.encode_unchecked(data)
        stored = len(memoryview(out))
        if len(data) > max(stored, 1) * self.max_ratio:
            raise ConfigError(
                f"codec {self.descriptor} encoded {len(data)} bytes into {stored}, more than "
                f"its max_ratio ({self.max_ratio}) allows a reader to accept; raise the "
                "codec's max_ratio (it is part of its on-storage format: a new version)"
            )
        return out

    def decode_limited(self, data: BytesLike, raw_length: int | None, limit: int) -> BytesLike:
        """The item's bytes, decoding no more than ``limit`` of them (``decode`` passes the
        recorded raw length, or ``max_ratio`` times the stored size, whichever is known and
        smaller). Default: ``decode_unchecked`` (``decode`` checks the result's length
        after); a codec that can stop early, as zstd does, overrides this so a stored
        item that lies about its size never costs more memory than ``limit``."""
        return self.decode_unchecked(data, raw_length)

    def decode(
        self,
        data: BytesLike,
        raw_length: int | None,
        where: str = "an item",
        *,
        limit: int | None = None,
    ) -> BytesLike:
        """``decode_limited``: refusing a ``raw_length`` beyond ``max_ratio`` times the
        stored size (or beyond ``limit``, the most the caller can use: a tensor item's
        bytes) and a result of another length; any failure is ``CorruptCheckpointError``
        naming ``where``."""
        stored = len(memoryview(data))
        cap = max(stored, 1) * self.max_ratio
        if limit is not None:
            cap = min(cap, max(limit, 0))
        if raw_length is not None and raw_length > cap:
            raise CorruptCheckpointError(
                f"{where}: {stored} stored bytes cannot decode to {raw_length} with "
                f"{self.descriptor} (at most {cap}); the manifest is damaged: restore the "
                "previous checkpoint."
            )
        try:
            out = self.decode_limited(
                data, raw_length, raw_length if raw_length is not None else cap
            )
        except CkptStoreError:
            raise
        except Exception as exc:
            raise CorruptCheckpointError(
                f"{where} does not decode with {self.descriptor} ({str(exc)[:200]}); the "
                "checkpoint is damaged: restore the previous one."
            ) from exc
        size = len(memoryview(out))
        if raw_length is not None and size != raw_length:
            raise CorruptCheckpointError(
                f"{where} decodes to {size} bytes with {self.descriptor}, "
                f"but the manifest says {raw_length}; restore the previous checkpoint."
            )
        if size > cap:
            raise CorruptCheckpointError(
                f"{where} decodes to {size} bytes with {self.descriptor}, more than the "
                f"{cap} its item can hold; the checkpoint is damaged: restore the previous one."
            )
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Codec) and other.descriptor == self.descriptor

    def __hash__(self) -> int:
        return hash(self.descriptor)

    def __repr__(self) -> str:
        return f"<codec {self.descriptor}>"


class NoneCodec(Codec):
    """Items stored as they are (what stock DCP writes)."""

    name = "none"

    @property
    def dcp_transform(self) -> str | None:
        """None: stock DCP reads these items with no transform."""
        return None

    @property
    def identity(self) -> bool:
        """True: the stored bytes are the item's bytes."""
        return True

    def encode_unchecked(self, data: memoryview) -> BytesLike:
        """The bytes unchanged."""
        return data

    def decode_unchecked(self, data: BytesLike, raw_length: int | None) -> BytesLike:
        """The bytes unchanged."""
        return data


class ZstdCodec(Codec):
    """Each item one zstd frame (level 3): the format of DCP's ``ZStandard`` stream
    extension, which the writer names in ``.metadata`` so stock readers decode it too."""

    name = "zstd"
    #: zstd cannot expand a stored item more than this (a 128 KiB block takes >= 4 bytes).
    max_ratio = 32768

    @property
    def dcp_transform(self) -> str | None:
        """DCP's own ZStandard extension, so stock readers decode these items too."""
        return "stream.zstd/1"  # torch.distributed.checkpoint._extension.ZStandard

    def require(self) -> None:
        """Import zstandard (``MissingDependencyError`` naming ``ckptstore[zstd]`` if absent)."""
        _zstd()

    def encode_unchecked(self, data: memoryview) -> BytesLike:
        """One zstd frame (level 3, all cores) holding ``data``."""
        return _zstd().ZstdCompressor(level=3, threads=-1).compress(data)  # type: ignore[no-any-return]

    def decode_unchecked(self, data: BytesLike, raw_length: int | None) -> BytesLike:
        """The frame's content (at most ``max_ratio`` times the stored size)."""
        return self.decode_limited(data, raw_length, max(len(memoryview(data)), 1) * self.max_ratio)

    def decode_limited(self, data: BytesLike, raw_length: int | None, limit: int) -> BytesLike:
        """The frame's content, never more than ``limit`` bytes of it: a frame that declares
        its size is refused before allocation if that size is another (or over ``limit``);
        one that does not is decoded in pieces, stopping once past ``limit``."""
        zstd = _zstd()
        declared = zstd.get_frame_parameters(data).content_size
        if declared != zstd.CONTENTSIZE_UNKNOWN:
            if raw_length is not None and declared != raw_length:
                raise ValueError(f"the frame declares {declared} bytes")  # before allocating
            if declared > limit:
                raise ValueError(f"the frame declares {declared} bytes, more than {limit}")
            return zstd.ZstdDecompressor().decompress(data)  # type: ignore[no-any-return]
        if raw_length is not None:  # a buffer of raw_length; more output is an error
            return zstd.ZstdDecompressor().decompress(data, max_output_size=raw_length)  # type: ignore[no-any-return]
        # A frame of DCP's stream extension records no size: stream it, within the limit.
        out = bytearray()
        with zstd.ZstdDecompressor().stream_reader(data) as reader:
            while chunk := reader.read(min(_PIECE, limit + 1 - len(out))):
                out += chunk
                if len(out) > limit:
                    raise ValueError(f"the frame decodes to more than {limit} bytes")
        return out


#: How much of a frame that records no size is decoded at a time.
_PIECE = 16 << 20


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError as exc:
        raise missing_dependency("zstandard", "zstd") from exc
    return zstandard


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
