"""S3's native multipart upload: what ``S3Store``'s multipart methods are made of.

Call order (the engine drives it; see ``ckptstore.engine.store``)::

    up = store.begin_multipart(path)            # CreateMultipartUpload (ChecksumAlgorithm)
    store.put_part(up, n, offset, data)         # UploadPart, any order, many threads at once
    store.complete_multipart(up, parts)         # CompleteMultipartUpload
    store.abort_multipart(up)                   # AbortMultipartUpload, on any failure

Each function takes the bucket's ``S3Client``, the object's key and its ``name`` for
messages (``store.describe(path)``). A CRC32C sent with a part is kept in
``upload.extra["checksums"]``: CompleteMultipartUpload must repeat it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from ckptstore.engine.store import Multipart, Part
from ckptstore.errors import StoreNotFoundError
from ckptstore.stores.s3.body import multipart_etag
from ckptstore.stores.s3.client import S3Client
from ckptstore.stores.s3.error_map import error_code

__all__ = ["begin", "upload_part", "complete", "abort", "unfinished", "held_parts"]


def begin(client: S3Client, key: str, checksum: str, name: str) -> str:
    """CreateMultipartUpload (announcing CRC32C part checksums); returns the upload id."""
    kwargs: dict[str, Any] = {"ChecksumAlgorithm": "CRC32C"} if checksum == "crc32c" else {}
    out = client.call("create_multipart_upload", f"upload of {name}", Key=key, **kwargs)
    return str(out["UploadId"])


def upload_part(
    client: S3Client,
    key: str,
    upload: Multipart,
    number: int,
    offset: int,
    body: Any,
    size: int,
    integrity: dict[str, Any],
    name: str,
) -> Part:
    """UploadPart of ``body`` (``size`` bytes) with its ``integrity`` headers."""
    out = client.call(
        "upload_part",
        f"upload of {name} (part {number})",
        Key=key,
        UploadId=upload.upload_id,
        PartNumber=number,
        Body=body,
        **integrity,
    )
    if "ChecksumCRC32C" in integrity:  # CompleteMultipartUpload must repeat it
        upload.extra.setdefault("checksums", {})[number] = integrity["ChecksumCRC32C"]
    return Part(number, offset, size, out["ETag"])


def complete(
    client: S3Client, key: str, upload: Multipart, parts: Sequence[Part], name: str
) -> None:
    """CompleteMultipartUpload; idempotent when a retry follows a lost response.

    If the server no longer knows the upload but the object exists with the size (and,
    where the ETags allow, the multipart ETag) these parts make, it is already done.
    """
    checksums = upload.extra.get("checksums") or {}
    listed = []
    for p in sorted(parts, key=lambda p: p.number):
        entry = {"PartNumber": p.number, "ETag": p.etag}
        if p.number in checksums:
            entry["ChecksumCRC32C"] = checksums[p.number]
        listed.append(entry)
    try:
        client.raw(
            "complete_multipart_upload",
            Key=key,
            UploadId=upload.upload_id,
            MultipartUpload={"Parts": listed},
        )
    except Exception as exc:  # noqa: BLE001 - translated below
        if error_code(exc)[0] == "NoSuchUpload" and _already_complete(client, key, parts, name):
            return
        raise client.translate(exc, f"upload of {name}") from exc


def _already_complete(client: S3Client, key: str, parts: Sequence[Part], name: str) -> bool:
    try:
        head = client.call("head_object", f"stat of {name}", Key=key)
    except StoreNotFoundError:
        return False
    if int(head["ContentLength"]) != sum(p.size for p in parts):
        return False
    expected = multipart_etag(parts)
    actual = str(head.get("ETag", "")).strip('"')
    return expected is None or "-" not in actual or actual == expected


def abort(client: S3Client, key: str, upload_id: str, name: str) -> None:
    """AbortMultipartUpload; an upload already aborted or completed is no error."""
    try:
        client.raw("abort_multipart_upload", Key=key, UploadId=upload_id)
    except Exception as exc:  # noqa: BLE001 - translated below
        code, status = error_code(exc)
        if code == "NoSuchUpload" or status == 404:
            return  # already aborted or completed: nothing left to discard
        raise client.translate(exc, f"abort of upload of {name}") from exc


def unfinished(client: S3Client, base: str, rel: Callable[[str], str]) -> list[Multipart]:
    """The uploads under key ``base`` (the key itself or below it), named by ``rel(key)``,
    with ``extra["initiated"]`` where the listing gives it."""
    out: list[Multipart] = []
    for u in client.list_uploads(base):
        key = u["Key"]
        if base and key != base and not key.startswith(f"{base}/"):
            continue
        initiated = u.get("Initiated")
        extra = {"initiated": initiated.timestamp()} if initiated is not None else {}
        out.append(Multipart(rel(key), u["UploadId"], extra=extra))
    return out


def held_parts(client: S3Client, key: str, upload_id: str) -> list[Part]:
    """The parts the server holds for an unfinished upload (offsets unknown: 0)."""
    return [
        Part(int(p["PartNumber"]), 0, int(p["Size"]), p["ETag"])
        for p in client.list_parts(key, upload_id)
    ]
