"""``ckptstore-tool verify CKPT``: re-read every byte and check it against the manifest.

Exit 0 when every file matches; 1 when anything is damaged (each bad file is named with the
item ranges whose bytes changed), when the checkpoint is torn (no marker) or when the marker
matches no manifest. A stock DCP checkpoint has no checksums: ``verify`` checks that every
file ``.metadata`` names exists and is long enough, and says that is all it can check.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from ckptstore import Store
from ckptstore.cli.context import Context
from ckptstore.cli.render import Progress, dump_json, human_bytes, note, safe, table
from ckptstore.cli.sources import locate
from ckptstore.errors import CkptStoreError, ConfigError, StoreNotFoundError
from ckptstore.format import (
    MAX_METADATA_SIZE,
    METADATA_NAME,
    CheckpointStatus,
    get_capped,
    open_committed,
    verify_checkpoint,
)

__all__ = ["add_parser", "run", "verify_stock"]


def add_parser(sub: Any, common: Any) -> None:
    """Register ``verify`` on the subparsers ``sub`` (``common``: the shared flags)."""
    p = sub.add_parser(
        "verify",
        help="re-read every byte against the manifest (exit 1 if damaged)",
        description="Re-read every file of a committed checkpoint in parallel and check each "
        "file and each stored item range against the manifest's CRC32C. Exit 1 names each "
        "damaged file and range.",
    )
    p.add_argument("ckpt", metavar="CKPT", help="checkpoint URL (one step folder)")
    common(p)
    p.set_defaults(func=run)


def verify_stock(store: Store) -> list[str]:
    """Problems of a stock DCP checkpoint that can be found without checksums.

    ``.metadata`` is read with ``load_metadata`` (DCP's metadata classes only: never a
    plain unpickle of bytes nothing vouches for); one it refuses is the one problem.
    """
    from ckptstore.format import load_metadata

    try:
        data = get_capped(store, METADATA_NAME, MAX_METADATA_SIZE)
        metadata = load_metadata(data, store.describe(METADATA_NAME))
    except CkptStoreError as exc:
        return [str(exc)]
    need: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    problems = []
    for name, end in sorted(need.items()):
        try:
            size = store.size(name)
        except StoreNotFoundError:
            problems.append(f"{name}: missing")
            continue
        if size < end:
            problems.append(f"{name}: {size} bytes, but items reach byte {end} (truncated)")
    return problems


def _result(url: str, status: str, ok: bool, **more: Any) -> dict[str, Any]:
    return {"url": url, "status": status, "ok": ok, **more}


def run(args: argparse.Namespace, ctx: Context) -> int:
    """Run ``verify``; the exit status (1 if anything fails verification)."""
    loc = locate(ctx, args.ckpt)
    if loc.format != "dcp":
        raise ConfigError(
            f"{args.ckpt} is a single {loc.format} file: it has no manifest to verify against. "
            "verify works on DCP checkpoints (convert it with `ckptstore-tool convert --to dcp`)."
        )
    store = loc.store
    try:
        committed = open_committed(store)
    except CkptStoreError as exc:
        from ckptstore.cli.sources import classify

        status = classify(store)
        if status == CheckpointStatus.STOCK:
            problems = verify_stock(store)
            out = _result(store.url, CheckpointStatus.STOCK, not problems, problems=problems)
            if ctx.json:
                dump_json(out)
            else:
                for p in problems:
                    print(f"BAD  {safe(p)}")
                print(
                    f"{'OK' if not problems else 'FAILED'}: {store.url} is a stock DCP "
                    "checkpoint without checksums; only file presence and lengths were checked."
                )
            return 0 if not problems else 1
        out = _result(store.url, status, False, error=str(exc))
        if ctx.json:
            dump_json(out)
        else:
            print(f"FAILED: {safe(exc)}")
        return 1

    total = committed.manifest.total_bytes
    started = time.monotonic()
    with Progress(total, "verify", ctx.progress_enabled) as bar:
        report = verify_checkpoint(store, ctx.engine, committed=committed, on_bytes=bar.update)
    seconds = time.monotonic() - started
    if ctx.json:
        dump_json(
            _result(
                store.url,
                CheckpointStatus.COMMITTED if report.ok else CheckpointStatus.CORRUPT,
                report.ok,
                bytes_read=report.bytes_read,
                seconds=round(seconds, 3),
                files=[
                    {
                        "name": f.name,
                        "ok": f.ok,
                        "size": f.size,
                        "expected_size": f.expected_size,
                        "problem": f.problem,
                        "bad_ranges": f.bad_ranges,
                    }
                    for f in report.files
                ],
            )
        )
        return 0 if report.ok else 1
    rows = []
    for f in report.files:
        rows.append(["OK" if f.ok else "BAD", f.name, human_bytes(f.expected_size), f.problem])
        for r in f.bad_ranges:
            item = f" (item {r.key})" if r.key else ""
            rows.append(["", f"  bytes [{r.offset}, {r.offset + r.length}){item}", "", r.problem])
    print(table(["", "FILE", "SIZE", "PROBLEM"], rows, right={2}))
    bad = report.bad_files
    rate = report.bytes_read / seconds / 2**20 if seconds > 0 else 0.0
    if bad:
        print(
            f"FAILED: {len(bad)} of {len(report.files)} files of {store.url} are damaged. "
            "Do not load this checkpoint; restore the previous one."
        )
    else:
        print(
            f"OK: {len(report.files)} files, {human_bytes(report.bytes_read)} re-read and "
            f"matched the manifest in {seconds:.2f} s ({rate:.0f} MiB/s)."
        )
    if not ctx.quiet and ctx.engine.stats.retries:
        note(f"note: {ctx.engine.stats.retries} transient errors were retried")
    return 0 if not bad else 1
