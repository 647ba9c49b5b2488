"""A framework's local checkpoint folder <-> one committed ckptstore step.

Hugging Face Trainer and Accelerate write a checkpoint as a local folder of files in
their own formats. ``FolderCheckpoints`` uploads such a folder, byte for byte, as one
ckptstore step (each file a uint8 DCP item, plus a JSON index of names, sizes and
CRC32Cs), through a ``CheckpointManager``: staged, then written and committed in the
background, verified on every read. It restores a committed step as a local folder for
the framework's own loader. Call order::

    fc = FolderCheckpoints(root, ...)
    fc.save(step, folder)                     # after the framework wrote ``folder``
    fc.wait() / fc.close()                    # flush / flush and release
    step, path = fc.restore_newest(dest)      # newest committed step that verifies, as a
                                              # local folder ``dest(step, index)``
    fc.ensure_local(step, folder)             # a local copy that matches step, byte for byte

A local folder that does not match its committed step (torn, edited, another step) is
moved aside to a quarantine directory, never deleted, before the committed copy is
written in its place (files fsynced, then the folder renamed in).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import uuid
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from ckptstore.config import TransferConfig
from ckptstore.engine.checksum import crc32c
from ckptstore.errors import ConfigError, CorruptCheckpointError, IncompleteCheckpointError
from ckptstore.manager import CheckpointManager
from ckptstore.manager.retention import RetentionPolicy
from ckptstore.stores.local import LocalStore

from ._codec import from_uint8, load_step, refuse_multiprocess, to_uint8

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "FolderCheckpoints",
    "ManagerOptions",
    "INDEX_KEY",
    "FILE_PREFIX",
    "QUARANTINE",
    "quarantine",
]

log = logging.getLogger(__name__)

INDEX_KEY = "folder/index"
FILE_PREFIX = "folder/files/"
INDEX_FORMAT = "ckptstore.folder"
#: Where local folders that do not match a committed step are moved.
QUARANTINE = ".ckptstore-uncommitted"


class ManagerOptions(TypedDict, total=False):
    """The ``CheckpointManager`` options a folder plugin passes through, as keywords.

    Each means what it means there, with its default: ``storage_options`` (None),
    ``staging_dir`` (None), ``keep`` (None: ``KeepLast(3)``), ``async_save`` (True),
    ``config`` (None: ``TransferConfig()``), ``codec`` ("none"), ``strict`` (False),
    ``key_layout`` ("flat"), ``background`` ("thread").
    """

    storage_options: dict[str, Any] | None
    staging_dir: str | None
    keep: RetentionPolicy | None
    async_save: bool
    config: TransferConfig | None
    codec: str
    strict: bool
    key_layout: str
    background: str


def _read(path: str, size: int) -> torch.Tensor:
    if size == 0:
        return torch.empty(0, dtype=torch.uint8)
    return torch.from_file(path, shared=False, size=size, dtype=torch.uint8)


def _crc(t: torch.Tensor) -> int:
    return crc32c(t.numpy().data) if t.numel() else 0


def _local_files(folder: str) -> dict[str, str]:
    """Relative '/'-joined name -> absolute path, for every file under ``folder``."""
    out = {}
    for dirpath, _dirs, files in os.walk(folder):
        for name in files:
            full = os.path.join(dirpath, name)
            out[os.path.relpath(full, folder).replace(os.sep, "/")] = full
    return out


def quarantine(folder: str, qdir: str) -> str:
    """Move ``folder`` into ``qdir`` (replacing an older quarantined copy); its new path."""
    os.makedirs(qdir, exist_ok=True)
    target = os.path.join(qdir, os.path.basename(folder.rstrip(os.sep)))
    if os.path.exists(target):
        shutil.rmtree(target)
    os.replace(folder, target)
    log.warning("moved %s aside to %s: it does not match a committed checkpoint", folder, target)
    return target


class FolderCheckpoints:
    """Local checkpoint folders as committed steps under ``root``; see the module docstring.

    ``options``: :class:`ManagerOptions`, for the ``CheckpointManager`` made on first use.
    """

    def __init__(self, root: str, **options: Unpack[ManagerOptions]) -> None:
        known = ManagerOptions.__optional_keys__
        unknown = sorted(set(options) - known)
        if unknown:  # as a signature would: now, not when the manager is first made
            raise TypeError(
                f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}; the "
                f"CheckpointManager options a plugin takes are {', '.join(sorted(known))}"
            )
        self.root = root
        self._options = options
        self._mgr: CheckpointManager | None = None

    @property
    def manager(self) -> CheckpointManager:
        """The ``CheckpointManager`` (made on first use, so a plugin costs nothing until then)."""
        if self._mgr is None:
            refuse_multiprocess(type(self).__name__)
            self._mgr = CheckpointManager(self.root, **self._options)
        return self._mgr

    # -- saving --------------------------------------------------------------------------
    def save(self, step: int, folder: str, extra: dict[str, Any] | None = None) -> bool:
        """Start uploading ``folder`` as ``step``; False if that step is already committed."""
        if not os.path.isdir(folder):
            raise ConfigError(f"{folder} is not a directory; nothing to upload for step {step}")
        flat: dict[str, torch.Tensor] = {}
        files: dict[str, dict[str, int]] = {}
        for rel, full in sorted(_local_files(folder).items()):
            size = os.path.getsize(full)
            t = _read(full, size)
            flat[FILE_PREFIX + rel] = t
            files[rel] = {"size": size, "crc32c": _crc(t)}
        index = {
            "format": INDEX_FORMAT,
            "version": 1,
            "name": os.path.basename(os.path.normpath(folder)),
            "path": os.path.abspath(folder),
            "files": files,
            "extra": extra or {},
        }
        flat[INDEX_KEY] = to_uint8(json.dumps(index).encode())
        saved = self.manager.save(step, flat)
        if not saved:
            warnings.warn(
                f"step {step} is already committed under {self.root}; {folder} was not "
                "uploaded again",
                RuntimeWarning,
                stacklevel=3,
            )
        return saved

    def wait(self) -> None:
        if self._mgr is not None:
            self._mgr.wait()

    def close(self) -> None:
        """Wait for the last upload and release the manager; raise if it failed."""
        mgr, self._mgr = self._mgr, None
        if mgr is not None:
            mgr.close()

    # -- restoring -----------------------------------------------------------------------
    def steps(self) -> list[int]:
        return self.manager.steps()

    def index(self, step: int) -> dict[str, Any]:
        """The committed file index of ``step`` (verified)."""
        flat = load_step(self.manager, step, [INDEX_KEY])
        index = json.loads(from_uint8(flat[INDEX_KEY]))
        if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT:
            raise ConfigError(f"step {step} under {self.root} is not a checkpoint folder upload")
        return index

    @staticmethod
    def matches(folder: str, index: dict[str, Any]) -> bool:
        """Whether ``folder`` holds exactly the committed files (names, sizes, CRC32C)."""
        if not os.path.isdir(folder):
            return False
        local = _local_files(folder)
        if set(local) != set(index["files"]):
            return False
        for rel, want in index["files"].items():
            size = os.path.getsize(local[rel])
            if size != want["size"] or _crc(_read(local[rel], size)) != want["crc32c"]:
                return False
        return True

    def ensure_local(
        self,
        step: int,
        folder: str,
        qdir: str | None = None,
        index: dict[str, Any] | None = None,
    ) -> str:
        """Make ``folder`` hold committed ``step`` byte for byte.

        A local folder that differs is moved to ``qdir`` (default: ``QUARANTINE`` beside it).
        """
        index = index if index is not None else self.index(step)
        if self.matches(folder, index):
            return folder
        flat = load_step(self.manager, step, [FILE_PREFIX + rel for rel in index["files"]])
        parent = os.path.dirname(os.path.abspath(folder))
        qdir = qdir or os.path.join(parent, QUARANTINE)
        tmp = os.path.join(parent, f".{os.path.basename(folder)}.ckptstore-tmp-{uuid.uuid4().hex}")
        try:
            store = LocalStore(tmp)
            for rel in index["files"]:
                store.put(rel, flat.pop(FILE_PREFIX + rel).numpy().data)
            os.makedirs(tmp, exist_ok=True)  # an empty checkpoint is still a folder
            if os.path.exists(folder):
                quarantine(folder, qdir)
            os.replace(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fd = os.open(parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        log.info("restored step %d from %s into %s", step, self.root, folder)
        return folder

    def restore_newest(
        self, dest: Callable[[int, dict[str, Any]], str], qdir: str | None = None
    ) -> tuple[int, str] | None:
        """(step, local folder) of the newest committed step that verifies, or None.

        A step that fails verification is skipped with a warning, as
        ``CheckpointManager.restore`` does.
        """
        for step in reversed(self.steps()):
            try:
                index = self.index(step)
                return step, self.ensure_local(step, dest(step, index), qdir, index)
            except (CorruptCheckpointError, IncompleteCheckpointError) as exc:
                warnings.warn(
                    f"checkpoint step {step} could not be restored ({exc}); falling back to "
                    "the previous committed step",
                    RuntimeWarning,
                    stacklevel=2,
                )
        return None
