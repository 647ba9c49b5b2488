"""ckptstore: fast, verified, fault-tolerant PyTorch checkpoints on any storage.

import torch.distributed.checkpoint as dcp, ckptstore
dcp.save(state_dict, storage_writer=ckptstore.writer("/mnt/ckpts/run1/step_000100"))
dcp.load(state_dict, storage_reader=ckptstore.reader("/mnt/ckpts/run1/step_000100"))
"""

from __future__ import annotations

__version__ = "0.1.0"

from ckptstore.api import load, reader, save, unwrap_checkpoint_exception, writer
from ckptstore.config import RetryConfig, TransferConfig
from ckptstore.errors import (
    CheckpointExistsError,
    CkptStoreError,
    CommitConflictError,
    ConfigError,
    CorruptCheckpointError,
    DurabilityError,
    IncompleteCheckpointError,
    MissingDependencyError,
    StorageFullError,
    StoreAccessError,
    StoreNotFoundError,
    TransferError,
    TransientStoreError,
)
from ckptstore.manager import CheckpointManager, SaveRecord
from ckptstore.retention import KeepAll, KeepEvery, KeepLast, RetentionPolicy
from ckptstore.state import RNGState

__all__ = [
    "__version__",
    "writer",
    "reader",
    "save",
    "load",
    "unwrap_checkpoint_exception",
    "CheckpointManager",
    "SaveRecord",
    "RetentionPolicy",
    "KeepLast",
    "KeepEvery",
    "KeepAll",
    "RNGState",
    "TransferConfig",
    "RetryConfig",
    "CkptStoreError",
    "ConfigError",
    "MissingDependencyError",
    "IncompleteCheckpointError",
    "CorruptCheckpointError",
    "CheckpointExistsError",
    "CommitConflictError",
    "StoreNotFoundError",
    "StoreAccessError",
    "TransientStoreError",
    "TransferError",
    "DurabilityError",
    "StorageFullError",
]
