"""Shard formats: read a shard's index and schema from its footer (the samples of a local
copy are read by :mod:`ckptstore.data.shardreader`).

Three formats (a *group* is what is decoded at once):

- ``parquet``: a sample is a row; a group is a row group. The index comes from the footer.
- ``arrow`` (Arrow IPC *file* format, Feather v2): a sample is a row; a group is a record
  batch. The index comes from the footer plus each batch's message header (a few hundred
  bytes each); bodies are never read.
- ``raw``: a sample is a whole file (``{"path": ..., "data": bytes}``); one group of one.

``read_index(fmt, size, read)`` (``read(offset, length) -> bytes``, remote or local) gives
``(rows, digest)``; ``digest`` (SHA-256 of the footer) identifies a shard's content
cheaply: it enters the dataset fingerprint and is checked again on the downloaded copy.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence
from typing import Any

from ckptstore.errors import ShardFormatError, missing_dependency

__all__ = [
    "FORMATS",
    "EXTENSIONS",
    "check_schemas",
    "inspect",
    "preload",
    "pyarrow_module",
    "read_index",
]

FORMATS = ("parquet", "arrow", "raw")
EXTENSIONS = {"parquet": (".parquet", ".parq", ".pq"), "arrow": (".arrow", ".feather", ".ipc")}
_TAIL = 64 * 1024
_ARROW_MAGIC = b"ARROW1"
#: Most rows a shard of ``size`` bytes may claim: ``MAX_ROWS_PER_BYTE * size``. Honest
#: files stay far below it (a Parquet column of one repeated value, run-length encoded,
#: takes about 300 rows a byte); a footer claiming more lies, and is refused before the
#: data order allocates 8 bytes a row for it.
MAX_ROWS_PER_BYTE = 1024

ReadFn = Callable[[int, int], bytes]


def pyarrow_module() -> Any:
    """``pyarrow``, or ``MissingDependencyError`` naming the extra that installs it."""
    try:
        import pyarrow
    except ImportError as exc:
        raise missing_dependency("pyarrow", "data") from exc
    return pyarrow


def _check_rows(rows: Sequence[int], size: int, what: str) -> tuple[int, ...]:
    """``rows`` if every count is >= 0 and they sum to at most what ``size`` bytes can hold."""
    out = tuple(int(n) for n in rows)
    if any(n < 0 for n in out):
        raise ShardFormatError(f"{what}: the footer claims a negative row count")
    if sum(out) > MAX_ROWS_PER_BYTE * max(size, 1):
        raise ShardFormatError(
            f"{what}: the footer claims {sum(out)} rows, more than a {size}-byte file can "
            f"hold (at most {MAX_ROWS_PER_BYTE} a byte); the file is damaged or crafted"
        )
    return out


def _tail(size: int, read: ReadFn, magic: bytes, what: str) -> tuple[bytes, int]:
    """The footer bytes before ``<int32 length><magic>`` at the end of a file."""
    trailer = 4 + len(magic)
    if size < trailer + 4:
        raise ShardFormatError(f"{what}: {size} bytes is too short to be a {what} file")
    tail = read(max(0, size - _TAIL), min(size, _TAIL))
    if len(tail) < trailer or tail[-len(magic) :] != magic:
        raise ShardFormatError(f"{what}: no {magic.decode()} magic at the end; not a {what} file")
    flen = int.from_bytes(tail[-trailer : -len(magic)], "little", signed=True)
    if flen <= 0 or flen + trailer > size:
        raise ShardFormatError(f"{what}: footer length {flen} does not fit the file")
    if flen + trailer > len(tail):
        tail = read(size - flen - trailer, flen + trailer)
    return bytes(tail[-(flen + trailer) : -trailer]), flen


Schema = tuple[tuple[str, str], ...]


def _fields(schema: Any) -> Schema:
    """``((name, type), ...)`` of a pyarrow schema: what shards must agree on."""
    return tuple((f.name, str(f.type)) for f in schema)


def _parquet_inspect(size: int, read: ReadFn) -> tuple[tuple[int, ...], str, Schema]:
    pa = pyarrow_module()
    import pyarrow.parquet as pq

    footer, _ = _tail(size, read, b"PAR1", "Parquet")
    blob = footer + len(footer).to_bytes(4, "little") + b"PAR1"
    try:
        md = pq.read_metadata(pa.BufferReader(blob))
        fields = _fields(md.schema.to_arrow_schema())
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad footers
        raise ShardFormatError(f"Parquet: unreadable footer ({exc})") from exc
    try:
        rows = _check_rows(
            [md.row_group(i).num_rows for i in range(md.num_row_groups)], size, "Parquet"
        )
    except ShardFormatError:
        raise
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad footers
        raise ShardFormatError(f"Parquet: unreadable row groups ({exc})") from exc
    return rows, hashlib.sha256(footer).hexdigest(), fields


def _parquet_index(size: int, read: ReadFn) -> tuple[tuple[int, ...], str]:
    rows, digest, _ = _parquet_inspect(size, read)
    return rows, digest


# --- Arrow IPC: just enough FlatBuffers to read the footer's blocks and batch lengths ----


def _field(buf: bytes, table: int, field: int) -> int | None:
    """Absolute position of ``field`` of the FlatBuffers table at ``table`` (None: absent)."""
    vtable = table - struct.unpack_from("<i", buf, table)[0]
    vt_size = struct.unpack_from("<H", buf, vtable)[0]
    slot = 4 + 2 * field
    if slot + 2 > vt_size:
        return None
    off = struct.unpack_from("<H", buf, vtable + slot)[0]
    return table + off if off else None


def _deref(buf: bytes, pos: int) -> int:
    return pos + struct.unpack_from("<I", buf, pos)[0]


def _arrow_blocks(footer: bytes, size: int) -> list[tuple[int, int]]:
    """``(offset, metadata_length)`` of each record batch, from the IPC footer; each one
    checked to lie inside the file of ``size`` bytes before anything is read there."""
    root = _deref(footer, 0)
    pos = _field(footer, root, 3)  # Footer.recordBatches: [Block]
    if pos is None:
        return []
    vec = _deref(footer, pos)
    n = struct.unpack_from("<I", footer, vec)[0]
    if vec + 4 + 24 * n > len(footer):
        raise ShardFormatError(f"Arrow IPC: the footer claims {n} record batches it cannot hold")
    out = []
    for i in range(n):  # struct Block { offset: long; metaDataLength: int; bodyLength: long }
        offset, meta_len = struct.unpack_from("<qi", footer, vec + 4 + 24 * i)
        if offset < 0 or meta_len < 8 or offset + meta_len > size:
            raise ShardFormatError(
                f"Arrow IPC: record batch {i} at [{offset}, {offset + meta_len}) does not fit "
                f"the {size}-byte file"
            )
        out.append((offset, meta_len))
    if sum(n for _, n in out) > size:  # batches do not overlap: their headers fit the file
        raise ShardFormatError("Arrow IPC: the footer's record batch headers overlap")
    return out


def _batch_length(message: bytes) -> int:
    """``RecordBatch.length`` (rows) from an encapsulated IPC message header."""
    start = 8 if message[:4] == b"\xff\xff\xff\xff" else 4
    buf = message[start:]
    root = _deref(buf, 0)
    kind = _field(buf, root, 1)  # Message.header_type
    if kind is None or buf[kind] != 3:  # MessageHeader.RecordBatch
        raise ShardFormatError("Arrow IPC: a footer block is not a record batch")
    header = _field(buf, root, 2)
    if header is None:
        raise ShardFormatError("Arrow IPC: record batch message without a header")
    batch = _deref(buf, header)
    length = _field(buf, batch, 0)  # RecordBatch.length
    return 0 if length is None else int(struct.unpack_from("<q", buf, length)[0])


def _arrow_index(size: int, read: ReadFn) -> tuple[tuple[int, ...], str]:
    footer, _ = _tail(size, read, _ARROW_MAGIC, "Arrow IPC")
    try:
        blocks = _arrow_blocks(footer, size)
        rows = _check_rows(
            [_batch_length(bytes(read(off, n))) for off, n in blocks], size, "Arrow IPC"
        )
    except (struct.error, IndexError) as exc:
        raise ShardFormatError(f"Arrow IPC: malformed footer or batch header ({exc})") from exc
    return rows, hashlib.sha256(footer).hexdigest()


def _arrow_schema(size: int, read: ReadFn) -> Schema:
    """The schema message at the head of an IPC file (``ARROW1``, 2 pad bytes, message)."""
    pa = pyarrow_module()
    import pyarrow.ipc as ipc

    head = bytes(read(0, min(size, 16)))
    if len(head) < 16 or head[:6] != _ARROW_MAGIC:
        raise ShardFormatError("Arrow IPC: no ARROW1 magic at the start; not an Arrow IPC file")
    cont, n = struct.unpack_from("<Ii", head, 8)
    start, n = (16, n) if cont == 0xFFFFFFFF else (12, cont)  # pre-0.15 files: no marker
    if n <= 0 or start + n > size:
        raise ShardFormatError(f"Arrow IPC: schema message length {n} does not fit the file")
    try:
        message = bytes(read(8, start - 8 + n))
        return _fields(ipc.read_schema(pa.py_buffer(message)))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for bad messages
        raise ShardFormatError(f"Arrow IPC: unreadable schema message ({exc})") from exc


def inspect(fmt: str, size: int, read: ReadFn) -> tuple[tuple[int, ...], str, Schema]:
    """``(rows per group, footer digest, schema)``: :func:`read_index` plus the schema.

    The schema is ``((column, type), ...)``, what every shard of a dataset must agree on;
    raw files have ``()``. Parquet reads it from the same footer; Arrow from the schema
    message at the file's head (one more small ranged read).
    """
    if fmt == "parquet":
        return _parquet_inspect(size, read)
    if fmt == "arrow":
        rows, digest = _arrow_index(size, read)
        return rows, digest, _arrow_schema(size, read)
    rows, digest = read_index(fmt, size, read)
    return rows, digest, ()


def check_schemas(
    schemas: Sequence[tuple[str, Schema]], columns: Sequence[str] | None = None
) -> None:
    """Raise ``ShardFormatError`` unless every shard's ``(path, schema)`` agrees.

    With ``columns``, only those columns are compared (each must be in every shard).
    Metadata and column order do not count; names and types do.
    """
    if not schemas:
        return
    want = list(columns) if columns is not None else None

    def view(fields: Schema) -> dict[str, str]:
        d = dict(fields)
        return d if want is None else {c: d[c] for c in want if c in d}

    ref_path, ref_fields = schemas[0]
    ref = view(ref_fields)
    if want is not None:
        for path, fields in schemas:
            missing = [c for c in want if c not in dict(fields)]
            if missing:
                raise ShardFormatError(
                    f"{path} has no column {missing[0]!r} (columns={want}); it has "
                    f"{', '.join(n for n, _ in fields) or 'none'}"
                )
    for path, fields in schemas[1:]:
        got = view(fields)
        if got == ref:
            continue
        diffs = [
            f"{c!r} is {got[c]} there, {ref[c]} in {ref_path}"
            for c in ref
            if c in got and got[c] != ref[c]
        ]
        diffs += [f"{c!r} is missing there (present in {ref_path})" for c in ref if c not in got]
        diffs += [f"{c!r} is only there (not in {ref_path})" for c in got if c not in ref]
        raise ShardFormatError(
            f"shards disagree on their schema: in {path}, {'; '.join(diffs)}. Rewrite the "
            "shard to match, or select the columns every shard shares with columns=[...]"
        )


def preload(fmt: str) -> None:
    """Import what reading ``fmt`` needs, now, on the calling (main) thread.

    A module still being imported by a background thread when DataLoader workers are
    forked stays locked forever in the children; importing up front avoids that.
    """
    if fmt in ("parquet", "arrow"):
        pyarrow_module()
        import pyarrow.ipc  # noqa: F401
        import pyarrow.parquet  # noqa: F401


def read_index(fmt: str, size: int, read: ReadFn) -> tuple[tuple[int, ...], str]:
    """``(rows per group, footer digest)`` of a shard of ``size`` bytes.

    ``read(offset, length)`` returns bytes of the shard (ranged GETs or local preads); only
    the footer (and for Arrow, batch headers) is read. Raw files: ``((1,), "")``.
    Raises ``ShardFormatError`` for a file that is not of ``fmt``.
    """
    if fmt == "parquet":
        return _parquet_index(size, read)
    if fmt == "arrow":
        return _arrow_index(size, read)
    if fmt == "raw":
        return (1,), ""
    raise ShardFormatError(f"unknown format {fmt!r}; use one of {', '.join(FORMATS)}")
