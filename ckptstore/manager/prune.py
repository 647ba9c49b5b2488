"""Prune a root of checkpoints: retention, torn leftovers and stale multipart uploads.

    plan = plan_prune(root, KeepLast(3) | KeepEvery(1000), protected={in_flight})
    print(plan.deletions)          # look before you leap (``gc --dry-run`` prints this)
    apply_prune(root, plan)

Shared by ``ckptstore-tool gc`` and the checkpoint manager. Everything is deleted through
``engine.deletion`` (only ckptstore's own files of canonical ``step_%09d`` directories,
a committed step marker first, so a deletion cut short leaves an incomplete step, never
a committed one with files missing). Anything else under the root is left alone and
listed in ``PrunePlan.left_alone``; ``plan_prune`` says what is deleted and why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from dataclasses import dataclass, field

from ckptstore.engine.catalog import scan_root
from ckptstore.engine.committed import CheckpointStatus, checkpoint_status
from ckptstore.engine.deletion import (
    UploadDecision,
    abort_uploads,
    delete_step,
    plan_uploads,
    step_files,
    step_in_flight,
)
from ckptstore.engine.store import Store
from ckptstore.errors import CkptStoreError, InUseError, StoreNotFoundError
from ckptstore.manager.retention import RetentionPolicy, select_deletions

log = logging.getLogger(__name__)

__all__ = [
    "StepDecision",
    "UploadDecision",
    "LeftAlone",
    "PrunePlan",
    "plan_prune",
    "apply_prune",
]


@dataclass(frozen=True)
class StepDecision:
    """What a prune does with one ``step_*`` directory, and why."""

    step: int
    name: str
    status: str  # committed | incomplete | corrupt | damaged
    action: str  # keep | delete
    reason: str
    size: int | None = None


@dataclass(frozen=True)
class LeftAlone:
    """Something under the root that is not ckptstore's: never deleted."""

    path: str
    reason: str


@dataclass
class PrunePlan:
    """Everything :func:`plan_prune` decided for a root; :func:`apply_prune` carries it out."""

    root: str
    policy: str
    steps: list[StepDecision]
    uploads: list[UploadDecision]
    left_alone: list[LeftAlone] = field(default_factory=list)
    newest: str | None = None  # the newest good committed step's name (never deleted)

    @property
    def deletions(self) -> list[StepDecision]:
        """The steps to delete."""
        return [s for s in self.steps if s.action == "delete"]

    @property
    def aborts(self) -> list[UploadDecision]:
        """The stale uploads to abort."""
        return [u for u in self.uploads if u.action == "abort"]

    @property
    def freed_bytes(self) -> int:
        """Bytes the deletions free (steps of unknown size count 0)."""
        return sum(s.size or 0 for s in self.deletions)


def _size(store: Store, files: list[str]) -> int:
    """The bytes of a step that is not committed: its files' sizes (those still there)."""
    total = 0
    for name in files:
        try:
            total += store.size(name)
        except StoreNotFoundError:
            continue
    return total


def _keep_reason(step: int, steps: list[int], policy: RetentionPolicy) -> str:
    members = getattr(policy, "policies", (policy,))
    reasons = [p.describe() for p in members if step in p.keep(steps)]
    return ", ".join(reasons)


