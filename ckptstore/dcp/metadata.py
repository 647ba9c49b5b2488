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
(:func:`~ckptstore.dcp.metadata_checks.validate`); anything else raises
``CorruptCheckpointError`` naming ``source``.

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

At a save, :func:`build_indexes` makes both indexes a step commits besides its shard files
from every rank's ``WriteResult`` (each one's ``storage_data`` an ``ItemInfo``,
``dcp.encoding``): ckptstore's ``Manifest`` (files with their sizes and CRC32Cs, one range
per item, for verified reads and ``ckptstore-tool``) and DCP's stock ``Metadata``,
pickled by :func:`dump_metadata`, with a stock ``_StorageInfo`` per item, so stock readers
load the checkpoint too.
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
from torch.distributed.checkpoint.storage import WriteResult

from ckptstore.dcp.encoding import ItemInfo
from ckptstore.dcp.metadata_checks import (
    DAMAGED,
    MAX_STRIDE,
    StorageInfo,
    corrupt_error,
    is_int,
    validate,
)
from ckptstore.engine.codecs import Codec
from ckptstore.engine.manifest import FileEntry, Manifest, RangeEntry, version_text
from ckptstore.errors import CorruptCheckpointError, NewerFormatError, torch_name

__all__ = ["StorageInfo", "build_indexes", "dump_metadata", "load_metadata"]

_MAX_NDIM = 64  # torch's own limit on tensor dimensions
_MAX_PATH = 4096

with torch_name("DCP's _MEM_FORMAT_ENCODING (torch.distributed.checkpoint.metadata)"):
    _MEM_FORMAT_ENCODING = dcp_md._MEM_FORMAT_ENCODING
#: torch >= 2.15 records each tensor's strides in ``TensorProperties`` (a sixth field).
_HAS_STRIDES = "strides" in {f.name for f in dataclasses.fields(TensorProperties)}


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
            or not all(is_int(s) and 0 <= s < MAX_STRIDE for s in strides)
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
    what = str(exc).removeprefix(f"{source} ").removesuffix(DAMAGED)  # not damage: newer
    return NewerFormatError(
        f"{source} was written by torch {version_text(written_by)}; this torch is "
        f"{torch.__version__}, which cannot read its layout (it {what[:300]}). Load it under "
        f"torch>={release}, or rewrite it there for older releases with ckptstore-tool "
        "convert SRC DST --to dcp (ckptstore writes the oldest layout that loses nothing)"
    )


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


# -- building both indexes at a save -----------------------------------------------------
def build_indexes(
    metadata: Metadata,
    results: list[list[WriteResult]],
    *,
    step: int | None,
    codec: Codec,
    extra: dict[str, Any],
    storage_meta: StorageMeta | None,
) -> tuple[Manifest, bytes]:
    """The manifest and pickled stock ``Metadata`` (with stock ``_StorageInfo`` entries).

    ``metadata`` gets its ``storage_data`` and ``storage_meta`` set; ``extra`` is copied
    into the manifest's.
    """
    manifest = Manifest(
        step=step,
        world_size=len(results),
        codec=codec.name,
        codec_version=codec.version,
        torch_version=torch.__version__,
        ckptstore_version=_version(),
        extra=dict(extra),
    )
    storage_md = {}
    transform = codec.dcp_transform
    for rank_results in results:
        for wr in rank_results:
            info: ItemInfo = wr.storage_data
            storage_md[wr.index] = StorageInfo(
                info.relative_path,
                info.offset,
                info.length,
                transform_descriptors=[transform] if transform is not None else None,
            )
            manifest.files[info.relative_path] = FileEntry(info.file_size, info.file_crc32c)
            manifest.ranges.append(
                RangeEntry(
                    info.relative_path,
                    info.offset,
                    info.length,
                    info.crc32c,
                    key=f"{wr.index.fqn}@{','.join(map(str, wr.index.offset or ()))}",
                    raw_length=None if codec.identity else info.raw_length,
                    span=info.span,
                )
            )
    metadata.storage_data = storage_md
    metadata.storage_meta = storage_meta
    return manifest, dump_metadata(metadata)


def _version() -> str:
    from ckptstore._version import __version__

    return __version__
