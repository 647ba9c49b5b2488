"""``ckptstore-tool inspect CKPT``: every entry, its chunks and files; manifest facts.

Works on committed ckptstore checkpoints, stock DCP checkpoints (no manifest), torn ones
(says so, and shows what the attempt left: its manifest / .metadata copies, its shard files)
and single ``torch.save`` / safetensors files. Reads only metadata for DCP checkpoints.
"""

from __future__ import annotations

import argparse
import pickle
from typing import Any

from ckptstore.cli.context import Context
from ckptstore.cli.render import dump_json, format_shape, format_time, human_bytes, table
from ckptstore.cli.sources import Located, classify, dcp_entries, entries_of, flatten, load_state
from ckptstore.cli.sources import locate as locate_url
from ckptstore.engine.checksum import format_crc
from ckptstore.engine.commit import METADATA_NAME, open_committed
from ckptstore.engine.manifest import MANIFEST_NAME, Manifest
from ckptstore.engine.store import Store
from ckptstore.errors import CkptStoreError, StoreNotFoundError

__all__ = ["add_parser", "run", "describe"]

_STATUS_TEXT = {
    "committed": "committed (COMMITTED matches the manifest)",
    "incomplete": "INCOMPLETE: no COMMITTED marker; the save did not finish. Do not load it.",
    "corrupt": "CORRUPT: COMMITTED does not match any manifest copy. Do not load it.",
    "stock": "stock DCP checkpoint (no ckptstore manifest or marker: nothing is verified)",
}


def add_parser(sub: Any, common: Any) -> None:
    p = sub.add_parser(
        "inspect",
        help="entries, chunks, files and manifest facts of one checkpoint",
        description="Show every entry of a checkpoint (name, dtype, shape, bytes, chunks and "
        "files), the totals, and the manifest facts. Works on stock DCP checkpoints, on torn "
        "ones (says so) and on torch.save / safetensors files.",
    )
    p.add_argument("ckpt", metavar="CKPT", help="checkpoint URL (one step folder) or file")
    common(p)
    p.set_defaults(func=run)


def _best_manifest(store: Store, names: list[str]) -> Manifest | None:
    for name in [MANIFEST_NAME] + sorted(
        n for n in names if n.startswith("ckptstore.manifest.") and n != MANIFEST_NAME
    ):
        try:
            return Manifest.from_bytes(store.get(name), store.describe(name))
        except (StoreNotFoundError, CkptStoreError):
            continue
    return None


def _best_metadata(store: Store, names: list[str]) -> Any:
    for name in [METADATA_NAME] + sorted(n for n in names if n.startswith(METADATA_NAME + ".")):
        try:
            return pickle.loads(store.get(name))
        except Exception:  # noqa: BLE001 - a torn or foreign file: try the next copy
            continue
    return None


def _manifest_facts(m: Manifest | None) -> dict[str, Any] | None:
    if m is None:
        return None
    return {
        "format_version": m.version,
        "step": m.step,
        "world_size": m.world_size,
        "codec": m.codec,
        "checksum": "crc32c",
        "torch_version": m.torch_version,
        "ckptstore_version": m.ckptstore_version,
        "created": m.created,
        "files": len(m.files),
        "total_bytes": m.total_bytes,
        "ranges": len(m.ranges),
        "extra": m.extra,
    }


def _describe_dcp(store: Store) -> dict[str, Any]:
    status = classify(store)
    names = store.listdir()
    notes: list[str] = []
    manifest: Manifest | None = None
    metadata: Any = None
    if status == "committed":
        committed = open_committed(store)
        manifest, metadata = committed.manifest, pickle.loads(committed.metadata_bytes)
    else:
        if status == "corrupt":
            try:
                open_committed(store)
            except CkptStoreError as exc:
                notes.append(str(exc))
        manifest = None if status == "stock" else _best_manifest(store, names)
        metadata = _best_metadata(store, names)
        if status in ("incomplete", "corrupt"):
            if manifest is not None:
                notes.append("manifest shown is an uncommitted copy (what the attempt wrote)")
            if metadata is None:
                notes.append("no readable .metadata: the entries are unknown")
    storage = dict(getattr(metadata, "storage_data", None) or {})
    chunks: dict[str, list[Any]] = {}
    for idx, info in storage.items():
        chunks.setdefault(idx.fqn, []).append(info)
    entries = []
    for e in (dcp_entries(metadata) if metadata is not None else {}).values():
        infos = chunks.get(e.name, [])
        entries.append(
            {
                "name": e.name,
                "kind": e.kind,
                "dtype": e.dtype,
                "shape": list(e.shape) if e.shape is not None else None,
                "bytes": e.nbytes,
                "stored_bytes": sum(i.length for i in infos),
                "chunks": len(infos),
                "files": sorted({i.relative_path for i in infos}),
            }
        )
    files = _files(store, names, manifest, storage, status == "committed")
    tensors = [e for e in entries if e["kind"] == "tensor"]
    objects = [e for e in entries if e["kind"] != "tensor"]
    return {
        "url": store.url,
        "format": "dcp",
        "status": status,
        "manifest": _manifest_facts(manifest),
        "entries": entries,
        "files": files,
        "totals": {
            "entries": len(entries),
            "tensors": len(tensors),
            "tensor_bytes": sum(e["bytes"] or 0 for e in tensors),
            "objects": len(objects),
            "object_stored_bytes": sum(e["stored_bytes"] for e in objects),
            "stored_bytes": sum(f["size"] or 0 for f in files),
            "files": len(files),
        },
        "notes": notes,
    }


