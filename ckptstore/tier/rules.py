"""The local tier's rules, in one place: what a node keeps, and what a restore trusts.

The local tier (``local_tier_dir``) holds each save's shard files, written there and
uploaded to the root at once (``tier.tier_writer``), as tier copies a restore can read.
Keeping: after a save each node keeps the newest ``keep_local`` of the steps the root keeps
(``local_tier_keeps``, decided once, by rank 0) and deletes the older ones
(``local_tier_deletions``, ``trim_local_tier``; ``keep_newest`` for a ``TierWriter`` used
alone). Trusting: a tier copy is used whole only when its marker is the committed one of
the root and every file the manifest lists is there with its size (``local_copy_matches``),
else file by file (``local_files``). With two cadences (``save_tier``) some steps are
saved to the local tier alone: their manifest says so (``LOCAL_ONLY``). Only canonical
step directories and ckptstore's own files are ever deleted; symlinks are never followed
(``engine.deletion``). Every rule acts within one job's directory of the tier
(``tier.jobs``: a job is a root and a run), opened only once its stamp proves it
the job's own: another job's copies in the same tier are never used, trimmed or evicted.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from ckptstore.engine.bounded import MAX_MARKER_SIZE, get_capped
from ckptstore.engine.catalog import list_steps
from ckptstore.engine.committed import Committed
from ckptstore.engine.deletion import delete_step
from ckptstore.engine.manifest import MARKER_NAME, Manifest, Marker
from ckptstore.engine.store import Store
from ckptstore.errors import ConfigError, StoreNotFoundError, UnsafePathError
from ckptstore.tier.jobs import TierJob, open_job, stored_bytes

__all__ = [
    "LOCAL_ONLY",
    "evict_for",
    "evictions",
    "keep_newest",
    "local_copy_matches",
    "local_files",
    "local_tier_deletions",
    "local_tier_keeps",
    "save_tier",
    "trim_local_tier",
]

#: ``manifest.extra["tier"]`` of a step saved to the local tier alone (never to the root).
LOCAL_ONLY = "local"


def save_tier(step: int, local_every: int | None, root_every: int) -> str | None:
    """Where the save of ``step`` goes: ``"root"`` (through the local tier when there is
    one) every ``root_every`` steps, else ``"local"`` (the local tier alone) every
    ``local_every`` steps, else None (no save). ``root_every=1`` and no ``local_every``:
    every save goes to the root."""
    if step % root_every == 0:
        return "root"
    if local_every is not None and step % local_every == 0:
        return "local"
    return None


def local_tier_keeps(kept_steps: Iterable[int], keep_local: int) -> set[int]:
    """The steps every node's local tier keeps: the newest ``keep_local`` of
    ``kept_steps`` (the committed steps the root keeps, the one just saved among them)."""
    if isinstance(keep_local, bool) or not isinstance(keep_local, int) or keep_local < 1:
        raise ConfigError(f"keep_local needs a whole number >= 1; got {keep_local!r}")
    return set(sorted(set(kept_steps))[-keep_local:])


def local_tier_deletions(local_steps: Iterable[int], keeps: Collection[int]) -> list[int]:
    """The steps of one node's local tier that ``keeps`` (from :func:`local_tier_keeps`)
    lets go, ascending: every one not kept that is older than the newest kept step. A step
    newer than that is left alone (a save the decision did not know of); no decision
    (``keeps`` empty) deletes nothing."""
    if not keeps:
        return []
    newest = max(keeps)
    return sorted(s for s in set(local_steps) if s not in keeps and s < newest)


def trim_local_tier(job_dir: Store, keeps: Collection[int]) -> list[str]:
    """Delete the step directories of ``job_dir`` (a job's directory of a local tier,
    ``tier.jobs.open_job``) that ``keeps`` lets go; their names. Only canonical
    step directories count: an entry that is not one (a symlink, a file named like a step)
    is warned about once per process and left alone, never followed or deleted."""
    steps = _steps(job_dir)
    removed = []
    for step in local_tier_deletions(steps, keeps):
        delete_step(job_dir, steps[step])
        removed.append(steps[step])
    return removed


def keep_newest(job_dir: Store, keep_local: int) -> list[str]:
    """Trim ``job_dir`` (a job's directory of a local tier) to its newest ``keep_local``
    step directories; their names."""
    steps = _steps(job_dir)
    return trim_local_tier(job_dir, local_tier_keeps(steps, keep_local)) if steps else []


def _steps(job_dir: Store) -> dict[int, str]:
    """The canonical step directories of ``job_dir``: step -> name."""
    return {e.step: e.name for e in list_steps(job_dir, with_status=False, once=True)}


def evictions(others: Mapping[int, int], need: int, limit: int) -> list[int]:
    """The steps to evict, oldest first, so that ``need`` bytes (the newest step's, with
    its replicas and the next save's shards) fit in ``limit`` beside the steps kept:
    ``others`` maps each other step of the tier to its bytes. Never more than all of them."""
    held = sum(others.values())
    out = []
    for step in sorted(others):
        if held + need <= limit:
            break
        out.append(step)
        held -= others[step]
    return out


def evict_for(tier: Store, job: TierJob, step: int, need: int, limit: int) -> list[str]:
    """Delete the oldest step directories of ``job``'s directory of ``tier`` (a local
    tier's store) other than ``step`` (the newest, never evicted) until ``need`` bytes fit
    within ``limit`` beside all that stays; their names. Everything else in the tier
    (other jobs' directories, the older layout's steps, files ckptstore did not make)
    takes room that is never freed here: it is counted, never deleted. Sizes count regular
    files only, never through a symlink. ``TierStampError`` if the job's directory is
    not provably its own (nothing is deleted)."""
    job_dir = open_job(tier, job)
    if job_dir is None:
        return []
    steps = _steps(job_dir)
    sizes = {s: stored_bytes(job_dir, n) for s, n in steps.items()}
    elsewhere = stored_bytes(tier) - sum(sizes.values())  # not this job's steps
    others = {s: b for s, b in sizes.items() if s != step}
    removed = []
    for old in evictions(others, need, limit - elsewhere):
        delete_step(job_dir, steps[old])
        removed.append(steps[old])
    return removed


def local_files(local: Store, manifest: Manifest) -> list[str]:
    """The files of the committed step whose verified ``manifest`` is given that ``local``
    (a local store: this node's copy of the step) holds as regular files (never a
    symlink) of the size the manifest records."""
    return [name for name, entry in manifest.files.items() if _holds(local, name, entry.size)]


def local_copy_matches(local: Store, committed: Committed) -> bool:
    """True when ``local`` (a tier copy) holds a whole copy of the committed step of the
    root: its marker is the root's and every file the manifest lists is a regular
    file (never a symlink) of the recorded size. Reads only the local marker."""
    try:
        data = get_capped(local, MARKER_NAME, MAX_MARKER_SIZE)
        marker = Marker.from_bytes(data, local.describe(MARKER_NAME))
    except StoreNotFoundError:
        return False
    if marker != committed.marker:
        return False
    return all(_holds(local, name, e.size) for name, e in committed.manifest.files.items())


def _holds(local: Store, name: str, size: int) -> bool:
    # The store's size() is the check and the act at once: a volume store resolves the
    # name from its root's descriptor, refusing a link anywhere on the way
    # (UnsafePathError) and anything but a regular file (StoreNotFoundError).
    try:
        return local.size(name) == size
    except (StoreNotFoundError, UnsafePathError):
        return False
