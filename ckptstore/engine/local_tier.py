"""The node-local tier's rules, in one place: what a node keeps, and what a restore trusts.

The node-local tier (``local_tier_dir``) holds each save's shard files, written there
first and uploaded from there (``dcp.staged``), as a restore tier. Keeping: after a save
each node keeps the newest ``keep_local`` of the steps the root keeps
(``local_tier_keeps``, decided once, by rank 0) and deletes the older ones
(``local_tier_deletions``, ``trim_local_tier``; ``keep_newest`` for a staged writer used
alone). Trusting: a local copy is used whole only when its marker is the committed remote
one and every file the manifest lists is there with its size (``local_copy_matches``),
else file by file (``local_files``). With two cadences (``save_tier``) some steps are
saved to the local tier alone: their manifest says so (``LOCAL_ONLY``). Only canonical
step directories and ckptstore's own files are ever deleted; symlinks are never followed
(``engine.deletion``). A manager stamps each step directory with its run (``stamp_run``)
and trims or evicts only its own run's: another job's or run's steps in the same directory
are left alone.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Collection, Iterable, Mapping

from ckptstore.engine.bounded import MAX_MARKER_SIZE, get_capped
from ckptstore.engine.catalog import list_steps
from ckptstore.engine.committed import Committed
from ckptstore.engine.deletion import delete_step
from ckptstore.engine.manifest import MARKER_NAME, Manifest, Marker
from ckptstore.engine.names import RUN_STAMP
from ckptstore.engine.store import Store
from ckptstore.errors import CkptStoreError, ConfigError, StoreNotFoundError, UnsafePathError

__all__ = [
    "LOCAL_ONLY",
    "evict_for",
    "evictions",
    "keep_newest",
    "local_copy_matches",
    "local_files",
    "local_tier_deletions",
    "local_tier_keeps",
    "run_of_step",
    "save_tier",
    "stamp_run",
    "trim_local_tier",
]

#: ``manifest.extra["tier"]`` of a step saved to the local tier alone (never to the root).
LOCAL_ONLY = "local"


def save_tier(step: int, local_every: int | None, remote_every: int) -> str | None:
    """Where the save of ``step`` goes: ``"remote"`` (the root, through the local tier
    when there is one) every ``remote_every`` steps, else ``"local"`` (the local tier
    alone) every ``local_every`` steps, else None (no save). ``remote_every=1`` and no
    ``local_every``: every save goes to the root."""
    if step % remote_every == 0:
        return "remote"
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


def stamp_run(tier: Store, name: str, run: str) -> None:
    """Record in step directory ``name`` of ``tier`` (a local tier) that it holds a step
    of ``run`` (made if absent)."""
    tier.child(name).put(RUN_STAMP, json.dumps({"run": run}).encode())


def run_of_step(tier: Store, name: str) -> str | None:
    """The run ``stamp_run`` recorded in step directory ``name`` of ``tier``; None when
    there is no readable stamp (another tool's directory, or one ckptstore did not stamp)."""
    try:
        doc = json.loads(get_capped(tier.child(name), RUN_STAMP, MAX_MARKER_SIZE))
    except (CkptStoreError, OSError, ValueError):
        return None
    run = doc.get("run") if isinstance(doc, dict) else None
    return run if isinstance(run, str) else None


def _steps(tier: Store, run: str | None, steps: dict[int, str] | None = None) -> dict[int, str]:
    """The canonical step directories of ``tier`` (step -> name; ``steps``: as already
    listed); with ``run``, only those stamped with it."""
    if steps is None:
        steps = {e.step: e.name for e in list_steps(tier, with_status=False, once=True)}
    if run is None:
        return steps
    return {s: n for s, n in steps.items() if run_of_step(tier, n) == run}


def trim_local_tier(tier: Store, keeps: Collection[int], run: str | None = None) -> list[str]:
    """Delete the step directories of ``tier`` (a local tier directory's store) that
    ``keeps`` lets go; their names. Only canonical step directories count: an entry that
    is not one (a symlink, a file named like a step) is warned about once per process and
    left alone, never followed or deleted. With ``run``, only that run's steps count
    (``stamp_run``): another run's are never deleted."""
    steps = _steps(tier, run)
    removed = []
    for step in local_tier_deletions(steps, keeps):
        delete_step(tier, steps[step])
        removed.append(steps[step])
    return removed


def keep_newest(tier: Store, keep_local: int) -> list[str]:
    """Trim ``tier`` to its newest ``keep_local`` step directories; their names."""
    steps = [e.step for e in list_steps(tier, with_status=False, once=True)]
    return trim_local_tier(tier, local_tier_keeps(steps, keep_local)) if steps else []


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


def evict_for(tier: Store, step: int, need: int, limit: int, run: str | None = None) -> list[str]:
    """Delete the oldest step directories of ``tier`` (a local tier directory's store)
    other than ``step`` (never the newest complete one), of ``run`` only when given,
    until ``need`` bytes fit within ``limit`` beside all of them; their names. Sizes
    count regular files only, never through a symlink (``engine.deletion`` deletes only
    ckptstore's own files)."""
    everything = {e.step: e.name for e in list_steps(tier, with_status=False, once=True)}
    steps = _steps(tier, run, everything)
    foreign = sum(
        _dir_bytes(os.path.join(tier.url, n))
        for s, n in everything.items()
        if s not in steps and s != step
    )
    limit -= foreign  # another run's steps take room that cannot be freed
    others = {s: _dir_bytes(os.path.join(tier.url, n)) for s, n in steps.items() if s != step}
    removed = []
    for old in evictions(others, need, limit):
        delete_step(tier, steps[old])
        removed.append(steps[old])
    return removed


def _dir_bytes(path: str) -> int:
    """The bytes of the regular files under ``path``, symlinks neither followed nor counted."""
    total = 0
    for dirpath, _, files in os.walk(path, followlinks=False):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            if stat.S_ISREG(st.st_mode):
                total += st.st_size
    return total


def local_files(local: Store, manifest: Manifest) -> list[str]:
    """The files of the committed step whose verified ``manifest`` is given that ``local``
    (a local store: this node's copy of the step) holds as regular files (never a
    symlink) of the size the manifest records."""
    return [name for name, entry in manifest.files.items() if _holds(local, name, entry.size)]


def local_copy_matches(local: Store, committed: Committed) -> bool:
    """True when ``local`` (a local store) holds a whole copy of the committed remote
    step: its marker is the remote one and every file the manifest lists is a regular
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
