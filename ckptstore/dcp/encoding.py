"""How one DCP item becomes bytes in a shard file (reading them back: ``dcp.decoding``).

Items keep stock DCP's encoding (``torch.save`` of each tensor, raw bytes for BYTE_IO
items) so stock ``FileSystemReader`` / ``FsspecReader`` load ckptstore checkpoints; a tensor
is written as torch writes it with ``torch.serialization.set_crc32_options(False)``: the
zip's CRC-32 fields are 0 (``torch.load`` ignores them; the manifest's CRC32C covers every
byte). A codec (``ckptstore.engine.codecs``) then encodes those bytes, item by item; with
``codec="zstd"`` each item is one zstd frame of its own: the format of DCP's
``ZStandard`` stream extension, which the writer names in ``.metadata`` so stock readers
decompress them too (the codec is also recorded in the manifest).

A conjugate or negative view is stored resolved (its values as plain bytes), so every
stored tensor's bytes are its values.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from typing import IO, Any

import torch

from ckptstore.engine.manifest import Span

__all__ = [
    "ItemInfo",
    "write_item",
    "cpu_item",
    "payload_of",
    "payload_lead",
    "PAYLOAD_MIN",
    "encode_item",
    "small_item_bytes",
]


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
    span: Span | None = None  # the tensor's raw bytes within the item (see ItemSink)


#: Smallest tensor whose raw bytes are recorded as a span and read straight into place;
#: below it, one read of the whole item costs less than the extra bookkeeping.
PAYLOAD_MIN = 64 * 1024


def cpu_item(data: io.BytesIO | torch.Tensor) -> io.BytesIO | torch.Tensor:
    """``data`` as ``write_item`` saves it: a detached CPU tensor that is not a view into
    a larger storage (or the bytes)."""
    if isinstance(data, io.BytesIO):
        return data
    tensor = data.detach()
    if tensor.device.type != "cpu":
        tensor = tensor.cpu()
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()  # its values, in storage of its own
    if tensor.untyped_storage().nbytes() != tensor.nbytes:
        # torch.save writes a view's whole storage; store only the view (as stock DCP does).
        tensor = tensor.clone()
    return tensor


def payload_of(data: io.BytesIO | torch.Tensor) -> tuple[int, int] | None:
    """(address, nbytes) of the storage ``torch.save(data)`` writes as one record, if
    ``data`` is a dense CPU tensor that is exactly its storage and at least PAYLOAD_MIN."""
    if not isinstance(data, torch.Tensor) or data.device.type != "cpu":
        return None
    nbytes = data.numel() * data.element_size()
    if (
        nbytes < PAYLOAD_MIN
        or not data.is_contiguous()
        or data.storage_offset() != 0
        or data.untyped_storage().nbytes() != nbytes
    ):
        return None
    return data.data_ptr(), nbytes


def payload_lead(data: io.BytesIO | torch.Tensor) -> int | None:
    """How many bytes ``write_item`` writes before ``data``'s storage bytes (a ``cpu_item``
    result), where it writes them from its frame; None otherwise."""
    if not isinstance(data, torch.Tensor) or not _crc_free_ok():
        return None
    frame = _frame(data)
    return None if frame is None else len(frame.head)


def write_item(data: io.BytesIO | torch.Tensor, sink: IO[bytes] | Any) -> None:
    """Write the stock DCP bytes of one item into ``sink``: raw bytes, or ``torch.save``
    streamed (~40 records, each a call into ``sink.write``; the writer gathers small items
    through ``small_item_bytes`` instead)."""
    if isinstance(data, io.BytesIO):
        sink.write(data.getbuffer())
        return
    tensor = cpu_item(data)
    assert isinstance(tensor, torch.Tensor)
    _save_tensor(tensor, sink)


def small_item_bytes(data: io.BytesIO | torch.Tensor) -> bytes | memoryview | None:
    """The stock DCP bytes of ``data`` (a ``cpu_item`` result) if it is small (raw bytes,
    or a tensor whose storage is, under PAYLOAD_MIN), built in memory without a file
    object; None for a larger item, which is streamed through an ``ItemSink``.

    A save of a model's state has a few hundred such items (biases, norms, optimizer step
    counters, hyperparameters); a plain tensor's bytes are joined from its cached frame.
    """
    if isinstance(data, io.BytesIO):
        raw = data.getbuffer()
        return raw if len(raw) < PAYLOAD_MIN else None
    if data.untyped_storage().nbytes() >= PAYLOAD_MIN:
        return None
    frame = _frame(data) if _crc_free_ok() else None
    if frame is None:
        return encode_item(data)
    return b"".join((frame.head, _storage_bytes(data), frame.tail))


def encode_item(data: io.BytesIO | torch.Tensor) -> memoryview:
    """The stock DCP bytes of one item, in memory (for codecs that need the whole item)."""
    if isinstance(data, io.BytesIO):
        return data.getbuffer()
    tensor = cpu_item(data)
    assert isinstance(tensor, torch.Tensor)
    buf = io.BytesIO()
    _save_tensor(tensor, buf)
    return buf.getbuffer()


def _save_tensor(tensor: torch.Tensor, sink: IO[bytes] | Any) -> None:
    """``torch.save(tensor, sink)`` without the zip's CRC-32 of each record.

    torch computes a CRC-32 over every byte it saves (~4 GB/s here, with the GIL held: 9 ms
    of a 37 MiB state's save, 65 ms of a 256 MiB one, on the thread training needs), and
    every byte of a ckptstore item is already under the manifest's CRC32C. torch's own
    switch (``set_crc32_options``) is process-wide: a user's ``torch.save`` in another
    thread would lose its CRC-32 too. So the writer is built here with it off, through the
    private names ``torch.save`` itself uses; where they moved, ``torch.save`` it is.

    Without the CRC-32, what torch writes around a tensor's storage depends only on the
    tensor's dtype, shape, strides and storage size (``_Frame``): a plain tensor is written
    as its frame's head, its storage's bytes and the frame's tail (three writes instead of
    a pickler and ~20 records per item: the bytes are the same).
    """
    if not _crc_free_ok():
        torch.save(tensor, sink)
        return
    frame = _frame(tensor)
    if frame is None:
        _save_crc_free(tensor, sink)
        return
    sink.write(frame.head)
    sink.write(_storage_bytes(tensor))
    sink.write(frame.tail)


def _save_crc_free(tensor: torch.Tensor, sink: IO[bytes] | Any) -> None:
    from torch.serialization import DEFAULT_PROTOCOL, _get_storage_alignment, _save

    writer = torch._C.PyTorchFileWriter(sink, False, _get_storage_alignment())
    _save(tensor, writer, pickle, DEFAULT_PROTOCOL, False)
    writer.write_end_of_file()


def _storage_bytes(tensor: torch.Tensor) -> memoryview:
    """The bytes of ``tensor``'s storage, without a copy."""
    flat = torch.empty(0, dtype=torch.uint8).set_(tensor.untyped_storage())
    return flat.numpy().data


