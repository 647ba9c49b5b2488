"""The one deletion path: everything ckptstore deletes under a root goes through here.

Used by ``ckptstore-tool gc`` and the checkpoint manager's retention (through
``ckptstore.manager.prune``), by the clean-up of torn leftovers, by failed ``cp`` / ``convert``
outputs, and for aborting stale multipart uploads. It deletes only what it can prove
ckptstore made:

* a step directory only under its canonical name (``step_%09d`` exactly, from
  ``engine.names``); ``step_5``, ``step_0000000005``, a symlink or a regular file of a step's
  name are never touched;
* inside it only files whose names ckptstore or stock DCP write (``is_ckptstore_file``);
  a user's ``notes.txt`` stays, and is reported;
* the marker first, so a deletion cut short (a crash, kill -9) leaves an incomplete step
  that the next prune finishes, never a committed checkpoint with files missing; then the
  other files; then the directory, only if nothing is left in it;
* a save attempt's files only through its fence (``engine.fence``; ``remove_attempts``):
  the deleter creates the attempt's ``delete`` fence first, so a writer stopped for any
  time (SIGSTOP, a VM pause) can never commit over the deletion; an attempt whose writer
  already claimed its commit keeps its files (reported);
* an unfinished upload only of such a file inside such a step, and only when it is stale
  (older than ``stale_after_s``; an upload of unknown age is kept);
* no step whose save is in flight: a fresh step lease (``engine.lease``; fresh means
  refreshed within ``STALE_AFTER_S``, 60 s) makes ``delete_step`` raise ``InUseError``
  with nothing deleted, and ``plan_uploads`` keep its uploads. The lease is courtesy (a
  live save is not made to fail); the fence is what keeps a marker true.

Names go through the stores, which refuse anything that would leave the root
(``engine.paths``) and never follow a symlink. Which committed steps may go at all
(never the newest, never a protected one) is ``ckptstore.manager.prune``'s decision.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from ckptstore.engine.crashpoints import crashpoint
from ckptstore.engine.fence import (
    COMMIT,
    Fence,
    condemn,
    fence_attempt,
    marker_attempt,
    overrule,
    read_fence,
    release,
    settle,
)
from ckptstore.engine.lease import STALE_AFTER_S, LeaseInfo, lease_name, live_leases
from ckptstore.engine.manifest import MARKER_NAME
from ckptstore.engine.names import attempt_of, is_ckptstore_file, parse_step
from ckptstore.engine.paths import is_safe_name
from ckptstore.engine.store import Multipart, Store
from ckptstore.errors import CkptStoreError, CorruptCheckpointError, InUseError, UnsafePathError

__all__ = [
    "StepFiles",
    "Deleted",
    "UploadDecision",
    "step_files",
    "step_in_flight",
    "delete_step",
    "remove_attempts",
    "HeldFence",
    "held_fences",
    "release_held",
    "remove_made",
    "upload_is_ours",
    "plan_uploads",
    "abort_uploads",
]

log = logging.getLogger(__name__)

_STALE = f"{STALE_AFTER_S:.0f} s"


@dataclass(frozen=True)
class StepFiles:
    """The files of one step directory, split into ckptstore's and everyone else's."""

    ours: list[str]
    foreign: list[str]


@dataclass(frozen=True)
class Deleted:
    """What ``delete_step`` left in a step: files that are not ckptstore's (``foreign``),
    and save attempts whose commit fence kept their files (``held``: see ``held_fences``)."""

    foreign: list[str]
    held: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UploadDecision:
    """What ``plan_uploads`` decided for one unfinished upload, and why.

    ``action`` is ``keep`` or ``abort``; ``age_s`` is ``None`` when the store does not
    record when the upload started; ``upload`` is what ``abort_uploads`` aborts.
    """

    path: str
    action: str  # keep | abort
    reason: str
    age_s: float | None
    upload: Multipart = field(repr=False, compare=False)


def _step_store(root: Store, name: str) -> Store:
    if parse_step(name) is None:
        raise UnsafePathError(
            f"{root.describe(name)} is not a step directory name (step_%09d): ckptstore never "
            "deletes it"
        )
    return root.child(name)


def step_files(root: Store, name: str) -> StepFiles:
    """The files under step directory ``name`` of ``root``: ckptstore's and the rest."""
    files = _step_store(root, name).find()
    return StepFiles(
        [f for f in files if is_ckptstore_file(f)], [f for f in files if not is_ckptstore_file(f)]
    )


