"""The commit protocol: commit a checkpoint with a create-only marker, or take it back.

:func:`commit` (the coordinator, after every rank's data files are durable; its docstring
has the call order and what a crash at each point leaves) writes the attempt's own manifest
and ``.metadata``, takes the attempt's fence (``engine.fence``: where a commit and a
deletion meet), checks its files, then creates ``COMMITTED``, then the canonical copies. A
checkpoint exists only if COMMITTED exists and the manifest it names matches its CRC
(opening one is ``engine.committed``). ``finish_commit`` redoes steps 5 and 6 of a commit
cut short after its marker (``CheckpointManager.restore`` runs it on the next start);
``uncommit`` deletes the marker. Every store call here goes through ``retry.retrying``
(control calls retried per the engine's ``RetryConfig``; data calls by the engine itself).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from ckptstore.engine.checksum import crc32c
from ckptstore.engine.committed import (
    METADATA_NAME,
    Committed,
    attempt_manifest_name,
    attempt_metadata_name,
    open_committed,
)
from ckptstore.engine.crashpoints import crashpoint
from ckptstore.engine.deletion import remove_attempts
from ckptstore.engine.fence import claim_commit, fence_attempt, marker_attempt, release, settle
from ckptstore.engine.lease import lease_name, live_leases
from ckptstore.engine.manifest import MANIFEST_NAME, MARKER_NAME, FileEntry, Manifest, Marker
from ckptstore.engine.names import RUN_STAMP, TMP_MARK, attempt_of, is_ckptstore_file
from ckptstore.engine.retry import retrying
from ckptstore.engine.store import Store
from ckptstore.engine.transfer import TransferEngine
from ckptstore.errors import (
    CkptStoreError,
    CommitConflictError,
    IncompleteCheckpointError,
    StoreNotFoundError,
)

__all__ = [
    "commit",
    "finish_commit",
    "collect_warnings",
    "warn_after_commit",
    "uncommit",
]

log = logging.getLogger(__name__)

_collecting = threading.local()


@contextmanager
def collect_warnings() -> Iterator[list[str]]:
    """Collect, in this thread, the warnings of commits that succeeded with a step 4 or 5
    failure (each also logged); the manager puts them in the save's record."""
    notes: list[str] = []
    outer = getattr(_collecting, "notes", None)
    _collecting.notes = notes
    try:
        yield notes
    finally:
        _collecting.notes = outer


def _warn(message: str) -> None:
    log.warning("%s", message)
    notes = getattr(_collecting, "notes", None)
    if notes is not None:
        notes.append(message)


def warn_after_commit(message: str) -> None:
    """Report a failure of work done after a checkpoint's marker (a hook's, not this
    module's): logged, and collected by :func:`collect_warnings` like steps 4 and 5's.
    The checkpoint is committed; the failure never makes its save a failed one."""
    _warn(message)