def plan_prune(
    root: Store,
    policy: RetentionPolicy,
    *,
    protected: Collection[int] = (),
    damaged: Collection[int] = (),
    stale_after_s: float = 24 * 3600.0,
    now: float | None = None,
) -> PrunePlan:
    """Decide what to delete under ``root``; nothing is changed.

    Deleted: committed steps ``policy`` lets go (``retention.select_deletions``: never the
    newest committed step, never a ``protected`` one); torn leftovers (steps without a
    valid marker *older* than the newest committed step: a save that died); unfinished
    multipart uploads of ckptstore files under a deleted step, and any older than
    ``stale_after_s`` (uploads of unknown age are kept). Never deleted: a step holding a
    fresh lease (a save in flight, ``engine.lease``; ``apply_prune`` checks again right
    before each deletion), incomplete steps newer than the newest commit, corrupt steps
    (a marker that matches no manifest), steps a newer ckptstore wrote (``newer``: left
    for it) and ``damaged`` ones (their marker matched but their bytes did not, found at
    restore), left for a human to inspect; none counts toward what ``policy`` keeps:
    ``KeepLast(2)`` keeps two *good* checkpoints.
    """
    now = time.time() if now is None else now
    listing = scan_root(root)
    bad = set(damaged)
    committed = [
        e.step
        for e in listing.steps
        if e.status == CheckpointStatus.COMMITTED and e.step not in bad
    ]
    newest = max(committed) if committed else None
    doomed = set(select_deletions(committed, policy, protected))
    decisions = []
    left = [LeftAlone(s.name, s.reason) for s in listing.skipped + listing.foreign]
    for e in listing.steps:
        status = (
            CheckpointStatus.DAMAGED
            if e.step in bad and e.status == CheckpointStatus.COMMITTED
            else e.status
        )
        listed = status != CheckpointStatus.COMMITTED or e.step in doomed
        files = step_files(root, e.name) if listed else None
        holder = step_in_flight(root, e.name, files.ours) if files is not None else None
        if e.step in protected:
            action, reason = "keep", "protected"
        elif holder is not None:
            action, reason = "keep", f"save in flight: lease of {holder.describe(now)}"
        elif status == CheckpointStatus.COMMITTED:
            if e.step in doomed:
                action, reason = "delete", f"not kept by {policy.describe()}"
            elif e.step == newest:
                action, reason = "keep", "newest committed"
            else:
                action, reason = "keep", _keep_reason(e.step, committed, policy)
        elif status == CheckpointStatus.DAMAGED:
            action, reason = "keep", "damaged (found corrupt at restore): left for inspection"
        elif status == CheckpointStatus.CORRUPT:
            action, reason = "keep", "corrupt: left for inspection (ckptstore-tool verify)"
        elif status == CheckpointStatus.NEWER:
            action, reason = "keep", "written by a newer ckptstore: left alone (upgrade it)"
        elif files is not None and not files.ours:
            action, reason = "keep", "no ckptstore files: not ckptstore's, left alone"
        elif newest is not None and e.step < newest:
            action, reason = "delete", "torn leftover (no marker, older than the newest commit)"
        else:
            action, reason = "keep", "no marker, newer than the newest commit: may be in flight"
        if action == "delete" and files is not None:
            left += [
                LeftAlone(f"{e.name}/{f}", "not ckptstore's: left alone") for f in files.foreign
            ]
        size = (
            e.size
            if status == CheckpointStatus.COMMITTED
            else _size(root.child(e.name), files.ours if files else [])
        )
        decisions.append(StepDecision(e.step, e.name, status, action, reason, size))
    gone = {d.name for d in decisions if d.action == "delete"}
    live = {d.name for d in decisions if d.reason.startswith("save in flight")}
    uploads = plan_uploads(root, gone, stale_after_s, now, in_flight=live)
    left += [LeftAlone(u.path, u.reason) for u in uploads if u.reason.startswith("not ckptstore")]
    by_step = {d.step: d.name for d in decisions}
    return PrunePlan(
        root.url,
        policy.describe(),
        decisions,
        uploads,
        left,
        by_step.get(newest) if newest is not None else None,
    )


def apply_prune(root: Store, plan: PrunePlan) -> list[str]:
    """Carry out ``plan``: delete its steps (marker first) and abort its uploads. Returns
    the steps deleted only in part, one line each: a save attempt in them whose commit
    fence kept its files (``engine.deletion.held_fences``; ``ckptstore-tool gc --repair``).

    Committed steps are deleted only while the newest good commit the plan saw is still
    committed, so a root is never left without a checkpoint by a prune racing another;
    a step whose save started since the plan (a fresh lease) is left alone.
    """
    try:
        newest_ok = (
            plan.newest is not None
            and checkpoint_status(root.child(plan.newest)) == CheckpointStatus.COMMITTED
        )
    except CkptStoreError:
        newest_ok = False
    held = []
    for d in plan.deletions:
        if d.status == CheckpointStatus.COMMITTED and not newest_ok:
            continue
        try:
            left = delete_step(root, d.name)  # refuses a step whose save started since
        except InUseError as exc:
            log.info("%s", exc)
            continue
        held += [
            f"{d.name}: the files of save attempt {a} are kept: its writer claimed its "
            "commit and may still create its marker (ckptstore-tool gc ROOT --repair)"
            for a in left.held
        ]
    abort_uploads(root, plan.uploads)
    return held