@dataclass(frozen=True)
class _Frame:
    """What ``_save_crc_free`` writes before (``head``) and after (``tail``) a tensor's
    storage bytes."""

    head: bytes
    tail: bytes


class _FrameSink(io.RawIOBase):
    """Takes what ``_save_crc_free`` writes under ``torch.serialization.skip_data``
    (thread-local): the writes before the storage, one seek over it, the writes after."""

    def __init__(self, nbytes: int) -> None:
        super().__init__()
        self.parts: list[bytearray] = [bytearray()]
        self.nbytes = nbytes
        self.ok = True
        self._pos = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        self.parts[-1] += view
        self._pos += len(view)
        return len(view)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        target = {io.SEEK_SET: offset, io.SEEK_CUR: self._pos + offset}.get(whence, -1)
        # Anything but one skip of exactly the storage: no frame.
        self.ok = self.ok and target == self._pos + self.nbytes and len(self.parts) == 1
        self.parts.append(bytearray())
        self._pos = target
        return self._pos

    def tell(self) -> int:
        return self._pos


#: (dtype, shape, strides, storage bytes) -> its frame; a model has a few dozen shapes.
_FRAMES: dict[tuple[Any, ...], _Frame] = {}
_FRAMES_MAX = 4096


def _frame(tensor: torch.Tensor) -> _Frame | None:
    """The frame of a plain dense CPU tensor whose storage is exactly its bytes, from
    offset 0 (what ``cpu_item`` leaves of most); None for anything else."""
    nbytes = tensor.untyped_storage().nbytes()
    if (
        type(tensor) is not torch.Tensor
        or tensor.layout != torch.strided
        or tensor.device.type != "cpu"
        or tensor.is_quantized
        or tensor.requires_grad
        or tensor.is_conj()
        or tensor.is_neg()
        or tensor.__dict__
        or tensor.storage_offset() != 0
        or nbytes != tensor.nbytes
        or nbytes == 0
    ):
        return None
    key = (tensor.dtype, tuple(tensor.shape), tensor.stride(), nbytes)
    frame = _FRAMES.get(key)
    if frame is None:
        sink = _FrameSink(nbytes)
        with torch.serialization.skip_data():
            _save_crc_free(tensor, sink)
        if not sink.ok or len(sink.parts) != 2:
            return None
        if len(_FRAMES) >= _FRAMES_MAX:
            _FRAMES.clear()
        frame = _FRAMES[key] = _Frame(bytes(sink.parts[0]), bytes(sink.parts[1]))
    return frame


_CRC_FREE: list[bool] = []  # [whether _save_tensor's writer works with this torch], once known


def _crc_free_ok() -> bool:
    """Whether torch's private writer names are where ``_save_tensor`` expects them, what
    it writes loads back, and a frame around the bytes is what it writes (checked once
    per process; any drift in torch's internals: plain ``torch.save``)."""
    if not _CRC_FREE:
        probe = torch.arange(24.0).reshape(4, 6)
        try:
            whole = io.BytesIO()
            _save_crc_free(probe, whole)
            framed = _frame(probe)
            ok = framed is not None and whole.getvalue() == b"".join(
                (framed.head, _storage_bytes(probe), framed.tail)
            )
            whole.seek(0)
            ok = ok and torch.equal(torch.load(whole, weights_only=True), probe)
        except Exception:  # noqa: BLE001 - any drift in torch's internals: torch.save
            ok = False
        _FRAMES.clear()
        _CRC_FREE.append(ok)
    return _CRC_FREE[0]
