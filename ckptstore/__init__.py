"""ckptstore: fast, verified, fault-tolerant PyTorch checkpoints on any storage.

import torch.distributed.checkpoint as dcp, ckptstore
dcp.save(state_dict, storage_writer=ckptstore.writer("/mnt/ckpts/run1/step_000100"))
dcp.load(state_dict, storage_reader=ckptstore.reader("/mnt/ckpts/run1/step_000100"))

The names that need torch (``writer``, ``save``, ``CheckpointManager``, ...) are imported on
first use, so ``import ckptstore`` (and ``ckptstore-tool ls``, ``gc``, ``cp``, ``verify``) does
not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ckptstore import _moved
from ckptstore import errors as _errors
from ckptstore._version import __version__
from ckptstore.config import RetryConfig, TransferConfig
from ckptstore.errors import (  # errors.CHECKPOINT_ERRORS, which __all__ takes from there
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
    UnsafePathError,
    UnsafePickleError,
    WriterProcessDiedError,
)
from ckptstore.manager.retention import KeepAll, KeepEvery, KeepLast, RetentionPolicy

if TYPE_CHECKING:
    from ckptstore.api import load, reader, save, unwrap_checkpoint_exception, writer
    from ckptstore.manager import CheckpointManager, SaveRecord
    from ckptstore.manager.state import AppState, RNGState

_moved.install()

#: name -> module, for the names imported on first use (they import torch).
_LAZY = {
    "writer": "ckptstore.api",
    "reader": "ckptstore.api",
    "save": "ckptstore.api",
    "load": "ckptstore.api",
    "unwrap_checkpoint_exception": "ckptstore.api",
    "CheckpointManager": "ckptstore.manager",
    "SaveRecord": "ckptstore.manager",
    "RNGState": "ckptstore.manager.state",
    "AppState": "ckptstore.manager.state",
}


#: submodules reachable as attributes without an import of their own (they import torch).
_SUBMODULES = {"launch"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"ckptstore.{name}")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ckptstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY) | _SUBMODULES)


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
    "AppState",
    "TransferConfig",
    "RetryConfig",
    *_errors.CHECKPOINT_ERRORS,
]
