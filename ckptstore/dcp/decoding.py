"""How the bytes of one stored tensor item become a tensor again (``dcp.encoding`` writes them).

Decoding honours whatever ``torch.load`` honours: the fast path takes only a plain dense
tensor record (no conj / neg / other metadata, no hooks) and returns it as a view of the
bytes read, without a copy; anything else goes to ``torch.load(weights_only=True)``.
Items ckptstore wrote carry no zip CRC-32 (``dcp.encoding``); the manifest's CRC32C,
checked before decoding, covers every byte.
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import zipfile
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import IO, Any, cast

import torch

__all__ = ["decode_tensor"]


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
    """The tensor ``torch.save`` wrote into ``data``: a view of ``data`` when it can be.

    A plain dense tensor (what DCP saves) comes back as ``torch.frombuffer`` of its record,
    with the saved size, stride and offset: no copy, and it aliases ``data`` (the caller
    copies it into its target). Anything else (a read-only buffer, another byte order,
    several storages, a quantized or sparse tensor) goes through ``torch.load``, which
    copies the record into a new storage.
    """
    view = memoryview(data).cast("B")
    if not view.readonly:
        tensor = _tensor_view(view)
        if tensor is not None:
            return tensor
    reader = cast(IO[bytes], _ViewReader(view))
    return torch.load(reader, map_location="cpu", weights_only=True)


class _NotPlain(Exception):
    """The pickle holds something other than one plain tensor: use torch.load."""


@dataclass(frozen=True)
class _Storage:
    dtype: torch.dtype
    key: str
    numel: int


@dataclass(frozen=True)
class _TensorRecord:
    storage: _Storage
    offset: int
    size: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor_v2(
    storage: Any,
    offset: int,
    size: Any,
    stride: Any,
    requires_grad: Any = False,
    backward_hooks: Any = None,
    metadata: Any = None,
    *rest: Any,
) -> _TensorRecord:
    # ``metadata`` carries torch's conj / neg bits (and whatever torch adds): refuse any.
    # requires_grad does not matter: DCP copies the values into its own target.
    if not isinstance(storage, _Storage) or backward_hooks or metadata or rest:
        raise _NotPlain
    return _TensorRecord(storage, int(offset), tuple(size), tuple(stride))


class _TensorUnpickler(pickle.Unpickler):
    """Reads the ``data.pkl`` of ``torch.save(tensor)`` without building anything.

    Hand-written because torch offers no public way to load a saved tensor as a view of
    bytes already in memory (``torch.load(mmap=True)`` needs a file name); it admits only
    what a dense tensor's pickle holds and refuses everything else (``_NotPlain``).
    """

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild_tensor_v2
        if (module, name) == ("collections", "OrderedDict"):
            return OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return name
        raise _NotPlain

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise _NotPlain
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, str):
            raise _NotPlain
        try:
            from torch.storage import _get_dtype_from_pickle_storage_type

            dtype = _get_dtype_from_pickle_storage_type(storage_type)
        except (ImportError, KeyError):
            raise _NotPlain from None
        return _Storage(dtype, str(key), int(numel))


def _tensor_view(view: memoryview) -> torch.Tensor | None:
    """``torch.save(tensor)``'s bytes in ``view`` as a tensor aliasing ``view``, or None."""
    try:
        with zipfile.ZipFile(cast(IO[bytes], _ViewReader(view))) as zf:
            names = zf.namelist()
            pkl = next((n for n in names if n.endswith("/data.pkl")), None)
            if pkl is None:
                return None
            root = pkl[: -len("data.pkl")]
            order = f"{root}byteorder"
            if order in names and _small_record(view, zf.getinfo(order)) != sys.byteorder.encode():
                return None
            pickled = _small_record(view, zf.getinfo(pkl))
            if pickled is None:
                return None
            record = _TensorUnpickler(io.BytesIO(pickled)).load()
            if not isinstance(record, _TensorRecord):
                return None
            storage = record.storage
            info = zf.getinfo(f"{root}data/{storage.key}")
    except (_NotPlain, KeyError, ValueError, zipfile.BadZipFile, pickle.UnpicklingError):
        return None
    itemsize = torch.empty((), dtype=storage.dtype).element_size()
    nbytes = storage.numel * itemsize
    if info.file_size != nbytes or nbytes == 0:
        return None
    start = _record_start(view, info)
    last = record.offset + sum((n - 1) * st for n, st in zip(record.size, record.stride))
    if start is None or start + nbytes > len(view) or record.offset < 0:
        return None
    if min(record.size, default=1) < 1:
        return None
    if last >= storage.numel or min(record.stride, default=0) < 0:
        return None
    flat = torch.frombuffer(view, dtype=storage.dtype, count=storage.numel, offset=start)
    return flat.as_strided(record.size, record.stride, record.offset)


def _record_start(view: memoryview, info: zipfile.ZipInfo) -> int | None:
    """Where a stored (uncompressed) record's bytes start in ``view``, from its local
    header; None if the header is not one."""
    header = bytes(view[info.header_offset : info.header_offset + 30])
    if info.compress_type != zipfile.ZIP_STORED or len(header) < 30:
        return None
    if header[:4] != b"PK\x03\x04":
        return None
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def _small_record(view: memoryview, info: zipfile.ZipInfo) -> bytes | None:
    """A small record's bytes (``data.pkl``, ``byteorder``), its zip CRC-32 checked where
    it has one: ckptstore writes none (``_save_tensor``), and ``zipfile`` would refuse
    such a record."""
    start = _record_start(view, info)
    if start is None or info.file_size > 1 << 20 or start + info.file_size > len(view):
        return None
    data = bytes(view[start : start + info.file_size])
    if info.CRC and zlib.crc32(data) != info.CRC:
        return None
    return data
