"""How one DCP item becomes bytes in a shard file, and back.

Items keep stock DCP's encoding (``torch.save`` of each tensor, raw bytes for BYTE_IO
items) so stock ``FileSystemReader`` / ``FsspecReader`` load uncompressed ckptstore
checkpoints. With ``codec="zstd"`` each item's bytes are zstd-compressed on their own
(stock readers cannot load those; the codec is recorded in the manifest).
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import IO, Any, cast

import torch

from ckptstore.errors import ConfigError, missing_dependency

__all__ = [
    "CODECS",
    "ItemInfo",
    "write_item",
    "encode_item",
    "decode_tensor",
    "compress",
    "decompress",
]

CODECS = ("none", "zstd")


@dataclass(frozen=True)
class ItemInfo:
    """What a rank reports for each item it wrote (travels to the coordinator)."""

    relative_path: str
    offset: int
    length: int
    crc32c: int
    raw_length: int
    file_size: int = 0
    file_crc32c: int = 0


def write_item(data: io.BytesIO | torch.Tensor, sink: IO[bytes] | Any) -> None:
    """Write the stock DCP bytes of one item into ``sink``: raw bytes, or ``torch.save``."""
    if isinstance(data, io.BytesIO):
        sink.write(data.getbuffer())
        return
    tensor = data.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.untyped_storage().nbytes() != tensor.nbytes:
        # torch.save writes a view's whole storage; store only the view (as stock DCP does).
        tensor = tensor.clone()
    torch.save(tensor, sink)


def encode_item(data: io.BytesIO | torch.Tensor) -> memoryview:
    """The stock DCP bytes of one item, in memory (for codecs that need the whole item)."""
    if isinstance(data, io.BytesIO):
        return data.getbuffer()
    buf = io.BytesIO()
    write_item(data, buf)
    return buf.getbuffer()


class _ViewReader(io.RawIOBase):
    """A seekable file over a memoryview: ``torch.load`` reads it without a copy
    (``io.BytesIO`` would copy anything that is not ``bytes``)."""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        super().__init__()
        self._view = memoryview(data).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = max(0, min(len(b), len(self._view) - self._pos))
        b[:n] = self._view[self._pos : self._pos + n]
        self._pos += n
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos


def decode_tensor(data: bytes | bytearray | memoryview) -> torch.Tensor:
    reader = cast(IO[bytes], _ViewReader(data))
    return torch.load(reader, map_location="cpu", weights_only=True)


def _zstd():  # type: ignore[no-untyped-def]
    try:
        import zstandard
    except ImportError as exc:
        raise missing_dependency("zstandard", "zstd") from exc
    return zstandard


def check_codec(codec: str) -> str:
    if codec not in CODECS:
        raise ConfigError(f"unknown codec {codec!r}; choose one of {', '.join(CODECS)}")
    if codec == "zstd":
        _zstd()
    return codec


def compress(codec: str, data: memoryview) -> bytes | memoryview:
    if codec == "none":
        return data
    return _zstd().ZstdCompressor(level=3, threads=-1).compress(data)


def decompress(
    codec: str, data: bytes | bytearray | memoryview, raw_length: int | None
) -> bytes | bytearray | memoryview:
    if codec == "none":
        return data
    return _zstd().ZstdDecompressor().decompress(data, max_output_size=raw_length or 0)
