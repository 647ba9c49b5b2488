"""``CkptStoreIO``: a Lightning ``CheckpointIO`` whose checkpoints are ckptstore steps."""

from __future__ import annotations

import atexit
import logging
import threading
import time
import warnings
import weakref
from typing import Any

import torch

from ckptstore import (
    CheckpointManager,
    KeepAll,
    KeepLast,
    ManagerOptions,
    RetentionPolicy,
    parse_step,
    select_deletions,
)
from ckptstore.errors import (
    ConfigError,
    CorruptCheckpointError,
    IncompleteCheckpointError,
    missing_dependency,
    require_version,
)
from ckptstore.stores import open_store, split_url

from ._packing import OBJECTS_KEY, load_newest, load_step, pack, unpack
from ._versions import EXTRA, SUPPORTED

try:
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.callbacks import ModelCheckpoint
except ImportError as exc:  # pragma: no cover - exercised in a test with lightning hidden
    raise missing_dependency("lightning", EXTRA) from exc
require_version("lightning", SUPPORTED["lightning"], EXTRA)

from . import _ranks  # noqa: E402 - needs lightning, checked above
from ._names import (  # noqa: E402
    POINTER_FORMAT,
    Pointer,
    confine,
    is_last_name,
    norm,
    pointer_bytes,
    read_pointer,
    split,
)

__all__ = ["CkptStoreIO", "POINTER_FORMAT"]

log = logging.getLogger(__name__)


def _publish_at_exit(ref: weakref.ref[CkptStoreIO]) -> None:
    io = ref()
    if io is not None and io._pending:
        try:
            io._publish()
        except Exception as exc:  # noqa: BLE001 - nothing left to report it to
            log.warning("could not write checkpoint names at exit: %s", exc)


