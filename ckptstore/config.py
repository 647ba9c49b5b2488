"""Options as frozen dataclasses. They travel unchanged through every layer.

``WriterOptions`` is the writer's settings as one value (its codec, key layout and
transfer settings): ``ckptstore.writer``, ``CkptWriter``, ``ManagerOptions`` (and through
it ``save_step`` in a writer process: it pickles) and the torchtitan plugin take it whole.
The keywords these settings had before it (``codec=``, ``key_layout=``, ``config=``) still
work until ckptstore 0.2, with a ``DeprecationWarning`` naming the new spelling
(``fold_writer_keywords``; ``warn_renamed`` is the one place such a warning is made).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ckptstore._stack import user_stacklevel

__all__ = [
    "RetryConfig",
    "TransferConfig",
    "WriterOptions",
    "WRITER_KEYWORDS",
    "MiB",
    "fold_writer_keywords",
    "warn_renamed",
]

MiB = 1024 * 1024


@dataclass(frozen=True)
class RetryConfig:
    """How transient store errors are retried.

    ``attempts`` counts every try (1 = no retry). Backoff before try ``n`` (n >= 2) is
    ``min(max_backoff_s, base_backoff_s * 2**(n-2))`` scaled by a random factor in
    ``[1 - jitter, 1]``. ``deadline_s`` bounds one whole transfer (a file), retries included;
    ``request_timeout_s`` bounds one request where the store supports it.
    """

    attempts: int = 6
    base_backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    jitter: float = 0.5
    request_timeout_s: float = 60.0
    deadline_s: float = 900.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryConfig.attempts must be >= 1")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("RetryConfig.jitter must be within [0, 1]")
        if self.deadline_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("RetryConfig timeouts must be > 0")


@dataclass(frozen=True)
class TransferConfig:
    """How the transfer engine splits and parallelises one file.

    ``part_size`` is the target part size for multipart writes and ranged reads (grown
    automatically so a file never needs more parts than the store allows).
    ``concurrency`` is the number of parts in flight per process (to a volume, no more
    than the rank's cores less one: ``ckptstore.engine.cores.volume_writers``).
    ``memory_budget`` caps the bytes buffered for parts not yet written (a writer blocks
    when it is reached).
    A read-once restore (``CkptReader(share_group=)``) moves shared ranges in batches of
    ``memory_budget`` bytes, two at a time (one read, one sent): at most 2 x
    ``memory_budget`` per rank.

    A load on an object store plans its reads from the whole load plan
    (``ckptstore.engine.readplan``): the bytes a save keeps in flight (``concurrency`` x
    ``part_size``) are kept in flight as ranged GETs of at most 8 MiB (defaults: 32 GETs
    of 8 MiB; between ``concurrency`` and 64 GETs), each of ``ceil(load bytes / GETs)``
    bytes between 4 MiB and 8 MiB (or ``part_size`` if smaller), and small adjacent items
    merged into one GET. On a latency-bound link each connection carries at most its own
    rate, so raise ``concurrency`` to fill the link; the S3 client's connection pool holds
    64 connections (``storage_options={"config_kwargs": {"max_pool_connections": n}}`` for
    more), and requests beyond it wait for a free connection.
    """

    part_size: int = 32 * MiB
    concurrency: int = 8
    memory_budget: int = 512 * MiB
    retry: RetryConfig = RetryConfig()

    def __post_init__(self) -> None:
        if self.part_size < 1 or self.concurrency < 1:
            raise ValueError("TransferConfig.part_size and concurrency must be >= 1")
        if self.memory_budget < self.part_size:
            raise ValueError("TransferConfig.memory_budget must hold at least one part")


@dataclass(frozen=True)
class WriterOptions:
    """How a checkpoint is written: given once, passed on whole to every writer.

    ``codec``: "none", "zstd" (per item, in DCP's own ``ZStandard`` format) or another
    codec of ``engine.codec_registry``. ``key_layout``: "flat", or "spread" over 256 key
    prefixes for stores that limit the request rate per prefix. ``transfer``: the
    transfer settings (parts, concurrency, memory budget, retries). The codec and key
    layout are checked, against the registry and ``engine.names.KEY_LAYOUTS``, by what
    takes the value (``CkptWriter``, ``ManagerOptions``): ``ConfigError`` listing the
    choices.
    """

    codec: str = "none"
    key_layout: str = "flat"
    transfer: TransferConfig = TransferConfig()

    def __post_init__(self) -> None:
        if not isinstance(self.transfer, TransferConfig):
            raise TypeError(
                f"WriterOptions.transfer must be a TransferConfig, not {self.transfer!r}"
            )


#: Writer settings that were keywords of their own before ``WriterOptions``: the old
#: keyword -> its field there (``config`` is ``transfer`` now, the glossary's word).
WRITER_KEYWORDS: Mapping[str, str] = {
    "codec": "codec",
    "key_layout": "key_layout",
    "config": "transfer",
}


def warn_renamed(old: str, new: str) -> None:
    """Warn (``DeprecationWarning``, at the user's line) that the keyword ``old=`` is now
    spelled ``new``; the old one works until ckptstore 0.2."""
    warnings.warn(
        f"the keyword {old}= is deprecated and goes in ckptstore 0.2: pass {new} instead",
        DeprecationWarning,
        stacklevel=user_stacklevel(),
    )


def fold_writer_keywords(
    options: WriterOptions | None, keywords: dict[str, Any], spelling: str
) -> WriterOptions:
    """``options`` (default ``WriterOptions()``) with the writer settings ``keywords`` gives
    the old way (``WRITER_KEYWORDS``; None: not given): each is popped from ``keywords``
    and warned about (``warn_renamed``), its new spelling ``spelling.format(field)``."""
    options = options if options is not None else WriterOptions()
    changes: dict[str, Any] = {}
    for old, new in WRITER_KEYWORDS.items():
        if old in keywords:
            value = keywords.pop(old)
            warn_renamed(old, spelling.format(new))
            if value is not None:
                changes[new] = value
    return dataclasses.replace(options, **changes) if changes else options
