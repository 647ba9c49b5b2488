"""A framework's local checkpoint folder <-> one committed ckptstore step.

Hugging Face Trainer and Accelerate write a checkpoint as a local folder of files in
their own formats. ``FolderCheckpoints`` uploads such a folder, byte for byte, as one
ckptstore step (each file a uint8 DCP item, plus a JSON index of names, sizes and
CRC32Cs), through a ``CheckpointManager``: staged, then written and committed in the
background, verified on every read. It restores a committed step as a local folder for
the framework's own loader; call order and the several-process contract are its class
docstring's.

The index is read back from storage and is untrusted: its size is capped before it is
loaded and ``_folder_index.parse_index`` checks it; a bad one is a
``CorruptCheckpointError``, and a restore falls back past that step. The local folders are
untrusted ground too: every path below the directory the caller trusts is resolved from its
descriptor (``_local.LocalFolder``), never checked and then used as a string.
"""

from __future__ import annotations

import json
import logging
import os
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import torch
import torch.distributed as dist

from ckptstore import CheckpointManager, ManagerOptions, newer_steps, step_name
from ckptstore.api import empty_state_dict
from ckptstore.errors import (
    ConfigError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    NewerFormatError,
    NoLoadableCheckpointError,
    UnsafePathError,
)

from . import _folder_index
from ._folder_index import INDEX_FORMAT, bad_index, parse_index
from ._local import QUARANTINE, LocalFolder, crc

__all__ = [
    "FolderCheckpoints",
    "INDEX_KEY",
    "FILE_PREFIX",
    "QUARANTINE",
    "barrier",
]

log = logging.getLogger(__name__)

INDEX_KEY = "folder/index"
FILE_PREFIX = "folder/files/"


def _template(mgr: CheckpointManager, step: int, keys: Iterable[str]) -> dict:
    """Empty tensors for ``keys`` of committed ``step``, shaped from its metadata."""
    return empty_state_dict(mgr.root.child(step_name(step)), keys)


def _load(mgr: CheckpointManager, step: int, keys: Iterable[str]) -> dict:
    """The verified items ``keys`` of committed ``step`` (raises if it is torn or corrupt)."""
    flat = _template(mgr, step, keys)
    mgr.restore(flat, step=step)
    return flat


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _gather(obj: Any) -> list[Any]:
    """``obj`` of every rank, in rank order (also a barrier), on the default group."""
    if _world() == 1:
        return [obj]
    out: list[Any] = [None] * _world()
    dist.all_gather_object(out, obj)
    return out


def barrier() -> None:
    """Wait for every rank (a no-op in one process)."""
    _gather(None)


def _unreadable(folder: str, step: int, exc: OSError) -> ConfigError:
    return ConfigError(
        f"could not read {folder} for step {step} ({exc}): a folder of it vanished or "
        "changed while it was uploaded; save a folder the framework has finished writing"
    )


def _agree(mine: Any, refusal: Exception | None) -> list[Any]:
    """``mine`` of every rank, in rank order (``_gather``); where a rank could not read its
    folder (``refusal``), that error on that rank and one of its kind naming it on every
    other, so that no rank goes on into the upload alone."""
    seen = _gather((mine, refusal))
    if refusal is not None:
        raise refusal
    for rank, (_, theirs) in enumerate(seen):
        if theirs is not None:
            raise type(theirs)(f"rank {rank}: {theirs}")
    return [m for m, _ in seen]


def _shares(seen: list[dict[str, int]]) -> tuple[dict[str, int], dict[str, int]]:
    """(name -> size, name -> the rank that uploads it) from every rank's {name: size}.

    Each name goes to the rank that sees it with the fewest bytes assigned so far (the
    lowest such rank on a tie): the same answer on every rank.
    """
    sizes: dict[str, int] = {}
    holders: dict[str, list[int]] = {}
    for rank, files in enumerate(seen):
        for rel, size in files.items():
            if sizes.setdefault(rel, size) != size:
                first = holders[rel][0]
                raise ConfigError(
                    f"rank {first} sees {rel!r} with {sizes[rel]} bytes and rank {rank} with "
                    f"{size}: the ranks' copies of a checkpoint folder must be the same files "
                    "(one shared file system) or different ones (node-local disks)"
                )
            holders.setdefault(rel, []).append(rank)
    load = [0] * len(seen)
    owner: dict[str, int] = {}
    for rel in sorted(sizes, key=lambda r: (-sizes[r], r)):
        rank = min(holders[rel], key=lambda r: (load[r], r))
        owner[rel] = rank
        load[rank] += sizes[rel]
    return sizes, owner