def commit(
    store: Store,
    engine: TransferEngine,
    attempt: str,
    manifest: Manifest,
    metadata_bytes: bytes,
    *,
    replace: bool = False,
    check_files: bool = True,
) -> Marker:
    """Commit a checkpoint whose data files are durable (the call order is below).

    ``check_files=False`` only for a node's tier copy, which holds just its own
    ranks' files (the marker that counts is the destination's; a restore checks the local
    files itself).

    Call order on the coordinator, after every rank's data files are durable::

        commit(store, engine, attempt, manifest, metadata_bytes, replace=False)
            1. ckptstore.manifest.<attempt>.json     (put)   the attempt's own copies: a racing
            2. .metadata.<attempt>                    (put)   writer can never clobber them
            3. ckptstore.fence.<attempt>.json         (create-only, 'commit': engine.fence)
               -> IncompleteCheckpointError if a deleter created it first ('delete': gc or
                  retention took the save for an abandoned one; nothing is committed)
               check: every file the manifest lists is there with its recorded size (one
                  stat each, in parallel); else IncompleteCheckpointError, this attempt's
                  files and fence are removed, and no marker: a marker never vouches for a
                  file that is not there. Made after the fence, the check holds until the
                  marker however long this process is stopped: no deleter removes files
                  of an attempt whose 'commit' fence exists
            4. COMMITTED                              (create-only; names attempt + manifest CRC)
               -> CommitConflictError if another attempt committed first (the loser's files
                  and fence are deleted; the winner's are untouched)
               replace=True (re-saving a step found damaged): a plain put, which swaps the
                  old marker for the new one in one atomic write (the old marker's attempt
                  is first recorded 'committed', so its files may go)
            5. .metadata, ckptstore.manifest.json     (put)   canonical copies, for humans and
               stock DCP readers (.metadata first: a canonical manifest matching the marker
               vouches for the .metadata beside it, so one another writer replaced is
               refused as corrupt). The fence stays 'commit': whoever later removes or
               replaces the marker first records it 'committed' (``engine.fence.settle``)
            6. files of other attempts (torn leftovers, replaced checkpoints) are deleted,
               each through its fence (``engine.deletion.remove_attempts``): only names
               ckptstore or DCP make (``names.is_ckptstore_file``), none of an attempt
               whose writer claimed its commit, and nothing at all while another
               attempt's lease in the step is fresh (a save in flight: its files stay;
               the next commit or gc of the step removes them once it is stale)

    Steps 5 and 6 are best effort: the checkpoint is committed once step 4 returns, so a
    failure there is a warning (logged, and collected by :func:`collect_warnings` into the
    save's record), never a failed save; ``finish_commit`` completes them later.

    Replacing a committed step (``replace=True``) never shows a reader a committed step with
    files missing, and a crash at any point leaves the old or the new checkpoint whole: the
    new attempt's files all have names of their own (attempt ids) and are durable before
    step 4; until step 4 the old marker names the old attempt, whose files are untouched;
    after it the marker names the new attempt, whose own manifest and ``.metadata`` are
    found through the marker (the canonical copies still being the old ones until step 5);
    the old attempt's files go only in step 6. Two writers replacing the same step at once
    both succeed; the later marker wins and its step 6 removes the other's files.
    """
    store = retrying(store, engine.config.retry, engine.stats)
    manifest.files[METADATA_NAME] = FileEntry(len(metadata_bytes), crc32c(metadata_bytes))
    manifest.extra["attempt"] = attempt
    manifest_bytes = manifest.to_bytes()
    marker = Marker.for_manifest(manifest_bytes, manifest.step, attempt)
    own = [attempt_manifest_name(attempt), attempt_metadata_name(attempt)]
    mine = [*own, *(n for n in manifest.files if n != METADATA_NAME)]
    _put_all(store, engine, [(own[0], manifest_bytes), (own[1], metadata_bytes)])
    crashpoint("before_marker")
    engine.retry(lambda: claim_commit(store, attempt), f"fence of {store.url}")
    crashpoint("after_fence")
    if check_files:
        try:
            _check_files(store, engine, manifest, own)
        except IncompleteCheckpointError:
            _give_up(store, attempt, mine)
            raise
    crashpoint("after_check")
    what = f"commit of {store.describe(MARKER_NAME)}"
    if replace:
        replaced = marker_attempt(store)
        if replaced is not None and replaced != attempt:
            settle(store, replaced)  # its marker existed: its files may go once replaced
        engine.retry(lambda: store.put(MARKER_NAME, marker.to_bytes()), what)
    else:
        try:
            engine.retry(lambda: store.put_if_absent(MARKER_NAME, marker.to_bytes()), what)
        except CommitConflictError:
            _give_up(store, attempt, mine)
            raise _lost(store) from None
    crashpoint("after_marker")
    try:
        _after_marker(store, engine, attempt, manifest, manifest_bytes, metadata_bytes, live=True)
    except CkptStoreError as exc:
        _warn(
            f"{store.url} is committed, but writing its canonical copies or removing other "
            f"attempts' files failed ({exc}); CheckpointManager.restore (or "
            "ckptstore-tool gc) completes it later"
        )
    return marker


def _lost(store: Store) -> CommitConflictError:
    """The error of an attempt another writer's commit beat to ``store``."""
    return CommitConflictError(
        f"{store.url} was committed by another writer while this one was saving; "
        "this attempt's files were removed and the other checkpoint is kept."
    )


def _check_files(store: Store, engine: TransferEngine, manifest: Manifest, own: list[str]) -> None:
    """Raise ``IncompleteCheckpointError`` (no marker is written) unless every file the
    manifest lists is there with its recorded size, and the attempt's own manifest and
    ``.metadata`` copies too: one stat each, on the engine's I/O pool. Files deleted
    from under a save in flight (gc, another job's retention) are found here."""
    expected = {n: e.size for n, e in manifest.files.items() if n != METADATA_NAME}
    expected[own[1]] = manifest.files[METADATA_NAME].size

    def stat(name: str) -> int | None:
        try:
            return store.size(name)  # a retrying view (commit)
        except StoreNotFoundError:
            return None

    futures = {n: engine.pool.submit(stat, n) for n in [*sorted(expected), own[0]]}
    sizes = {n: f.result() for n, f in futures.items()}
    bad = [
        f"{n} is missing" if sizes[n] is None else f"{n} has {sizes[n]} bytes, not {size}"
        for n, size in expected.items()
        if sizes[n] != size
    ]
    if sizes[own[0]] is None:
        bad.append(f"{own[0]} is missing")
    if bad:
        shown = "; ".join(bad[:5]) + (f"; and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise IncompleteCheckpointError(
            f"{store.url} was not committed: files the manifest lists are not as written "
            f"({shown}). They were deleted or changed while the save was in flight (gc or "
            "another job's retention on this root?); no marker was written (checkpoints "
            "committed before it are unaffected), and the next save writes a new one."
        )


