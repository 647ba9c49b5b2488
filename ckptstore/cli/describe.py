"""What ``ckptstore-tool inspect`` reports, as data: :func:`describe` gathers a checkpoint's (or a
single file's) status, manifest facts, entries, files and problems; ``inspect`` renders it.

Nothing is unpickled freely: ``.metadata`` (and a torn attempt's ``.metadata.<attempt>``,
checked against the attempt's manifest first) goes through ``load_metadata``, which builds
DCP's metadata classes only; torch.save files load weights-only unless ``allow_pickle``.
Every file is stat-ed: a size other than the manifest's, a missing file or an item past
its file's end makes the status ``damaged``, as does a ``corrupt`` marker.
"""

from __future__ import annotations

from typing import Any

from ckptstore import Store
from ckptstore.cli.context import Context
from ckptstore.cli.sources import Located, classify, dcp_entries, entries_of, flatten, load_state
from ckptstore.cli.sources import locate as locate_url
from ckptstore.errors import CkptStoreError, NewerFormatError, StoreNotFoundError
from ckptstore.format import (
    MANIFEST_NAME,
    MAX_MANIFEST_SIZE,
    MAX_METADATA_SIZE,
    METADATA_NAME,
    CheckpointStatus,
    Manifest,
    crc32c,
    format_crc,
    get_capped,
    open_committed,
)

__all__ = ["describe"]


def _manifest_copies(store: Store, names: list[str]) -> list[tuple[str, Manifest]]:
    """Every manifest copy that parses, the canonical one first."""
    out = []
    for name in [MANIFEST_NAME] + sorted(
        n for n in names if n.startswith("ckptstore.manifest.") and n != MANIFEST_NAME
    ):
        try:
            data = get_capped(store, name, MAX_MANIFEST_SIZE)
            out.append((name, Manifest.from_bytes(data, store.describe(name))))
        except CkptStoreError:  # missing, torn or foreign: try the next copy
            continue
    return out


def _metadata_matches(data: bytes, manifest: Manifest) -> bool:
    entry = manifest.files.get(METADATA_NAME)
    return entry is not None and len(data) == entry.size and crc32c(data) == entry.crc32c


def _uncommitted_metadata(
    store: Store, names: list[str], manifests: list[tuple[str, Manifest]], notes: list[str]
) -> tuple[Any, Manifest | None]:
    """The entries of a torn or corrupt checkpoint: the first ``.metadata`` copy that one of
    the attempt's manifests vouches for (and that manifest), else the first copy that reads
    as DCP metadata at all, noted as unverified. Never a plain unpickle: every copy goes
    through ``load_metadata`` (DCP's classes only)."""
    from ckptstore.format import load_metadata

    copies = [n for n in [METADATA_NAME] if n in names] + sorted(
        n for n in names if n.startswith(METADATA_NAME + ".")
    )
    readable: list[tuple[str, Any]] = []
    for name in copies:
        try:
            data = get_capped(store, name, MAX_METADATA_SIZE)
            metadata = load_metadata(data, store.describe(name))
        except CkptStoreError as exc:
            notes.append(str(exc))
            continue
        for _, manifest in manifests:
            if _metadata_matches(data, manifest):
                return metadata, manifest
        readable.append((name, metadata))
    if readable:
        name, metadata = readable[0]
        notes.append(f"{name} matches no manifest copy: its entries are shown unverified")
        return metadata, manifests[0][1] if manifests else None
    return None, manifests[0][1] if manifests else None


def _stock_metadata(store: Store, notes: list[str]) -> Any:
    from ckptstore.format import load_metadata

    try:
        data = get_capped(store, METADATA_NAME, MAX_METADATA_SIZE)
        return load_metadata(data, store.describe(METADATA_NAME))
    except CkptStoreError as exc:
        notes.append(str(exc))
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


def _note_codec(store: Store, manifest: Manifest, notes: list[str]) -> None:
    """A note naming the manifest's codec when this ckptstore cannot decode it (unknown:
    a newer writer's or a plugin's, or damage; or its library is missing). Not damage by
    itself: the entries are still listed, and loading them is what is refused."""
    from ckptstore.format import stored_codec

    try:
        stored_codec(manifest.codec_descriptor, store.describe(MANIFEST_NAME)).require()
    except (CkptStoreError, ImportError) as exc:
        notes.append(f"its items cannot be decoded here: {exc}")


