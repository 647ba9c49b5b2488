"""Argument checks shared by the data-order modules, and the error they raise."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from ckptstore.errors import CkptStoreError

__all__ = [
    "MAX_CURSOR",
    "DataOrderError",
    "IntArray",
    "check_cursor",
    "check_int",
    "check_sizes",
    "check_str",
]

IntArray = npt.NDArray[np.int64]

#: The largest cursor (global sample position) the data order serves: cursors, and the
#: batches past them, stay 64-bit integers (4.6e18 samples: beyond any real run).
MAX_CURSOR = 1 << 62


class DataOrderError(CkptStoreError, ValueError):
    """The data order cannot be computed or resumed as asked; the message says what to change."""


def check_int(name: str, value: object, minimum: int | None = 0) -> int:
    """``value`` as an int, if it is one (not a bool) and at least ``minimum`` (None: any)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise DataOrderError(f"{name} must be an int, got {value!r}")
    if minimum is not None and value < minimum:
        raise DataOrderError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_cursor(name: str, value: object) -> int:
    """``value`` as a cursor: an int in ``[0, MAX_CURSOR]`` (a saved state's cursor past it
    is damaged or crafted; it would overflow the 64-bit arithmetic of the order)."""
    k = check_int(name, value)
    if k > MAX_CURSOR:
        raise DataOrderError(
            f"{name} {k} is beyond any epoch this loader serves (at most {MAX_CURSOR}); the "
            "saved data order state is damaged. Resume from another checkpoint"
        )
    return k


def check_sizes(shard_sizes: Iterable[int]) -> tuple[int, ...]:
    """Shard sample counts as a tuple of ints >= 0 with at least one sample in all."""
    sizes = tuple(check_int(f"shard_sizes[{i}]", n) for i, n in enumerate(shard_sizes))
    if sum(sizes) < 1:
        raise DataOrderError("the dataset has no samples (shard_sizes sum to 0)")
    return sizes


def check_str(name: str, value: object) -> str:
    """``value``, if it is a str."""
    if not isinstance(value, str):
        raise DataOrderError(f"{name} must be a str, got {value!r}")
    return value
