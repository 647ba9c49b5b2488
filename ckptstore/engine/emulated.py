"""Multipart uploads emulated on whole-object primitives: ``Store``'s default.

A store that implements only ``put``, ``get``, ``size``, ``find`` and ``delete`` gets
multipart writes from these functions (``Store.begin_multipart`` and the rest call them).
Every object they make is a ckptstore temp object beside the target, named with
``engine.names.TMP_MARK``, so ``names.is_ckptstore_file`` and the deletion rules
recognise it, and the commit's leftover cleanup never takes it for a finished file::

    up = begin(store, "d/obj")           # puts d/obj.ckptstore-tmp-<id>        (begin marker,
                                         #   32 hex; holds the start time, for the sweeper)
    put_part(store, up, n, offset, b)    # puts d/obj.ckptstore-tmp-<id><n:08x> (a part)
    complete(store, up, parts)           # one put of d/obj from the parts, in number order;
                                         #   then deletes the parts, the marker last
    abort(store, up)                     # deletes the parts, then the marker (idempotent)
    list_uploads(store, prefix)          # one Multipart per begin marker under prefix

The target is written by one ``put`` (atomic on every store whose ``put`` is), so no
half-written object under the target's name can be mistaken for a good one. ``complete``
holds the whole object in memory once (plus one part); stores with a native parallel path
override all five methods. A retried ``complete`` whose first try landed (its response
lost) finds the marker gone and the target whole: that is a success.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ckptstore.engine.names import TMP_MARK
from ckptstore.errors import CkptStoreError, StoreNotFoundError, UnsafePathError

if TYPE_CHECKING:
    from ckptstore.engine.store import Buffer, Multipart, Part, Store

__all__ = ["begin", "put_part", "complete", "abort", "list_uploads"]

_ID = re.compile(r"^[0-9a-f]{32}$")
_PART = re.compile(r"^[0-9a-f]{8}$")


def _marker(upload: Multipart) -> str:
    if not _ID.match(upload.upload_id):
        raise UnsafePathError(
            f"upload id {upload.upload_id!r} of {upload.path!r} is not one ckptstore made "
            "(32 hex digits); nothing was read, written or deleted"
        )
    return f"{upload.path}{TMP_MARK}{upload.upload_id}"


def _part(upload: Multipart, number: int) -> str:
    if not 1 <= number <= 0xFFFFFFFF:
        raise ValueError(f"part numbers are 1..{0xFFFFFFFF}, got {number}")
    return f"{_marker(upload)}{number:08x}"


def begin(store: Store, path: str) -> Multipart:
    """Start an upload of ``path``: put its begin marker (holding the start time)."""
    from ckptstore.engine.store import Multipart

    initiated = time.time()
    upload = Multipart(path, uuid.uuid4().hex, extra={"initiated": initiated})
    store.put(_marker(upload), repr(initiated).encode())
    return upload


def put_part(store: Store, upload: Multipart, number: int, offset: int, data: Buffer) -> Part:
    """Put part ``number`` as a temp object of its own; the ``Part`` to complete with."""
    from ckptstore.engine.store import Part

    name = _part(upload, number)
    if not store.exists(_marker(upload)):
        raise StoreNotFoundError(
            f"part {number} of {store.describe(upload.path)}: the upload was aborted or completed"
        )
    store.put(name, data)
    return Part(number, offset, memoryview(data).nbytes)


def _parts_on_store(store: Store, upload: Multipart) -> list[str]:
    """The part objects of ``upload`` that exist (any number), sorted."""
    head = upload.path.rpartition("/")[0]
    mark = _marker(upload)
    return [n for n in store.find(head) if n.startswith(mark) and _PART.match(n[len(mark) :])]


def _whole(store: Store, path: str, total: int) -> bool:
    try:
        return store.size(path) == total
    except StoreNotFoundError:
        return False


def complete(store: Store, upload: Multipart, parts: Sequence[Part]) -> None:
    """Write the target in one put from the parts in number order, then delete them."""
    what = f"upload of {store.describe(upload.path)}"
    ordered = sorted(parts, key=lambda p: p.number)
    total = sum(p.size for p in ordered)
    if not store.exists(_marker(upload)):
        if _whole(store, upload.path, total):
            return  # a retry after a lost response: done already
        raise StoreNotFoundError(f"{what}: the upload was aborted or completed")
    body = bytearray(total)
    into = memoryview(body)  # no temporary copy of each part (bytearray's slice assignment)
    pos = 0
    for p in ordered:
        try:
            data = store.get(_part(upload, p.number))
        except StoreNotFoundError:
            if _whole(store, upload.path, total):  # completed; its cleanup was cut short
                abort(store, upload)
                return
            raise
        if len(data) != p.size:
            raise StoreNotFoundError(
                f"{what}: part {p.number} holds {len(data)} bytes, not {p.size}; upload it again"
            )
        into[pos : pos + p.size] = data
        pos += p.size
    store.put(upload.path, body)
    abort(store, upload)  # the target is whole: now only the temp objects go


def abort(store: Store, upload: Multipart) -> None:
    """Delete the upload's parts, then its marker (idempotent)."""
    marker = _marker(upload)
    store.delete_many(_parts_on_store(store, upload))
    store.delete(marker)  # last: an abort cut short stays listed, and is swept again


def list_uploads(store: Store, prefix: str) -> list[Multipart]:
    """One ``Multipart`` per begin marker under ``prefix``."""
    from ckptstore.engine.store import Multipart

    out = []
    for name in store.find(prefix):
        path, mark, upload_id = name.rpartition(TMP_MARK)
        if not mark or not path or not _ID.match(upload_id):
            continue
        extra: dict[str, float] = {}
        try:
            extra["initiated"] = float(store.get(name, 0, 64).decode("ascii"))
        except (CkptStoreError, ValueError, UnicodeDecodeError):
            pass  # completed or aborted meanwhile, or not ours to date: age unknown (kept)
        out.append(Multipart(path, upload_id, extra=extra))
    return out
