"""Retention policies: which committed checkpoints to keep, as small combinable objects.

    policy = KeepLast(3) | KeepEvery(1000)
    doomed = select_deletions(committed_steps, policy, protected={in_flight_step})

A policy only says which steps it *keeps*; :func:`select_deletions` is the one place that
turns that into deletions, and it never deletes the newest committed step or a protected one
(a save in flight, a checkpoint being restored), whatever the policy says. Pure functions:
no I/O, shared by ``ckptstore-tool gc`` and the checkpoint manager.
The local tiers follow one decision too: see ``tier.rules``.
"""

from __future__ import annotations

import abc
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from ckptstore.errors import ConfigError

__all__ = [
    "RetentionPolicy",
    "KeepLast",
    "KeepEvery",
    "KeepAll",
    "AnyOf",
    "select_deletions",
]


def _positive_int(owner: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{owner} needs a whole number >= 1; got {value!r}")
    return value


class RetentionPolicy(abc.ABC):
    """Decides which of a run's committed steps to keep. Combine with ``|`` (keep if any)."""

    @abc.abstractmethod
    def keep(self, steps: list[int]) -> set[int]:
        """The steps to keep among ``steps`` (committed, ascending, no duplicates)."""

    def __or__(self, other: RetentionPolicy) -> AnyOf:
        if not isinstance(other, RetentionPolicy):
            return NotImplemented
        return AnyOf((*_members(self), *_members(other)))

    def describe(self) -> str:
        """A short human description (``keep-last 3``)."""
        return repr(self)


def _members(policy: RetentionPolicy) -> tuple[RetentionPolicy, ...]:
    return policy.policies if isinstance(policy, AnyOf) else (policy,)


@dataclass(frozen=True)
class KeepLast(RetentionPolicy):
    """Keep the ``n`` newest committed steps."""

    n: int

    def __post_init__(self) -> None:
        _positive_int("KeepLast(n)", self.n)

    def keep(self, steps: list[int]) -> set[int]:
        """The newest ``n`` of ``steps``."""
        return set(steps[-self.n :])

    def describe(self) -> str:
        """``keep-last <n>``."""
        return f"keep-last {self.n}"


@dataclass(frozen=True)
class KeepEvery(RetentionPolicy):
    """Keep one checkpoint per ``n_steps`` training steps, for the long-term record.

    Steps are grouped in windows ``[k * n_steps, (k + 1) * n_steps)`` and the first committed
    step of each window is kept, so a step that is an exact multiple of ``n_steps`` is always
    kept, and a run saving at steps that never hit a multiple (every 300 steps with
    ``n_steps=1000``) still keeps one per window. The choice is stable: later saves never
    change which step of a window is kept.
    """

    n_steps: int

    def __post_init__(self) -> None:
        _positive_int("KeepEvery(n_steps)", self.n_steps)

    def keep(self, steps: list[int]) -> set[int]:
        """The first step of each ``n_steps`` window."""
        first: dict[int, int] = {}
        for step in steps:
            first.setdefault(step // self.n_steps, step)
        return set(first.values())

    def describe(self) -> str:
        """``keep-every <n> steps``."""
        return f"keep-every {self.n_steps} steps"


@dataclass(frozen=True)
class KeepAll(RetentionPolicy):
    """Keep everything (retention off)."""

    def keep(self, steps: list[int]) -> set[int]:
        """Every step."""
        return set(steps)

    def describe(self) -> str:
        """``keep all``."""
        return "keep all"


@dataclass(frozen=True)
class AnyOf(RetentionPolicy):
    """Keep a step if any of ``policies`` keeps it (what ``a | b`` builds)."""

    policies: tuple[RetentionPolicy, ...]

    def keep(self, steps: list[int]) -> set[int]:
        """The union of what each policy keeps."""
        out: set[int] = set()
        for p in self.policies:
            out |= p.keep(steps)
        return out

    def describe(self) -> str:
        """The policies' descriptions joined by `` | ``."""
        return " | ".join(p.describe() for p in self.policies)


def select_deletions(
    committed_steps: Iterable[int], policy: RetentionPolicy, protected: Collection[int] = ()
) -> list[int]:
    """The committed steps ``policy`` lets go, ascending.

    Never returned, whatever the policy: the newest committed step and any ``protected``
    step (a save in flight, a checkpoint being restored).
    """
    steps = sorted(set(committed_steps))
    if not steps:
        return []
    keep = policy.keep(list(steps)) | {steps[-1]} | set(protected)
    return [s for s in steps if s not in keep]
