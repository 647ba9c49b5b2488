"""Retries with exponential backoff and jitter, bounded by attempts and a deadline."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from ckptstore.config import RetryConfig
from ckptstore.errors import TransferError, TransientStoreError

__all__ = ["backoff_delay", "call_with_retry", "RetryStats", "Deadline"]

log = logging.getLogger(__name__)
T = TypeVar("T")


def backoff_delay(config: RetryConfig, attempt: int, rand: float) -> float:
    """Seconds to sleep before try ``attempt`` (2-based; try 1 has no delay).

    ``rand`` in [0, 1) picks the jitter: the delay is scaled into [1 - jitter, 1].
    """
    if attempt < 2:
        return 0.0
    base = min(config.max_backoff_s, config.base_backoff_s * 2 ** (attempt - 2))
    return base * (1.0 - config.jitter * rand)


class RetryStats:
    """Counts of retried and throttled calls, shared by the threads of one engine."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.retries = 0
        self.failures = 0

    def count(self, retries: int = 0, failures: int = 0) -> None:
        with self._lock:
            self.retries += retries
            self.failures += failures


class Deadline:
    """An absolute point in time after which no new try is started."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()


def call_with_retry(
    fn: Callable[[], T],
    config: RetryConfig,
    what: str,
    *,
    deadline: Deadline | None = None,
    stats: RetryStats | None = None,
) -> T:
    """Call ``fn`` until it succeeds, retrying only ``TransientStoreError``.

    Any other exception propagates at once (fail fast on 403/404/ENOSPC ...). When the
    attempts or the deadline run out, raises ``TransferError`` naming ``what``.
    """
    deadline = deadline or Deadline(config.deadline_s)
    attempt = 1
    while True:
        try:
            return fn()
        except TransientStoreError as exc:
            if attempt >= config.attempts:
                if stats:
                    stats.count(failures=1)
                raise TransferError(
                    f"{what} failed after {attempt} attempts: {exc}. The store kept failing "
                    "with transient errors; check its health and the network, then retry."
                ) from exc
            delay = backoff_delay(config, attempt + 1, random.random())
            if deadline.remaining() < delay:
                if stats:
                    stats.count(failures=1)
                raise TransferError(
                    f"{what} did not finish within its {deadline.seconds:.0f} s deadline "
                    f"(last error: {exc}). Raise RetryConfig.deadline_s or check the link."
                ) from exc
            log.info("retrying %s in %.2fs after: %s", what, delay, exc)
            if stats:
                stats.count(retries=1)
            time.sleep(delay)
            attempt += 1