def step_in_flight(root: Store, name: str, ours: list[str] | None = None) -> LeaseInfo | None:
    """The fresh lease of a save in flight in step directory ``name`` (``ours``: its
    ckptstore files, if already listed), else None."""
    if ours is None:
        ours = step_files(root, name).ours
    leases = live_leases(_step_store(root, name), ours)
    return leases[0] if leases else None


def delete_step(root: Store, name: str) -> Deleted:
    """Delete ckptstore's files of step directory ``name``: marker first, then each save
    attempt's files through its fence (``remove_attempts``), then the names of no attempt,
    then the directory if it is empty. Returns what was left: the files that are not
    ckptstore's, and the attempts their fence kept.

    Raises ``InUseError`` (nothing deleted) while a save of the step holds a fresh lease.
    An attempt whose writer claimed its commit and has no marker keeps its files (logged).
    """
    step = _step_store(root, name)
    files = step_files(root, name)
    holder = step_in_flight(root, name, files.ours)
    if holder is not None:
        raise InUseError(
            f"{root.describe(name)} is not deleted: a save of it is in flight "
            f"({holder.describe()}). Its lease goes stale {_STALE} after its writer stops; "
            "delete it after that."
        )
    if MARKER_NAME in files.ours:
        committed = marker_attempt(step)
        if committed is not None:
            settle(step, committed)  # its marker exists: its writer never makes another
        step.delete(MARKER_NAME)  # invisible at once: the rest is a torn leftover
    crashpoint("after_unmark")
    held = remove_attempts(step, files.ours)
    step.delete_many(
        [
            f
            for f in files.ours
            if f != MARKER_NAME and attempt_of(f) is None and fence_attempt(f) is None
        ]
    )
    step.remove_empty_dirs()
    for f in files.foreign:
        log.warning("%s: not ckptstore's, left alone", step.describe(f))
    crashpoint("after_step_deleted")
    return Deleted(files.foreign, held)


def remove_attempts(step: Store, names: Iterable[str], spare: str | None = None) -> list[str]:
    """Delete the files of each save attempt among ``names`` (a listing of step directory
    ``step``) but ``spare``'s, each through its fence (``engine.fence``); the attempts
    whose files were kept.

    Per attempt: ``condemn`` (create its ``delete`` fence), then its files, then the fence.
    One whose fence says its writer claimed its commit (``commit``), or that is not a
    valid fence, keeps its files: that writer may still create its marker, which then
    vouches for files that are all there. The caller has removed any marker naming an
    attempt it passes (its fence is ``committed`` then). Names of no attempt are not
    touched here.
    """
    groups: dict[str, list[str]] = {}
    for n in names:
        attempt = attempt_of(n) or fence_attempt(n)
        if attempt is not None and attempt != spare:
            files = groups.setdefault(attempt, [])
            if fence_attempt(n) is None:
                files.append(n)
    kept = []
    for attempt, files in sorted(groups.items()):
        holder = condemn(step, attempt)
        if holder is not None:
            log.warning(
                "%s: the %d files of save attempt %s are kept: its writer claimed its commit "
                "(fence %s) and may still create its marker. If no job writes this root any "
                "more, `ckptstore-tool gc ROOT --repair --apply` removes them.",
                step.url,
                len(files),
                attempt,
                holder.describe(),
            )
            kept.append(attempt)
            continue
        crashpoint("after_condemn")
        step.delete_many(files)
        release(step, attempt)
    return kept


@dataclass(frozen=True)
class HeldFence:
    """A save attempt whose files its fence keeps although no marker names it: its writer
    took its ``commit`` fence and was stopped or killed before its marker (or the marker
    was removed by something that does not keep the fence protocol). ``fence`` is None
    for one that is not a valid fence document (``damage``, the reason); ``live`` is the
    attempt's fresh lease if its writer still heartbeats."""

    step: str
    attempt: str
    fence: Fence | None
    files: list[str]
    damage: str = ""
    live: LeaseInfo | None = None

    def describe(self) -> str:
        """``step_000000003: attempt ab12 ('commit' by ...), 4 files``."""
        what = self.fence.describe() if self.fence is not None else self.damage
        return f"{self.step}: attempt {self.attempt} ({what}), {len(self.files)} files"


