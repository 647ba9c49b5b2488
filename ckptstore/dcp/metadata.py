"""DCP ``.metadata`` read without running untrusted code, and checked against its files.

``.metadata`` is a pickle (``torch.distributed.checkpoint.filesystem`` writes it with
``pickle.dump`` in torch 2.13, and so does ckptstore's writer). A plain ``pickle.loads``
of it runs whatever a crafted file asks for, so :func:`load_metadata` uses an unpickler
that resolves only the globals a real ``.metadata`` holds — checked against the pickles
of stock ``FileSystemWriter`` (with and without the ZStandard extension), ckptstore's
writer (codec ``none`` and ``zstd``) and FSDP2 / DTensor saves::

    torch.distributed.checkpoint.metadata   Metadata, TensorStorageMetadata,
                                            BytesStorageMetadata, ChunkStorageMetadata,
                                            TensorProperties, MetadataIndex, StorageMeta,
                                            _MEM_FORMAT_ENCODING (how memory formats pickle)
    torch.distributed.checkpoint.filesystem _StorageInfo
    torch                                   Size, and the dtypes (``torch.float32`` ...)
    torch.serialization                     _get_layout (how ``torch.strided`` pickles)
    pathlib                                 PosixPath & co. (stock ``StorageMeta.checkpoint_id``)

No builtins are needed (protocol >= 3 pickles bytes, sets are never stored). Sizes and
paths go through bounded constructors, so a small pickle cannot make huge copies by
repeating one memoised object. The result is then checked field by field
(:func:`validate`); anything else raises ``CorruptCheckpointError`` naming ``source``.

:func:`check_metadata` then checks every stored item against the files it lives in.
"""

from __future__ import annotations

import io
import pathlib
import pickle
from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as dcp_md
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptstore.errors import CorruptCheckpointError

__all__ = ["load_metadata", "validate", "check_metadata", "is_contained_name"]

_MAX_NDIM = 64  # torch's own limit on tensor dimensions
_MAX_PATH = 4096
_MAX_DEPTH = 32  # nesting of planner_data

_DCP_CLASSES = {
    "Metadata": Metadata,
    "TensorStorageMetadata": TensorStorageMetadata,
    "BytesStorageMetadata": BytesStorageMetadata,
    "ChunkStorageMetadata": ChunkStorageMetadata,
    "TensorProperties": TensorProperties,
    "MetadataIndex": MetadataIndex,
    "StorageMeta": StorageMeta,
    "_MEM_FORMAT_ENCODING": dcp_md._MEM_FORMAT_ENCODING,
}
_LAYOUTS = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}
_PATHS = ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")


def _size(dims: Any = ()) -> torch.Size:
    """``torch.Size`` for the unpickler: at most 64 dimensions."""
    dims = tuple(dims)
    if len(dims) > _MAX_NDIM:
        raise ValueError(f"a size with {len(dims)} dimensions")
    return torch.Size(dims)


def _layout(name: Any) -> torch.layout:
    if not isinstance(name, str) or name not in _LAYOUTS:
        raise ValueError(f"unknown layout {name!r}")
    return _LAYOUTS[name]


def _path_maker(name: str) -> Any:
    cls = getattr(pathlib, name)

    def make(*parts: Any) -> pathlib.PurePath:
        if len(parts) > _MAX_NDIM or not all(isinstance(p, str) for p in parts):
            raise ValueError("a path made of something other than a few strings")
        if sum(len(p) for p in parts) > _MAX_PATH:
            raise ValueError("a path longer than 4096 characters")
        return cls(*parts)  # type: ignore[no-any-return]

    return make


class _MetadataUnpickler(pickle.Unpickler):
    """Resolves only the globals listed in the module docstring."""

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch.distributed.checkpoint.metadata" and name in _DCP_CLASSES:
            return _DCP_CLASSES[name]
        if module == "torch.distributed.checkpoint.filesystem" and name == "_StorageInfo":
            return _StorageInfo
        if module == "torch":
            if name == "Size":
                return _size
            value = getattr(torch, name, None) if not name.startswith("_") else None
            if isinstance(value, torch.dtype):
                return value
        if module == "torch.serialization" and name == "_get_layout":
            return _layout
        if module in ("pathlib", "pathlib._local") and name in _PATHS:
            return _path_maker(name)
        raise pickle.UnpicklingError(f"global {module}.{name} is not part of DCP metadata")


