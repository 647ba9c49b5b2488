"""Planning the ranged reads of a whole load: pure functions, no I/O.

A load asks for many ranges (one per stored item) at once. Read one GET per item and a
state of many small tensors pays one round trip per tensor; read each large item as
fixed-size parts and a load of a few large tensors may use fewer connections than the
engine has. So the reader plans its reads from the whole load plan, in two steps::

    piece = piece_size(total_bytes, config.part_size, config.concurrency)
    windows = coalesce(ranges, max_window=piece)

- ``piece_size``: the size of one ranged GET, so that the load's bytes cut into about
  ``concurrency`` pieces or more (every connection busy until the end), never more than
  ``part_size`` and never below ``min_piece`` (a GET much smaller than a link's
  bandwidth-delay product spends its time waiting for the first byte).
- ``coalesce``: ranges of one file, in offset order, that are smaller than ``max_window``
  and adjacent (at most ``max_gap`` bytes apart) merge into one window of at most
  ``max_window`` bytes: one GET instead of one per range. A range of ``max_window`` bytes
  or more is a window of its own; the engine splits it into ``piece``-sized GETs in
  parallel.

Each range keeps its own integrity check: the reader verifies every member of a window
against its manifest CRC32C, exactly as it verifies a range read alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckptstore.config import MiB

__all__ = ["MIN_PIECE", "Window", "coalesce", "piece_size"]

#: The smallest ranged GET a load plans (unless the part size itself is smaller): 4 MiB
#: is ~1.7 bandwidth-delay products of a 200 Mbit/s connection with a 40 ms round trip.
MIN_PIECE = 4 * MiB


@dataclass(frozen=True)
class Window:
    """One planned read: ``length`` bytes at ``offset`` of ``path``, covering the given
    ranges ``members`` (indexes into the sequence given to :func:`coalesce`, in offset
    order)."""

    path: str
    offset: int
    length: int
    members: tuple[int, ...]

    @property
    def end(self) -> int:
        """The first byte after the window."""
        return self.offset + self.length


def piece_size(total: int, part_size: int, concurrency: int, min_piece: int = MIN_PIECE) -> int:
    """The GET size for a load of ``total`` bytes: ``ceil(total / concurrency)`` clamped
    to ``[min(min_piece, part_size), part_size]``."""
    if part_size < 1 or concurrency < 1 or min_piece < 1:
        raise ValueError("piece_size: part_size, concurrency and min_piece must be >= 1")
    share = -(-max(total, 0) // concurrency)
    return max(min(min_piece, part_size), min(share, part_size))


def coalesce(
    ranges: Sequence[tuple[str, int, int]], max_window: int, max_gap: int = 0
) -> list[Window]:
    """Group ``(path, offset, length)`` ranges into windows (see the module docstring).

    Windows come back sorted by (path, offset); every range is in exactly one window and
    a window spans from its first member's start to its furthest member's end. Ranges
    may overlap (each is still delivered whole). Raises ``ValueError`` for a negative
    offset or length, or a ``max_window`` below 1.
    """
    if max_window < 1 or max_gap < 0:
        raise ValueError("coalesce: max_window must be >= 1 and max_gap >= 0")
    order = sorted(range(len(ranges)), key=lambda i: (ranges[i][0], ranges[i][1], ranges[i][2]))
    windows: list[Window] = []
    path, start, end = "", 0, 0
    members: list[int] = []

    def close() -> None:
        if members:
            windows.append(Window(path, start, end - start, tuple(members)))

    for i in order:
        p, off, length = ranges[i]
        if off < 0 or length < 0:
            raise ValueError(f"coalesce: range {ranges[i]!r} has a negative offset or length")
        joins = (
            members
            and p == path
            and length < max_window
            and off - end <= max_gap
            and max(end, off + length) - start <= max_window
            # a window of its own stays one: large members are split, not merged
            and end - start < max_window
        )
        if joins:
            members.append(i)
            end = max(end, off + length)
            continue
        close()
        path, start, end, members = p, off, off + length, [i]
    close()
    return windows
