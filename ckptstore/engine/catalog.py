"""Checkpoints under a root: step naming, discovery and status.

A root holds one directory (prefix) per step, named exactly ``step_<9 digits>``
(``engine.names``). Discovery lists the root's children only to find candidate steps;
whether a step is a checkpoint is decided by its marker and manifest (``engine.committed``),
never by the listing. "Newest" is the highest step number, never a modification time.

The root owner's lease (``ckptstore.owner.json``) is ckptstore's and not listed.
Everything else under a root is someone else's: ``scan_root`` reports it (``foreign``), and
a canonical step name that is not a plain directory (a symlink, a regular file) is skipped
with a ``SkippedEntryWarning`` from ``list_steps``: a link is never followed.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field

from ckptstore.engine.committed import CheckpointStatus, committed_status, open_committed
from ckptstore.engine.names import OWNER_NAME, parse_step, step_name
from ckptstore.engine.store import Store
from ckptstore.errors import CkptStoreError, NewerFormatError

__all__ = [
    "step_name",
    "parse_step",
    "StepEntry",
    "Skipped",
    "RootListing",
    "SkippedEntryWarning",
    "scan_root",
    "list_steps",
    "committed_steps",
    "newer_steps",
]


class SkippedEntryWarning(UserWarning):
    """A name under a checkpoint root looks like a step but is not a step directory."""


@dataclass(frozen=True)
class StepEntry:
    """One canonical step directory under a root.

    ``status`` is ``committed``, ``incomplete``, ``corrupt`` (``open_committed``; a
    symlinked marker or manifest counts as ``corrupt``) or ``newer`` (a newer ckptstore's
    format), or ``unknown`` when listed
    ``with_status=False``; ``size`` is a committed step's bytes (its manifest's total).
    """

    step: int
    name: str
    status: str  # committed | incomplete | corrupt | newer
    size: int | None = None


@dataclass(frozen=True)
class Skipped:
    """A root entry that is not one of ckptstore's step directories: left alone."""

    name: str
    reason: str
    #: What the listing says it is: ``dir``, ``file``, ``link`` or ``other``.
    kind: str = ""


@dataclass
class RootListing:
    """What ``scan_root`` found under a root: its step directories and everything else."""

    steps: list[StepEntry]
    #: Step-named entries that are not plain directories (links, files): never touched.
    skipped: list[Skipped] = field(default_factory=list)
    #: Every other entry of the root (``notes.txt``, ``step_5/``): not ckptstore's.
    foreign: list[Skipped] = field(default_factory=list)


_WHY = {
    "link": "a symlink, never followed: not a step directory",
    "file": "a file named like a step, not a step directory",
    "other": "not a directory (device, socket or FIFO)",
}


def _entry(step: int, name: str, store: Store) -> StepEntry:
    status, committed = committed_status(store)
    return StepEntry(step, name, status, committed.manifest.total_bytes if committed else None)


def scan_root(root: Store, with_status: bool = True) -> RootListing:
    """Every canonical step directory under ``root`` (ascending), and what was left out."""
    found: dict[int, str] = {}
    skipped, foreign = [], []
    dirs = set()
    entries = root.scan()
    for e in entries:
        if e.kind == "dir":
            dirs.add(e.name)
    for e in entries:
        step = parse_step(e.name)
        if step is not None and e.kind == "dir":
            found[step] = e.name
        elif step is not None and not (e.kind == "file" and e.name in dirs):
            skipped.append(Skipped(e.name, _WHY.get(e.kind, "not a directory")))
        elif step is not None:  # an object beside a prefix of the same name
            skipped.append(Skipped(e.name, "an object named like a step, beside the step"))
        elif e.name == OWNER_NAME and e.kind == "file":
            continue  # the root owner's lease (engine.owner): ours, not a checkpoint
        else:
            kind = "directory" if e.kind == "dir" else e.kind
            foreign.append(Skipped(e.name, f"not ckptstore's ({kind}): left alone", e.kind))
    steps = [
        _entry(step, name, root.child(name))
        if with_status
        else StepEntry(step, name, CheckpointStatus.UNKNOWN)
        for step, name in sorted(found.items())
    ]
    return RootListing(steps, skipped, foreign)


#: (root url, name) of the skipped entries ``list_steps(once=True)`` warned about already.
_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def list_steps(root: Store, with_status: bool = True, *, once: bool = False) -> list[StepEntry]:
    """Every ``step_%09d`` directory under ``root``, ascending by step, with its status.

    Step-named entries that are not directories are skipped with a ``SkippedEntryWarning``;
    with ``once``, each such entry is warned about once per process (a local tier
    listed after every save: a stray link there is news once, not at every save).
    """
    listing = scan_root(root, with_status)
    for s in listing.skipped:
        if once:
            with _warned_lock:
                if (root.url, s.name) in _warned:
                    continue
                _warned.add((root.url, s.name))
        warnings.warn(
            f"{root.describe(s.name)} skipped: {s.reason}", SkippedEntryWarning, stacklevel=2
        )
    return listing.steps


def committed_steps(root: Store, newest_first: bool = False) -> Iterator[int]:
    """Steps whose marker matches their manifest, ascending (or newest first)."""
    entries = list_steps(root)
    if newest_first:
        entries.reverse()
    return (e.step for e in entries if e.status == CheckpointStatus.COMMITTED)


def newer_steps(root: Store) -> list[tuple[int, str]]:
    """Steps a newer ckptstore committed (status ``newer``: a manifest format this one
    cannot read), newest first, each with the ``NewerFormatError`` saying so: committed
    steps that ``committed_steps`` leaves out, which a resume that finds nothing it can
    load names rather than starting over."""
    out = []
    for e in reversed(list_steps(root)):
        if e.status != CheckpointStatus.NEWER:
            continue
        try:
            open_committed(root.child(e.name))
        except NewerFormatError as exc:
            out.append((e.step, str(exc)))
        except CkptStoreError:
            continue  # changed since it was listed: not this one's to name
    return out
