"""The node-local tier's rules, in one place: what a node keeps, and what a restore trusts.

The node-local tier (``local_tier_dir``) holds each save's shard files, written there
first and uploaded from there (``dcp.staged``), as a restore tier. Keeping: after a save
each node keeps the newest ``keep_local`` of the steps the root keeps
(``local_tier_keeps``, decided once, by rank 0) and deletes the older ones
(``local_tier_deletions``, ``trim_local_tier``; ``keep_newest`` for a staged writer used
alone). Trusting: a local copy is used whole only when its marker is the committed remote
one and every file the manifest lists is there with its size (``local_copy_matches``),
else file by file (``local_files``). Only canonical step directories and ckptstore's own
files are ever deleted; symlinks are never followed (``engine.deletion``).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable

from ckptstore.engine.bounded import MAX_MARKER_SIZE, get_capped
from ckptstore.engine.catalog import list_steps
from ckptstore.engine.committed import Committed
from ckptstore.engine.deletion import delete_step
from ckptstore.engine.manifest import MARKER_NAME, Manifest, Marker
from ckptstore.engine.store import Store
from ckptstore.errors import ConfigError, StoreNotFoundError

__all__ = [
    "keep_newest",
    "local_copy_matches",
    "local_files",
    "local_tier_deletions",
    "local_tier_keeps",
    "trim_local_tier",
]


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


def trim_local_tier(tier: Store, keeps: Collection[int]) -> list[str]:
    """Delete the step directories of ``tier`` (a local tier directory's store) that
    ``keeps`` lets go; their names. Only canonical step directories count: an entry that
    is not one (a symlink, a file named like a step) is warned about once per process and
    left alone, never followed or deleted."""
    steps = {e.step: e.name for e in list_steps(tier, with_status=False, once=True)}
    removed = []
    for step in local_tier_deletions(steps, keeps):
        delete_step(tier, steps[step])
        removed.append(steps[step])
    return removed


def keep_newest(tier: Store, keep_local: int) -> list[str]:
    """Trim ``tier`` to its newest ``keep_local`` step directories; their names."""
    steps = [e.step for e in list_steps(tier, with_status=False, once=True)]
    return trim_local_tier(tier, local_tier_keeps(steps, keep_local)) if steps else []


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
    path = os.path.join(local.url, name)
    return os.path.isfile(path) and not os.path.islink(path) and local.size(name) == size
