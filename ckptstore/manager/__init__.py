"""The checkpoint manager and what it runs on: the background save (``saving``), retention, restore.

``CheckpointManager``, ``SaveRecord`` and ``SaveStatus`` (they import torch) load on first
use, so ``ckptstore.manager.retention`` and ``ckptstore.manager.prune`` (which
``ckptstore-tool gc`` uses) do not pay for torch, and ``python -m
ckptstore.manager.saving.writer_main`` starts light.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptstore.manager.manager import CheckpointManager, SaveRecord, SaveStatus

__all__ = ["CheckpointManager", "SaveRecord", "SaveStatus"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module 'ckptstore.manager' has no attribute {name!r}")
    value = getattr(importlib.import_module("ckptstore.manager.manager"), name)
    globals()[name] = value
    return value