def _put_all(store: Store, engine: TransferEngine, items: list[tuple[str, bytes]]) -> None:
    """``put`` each of ``items`` in order, durable on return: one ``Store.put_many`` (a
    volume fsyncs the files at once, then the directory once for all) when each fits in
    a part, else one ``engine.put`` after another (large ones as parallel parts)."""
    if all(len(data) <= engine.config.part_size for _, data in items):
        engine.retry(lambda: store.put_many(items), f"write of {store.describe(items[0][0])}")
        return
    for name, data in items:
        engine.put(store, name, data)


def _give_up(store: Store, attempt: str, names: list[str]) -> None:
    """Delete an attempt's own files, then its fence, after it failed to commit; a failure
    leaves them to gc (the attempt's error is what it raises, whatever happens here)."""
    try:
        store.delete_many(names)
        release(store, attempt)
    except CkptStoreError as exc:
        log.warning("could not remove the files of %s's failed commit: %s", store.url, exc)


def _after_marker(
    store: Store,
    engine: TransferEngine,
    attempt: str,
    manifest: Manifest,
    manifest_bytes: bytes,
    metadata_bytes: bytes,
    live: bool = False,
) -> None:
    """Steps 5 and 6: canonical copies, then delete what no committed file needs (only
    ckptstore's own names; other attempts' through their fences; nothing while another
    save of the step holds a fresh lease). ``live``: the committing writer itself (its
    own lease is its, not another save's; it removes it itself)."""
    # .metadata before the manifest: a canonical manifest that matches the marker then
    # proves the canonical .metadata beside it was ckptstore's (see open_committed).
    _put_all(store, engine, [(METADATA_NAME, metadata_bytes), (MANIFEST_NAME, manifest_bytes)])
    own = [attempt_manifest_name(attempt), attempt_metadata_name(attempt)] if attempt else []
    own_lease = [lease_name(attempt)] if attempt and live else []
    keep = {MARKER_NAME, MANIFEST_NAME, METADATA_NAME, RUN_STAMP, *own, *own_lease}
    keep |= set(manifest.files)  # RUN_STAMP: a local tier's (``tier.rules``)
    names = store.find()
    others = live_leases(store, names, exclude=own_lease)
    if others:
        log.info(
            "%s: another save of this step is in flight (%s); its files are left alone",
            store.url,
            others[0].describe(),
        )
        return
    ours = [n for n in names if n not in keep and is_ckptstore_file(n)]
    # A temp object of no attempt may be a live writer's (the stale-upload sweep
    # removes abandoned ones); an attempt's go with it, once its fence is taken.
    loose = [n for n in ours if attempt_of(n) is None and fence_attempt(n) is None]
    store.delete_many([n for n in loose if TMP_MARK not in n])
    if attempt:  # the committed attempt's own leftovers (its lease, after a crash)
        store.delete_many([n for n in ours if attempt_of(n) == attempt])
    remove_attempts(store, ours, spare=attempt or None)


def finish_commit(store: Store, engine: TransferEngine, committed: Committed | None = None) -> bool:
    """Complete a commit cut short after its marker (steps 4 and 5); True if it was.

    Idempotent and a no-op for a checkpoint whose canonical copies are the committed ones.
    ``committed`` is ``store`` as ``open_committed`` just opened it (else it is opened
    here). Raises Incomplete/CorruptCheckpointError as ``open_committed`` does.
    """
    store = retrying(store, engine.config.retry, engine.stats)
    if committed is None:
        committed = open_committed(store)
    if committed.canonical:
        return False
    c = committed
    _after_marker(store, engine, c.marker.attempt, c.manifest, c.manifest_bytes, c.metadata_bytes)
    log.info("%s: finished a commit cut short after its marker (canonical copies)", store.url)
    return True


def uncommit(store: Store) -> None:
    """Make a committed checkpoint invisible (before overwriting it): delete its marker,
    first recording its attempt ``committed`` (``engine.fence.settle``), so the commit
    that replaces it removes that attempt's files."""
    store = retrying(store)
    replaced = marker_attempt(store)
    if replaced is not None:
        settle(store, replaced)
    store.delete(MARKER_NAME)
