"""A loaded DCP ``Metadata`` checked field by field, before anything trusts it.

:func:`validate` refuses, as ``CorruptCheckpointError`` naming the source, any object that
is not exactly what DCP pickles: every field of the type DCP gives it, offsets and lengths
>= 0, names contained, planner data plain and a tree, and no item metadata or chunk list
shared between items. Linear in the pickle's size (each distinct object checked once: a
pickle's memo can name one object many times at two bytes a time). Loading is
:mod:`ckptstore.dcp.metadata`'s; checking the items against their files is
:mod:`ckptstore.dcp.metadata_bounds`'.
"""

from __future__ import annotations

import pathlib
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)

from ckptstore.engine.manifest import is_contained_name
from ckptstore.errors import CorruptCheckpointError, torch_name

#: DCP's record of where an item is stored (torch's private ``_StorageInfo``): imported
#: here once, for the checks, the unpickler and the writers that make stock ``Metadata``.
with torch_name("DCP's _StorageInfo (torch.distributed.checkpoint.filesystem)"):
    from torch.distributed.checkpoint.filesystem import _StorageInfo as StorageInfo

__all__ = [
    "DAMAGED",
    "MAX_STRIDE",
    "StorageInfo",
    "corrupt_error",
    "is_int",
    "item_name",
    "validate",
]

_MAX_DEPTH = 32  # nesting of planner_data
#: A stride at least this large is no stride any tensor can have.
MAX_STRIDE = 1 << 63

DAMAGED = (
    "; the checkpoint's metadata is damaged or was not written by DCP. Restore the previous "
    "checkpoint."
)


def corrupt_error(source: str, what: str) -> CorruptCheckpointError:
    """The error for metadata of ``source`` that ``what`` (e.g. "has a malformed ...")."""
    return CorruptCheckpointError(f"{source} {what}{DAMAGED}")


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
        or not all(is_int(s) and 0 <= s < MAX_STRIDE for s in strides)
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
