"""Codecs: how a stored item's bytes are encoded (``Codec``) and the built-in ones.

A codec is named by a versioned descriptor, ``<name>/<version>`` (``zstd/1``), which the
writer records in the manifest; ``engine.codec_registry`` looks descriptors up. Built in:
``none/1`` (the bytes as they are) and ``zstd/1`` (one zstd frame per item; needs
``ckptstore[zstd]``). ``Codec.encode`` and ``Codec.decode`` check sizes around a
subclass's ``encode_unchecked`` / ``decode_unchecked`` (see ``engine.codec_registry`` for
adding one). This module imports no torch (and zstandard only when a zstd item is encoded
or decoded).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from ckptstore.errors import CkptStoreError, ConfigError, CorruptCheckpointError, missing_dependency

__all__ = ["Codec", "NoneCodec", "ZstdCodec"]

BytesLike = bytes | bytearray | memoryview


class Codec(ABC):
    """One way of storing an item's bytes; subclass it and register an instance
    (``engine.codec_registry.register_codec``).

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
        one that does not is decoded 16 MiB at a time, stopping once past ``limit``."""
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
            while chunk := reader.read(min(_DECODE_STEP, limit + 1 - len(out))):
                out += chunk
                if len(out) > limit:
                    raise ValueError(f"the frame decodes to more than {limit} bytes")
        return out


#: How much of a frame that records no size is decoded at a time.
_DECODE_STEP = 16 << 20


def _zstd() -> Any:
    try:
        import zstandard
    except ImportError as exc:
        raise missing_dependency("zstandard", "zstd") from exc
    return zstandard
