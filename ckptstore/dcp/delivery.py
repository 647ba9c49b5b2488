"""Check the bytes of one stored range, decode them and hand them to DCP's load planner.

``CkptReader.read_data`` plans and schedules the reads; a :class:`RangeDelivery` (one per
``read_data`` call) takes each range read: it checks the bytes against the manifest's
CRC32C (when verifying), decodes them with the item's codec (:func:`item_codec`) and
delivers every request that shares the range. A tensor whose raw bytes the manifest
locates and whose target is a matching contiguous CPU tensor is read straight into the
target (:meth:`RangeDelivery.direct`). Object items go through ``dcp.safe_objects``.
"""

from __future__ import annotations

import io
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

from ckptstore.dcp.decoding import decode_tensor
from ckptstore.dcp.safe_objects import check_safe_object, unpickles_unsafely
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.codec_registry import transform_codec
from ckptstore.engine.codecs import Codec
from ckptstore.engine.manifest import RangeEntry, Span
from ckptstore.engine.readplan import Window
from ckptstore.engine.store import Store
from ckptstore.errors import CorruptCheckpointError, StoreNotFoundError

__all__ = ["Direct", "RangeDelivery", "item_codec"]


@dataclass(frozen=True)
class Direct:
    """A tensor read straight into its target: the request, the target, where its raw
    bytes are in the stored item, and the target's bytes."""

    req: ReadItem
    target: torch.Tensor
    span: Span
    buf: memoryview


