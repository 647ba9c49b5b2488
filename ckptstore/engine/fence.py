"""The fence: where a commit and a deletion of the same save attempt meet, without a clock.

A process can stop for longer than any lease (SIGSTOP, a cgroup freezer, a VM pause, a
debugger), so "the writer's lease is fresh" can never tell a deleter that a writer will not
commit later, nor tell a writer that its files are still there. Instead each save attempt
``a`` of a step has one fence object, ``ckptstore.fence.<a>.json``, created create-only
(``Store.put_if_absent``: ``O_EXCL``/link on a volume, If-None-Match on S3 and Azure,
generation 0 on GCS). Of a committing writer and a deleter, whoever creates it first
decides the attempt's fate; the other backs off. It holds one of three states:

``commit``     the attempt's writer created it: from now on its files are its own; it
               then checks every file is there at its size, then creates ``COMMITTED``
``committed``  the attempt's marker was created (whoever removes or replaces a marker
               naming it says so first): its writer will never create a marker again,
               so its files may go once no marker names it
``delete``     a deleter created it: the attempt can never commit; its files go, and the
               fence last

The argument (the protocol's call order is in ``engine.commit.commit`` and
``engine.deletion.remove_attempts``): a deleter removes an attempt's files only while it
holds the attempt's ``delete`` fence, or after the attempt's marker was created
(``committed``). A writer creates ``COMMITTED`` only after creating the ``commit`` fence
and then finding every file it lists there. If the writer's fence create comes first, no
deleter ever holds ``delete`` (its create fails, and it leaves the files alone); if the
deleter's comes first, the writer's create fails while the deleter works, and once the
deleter removed the fence (after the files) the writer's create succeeds but its check
finds the files gone. Either way a marker never vouches for a deleted file, however long
either side was stopped, at any point. ``commit`` without a marker naming the attempt
(its writer stopped, or killed, between its fence and its marker) keeps the files until
``ckptstore-tool gc --repair`` releases it: only a person can say no writer is left.

Fences are small untrusted control files: read capped (``MAX_FENCE_BYTES``), and one that
is not a valid fence document protects its attempt (its files are left alone, reported).
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass

from ckptstore.engine.bounded import get_capped
from ckptstore.engine.lease import (
    node_id,
    parse_document,
    parse_holder,
    process_is_gone,
    this_host,
)
from ckptstore.engine.manifest import MARKER_NAME, MAX_MARKER_SIZE, Marker
from ckptstore.engine.store import Store
from ckptstore.errors import (
    CommitConflictError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    StoreNotFoundError,
)

__all__ = [
    "COMMIT",
    "COMMITTED",
    "DELETE",
    "MAX_FENCE_BYTES",
    "Fence",
    "fence_name",
    "fence_attempt",
    "read_fence",
    "claim_commit",
    "settle",
    "condemn",
    "overrule",
    "release",
    "marker_attempt",
]

log = logging.getLogger(__name__)

COMMIT = "commit"
COMMITTED = "committed"
DELETE = "delete"
_STATES = (COMMIT, COMMITTED, DELETE)
#: A fence document is under 200 bytes; a bigger one is not ckptstore's.
MAX_FENCE_BYTES = 4096

_NAME = re.compile(r"^ckptstore\.fence\.([0-9a-f]{1,64})\.json$")


@dataclass(frozen=True)
class Fence:
    """One fence document: the attempt's state, and the process that set it."""

    attempt: str
    state: str  # COMMIT | COMMITTED | DELETE
    host: str  # socket.gethostname() of the setter (for messages)
    pid: int  # the setting process
    node: str  # its boot id + pid namespace (``engine.lease.node_id``)
    time: float  # when it was set, by the setter's clock (shown, never compared)

    def to_bytes(self) -> bytes:
        """The fence as stored."""
        doc = {
            "ckptstore_fence": 1,
            "attempt": self.attempt,
            "state": self.state,
            "host": self.host,
            "pid": self.pid,
            "node": self.node,
            "time": self.time,
        }
        return json.dumps(doc, sort_keys=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes, attempt: str, where: str) -> Fence:
        """Parse a fence read from ``where`` (the fence of ``attempt``), else
        ``CorruptCheckpointError``."""
        doc = parse_document(data, "fence", where)
        state = doc.get("state")
        if doc.get("attempt") != attempt:
            raise CorruptCheckpointError(f"{where}: names another attempt than its file name")
        if state not in _STATES:
            raise CorruptCheckpointError(f"{where}: state {state!r:.40} is not a fence state")
        host, pid, node, stamp = parse_holder(doc, "fence", where)
        return cls(attempt, state, host, pid, node, stamp)

    def describe(self) -> str:
        """``'commit' by host h pid 12 at 2026-12-07 21:00:00 UTC``."""
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.time))
        return f"{self.state!r} by host {self.host} pid {self.pid} at {when}"