class FolderCheckpoints:
    """Local checkpoint folders as committed steps under ``root``. Call order::

        fc = FolderCheckpoints(root, ...)
        fc.save(step, folder)                     # after the framework wrote ``folder``
        fc.wait() / fc.close()                    # flush / flush and release
        step, path = fc.restore_newest(dest)      # newest committed step that verifies, as a
                                                  # local folder ``dest(step, index)``
        fc.ensure_local(step, folder)             # a local copy that matches step, byte for byte

    ``options`` (``ckptstore.ManagerOptions``) with any of its fields replaced by
    ``keywords``, checked now as ``CheckpointManager`` checks them, for the manager made on
    first use.

    A local folder that does not match its committed step (torn, edited, another step) is
    moved aside to a quarantine directory, never deleted, before the committed copy is
    written in its place (files fsynced, then the folder renamed in) -- only where the
    caller allows it (``replace``): a folder whose path came from the stored index is never
    moved. A restore's folder and quarantine directory lie below a directory the caller
    trusts (``base``: the framework's output or project directory; default the folder's
    parent); a save's folder is trusted as given. Below those, every path is resolved from
    the trusted directory's descriptor: a link there is refused (``UnsafePathError``),
    never read, written or moved through, and only regular files are read.

    Several processes (``torch.distributed`` initialised, world size > 1): every rank calls
    ``save``, ``ensure_local`` and ``restore_newest``, in the same order, on the training
    script's default process group as well as the manager's own. ``save`` waits until every
    rank has written its files into the folder, then each rank uploads a share of the files
    (each file once, by one of the ranks that see it, balanced by bytes), so a folder the
    ranks see on one shared file system is written by all of them, and a file only one node
    wrote (its ranks' RNG states, on node-local disks) still gets in. A name two ranks see
    with different bytes is refused. ``save`` returns once every rank has copied its share:
    from then on the folder may change (the upload goes on from the copies). On restore
    every rank loads the step and only the ranks given ``write=True`` (one per file system:
    the framework's "should save" process) write the folder; every rank returns after it is
    written.
    """

    def __init__(self, root: str, options: ManagerOptions | None = None, **keywords: Any) -> None:
        self.root = root
        self.options = ManagerOptions.from_keywords(options, **keywords)
        self.options.refuse_cadences("ckptstore_hf")
        self._mgr: CheckpointManager | None = None

    @property
    def manager(self) -> CheckpointManager:
        """The ``CheckpointManager`` (made on first use, so a plugin costs nothing until then)."""
        if self._mgr is None:
            self._mgr = CheckpointManager(self.root, self.options)
        return self._mgr

    # -- saving --------------------------------------------------------------------------
    def save(self, step: int, folder: str, extra: dict[str, Any] | None = None) -> bool:
        """Start uploading ``folder`` as ``step``; False if that step is already committed.

        With several processes every rank calls it (see the class docstring).
        """
        barrier()  # every rank has written its files into the folder
        local = LocalFolder(folder, base=folder)
        mine: dict[str, int] = {}
        refusal: Exception | None = None
        try:
            mine = local.files()
        except UnsafePathError as exc:
            refusal = exc
        except OSError as exc:
            refusal = _unreadable(folder, step, exc)
        seen = _agree(mine, refusal)
        if not any(seen):
            raise ConfigError(f"{folder} is not a directory; nothing to upload for step {step}")
        sizes, owner = _shares(seen)
        me = dist.get_rank() if _world() > 1 else 0
        flat: dict[str, torch.Tensor] = {}
        crcs: dict[str, int] = {}
        try:
            for rel in sorted(mine):
                if owner[rel] == me:
                    t = local.read(rel)
                    if t.numel() != sizes[rel]:
                        raise ConfigError(
                            f"{os.path.join(folder, rel)} changed size while step {step} was "
                            "uploaded; save a folder the framework has finished writing"
                        )
                    flat[FILE_PREFIX + rel] = t
                    crcs[rel] = crc(t)
        except (ConfigError, UnsafePathError) as exc:
            refusal = exc
        except OSError as exc:
            refusal = _unreadable(folder, step, exc)
        crc_all: dict[str, int] = {}
        for part in _agree(crcs, refusal):
            crc_all.update(part)
        files = {rel: {"size": sizes[rel], "crc32c": crc_all[rel]} for rel in sorted(sizes)}
        index = {
            "format": INDEX_FORMAT,
            "version": 1,
            "name": os.path.basename(os.path.normpath(folder)),
            "path": os.path.abspath(folder),
            "files": files,
            "extra": extra or {},
        }
        if me == 0:
            flat[INDEX_KEY] = torch.frombuffer(
                bytearray(json.dumps(index).encode()), dtype=torch.uint8
            )
        saved = self.manager.save(step, flat)
        # ``save`` returns once this rank's share is copied, but ``flat`` maps the files
        # themselves: the framework goes on with its folder when we return (Accelerate
        # rewrites its custom states), and a file truncated under a rank still copying it
        # kills that rank (SIGBUS). So no rank returns before every rank has copied.
        barrier()
        if not saved and me == 0:
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
        """The committed file index of ``step`` (verified, size-capped, ``parse_index``)."""
        flat = _template(self.manager, step, [INDEX_KEY])
        t = flat[INDEX_KEY]
        cap = _folder_index.INDEX_MAX
        if t.dtype != torch.uint8 or t.dim() != 1 or t.numel() > cap:
            what = f"{t.dtype}{list(t.shape)}"
            raise bad_index(step, f"item {INDEX_KEY!r} is {what}, not uint8 bytes (over {cap})")
        self.manager.restore(flat, step=step)
        return parse_index(flat[INDEX_KEY].numpy().tobytes(), step)

    @staticmethod
    def matches(folder: str, index: dict[str, Any], base: str | None = None) -> bool:
        """Whether ``folder`` (below ``base``, see the class docstring) holds exactly the
        committed files (names, sizes, CRC32C); a link or non-regular file in it: no."""
        return LocalFolder(folder, base).matches(index)

    def ensure_local(
        self,
        step: int,
        folder: str,
        qdir: str | None = None,
        index: dict[str, Any] | None = None,
        write: bool = True,
        replace: bool = True,
        base: str | None = None,
    ) -> str:
        """Make ``folder`` hold committed ``step`` byte for byte.

        A local folder that differs is moved to ``qdir`` (default: ``QUARANTINE`` beside it)
        if ``replace``; else ``ConfigError`` (ckptstore moves no folder it was not given).
        ``folder`` and ``qdir`` lie below ``base`` (default: the folder's parent), from whose
        descriptor they are resolved (class docstring). With several processes every rank
        calls it; only those with ``write`` write.
        """
        index = index if index is not None else self.index(step)
        local = LocalFolder(folder, base)
        need = write and not local.matches(index)
        if not any(_gather(need)):
            return folder
        flat = _load(self.manager, step, [FILE_PREFIX + rel for rel in index["files"]])
        for rel, want in index["files"].items():
            if flat[FILE_PREFIX + rel].numel() != want["size"]:
                raise bad_index(step, f"{rel!r} is stored with another size than it lists")
        error: BaseException | None = None
        if need:
            try:
                if not replace and local.exists():
                    raise ConfigError(
                        f"{folder} exists and differs from committed step {step}; ckptstore "
                        "does not move a folder whose path it read from the stored index. "
                        "Pass the local directory to restore into (prepare_resume(local_dir)), "
                        "or move that folder away"
                    )
                local.write({rel: flat.pop(FILE_PREFIX + rel) for rel in index["files"]}, qdir)
                log.info("restored step %d from %s into %s", step, self.root, folder)
            except BaseException as exc:  # noqa: BLE001 - every rank hears of it below
                error = exc
        failed = [r for r, ok in enumerate(_gather(error is None)) if not ok]
        if error is not None:
            raise error
        if failed:
            raise CorruptCheckpointError(
                f"rank {failed[0]} could not write step {step} into {folder}; see its log"
            )
        return folder

    def restore_newest(
        self,
        dest: Callable[[int, dict[str, Any]], str],
        qdir: str | None = None,
        write: bool = True,
        replace: bool = True,
        on_unloadable: str = "raise",
        base: str | None = None,
    ) -> tuple[int, str] | None:
        """(step, local folder) of the newest committed step that verifies, or None if the
        root holds no committed step.

        A step that fails verification (its index too) or that a newer torch or ckptstore
        wrote is skipped with a warning, as ``CheckpointManager.restore`` does; if every
        one is, ``NoLoadableCheckpointError`` lists them (``on_unloadable="fresh"``: a
        warning and None, a fresh start). ``write``, ``replace`` and ``base`` as for
        ``ensure_local``.
        """
        refused: list[tuple[int, str]] = []
        for step in reversed(self.steps()):
            try:
                index = self.index(step)
                folder = dest(step, index)
                return step, self.ensure_local(step, folder, qdir, index, write, replace, base)
            except (CorruptCheckpointError, IncompleteCheckpointError, NewerFormatError) as exc:
                refused.append((step, str(exc)))
                warnings.warn(
                    f"checkpoint step {step} could not be restored ({exc}); falling back to "
                    "the previous committed step",
                    RuntimeWarning,
                    stacklevel=2,
                )
        refused += newer_steps(self.manager.root)  # committed, yet not in steps()
        if refused:
            refused.sort(reverse=True)
            error = NoLoadableCheckpointError.of(self.manager.root.url, refused)
            if on_unloadable != "fresh":
                raise error
            warnings.warn(error.warning(), RuntimeWarning, stacklevel=2)
        return None
