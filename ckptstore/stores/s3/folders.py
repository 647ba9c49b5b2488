"""Bulk deletes and folder keys on S3: what ``S3Store``'s deletions are made of.

Servers with real folders (SeaweedFS) keep an emptied folder, and list it as a common
prefix, until its key (``a/b/``) is deleted; on AWS such keys are folder-marker objects,
if any. So after deleting objects, the store deletes the folder keys they leave empty,
deepest first. Deleting a folder key never deletes objects still in the folder.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ckptstore.errors import TransientStoreError
from ckptstore.stores.s3.client import S3Client

__all__ = ["delete_keys", "delete_by_depth", "empty_folders", "folders_of"]


def _client_error(error: dict[str, Any]) -> Exception:
    from botocore.exceptions import ClientError

    return ClientError({"Error": error}, "DeleteObjects")


def delete_keys(client: S3Client, keys: list[str], where: str) -> None:
    """DeleteObjects, 1000 keys a request; a missing key is no error (``where``: a URL)."""
    for i in range(0, len(keys), 1000):
        batch = keys[i : i + 1000]
        what = f"delete of {len(batch)} objects under {where}"
        out = client.call(
            "delete_objects",
            what,
            Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
        )
        errors = [e for e in out.get("Errors", []) if e.get("Code") != "NoSuchKey"]
        if not errors:
            continue
        first = errors[0]
        detail = f"{len(errors)} failed, e.g. {first.get('Key')}: {first.get('Code')}"
        if all(e.get("Code") in ("SlowDown", "InternalError") for e in errors):
            raise TransientStoreError(f"{what}: {detail}")
        raise client.translate(_client_error(first), f"{what} ({detail})")


def delete_by_depth(client: S3Client, folders: Iterable[str], where: str) -> None:
    """Delete folder keys, deepest first (a parent only after its children)."""
    folders = set(folders)
    for depth in sorted({f.count("/") for f in folders}, reverse=True):
        delete_keys(client, sorted(f for f in folders if f.count("/") == depth), where)


def empty_folders(client: S3Client, base: str) -> list[str]:
    """The folder keys under bucket key ``base`` (and ``base/`` itself) holding no object."""
    folders: list[str] = []
    holds: set[str] = set()  # folders with an object somewhere below

    def walk(folder: str) -> bool:
        keys, dirs = client.list_objects(folder, delimiter="/")
        full = any(not k.endswith("/") for k in keys)
        for d in dirs:
            if d != folder and walk(d):
                full = True
        folders.append(folder)
        if full:
            holds.add(folder)
        return full

    if base:
        walk(f"{base}/")
    else:
        for d in client.list_objects("", delimiter="/")[1]:
            walk(d)
    return [f for f in folders if f not in holds]


def folders_of(keys: Iterable[str], markers: Iterable[str], base: str) -> set[str]:
    """The folder keys of ``base`` and of every folder below it that ``keys`` were in."""
    folders = set(markers) | ({f"{base}/"} if base else set())
    for key in keys:
        head = key.rpartition("/")[0]
        while head and len(head) > len(base):
            folders.add(f"{head}/")
            head = head.rpartition("/")[0]
    return folders
