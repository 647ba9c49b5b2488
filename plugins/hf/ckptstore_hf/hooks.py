"""``CkptStoreCallback`` (transformers ``Trainer``) and ``CkptStoreAccelerate`` (hooks).

Each class docstring gives its use and call order; the folders go up and come back through
``_folder.FolderCheckpoints``. Several processes (``torchrun --nproc-per-node N``,
``accelerate launch --num_processes N``): every rank runs the same hooks. A save waits
until every rank has written its files, then every rank uploads a share of the folder and
the step commits once. On resume every rank loads the committed step and the process that
saves for its file system (the framework's ``should_save`` / main process; with
``save_on_each_node``, one per node) writes the local folder. The directory the framework
was configured with (``output_dir``, ``project_dir``, a ``local_dir``) is trusted as given;
every path below it -- the checkpoint folders, the quarantine folder, their files -- is
resolved from its descriptor, never through a link (``_local.LocalFolder``).
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any

from ckptstore import ManagerOptions
from ckptstore.errors import ConfigError, UnsafePathError, missing_dependency, require_version

from ._folder import QUARANTINE, FolderCheckpoints, barrier
from ._folder_index import trailing_int
from ._local import LocalFolder, name_below
from ._versions import EXTRA, SUPPORTED

try:
    from accelerate.checkpointing import save_custom_state
except ImportError as exc:  # pragma: no cover - exercised in a test with accelerate hidden
    raise missing_dependency("accelerate", EXTRA) from exc
try:
    from transformers import TrainerCallback
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
except ImportError as exc:  # pragma: no cover - exercised in a test with transformers hidden
    raise missing_dependency("transformers", EXTRA) from exc
for _name, _spec in SUPPORTED.items():
    require_version(_name, _spec, EXTRA)

__all__ = ["CkptStoreCallback", "CkptStoreAccelerate"]


def _move_newer_aside(
    base: str, parent: str, pattern: re.Pattern[str], newest: int | None, qdir: str
) -> None:
    """Quarantine the checkpoint folders in ``parent`` numbered above ``newest`` (torn or
    uncommitted) into ``qdir``; both lie below the trusted directory ``base``, and only
    folders are moved (a link there is left alone)."""
    if newest is None:
        return
    for name in LocalFolder(parent, base).folders():
        m = pattern.fullmatch(name)
        if m and int(m.group(1)) > newest:
            LocalFolder(os.path.join(parent, name), base).quarantine(qdir)


class CkptStoreCallback(TrainerCallback):
    """Uploads every Trainer checkpoint to ``root`` and resumes from the newest committed.

    Use::

        ckpt = CkptStoreCallback("s3://bucket/run1")
        trainer = Trainer(..., callbacks=[ckpt])
        trainer.train(resume_from_checkpoint=ckpt.resume_from)  # newest committed; None: fresh
        ckpt.close()                                            # the last upload committed

    Call order (the Trainer calls the callback)::

        on_init_end    -> prepare_resume(args.output_dir)   # before train() looks for them
        on_save        -> upload output_dir/checkpoint-<global_step> as step global_step
        on_train_end   -> wait for the last upload;  close() when done with the callback

    With ``sync_on_init`` (default) the callback prepares ``args.output_dir`` when the
    Trainer is built and sets ``resume_from``: the newest committed checkpoint's folder
    (written back even on a machine that never saw it), or None on a fresh run. Pass it as
    ``train(resume_from_checkpoint=ckpt.resume_from)``: the same line starts a fresh run
    and resumes one (``resume_from_checkpoint=True`` makes the Trainer raise "No valid
    checkpoint found" on a fresh run). ``options`` (``ckptstore.ManagerOptions``) and
    ``keywords`` (any of its fields) configure the ``CheckpointManager`` as they configure
    one made directly: ``keep`` prunes committed steps (default ``KeepLast(3)``), while
    ``save_total_limit`` still prunes the local folders.
    """

    def __init__(
        self,
        root: str,
        options: ManagerOptions | None = None,
        *,
        sync_on_init: bool = True,
        **keywords: Any,
    ) -> None:
        self.folders = FolderCheckpoints(root, options, **keywords)
        self.sync_on_init = sync_on_init
        #: The folder ``prepare_resume`` put back (the newest committed step), or None.
        self.resume_from: str | None = None

    def prepare_resume(
        self, output_dir: str, write: bool = True, on_unloadable: str = "raise"
    ) -> str | None:
        """Make ``output_dir/checkpoint-<N>`` the newest committed step N; its path, or None
        when the root holds no committed step (a fresh run).

        With several processes every rank calls it; those with ``write`` (one per file
        system) write the folder. Committed steps none of which loads raise
        ``NoLoadableCheckpointError`` naming each, never a silent fresh start, unless
        ``on_unloadable="fresh"``.
        """
        qdir = os.path.join(output_dir, QUARANTINE)
        found = self.folders.restore_newest(
            lambda step, _index: os.path.join(output_dir, f"{PREFIX_CHECKPOINT_DIR}-{step}"),
            qdir,
            write,
            on_unloadable=on_unloadable,
            base=output_dir,
        )
        if write:
            pattern = re.compile(rf"{re.escape(PREFIX_CHECKPOINT_DIR)}-(\d+)")
            newest = found[0] if found else None
            _move_newer_aside(output_dir, output_dir, pattern, newest, qdir)
        barrier()  # no rank looks for checkpoints before the folders are in place
        self.resume_from = found[1] if found else None
        return self.resume_from

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Trainer hook: with ``sync_on_init``, put the newest committed checkpoint folder
        back in ``output_dir`` (``prepare_resume``) before training starts."""
        if self.sync_on_init:
            self.prepare_resume(args.output_dir, write=args.should_save)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Trainer hook: save the checkpoint folder the Trainer just wrote, on every rank."""
        folder = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        self.folders.save(state.global_step, folder)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Trainer hook: wait for the last folder's save to commit."""
        self.folders.wait()

    def wait(self) -> None:
        """Wait for the in-flight folder save (raises if it failed)."""
        self.folders.wait()

    def close(self) -> None:
        """Wait for the last upload and release resources; raise if it failed."""
        self.folders.close()


class CkptStoreAccelerate:
    """Accelerate save/load-state hooks uploading every ``save_state`` folder to ``root``.

    Use::

        ckpt = CkptStoreAccelerate("s3://bucket/run1").register(accelerator)
        if path := ckpt.prepare_resume():               # None on a fresh run
            accelerator.load_state(path)                # then train, save_state(...) as usual

    Call order (``register`` installs both hooks and registers the object for
    checkpointing, so ``save_state`` calls its ``state_dict`` after writing every other file)::

        prepare_resume()   # newest committed step -> its local folder (None on a fresh run)
        load_state(path)   # load pre-hook: the folder must match its committed step; a torn
                           # or stale copy is replaced by the committed one first
        save_state(dir)    # save pre-hook notes dir; state_dict() uploads it as step N, the
                           # number dir's name ends with (checkpoint_3, step_500)
        wait() / close()

    Folder names must end with a step number (``automatic_checkpoint_naming`` gives
    ``checkpoint_<i>``). ``options`` (``ckptstore.ManagerOptions``) and ``keywords`` (any of
    its fields) configure the ``CheckpointManager`` as they configure one made directly.
    """

    FORMAT = "ckptstore.accelerate"

    def __init__(self, root: str, options: ManagerOptions | None = None, **keywords: Any) -> None:
        self.folders = FolderCheckpoints(root, options, **keywords)
        self.accelerator: Any = None
        self._saving: tuple[int, str] | None = None
        self._uploading = False
        self._handles: list[Any] = []

    # -- wiring --------------------------------------------------------------------------
    def register(self, accelerator: Any) -> CkptStoreAccelerate:
        """Install the hooks on ``accelerator`` and register for checkpointing; returns self.

        Call it after ``prepare``; your own ``register_for_checkpointing`` calls may come
        before or after it (their states are written before the upload either way).
        """
        self.accelerator = accelerator
        self._handles = [
            accelerator.register_save_state_pre_hook(self._before_save),
            accelerator.register_load_state_pre_hook(self._before_load),
        ]
        accelerator.register_for_checkpointing(self)
        return self

    def _writes(self) -> bool:
        """Whether this process writes restored folders (one per file system)."""
        acc = self.accelerator
        if acc.project_configuration.save_on_each_node:
            return bool(acc.is_local_main_process)
        return bool(acc.is_main_process)

    def _checkpoints_dir(self) -> str | None:
        cfg = self.accelerator.project_configuration
        if not cfg.automatic_checkpoint_naming:
            return None
        return os.path.join(self.accelerator.project_dir, "checkpoints")

    def _qdir(self) -> str | None:
        """Where mismatching folders go: beside them, except under automatic naming."""
        if self._checkpoints_dir() is None:
            return None
        # Accelerate parses every name in checkpoints/ as a number: keep out of it.
        return os.path.join(self.accelerator.project_dir, QUARANTINE)

    @staticmethod
    def _step(folder: str) -> int:
        step = trailing_int(folder)
        if step is None:
            raise ConfigError(
                f"cannot tell the step of {folder!r}: name checkpoint folders with a trailing "
                "step number (f'ckpts/step_{step}'), or use ProjectConfiguration("
                "automatic_checkpoint_naming=True)"
            )
        return step

    # -- saving --------------------------------------------------------------------------
    def _before_save(self, models: list[Any], weights: list[Any], output_dir: str) -> None:
        self._saving = (self._step(output_dir), output_dir)

    def state_dict(self) -> dict[str, Any]:
        """Called by ``save_state`` after every other file is written: upload the folder."""
        state = {"format": self.FORMAT, "version": 1}
        if self._saving is None or self._uploading:
            return state
        step, folder = self._saving
        self._uploading = True
        try:
            # Write the custom states Accelerate writes after this call (this object's
            # included) first, so the upload is the whole folder.
            acc = self.accelerator
            mine = next(i for i, o in enumerate(acc._custom_objects) if o is self)
            each_node = acc.project_configuration.save_on_each_node
            for i, obj in enumerate(acc._custom_objects[mine:], start=mine):
                save_custom_state(obj, folder, i, save_on_each_node=each_node)
            self.folders.save(step, folder)
        finally:
            self._saving = None
            self._uploading = False
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Check that ``state`` is this plugin's own (``ConfigError`` otherwise)."""
        if not isinstance(state, dict) or state.get("format") != self.FORMAT:
            raise ConfigError(f"not a {self.FORMAT} state: {state!r}")

    # -- restoring -----------------------------------------------------------------------
    def _set_iteration(self, step: int) -> None:
        if self._checkpoints_dir() is not None:  # the next automatic name must be new
            self.accelerator.project_configuration.iteration = step + 1

    def _before_load(self, models: list[Any], input_dir: str) -> None:
        step = trailing_int(input_dir)
        if step is None or step not in self.folders.steps():
            warnings.warn(
                f"loading {input_dir}, which ckptstore has not committed under "
                f"{self.folders.root}; use prepare_resume() for the newest committed one",
                RuntimeWarning,
                stacklevel=3,
            )
            return
        qdir, base = self._qdir(), None  # beside the folder, below its parent as given
        if qdir is not None:
            try:  # below the project directory, where the quarantine folder is
                name_below(input_dir, self.accelerator.project_dir)
                base = self.accelerator.project_dir
            except UnsafePathError:
                qdir = None  # a folder elsewhere: its mismatch goes beside it
        self.folders.ensure_local(step, input_dir, qdir, write=self._writes(), base=base)
        self._set_iteration(step)

    def prepare_resume(
        self, local_dir: str | None = None, on_unloadable: str = "raise"
    ) -> str | None:
        """Write the newest committed step as a local folder; its path, or None if none.
        Committed steps none of which loads raise ``NoLoadableCheckpointError`` naming each
        (never a silent fresh start) unless ``on_unloadable="fresh"``.

        The folder is ``project_dir/checkpoints/checkpoint_<N>`` with automatic naming,
        else ``local_dir/<saved name>``, else the path it was saved from -- only if that
        lies inside ``project_dir`` (else the working directory), and an existing folder
        there that differs is never moved (``ConfigError``: pass ``local_dir``). Below
        ``project_dir`` (``local_dir``) every path is resolved without following a link.
        """
        auto = self._checkpoints_dir()
        project = self.accelerator.project_dir or os.getcwd()
        base = local_dir if local_dir and auto is None else project

        def dest(step: int, index: dict[str, Any]) -> str:
            if auto is not None:
                return os.path.join(auto, f"checkpoint_{step}")
            if local_dir:  # the index's name is one plain segment (parse_index)
                return os.path.join(local_dir, index["name"])
            try:  # a path read from storage: only inside the configured directory
                return os.path.join(project, name_below(index["path"], project))
            except UnsafePathError as exc:
                raise ConfigError(
                    f"step {step} was saved from {index['path']}, outside {project} ({exc}); "
                    "pass prepare_resume(local_dir=...) to restore it into a directory "
                    "of your choice"
                ) from None

        qdir = self._qdir()
        replace = auto is not None or local_dir is not None
        found = self.folders.restore_newest(
            dest, qdir, self._writes(), replace, on_unloadable=on_unloadable, base=base
        )
        if found is not None and auto is not None and qdir is not None and self._writes():
            pattern = re.compile(r"checkpoint_(\d+)")
            _move_newer_aside(project, auto, pattern, found[0], qdir)
        barrier()  # every rank goes on once the folders are in place
        if found is None:
            return None
        step, path = found
        self._set_iteration(step)
        return path

    def wait(self) -> None:
        """Wait for the in-flight folder save (raises if it failed)."""
        self.folders.wait()

    def close(self) -> None:
        """Remove the hooks, wait for the last upload; raise if it failed."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.folders.close()
