"""``ckptstore-tool pack SRC DST``: pack a directory of small files into Parquet shards.

A thin front of :func:`ckptstore.data.pack.pack_files`: every non-hidden file under SRC
(or those matching ``--include``) goes, in path order, into ``part-NNNNN.parquet`` shards
under DST with a ``path`` and a ``data`` column; ``ShardedDataset(DST)`` then reads them as
Parquet, each sample the ``{"path", "data"}`` dict a raw file gives. DST must hold no
Parquet files yet.
"""

from __future__ import annotations

import argparse
from typing import Any

from ckptstore.cli.context import Context
from ckptstore.cli.render import dump_json, human_bytes

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, common: Any) -> None:
    """Register ``pack`` on the subparsers ``sub`` (``common``: the shared flags)."""
    p = sub.add_parser(
        "pack",
        help="pack many small files into Parquet shards a data loader reads fast",
        description="Pack every file under SRC (images, clips: one sample each) into Parquet "
        "shards under DST, with a 'path' and a 'data' column, in path order. "
        "ckptstore.data.ShardedDataset(DST) reads them like any Parquet dataset.",
    )
    p.add_argument("src", metavar="SRC", help="URL of the directory of files")
    p.add_argument("dst", metavar="DST", help="URL to write the shards under (no Parquet there)")
    p.add_argument("--shard-size", default="64MiB", help="bytes of files per shard (64MiB)")
    p.add_argument("--row-group-size", default="1MiB", help="bytes of files per row group (1MiB)")
    p.add_argument("--include", metavar="GLOB", help="only paths below SRC matching GLOB")
    common(p, two_sided=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: Context) -> int:
    """Run ``pack``; the exit status."""
    from ckptstore.data import pack_files

    src, dst = ctx.open(args.src, "src"), ctx.open(args.dst, "dst")
    try:
        report = pack_files(
            src,
            dst,
            shard_bytes=args.shard_size,
            row_group_bytes=args.row_group_size,
            include=args.include,
            threads=ctx.config.concurrency,
        )
    finally:
        src.close()
        dst.close()
    if ctx.json:
        dump_json(
            {
                "src": args.src,
                "dst": args.dst,
                "files": report.files,
                "bytes": report.nbytes,
                "shards": list(report.shards),
                "seconds": round(report.seconds, 3),
            }
        )
    else:
        print(
            f"packed {report.files} files ({human_bytes(report.nbytes)}) from {args.src} into "
            f"{len(report.shards)} shards under {args.dst} in {report.seconds:.2f} s"
        )
    return 0
