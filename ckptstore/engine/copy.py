"""Copy a committed checkpoint between any two stores, verified, committed last.

Call order::

    result = copy_checkpoint(src, dst, engine, on_bytes=bar.update, cancel=event)
        1. open_committed(src)            marker, manifest, .metadata (refuses torn/corrupt)
        2. dst must be empty              (overwrite=True: its marker is deleted first)
        3. every data file, in parallel   ranged GETs (read-ahead) -> FileWriter parts;
                                          CRC32C folded on the fly and checked against the
                                          manifest *before* the file is made visible
        4. commit(dst, ...)               manifest + .metadata, then the create-only COMMITTED

From step 3 to the end the copy keeps a step lease in ``dst`` (``engine.lease``), so
``ckptstore-tool gc`` or a manager's retention on the destination's root leaves its files
alone while it runs.

If anything fails, or ``cancel`` is set (Ctrl-C), the file copies stop, open uploads are
aborted, the files this copy made are deleted (through ``engine.deletion.remove_made``: only
ckptstore's own names), and no marker is written: the destination never holds a committed
checkpoint that was not fully copied and checked. Every name the source manifest lists is
checked (``engine.paths``) before anything is read or written: a crafted ``../x`` or ``/x``
raises ``UnsafePathError`` and the copy does nothing.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from ckptstore.engine.commit import commit, uncommit
from ckptstore.engine.committed import (
    METADATA_NAME,
    attempt_manifest_name,
    attempt_metadata_name,
    open_committed,
)
from ckptstore.engine.deletion import remove_made
from ckptstore.engine.lease import hold_step_lease
from ckptstore.engine.manifest import MARKER_NAME, FileEntry, Manifest, Marker
from ckptstore.engine.owner import run_identity
from ckptstore.engine.paths import check_name
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import CopyCancelled, TransferEngine
from ckptstore.errors import CheckpointExistsError

__all__ = ["CopyResult", "CopyCancelled", "copy_checkpoint", "check_empty_destination"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CopyResult:
    """A finished copy: both URLs, the data files and bytes copied, the new marker.

    ``files`` and ``bytes`` count the manifest's data files, not ``.metadata`` (which
    ``commit`` writes with the manifest).
    """

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
    """Stream one file src -> dst; it becomes visible only if its size and CRC match."""
    engine.copy(
        src,
        name,
        dst,
        name,
        expect_size=entry.size,
        expect_crc=entry.crc32c,
        cancel=cancel,
        on_bytes=on_bytes,
    )


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
    for name in committed.manifest.files:
        check_name(name, src.url)
    check_empty_destination(dst, overwrite)
    if overwrite:
        uncommit(dst)
    cancel = cancel or threading.Event()
    files = {n: e for n, e in committed.manifest.files.items() if n != METADATA_NAME}
    attempt = uuid.uuid4().hex[:12]
    made = [*files, attempt_manifest_name(attempt), attempt_metadata_name(attempt)]
    lease = hold_step_lease(dst, attempt, run_identity())
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
        marker = commit(dst, engine, attempt, manifest, committed.metadata_bytes)
    except BaseException:
        cancel.set()
        for f in futures:
            f.cancel()
        pool.shutdown(wait=True)
        if lease is not None:
            lease.stop()
        if not dst.exists(MARKER_NAME):
            remove_made(dst, made)
        raise
    if lease is not None:
        lease.stop()
    pool.shutdown(wait=True)
    return CopyResult(src.url, dst.url, len(files), sum(e.size for e in files.values()), marker)
