"""Pack a directory of small files into Parquet shards ahead of time.

A dataset of many small files (images, audio clips) read with ``format="raw"`` costs a
cache entry per file: a lock, a pre-allocated temp file, a GET, a CRC, a ``.meta`` and a
rename each. Packed into shards of a few MiB, the same files are a Parquet dataset with two
columns, ``path`` (the file's path below the source) and ``data`` (its bytes), which
:class:`~ckptstore.data.ShardedDataset` reads like any other; a sample is the same
``{"path": ..., "data": ...}`` dict that a raw file gives (as litdata's ``optimize()`` and
Mosaic's ``MDSWriter`` do for their own formats)::

    report = pack_files("s3://bucket/images/", "s3://bucket/images-packed/",
                        shard_bytes="64MiB")          # lists, reads, writes part-*.parquet
    ds = ShardedDataset("s3://bucket/images-packed/", format="parquet")

How files are packed and how the output is published at once (a create-only pending
marker, a lease against a concurrent pack) is :func:`pack_files`'s docstring.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from ckptstore.config import TransferConfig
from ckptstore.engine.bounded import get_capped
from ckptstore.engine.lease import Heartbeat, is_lease_name, lease_name, live_leases, this_host
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import (
    CkptStoreError,
    CommitConflictError,
    ConfigError,
    CorruptCheckpointError,
    DatasetChangedError,
    EmptyDatasetError,
)

__all__ = ["PACK_PENDING", "PackReport", "pack_files", "plan_shards", "SHARD_NAME"]

log = logging.getLogger(__name__)

#: Shard ``k`` of a packed dataset is written as ``SHARD_NAME.format(k)``.
SHARD_NAME = "part-{:05d}.parquet"
_SHARD_RE = re.compile(r"part-[0-9]{5,}\.parquet")
#: Present in a pack's destination from its start until its last shard is durable.
PACK_PENDING = ".ckptstore-pack-pending.json"
_PENDING_MAX = 1 << 20  # a marker naming ~40k shards; a larger one is not ours


@dataclass(frozen=True)
class PackReport:
    """What :func:`pack_files` wrote: counts, bytes and the shard paths below ``dst``."""

    files: int
    nbytes: int  # the files' bytes (the shards add a small Parquet overhead)
    shards: tuple[str, ...]
    seconds: float


def plan_shards(sizes: Sequence[tuple[str, int]], shard_bytes: int) -> list[list[tuple[str, int]]]:
    """Split ``(path, size)`` pairs, in the order given, into runs of <= ``shard_bytes``.

    A run closes before the file that would take it past ``shard_bytes``; a file larger
    than that is a run of its own. No run is empty; the runs concatenate to ``sizes``.
    """
    if shard_bytes < 1:
        raise ConfigError(f"shard_bytes must be >= 1, got {shard_bytes}")
    runs: list[list[tuple[str, int]]] = []
    run: list[tuple[str, int]] = []
    held = 0
    for path, size in sizes:
        if run and held + size > shard_bytes:
            runs.append(run)
            run, held = [], 0
        run.append((path, size))
        held += size
    if run:
        runs.append(run)
    return runs


def _row_groups(sizes: Sequence[int], group_bytes: int) -> list[int]:
    """Rows per row group: consecutive files of <= ``group_bytes`` (at least one each)."""
    return [len(run) for run in plan_shards([("", s) for s in sizes], max(1, group_bytes))]


def _encode(run: Sequence[tuple[str, bytes]], group_bytes: int) -> Any:
    """One Parquet shard of ``run`` in memory (uncompressed: blobs rarely compress)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([("path", pa.string()), ("data", pa.binary())])
    sink = pa.BufferOutputStream()
    with pq.ParquetWriter(sink, schema, compression="none") as w:
        start = 0
        for rows in _row_groups([len(d) for _, d in run], group_bytes):
            part = run[start : start + rows]
            w.write_table(
                pa.table(
                    {"path": [p for p, _ in part], "data": [d for _, d in part]}, schema=schema
                )
            )
            start += rows
    return sink.getvalue()


