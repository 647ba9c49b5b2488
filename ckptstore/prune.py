"""Prune a root of checkpoints: retention, torn leftovers and stale multipart uploads.

    plan = plan_prune(root, KeepLast(3) | KeepEvery(1000), protected={in_flight})
    print(plan.deletions)          # look before you leap (``gc --dry-run`` prints this)
    apply_prune(root, plan)

What is deleted:

* committed steps the policy lets go (``retention.select_deletions``: never the newest
  committed step, never a protected one);
* torn leftovers: steps without a valid marker that are *older* than the newest committed
  step (a save that died). Incomplete steps newer than the newest commit may be saves in
  flight and are never touched; corrupt steps (a marker that matches no manifest) are left
  for a human to inspect;
* unfinished multipart uploads under a deleted step, and any older than ``stale_after_s``
  (stores record the start time in ``Multipart.extra["initiated"]``; uploads of unknown age
  are kept).

A committed step is deleted marker first, so a deletion cut short leaves an incomplete step
(which the next prune removes), never a committed one with files missing.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass, field

from ckptstore.catalog import list_steps
from ckptstore.engine.commit import delete_checkpoint, open_committed
from ckptstore.engine.store import Multipart, Store
from ckptstore.errors import CkptStoreError, StoreNotFoundError
from ckptstore.retention import RetentionPolicy, select_deletions

__all__ = ["StepDecision", "UploadDecision", "PrunePlan", "plan_prune", "apply_prune"]


@dataclass(frozen=True)
class StepDecision:
    step: int
    name: str
    status: str  # committed | incomplete | corrupt
    action: str  # keep | delete
    reason: str
    size: int | None = None


@dataclass(frozen=True)
class UploadDecision:
    path: str
    action: str  # keep | abort
    reason: str
    age_s: float | None
    upload: Multipart = field(repr=False, compare=False)


@dataclass
class PrunePlan:
    root: str
    policy: str
    steps: list[StepDecision]
    uploads: list[UploadDecision]

    @property
    def deletions(self) -> list[StepDecision]:
        return [s for s in self.steps if s.action == "delete"]

    @property
    def aborts(self) -> list[UploadDecision]:
        return [u for u in self.uploads if u.action == "abort"]

    @property
    def freed_bytes(self) -> int:
        return sum(s.size or 0 for s in self.deletions)


def _size(store: Store, status: str) -> int | None:
    if status == "committed":
        try:
            return open_committed(store).manifest.total_bytes
        except CkptStoreError:
            return None
    total = 0
    for name in store.find():
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
    stale_after_s: float = 24 * 3600.0,
    now: float | None = None,
) -> PrunePlan:
    """Decide what to delete under ``root`` (nothing is changed; see the module docstring)."""
    now = time.time() if now is None else now
    entries = list_steps(root)
    committed = [e.step for e in entries if e.status == "committed"]
    newest = max(committed) if committed else None
    doomed = set(select_deletions(committed, policy, protected))
    decisions = []
    for e in entries:
        if e.step in protected:
            action, reason = "keep", "protected"
        elif e.status == "committed":
            if e.step in doomed:
                action, reason = "delete", f"not kept by {policy.describe()}"
            elif e.step == newest:
                action, reason = "keep", "newest committed"
            else:
                action, reason = "keep", _keep_reason(e.step, committed, policy)
        elif e.status == "corrupt":
            action, reason = "keep", "corrupt: left for inspection (ckptstore-tool verify)"
        elif newest is not None and e.step < newest:
            action, reason = "delete", "torn leftover (no marker, older than the newest commit)"
        else:
            action, reason = "keep", "no marker, newer than the newest commit: may be in flight"
        size = _size(root.child(e.name), e.status)
        decisions.append(StepDecision(e.step, e.name, e.status, action, reason, size))
    gone = {d.name for d in decisions if d.action == "delete"}
    uploads = []
    for up in root.list_multipart():
        started = up.extra.get("initiated")
        age = None if started is None else now - float(started)
        top = up.path.split("/", 1)[0]
        if top in gone:
            uploads.append(UploadDecision(up.path, "abort", f"under deleted {top}", age, up))
        elif age is not None and age > stale_after_s:
            uploads.append(
                UploadDecision(up.path, "abort", f"stale: {age / 3600:.1f} h old", age, up)
            )
        else:
            why = "age unknown" if age is None else f"recent: {age / 3600:.1f} h old"
            uploads.append(UploadDecision(up.path, "keep", why, age, up))
    return PrunePlan(root.url, policy.describe(), decisions, uploads)


def apply_prune(root: Store, plan: PrunePlan) -> None:
    """Carry out ``plan``: delete its steps (marker first) and abort its uploads."""
    for d in plan.deletions:
        delete_checkpoint(root.child(d.name))
    for u in plan.aborts:
        root.abort_multipart(u.upload)
