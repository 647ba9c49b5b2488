"""Checkpoints under a root: step naming, discovery and status.

A root holds one directory (prefix) per step, ``step_<9 digits>``. Discovery lists the
root's children only to find candidate steps; whether a step is a checkpoint is decided
by its marker and manifest (``engine.commit``), never by the listing. "Newest" is the
highest step number, never a modification time.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from ckptstore.engine.commit import checkpoint_status
from ckptstore.engine.layout import parse_step, step_name
from ckptstore.engine.store import Store

__all__ = ["step_name", "parse_step", "StepEntry", "list_steps", "committed_steps"]


@dataclass(frozen=True)
class StepEntry:
    step: int
    name: str
    status: str  # committed | incomplete | corrupt


def list_steps(root: Store, with_status: bool = True) -> list[StepEntry]:
    """Every ``step_*`` under ``root``, ascending by step, with its commit status."""
    found = sorted(
        (step, name) for name in root.listdir() if (step := parse_step(name)) is not None
    )
    return [
        StepEntry(step, name, checkpoint_status(root.child(name)) if with_status else "unknown")
        for step, name in found
    ]


def committed_steps(root: Store, newest_first: bool = False) -> Iterator[int]:
    """Steps whose marker matches their manifest, ascending (or newest first)."""
    entries = list_steps(root)
    if newest_first:
        entries.reverse()
    return (e.step for e in entries if e.status == "committed")