def pack_files(
    src: str | Store,
    dst: str | Store,
    *,
    shard_bytes: int | str = "64MiB",
    row_group_bytes: int | str = "1MiB",
    include: str | None = None,
    storage_options: dict[str, Any] | None = None,
    dst_storage_options: dict[str, Any] | None = None,
    threads: int = 16,
) -> PackReport:
    """Pack every file under ``src`` (or those matching ``include``) into shards in ``dst``.

    Which files count is what ``ShardedDataset(src, format="raw", include=include)`` would
    list: every non-hidden file, no ckptstore temp files. ``storage_options`` apply to
    ``src`` and, unless ``dst_storage_options`` is given, to ``dst``. Raises
    ``EmptyDatasetError`` when there is nothing to pack and ``ConfigError`` when ``dst``
    already holds Parquet files.

    Files are packed in path order, whole (a file larger than ``shard_bytes`` gets a shard of
    its own), ``row_group_bytes`` of them to a row group (the unit the loader decodes at once).
    Reads run ``threads`` at a time, the next shard's while this one is written: about three
    shards' bytes are held in memory. The destination must not hold Parquet files yet
    (nothing there is replaced). Each shard is written whole with the transfer engine (a
    multipart upload, or a temp file renamed): readers never see a partial one.

    The output is published at once: a pack first creates :data:`PACK_PENDING` in ``dst``
    (create-only, so two packs into one place cannot both run), naming the shards it will
    write; while it is there, ``ShardedDataset(dst)`` refuses the folder as incomplete.
    Deleting it, after the last shard is durable, publishes the dataset (listings are sorted,
    and it sorts before every shard: a listing that missed it saw every shard). A pack that
    fails removes what it wrote and the marker; one that was killed leaves them, and the next
    pack into ``dst`` removes the shards that marker names (only those) and starts afresh.
    While it runs, a pack keeps a lease in ``dst`` (``engine.lease``: rewritten every 5 s,
    stale after 60 s or at once when its process is known dead): a pack that finds the marker
    of one whose lease is fresh is refused, naming it, instead of deleting its shards.
    """
    from ckptstore.data.dataset import parse_size, usable_paths
    from ckptstore.stores import open_store

    shard_limit = parse_size(shard_bytes) or 0
    group_limit = parse_size(row_group_bytes) or 0
    if shard_limit < 1 or group_limit < 1:
        raise ConfigError(
            f"shard_bytes and row_group_bytes must be positive, got {shard_bytes!r} and "
            f"{row_group_bytes!r}"
        )
    t0 = time.perf_counter()
    source = open_store(src, storage_options)
    dst_options = storage_options if dst_storage_options is None else dst_storage_options
    target = open_store(dst, dst_options)
    engine = TransferEngine(TransferConfig(concurrency=max(1, threads)))
    try:
        listed = source.find_sizes("")
        if listed is None:
            listed = {p: source.size(p) for p in source.find("")}
        keep = set(usable_paths(source, list(listed), "raw", include))
        files = sorted((p, s) for p, s in listed.items() if p in keep)
        if not files:
            raise EmptyDatasetError(
                f"no files to pack under {source.describe()}"
                + (f" matching {include!r}" if include else "")
            )
        runs = plan_shards(files, shard_limit)
        names = [SHARD_NAME.format(k) for k in range(len(runs))]
        there = target.find("")
        if PACK_PENDING in there:
            _remove_unfinished(engine, target)
            there = target.find("")
        existing = [p for p in there if p.lower().endswith(".parquet")]
        if existing:
            raise ConfigError(
                f"{target.describe()} already holds Parquet files ({existing[0]}, ...): a "
                "dataset there would mix them with the new shards. Pack into an empty prefix, "
                "or delete those files first"
            )
        _claim(engine, target, names)
        lease = Heartbeat(target, lease_name(uuid.uuid4().hex), f"pack:{this_host()}:{os.getpid()}")
        written: list[str] = []
        try:
            lease.start()
            _write_shards(engine, source, target, runs, group_limit, threads, written)
        except BaseException:
            lease.stop()
            _remove(target, [*written, PACK_PENDING])
            raise
        # The publish: from here on the folder is a dataset (a failure is an error).
        engine.retry(lambda: target.delete(PACK_PENDING), f"publish of {target.describe()}")
        lease.stop()
        return PackReport(
            files=len(files),
            nbytes=sum(s for _, s in files),
            shards=tuple(written),
            seconds=time.perf_counter() - t0,
        )
    finally:
        engine.close()
        if not isinstance(src, Store):
            source.close()
        if not isinstance(dst, Store):
            target.close()


