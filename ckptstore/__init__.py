"""ckptstore: fast, verified, fault-tolerant PyTorch checkpoints on any storage.

import torch.distributed.checkpoint as dcp, ckptstore
dcp.save(state_dict, storage_writer=ckptstore.writer("/mnt/ckpts/run1/step_000100"))
dcp.load(state_dict, storage_reader=ckptstore.reader("/mnt/ckpts/run1/step_000100"))

The names that need torch (``writer``, ``save``, ``CheckpointManager``, ...) are imported on
first use, so ``import ckptstore`` (and ``ckptstore-tool ls``, ``gc``, ``cp``, ``verify``) does
not pay for importing torch.

Working with a checkpoint root without DCP (torch-free, also imported on first use)::

    root = ckptstore.open_store("s3://bucket/run1")     # a Store; .child("step_000000100")
    list(ckptstore.committed_steps(root))                 # committed step numbers, ascending
    ckptstore.checkpoint_status(root.child(name))         # COMMITTED / INCOMPLETE / CORRUPT
    report = ckptstore.verify_checkpoint(root.child(name))          # re-read every byte
    with ckptstore.TransferEngine() as engine:
        ckptstore.copy_checkpoint(src, dst, engine)                 # src, dst: Stores
    plan = ckptstore.plan_prune(root, ckptstore.KeepLast(3))        # decide, change nothing
    ckptstore.apply_prune(root, plan)                               # then delete
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ckptstore import errors as _errors
from ckptstore._version import __version__
from ckptstore.config import RetryConfig, TransferConfig, WriterOptions
from ckptstore.errors import (  # errors.CHECKPOINT_ERRORS, which __all__ takes from there
    CheckpointExistsError,
    CkptStoreError,
    CommitConflictError,
    ConfigError,
    CorruptCheckpointError,
    DurabilityError,
    IncompleteCheckpointError,
    MissingDependencyError,
    NewerFormatError,
    NoLoadableCheckpointError,
    StagingMemoryError,
    StateDictMismatchError,
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
    from ckptstore.engine.catalog import committed_steps, list_steps, newer_steps
    from ckptstore.engine.committed import CheckpointStatus, checkpoint_status, open_committed
    from ckptstore.engine.copy import copy_checkpoint
    from ckptstore.engine.names import parse_step, step_name
    from ckptstore.engine.store import Store
    from ckptstore.engine.transfer import TransferEngine
    from ckptstore.engine.verify import verify_checkpoint
    from ckptstore.manager import CheckpointManager, SaveRecord
    from ckptstore.manager.options import ManagerOptions
    from ckptstore.manager.prune import apply_prune, plan_prune
    from ckptstore.manager.retention import select_deletions
    from ckptstore.manager.state import AppState, RNGState
    from ckptstore.stores import open_store


#: name -> module, for the names imported on first use. The first group imports torch; the
#: second (stores, verify, copy, prune) does not, but is not paid for by ``import ckptstore``.
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
    # torch-free
    "Store": "ckptstore.engine.store",
    "open_store": "ckptstore.stores",
    "TransferEngine": "ckptstore.engine.transfer",
    "open_committed": "ckptstore.engine.committed",
    "checkpoint_status": "ckptstore.engine.committed",
    "CheckpointStatus": "ckptstore.engine.committed",
    "committed_steps": "ckptstore.engine.catalog",
    "list_steps": "ckptstore.engine.catalog",
    "newer_steps": "ckptstore.engine.catalog",
    "verify_checkpoint": "ckptstore.engine.verify",
    "copy_checkpoint": "ckptstore.engine.copy",
    "plan_prune": "ckptstore.manager.prune",
    "apply_prune": "ckptstore.manager.prune",
    # what the framework plugins (plugins/) use too
    "ManagerOptions": "ckptstore.manager.options",
    "step_name": "ckptstore.engine.names",
    "parse_step": "ckptstore.engine.names",
    "select_deletions": "ckptstore.manager.retention",
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
    "WriterOptions",
    "Store",
    "open_store",
    "TransferEngine",
    "open_committed",
    "checkpoint_status",
    "CheckpointStatus",
    "committed_steps",
    "list_steps",
    "newer_steps",
    "verify_checkpoint",
    "copy_checkpoint",
    "plan_prune",
    "apply_prune",
    "ManagerOptions",
    "step_name",
    "parse_step",
    "select_deletions",
    *_errors.CHECKPOINT_ERRORS,
]
