"""Copy a committed checkpoint between any two stores, verified, committed last.

Call order::

    result = copy_checkpoint(src, dst, engine, on_bytes=bar.update, cancel=event)
        1. open_committed(src)            marker, manifest, .metadata (refuses torn/corrupt)
        2. dst must be empty              (overwrite=True: its marker is deleted first)
        3. every data file, in parallel   ranged GETs (read-ahead) -> FileWriter parts;
                                          CRC32C folded on the fly and checked against the
                                          manifest *before* the file is made visible
        4. publish(dst, ...)              manifest + .metadata, then the create-only COMMITTED

If anything fails, or ``cancel`` is set (Ctrl-C), the file copies stop, open uploads are
aborted, the files this copy made are deleted, and no marker is written: the destination
never holds a committed checkpoint that was not fully copied and checked.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from ckptstore.engine.checksum import Crc32c, crc32c, format_crc
from ckptstore.engine.commit import (
    METADATA_NAME,
    attempt_manifest_name,
    attempt_metadata_name,
    open_committed,
    publish,
    uncommit,
)
from ckptstore.engine.manifest import MARKER_NAME, FileEntry, Manifest, Marker
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine, split_ranges
from ckptstore.errors import CheckpointExistsError, CorruptCheckpointError, StoreNotFoundError

__all__ = ["CopyResult", "CopyCancelled", "copy_checkpoint", "check_empty_destination"]

log = logging.getLogger(__name__)


class CopyCancelled(Exception):
    """Raised inside the file copies when ``cancel`` is set."""


@dataclass(frozen=True)
class CopyResult:
    src: str
    dst: str
    files: int
    bytes: int
    marker: Marker


def check_empty_destination(dst: Store, overwrite: bool) -> None:
    """Refuse a destination that holds anything, unless ``overwrite``."""
    if overwrite:
        return
    if dst.find():
        raise CheckpointExistsError(
            f"{dst.url} is not empty; pick another destination, or replace what is there with "
            "--force (overwrite=True from Python)."
        )


def _copy_file(
    src: Store,
    dst: Store,
    engine: TransferEngine,
    name: str,
    entry: FileEntry,
    cancel: threading.Event,
    on_bytes: Callable[[int], None] | None,
) -> None:
    """Stream one file src -> dst in parts; raise before close() if its CRC is wrong."""
    try:
        size = engine.retry(lambda: src.size(name), f"stat of {src.describe(name)}")
    except StoreNotFoundError:
        raise CorruptCheckpointError(
            f"{src.describe(name)} is missing but the manifest lists it; the source checkpoint "
            "is damaged (run `ckptstore-tool verify`)."
        ) from None
    if size != entry.size:
        raise CorruptCheckpointError(
            f"{src.describe(name)} is {size} bytes but the manifest says {entry.size}; the "
            "source checkpoint is damaged (run `ckptstore-tool verify`)."
        )
    windows = deque(split_ranges(0, entry.size, engine.config.part_size))
    ahead: deque[tuple[int, int, Future]] = deque()
    crc = Crc32c()
    with engine.writer(dst, name, size_hint=entry.size) as w:
        while windows or ahead:
            while windows and len(ahead) < 2:
                s, e = windows.popleft()
                ahead.append((s, e, engine.read_async(src, name, s, e - s)))
            s, e, fut = ahead.popleft()
            while not fut.done():  # wait, but notice a cancel within 0.1 s
                if cancel.is_set():
                    raise CopyCancelled(name)
                wait([fut], timeout=0.1)
            if cancel.is_set():
                raise CopyCancelled(name)
            data = fut.result()
            if len(data) != e - s:
                raise CorruptCheckpointError(
                    f"{src.describe(name)} bytes [{s}, {e}): got {len(data)} bytes; the source "
                    "file is shorter than its manifest entry."
                )
            piece = crc32c(data)
            crc.extend(piece, len(data))
            w.write(data, piece)
            if on_bytes is not None:
                on_bytes(len(data))
        if crc.value != entry.crc32c:
            raise CorruptCheckpointError(
                f"{src.describe(name)}: crc32c {format_crc(crc.value)} of the bytes read does not "
                f"match the manifest's {format_crc(entry.crc32c)}; the source checkpoint is "
                "damaged (run `ckptstore-tool verify`). Nothing was committed at the destination."
            )
        w.close()


def copy_checkpoint(
    src: Store,
    dst: Store,
    engine: TransferEngine,
    *,
    overwrite: bool = False,
    on_bytes: Callable[[int], None] | None = None,
    cancel: threading.Event | None = None,
    file_concurrency: int = 4,
) -> CopyResult:
    """Copy the committed checkpoint at ``src`` to ``dst``; see the module docstring."""
    committed = open_committed(src)
    check_empty_destination(dst, overwrite)
    if overwrite:
        uncommit(dst)
    cancel = cancel or threading.Event()
    files = {n: e for n, e in committed.manifest.files.items() if n != METADATA_NAME}
    attempt = uuid.uuid4().hex[:12]
    made = [*files, attempt_manifest_name(attempt), attempt_metadata_name(attempt)]
    pool = ThreadPoolExecutor(max(1, min(file_concurrency, len(files))), "ckptstore-cp")
    futures: list[Future] = []
    try:
        futures = [
            pool.submit(_copy_file, src, dst, engine, n, e, cancel, on_bytes)
            for n, e in sorted(files.items())
        ]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        for f in done:
            if f.exception() is not None:
                raise f.exception()  # type: ignore[misc]
        manifest = Manifest.from_bytes(committed.manifest.to_bytes(), src.url)
        manifest.extra["copied_from"] = src.url
        marker = publish(dst, engine, attempt, manifest, committed.metadata_bytes)
    except BaseException:
        cancel.set()
        for f in futures:
            f.cancel()
        pool.shutdown(wait=True)
        if not dst.exists(MARKER_NAME):
            _remove(dst, made)
        raise
    pool.shutdown(wait=True)
    return CopyResult(src.url, dst.url, len(files), sum(e.size for e in files.values()), marker)


def _remove(dst: Store, names: list[str]) -> None:
    """Best-effort removal of what a failed copy made (never raises)."""
    for name in names:
        try:
            dst.delete(name)
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the real error
            log.warning("could not remove %s: %s", dst.describe(name), exc)
