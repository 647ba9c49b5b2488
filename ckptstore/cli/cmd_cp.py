"""``ckptstore-tool cp SRC DST``: copy a committed checkpoint between any two stores.

Data files stream through the transfer engine as parallel parts, each file's CRC32C is checked
against the source manifest before the file is made visible at the destination, and the
destination is committed last (manifest, ``.metadata``, then the create-only ``COMMITTED``).
Ctrl-C stops the copy, aborts open uploads, removes what was copied and commits nothing.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

from ckptstore.cli.context import Context
from ckptstore.cli.render import Progress, dump_json, human_bytes, note
from ckptstore.cli.sources import require_committed
from ckptstore.errors import ConfigError
from ckptstore.format import (
    MARKER_NAME,
    METADATA_NAME,
    check_empty_destination,
    copy_checkpoint,
    open_committed,
)

__all__ = ["add_parser", "run"]

EXIT_INTERRUPTED = 130


def add_parser(sub: Any, common: Any) -> None:
    """Register ``cp`` on the subparsers ``sub`` (``common``: the shared flags)."""
    p = sub.add_parser(
        "cp",
        help="copy a committed checkpoint between any two stores, verified, committed last",
        description="Copy a committed checkpoint to another URL (any store to any store) with "
        "parallel parts, checking every file's CRC32C against the manifest on the fly, and "
        "committing the destination last. Interrupting it (Ctrl-C) leaves nothing committed.",
    )
    p.add_argument("src", metavar="SRC", help="committed checkpoint URL (one step folder)")
    p.add_argument("dst", metavar="DST", help="destination URL (must be empty)")
    p.add_argument(
        "--force", action="store_true", help="replace whatever is at DST (uncommits it first)"
    )
    common(p, two_sided=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, ctx: Context) -> int:
    """Run ``cp``; the exit status."""
    src = ctx.open(args.src, "src")
    dst = ctx.open(args.dst, "dst")
    if src.url == dst.url:
        raise ConfigError("SRC and DST are the same location")
    require_committed(src, args.src, "copy")
    check_empty_destination(dst, args.force)
    committed = open_committed(src)
    total = sum(e.size for n, e in committed.manifest.files.items() if n != METADATA_NAME)
    cancel = threading.Event()
    # A volume destination this copy creates is removed again if the copy fails (only while
    # it is empty); one that existed before, perhaps the user's, stays.
    made_dst = os.path.isabs(dst.url) and not os.path.lexists(dst.url)
    started = time.monotonic()
    try:
        with Progress(total, "cp", ctx.progress_enabled) as bar:
            result = copy_checkpoint(
                src, dst, ctx.engine, overwrite=args.force, on_bytes=bar.update, cancel=cancel
            )
    except BaseException as exc:
        cancel.set()
        committed_at_dst = dst.exists(MARKER_NAME)
        if made_dst and not committed_at_dst:
            dst.remove_empty_dirs()
        if not isinstance(exc, KeyboardInterrupt):
            raise
        print(
            f"interrupted: {args.dst} "
            + (
                "was already committed (the copy had finished)."
                if committed_at_dst
                else "holds no committed checkpoint; the partial copy was removed."
            ),
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    seconds = time.monotonic() - started
    rate = result.bytes / seconds / 2**20 if seconds > 0 else 0.0
    if ctx.json:
        dump_json(
            {
                "src": result.src,
                "dst": result.dst,
                "files": result.files,
                "bytes": result.bytes,
                "seconds": round(seconds, 3),
                "committed": True,
                "step": result.marker.step,
            }
        )
    else:
        print(
            f"copied {result.files} files ({human_bytes(result.bytes)}) {result.src} -> "
            f"{result.dst} in {seconds:.2f} s ({rate:.0f} MiB/s); every file matched the "
            "manifest; committed."
        )
    if not ctx.quiet and ctx.engine.stats.retries:
        note(f"note: {ctx.engine.stats.retries} transient errors were retried")
    return 0
