"""One error root for ckptstore.

Every error is a ``CkptStoreError`` and also subclasses the builtin a caller would
naturally catch (``FileNotFoundError`` for a missing checkpoint, ``PermissionError``
for a refused credential, ...). Messages say what happened and what to do.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from ckptstore.redact import redact

#: The errors ``import ckptstore`` exports too (the data layer's stay here).
CHECKPOINT_ERRORS = [
    "CkptStoreError",
    "ConfigError",
    "MissingDependencyError",
    "IncompleteCheckpointError",
    "CorruptCheckpointError",
    "NewerFormatError",
    "NoLoadableCheckpointError",
    "CheckpointExistsError",
    "CommitConflictError",
    "StoreNotFoundError",
    "StoreAccessError",
    "TransientStoreError",
    "TransferError",
    "DurabilityError",
    "StorageFullError",
    "WriterProcessDiedError",
    "StagingMemoryError",
    "UnsafePathError",
    "UnsafePickleError",
    "StateDictMismatchError",
]

__all__ = [
    *CHECKPOINT_ERRORS,
    "EmptyDatasetError",
    "DatasetChangedError",
    "ShardFormatError",
    "CacheError",
    "CacheTooSmallError",
    "missing_dependency",
    "check_version",
    "require_version",
    "TORCH_RANGE",
    "TorchVersionError",
    "torch_name",
    "CHECKPOINT_ERRORS",
]


class CkptStoreError(Exception):
    """Root of every error raised by ckptstore.

    Its message never shows a credential: ``str()`` and ``repr()`` pass through
    ``ckptstore.redact.redact`` (URL user-info, credential-named options, signatures).
    """

    def __str__(self) -> str:
        return redact(super().__str__())

    def __repr__(self) -> str:
        return redact(super().__repr__())


class ConfigError(CkptStoreError, ValueError):
    """An option, URL or argument is invalid."""


class MissingDependencyError(CkptStoreError, ImportError):
    """An optional dependency is not installed."""


class IncompleteCheckpointError(CkptStoreError, FileNotFoundError):
    """The checkpoint has no valid commit marker, or a file it needs is missing."""


class CorruptCheckpointError(CkptStoreError, ValueError):
    """Bytes on storage do not match the manifest (size or checksum)."""


class NewerFormatError(CkptStoreError, ValueError):
    """A checkpoint was written by a newer torch or ckptstore, in a form this one cannot
    read. Not damage: a restore passes over it (naming it), but retention, ``gc`` and the
    local tier never count it as damaged, replace or delete it. The message names both
    versions and the way out (upgrade, or rewrite it under the newer release)."""


class NoLoadableCheckpointError(CkptStoreError, RuntimeError):
    """``CheckpointManager.restore`` found committed steps under the root and could load
    none of them. Starting over silently would lose the job's progress, so it raises with
    each step and why it was refused (``refused``: ``(step, reason)`` pairs, newest first);
    a caller that wants a fresh start in that case passes ``on_unloadable="fresh"``."""

    def __init__(self, message: str, refused: list[tuple[int, str]] | None = None) -> None:
        super().__init__(message)
        self.refused = list(refused or [])

    @classmethod
    def of(cls, root: str, refused: list[tuple[int, str]]) -> NoLoadableCheckpointError:
        """The error for ``root`` whose committed steps ``refused`` (each with why, newest
        first) all failed to load: what every resume path (the manager, the plugins) raises."""
        steps = _steps_text(refused)
        return cls(
            f"{root} holds {len(refused)} committed step(s) and none could be restored: "
            f"{steps}. Nothing was loaded. Fix what each step names (a newer torch or "
            "ckptstore: upgrade this one), restore a step by number, or pass "
            'on_unloadable="fresh" to start over deliberately',
            refused,
        )

    def warning(self) -> str:
        """What a resume that was asked to start over anyway (``on_unloadable="fresh"``)
        warns instead of raising."""
        steps = _steps_text(self.refused)
        return (
            f"no committed step could be restored ({steps}); starting from scratch, as "
            'on_unloadable="fresh" asks'
        )

    def __reduce__(self) -> tuple[object, ...]:  # keeps refused across processes
        return type(self), (self.args[0], self.refused)


def _steps_text(refused: list[tuple[int, str]], most: int = 10) -> str:
    """``refused`` for a message: the first ``most`` steps with why, then how many more."""
    text = "; ".join(f"step {s}: {why.rstrip('.')}" for s, why in refused[:most])
    more = len(refused) - most
    return text + (f"; and {more} more (the error's .refused lists them)" if more > 0 else "")


class UnsafePickleError(CkptStoreError, pickle.UnpicklingError):
    """An object item's pickle needs more than ``weights_only`` loading allows; it was not
    unpickled. For a checkpoint you trust: allow its classes with
    ``torch.serialization.add_safe_globals``, or opt in with ``allow_pickle=True``."""


class CheckpointExistsError(CkptStoreError, FileExistsError):
    """A committed checkpoint already exists where a new one was to be written."""


class CommitConflictError(CkptStoreError, FileExistsError):
    """Another writer committed the same checkpoint first (create-only marker lost the race)."""


class StoreNotFoundError(CkptStoreError, FileNotFoundError):
    """A path, bucket or container does not exist."""


class StoreAccessError(CkptStoreError, PermissionError):
    """The store refused the request (credentials, permissions, bad request): not retried."""


class TransientStoreError(CkptStoreError, ConnectionError):
    """A failure worth retrying: throttling, 5xx, reset connection, timeout."""


class TransferError(CkptStoreError, OSError):
    """A transfer failed for good: retries exhausted, deadline passed, or a part failed."""


class DurabilityError(CkptStoreError, OSError):
    """Data could not be made durable (fsync failed). The checkpoint is failed, never retried."""


class StorageFullError(CkptStoreError, OSError):
    """The destination is out of space (ENOSPC)."""


class WriterProcessDiedError(CkptStoreError, ChildProcessError):
    """A background writer process (``background="process"``) died during a save.

    That save is lost (never committed); the previous committed checkpoint is intact.
    """


class StagingMemoryError(CkptStoreError, MemoryError):
    """A save could not allocate the host memory to stage the state into (its arena).

    Raised by ``CheckpointManager.save`` on every rank at once; nothing was staged or
    written, and the previous committed checkpoint is intact.
    """


class UnsafePathError(CorruptCheckpointError):
    """A name from a manifest, marker, ``.metadata``, listing or caller would leave its root
    (absolute, ``..``, empty or odd segments, NUL, backslash) or pass through a symlink.

    Nothing was read, written or deleted. A checkpoint that names such a path is treated
    as damaged (``CorruptCheckpointError``; also a ``ValueError``): restore falls back past
    it and ``verify`` fails it. Inspect the files under the root that named it.
    """


class EmptyDatasetError(CkptStoreError, ValueError):
    """A dataset URL lists no shards of the requested format, or its shards hold no samples."""


class DatasetChangedError(CkptStoreError, RuntimeError):
    """A shard was deleted or changed on the store after the dataset was listed.

    The data order of a run is fixed by its listing; re-create the dataset (it re-lists) and
    resume from the last checkpoint, allowing the change explicitly.
    """


class ShardFormatError(CkptStoreError, ValueError):
    """A shard is not a readable file of the dataset's format (no magic, bad footer)."""


