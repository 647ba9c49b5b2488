"""S3's server-side copy (``S3Store.copy``): the bytes stay on the server.

An object stored in one part is copied by one ``CopyObject``; its ETag (the MD5 of its
bytes) must come back unchanged. A multipart object is copied part for part, in parallel,
by ``UploadPartCopy`` of the source's own part ranges (``HEAD ?partNumber=n``) into a new
multipart upload: every part reports the CRC32C of the bytes that landed, and their
composite must equal the source's (S3Store sends a CRC32C with every part it writes), so a
damaged copy is caught before ``CompleteMultipartUpload`` makes it visible; on any failure
the upload is aborted and nothing appears. Every copy request names the source's ETag
(``CopySourceIfMatch``): a source replaced midway fails the copy instead of mixing two
objects. The destination's size is checked last.
"""

from __future__ import annotations

import base64
import contextlib
import re
from typing import Any

from ckptstore.engine.checksum import crc32c
from ckptstore.errors import CorruptCheckpointError
from ckptstore.stores._cloud import parallel
from ckptstore.stores.s3.client import S3Client

__all__ = ["copy_object"]

#: S3's smallest part (all but the last).
MIN_PART = 5 * 1024 * 1024
_RANGE = re.compile(r"bytes (\d+)-(\d+)/\d+")


def _composite(part_crcs: list[str]) -> str:
    """S3's COMPOSITE CRC32C of parts whose CRC32Cs (base64) are ``part_crcs``."""
    joined = b"".join(base64.b64decode(c) for c in part_crcs)
    return f"{base64.b64encode(crc32c(joined).to_bytes(4, 'big')).decode()}-{len(part_crcs)}"


def _part_sizes(client: S3Client, key: str, count: int, total: int, what: str) -> list[int]:
    """The sizes of the ``count`` parts of ``key`` (``HEAD ?partNumber=n``), or, from a
    server that does not report them (moto), about ``count`` equal ranges of at least S3's
    5 MiB minimum (the last shorter)."""
    heads = parallel(
        lambda n: client.call("head_object", what, Key=key, PartNumber=n),
        list(range(1, count + 1)),
    )
    sizes = [int(h["ContentLength"]) for h in heads]
    if sum(sizes) == total and all(_RANGE.fullmatch(str(h.get("ContentRange"))) for h in heads):
        return sizes
    step = max(-(-total // count), MIN_PART)
    return [min(step, total - start) for start in range(0, total, step)]


def _copy_parts(client: S3Client, src: str, dst: str, head: dict[str, Any], what: str) -> None:
    count = int(head["ETag"].strip('"').rpartition("-")[2])
    sizes = _part_sizes(client, src, count, int(head["ContentLength"]), what)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    ranges = [(start, start + size - 1) for start, size in zip(starts, sizes)]
    source = {"Bucket": client.bucket, "Key": src}
    upload_id = client.call("create_multipart_upload", what, Key=dst, ChecksumAlgorithm="CRC32C")[
        "UploadId"
    ]

    def part(job: tuple[int, tuple[int, int]]) -> dict[str, Any]:
        number, (first, last) = job
        out = client.call(
            "upload_part_copy",
            what,
            Key=dst,
            UploadId=upload_id,
            PartNumber=number,
            CopySource=source,
            CopySourceRange=f"bytes={first}-{last}",
            CopySourceIfMatch=head["ETag"],
        )["CopyPartResult"]
        crc = out.get("ChecksumCRC32C")
        return {"PartNumber": number, "ETag": out["ETag"], "ChecksumCRC32C": crc}

    try:
        parts = parallel(part, list(enumerate(ranges, 1)))
        crcs = [p["ChecksumCRC32C"] for p in parts]
        expected = head.get("ChecksumCRC32C")  # comparable if the parts are the source's
        comparable = expected and expected.endswith(f"-{len(crcs)}") and all(crcs)
        if comparable and _composite(crcs) != expected:
            raise CorruptCheckpointError(
                f"{what}: the copied parts' CRC32C {_composite(crcs)} is not the source's "
                f"{expected}; nothing was made"
            )
        for p in parts:
            if not p["ChecksumCRC32C"]:
                del p["ChecksumCRC32C"]
        client.call(
            "complete_multipart_upload",
            what,
            Key=dst,
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},
        )
    except BaseException:
        with contextlib.suppress(Exception):  # the copy's own error is the one to raise
            client.call("abort_multipart_upload", what, Key=dst, UploadId=upload_id)
        raise


def copy_object(client: S3Client, src: str, dst: str, what: str) -> None:
    """Copy key ``src`` to key ``dst`` in ``client``'s bucket (the module docstring)."""
    head = client.call("head_object", what, Key=src, ChecksumMode="ENABLED")
    etag = str(head["ETag"])
    if "-" in etag:
        _copy_parts(client, src, dst, head, what)
    else:
        out = client.call(
            "copy_object",
            what,
            Key=dst,
            CopySource={"Bucket": client.bucket, "Key": src},
            CopySourceIfMatch=etag,
        )
        landed = str(out["CopyObjectResult"]["ETag"]).strip('"')
        if landed != etag.strip('"'):
            client.call("delete_object", what, Key=dst)
            raise CorruptCheckpointError(
                f"{what}: the copy's ETag {landed} is not the source's {etag}; it was deleted"
            )
    size = int(client.call("head_object", what, Key=dst)["ContentLength"])
    if size != int(head["ContentLength"]):
        client.call("delete_object", what, Key=dst)
        raise CorruptCheckpointError(
            f"{what}: {size} bytes landed of the source's {head['ContentLength']}; the copy "
            "was deleted"
        )
