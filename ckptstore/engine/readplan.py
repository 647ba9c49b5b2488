"""Planning the ranged reads of a whole load: pure functions, no I/O.

A load asks for many ranges (one per stored item) at once. Read one GET per item and a
state of many small tensors pays one round trip per tensor; read each large item as
fixed-size parts and a load of a few large tensors may use fewer connections than the
engine has. So the reader plans its reads from the whole load plan, in three steps::

    streams = read_streams(config.part_size, config.concurrency)   # GETs in flight
    size = range_size(total_bytes, min(config.part_size, READ_RANGE), streams)     # a GET
    windows = coalesce(ranges, max_window=size)

Each range keeps its own integrity check: the reader verifies every member of a window
against its manifest CRC32C, exactly as it verifies a range read alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ckptstore.config import MiB

__all__ = [
    "FIRST_RANGE",
    "MAX_STREAMS",
    "MIN_RANGE",
    "READ_RANGE",
    "Window",
    "coalesce",
    "range_size",
    "read_streams",
]

#: The smallest ranged GET a load plans (unless the part size itself is smaller): 4 MiB
#: is ~1.7 bandwidth-delay products of a 200 Mbit/s connection with a 40 ms round trip.
MIN_RANGE = 4 * MiB

#: The smallest ranged GET of a read that must land early (a load's first window, a
#: shared batch): on a link whose every connection is capped, a window read as GETs of
#: ``MIN_RANGE`` takes ``MIN_RANGE / cap`` however many connections sit idle; 1 MiB GETs
#: spread it over more of them (each still ~0.4 bandwidth-delay products at 200 Mbit/s,
#: 40 ms).
FIRST_RANGE = 1 * MiB

#: The largest ranged GET a load plans (unless the part size is smaller): 8 MiB is ~3.4
#: bandwidth-delay products of a 200 Mbit/s connection with a 40 ms round trip (~1.7 at
#: 1 Gbit/s), so the request's round trip costs a few per cent of it, and the size
#: s3torchconnector's CRT client reads in. Through this project's shaped link (2 ranks x
#: 256 MiB) 32 GETs of 8 MiB in flight per rank took 0.80x the time of 8 of 32 MiB, the
#: same bytes in flight (issue 17; the run is in `git log -p benchmarks/README.md`).
READ_RANGE = 8 * MiB

#: The most ranged GETs a process keeps in flight: the S3 client's connection pool
#: (``ckptstore.stores.s3.client.make_s3fs``'s ``max_pool_connections``).
MAX_STREAMS = 64


def read_streams(
    part_size: int, concurrency: int, largest: int = READ_RANGE, cap: int = MAX_STREAMS
) -> int:
    """The ranged GETs a load keeps in flight:
    ``concurrency * part_size / min(largest, part_size)``, clamped to
    ``[concurrency, max(cap, concurrency)]``.

    On a link whose every connection is capped (a cloud store's per-connection rate, a
    latency-bound TCP window) the load's rate is the number of connections times that cap,
    so a load uses as many as the engine's byte budget for transfers in flight allows: the
    bytes a save keeps in flight (``concurrency`` parts of ``part_size``), cut into ranges
    of ``READ_RANGE``; never fewer than ``concurrency``, never more than ``MAX_STREAMS``
    (the S3 client's connection pool). With the defaults (8 x 32 MiB): 32 GETs of 8 MiB. The
    memory stays bounded as before: a GET lands in its target tensor (no buffer) or in a
    window the reader counts against ``memory_budget``.
    """
    if part_size < 1 or concurrency < 1 or largest < 1 or cap < 1:
        raise ValueError("read_streams: part_size, concurrency, largest and cap must be >= 1")
    streams = concurrency * part_size // min(largest, part_size)
    return max(concurrency, min(streams, cap))


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


def range_size(total: int, max_range: int, streams: int, min_range: int = MIN_RANGE) -> int:
    """The GET size for a load of ``total`` bytes: ``ceil(total / streams)`` clamped
    to ``[min(min_range, max_range), max_range]``.

    Chosen so that the load's bytes cut into about ``streams`` ranges or more (every
    connection busy until the end), never more than ``max_range`` and never below
    ``min_range`` (a GET much smaller than a link's bandwidth-delay product spends its time
    waiting for the first byte).
    """
    if max_range < 1 or streams < 1 or min_range < 1:
        raise ValueError("range_size: max_range, streams and min_range must be >= 1")
    share = -(-max(total, 0) // streams)
    return max(min(min_range, max_range), min(share, max_range))


def coalesce(
    ranges: Sequence[tuple[str, int, int]], max_window: int, max_gap: int = 0
) -> list[Window]:
    """Group ``(path, offset, length)`` ranges into windows.

    Ranges of one file, in offset order, that are smaller than ``max_window``
    and adjacent (at most ``max_gap`` bytes apart) merge into one window of at most
    ``max_window`` bytes: one GET instead of one per range. A range of ``max_window`` bytes
    or more is a window of its own; the engine splits it into ``range_size`` GETs in
    parallel.

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