def fence_name(attempt: str) -> str:
    """The fence of save attempt ``attempt``: ``ckptstore.fence.<attempt>.json``."""
    return f"ckptstore.fence.{attempt}.json"


def fence_attempt(name: str) -> str | None:
    """The attempt whose fence ``name`` is (relative to its step directory), else None."""
    m = _NAME.match(name)
    return m.group(1) if m else None


def _new(attempt: str, state: str) -> Fence:
    return Fence(attempt, state, this_host(), os.getpid(), node_id(), time.time())


def read_fence(store: Store, attempt: str) -> Fence | None:
    """The fence of ``attempt`` in step directory ``store``; None if there is none.
    ``CorruptCheckpointError`` if it is not a valid fence (too big, not a document, not
    a regular file)."""
    name = fence_name(attempt)
    try:
        data = get_capped(store, name, MAX_FENCE_BYTES, advice="")
    except StoreNotFoundError:
        return None
    return Fence.from_bytes(data, attempt, store.describe(name))


def _create(store: Store, fence: Fence) -> Fence | None:
    """Create ``fence`` create-only; None if it was created (or a retry found exactly it),
    else the fence that was there (``CorruptCheckpointError`` if that is not a valid one;
    a fence removed between the failed create and the read is created again)."""
    name = fence_name(fence.attempt)
    while True:
        try:
            store.put_if_absent(name, fence.to_bytes())
            return None
        except CommitConflictError:
            there = read_fence(store, fence.attempt)
            if there is not None:
                return there


def claim_commit(store: Store, attempt: str) -> None:
    """The writer's side: create ``attempt``'s ``commit`` fence before checking its files
    and creating its marker. ``IncompleteCheckpointError`` if a deleter holds it (the
    attempt's files are being deleted, or were: this save cannot commit)."""
    there = _create(store, _new(attempt, COMMIT))
    if there is None:
        return
    raise IncompleteCheckpointError(
        f"{store.url} was not committed: its files were deleted while the save was in flight "
        f"(fence {there.describe()}: gc, or another job's retention on this root, took the "
        "save for an abandoned one). Checkpoints committed before it are unaffected; the "
        "next save writes a new one."
    )


def settle(store: Store, attempt: str) -> None:
    """Record that ``attempt``'s marker was created (its writer will never create one
    again): a plain write of its ``committed`` fence. Called by whoever read a marker
    naming ``attempt`` before removing or replacing it (a deletion, ``uncommit``, a
    commit with ``replace``); the writer's fence stays ``commit`` until then."""
    store.put(fence_name(attempt), _new(attempt, COMMITTED).to_bytes())


def condemn(store: Store, attempt: str) -> Fence | None:
    """The deleter's side: take ``attempt``'s ``delete`` fence before deleting any of its
    files. None when the files may go (the fence is now, or already was, ``delete``; or
    ``committed``: the caller has removed or replaced the marker naming it; or ``commit``
    set by a process of this machine that is gone, which can never create a marker: it is
    made ``delete``); else the fence that protects them (``commit``: its writer claimed
    its commit and may still create its marker). A fence that is not valid protects them
    too: it is logged, and ``None`` is never returned for it."""
    try:
        there = _create(store, _new(attempt, DELETE))
    except CorruptCheckpointError as exc:
        log.warning("%s; the files of attempt %s are left alone", exc, attempt)
        return Fence(attempt, "damaged", "unknown", 0, "", 0.0)
    if there is None or there.state in (DELETE, COMMITTED):
        return None
    if process_is_gone(there.node, there.pid):
        overrule(store, attempt)
        return None
    return there


def overrule(store: Store, attempt: str) -> None:
    """Make ``attempt``'s fence ``delete`` whatever it held (a plain write): only for a
    writer known never to resume, its process gone (``condemn``) or on a person's word
    (``ckptstore-tool gc --repair --apply``); a writer that did resume would then find
    its files gone and fail."""
    store.put(fence_name(attempt), _new(attempt, DELETE).to_bytes())


def release(store: Store, attempt: str) -> None:
    """Remove ``attempt``'s fence, once every file of the attempt is gone (a deleter's), or
    once its writer removed its own files after failing (a writer's); missing is fine."""
    try:
        store.delete(fence_name(attempt))
    except StoreNotFoundError:
        pass


def marker_attempt(store: Store) -> str | None:
    """The attempt the marker of step directory ``store`` names, if it has a valid one
    (None when it has none, or it is not a valid marker: then it names no attempt)."""
    try:
        data = get_capped(store, MARKER_NAME, MAX_MARKER_SIZE, advice="")
        return Marker.from_bytes(data, store.describe(MARKER_NAME)).attempt or None
    except (StoreNotFoundError, CorruptCheckpointError):
        return None
