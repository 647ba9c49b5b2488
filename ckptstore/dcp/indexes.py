"""What a DCP save commits besides its shard files: the manifest and ``.metadata``.

``CkptWriter.finish`` hands every rank's ``WriteResult``s (each one's ``storage_data`` an
``ItemInfo``, ``dcp.encoding``) to ``build_indexes``, which makes both indexes of the same
items: ckptstore's ``Manifest`` (files with their sizes and CRC32Cs, one range per item,
for verified reads and ``ckptstore-tool``) and DCP's stock ``Metadata``, pickled, with a
stock ``_StorageInfo`` per item, so stock readers load the checkpoint too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.storage import WriteResult

from ckptstore.dcp.encoding import ItemInfo
from ckptstore.dcp.metadata import StorageInfo, dump_metadata
from ckptstore.engine.codecs import Codec
from ckptstore.engine.manifest import FileEntry, Manifest, RangeEntry

__all__ = ["build_indexes"]


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
