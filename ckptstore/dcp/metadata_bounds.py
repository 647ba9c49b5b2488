"""A DCP ``.metadata`` checked against the files it points into, before anything is read.

:func:`check_metadata` refuses an item outside its file and a tensor bigger than its
stored bytes can decode to (a petabyte claimed in a kilobyte file); :func:`item_limits`
gives each stored item's most decoded bytes, which the reader and the transcoder hold a
decoder to (a stored item that needs more is a decompression bomb). The metadata itself
is loaded by :mod:`ckptstore.dcp.metadata` and checked field by field by
:mod:`ckptstore.dcp.metadata_checks`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from ckptstore.dcp.metadata_checks import corrupt_error, is_int, item_name
from ckptstore.engine.manifest import is_contained_name
from ckptstore.errors import CkptStoreError

__all__ = ["TORCH_SAVE_SLACK", "check_metadata", "item_limits"]


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _numel(size: Any) -> int:
    n = 1
    for d in size:
        n *= int(d)
    return n


#: What ``torch.save`` adds around a tensor's bytes (zip records, the pickle, alignment):
#: a stored tensor item decodes to at most its bytes plus this.
TORCH_SAVE_SLACK = 1 << 20


def item_limits(metadata: Metadata) -> dict[tuple[str, tuple[int, ...]], int]:
    """The most bytes each stored tensor item (keyed ``(fqn, chunk offsets)``) can decode
    to: its chunk's bytes plus ``TORCH_SAVE_SLACK``. Stock DCP and ckptstore store each
    chunk as ``torch.save`` of a tensor that is exactly its storage, so a decoder never
    needs more (a stored item that would is a lie: a decompression bomb)."""
    out: dict[tuple[str, tuple[int, ...]], int] = {}
    for fqn, md in (metadata.state_dict_metadata or {}).items():
        if isinstance(md, TensorStorageMetadata):
            itemsize = _itemsize(md.properties.dtype)
            for chunk in md.chunks:
                nbytes = _numel(chunk.sizes) * itemsize + TORCH_SAVE_SLACK
                out[(fqn, tuple(chunk.offsets))] = nbytes
    return out


def _ratio(descriptors: Any, plain_ratio: int, ratios: dict[Any, int]) -> int:
    """How far one stored byte of an item with DCP ``descriptors`` may expand: ``plain_ratio``
    (the manifest codec's) without transforms; a known codec's ``max_ratio``; else the
    largest any known codec has (ckptstore cannot decode it, but must not trust it)."""
    if not descriptors:
        return plain_ratio
    key = tuple(descriptors)
    if key not in ratios:
        from ckptstore.engine.codec_registry import transform_codec

        try:
            codec = transform_codec(list(descriptors), "an item")
            ratios[key] = codec.max_ratio if codec is not None else plain_ratio
        except CkptStoreError:  # unknown (or its library missing): the largest known
            ratios[key] = _largest_ratio()
    return ratios[key]


def _largest_ratio() -> int:
    from ckptstore.engine.codec_registry import codec_names, get_codec

    best = 1
    for name in codec_names():
        try:
            best = max(best, get_codec(name).max_ratio)
        except CkptStoreError:
            continue
    return best


def check_metadata(
    metadata: Metadata, files: Mapping[str, int], source: str, max_ratio: int | None = 1
) -> None:
    """Raise ``CorruptCheckpointError`` unless every stored item of ``metadata`` lies in a
    file of ``files`` (name -> size in bytes): a contained name present there, and
    ``0 <= offset``, ``0 <= length``, ``offset + length <= size``; and unless every tensor
    fits in the bytes stored for it: its size times its dtype's size at most the sum of
    its items' lengths, each times the most its codec expands a byte (``max_ratio``: the
    manifest codec's, for items that name no DCP transform; None: the largest of any known
    codec, when the codec is not known). A tensor claiming more (a
    petabyte in a kilobyte file) is refused before anything is allocated for it."""
    capacity: dict[str, int] = {}
    ratios: dict[Any, int] = {}
    plain_ratio = max_ratio if max_ratio is not None else _largest_ratio()
    checked: set[int] = set()
    for index, info in (metadata.storage_data or {}).items():
        fqn = getattr(index, "fqn", index)
        path: Any = getattr(info, "relative_path", None)
        offset: Any = getattr(info, "offset", None)
        length: Any = getattr(info, "length", None)
        if id(path) not in checked:
            if not is_contained_name(path):
                raise corrupt_error(
                    source, f"stores {item_name(fqn)} at {path!r:.200}, not a name inside it"
                )
            checked.add(id(path))
        if path not in files:
            raise corrupt_error(
                source, f"stores {item_name(fqn)} in {path!r:.200}, which the checkpoint lacks"
            )
        if not (is_int(offset) and is_int(length)) or offset < 0 or length < 0:
            raise corrupt_error(source, f"stores {item_name(fqn)} at a malformed range")
        if offset + length > files[path]:
            raise corrupt_error(
                source,
                f"stores {item_name(fqn)} at bytes [{offset}, {offset + length}) of {path!r:.200}, "
                f"past its end ({files[path]} bytes)",
            )
        ratio = _ratio(getattr(info, "transform_descriptors", None), plain_ratio, ratios)
        capacity[fqn] = capacity.get(fqn, 0) + max(length, 1) * ratio
    for fqn, md in (metadata.state_dict_metadata or {}).items():
        if not isinstance(md, TensorStorageMetadata):
            continue
        nbytes = _numel(md.size) * _itemsize(md.properties.dtype)
        if nbytes > capacity.get(fqn, 0):
            raise corrupt_error(
                source,
                f"claims item {item_name(fqn)} is a tensor of {tuple(md.size)} "
                f"{str(md.properties.dtype).replace('torch.', '')} ({nbytes} bytes), more "
                f"than its stored items can hold ({capacity.get(fqn, 0)} bytes)",
            )
