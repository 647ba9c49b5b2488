"""The versioned integrity manifest: every file's size and checksum, every item range's.

On storage it is ``ckptstore.manifest.json``; its CRC32C is what the ``COMMITTED`` marker
holds. Unknown keys are ignored (forward compatible); a newer major ``version`` is refused.
``codec`` is the codec's versioned descriptor (``zstd/1``, see ``engine.codec_registry``), except
that uncompressed checkpoints record a bare ``none``: older ckptstore readers took any
other string for zstd. A bare name reads as version 1; whether the codec is known is
checked by whoever decodes (a manifest naming an unknown codec still parses).
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field
from typing import Any

from ckptstore._version import __version__ as _ckptstore_version
from ckptstore.engine.checksum import crc32c, format_crc, parse_crc
from ckptstore.engine.codec_registry import find_codec, parse_descriptor
from ckptstore.engine.paths import is_safe_name
from ckptstore.errors import CorruptCheckpointError, NewerFormatError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MARKER_NAME",
    "FileEntry",
    "RangeEntry",
    "Span",
    "Manifest",
    "Marker",
    "version_text",
    "is_contained_name",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "ckptstore.manifest.json"
MARKER_NAME = "COMMITTED"
#: A marker naming a bigger manifest is refused before anything else is read. A manifest
#: costs ~150-200 bytes per stored item range (measured: 300 tensors of one rank, 44 KB;
#: a 4-rank checkpoint of ~300 tensors is ~0.25 MB). 4,096 ranks each holding a shard of
#: 300 tensors make 1.2M ranges, ~230 MB: the cap is twice that, so an honest manifest is
#: never refused, and a hostile marker can make a reader fetch at most this much (it was
#: 1 GiB, which a planted manifest turned into 2.1-2.4 GB of peak memory).
MAX_MANIFEST_SIZE = 512 << 20
#: A marker is ~150 bytes; a bigger one is refused before it is parsed.
MAX_MARKER_SIZE = 64 << 10
_MAX_COUNT = 1 << 62
#: An attempt id becomes part of file names: one plain name component (ckptstore makes
#: hex ids; other tools re-committing a checkpoint may use words).
_ATTEMPT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CRC = re.compile(r"^[0-9a-f]{1,8}$")


@dataclass(frozen=True)
class FileEntry:
    """One file of the checkpoint as stored: its size in bytes and the CRC32C of all of it."""

    size: int
    crc32c: int


@dataclass(frozen=True)
class Span:
    """The payload of an item (a dense tensor's raw bytes): ``length`` bytes at ``offset``
    within the item, with their own CRC32C, so a reader can fetch them straight into place."""

    offset: int
    length: int
    crc32c: int


@dataclass(frozen=True)
class RangeEntry:
    """One stored item: ``length`` bytes at ``offset`` of ``file`` (as stored, i.e. compressed)."""

    file: str
    offset: int
    length: int
    crc32c: int
    key: str = ""
    raw_length: int | None = None  # uncompressed length when a codec is used
    span: Span | None = None  # where the raw tensor bytes sit, for uncompressed tensors


def _range_doc(r: RangeEntry) -> dict[str, Any]:
    # Field by field, not dataclasses.asdict: its recursive deep copy was a third of
    # writing a 228-item manifest (profiled).
    doc: dict[str, Any] = {
        "file": r.file,
        "offset": r.offset,
        "length": r.length,
        "crc32c": format_crc(r.crc32c),
        "key": r.key,
        "raw_length": r.raw_length,
    }
    if r.span is not None:  # absent otherwise: the document is as before
        s = r.span
        doc["span"] = {"offset": s.offset, "length": s.length, "crc32c": format_crc(s.crc32c)}
    return doc


@dataclass
class Manifest:
    """The integrity manifest of one checkpoint (``ckptstore.manifest.json``).

    ``step`` is None for a checkpoint not saved as a step; ``world_size`` is the number of
    ranks that wrote it; ``files`` maps each file name to its ``FileEntry``, ``ranges``
    lists every stored item; ``codec`` and ``codec_version`` name the shards' codec
    (recorded as ``codec_descriptor``); ``extra`` holds what the writer adds (the attempt
    id, the manager's timings), kept as parsed. Build one from storage with
    :meth:`from_bytes`.
    """

    step: int | None
    world_size: int
    files: dict[str, FileEntry] = field(default_factory=dict)
    ranges: list[RangeEntry] = field(default_factory=list)
    codec: str = "none"  # the codec's name; the manifest records "<codec>/<codec_version>"
    torch_version: str = ""
    ckptstore_version: str = ""
    created: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION
    codec_version: int = 1

    @property
    def codec_descriptor(self) -> str:
        """What the manifest records: ``<codec>/<codec_version>``, or a bare ``none``."""
        if (self.codec, self.codec_version) == ("none", 1):
            return "none"  # older readers took any other string for zstd
        return f"{self.codec}/{self.codec_version}"

    def to_bytes(self) -> bytes:
        """The manifest as stored: JSON, files sorted by name, ranges by (file, offset)."""
        doc = {
            "format": "ckptstore",
            "version": self.version,
            "step": self.step,
            "world_size": self.world_size,
            "codec": self.codec_descriptor,
            "checksum": "crc32c",
            "torch_version": self.torch_version,
            "ckptstore_version": self.ckptstore_version,
            "created": self.created,
            "files": {
                name: {"size": e.size, "crc32c": format_crc(e.crc32c)}
                for name, e in sorted(self.files.items())
            },
            "ranges": [
                _range_doc(r) for r in sorted(self.ranges, key=lambda r: (r.file, r.offset))
            ],
            "extra": self.extra,
        }
        # No indent: json's C encoder (indented output goes through its Python one, 4x
        # slower on a few hundred ranges, and a save builds one manifest per step).
        return json.dumps(doc).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        """Parse and schema-check a manifest (see :func:`_parse_manifest`); anything
        malformed is ``CorruptCheckpointError`` naming ``where``."""
        try:
            return _parse_manifest(cls, _json(data, MAX_MANIFEST_SIZE), where)
        except _Bad as exc:
            raise CorruptCheckpointError(
                f"{where} is not a valid ckptstore manifest ({exc}); the checkpoint is "
                "damaged: restore from the previous checkpoint."
            ) from None

    def range_index(self) -> dict[tuple[str, int, int], RangeEntry]:
        """Every range keyed by ``(file, offset, length)``, as DCP's ``.metadata`` names items."""
        return {(r.file, r.offset, r.length): r for r in self.ranges}

    @property
    def total_bytes(self) -> int:
        """The sum of the sizes of every file the manifest lists."""
        return sum(e.size for e in self.files.values())


@dataclass(frozen=True)
class Marker:
    """The content of ``COMMITTED``: which manifest (by checksum and size) it commits."""

    manifest_crc32c: int
    manifest_size: int
    step: int | None
    attempt: str = ""
    version: int = FORMAT_VERSION

    @classmethod
    def for_manifest(cls, manifest_bytes: bytes, step: int | None, attempt: str) -> Marker:
        """The marker committing ``manifest_bytes`` (a manifest's ``to_bytes()``)."""
        return cls(crc32c(manifest_bytes), len(manifest_bytes), step, attempt)

    def to_bytes(self) -> bytes:
        """The marker as stored: a small JSON object, the manifest's CRC32C in hex."""
        return json.dumps(
            {
                "version": self.version,
                "step": self.step,
                "attempt": self.attempt,
                "manifest_crc32c": format_crc(self.manifest_crc32c),
                "manifest_size": self.manifest_size,
            }
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Marker:
        """Parse and schema-check a marker; anything malformed is ``CorruptCheckpointError``
        naming ``where``."""
        try:
            doc = _json(data, MAX_MARKER_SIZE)
            if type(doc) is not dict:
                raise _Bad("not a JSON object")
            attempt = doc.get("attempt", "")
            if type(attempt) is not str or (attempt and not _ATTEMPT.match(attempt)):
                raise _Bad(f"attempt {attempt!r:.80} is not an attempt id")
            return cls(
                _crc(doc, "manifest_crc32c"),
                _count(doc, "manifest_size", MAX_MANIFEST_SIZE),
                _step(doc.get("step")),
                attempt,
                _count(doc, "version", 1 << 31, default=1),
            )
        except _Bad as exc:
            raise CorruptCheckpointError(
                f"{where} is not a valid commit marker ({exc}); treat this checkpoint as "
                "incomplete and restore from the previous one."
            ) from None

    def matches(self, manifest_bytes: bytes) -> bool:
        """True if ``manifest_bytes`` has the size and CRC32C this marker commits."""
        return (
            len(manifest_bytes) == self.manifest_size
            and crc32c(manifest_bytes) == self.manifest_crc32c
        )


class _Bad(Exception):
    """A schema violation inside a manifest or marker (turned into CorruptCheckpointError)."""


def _json(data: bytes, limit: int) -> Any:
    if len(data) > limit:  # json.loads would hold many times its size
        raise _Bad(f"{len(data)} bytes, more than such a file can be ({limit})")
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise _Bad(f"not JSON: {str(exc)[:120]}") from None


def is_contained_name(name: Any) -> bool:
    """True for a name a manifest, marker or ``.metadata`` may hold: one the stores accept
    (``engine.paths.is_safe_name``: relative, normalised, inside its root), at most 4096
    characters, and no drive letter or scheme (``C:``, ``s3:``) in its first segment."""
    return is_safe_name(name) and len(name) <= 4096 and ":" not in name.split("/")[0]


def _get(doc: dict[str, Any], key: str, default: Any = ...) -> Any:
    if key in doc:
        return doc[key]
    if default is ...:
        raise _Bad(f"no {key!r}")
    return default


def _count(doc: dict[str, Any], key: str, limit: int = _MAX_COUNT, default: Any = ...) -> int:
    """``doc[key]``: a whole number in [0, limit] (JSON floats and bools are refused)."""
    v = _get(doc, key, default)
    if type(v) is not int or not 0 <= v <= limit:
        raise _Bad(f"{key!r} is {v!r:.80}, not a whole number in [0, {limit}]")
    return v


def _crc(doc: dict[str, Any], key: str) -> int:
    v = _get(doc, key)
    if type(v) is not str or not _CRC.match(v):
        raise _Bad(f"{key!r} is {v!r:.80}, not a CRC32C in hex")
    return parse_crc(v)


def _str(doc: dict[str, Any], key: str, default: str = "") -> str:
    v = doc.get(key, default)
    if type(v) is not str:
        raise _Bad(f"{key!r} is not a string")
    return v


def _step(v: Any) -> int | None:
    if v is not None and (type(v) is not int or not 0 <= v <= 999_999_999):
        raise _Bad(f"step {v!r:.80} is not a step number")
    return v  # type: ignore[no-any-return]


def _obj(v: Any, what: str) -> dict[str, Any]:
    if type(v) is not dict:
        raise _Bad(f"{what} is not a JSON object")
    return v


_VERSION_TEXT = re.compile(r"[0-9A-Za-z.+_-]{1,40}")


def version_text(version: str) -> str:
    """A release string read from storage, for a message: as written if it looks like one
    (``2.15.0+cu130``), else quoted and cut (it may hold anything)."""
    return version if _VERSION_TEXT.fullmatch(version) else f"{version!r:.42}"


def _parse_manifest(cls: type[Manifest], doc: Any, where: str) -> Manifest:
    """The manifest in ``doc``, every field checked: types, counts >= 0, names contained,
    every range inside its (listed) file, spans inside their item, raw lengths the codec
    can reach (if it is a known one)."""
    doc = _obj(doc, "the document")
    if doc.get("format") != "ckptstore":
        raise _Bad("not a ckptstore manifest")
    version = _count(doc, "version", 1 << 31)
    if version > FORMAT_VERSION:
        written = _str(doc, "ckptstore_version")
        raise NewerFormatError(
            f"{where} has format version {version}"
            + (f" (written by ckptstore {version_text(written)})" if written else "")
            + f", newer than this ckptstore {_ckptstore_version} understands "
            f"({FORMAT_VERSION}): upgrade ckptstore to read it"
        )
    codec_text = _str(doc, "codec", "none")
    parsed = parse_descriptor(codec_text)
    if parsed is None:
        raise _Bad(f"codec {codec_text!r:.80} is not a codec descriptor (<name>/<version>)")
    known = find_codec(*parsed)
    max_ratio = known.max_ratio if known is not None else None
    files: dict[str, FileEntry] = {}
    for name, e in _obj(_get(doc, "files"), "'files'").items():
        if not is_contained_name(name):
            raise _Bad(f"file name {name!r:.200} is not a relative name inside the step")
        e = _obj(e, f"the entry of {name!r}")
        files[name] = FileEntry(_count(e, "size"), _crc(e, "crc32c"))
    raw_ranges = _get(doc, "ranges")
    if type(raw_ranges) is not list:
        raise _Bad("'ranges' is not a list")
    ranges = [_parse_range(_obj(r, "a range"), files, max_ratio) for r in raw_ranges]
    created = doc.get("created", 0.0)
    if type(created) not in (int, float):
        raise _Bad("'created' is not a number")
    return cls(
        step=_step(doc.get("step")),
        world_size=_count(doc, "world_size", 1 << 31),
        files=files,
        ranges=ranges,
        codec=parsed[0],
        codec_version=parsed[1],
        torch_version=_str(doc, "torch_version"),
        ckptstore_version=_str(doc, "ckptstore_version"),
        created=float(created),
        extra=_obj(doc.get("extra", {}), "'extra'"),
        version=version,
    )


def _parse_range(
    r: dict[str, Any], files: dict[str, FileEntry], max_ratio: int | None
) -> RangeEntry:
    """One range; ``max_ratio``: how far the manifest's codec can expand a stored item
    (None for a codec this ckptstore does not know, which no reader will decode)."""
    name: Any = r.get("file")
    listed = type(name) is str and name in files  # checked with 'files' (a few names)
    if not listed and not is_contained_name(name):
        raise _Bad(f"a range is in {name!r:.200}, not a relative name inside the step")
    offset, length = _count(r, "offset"), _count(r, "length")
    # A range of a file 'files' does not list is never read (the reader reads only what
    # the checked .metadata names, and that must be in 'files'); bounds apply to the rest.
    if listed and offset + length > files[name].size:
        raise _Bad(
            f"range [{offset}, {offset + length}) of {name!r} is past its end "
            f"({files[name].size} bytes)"
        )
    raw_length = r.get("raw_length")
    if raw_length is not None:
        limit = max(length, 1) * max_ratio if max_ratio is not None else _MAX_COUNT
        raw_length = _count(r, "raw_length", limit)
    item_length = raw_length if raw_length is not None else length
    span = None
    if r.get("span") is not None:
        s = _obj(r["span"], "a span")
        span = Span(_count(s, "offset"), _count(s, "length"), _crc(s, "crc32c"))
        if span.offset + span.length > item_length:
            raise _Bad(f"a span of {name!r} at {offset} is past the end of its item")
    return RangeEntry(
        file=name,
        offset=offset,
        length=length,
        crc32c=_crc(r, "crc32c"),
        key=_str(r, "key"),
        raw_length=raw_length,
        span=span,
    )