@dataclass(frozen=True)
class RangeDelivery:
    """Checks, decodes and delivers the stored ranges of one ``read_data`` call.

    ``verify``: check CRC32Cs and refuse ranges the manifest does not list (False for a
    stock checkpoint, which has no manifest, or a reader built with ``verify=False``).
    ``metadata``: the DCP Metadata ``set_up_storage_reader`` kept.
    """

    store: Store
    url: str
    verify: bool
    allow_pickle: bool
    metadata: Metadata | None

    def direct(
        self, reqs: list[ReadItem], entry: RangeEntry | None, codec: Codec, planner: LoadPlanner
    ) -> Direct | None:
        """How to read one item straight into its target, or None if it cannot be."""
        if not codec.identity or entry is None or entry.span is None or len(reqs) != 1:
            return None
        req = reqs[0]
        assert self.metadata is not None  # set_up_storage_reader ran
        md = self.metadata.state_dict_metadata.get(req.storage_index.fqn)
        if req.type != LoadItemType.TENSOR or not isinstance(md, TensorStorageMetadata):
            return None
        if any(req.storage_offsets):
            return None  # a part of the stored chunk (resharding): decode and narrow
        # A request from offset 0 whose byte count equals the stored span's (the whole
        # stored chunk) is the whole chunk: its lengths cannot be smaller in any dimension.
        target = planner.resolve_tensor(req).detach()
        if (
            target.device.type != "cpu"
            or target.is_conj()
            or target.is_neg()
            or target.dtype != md.properties.dtype
            or not target.is_contiguous()
            or tuple(target.size()) != tuple(req.lengths)
            or target.numel() * target.element_size() != entry.span.length
        ):
            return None
        buf: memoryview = target.reshape(-1).view(torch.uint8).numpy().data
        return Direct(req, target, entry.span, buf)

    def check_direct(self, key: tuple[str, int, int], fut: Future, direct: Direct) -> None:
        """Raise unless ``direct``'s read (``fut``) succeeded and its bytes check."""
        path, offset, _ = key
        self._result(path, fut)
        self._verify(path, offset + direct.span.offset, direct.buf, direct.span.crc32c)

    def check(self, key: tuple[str, int, int], data: Any, entry: RangeEntry | None) -> None:
        """Raise ``CorruptCheckpointError`` unless ``data``, the bytes of range ``key``,
        are listed by the manifest with this CRC32C (when verifying)."""
        if self.verify and entry is None:
            raise CorruptCheckpointError(f"{self._where(key)} is not listed in the manifest")
        if entry is not None:
            self._verify(key[0], key[1], data, entry.crc32c)

    def _verify(self, path: str, start: int, data: Any, crc: int) -> None:
        """Raise if verification is on and ``data``, read at ``start`` of ``path``, does
        not have the manifest's CRC32C ``crc``."""
        if self.verify and crc32c(data) != crc:
            raise CorruptCheckpointError(
                f"{self.store.describe(path)} bytes [{start}, {start + len(data)}): checksum "
                "mismatch (the bytes changed after commit); restore the previous checkpoint."
            )

    def _result(self, path: str, fut: Future) -> Any:
        try:
            return fut.result()
        except StoreNotFoundError as exc:
            raise CorruptCheckpointError(
                f"{self.store.describe(path)} is missing but the checkpoint needs it; the "
                "checkpoint is damaged: restore the previous one."
            ) from exc

    def _where(self, key: tuple[str, int, int]) -> str:
        path, offset, length = key
        return f"{self.store.describe(path)} bytes [{offset}, {offset + length})"

    def window_bytes(self, win: Window, fut: Future) -> Any:
        """The bytes of one planned read, all of them (else the file is truncated)."""
        data = self._result(win.path, fut)
        if len(data) != win.length:
            where = self._where((win.path, win.offset, win.length))
            raise CorruptCheckpointError(
                f"{where}: got {len(data)} bytes, the file is truncated; restore the previous "
                "checkpoint."
            )
        return data

    def consume(
        self,
        key: tuple[str, int, int],
        data: Any,
        reqs: list[ReadItem],
        entry: RangeEntry | None,
        codec: Codec,
        planner: LoadPlanner,
        limit: int | None = None,
    ) -> None:
        """Check one stored range's bytes, decode them (to at most ``limit`` bytes: a tensor
        item's, see ``item_limits``) and hand them to every request.

        A tensor that can take its raw bytes straight (see ``direct``) gets the span
        copied into its target after the span's own CRC32C is checked.
        """
        path, offset, _ = key
        direct = self.direct(reqs, entry, codec, planner)
        if direct is not None:
            span = data[direct.span.offset : direct.span.offset + direct.span.length]
            self._verify(path, offset + direct.span.offset, span, direct.span.crc32c)
            direct.buf[:] = span
            planner.commit_tensor(direct.req, direct.target)
            return
        self.check(key, data, entry)
        raw_length = entry.raw_length if entry else None
        data = codec.decode(data, raw_length, self._where(key), limit=limit)
        for req in reqs:
            self._deliver(req, data, planner)

    def _deliver(self, req: ReadItem, data: Any, planner: LoadPlanner) -> None:
        if req.type == LoadItemType.BYTE_IO:
            if not self.allow_pickle and unpickles_unsafely(planner):
                check_safe_object(data, req.storage_index.fqn, self.url)
            planner.load_bytes(req, io.BytesIO(data))
            return
        try:
            tensor = decode_tensor(data)
        except Exception as exc:  # noqa: BLE001 - torch.load raises anything on garbage
            # Only bytes nothing verified get here with garbage (a stock checkpoint's):
            # a verified range is the one that was written. The weights-only unpickler
            # raises IndexError, KeyError, struct.error... as the bytes happen to be.
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise CorruptCheckpointError(
                f"item {req.storage_index.fqn} of {self.url} is not a tensor record "
                f"({type(exc).__name__}: {reason[:200]}); the checkpoint is damaged"
            ) from exc
        for dim, (start, length) in enumerate(zip(req.storage_offsets, req.lengths, strict=True)):
            if start != 0 or length != tensor.size(dim):
                tensor = tensor.narrow(dim, start, length)
        target = planner.resolve_tensor(req).detach()
        if target.size() != tensor.size():
            raise CorruptCheckpointError(
                f"item {req.storage_index.fqn}: stored shape {tuple(tensor.size())} does not "
                f"match the requested {tuple(target.size())}"
            )
        target.copy_(tensor)
        planner.commit_tensor(req, target)


def item_codec(manifest_codec: Codec, descriptors: Any, fqn: str, url: str) -> Codec:
    """The codec of one stored item: the one its ``.metadata`` entry's DCP stream
    transforms name (``stream.zstd/1``, ``ckptstore.<name>/<n>``; see
    ``engine.codec_registry.transform_codec``), else the manifest's."""
    codec = transform_codec(descriptors, f"{url}: item {fqn}")
    return codec if codec is not None else manifest_codec