def _describe_dcp(store: Store) -> dict[str, Any]:
    status = classify(store)
    names = store.listdir()
    notes: list[str] = []
    manifest: Manifest | None = None
    metadata: Any = None
    from ckptstore.format import load_metadata

    if status == CheckpointStatus.COMMITTED:
        committed = open_committed(store)  # .metadata's bytes verified against the manifest
        manifest = committed.manifest
        try:
            metadata = load_metadata(
                committed.metadata_bytes, store.describe(METADATA_NAME), manifest.torch_version
            )
        except NewerFormatError as exc:  # a newer torch's layout: not damage
            notes.append(str(exc))
        except CkptStoreError as exc:  # vouched for by a (re-signed?) manifest, yet hostile
            notes.append(str(exc))
            status = CheckpointStatus.DAMAGED
    elif status == "stock":
        metadata = _stock_metadata(store, notes)
        if metadata is None:
            status = "damaged"
    else:
        if status in ("corrupt", "newer"):
            try:
                open_committed(store)
            except CkptStoreError as exc:
                notes.append(str(exc))
        manifests = _manifest_copies(store, names)
        metadata, manifest = _uncommitted_metadata(store, names, manifests, notes)
        if status in ("incomplete", "corrupt"):
            if manifest is not None:
                notes.append("manifest shown is an uncommitted copy (what the attempt wrote)")
            if metadata is None:
                notes.append("no readable .metadata: the entries are unknown")
    if manifest is not None:
        _note_codec(store, manifest, notes)
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
    files = _files(store, names, manifest, storage, only_manifest=status == "committed")
    problems = _file_problems(files, metadata, store)
    if problems:
        notes += problems
        if status in ("committed", "stock"):
            status = "damaged"
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
    only_manifest: bool,
) -> list[dict[str, Any]]:
    """The checkpoint's files as they really are (each one stat-ed), with the size and
    checksum the manifest expects, when there is one: the manifest's files for a committed
    checkpoint, else what the metadata and manifest name and the shards that are there."""
    items: dict[str, int] = {}
    for info in storage.values():
        items[info.relative_path] = items.get(info.relative_path, 0) + 1
    expected = manifest.files if manifest is not None else {}
    wanted = set(expected)
    if not only_manifest:
        wanted |= set(items) | {n for n in names if n.endswith(".distcp")}
    out = []
    for n in sorted(wanted):
        try:
            size: int | None = store.size(n)
        except StoreNotFoundError:
            size = None
        entry = expected.get(n)
        out.append(
            {
                "name": n,
                "size": size,
                "expected_size": entry.size if entry is not None else None,
                "crc32c": format_crc(entry.crc32c) if entry is not None else None,
                "items": items.get(n, 0),
            }
        )
    return out


def _file_problems(files: list[dict[str, Any]], metadata: Any, store: Store) -> list[str]:
    """What the sizes alone show is wrong: files missing or of another size than the
    manifest says, items reaching past the end of their file."""
    problems = []
    for f in files:
        want = f["expected_size"]
        if f["size"] is None and (want is not None or f["items"]):
            problems.append(f"{f['name']} is missing")
        elif want is not None and f["size"] != want:
            problems.append(
                f"{f['name']} is {f['size']} bytes, the manifest says {want}: the file is "
                "damaged (`ckptstore-tool verify` checks every byte)"
            )
    if metadata is not None and not problems:
        from ckptstore.format import check_metadata

        sizes = {f["name"]: f["size"] for f in files if f["size"] is not None}
        try:
            # The manifest's codec is not at hand: any known codec's ratio bounds a tensor.
            check_metadata(metadata, sizes, store.describe(METADATA_NAME), max_ratio=None)
        except CkptStoreError as exc:
            problems.append(str(exc))
    return problems


def _describe_file(ctx: Context, loc: Located, allow_pickle: bool) -> dict[str, Any]:
    flat = flatten(load_state(ctx, loc, allow_pickle=allow_pickle))
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
        "files": [
            {
                "name": loc.name,
                "size": size,
                "expected_size": None,
                "crc32c": None,
                "items": len(entries),
            }
        ],
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


def describe(ctx: Context, url: str, allow_pickle: bool = False) -> dict[str, Any]:
    """Everything ``inspect`` shows, as a JSON-ready dict."""
    loc = locate_url(ctx, url)
    if loc.format == "dcp":
        return _describe_dcp(loc.store)
    return _describe_file(ctx, loc, allow_pickle)
