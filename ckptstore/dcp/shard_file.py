"""Serialising one shard file: a rank's items, in write order, through one file writer.

``write_items`` is what ``CkptWriter._write_file`` runs inside the writer its hooks give
(``engine.filewriter.FileWriter``, or ``engine.tee.TeeWriter`` for ``TierWriter``):
bytes items first (as stock DCP writes them), then the larger tensors, then the smaller
ones, each in plan order. With the identity codec small items are gathered and written
together (``SmallItems``), each larger one streamed through an ``ItemSink`` (hashed once,
its storage recorded as a span), after zeros that put its storage's bytes where a volume
writes them from their own memory (``FileWriter.align``: DCP's metadata locates every
item, no reader reads between). Any other codec encodes each item whole.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.distributed.checkpoint.planner import WriteItem, WriteItemType

from ckptstore.dcp.encoding import (
    PAYLOAD_MIN,
    cpu_item,
    encode_item,
    payload_lead,
    payload_of,
    small_item_bytes,
    write_item,
)
from ckptstore.dcp.schedule import item_bytes
from ckptstore.engine.checksum import crc32c
from ckptstore.engine.codecs import Codec
from ckptstore.engine.filewriter import FileWriter
from ckptstore.engine.itemsink import GATHER_MAX
from ckptstore.engine.manifest import Span
from ckptstore.engine.tee import TeeWriter

__all__ = ["Written", "SmallItems", "write_items", "write_order"]

#: One item as written: (item, offset, stored length, CRC32C, raw length, span or None).
Written = tuple[Any, int, int, int, int, "Span | None"]


def write_items(
    w: FileWriter | TeeWriter,
    items: list[WriteItem],
    resolve: Callable[[WriteItem], Any],
    codec: Codec,
) -> list[Written]:
    """Write ``items`` (their data from ``resolve``, the planner's ``resolve_data``) into
    the open file ``w`` with ``codec``, in ``write_order`` (module docstring); what was
    written where. The caller closes ``w``."""
    written: list[Written] = []
    small = SmallItems(w, written)
    for item in sorted(items, key=write_order):
        data = cpu_item(resolve(item))
        if codec.identity:  # stream straight into part buffers, hashed once
            if small.add(item, data):
                continue
            small.flush()
            payload = payload_of(data)
            lead = payload_lead(data) if payload is not None else None
            if payload is not None and lead is not None:
                w.align(payload[0], lead, payload[1])  # its storage written in place
            with w.item(payload, owner=data) as sink:
                write_item(data, sink)
            written.append((item, sink.offset, sink.length, sink.crc32c, sink.length, sink.span))
            continue
        raw = encode_item(data)
        stored = codec.encode(raw)
        crc = crc32c(stored)
        offset = w.write(stored, crc)
        written.append((item, offset, len(stored), crc, len(raw), None))
    small.flush()
    return written


def write_order(item: WriteItem) -> int:
    """Bytes items first, then tensors of ``PAYLOAD_MIN`` or more, then the smaller ones
    (a sort key; the sort is stable)."""
    if item.type == WriteItemType.BYTE_IO:
        return 0
    return 2 if item_bytes(item) < PAYLOAD_MIN else 1


class SmallItems:
    """Small items of one file, encoded into one buffer and written together: one write,
    hashed once for the file, instead of an ``ItemSink`` each (a model state's few
    hundred biases, norms, step counters and hyperparameters cost the save thread, which
    holds the GIL training needs, ~25 us each through a sink; profiled).

    Call order: ``add`` per item (False: not small, nothing taken), ``flush`` before any
    other write to the file and before it closes.
    """

    def __init__(self, writer: FileWriter | TeeWriter, written: list[Written]) -> None:
        self._writer = writer
        self._written = written
        self._buf = bytearray()
        self._pending: list[tuple[Any, int, int, int]] = []  # (item, start, length, crc)

    def add(self, item: Any, data: Any) -> bool:
        """Take ``item`` (``data``: its ``cpu_item``) if it is small; False if not."""
        raw = small_item_bytes(data)
        if raw is None:
            return False
        self._pending.append((item, len(self._buf), len(raw), crc32c(raw)))
        self._buf += raw
        if len(self._buf) >= GATHER_MAX:
            self.flush()
        return True

    def flush(self) -> None:
        """Write the gathered items (a new buffer each time: the writer may keep it)."""
        if not self._pending:
            return
        buf, self._buf = self._buf, bytearray()
        base = self._writer.write(buf)
        self._written.extend(
            (item, base + start, n, crc, n, None) for item, start, n, crc in self._pending
        )
        self._pending = []
