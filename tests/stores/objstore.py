"""What the GCS and Azure server tests share: marks, fast retries, small parts, new buckets."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from ckptstore.config import RetryConfig, TransferConfig

__all__ = ["CFG", "FAST", "PART", "SERVER_MARKS", "new_bucket"]

SERVER_MARKS = [
    pytest.mark.server,
    # single-process DCP saves/loads (no process group) are intended here
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning"),
]

PART = 64 * 1024
FAST = RetryConfig(attempts=4, base_backoff_s=0.01, max_backoff_s=0.05, request_timeout_s=10)
CFG = TransferConfig(part_size=PART, concurrency=4, memory_budget=16 * PART, retry=FAST)


def new_bucket(server: Any) -> str:
    """A fresh bucket (Azure: container) on ``server``; its name."""
    name = f"t-{uuid.uuid4().hex[:12]}"
    server.create_bucket(name)
    return name