def _write_shards(
    engine: TransferEngine,
    source: Store,
    target: Store,
    runs: list[list[tuple[str, int]]],
    group_limit: int,
    threads: int,
    written: list[str],
) -> None:
    """Read each run's files and write its shard; ``written`` collects the names done."""
    with ThreadPoolExecutor(max(1, threads), "ckptstore-pack") as pool:

        def read(path: str) -> bytes:
            return engine.retry(lambda: source.get(path), f"read of {source.describe(path)}")

        def contents() -> Iterator[list[tuple[str, bytes]]]:
            pending = [pool.map(read, [p for p, _ in run]) for run in runs[:1]]
            for k in range(len(runs)):
                if k + 1 < len(runs):  # read the next shard's files while this one is written
                    pending.append(pool.map(read, [p for p, _ in runs[k + 1]]))
                data = list(pending.pop(0))
                yield [(p, d) for (p, _), d in zip(runs[k], data)]

        for k, run in enumerate(contents()):
            for (path, size), (_, data) in zip(runs[k], run):
                if len(data) != size:
                    raise DatasetChangedError(
                        f"{source.describe(path)} changed while packing ({len(data)} bytes "
                        f"read, {size} listed); pack again once the source is stable"
                    )
            name = SHARD_NAME.format(k)
            written.append(name)  # before the write: a failed one is removed too
            engine.put(target, name, memoryview(_encode(run, group_limit)))


def _claim(engine: TransferEngine, target: Store, names: list[str]) -> None:
    """Create :data:`PACK_PENDING` naming the shards this pack writes (create-only)."""
    body = json.dumps({"version": 1, "shards": names}).encode()
    try:
        engine.retry(
            lambda: target.put_if_absent(PACK_PENDING, body), f"claim of {target.describe()}"
        )
    except CommitConflictError:
        raise ConfigError(
            f"another pack into {target.describe()} started at the same moment; let it "
            "finish, or pack into another prefix"
        ) from None


def _remove_unfinished(engine: TransferEngine, target: Store) -> None:
    """Remove the shards a pack that did not finish names in its marker, then the marker.

    Only names of this module's form (``part-NNNNN.parquet``) listed there are deleted: a
    marker that is not one :func:`_claim` wrote is refused, and nothing is deleted.
    """
    what = target.describe(PACK_PENDING)
    listing = target.find("")
    running = live_leases(target, listing)
    if running:
        raise ConfigError(
            f"another pack into {target.describe()} is still running ("
            f"{running[0].describe()}); let it finish, or pack into another prefix"
        )
    names: object = None
    try:
        data = engine.retry(
            lambda: get_capped(target, PACK_PENDING, _PENDING_MAX), f"read of {what}"
        )
        doc = json.loads(data)
        names = doc.get("shards") if isinstance(doc, dict) else None
    except (CorruptCheckpointError, ValueError, RecursionError):  # too big, or not JSON
        names = None
    if not (
        isinstance(names, list)
        and all(isinstance(n, str) and _SHARD_RE.fullmatch(n) for n in names)
    ):
        raise ConfigError(
            f"{what} is not a marker a pack wrote; nothing was deleted. Remove it (and any "
            "shards of a failed pack) by hand, or pack into another prefix"
        )
    log.warning(
        "a pack into %s did not finish; removing the %d shard(s) its marker names",
        target.describe(),
        len(names),
    )
    stale = [n for n in listing if is_lease_name(n)]  # the dead pack's own lease
    _remove(target, [*names, *stale, PACK_PENDING], strict=True)


def _remove(target: Store, names: list[str], strict: bool = False) -> None:
    """Delete ``names`` in order, the marker (last) only if every shard went: a failure
    is logged, or with ``strict`` raised; the folder then stays refused as incomplete."""
    failed = False
    for name in names:
        if name == PACK_PENDING and failed:
            return
        try:
            target.delete(name)
        except CkptStoreError as exc:
            if strict:
                raise
            failed = True
            log.warning("could not remove %s of a failed pack: %s", target.describe(name), exc)