class CacheError(CkptStoreError, OSError):
    """The node-local data cache cannot be used: unwritable, full, or no space freed in time."""


class CacheTooSmallError(CkptStoreError, ValueError):
    """The cache byte budget cannot hold even the largest shard."""


def missing_dependency(module: str, extra: str) -> MissingDependencyError:
    """The error for an optional import that failed, naming the command that fixes it."""
    return MissingDependencyError(
        f"{module!r} is not installed; run: pip install 'ckptstore[{extra}]'"
    )


def check_version(name: str, installed: str, spec: str, extra: str) -> None:
    """``ConfigError`` naming the range and the fix if version ``installed`` of ``name`` is
    outside ``spec`` (a PEP 440 specifier). For a plugin's framework: it imports
    ``packaging``, which every framework a plugin serves requires."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        ok = Version(installed) in SpecifierSet(spec, prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise ConfigError(
            f"ckptstore's {name} plugin supports {name}{spec}, but {name} {installed} is "
            f"installed; run: pip install '{name}{spec}' (or pip install 'ckptstore[{extra}]')"
        )


def require_version(name: str, spec: str, extra: str) -> str:
    """The installed version of distribution ``name``, checked by :func:`check_version`
    (a plugin calls it right after importing its framework, so a version outside the range
    fails at import, not later deep inside the framework)."""
    from importlib import metadata

    installed = metadata.version(name)
    check_version(name, installed, spec, extra)
    return installed


#: The torch releases ckptstore is tested with: pyproject's ``torch`` requirement
#: (tests/test_torch_range.py keeps the two equal and the range tested).
TORCH_RANGE = ">=2.13,<2.16"


class TorchVersionError(CkptStoreError, ImportError):
    """The installed torch lacks a name ckptstore uses (most are DCP's private helpers,
    listed with their guards in docs/ARCHITECTURE.md): a torch release moved or removed it.
    The message names the name, the installed torch and the tested range."""


@contextmanager
def torch_name(what: str) -> Iterator[None]:
    """Around an import from torch (or a lookup of a torch attribute): an ``ImportError``
    or ``AttributeError`` inside becomes :class:`TorchVersionError` naming ``what``."""
    try:
        yield
    except (ImportError, AttributeError) as exc:
        torch = sys.modules.get("torch")  # errors imports no torch (engine/ uses it)
        version = getattr(torch, "__version__", "(unknown)")
        raise TorchVersionError(
            f"ckptstore needs {what}, which torch {version} does not have ({exc}); "
            f"ckptstore is tested with torch{TORCH_RANGE}: run pip install 'torch{TORCH_RANGE}' "
            "(and report the torch release that moved it to ckptstore)"
        ) from exc


class StateDictMismatchError(ConfigError):
    """The state dict given to load into does not match the checkpoint: it asks for a key
    the checkpoint does not hold, or a tensor's shape differs from the saved one.

    Nothing was loaded into it. A ``ConfigError`` (and ``ValueError``), not damage:
    ``CheckpointManager.restore`` raises it rather than falling back to an older step.
    """


class InUseError(CkptStoreError, RuntimeError):
    """What would be changed is held by a live writer (a save in flight keeps a fresh
    lease on its step; see ``ckptstore.engine.lease``): nothing was deleted or written."""


class RootInUseError(InUseError):
    """Another live job (another run id) owns this checkpoint root; its saves would mix
    with this one's. The message names the owner (run, host, pid, heartbeat age)."""


class OwnerFileError(RootInUseError):
    """The root's owner file (``ckptstore.owner.json``) is there but is not a valid lease
    (a symlink, directory, FIFO, an oversized or non-JSON file) and stayed so while the
    claim watched it. It may hide a live job, or have been planted to let a second job in,
    so it is never taken over: nothing was saved. The message names the file, what it is,
    and the command that clears it (``ckptstore-tool gc ROOT --repair``)."""


class TierStampError(InUseError):
    """A job's directory of the local tier (``local_tier_dir/job-<hex>/``) cannot be
    shown to be this job's: its stamp (``ckptstore.job.json``) is another job's, a
    symlink, FIFO or directory, oversized or not a stamp, or missing from a directory that
    holds files. Its copies may be another job's, so nothing in it was used, written or
    deleted. The message names the directory and how to clear it
    (``ckptstore.tier.jobs``)."""


__all__ += ["InUseError", "RootInUseError", "OwnerFileError", "TierStampError"]


def size_text(n: int) -> str:
    """``n`` bytes in the unit a reader takes in at a glance (``38.4 MB``): the one size
    format of messages and log lines, here (the lowest layer) so that the manager's and
    the tier's messages share it."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