def held_fences(root: Store) -> list[HeldFence]:
    """The attempts under ``root``'s canonical step directories whose fence keeps their
    files with no marker naming them (``engine.fence``: only a person can say their writer
    will never resume; ``release_held`` acts on that word). Nothing is changed."""
    out = []
    for name in sorted(n.rstrip("/") for n in root.listdir()):
        if parse_step(name) is None:
            continue
        step = root.child(name)
        ours = step_files(root, name).ours
        named = marker_attempt(step) if MARKER_NAME in ours else None
        for attempt in sorted({a for n in ours if (a := fence_attempt(n)) is not None}):
            if attempt == named:
                continue
            try:
                fence, damage = read_fence(step, attempt), ""
            except CorruptCheckpointError as exc:
                fence, damage = None, str(exc)
            if fence is not None and fence.state != COMMIT:
                continue  # 'delete' or 'committed': the next deletion takes its files
            files = [n for n in ours if attempt_of(n) == attempt]
            live = live_leases(step, [lease_name(attempt)] if lease_name(attempt) in ours else [])
            out.append(HeldFence(name, attempt, fence, files, damage, live[0] if live else None))
    return out


def release_held(root: Store, held: HeldFence) -> None:
    """Delete ``held``'s files and fence (``ckptstore-tool gc --repair --apply``): its fence
    is made ``delete`` first, so the attempt can never commit afterwards. ``InUseError``
    (nothing changed) while its writer's lease is fresh."""
    step = _step_store(root, held.step)
    live = live_leases(step, [lease_name(held.attempt)])
    if live:
        raise InUseError(
            f"{root.describe(held.step)}: attempt {held.attempt} is not released: its writer "
            f"is alive ({live[0].describe()})"
        )
    overrule(step, held.attempt)
    step.delete_many([n for n in step_files(root, held.step).ours if attempt_of(n) == held.attempt])
    release(step, held.attempt)
    step.remove_empty_dirs()


def remove_made(store: Store, names: Iterable[str]) -> list[str]:
    """Best-effort removal of the files a failed copy or conversion made (never raises).

    Only safe names of ckptstore's kind are deleted; returns the ones left alone.
    """
    left = []
    for name in names:
        if not (is_safe_name(name) and is_ckptstore_file(name)) or name == MARKER_NAME:
            left.append(name)
            continue
        try:
            store.delete(name)
        except Exception as exc:  # noqa: BLE001 - cleanup must not hide the real error
            log.warning("could not remove %s: %s", store.describe(name), exc)
    if left:
        log.warning("%s: left alone (not ckptstore's to delete): %s", store.url, left)
    return left  # directories stay: the destination may be one the user made


def upload_is_ours(path: str) -> bool:
    """True for an upload of a ckptstore file inside a canonical step directory."""
    top, _, rest = path.partition("/")
    return parse_step(top) is not None and is_safe_name(path) and is_ckptstore_file(rest)


def plan_uploads(
    root: Store,
    deleted_steps: Iterable[str] = (),
    stale_after_s: float = 24 * 3600.0,
    now: float | None = None,
    in_flight: Iterable[str] = (),
) -> list[UploadDecision]:
    """What to do with each unfinished upload under ``root``.

    Aborted: ours under a step being deleted, or ours older than ``stale_after_s`` (strictly;
    stores record the start in ``Multipart.extra["initiated"]``; moto reports 2010 for every
    upload, so there every upload is stale). Kept: younger or of unknown age ones, those
    under a step in ``in_flight`` (a fresh lease: a save in flight), and uploads that are
    not ckptstore's (reported as left alone).
    """
    now = time.time() if now is None else now
    gone = set(deleted_steps)
    live = set(in_flight)
    out = []
    for up in root.list_multipart():
        started = up.extra.get("initiated")
        age = None if started is None else now - float(started)
        top = up.path.split("/", 1)[0]
        if not upload_is_ours(up.path):
            out.append(UploadDecision(up.path, "keep", "not ckptstore's: left alone", age, up))
        elif top in live:
            out.append(UploadDecision(up.path, "keep", "save in flight (fresh lease)", age, up))
        elif top in gone:
            out.append(UploadDecision(up.path, "abort", f"under deleted {top}", age, up))
        elif age is not None and age > stale_after_s:
            out.append(UploadDecision(up.path, "abort", f"stale: {age / 3600:.1f} h old", age, up))
        else:
            why = "age unknown" if age is None else f"recent: {age / 3600:.1f} h old"
            out.append(UploadDecision(up.path, "keep", why, age, up))
    return out


def abort_uploads(root: Store, decisions: Iterable[UploadDecision]) -> list[UploadDecision]:
    """Abort the uploads marked ``abort``; returns those aborted.

    One that cannot be aborted (a transient error, a permission the caller lacks) is logged
    and skipped, so one bad upload never stops a prune; the next one tries it again.
    """
    done = []
    for d in decisions:
        if d.action != "abort" or not upload_is_ours(d.upload.path):
            continue
        try:
            root.abort_multipart(d.upload)
        except CkptStoreError as exc:
            log.warning("could not abort the upload of %s: %s", root.describe(d.path), exc)
            continue
        done.append(d)
    return done
