"""Options as frozen dataclasses. They travel unchanged through every layer."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["RetryConfig", "TransferConfig", "MiB"]

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
