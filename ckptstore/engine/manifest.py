"""The versioned integrity manifest: every file's size and checksum, every item range's.

On storage it is ``ckptstore.manifest.json``; its CRC32C is what the ``COMMITTED`` marker
holds. Unknown keys are kept (forward compatible); a newer major ``version`` is refused.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from ckptstore.engine.checksum import crc32c, format_crc, parse_crc
from ckptstore.errors import CorruptCheckpointError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "MARKER_NAME",
    "FileEntry",
    "RangeEntry",
    "Span",
    "Manifest",
    "Marker",
]

FORMAT_VERSION = 1
MANIFEST_NAME = "ckptstore.manifest.json"
MARKER_NAME = "COMMITTED"


@dataclass(frozen=True)
class FileEntry:
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
    doc = {**asdict(r), "crc32c": format_crc(r.crc32c)}
    doc.pop("span")
    if r.span is not None:  # absent otherwise: the document is as before
        doc["span"] = {**asdict(r.span), "crc32c": format_crc(r.span.crc32c)}
    return doc


def _parse_span(doc: dict[str, Any] | None) -> Span | None:
    if doc is None:
        return None
    return Span(int(doc["offset"]), int(doc["length"]), parse_crc(doc["crc32c"]))


@dataclass
class Manifest:
    step: int | None
    world_size: int
    files: dict[str, FileEntry] = field(default_factory=dict)
    ranges: list[RangeEntry] = field(default_factory=list)
    codec: str = "none"
    torch_version: str = ""
    ckptstore_version: str = ""
    created: float = field(default_factory=time.time)
    extra: dict[str, Any] = field(default_factory=dict)
    version: int = FORMAT_VERSION

    def to_bytes(self) -> bytes:
        doc = {
            "format": "ckptstore",
            "version": self.version,
            "step": self.step,
            "world_size": self.world_size,
            "codec": self.codec,
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
        return json.dumps(doc, indent=1, sort_keys=False).encode()

    @classmethod
    def from_bytes(cls, data: bytes, where: str) -> Manifest:
        try:
            doc = json.loads(data)
            if doc.get("format") != "ckptstore":
                raise ValueError("not a ckptstore manifest")
            version = int(doc["version"])
            if version > FORMAT_VERSION:
                raise CorruptCheckpointError(
                    f"{where} has format version {version}, newer than this ckptstore "
                    f"understands ({FORMAT_VERSION}); upgrade ckptstore to read it."
                )
            return cls(
                step=doc["step"],
                world_size=int(doc["world_size"]),
                files={
                    n: FileEntry(int(e["size"]), parse_crc(e["crc32c"]))
                    for n, e in doc["files"].items()
                },
                ranges=[
                    RangeEntry(
                        file=r["file"],
                        offset=int(r["offset"]),
                        length=int(r["length"]),
                        crc32c=parse_crc(r["crc32c"]),
                        key=r.get("key", ""),
                        raw_length=r.get("raw_length"),
                        span=_parse_span(r.get("span")),
                    )
                    for r in doc["ranges"]
                ],
                codec=doc.get("codec", "none"),
                torch_version=doc.get("torch_version", ""),
                ckptstore_version=doc.get("ckptstore_version", ""),
                created=float(doc.get("created", 0.0)),
                extra=doc.get("extra", {}),
                version=version,
            )
        except CorruptCheckpointError:
            raise
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpointError(
                f"{where} is not a valid ckptstore manifest ({exc}); the checkpoint is "
                "damaged: restore from the previous checkpoint."
            ) from exc

    def range_index(self) -> dict[tuple[str, int, int], RangeEntry]:
        return {(r.file, r.offset, r.length): r for r in self.ranges}

    @property
    def total_bytes(self) -> int:
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
        return cls(crc32c(manifest_bytes), len(manifest_bytes), step, attempt)

    def to_bytes(self) -> bytes:
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
        try:
            doc = json.loads(data)
            return cls(
                parse_crc(doc["manifest_crc32c"]),
                int(doc["manifest_size"]),
                doc.get("step"),
                str(doc.get("attempt", "")),
                int(doc.get("version", 1)),
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise CorruptCheckpointError(
                f"{where} is not a valid commit marker ({exc}); treat this checkpoint as "
                "incomplete and restore from the previous one."
            ) from exc

    def matches(self, manifest_bytes: bytes) -> bool:
        return (
            len(manifest_bytes) == self.manifest_size
            and crc32c(manifest_bytes) == self.manifest_crc32c
        )
