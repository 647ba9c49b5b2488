"""Rewrite a DCP checkpoint item by item with another codec (e.g. ``none`` <-> ``zstd``).

    marker = transcode(src_store, dst_store, engine, codec="zstd")

Streams: each stored item is read (checked against the source manifest when there is
one), decoded, encoded with ``codec`` and appended to a new shard file at the destination,
one per source file, so the rank layout (and resharding on load) is unchanged and memory
stays bounded by the engine's budget. The ``Metadata`` is rewritten to the new offsets, a
new manifest records every file and range, and the result is committed last with
``commit``. A stock DCP source (no manifest) is adopted: the output has both.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from ckptstore.dcp.delivery import item_codec
from ckptstore.dcp.metadata import StorageInfo, dump_metadata
from ckptstore.dcp.metadata_bounds import item_limits
from ckptstore.dcp.reader import CkptReader
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.codec_registry import get_codec
from ckptstore.engine.codecs import Codec
from ckptstore.engine.commit import commit
from ckptstore.engine.committed import attempt_manifest_name, attempt_metadata_name
from ckptstore.engine.deletion import remove_made
from ckptstore.engine.lease import hold_step_lease
from ckptstore.engine.manifest import MARKER_NAME, FileEntry, Manifest, Marker, RangeEntry
from ckptstore.engine.owner import run_identity
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import CorruptCheckpointError

__all__ = ["transcode", "TranscodeCancelled"]

log = logging.getLogger(__name__)
_RANK = re.compile(r"^__(\d+)_")


class TranscodeCancelled(Exception):
    """Raised when ``cancel`` is set during a transcode."""


def _new_name(old: str, attempt: str) -> str:
    stem = old.split(".", 1)[0]
    return f"{stem}.{attempt}.distcp"


def transcode(
    src: Store,
    dst: Store,
    engine: TransferEngine,
    *,
    codec: str = "none",
    step: int | None = None,
    on_bytes: Callable[[int], None] | None = None,
    cancel: threading.Event | None = None,
    extra: dict[str, Any] | None = None,
) -> Marker:
    """Transcode the DCP checkpoint at ``src`` into ``dst`` (which the caller made empty).

    Opens the source with ``CkptReader`` (refuses torn checkpoints), writes every file,
    then publishes; on any failure the files it wrote are deleted and nothing is committed.
    """
    out_codec = get_codec(codec)
    reader = CkptReader(src, engine=engine, config=engine.config)
    metadata: Metadata = reader.read_metadata()
    src_manifest = reader.manifest
    index = src_manifest.range_index() if src_manifest else {}
    by_file: dict[str, dict[tuple[int, int], list[Any]]] = {}
    codecs: dict[tuple[str, int, int], Codec] = {}
    tensor_limits = item_limits(metadata)
    limits: dict[tuple[str, int, int], int | None] = {}
    for idx, info in (metadata.storage_data or {}).items():
        descriptors = getattr(info, "transform_descriptors", None)
        key = (info.relative_path, info.offset, info.length)
        codecs[key] = item_codec(reader.manifest_codec, descriptors, idx.fqn, src.url)
        limits[key] = tensor_limits.get((idx.fqn, tuple(idx.offset or ())))  # None: an object
        by_file.setdefault(info.relative_path, {}).setdefault((info.offset, info.length), [])
        by_file[info.relative_path][(info.offset, info.length)].append(idx)

    attempt = uuid.uuid4().hex[:12]
    transform = out_codec.dcp_transform
    descriptors = [transform] if transform is not None else None
    cancel = cancel or threading.Event()
    manifest = Manifest(
        step=step if step is not None else (src_manifest.step if src_manifest else None),
        world_size=src_manifest.world_size if src_manifest else _world_size(by_file),
        codec=out_codec.name,
        codec_version=out_codec.version,
        torch_version=torch.__version__,
        ckptstore_version=_version(),
        extra={**(extra or {}), "converted_from": src.url},
    )
    storage_md: dict[Any, StorageInfo] = {}
    made = [attempt_manifest_name(attempt), attempt_metadata_name(attempt)]
    # gc and retention on dst's root leave a conversion in flight alone (engine.lease)
    lease = hold_step_lease(dst, attempt, run_identity())
    try:
        for old in sorted(by_file):
            new = _new_name(old, attempt)
            made.append(new)
            items = by_file[old]
            with engine.writer(dst, new) as w:
                for (off, length), idxs, data in _read_ahead(
                    engine, src, old, sorted(items), items
                ):
                    if cancel.is_set():
                        raise TranscodeCancelled(old)
                    entry = index.get((old, off, length))
                    if src_manifest is not None and (entry is None or crc32c(data) != entry.crc32c):
                        raise CorruptCheckpointError(
                            f"{src.describe(old)} bytes [{off}, {off + length}) do not match "
                            "the source manifest; the source is damaged (run `ckptstore-tool "
                            "verify`)."
                        )
                    where = f"{src.describe(old)} bytes [{off}, {off + length})"
                    raw = memoryview(
                        codecs[(old, off, length)].decode(
                            data,
                            entry.raw_length if entry else None,
                            where,
                            limit=limits[(old, off, length)],
                        )
                    )
                    stored = out_codec.encode(raw)
                    crc = crc32c(stored)
                    new_off = w.write(stored, crc)
                    for idx in idxs:
                        storage_md[idx] = StorageInfo(
                            new, new_off, len(stored), transform_descriptors=descriptors
                        )
                    fqn = idxs[0]
                    manifest.ranges.append(
                        RangeEntry(
                            new,
                            new_off,
                            len(stored),
                            crc,
                            key=f"{fqn.fqn}@{','.join(map(str, fqn.offset or ()))}",
                            raw_length=None if out_codec.identity else len(raw),
                        )
                    )
                    if on_bytes is not None:
                        on_bytes(length)
                info = w.close()
            manifest.files[new] = FileEntry(info.size, info.crc32c)
        metadata.storage_data = storage_md
        metadata.storage_meta = StorageMeta(checkpoint_id=dst.url, save_id=attempt)
        return commit(dst, engine, attempt, manifest, dump_metadata(metadata))
    except BaseException:
        if lease is not None:
            lease.stop()
        if not dst.exists(MARKER_NAME):
            remove_made(dst, made)  # the one deletion path: only ckptstore's names
        raise
    finally:
        if lease is not None:
            lease.stop()


def _read_ahead(
    engine: TransferEngine,
    store: Store,
    path: str,
    keys: list[tuple[int, int]],
    items: dict[tuple[int, int], list[Any]],
) -> Iterator[tuple[tuple[int, int], list[Any], bytes | bytearray]]:
    """Yield ``(key, indices, bytes)`` in offset order, with reads in flight ahead of use."""
    pending = deque(keys)
    inflight: deque[tuple[tuple[int, int], Future]] = deque()
    budget = engine.config.memory_budget // 2
    used = 0
    try:
        while pending or inflight:
            while pending and (not inflight or used + pending[0][1] <= budget):
                key = pending.popleft()
                inflight.append((key, engine.read_async(store, path, key[0], key[1])))
                used += key[1]
            key, fut = inflight.popleft()
            used -= key[1]
            data = fut.result()
            if len(data) != key[1]:
                raise CorruptCheckpointError(
                    f"{store.describe(path)} bytes [{key[0]}, {key[0] + key[1]}): got "
                    f"{len(data)} bytes; the source file is truncated."
                )
            yield key, items[key], data
    finally:
        for _, fut in inflight:
            fut.cancel()


def _world_size(by_file: dict[str, Any]) -> int:
    ranks = {int(m.group(1)) for name in by_file if (m := _RANK.match(name))}
    return max(ranks) + 1 if ranks else 1


def _version() -> str:
    from ckptstore._version import __version__

    return __version__
