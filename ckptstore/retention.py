"""Retention policies: which committed checkpoints to keep.

Policies are small objects combined with ``|`` (keep what either keeps)::

    policy = KeepLast(3) | KeepEvery(1000)
    doomed = select_deletions(committed_steps, policy, protected={restoring_step})

``select_deletions`` is pure and never selects the newest committed step or a protected
one (being restored, in flight).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass

__all__ = ["RetentionPolicy", "KeepLast", "KeepEvery", "KeepAll", "select_deletions"]


class RetentionPolicy:
    """Decides which of the committed steps to keep."""

    def keep(self, steps: list[int]) -> set[int]:
        raise NotImplementedError

    def __or__(self, other: RetentionPolicy) -> RetentionPolicy:
        return _Union((self, other))


@dataclass(frozen=True)
class _Union(RetentionPolicy):
    parts: tuple[RetentionPolicy, ...]

    def keep(self, steps: list[int]) -> set[int]:
        return set().union(*(p.keep(steps) for p in self.parts))


@dataclass(frozen=True)
class KeepLast(RetentionPolicy):
    """Keep the ``n`` newest committed checkpoints."""

    n: int

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError("KeepLast(n) needs n >= 1 (the newest checkpoint is always kept)")

    def keep(self, steps: list[int]) -> set[int]:
        return set(sorted(steps)[-self.n :])


@dataclass(frozen=True)
class KeepEvery(RetentionPolicy):
    """Keep every checkpoint whose step is a multiple of ``n_steps``."""

    n_steps: int

    def __post_init__(self) -> None:
        if self.n_steps < 1:
            raise ValueError("KeepEvery(n_steps) needs n_steps >= 1")

    def keep(self, steps: list[int]) -> set[int]:
        return {s for s in steps if s % self.n_steps == 0}


@dataclass(frozen=True)
class KeepAll(RetentionPolicy):
    """Keep everything."""

    def keep(self, steps: list[int]) -> set[int]:
        return set(steps)


def select_deletions(
    committed: Iterable[int], policy: RetentionPolicy, protected: Collection[int] = ()
) -> list[int]:
    """Committed steps the policy lets go, never the newest one nor a protected one."""
    steps = sorted(set(committed))
    if not steps:
        return []
    keep = policy.keep(steps) | {steps[-1]} | set(protected)
    return [s for s in steps if s not in keep]