def _files(
    store: Store,
    names: list[str],
    manifest: Manifest | None,
    storage: dict[Any, Any],
    committed: bool,
) -> list[dict[str, Any]]:
    """The checkpoint's files: the manifest's list when committed, else what is there."""
    items: dict[str, int] = {}
    for info in storage.values():
        items[info.relative_path] = items.get(info.relative_path, 0) + 1
    listed: dict[str, tuple[int | None, str | None]]
    if committed:
        assert manifest is not None
        listed = {n: (e.size, format_crc(e.crc32c)) for n, e in manifest.files.items()}
    else:  # what is really there, with the checksums the attempt's manifest expected
        expected = manifest.files if manifest is not None else {}
        wanted = set(items) | {n for n in names if n.endswith(".distcp")} | set(expected)
        listed = {}
        for n in sorted(wanted):
            crc = format_crc(expected[n].crc32c) if n in expected else None
            try:
                listed[n] = (store.size(n), crc)
            except StoreNotFoundError:
                listed[n] = (None, crc)
    return [
        {"name": n, "size": size, "crc32c": crc, "items": items.get(n, 0)}
        for n, (size, crc) in sorted(listed.items())
    ]


def _describe_file(ctx: Context, loc: Located) -> dict[str, Any]:
    flat = flatten(load_state(ctx, loc, allow_pickle=False))
    entries = [
        {
            "name": e.name,
            "kind": e.kind,
            "dtype": e.dtype,
            "shape": list(e.shape) if e.shape is not None else None,
            "bytes": e.nbytes,
            "stored_bytes": None,
            "chunks": 1,
            "files": [loc.name],
        }
        for e in entries_of(flat).values()
    ]
    size = loc.store.size(loc.name)
    tensors = [e for e in entries if e["kind"] == "tensor"]
    return {
        "url": loc.url,
        "format": loc.format,
        "status": "file (no manifest: nothing is verified)",
        "manifest": None,
        "entries": entries,
        "files": [{"name": loc.name, "size": size, "crc32c": None, "items": len(entries)}],
        "totals": {
            "entries": len(entries),
            "tensors": len(tensors),
            "tensor_bytes": sum(e["bytes"] or 0 for e in tensors),
            "objects": len(entries) - len(tensors),
            "object_stored_bytes": None,
            "stored_bytes": size,
            "files": 1,
        },
        "notes": [],
    }


def describe(ctx: Context, url: str) -> dict[str, Any]:
    """Everything ``inspect`` shows, as a JSON-ready dict."""
    loc = locate_url(ctx, url)
    return _describe_dcp(loc.store) if loc.format == "dcp" else _describe_file(ctx, loc)


def _print(info: dict[str, Any]) -> None:
    m = info["manifest"]
    print(f"Checkpoint  {info['url']}")
    print(f"Format      {info['format']}")
    print(f"Status      {_STATUS_TEXT.get(info['status'], info['status'])}")
    if m is not None:
        print(
            f"Manifest    version {m['format_version']}, step {m['step']}, world size "
            f"{m['world_size']}, codec {m['codec']}, checksums {m['checksum']}"
        )
        print(
            f"Written     {format_time(m['created'])} by torch {m['torch_version'] or '?'}, "
            f"ckptstore {m['ckptstore_version'] or '?'}"
        )
        for key, value in sorted(m["extra"].items()):
            print(f"Extra       {key}: {value}")
    for n in info["notes"]:
        print(f"Note        {n}")
    rows = []
    for e in info["entries"]:
        files = e["files"]
        shown = ", ".join(files) if len(files) <= 2 else f"{len(files)} files: {files[0]}, ..."
        rows.append(
            [
                e["name"],
                e["dtype"] if e["kind"] == "tensor" else "object",
                format_shape(e["shape"]) if e["kind"] == "tensor" else "-",
                human_bytes(e["bytes"]),
                human_bytes(e["stored_bytes"]),
                e["chunks"],
                shown,
            ]
        )
    if rows:
        print()
        print(
            table(
                ["ENTRY", "DTYPE", "SHAPE", "BYTES", "STORED", "CHUNKS", "FILES"],
                rows,
                right={3, 4, 5},
            )
        )
    t = info["totals"]
    print()
    print(
        f"Totals      {t['entries']} entries: {t['tensors']} tensors "
        f"({human_bytes(t['tensor_bytes'])}), {t['objects']} non-tensor entries; "
        f"{t['files']} files, {human_bytes(t['stored_bytes'])} stored"
    )
    if info["files"]:
        print()
        print(
            table(
                ["FILE", "SIZE", "CRC32C", "ITEMS"],
                [
                    [
                        f["name"],
                        human_bytes(f["size"]) if f["size"] is not None else "missing",
                        f["crc32c"] or "-",
                        f["items"],
                    ]
                    for f in info["files"]
                ],
                right={1, 3},
            )
        )


def run(args: argparse.Namespace, ctx: Context) -> int:
    info = describe(ctx, args.ckpt)
    if ctx.json:
        dump_json(info)
    else:
        _print(info)
    return 0
