"""``Storage.rename`` per torch_checkpointing's commit table, on a volume and an object store.

==========  ===================  ==========================================================
source      destination          result (both kinds of store)
==========  ===================  ==========================================================
directory   absent               its files land AT the destination
directory   empty directory      the same (an object store has no empty directories)
directory   populated directory  ``FileExistsError`` (ENOTEMPTY); neither side touched
directory   file                 ``FileExistsError`` (ENOTDIR); neither side touched
file        absent / file        it replaces the destination
file        directory            ``FileExistsError`` (EISDIR); neither side touched
==========  ===================  ==========================================================

A volume renames with one ``rename(2)`` (atomic), relative to the descriptors of both parent
directories resolved from the root (``ckptstore.stores.Anchor``: never through a link), and
then fsyncs both. An object store has no rename: each file is copied on the server
(``Store.copy``: S3 CopyObject / UploadPartCopy, GCS compose, Azure Copy Blob; checked
against the source's size and checksum), several at once, then the sources are deleted.
The directory's ``COPIED_LAST`` files (torch_checkpointing's ``metadata.pkl``, which makes
a checkpoint loadable) are copied after every other file, so the destination never looks
complete before it is. If any copy fails, the copies already made are deleted and the
source is left whole: the rename raises and nothing half-renamed remains.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from ckptstore import Store, TransferEngine
from ckptstore.stores import Anchor

__all__ = ["COPIED_LAST", "has_children", "occupied", "rename_volume", "rename_objects"]

log = logging.getLogger(__name__)

#: Copied after every other file of a directory: torch_checkpointing's global metadata.
COPIED_LAST = ("metadata.pkl",)


def occupied(src: str, dst: str, number: int) -> FileExistsError:
    """The error for a destination a rename may not consume (``number``: which way)."""
    return FileExistsError(
        number,
        f"refusing to rename {src} onto {dst}: the destination is occupied, and a rename "
        "commits onto unoccupied space; delete it first if it is meant to be replaced",
    )


def rename_volume(paths: Anchor, src: str, dst: str, describe: Callable[[str], str]) -> None:
    """Rename ``src`` -> ``dst`` (names below the root of ``paths``) on a volume per the
    table; durable on return."""
    try:
        paths.rename(src, dst)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise occupied(describe(src), describe(dst), exc.errno) from exc
        raise


def has_children(store: Store, key: str) -> bool:
    """Whether anything lies below ``key`` (an object store's directory)."""
    head = f"{key}/" if key else ""
    return any(p.startswith(head) for p in store.find(key))


def rename_objects(
    store: Store,
    engine: TransferEngine,
    src: str,
    dst: str,
    *,
    describe: Callable[[str], str],
    background_cleanup: bool = False,
) -> threading.Thread | None:
    """Rename keys ``src`` -> ``dst`` of an object store per the table (module docstring).

    Returns the thread deleting the sources when ``background_cleanup`` asked for one.
    """
    if store.exists(src):  # a file
        if has_children(store, dst):
            raise occupied(describe(src), describe(dst), errno.EISDIR)
        engine.retry(lambda: store.copy(src, dst), f"copy of {describe(src)}")
        engine.retry(lambda: store.delete(src), f"delete of {describe(src)}")
        return None
    names = [n[len(src) + 1 :] for n in store.find(src)] if src else store.find()
    if not names:
        raise FileNotFoundError(errno.ENOENT, f"{describe(src)} does not exist")
    if store.exists(dst):
        raise occupied(describe(src), describe(dst), errno.ENOTDIR)
    if has_children(store, dst):
        raise occupied(describe(src), describe(dst), errno.ENOTEMPTY)
    _copy_all(store, engine, src, dst, names, describe)
    sources = [f"{src}/{n}" for n in names]

    def cleanup() -> None:
        engine.retry(lambda: store.delete_many(sources), f"delete of {describe(src)}")

    if not background_cleanup:
        cleanup()
        return None
    thread = threading.Thread(target=cleanup, name="ckptstore-tc-cleanup", daemon=True)
    thread.start()
    return thread


def _copy_all(
    store: Store,
    engine: TransferEngine,
    src: str,
    dst: str,
    names: list[str],
    describe: Callable[[str], str],
) -> None:
    """Copy every name (``COPIED_LAST`` after the rest); on a failure delete the copies."""
    last = [n for n in names if n.rpartition("/")[2] in COPIED_LAST]
    first = [n for n in names if n not in last]
    made: list[str] = []
    lock = threading.Lock()

    def one(name: str) -> None:
        engine.retry(
            lambda: store.copy(f"{src}/{name}", f"{dst}/{name}"),
            f"copy of {describe(f'{src}/{name}')}",
        )
        with lock:
            made.append(f"{dst}/{name}")

    try:
        with ThreadPoolExecutor(max(1, engine.config.concurrency), "ckptstore-tc-copy") as pool:
            for batch in (first, last):
                for future in [pool.submit(one, n) for n in batch]:
                    future.result()
    except BaseException:
        try:
            store.delete_many(made)
        except Exception as exc:  # noqa: BLE001 - the copy's own error is the one to raise
            log.error("rename of %s failed, and its partial copies stay: %s", describe(src), exc)
        raise
