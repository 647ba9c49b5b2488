"""How one DCP item becomes bytes in a shard file, and back.

Items keep stock DCP's encoding (``torch.save`` of each tensor, raw bytes for BYTE_IO
items) so stock ``FileSystemReader`` / ``FsspecReader`` load uncompressed ckptstore
checkpoints. With ``codec="zstd"`` each item's bytes are zstd-compressed on their own
(stock readers cannot load those; the codec is recorded in the manifest).
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch

from ckptstore.errors import ConfigError, missing_dependency

__all__ = ["CODECS", "ItemInfo", "encode_item", "decode_tensor", "compress", "decompress"]

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


def encode_item(data: io.BytesIO | torch.Tensor) -> memoryview:
    """The stock DCP bytes of one item: raw bytes, or ``torch.save`` of a CPU tensor."""
    if isinstance(data, io.BytesIO):
        return data.getbuffer()
    tensor = data.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    buf = io.BytesIO()
    torch.save(tensor, buf)
    return buf.getbuffer()


def decode_tensor(data: bytes | bytearray | memoryview) -> torch.Tensor:
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


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
