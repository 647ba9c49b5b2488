"""Planning a file's parts: their size, what is copied and what is sent by reference.

Pure sizes and rules, no I/O; ``FileWriter`` (``ckptstore.engine.filewriter``) acts on
them. A file's part size is ``plan_part_size``'s (the configured size, grown so the store's
part count is not exceeded). Writes of at least ``ZERO_COPY_MIN`` bytes go out from the
caller's memory on a store that can take them so (``zero_copy_parts``, ``gather_parts``);
smaller ones are copied into buffers of ``SMALL_PART`` (volumes), ``GATHER_BUFFER`` (S3)
or a whole part (any other store). ``alignment_pad`` is the zero padding that lets a
volume write a tensor straight from its memory with direct I/O.
"""

from __future__ import annotations

import math

__all__ = [
    "COPY_MAX",
    "GATHER_BUFFER",
    "SMALL_PART",
    "SMALL_QUEUED",
    "ZERO_COPY_MIN",
    "alignment_pad",
    "plan_part_size",
]


def plan_part_size(total: int | None, part_size: int, min_part: int, max_parts: int) -> int:
    """Part size for a file of ``total`` bytes: ``part_size`` grown so parts <= ``max_parts``."""
    size = max(part_size, min_part)
    if total is not None and total > 0:
        size = max(size, math.ceil(total / max_parts))
    return size


#: Smallest write a store with ``zero_copy_parts`` takes by reference (``FileWriter._append``).
ZERO_COPY_MIN = 1024 * 1024

#: Part buffer size on a ``zero_copy_parts`` store: only writes below ``ZERO_COPY_MIN`` (item
#: headers, small items) are copied there, so a full ``part_size`` buffer would be mostly
#: untouched memory that ``bytearray`` still zero-fills (page faults) on every acquire.
#: One ``ZERO_COPY_MIN``, not more, and no more of one file's waiting for a writer than
#: the volume's writers (``TransferEngine.volume_writers``), or ``SMALL_QUEUED`` if that is
#: more (one written while the next fills): they are memory the save holds while the
#: writers catch up (a save of the demo state on 1 writer: 9-10 MiB of them queued without
#: the cap, 20 MiB with 4 MiB buffers; 2 MiB with it, the save no slower).
SMALL_PART = ZERO_COPY_MIN
SMALL_QUEUED = 2

#: Most bytes a part buffer may hold and still be sent as a copy of those bytes before a
#: large write on a ``zero_copy_parts`` store (``_submit_copy``: usually an item's header);
#: a fuller buffer is sent itself, not copied once more.
COPY_MAX = 64 * 1024

#: Size of the pooled buffers small writes are copied into on a ``gather_parts`` store
#: (each counts whole against the budget, so a part is at least ``part_size`` minus this).
GATHER_BUFFER = ZERO_COPY_MIN


def alignment_pad(size: int, address: int, lead: int, nbytes: int, alignment: int) -> int:
    """Zero bytes to write at offset ``size`` of a file so that ``nbytes`` of memory at
    ``address``, written ``lead`` bytes later, land at a file offset that agrees with
    ``address`` modulo ``alignment`` (0: nothing to agree on, or a write too small to be
    sent from its own memory, ``ZERO_COPY_MIN``)."""
    if not alignment or nbytes < ZERO_COPY_MIN:
        return 0
    return (address - size - lead) % alignment
