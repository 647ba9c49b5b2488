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

Layouts across torch releases: torch 2.15 added ``TensorProperties.strides`` (each saved
tensor's strides, a sixth pickled field), which torch 2.13 / 2.14 cannot unpickle ("too
many values to unpack"). This module reads both layouts on every supported torch (the
strides checked: a tuple of ints, one per dimension of the item; kept as an attribute
where this torch's class has no field for them, where nothing reads them), and
:func:`dump_metadata` writes the oldest layout whenever that loses nothing: an item whose
strides are the contiguous ones of its size (what every DCP save of a contiguous tensor
records) is pickled exactly as torch 2.13 pickles it, so ckptstore's checkpoints load under
every supported torch, with stock readers too.

:func:`~ckptstore.dcp.metadata_bounds.check_metadata` then checks every stored item
against the files it lives in.
"""

from __future__ import annotations

import copyreg
import dataclasses
import io
import pathlib
import pickle
import re
from typing import Any

import torch
from torch.distributed.checkpoint import metadata as dcp_md
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptstore.engine.manifest import is_contained_name, version_text
from ckptstore.errors import CorruptCheckpointError, NewerFormatError, torch_name

#: DCP's record of where an item is stored (torch's private ``_StorageInfo``): imported
#: here once, for the unpickler and for the writers that make stock ``Metadata``.
with torch_name("DCP's _StorageInfo (torch.distributed.checkpoint.filesystem)"):
    from torch.distributed.checkpoint.filesystem import _StorageInfo as StorageInfo

__all__ = [
    "StorageInfo",
    "dump_metadata",
    "load_metadata",
    "validate",
    "corrupt_error",
    "is_int",
    "item_name",
]

_MAX_NDIM = 64  # torch's own limit on tensor dimensions
_MAX_PATH = 4096
_MAX_DEPTH = 32  # nesting of planner_data

with torch_name("DCP's _MEM_FORMAT_ENCODING (torch.distributed.checkpoint.metadata)"):
    _MEM_FORMAT_ENCODING = dcp_md._MEM_FORMAT_ENCODING
#: torch >= 2.15 records each tensor's strides in ``TensorProperties`` (a sixth field).
_HAS_STRIDES = "strides" in {f.name for f in dataclasses.fields(TensorProperties)}
_MAX_STRIDE = 1 << 63


class _AnyLayoutProperties(TensorProperties):
    """What the unpickler makes for a pickled ``TensorProperties``: it takes the five
    fields of torch <= 2.14 or the six of torch >= 2.15 on any torch, checks the strides'
    form (their count against the item's size is :func:`validate`'s), and becomes a plain
    ``TensorProperties`` (the class swap keeps ``validate``'s exact-type checks and what
    DCP's planners see unchanged). Where this torch's class has no ``strides`` field they
    stay an attribute of the instance, which no code of that torch reads."""

    def __setstate__(self, state: Any) -> None:
        if type(state) is not tuple or len(state) not in (5, 6):
            raise ValueError("tensor properties that are not a tuple of 5 or 6 fields")
        strides = state[5] if len(state) == 6 else None
        if strides is not None and (
            type(strides) is not tuple
            or len(strides) > _MAX_NDIM
            or not all(is_int(s) and 0 <= s < _MAX_STRIDE for s in strides)
        ):
            raise ValueError(f"tensor strides {strides!r:.80} are not a tuple of sizes")
        TensorProperties.__setstate__(self, state[:5])
        self.__class__ = TensorProperties  # type: ignore[assignment]
        self.strides = strides


_DCP_CLASSES = {
    "Metadata": Metadata,
    "TensorStorageMetadata": TensorStorageMetadata,
    "BytesStorageMetadata": BytesStorageMetadata,
    "ChunkStorageMetadata": ChunkStorageMetadata,
    "TensorProperties": _AnyLayoutProperties,
    "MetadataIndex": MetadataIndex,
    "StorageMeta": StorageMeta,
    "_MEM_FORMAT_ENCODING": _MEM_FORMAT_ENCODING,
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
            return StorageInfo
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


def load_metadata(data: bytes, source: str, written_by: str = "") -> Metadata:
    """The DCP ``Metadata`` pickled in ``data`` (read from ``source``), without running
    any code but DCP's own metadata classes; ``CorruptCheckpointError`` for anything
    that is not a well-formed ``Metadata``, or ``NewerFormatError`` if so and
    ``written_by`` (the torch release the manifest says wrote it) is newer than this one."""
    try:
        try:
            obj = _MetadataUnpickler(io.BytesIO(data)).load()
        except Exception as exc:  # noqa: BLE001 - any failure of hostile bytes is the same error
            what = f"{type(exc).__name__}: {str(exc)[:200]}"
            raise corrupt_error(source, f"cannot be read as DCP metadata ({what})") from None
        validate(obj, source)
    except CorruptCheckpointError as exc:
        newer = _newer_torch_error(source, written_by, exc)
        if newer is not None:
            raise newer from None
        raise
    return obj  # type: ignore[no-any-return]


def _release(version: str) -> tuple[int, int] | None:
    m = re.match(r"(\d{1,6})\.(\d{1,6})", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _newer_torch_error(source: str, written_by: str, exc: Exception) -> NewerFormatError | None:
    """The error for ``source``'s metadata that this torch refused with ``exc``, if the
    torch release that wrote it (``written_by``) is a newer minor than this one; else None
    (the refusal stands as damage)."""
    theirs, ours = _release(written_by), _release(torch.__version__)
    if theirs is None or ours is None or theirs <= ours:
        return None
    release = f"{theirs[0]}.{theirs[1]}"
    what = str(exc).removeprefix(f"{source} ").removesuffix(_DAMAGED)  # not damage: newer
    return NewerFormatError(
        f"{source} was written by torch {version_text(written_by)}; this torch is "
        f"{torch.__version__}, which cannot read its layout (it {what[:300]}). Load it under "
        f"torch>={release}, or rewrite it there for older releases with ckptstore-tool "
        "convert SRC DST --to dcp (ckptstore writes the oldest layout that loses nothing)"
    )


_DAMAGED = (
    "; the checkpoint's metadata is damaged or was not written by DCP. Restore the previous "
    "checkpoint."
)


def corrupt_error(source: str, what: str) -> CorruptCheckpointError:
    """The error for metadata of ``source`` that ``what`` (e.g. "has a malformed ...")."""
    return CorruptCheckpointError(f"{source} {what}{_DAMAGED}")


def _fields(obj: Any, cls: type, allowed: set[str], where: Any, source: str) -> dict[str, Any]:
    """``obj``'s attributes, if it is exactly ``cls`` and has no field DCP does not define
    (``where``: a string, or a callable making it: messages are built only when needed)."""
    if type(obj) is not cls:
        what = where() if callable(where) else where
        raise corrupt_error(source, f"has {type(obj).__name__} where {what} must be {cls.__name__}")
    state = getattr(obj, "__dict__", {})
    extra = set(state) - allowed
    if extra:
        what = where() if callable(where) else where
        raise corrupt_error(source, f"has unknown fields {sorted(extra)[:8]} in {what}")
    return {name: getattr(obj, name, None) for name in allowed}


def is_int(v: Any) -> bool:
    """Whether ``v`` is exactly an ``int`` (not a bool, nor a subclass a pickle made)."""
    return type(v) is int


def item_name(fqn: Any) -> str:
    """An item's name for a message: quoted, at most 200 characters of it."""
    return f"{fqn!r:.200}"


def _check_size(v: Any, where: str, source: str) -> None:
    if type(v) is not torch.Size or any(d < 0 for d in v):
        raise corrupt_error(source, f"has a {type(v).__name__} where {where} must be a size >= 0")


class _Seen:
    """What :func:`validate` has checked, by object identity. A pickle can name one object
    many times at two bytes a time (its memo), so a check that walked every reference
    would cost far more than the pickle's size (a 6.8 KB file could make ~10^9 visits).
    Each distinct object is checked once instead, and a container DCP never shares (an
    item's metadata, a chunk list) is refused when it is named twice: whatever reads the
    metadata later (DCP's planners) walks references, not objects."""

    def __init__(self) -> None:
        self.ids: set[int] = set()

    def first(self, obj: Any) -> bool:
        """True the first time ``obj`` is seen."""
        key = id(obj)
        if key in self.ids:
            return False
        self.ids.add(key)
        return True


def _check_tensor_md(md: TensorStorageMetadata, fqn: str, source: str, seen: _Seen) -> None:
    where = lambda: f"item {item_name(fqn)}"  # noqa: E731 - built only for a message
    f = _fields(md, TensorStorageMetadata, {"properties", "size", "chunks"}, where, source)
    p = _fields(
        f["properties"],
        TensorProperties,
        {"dtype", "layout", "requires_grad", "memory_format", "pin_memory", "strides"},
        lambda: f"{where()}.properties",
        source,
    )
    if (
        not isinstance(p["dtype"], torch.dtype)
        or not isinstance(p["layout"], torch.layout)
        or not isinstance(p["memory_format"], torch.memory_format)
        or type(p["requires_grad"]) is not bool
        or type(p["pin_memory"]) is not bool
    ):
        raise corrupt_error(source, f"has malformed tensor properties for {where()}")
    _check_size(f["size"], "an item's size", source)
    size = f["size"]
    strides = p["strides"]
    if strides is not None and (
        type(strides) is not tuple
        or len(strides) != len(size)
        or not all(is_int(s) and 0 <= s < _MAX_STRIDE for s in strides)
    ):
        raise corrupt_error(
            source, f"has strides {strides!r:.80} for {where()} of size {tuple(size)}"
        )
    chunks = f["chunks"]
    if type(chunks) is not list:
        raise corrupt_error(source, f"has no chunk list for {where()}")
    if not seen.first(chunks):
        raise corrupt_error(source, f"shares the chunk list of {where()} with another item")
    for chunk in chunks:
        c = _fields(chunk, ChunkStorageMetadata, {"offsets", "sizes"}, "a chunk", source)
        _check_size(c["offsets"], "a chunk's offsets", source)
        _check_size(c["sizes"], "a chunk's sizes", source)
        if len(c["offsets"]) != len(size) or len(c["sizes"]) != len(size):
            raise corrupt_error(
                source, f"has a chunk of {where()} with the wrong number of dimensions"
            )
        if any(o + s > d for o, s, d in zip(c["offsets"], c["sizes"], size, strict=True)):
            raise corrupt_error(
                source, f"has a chunk of {where()} outside the tensor's size {size}"
            )


def _check_plain(value: Any, where: str, source: str) -> None:
    """``value`` is plain data (what DCP's planners store: each item's path, a tuple of
    keys): no objects, nested at most ``_MAX_DEPTH`` deep, and a tree: a non-empty
    container the pickle names twice (its memo makes that two bytes, and a chain of them
    ~10^9 references from a few KB) is refused, so this walk and every later one (DCP's
    planners follow those paths) is linear in the pickle's size."""
    seen: set[int] = set()
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if v is None or type(v) in (bool, int, float, str, bytes):
            continue
        if type(v) not in (list, tuple, dict):
            raise corrupt_error(source, f"has a {type(v).__name__} in {where}")
        if depth > _MAX_DEPTH:
            raise corrupt_error(source, f"has {where} nested deeper than {_MAX_DEPTH}")
        if not v:
            continue  # an empty one holds nothing (and () is one object for all)
        if id(v) in seen:
            raise corrupt_error(source, f"names one container of {where} more than once")
        seen.add(id(v))
        children = [x for kv in v.items() for x in kv] if type(v) is dict else v
        stack.extend((x, depth + 1) for x in children)


def _check_storage_meta(sm: Any, source: str) -> None:
    if sm is None:
        return
    allowed = {"checkpoint_id", "save_id", "load_id", "modules"}
    f = _fields(sm, StorageMeta, allowed, "storage_meta", source)
    if not (f["checkpoint_id"] is None or isinstance(f["checkpoint_id"], str | pathlib.PurePath)):
        raise corrupt_error(source, "has a malformed storage_meta.checkpoint_id")
    if any(f[k] is not None and type(f[k]) is not str for k in ("save_id", "load_id")):
        raise corrupt_error(source, "has a malformed storage_meta id")
    modules = f["modules"]
    if type(modules) is not list or any(type(m) is not str for m in modules):
        raise corrupt_error(source, "has a malformed storage_meta.modules")


def _check_storage_info(index: Any, info: Any, source: str, seen: _Seen) -> None:
    idx = _fields(index, MetadataIndex, {"fqn", "offset", "index"}, "a storage key", source)
    fqn = idx["fqn"]
    if type(fqn) is not str:
        raise corrupt_error(source, "has a storage key whose fqn is not a string")
    if idx["offset"] is not None:
        _check_size(idx["offset"], "a storage key's offset", source)
    if idx["index"] is not None and not is_int(idx["index"]):
        raise corrupt_error(source, f"has a malformed index hint for {item_name(fqn)}")
    if not seen.first(info):
        return  # one stored item named by two keys: checked once
    allowed = {"relative_path", "offset", "length", "transform_descriptors"}
    f = _fields(info, StorageInfo, allowed, lambda: f"the storage of {item_name(fqn)}", source)
    path = f["relative_path"]
    if seen.first(path) and not is_contained_name(path):
        raise corrupt_error(
            source, f"stores {item_name(fqn)} at {path!r:.200}, not a name inside it"
        )
    if not (is_int(f["offset"]) and is_int(f["length"])) or f["offset"] < 0 or f["length"] < 0:
        raise corrupt_error(
            source,
            f"stores {item_name(fqn)} at offset {f['offset']!r:.40} length {f['length']!r:.40} "
            "(must be whole numbers >= 0)",
        )
    td = f["transform_descriptors"]
    if td is not None and seen.first(td):
        if type(td) not in (list, tuple) or len(td) > 16 or any(type(t) is not str for t in td):
            raise corrupt_error(source, f"has malformed transform descriptors for {item_name(fqn)}")


def validate(obj: Any, source: str) -> None:
    """Raise ``CorruptCheckpointError`` unless ``obj`` is a well-formed DCP ``Metadata``
    (every field of the type DCP gives it; offsets and lengths >= 0; names contained; no
    item metadata or chunk list shared between items). Linear in the pickle's size: each
    distinct object is checked once (see ``_Seen``)."""
    allowed = {"state_dict_metadata", "planner_data", "storage_data", "storage_meta", "version"}
    f = _fields(obj, Metadata, allowed, "the top level", source)
    seen = _Seen()
    sdm = f["state_dict_metadata"]
    if type(sdm) is not dict:
        raise corrupt_error(source, "has no state_dict_metadata dict")
    for fqn, md in sdm.items():
        if type(fqn) is not str:
            raise corrupt_error(source, f"has an item key {fqn!r:.200} that is not a string")
        if not seen.first(md):
            raise corrupt_error(
                source, f"shares the metadata of item {item_name(fqn)} with another"
            )
        if type(md) is BytesStorageMetadata:
            _fields(md, BytesStorageMetadata, set(), "an object item", source)
        else:
            _check_tensor_md(md, fqn, source, seen)
    _check_plain(f["planner_data"], "planner_data", source)
    storage = f["storage_data"]
    if storage is not None:
        if type(storage) is not dict:
            raise corrupt_error(source, "has storage_data that is not a dict")
        for index, info in storage.items():
            _check_storage_info(index, info, source, seen)
    _check_storage_meta(f["storage_meta"], source)
    if f["version"] is not None and type(f["version"]) is not str:
        raise corrupt_error(source, "has a version that is not a string")


def _contiguous_strides(size: torch.Size) -> tuple[int, ...]:
    """The strides of a contiguous tensor of ``size`` (as ``torch.empty(size).stride()``)."""
    strides = []
    step = 1
    for d in reversed(size):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def dump_metadata(metadata: Metadata) -> bytes:
    """``metadata`` pickled as stock DCP pickles it, in the oldest layout that loses
    nothing: the tensor properties of an item whose strides are unset or the contiguous
    ones of its size are written with torch 2.13's five fields (torch 2.13 / 2.14 cannot
    unpickle a sixth), any others with torch 2.15's six (see the module docstring)."""
    if not _HAS_STRIDES:
        return pickle.dumps(metadata)  # this torch pickles the five fields only
    oldest = set()
    for md in metadata.state_dict_metadata.values():
        if isinstance(md, TensorStorageMetadata):
            strides = getattr(md.properties, "strides", None)
            if strides is None or tuple(strides) == _contiguous_strides(md.size):
                oldest.add(id(md.properties))

    def reduce(props: TensorProperties) -> Any:
        state = props.__getstate__()  # type: ignore[attr-defined]
        if id(props) in oldest:
            state = state[:5]
        return copyreg.__newobj__, (TensorProperties,), state  # type: ignore[attr-defined]

    buf = io.BytesIO()
    pickler = pickle.Pickler(buf, pickle.DEFAULT_PROTOCOL)
    # Only TensorProperties are reduced here; every other object pickles as pickle.dumps does.
    pickler.dispatch_table = {**copyreg.dispatch_table, TensorProperties: reduce}
    pickler.dump(metadata)
    return buf.getvalue()
