"""What both staging arenas share: where a tensor lies, and a state's skeleton with holes.

A staged state is its non-tensor structure (the *skeleton*, each tensor replaced by a
``Hole`` naming its slot) plus one ``Slot`` per tensor in an arena; ``fill`` puts tensors
back into the holes. ``allocated`` and ``user_values`` turn what allocating an arena or
copying the user's values raised into errors that say what to do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from ckptstore.errors import ConfigError, StagingMemoryError

__all__ = ["ALIGN", "Hole", "Slot", "allocated", "fill", "user_values"]

#: Every slot starts at a multiple of this many bytes.
ALIGN = 64
_T = TypeVar("_T")


@dataclass(frozen=True)
class Slot:
    """Where one tensor lies in the arena."""

    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    round: int = 0  # with a staging budget: the round it belongs to (offset: in the segment)


@dataclass(frozen=True)
class Hole:
    """Where tensor ``index`` (of the staged state's tensors, in order) goes back."""

    index: int  # into StagedState.slots

    def __deepcopy__(self, memo: dict[int, Any]) -> Hole:
        # Immutable: itself. (``copy.deepcopy`` would rebuild each one through
        # ``__reduce_ex__``: most of the time ``prepare`` spends on a model's state.)
        return self


def allocated(nbytes: int, make: Callable[[], _T]) -> _T:
    """``make()``, which allocates an arena of ``nbytes``, or ``StagingMemoryError`` saying
    what to do when the memory cannot be had (mmap, memfd or pinning failed)."""
    try:
        return make()
    except (OSError, MemoryError, RuntimeError) as exc:
        raise StagingMemoryError(
            f"could not allocate {nbytes} bytes of host memory to stage the state into "
            f"({type(exc).__name__}: {exc}); free host memory, or bound what saves stage "
            "with CheckpointManager(max_staging_bytes=...) below what is free"
        ) from exc


def user_values(make: Callable[[], Any], message: str) -> Any:
    """``make()`` (a copy or pickle of the user's non-tensor values), or ``ConfigError``
    with ``message``, its ``{error}`` the exception it raised."""
    try:
        return make()
    except Exception as exc:  # noqa: BLE001 - whatever the user's values raise
        raise ConfigError(message.format(error=f"{type(exc).__name__}: {exc}")) from exc


def fill(obj: Any, make: Callable[[int], torch.Tensor]) -> Any:
    """``obj`` (freshly unpickled) with every hole replaced by ``make(index)``."""
    if isinstance(obj, Hole):
        return make(obj.index)
    if isinstance(obj, dict):
        for k, v in obj.items():
            obj[k] = fill(v, make)
        return obj
    if isinstance(obj, list):
        obj[:] = [fill(v, make) for v in obj]
        return obj
    if isinstance(obj, tuple):
        values = [fill(v, make) for v in obj]
        return type(obj)(*values) if hasattr(obj, "_fields") else tuple(values)
    return obj