def load_metadata(data: bytes, source: str) -> Metadata:
    """The DCP ``Metadata`` pickled in ``data`` (read from ``source``), without running
    any code but DCP's own metadata classes; ``CorruptCheckpointError`` for anything
    that is not a well-formed ``Metadata``."""
    try:
        obj = _MetadataUnpickler(io.BytesIO(data)).load()
    except Exception as exc:  # noqa: BLE001 - any failure of hostile bytes is the same error
        what = f"{type(exc).__name__}: {str(exc)[:200]}"
        raise _corrupt(source, f"cannot be read as DCP metadata ({what})") from None
    validate(obj, source)
    return obj  # type: ignore[no-any-return]


def _corrupt(source: str, what: str) -> CorruptCheckpointError:
    return CorruptCheckpointError(
        f"{source} {what}; the checkpoint's metadata is damaged or was not written by DCP. "
        "Restore the previous checkpoint."
    )


def _fields(obj: Any, cls: type, allowed: set[str], where: str, source: str) -> dict[str, Any]:
    """``obj``'s attributes, if it is exactly ``cls`` and has no field DCP does not define."""
    if type(obj) is not cls:
        raise _corrupt(source, f"has {type(obj).__name__} where {where} must be {cls.__name__}")
    state = getattr(obj, "__dict__", {})
    extra = set(state) - allowed
    if extra:
        raise _corrupt(source, f"has unknown fields {sorted(extra)} in {where}")
    return {name: getattr(obj, name, None) for name in allowed}


def _is_int(v: Any) -> bool:
    return type(v) is int


def _check_size(v: Any, where: str, source: str) -> None:
    if type(v) is not torch.Size or any(d < 0 for d in v):
        raise _corrupt(source, f"has a {type(v).__name__} where {where} must be a size >= 0")


def _check_tensor_md(md: TensorStorageMetadata, fqn: str, source: str) -> None:
    where = f"item {fqn!r}"
    f = _fields(md, TensorStorageMetadata, {"properties", "size", "chunks"}, where, source)
    p = _fields(
        f["properties"],
        TensorProperties,
        {"dtype", "layout", "requires_grad", "memory_format", "pin_memory"},
        f"{where}.properties",
        source,
    )
    if (
        not isinstance(p["dtype"], torch.dtype)
        or not isinstance(p["layout"], torch.layout)
        or not isinstance(p["memory_format"], torch.memory_format)
        or type(p["requires_grad"]) is not bool
        or type(p["pin_memory"]) is not bool
    ):
        raise _corrupt(source, f"has malformed tensor properties for {where}")
    _check_size(f["size"], f"{where}.size", source)
    size = f["size"]
    if type(f["chunks"]) is not list:
        raise _corrupt(source, f"has no chunk list for {where}")
    for chunk in f["chunks"]:
        c = _fields(chunk, ChunkStorageMetadata, {"offsets", "sizes"}, f"{where} chunk", source)
        _check_size(c["offsets"], f"{where} chunk offsets", source)
        _check_size(c["sizes"], f"{where} chunk sizes", source)
        if len(c["offsets"]) != len(size) or len(c["sizes"]) != len(size):
            raise _corrupt(source, f"has a chunk of {where} with the wrong number of dimensions")
        if any(o + s > d for o, s, d in zip(c["offsets"], c["sizes"], size, strict=True)):
            raise _corrupt(source, f"has a chunk of {where} outside the tensor's size {size}")


def _check_plain(value: Any, where: str, source: str) -> None:
    """``value`` is plain data (what DCP's planners store): no objects, bounded depth."""
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if depth > _MAX_DEPTH:
            raise _corrupt(source, f"has {where} nested deeper than {_MAX_DEPTH}")
        if v is None or type(v) in (bool, int, float, str, bytes):
            continue
        if type(v) in (list, tuple):
            stack.extend((x, depth + 1) for x in v)
        elif type(v) is dict:
            stack.extend((x, depth + 1) for kv in v.items() for x in kv)
        else:
            raise _corrupt(source, f"has a {type(v).__name__} in {where}")


def _check_storage_meta(sm: Any, source: str) -> None:
    if sm is None:
        return
    allowed = {"checkpoint_id", "save_id", "load_id", "modules"}
    f = _fields(sm, StorageMeta, allowed, "storage_meta", source)
    if not (f["checkpoint_id"] is None or isinstance(f["checkpoint_id"], str | pathlib.PurePath)):
        raise _corrupt(source, "has a malformed storage_meta.checkpoint_id")
    if any(f[k] is not None and type(f[k]) is not str for k in ("save_id", "load_id")):
        raise _corrupt(source, "has a malformed storage_meta id")
    modules = f["modules"]
    if type(modules) is not list or any(type(m) is not str for m in modules):
        raise _corrupt(source, "has a malformed storage_meta.modules")