class CkptStoreIO(CheckpointIO):
    """Lightning ``CheckpointIO`` over ckptstore: each checkpoint is a step, its name a pointer.

    Call order (Lightning drives it; the package docstring says what each call means)::

        save_checkpoint(ckpt, path)  # stage; the step commits in the background, then a
                                     # watcher thread writes the pointer ``path`` (``_names``)
        remove_checkpoint(path)      # delete the name; its step goes once no name refers to
                                     # it, it is not the newest and ``keep`` lets it go
        load_checkpoint(path)        # a pointer, a root (newest committed), a step URL, or
                                     # a stock Lightning file (loaded as before)
        teardown()                   # end of fit: wait, write names, raise if the last failed

    With several processes every rank makes each call (``_ranks``); rank 0 alone writes and
    removes names and prunes. One checkpoint per global step: a second save of a step (the
    "last" name of ``save_last=True``) points at the first.

    ``options`` (``ckptstore.ManagerOptions``) and ``keywords`` (any of its fields, checked
    as ``CheckpointManager`` checks them) configure each root's ``CheckpointManager``, but
    ``storage_options`` reach object-store roots and names only (a local path takes none),
    and ``keep`` (a keyword here; ``options.keep`` stays at its default) is the IO's own
    pruning: it keeps committed steps beyond those a name refers to (the newest always;
    default ``KeepLast(1)``, so ``ModelCheckpoint`` alone decides); the manager keeps all.
    """

    def __init__(
        self,
        root: str | None = None,
        options: ManagerOptions | None = None,
        *,
        keep: RetentionPolicy | None = None,
        **keywords: Any,
    ) -> None:
        self.options = ManagerOptions.from_keywords(options, **keywords)
        if self.options.keep != ManagerOptions().keep:
            raise ConfigError(
                "CkptStoreIO prunes by checkpoint names: pass keep= to CkptStoreIO, "
                "not in its ManagerOptions"
            )
        self.options.refuse_cadences("CkptStoreIO")
        self.root = norm(root) if root else None
        self.keep = keep or KeepLast(1)
        self._strategy: Any = None  # set by _ranks.attach when the Trainer is built
        self._managers: dict[str, CheckpointManager] = {}
        self._pending: list[tuple[str, Pointer]] = []  # names waiting for their commit
        self._last_save: dict[str, tuple[int, frozenset[str]]] = {}
        self._pointer_dirs: set[str] = set()
        self._lock = threading.RLock()  # the watcher thread publishes names too
        self._watcher: threading.Thread | None = None
        # A save still uploading at exit is finished by the manager's worker (joined before
        # atexit handlers run); then name it, even if nobody called teardown().
        atexit.register(_publish_at_exit, weakref.ref(self))

    # -- stores and managers ---------------------------------------------------------------
    def _options(self, url: str) -> dict[str, Any] | None:
        if split_url(url)[0] in ("file", "local") or self.options.storage_options is None:
            return None
        return dict(self.options.storage_options)

    def manager(self, root: str | None = None) -> CheckpointManager:
        """The ``CheckpointManager`` of ``root`` (default: the configured root)."""
        root = norm(root) if root else self.root
        if root is None:
            raise ConfigError("CkptStoreIO has no root yet: pass one, or save a checkpoint first")
        with self._lock:
            if root not in self._managers:
                self._managers[root] = CheckpointManager(
                    root,
                    self.options,
                    storage_options=self._options(root),
                    keep=KeepAll(),  # pruning needs the names, so this plugin does it
                )
            return self._managers[root]

    # -- pointers ------------------------------------------------------------------------
    def _home(self, parent: str) -> str:
        """The root this IO saves into (and may prune) for names in ``parent``."""
        return self.root or parent

    def _read_pointer(self, path: str) -> Pointer | None:
        """The pointer at ``path``; None if there is none (absent, a stock ``.ckpt``).

        The file is untrusted: its size is checked before it is read, its bytes parsed
        strictly, its root confined (``_names``); else ``CorruptCheckpointError``.
        """
        parent, name = split(path)
        ptr = read_pointer(open_store(parent, self._options(parent)), name, parent)
        return None if ptr is None else confine(ptr, parent, self.root)

    def _write_pointer(self, path: str, ptr: Pointer) -> None:
        parent, name = split(path)
        open_store(parent, self._options(parent)).put(name, pointer_bytes(ptr, parent))
        self._pointer_dirs.add(parent)

    def _status(self, ptr: Pointer) -> str:
        mgr = self.manager(ptr.root)
        for rec in reversed(mgr.records):
            if rec.step == ptr.step:
                if rec.status == "skipped":  # already committed (an earlier run) or busy
                    return "committed" if ptr.step in mgr.steps() else "failed"
                return rec.status
        return "committed" if ptr.step in mgr.steps() else "failed"

    def _publish(self, report: bool = True) -> bool:
        """Write the names whose steps have committed, prune what nothing names any more;
        True while some step is still being written. Failures are reported (and dropped)
        only with ``report``, so they surface on the caller's thread, not the watcher's."""
        with self._lock:
            waiting: list[tuple[str, Pointer]] = []
            roots, busy = set(), False
            for path, ptr in self._pending:
                status = self._status(ptr)
                if status == "committed":
                    self._write_pointer(path, ptr)
                    roots.add(ptr.root)
                elif status == "failed" and report:
                    warnings.warn(
                        f"{path} was not written: saving step {ptr.step} failed (steps "
                        "committed before it are unaffected)",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                else:
                    busy = busy or status != "failed"
                    waiting.append((path, ptr))
            self._pending = waiting
            for root in roots:
                self._prune(root)
            return busy

    def _watch(self) -> None:
        """Publish names shortly after their steps commit, while any step is being written."""
        while True:
            time.sleep(0.05)
            with self._lock:
                try:
                    busy = self._publish(report=False)
                except Exception as exc:  # noqa: BLE001 - the next save/wait/teardown retries
                    log.warning("could not write checkpoint names yet: %s", exc)
                    busy = False
                if not busy:
                    self._watcher = None
                    return

    def _start_watcher(self) -> None:
        with self._lock:
            if self._pending and self._watcher is None:
                self._watcher = threading.Thread(
                    target=self._watch, name="ckptstore-lightning-names", daemon=True
                )
                self._watcher.start()

    def _named_steps(self, root: str) -> set[int] | None:
        """Steps under ``root`` that some checkpoint name (written or waiting) refers to;
        None when a name cannot be read (it may have named any step)."""
        steps = {p.step for _, p in self._pending if p.root == root}
        for parent in self._pointer_dirs:
            store = open_store(parent, self._options(parent))
            for name in store.listdir():
                if name.endswith(ModelCheckpoint.FILE_EXTENSION):
                    try:  # unconfined: a name that keeps a step only stops a deletion
                        ptr = read_pointer(store, name, parent)
                    except CorruptCheckpointError as exc:
                        log.warning("not pruning %s: %s", root, exc)
                        return None
                    if ptr is not None and not ptr.newest and ptr.root == root:
                        steps.add(ptr.step)
        return steps

    def _prune(self, root: str) -> None:
        mgr = self.manager(root)
        protected = self._named_steps(root)
        if protected is None:  # unsure what the names keep: delete nothing
            return
        doomed = select_deletions(mgr.steps(), self.keep, protected=protected)
        for step in doomed:
            log.info("deleting step %d under %s: no checkpoint name refers to it", step, root)
            mgr.delete(step)

    # -- CheckpointIO ----------------------------------------------------------------------
    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None
    ) -> None:
        """Start saving ``checkpoint`` as step ``global_step``; ``path`` names it (the same
        ``path`` on every rank)."""
        if storage_options is not None:
            raise TypeError(
                "CkptStoreIO.save_checkpoint takes no storage_options; pass them to CkptStoreIO()"
            )
        rank, _world = _ranks.check_ranks(self._strategy)
        path = norm(str(path))
        if "global_step" not in checkpoint:
            raise ConfigError("a Lightning checkpoint dict has a 'global_step'; this one does not")
        step = int(checkpoint["global_step"])
        root = self.root or split(path)[0]
        with self._lock:
            mgr = self.manager(root)
            previous = self._last_save.get(root)
            if previous is not None and previous[0] == step:
                if not set(checkpoint) <= previous[1]:
                    warnings.warn(
                        f"step {step} was already saved with fewer entries; {path} refers to "
                        "that save (ckptstore keeps one checkpoint per global step)",
                        RuntimeWarning,
                        stacklevel=2,
                    )
            else:
                flat = pack(checkpoint)
                if rank != 0:  # the replicated tensors only: rank 0 saves the rest
                    shared = _ranks.REPLICATED
                    flat = {k: v for k, v in flat.items() if k.startswith(shared)}
                mgr.save(step, flat)  # waits for the previous save, if in flight
                self._last_save[root] = (step, frozenset(checkpoint))
            if rank != 0:  # names are rank 0's: it writes them once the step commits
                return
            self._pending.append((path, Pointer(root, step, newest=is_last_name(path))))
            self._publish()  # the previous step's names; this one's too if saved synchronously
        self._start_watcher()

    def _resolve(self, path: str) -> tuple[str, int | None] | None:
        """(root, step or None for the newest committed) of ``path``; None: a stock file."""
        parent, name = split(path)
        step = parse_step(name)
        if step is not None:
            return parent, step
        with self._lock:
            try:
                ptr = self._read_pointer(path)
            except CorruptCheckpointError as exc:
                if not is_last_name(path):
                    raise
                # A "last" name always means the newest committed step of its root: take
                # it from the configured root instead of the damaged or planted file.
                home = self._home(parent)
                warnings.warn(
                    f"{exc}; loading the newest committed step under {home} instead",
                    RuntimeWarning,
                    stacklevel=3,
                )
                return home, None
            if ptr is not None:
                self._pointer_dirs.add(parent)
                return ptr.root, (None if ptr.newest else ptr.step)
        if open_store(parent, self._options(parent)).exists(name):
            return None
        return norm(path), None

    def load_checkpoint(
        self, path: Any, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """The Lightning dict of ``path``: a name, a root (newest committed) or a step URL.

        With several processes, every rank calls this (Lightning does) and loads what rank 0
        resolved ``path`` to.
        """
        _rank, world = _ranks.check_ranks(self._strategy)
        self.wait()
        target = self._resolve(norm(str(path)))
        if world > 1:
            target = self._strategy.broadcast(target, src=0)
        if target is None:
            return TorchCheckpointIO().load_checkpoint(path, map_location, weights_only)
        root, step = target
        mgr = self.manager(root)
        if step is None:
            found = load_newest(mgr)
            if found is None:
                raise IncompleteCheckpointError(
                    f"no committed checkpoint under {root} (from {path}); for a run that may "
                    'be the first, pass ckpt_path="last" with ModelCheckpoint(save_last=True)'
                )
            step, flat = found
        else:
            flat = load_step(mgr, step)
        if map_location is not None:
            device = torch.device(map_location)
            flat = {k: v if k == OBJECTS_KEY else v.to(device) for k, v in flat.items()}
        checkpoint = unpack(flat, weights_only=weights_only)
        log.info("loaded step %d from %s", step, root)
        return checkpoint

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the name ``path``; its step goes once nothing keeps it (class docstring)."""
        path = norm(str(path))
        parent, name = split(path)
        with self._lock:
            self._pending = [(p, ptr) for p, ptr in self._pending if p != path]
            try:
                ptr = self._read_pointer(path)
            except CorruptCheckpointError as exc:
                # Lightning asked for the name to go; what it points at is not trusted, so
                # nothing is pruned through it.
                warnings.warn(f"{exc}; removed the name only", RuntimeWarning, stacklevel=2)
                open_store(parent, self._options(parent)).delete(name)
                return
            if ptr is None:
                if open_store(parent, self._options(parent)).exists(name):
                    TorchCheckpointIO().remove_checkpoint(path)  # a stock file from before
                return
            open_store(parent, self._options(parent)).delete(name)
            self._pointer_dirs.add(parent)
            if not ptr.newest and ptr.root == self._home(parent):
                self._prune(ptr.root)

    def wait(self) -> None:
        """Block until every in-flight save has committed or failed; write their names."""
        with self._lock:
            managers = list(self._managers.values())
        for mgr in managers:
            mgr.wait()
        self._publish()

    def teardown(self) -> None:
        """Wait, write the names, close the managers; raise if the last save failed."""
        try:
            self.wait()
        finally:
            with self._lock:
                managers, self._managers = self._managers, {}
                self._last_save.clear()
            first: BaseException | None = None
            for mgr in managers.values():
                try:
                    mgr.close()
                except BaseException as exc:  # noqa: BLE001 - close every manager, then raise
                    first = first or exc
            if first is not None:
                raise first


_ranks.install(CkptStoreIO)
