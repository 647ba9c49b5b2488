"""``ckptstore-tool inspect CKPT``: every entry, its chunks and files; manifest facts.

Works on committed ckptstore checkpoints, stock DCP checkpoints (no manifest), torn ones
(says so, and shows what the attempt left: its manifest / .metadata copies, its shard files)
and single ``torch.save`` / safetensors files. Reads only metadata for DCP checkpoints; the
facts are gathered by :mod:`ckptstore.cli.describe`, this module prints them.

Nothing is unpickled freely: ``.metadata`` (and a torn attempt's ``.metadata.<attempt>``,
checked against the attempt's manifest first) goes through ``load_metadata``, which builds
DCP's metadata classes only; torch.save files load weights-only unless ``--allow-pickle``.
Every file is stat-ed: a size other than the manifest's, a missing file or an item past
its file's end makes the status ``damaged`` (exit 1), as does a ``corrupt`` marker.
"""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore import CheckpointStatus
from ckptstore.cli.context import Context
from ckptstore.cli.describe import describe
from ckptstore.cli.render import dump_json, format_shape, format_time, human_bytes, safe, table

__all__ = ["add_parser", "run", "describe"]

_STATUS_TEXT = {
    "committed": "committed (COMMITTED matches the manifest)",
    "incomplete": "INCOMPLETE: no COMMITTED marker; the save did not finish. Do not load it.",
    "corrupt": "CORRUPT: COMMITTED does not match any manifest copy. Do not load it.",
    "stock": "stock DCP checkpoint (no ckptstore manifest or marker: nothing is verified)",
    "damaged": "DAMAGED: files or metadata do not match (see the notes). Do not load it.",
    "newer": "NEWER: written by a newer ckptstore than this one reads (see the notes): upgrade "
    "ckptstore to load it.",
}


def add_parser(sub: Any, common: Any) -> None:
    """Register ``inspect`` on the subparsers ``sub`` (``common``: the shared flags)."""
    p = sub.add_parser(
        "inspect",
        help="entries, chunks, files and manifest facts of one checkpoint",
        description="Show every entry of a checkpoint (name, dtype, shape, bytes, chunks and "
        "files), the totals, and the manifest facts. Works on stock DCP checkpoints, on torn "
        "ones (says so) and on torch.save / safetensors files.",
    )
    p.add_argument("ckpt", metavar="CKPT", help="checkpoint URL (one step folder) or file")
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="let torch.load run arbitrary pickled objects in a torch.save file (trusted files "
        "only; default: torch.load(weights_only=True)). DCP .metadata is never unpickled freely",
    )
    common(p)
    p.set_defaults(func=run)


def _size_cell(f: dict[str, Any]) -> str:
    if f["size"] is None:
        return "missing"
    want = f.get("expected_size")
    if want is not None and want != f["size"]:
        return f"{human_bytes(f['size'])} (manifest: {human_bytes(want)})"
    return human_bytes(f["size"])


def _print(info: dict[str, Any]) -> None:
    m = info["manifest"]
    print(f"Checkpoint  {safe(info['url'])}")
    print(f"Format      {info['format']}")
    print(f"Status      {_STATUS_TEXT.get(info['status'], info['status'])}")
    if m is not None:
        print(
            f"Manifest    version {m['format_version']}, step {m['step']}, world size "
            f"{m['world_size']}, codec {safe(m['codec'])}, checksums {m['checksum']}"
        )
        print(
            f"Written     {format_time(m['created'])} by torch {m['torch_version'] or '?'}, "
            f"ckptstore {m['ckptstore_version'] or '?'}"
        )
        for key, value in sorted(m["extra"].items()):
            print(f"Extra       {safe(key)}: {safe(value)}")
    for n in info["notes"]:
        print(f"Note        {safe(n)}")
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
                        _size_cell(f),
                        f["crc32c"] or "-",
                        f["items"],
                    ]
                    for f in info["files"]
                ],
                right={1, 3},
            )
        )


def run(args: argparse.Namespace, ctx: Context) -> int:
    """Run ``inspect``; the exit status (1 if the checkpoint is damaged or corrupt)."""
    info = describe(ctx, args.ckpt, allow_pickle=args.allow_pickle)
    if ctx.json:
        dump_json(info)
    else:
        _print(info)
    return 1 if info["status"] in (CheckpointStatus.CORRUPT, CheckpointStatus.DAMAGED) else 0