def is_contained_name(name: Any) -> bool:
    """True for a relative, normalised '/'-separated name that stays inside its directory:
    no absolute path, no ``..`` / ``.`` / empty part, no backslash, NUL or drive."""
    if type(name) is not str or not name or len(name) > _MAX_PATH:
        return False
    if "\0" in name or "\\" in name or name.startswith("/") or ":" in name.split("/")[0]:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def _check_storage_info(index: Any, info: Any, source: str) -> None:
    idx = _fields(index, MetadataIndex, {"fqn", "offset", "index"}, "a storage key", source)
    if type(idx["fqn"]) is not str:
        raise _corrupt(source, "has a storage key whose fqn is not a string")
    if idx["offset"] is not None:
        _check_size(idx["offset"], f"the offset of {idx['fqn']!r}", source)
    if idx["index"] is not None and not _is_int(idx["index"]):
        raise _corrupt(source, f"has a malformed index hint for {idx['fqn']!r}")
    allowed = {"relative_path", "offset", "length", "transform_descriptors"}
    f = _fields(info, _StorageInfo, allowed, f"the storage of {idx['fqn']!r}", source)
    if not is_contained_name(f["relative_path"]):
        raise _corrupt(
            source, f"stores {idx['fqn']!r} at {f['relative_path']!r}, not a name inside it"
        )
    if not (_is_int(f["offset"]) and _is_int(f["length"])) or f["offset"] < 0 or f["length"] < 0:
        raise _corrupt(
            source,
            f"stores {idx['fqn']!r} at offset {f['offset']!r} length {f['length']!r} "
            "(must be whole numbers >= 0)",
        )
    td = f["transform_descriptors"]
    if td is not None and (type(td) not in (list, tuple) or any(type(t) is not str for t in td)):
        raise _corrupt(source, f"has malformed transform descriptors for {idx['fqn']!r}")


def validate(obj: Any, source: str) -> None:
    """Raise ``CorruptCheckpointError`` unless ``obj`` is a well-formed DCP ``Metadata``
    (every field of the type DCP gives it; offsets and lengths >= 0; names contained)."""
    allowed = {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"}
    f = _fields(obj, Metadata, allowed, "the top level", source)
    sdm = f["state_dict_metadata"]
    if type(sdm) is not dict:
        raise _corrupt(source, "has no state_dict_metadata dict")
    for fqn, md in sdm.items():
        if type(fqn) is not str:
            raise _corrupt(source, f"has an item key {fqn!r} that is not a string")
        if type(md) is BytesStorageMetadata:
            _fields(md, BytesStorageMetadata, set(), f"item {fqn!r}", source)
        else:
            _check_tensor_md(md, fqn, source)
    _check_plain(f["planner_data"], "planner_data", source)
    storage = f["storage_data"]
    if storage is not None:
        if type(storage) is not dict:
            raise _corrupt(source, "has storage_data that is not a dict")
        for index, info in storage.items():
            _check_storage_info(index, info, source)
    _check_storage_meta(f["storage_meta"], source)
    if f["version"] is not None and type(f["version"]) is not str:
        raise _corrupt(source, "has a version that is not a string")


def check_metadata(metadata: Metadata, files: Mapping[str, int], source: str) -> None:
    """Raise ``CorruptCheckpointError`` unless every stored item of ``metadata`` lies in a
    file of ``files`` (name -> size in bytes): a contained name present there, and
    ``0 <= offset``, ``0 <= length``, ``offset + length <= size``."""
    for index, info in (metadata.storage_data or {}).items():
        fqn = getattr(index, "fqn", index)
        path: Any = getattr(info, "relative_path", None)
        offset: Any = getattr(info, "offset", None)
        length: Any = getattr(info, "length", None)
        if not is_contained_name(path):
            raise _corrupt(source, f"stores {fqn!r} at {path!r}, not a name inside it")
        if path not in files:
            raise _corrupt(source, f"stores {fqn!r} in {path!r}, which the checkpoint lacks")
        if not (_is_int(offset) and _is_int(length)) or offset < 0 or length < 0:
            raise _corrupt(source, f"stores {fqn!r} at a malformed range")
        if offset + length > files[path]:
            raise _corrupt(
                source,
                f"stores {fqn!r} at bytes [{offset}, {offset + length}) of {path!r}, past its "
                f"end ({files[path]} bytes)",
            )
